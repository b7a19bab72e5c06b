"""The down-closed sets (ideals) of the order graph, with what the DP needs to price a stage ``I \\ J``.

Enumeration is breadth first by size from the empty set, adding one unit whose order-graph predecessors
are all in: ``O(m w n / 64)`` for ``m`` ideals of a DAG of width ``w``. ``m`` is ``O(n)`` for layer chains
with short parallel branches and ``O((n / w)^w)`` in general; a cap stops it.
"""

from __future__ import annotations

import numpy as np

from layoutsearch.costdag import CostDAG
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.instance import STAGE, Instance, Kind, compile_dag

MAX_IDEALS = 200_000
"""Default cap on the number of ideals the DP enumerates (memory: about ``m * n / 8`` bytes)."""


class TooManyIdeals(Exception):
    """More ideals than the cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class Ideals:
    """Every ideal with: its time on each kind and its ``key`` (the sum of its units' smallest time on any
    kind), both exactly rounded so that ``J ⊆ I`` implies ``t[J] <= t[I]``; the
    number of its units not eligible on each kind, memory, the tensors crossing its boundary (``cut``,
    padded with a dummy tensor of cost 0: ``cut_t`` for forward tensors, ``cut_b`` for the others) and the
    consumers of its forward cut tensors outside it (``pending``, bitsets), and its units as a bitset
    (``words``, 64 units per word)."""

    def __init__(self, inst: Instance, limit: int) -> None:
        n, tensors = inst.n, inst.tensors
        nk = len(inst.kinds)
        pred_mask = [sum(1 << u for u in inst.preds[v]) for v in range(n)]
        touch: list[list[int]] = [[] for _ in range(n)]
        for t, (src, cons, _) in enumerate(tensors):
            for v in {src, *cons}:
                touch[v].append(t)
        tsrc_bit = [1 << src for src, _, _ in tensors]
        cons_mask = [sum(1 << w for w in cons) for _, cons, _ in tensors]
        dens, nums, inel = [], [], []
        for times in [*inst.time, inst.key()]:
            finite = [c if c != float("inf") else 0.0 for c in times]
            den = max((c.as_integer_ratio()[1] for c in finite), default=1)
            dens.append(den)
            nums.append([c.as_integer_ratio()[0] * (den // c.as_integer_ratio()[1]) for c in finite])
            inel.append([int(c == float("inf")) for c in times])

        def crosses(t: int, bits: int) -> bool:
            return (cons_mask[t] & ~bits if bits & tsrc_bit[t] else cons_mask[t] & bits) != 0

        zero = (0,) * (nk + 1)
        roots = tuple(v for v in range(n) if not inst.preds[v])
        records = [(0, roots, zero, zero, 0, 0, ())]
        seen = {0: 0}
        head = 0
        while head < len(records):
            bits, addable, cint, bad, mem, act, cut = records[head]
            head += 1
            for v in addable:
                child = bits | (1 << v)
                if child in seen:
                    continue
                if len(records) >= limit:
                    raise TooManyIdeals(limit)
                seen[child] = len(records)
                new_addable = tuple(a for a in addable if a != v) + tuple(
                    w for w in inst.succs[v] if pred_mask[w] | child == child)
                changed = set(touch[v])
                new_cut = tuple(t for t in cut if t not in changed) + tuple(
                    t for t in sorted(changed) if crosses(t, child))
                records.append((child, new_addable, tuple(c + nums[k][v] for k, c in enumerate(cint)),
                                tuple(b + inel[k][v] for k, b in enumerate(bad)), mem + inst.fixed[v],
                                act + inst.act[v], new_cut))
        m = len(records)
        self.m, self.n = m, n
        self.bits = [r[0] for r in records]
        self.size = np.array([r[0].bit_count() for r in records], dtype=np.int32)
        self.time = [np.array([r[2][k] / dens[k] for r in records], dtype=np.float64) for k in range(nk)]
        self.key = np.array([r[2][nk] / dens[nk] for r in records], dtype=np.float64)
        self.inel = [np.array([r[3][k] for r in records], dtype=np.int32) for k in range(nk)]
        self.mem = np.array([r[4] for r in records], dtype=np.int64)
        self.act = np.array([r[5] for r in records], dtype=np.int64)
        self.tc = np.array([c for _, _, c in tensors] + [0.0])
        # forward tensors (every consumer an order successor of the source: an ideal holding a consumer
        # holds the source) and the others, each with its own cut lists
        preds = [set(p) for p in inst.preds]
        forward = [all(src in preds[w] for w in cons) for src, cons, _ in tensors]
        self.cut_t = _pad([tuple(t for t in r[6] if forward[t]) for r in records], len(tensors))
        self.cut_b = _pad([tuple(t for t in r[6] if not forward[t]) for r in records], len(tensors))
        self.backward = not all(forward)
        self.cut = self.tc[self.cut_t].sum(axis=1)
        self.index = seen
        self.empty, self.full = 0, seen[(1 << n) - 1]
        width = (n + 63) // 64
        self.words = _words(self.bits, width)
        # the source of each tensor as (word, bit) (the dummy tensor: any), and the consumers of each cut
        # tensor outside the ideal, as a bitset
        src = np.array([s for s, _, _ in tensors] + [0], dtype=np.int64)
        self.src_word, self.src_bit = src >> 6, (src & 63).astype(np.uint64)
        self.consumers = _words([sum(1 << w for w in cons) for _, cons, _ in tensors] + [0], width)
        self.pending = self.consumers[self.cut_t] & ~self.words[:, None, :]


def _words(bitsets: list[int], width: int) -> np.ndarray:
    """Python-integer bitsets as rows of ``width`` little-endian 64-bit words."""
    data = b"".join(b.to_bytes(8 * width, "little") for b in bitsets)
    return np.frombuffer(data, dtype="<u8").reshape(len(bitsets), width).astype(np.uint64)


def _pad(rows: list[tuple[int, ...]], fill: int) -> np.ndarray:
    width = max(1, max(map(len, rows)))
    out = np.full((len(rows), width), fill, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def count_ideals(dag: CostDAG, limit: int = MAX_IDEALS) -> int:
    """The number of down-closed sets of a cost DAG (including the empty set and the whole DAG); raises
    :class:`PartitionError` beyond ``limit``."""
    try:
        return Ideals(compile_dag(dag, [Kind(STAGE, 1, None, False)]), limit).m
    except TooManyIdeals:
        raise PartitionError(f"cost DAG {dag.name!r} has more than {limit} down-closed sets") from None
