"""Pipeline-stage partitioning of a cost DAG: exact DP over down-closed sets, ILP, brute force.

**Problem.** Split the nodes of a :class:`~layoutsearch.costdag.CostDAG` into ``K`` non-empty stages
(one per pipeline device), each within a memory limit, minimizing one of two objectives:

* ``"throughput"`` (the max-load objective of the device-placement literature, Tarnawski et al. 2020):
  a stage's *load* is the compute of its nodes plus the transfer time of every tensor crossing its
  boundary, paid once by the sending stage and once by each receiving stage (stages talk directly);
  minimize the largest load, the steady-state time per micro-batch.
* ``"gpipe"``: the GPipe step time for ``M`` micro-batches, ``(M + K - 1) * max_k t_k`` (Huang et al.
  2019), where ``t_k`` is stage ``k``'s per-micro-batch forward+backward time plus its point-to-point
  transfers over the stage axis, not overlapped with compute. Stages talk only to their neighbours on
  the axis, so a tensor from stage ``i`` to stage ``j > i + 1`` is relayed: stage ``i`` sends it, stages
  ``i+1 .. j-1`` receive and send it, stage ``j`` receives it. Equivalently, ``t_k = compute(S_k) +
  cut(I_{k-1}) + cut(I_k)`` where ``I_k`` is the union of stages ``0..k`` and ``cut(I)`` the transfer
  time of the tensors live across ``I`` (produced inside, consumed outside).

A stage's memory is ``sum(memory_bytes) + M * sum(activation_bytes)`` of its nodes (``M`` micro-batches
of activations in flight; ``M = 1`` by default).

**Contiguous and non-contiguous.** A partition is *contiguous* when its stages can be ordered so that
every edge goes from a stage to the same or a later one; then each prefix ``I_k = S_0 ∪ .. ∪ S_k`` is
down-closed (an *ideal*) and each stage is a difference ``I_k \\ I_{k-1}`` of two ideals. Intervals of
one fixed topological order are a special case, and not enough: two independent branches may go to
different stages in a way no single order makes contiguous intervals of. A partition whose stage graph
(the quotient) is acyclic is always contiguous in this sense, since a topological order of the
quotient orders the stages; so "non-contiguous with acyclic stage dependencies" is the same space, and
``contiguous=False`` means the general case: any assignment, a device may hold several pieces and the
quotient may have cycles. That is well defined for the throughput objective (steady-state pipelining,
as in interleaved/virtual-stage schedules); the GPipe objective needs a stage order and is contiguous
only.

**Methods.**

* ``"dp"`` (contiguous; Tarnawski et al. 2020, Section 4): enumerate the ideals of the DAG, then
  ``dp[k][I] = min over ideals J ⊊ I of max(dp[k-1][J], load(I \\ J))``, ``dp[0][∅] = 0``; the answer
  is ``dp[K][V]``. A stage's load depends on its boundary, which for ``I \\ J`` is determined by the
  tensors live across ``J`` and across ``I``. Pairs are pruned to ``compute(I) - compute(J) <= U`` for an
  upper bound ``U`` of the optimum (load >= compute), found by a first pass; the result is exact.
  Complexity: ``O(m w n / 64)`` to enumerate ``m`` ideals of a DAG of width ``w``; ``O(P (w + f d) + K P)``
  for the DP, where ``P <= m^2`` is the number of comparable ideal pairs inside the window (about
  ``m^2 / K`` for layer chains), ``f`` the largest number of live tensors across a cut, ``d`` the largest
  number of consumers of a tensor. ``m`` is ``O(n)`` for layer chains with short parallel branches and
  ``O((n / w)^w)`` in general; ``max_ideals`` caps it.
* ``"ilp-pulp"``, ``"ilp-ortools"`` (Tarnawski et al. 2020, Section 5): binaries ``x[v,k]``; contiguity
  as "each prefix of stages is down-closed" (``sum_{i<=j} x[u,i] >= sum_{i<=j} x[v,i]`` per edge
  ``u -> v``); send/receive (throughput) or live-across-cut (GPipe) indicators linearized by
  ``s >= x[a,k] - x[b,k]``; ``L >= load_k`` minimized. ``n K`` binaries, ``O((n + |E|) K)`` constraints.
  Solved by CBC through PuLP, or by OR-tools' CP-SAT (times rounded to 1e-9 of a lower bound of the
  optimum; memory rows in integer units of at most 2^31, exact when the sizes share a common unit, else
  conservative). A time limit returns the best partition found, labelled not optimal, with its relative
  gap to the solver's bound.
* ``"brute"``: every (monotone, for contiguous) assignment, ``O(K^n (n + |E|))``; for tests (``n <= 12``).

Every method's answer is re-evaluated by :func:`stage_loads`, the one definition of the objectives;
the DP and the ILPs check that their own value agrees with it.

References: J. Tarnawski, A. Phanishayee, N. Devanur, D. Mahajan, F. Nina Paravecino, "Efficient
Algorithms for Device Placement of DNN Graph Operators", NeurIPS 2020. Y. Huang et al., "GPipe:
Efficient Training of Giant Neural Networks using Pipeline Parallelism", NeurIPS 2019.
"""

from __future__ import annotations

import math
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from layoutsearch.costdag import CostDAG
from layoutsearch.errors import PartitionError
from layoutsearch.gantt import bubble_fraction
from layoutsearch.units import format_bytes

OBJECTIVES = ("throughput", "gpipe")
SOLVERS = ("auto", "dp", "ilp-pulp", "ilp-ortools", "brute")
MAX_IDEALS = 200_000
"""Default cap on the number of ideals the DP enumerates (memory: about ``m * n / 8`` bytes)."""
BRUTE_MAX_NODES = 12
AUTO_ILP_TIME_LIMIT = 60.0
"""Seconds given to the ILP when ``solver="auto"`` falls back to it without a ``time_limit``."""
_RTOL = 1e-9


@dataclass(frozen=True)
class Partition:
    """Stages of a cost DAG and what they cost.

    ``loads`` are per-stage loads (throughput) or per-micro-batch stage times (GPipe), in seconds;
    ``objective`` is the largest load (throughput) or the step time ``(M + K - 1) * max(loads)`` (GPipe);
    ``gap`` is the relative gap to a proven lower bound (0 when optimal, None when unknown).
    """

    stages: tuple[tuple[str, ...], ...]
    loads: tuple[float, ...]
    memory: tuple[float, ...]
    objective: float
    method: str
    optimal: bool
    gap: float | None
    kind: str = "throughput"
    microbatches: int = 1
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def assignment(self) -> dict[str, int]:
        """Node name -> stage index."""
        return {n: k for k, s in enumerate(self.stages) for n in s}

    @property
    def bubble_fraction(self) -> float:
        """GPipe's idle fraction ``(K - 1) / (M + K - 1)`` (with equal stage times)."""
        return bubble_fraction(self.num_stages, self.microbatches)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "objective_kind": self.kind, "objective": self.objective, "microbatches": self.microbatches,
            "method": self.method, "optimal": self.optimal, "gap": self.gap,
            "stages": [{"nodes": list(s), "load": ld, "memory": mem}
                       for s, ld, mem in zip(self.stages, self.loads, self.memory, strict=True)],
        }
        if self.kind == "gpipe":
            d["bubble_fraction"] = self.bubble_fraction
        if self.info:
            d["info"] = dict(self.info)
        return d


class StageCosts(NamedTuple):
    """What :func:`stage_loads` returns."""

    loads: tuple[float, ...]
    memory: tuple[int, ...]
    objective: float


# -- the objective (one definition for every method) ----------------------------------------------------------------

class _Ctx:
    """The DAG compiled to integer indices in its canonical topological order."""

    def __init__(self, dag: CostDAG) -> None:
        self.dag = dag
        self.names = dag.topological_order
        idx = {name: i for i, name in enumerate(self.names)}
        self.n = len(self.names)
        nodes = [dag.node(name) for name in self.names]
        self.comp = [n.compute_s for n in nodes]
        self.fixed = [n.memory_bytes for n in nodes]
        self.act = [n.activation_bytes for n in nodes]
        self.preds = [tuple(idx[p] for p in dag.predecessors[name]) for name in self.names]
        self.succs = [tuple(idx[s] for s in dag.successors[name]) for name in self.names]
        self.tensors = [(idx[t.src], tuple(idx[c] for c in t.consumers), t.transfer_s) for t in dag.tensors]

    def memw(self, microbatches: int) -> list[int]:
        return [f + microbatches * a for f, a in zip(self.fixed, self.act, strict=True)]


def _evaluate(ctx: _Ctx, sigma: Sequence[int], k: int, kind: str, microbatches: int) -> tuple[list[float], list[int]]:
    """Per-stage loads and memory of the assignment ``sigma`` (topological index -> stage)."""
    loads = [0.0] * k
    mem = [0] * k
    for v, s in enumerate(sigma):
        loads[s] += ctx.comp[v]
        mem[s] += ctx.fixed[v] + microbatches * ctx.act[v]
    for src, cons, c in ctx.tensors:
        s = sigma[src]
        receivers = {sigma[w] for w in cons}
        receivers.discard(s)
        if not receivers:
            continue
        if kind == "gpipe":
            lo, hi = min(receivers), max(receivers)
            if lo < s:
                w = next(w for w in cons if sigma[w] == lo)
                raise PartitionError(
                    f"the gpipe objective needs stages in pipeline order, but edge {ctx.names[src]!r} -> "
                    f"{ctx.names[w]!r} goes from stage {s} back to stage {lo}")
            loads[s] += c
            for j in range(s + 1, hi):
                loads[j] += 2 * c
            loads[hi] += c
        else:
            loads[s] += c
            for r in receivers:
                loads[r] += c
    return loads, mem


def _value(loads: Sequence[float], kind: str, microbatches: int) -> float:
    worst = max(loads)
    return (microbatches + len(loads) - 1) * worst if kind == "gpipe" else worst


def stage_loads(dag: CostDAG, assignment: Mapping[str, int] | Sequence[Sequence[str]],
                objective: str = "throughput", microbatches: int = 1) -> StageCosts:
    """Per-stage loads, memory and the objective value of an assignment of nodes to stages.

    ``assignment`` maps every node to a stage index ``0..K-1`` (``K`` = the largest index + 1), or lists
    the stages' node names in stage order. This is the single definition of both objectives (see the
    module docstring) used by every method.
    """
    _check_objective(objective, microbatches)
    ctx = _Ctx(dag)
    sigma, k = _sigma(ctx, assignment)
    loads, mem = _evaluate(ctx, sigma, k, objective, microbatches)
    return StageCosts(tuple(loads), tuple(mem), _value(loads, objective, microbatches))


def _sigma(ctx: _Ctx, assignment: Mapping[str, int] | Sequence[Sequence[str]]) -> tuple[list[int], int]:
    if not isinstance(assignment, Mapping):
        stages = [list(stage) for stage in assignment]
        assignment = {name: k for k, stage in enumerate(stages) for name in stage}
        if len(assignment) != sum(map(len, stages)):
            raise PartitionError("a node appears in two stages")
        if any(not stage for stage in stages):
            raise PartitionError("a stage is empty")
    missing = [n for n in ctx.names if n not in assignment]
    unknown = [n for n in assignment if n not in ctx.dag.index]
    if unknown:
        raise PartitionError(f"assignment names unknown node(s) {unknown[:5]}")
    if missing:
        raise PartitionError(f"assignment leaves node(s) {missing[:5]} without a stage")
    sigma = [assignment[n] for n in ctx.names]
    if any(not isinstance(s, int) or s < 0 for s in sigma):
        raise PartitionError("stage indices must be integers >= 0")
    return sigma, max(sigma) + 1


def _check_objective(objective: str, microbatches: int) -> None:
    if objective not in OBJECTIVES:
        raise PartitionError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise PartitionError(f"microbatches must be an integer >= 1, got {microbatches!r}")


# -- ideals (down-closed sets) --------------------------------------------------------------------------------------

class _Ideals:
    """Every ideal of the DAG with what the DP needs to price a stage ``I \\ J``: compute (exactly
    rounded, so ``J ⊆ I`` implies ``comp[J] <= comp[I]``), memory, the tensors live across it (padded
    with a dummy tensor of cost 0) and their consumers outside it (``pending``, padded with a dummy node
    no ideal holds), its maximal nodes (padded with a dummy node that every ideal holds) and its members
    (one byte per node, or bits packed 8 per byte when that would exceed ``_UNPACKED_BYTES``)."""

    def __init__(self, ctx: _Ctx, limit: int) -> None:
        n, tensors = ctx.n, ctx.tensors
        pred_mask = [sum(1 << u for u in ctx.preds[v]) for v in range(n)]
        pred_set = [frozenset(p) for p in ctx.preds]
        in_t: list[set[int]] = [set() for _ in range(n)]
        out_t: list[list[int]] = [[] for _ in range(n)]
        for t, (src, cons, _) in enumerate(tensors):
            out_t[src].append(t)
            for w in cons:
                in_t[w].add(t)
        cons_mask = [sum(1 << w for w in cons) for _, cons, _ in tensors]
        den = max((c.as_integer_ratio()[1] for c in ctx.comp), default=1)
        comp_int = [c.as_integer_ratio()[0] * (den // c.as_integer_ratio()[1]) for c in ctx.comp]

        # One record per ideal: bits, addable nodes, exact compute numerator, fixed memory, activations,
        # live tensors, maximal nodes. Breadth first by size, so a child is never seen before its parents.
        roots = tuple(v for v in range(n) if not ctx.preds[v])
        records = [(0, roots, 0, 0, 0, (), ())]
        seen = {0: 0}
        head = 0
        while head < len(records):
            bits, addable, cint, mem, act, front, maxel = records[head]
            head += 1
            for v in addable:
                child = bits | (1 << v)
                if child in seen:
                    continue
                if len(records) >= limit:
                    raise _TooManyIdeals(limit)
                seen[child] = len(records)
                new_addable = tuple(a for a in addable if a != v) + tuple(
                    w for w in ctx.succs[v] if pred_mask[w] | child == child)
                new_front = tuple(t for t in front if t not in in_t[v] or cons_mask[t] | child != child)
                records.append((child, new_addable, cint + comp_int[v], mem + ctx.fixed[v], act + ctx.act[v],
                                new_front + tuple(out_t[v]), tuple(u for u in maxel if u not in pred_set[v]) + (v,)))
        m = len(records)
        self.m, self.n = m, n
        self.bits = [r[0] for r in records]
        self.size = np.array([r[0].bit_count() for r in records], dtype=np.int32)
        self.comp = np.array([r[2] / den for r in records], dtype=np.float64)
        self.mem = np.array([r[3] for r in records], dtype=np.int64)
        self.act = np.array([r[4] for r in records], dtype=np.int64)
        tc = np.array([c for _, _, c in tensors] + [0.0])
        self.tc = tc
        self.tsrc = np.array([s for s, _, _ in tensors] + [n], dtype=np.int32)
        dmax = max((len(cons) for _, cons, _ in tensors), default=1)
        self.tcons = np.full((len(tensors) + 1, dmax), n, dtype=np.int32)
        for t, (_, cons, _) in enumerate(tensors):
            self.tcons[t, :len(cons)] = cons
        self.front = _pad([r[5] for r in records], len(tensors))
        self.maxel = _pad([r[6] for r in records], n)
        self.cut = tc[self.front].sum(axis=1)
        never = n + 1
        self.pending = np.full((m, self.front.shape[1], dmax), never, dtype=np.int32)
        for i, r in enumerate(records):
            for j, t in enumerate(r[5]):
                out = [w for w in tensors[t][1] if not r[0] >> w & 1]
                self.pending[i, j, :len(out)] = out
        nb = (n + 2) // 8 + 1
        always = 1 << n
        packed = np.frombuffer(b"".join((b | always).to_bytes(nb, "little") for b in self.bits),
                               dtype=np.uint8).reshape(m, nb)
        self.unpacked = m * (n + 2) <= _UNPACKED_BYTES
        if self.unpacked:
            self.stride = n + 2
            self.member = np.ascontiguousarray(np.unpackbits(packed, axis=1, bitorder="little")[:, :n + 2]).ravel()
        else:
            self.stride, self.member = nb, packed.ravel()
        self.index = seen
        self.empty, self.full = 0, seen[(1 << n) - 1]

    def has(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Whether ideal ``rows`` holds node ``cols`` (broadcast), as uint8 0/1."""
        rows = rows.astype(np.int64) * self.stride
        if self.unpacked:
            return np.take(self.member, rows + cols)
        return (np.take(self.member, rows + (cols >> 3)) >> (cols & 7).astype(np.uint8)) & 1


class _TooManyIdeals(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def _pad(rows: list[tuple[int, ...]], fill: int) -> np.ndarray:
    width = max(1, max(map(len, rows)))
    out = np.full((len(rows), width), fill, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


_UNPACKED_BYTES = 256 * 2**20


def count_ideals(dag: CostDAG, limit: int = MAX_IDEALS) -> int:
    """The number of down-closed sets of ``dag`` (including the empty set and the whole DAG); raises
    :class:`PartitionError` beyond ``limit``."""
    try:
        return _Ideals(_Ctx(dag), limit).m
    except _TooManyIdeals:
        raise PartitionError(f"cost DAG {dag.name!r} has more than {limit} down-closed sets") from None


# -- the DP ---------------------------------------------------------------------------------------------------------

_PAIR_BUDGET = 400_000


class _DP:
    """``dp[k][I] = min_{J ⊊ I} max(dp[k-1][J], load(I \\ J))`` over ideals sorted by (key, size).

    The key (compute, or memory for ``kind="memory"``) is additive and lower-bounds a stage's load, so
    a solution of value ``<= ub`` only uses pairs with ``key[I] - key[J] <= ub`` in which ``I`` can end
    stage ``k`` and ``J`` stage ``k - 1`` for some ``k``: ``key[I] <= k ub`` and ``T - key[I] <= (K - k) ub``
    (``T`` = key of the whole DAG). Only those pairs are priced. ``subset`` restricts the ideals (the
    prefixes of one topological order give the best interval split, a quick upper bound).
    """

    def __init__(self, ideals: _Ideals, k: int, kind: str, microbatches: int, limit: int | None,
                 subset: np.ndarray | None = None) -> None:
        self.I, self.k, self.kind, self.mb, self.limit = ideals, k, kind, microbatches, limit
        # int64 unless the largest ideal's memory could reach 2^62 (then exact Python integers)
        wide = int(ideals.mem.max(initial=0)) + microbatches * int(ideals.act.max(initial=0)) >= 2**62
        mem, act = (ideals.mem.astype(object), ideals.act.astype(object)) if wide else (ideals.mem, ideals.act)
        self.memw = mem + microbatches * act
        self.key = self.memw.astype(np.float64) if kind == "memory" else ideals.comp
        idx = np.arange(ideals.m) if subset is None else np.asarray(subset)
        self.order = idx[np.lexsort((ideals.size[idx], self.key[idx]))]
        self.key_sorted = self.key[self.order]
        self.total = float(self.key[ideals.full])
        self.pairs = 0
        self.rounds = 0

    def solve(self, lower: float, upper: float | None = None) -> tuple[float, list[int]] | None:
        """The optimum and its chain of ideals ``∅ = I_0 ⊊ .. ⊊ I_K = V`` (None if infeasible). ``upper``:
        the value of a known solution, if any (one pass then suffices)."""
        lower = max(lower, self.total / self.k)  # the key of a stage lower-bounds its load
        ub = upper if upper is not None else max(lower * 1.25, 1e-300)
        while True:
            self.rounds += 1
            got = self._run(ub)
            if got is not None and got[0] <= ub * (1 + _RTOL):
                return got
            if got is None and ub >= self.total:  # every pair was in the window: nothing fits the limit
                return None
            ub = got[0] if got is not None else ub * 2

    def _windows(self, ub: float) -> tuple[np.ndarray, np.ndarray]:
        """Per sorted position of I: the sorted positions ``[lo, hi)`` of the J worth pairing with it."""
        u, ks, k, total = ub * (1 + _RTOL) + 1e-300, self.key_sorted, self.k, self.total
        first = np.ceil(ks / u)  # the stages I may end: first .. last
        last = k - np.ceil((total - ks) / u)
        lo = np.maximum(np.searchsorted(ks, ks - u, side="left"),
                        np.searchsorted(ks, total - (k + 1 - first) * u, side="left"))
        hi = np.minimum(np.arange(len(ks)), np.searchsorted(ks, (last - 1) * u, side="right"))
        return lo, np.where(first <= last, np.maximum(hi, lo), lo)

    def _run(self, ub: float) -> tuple[float, list[int]] | None:
        m, k = self.I.m, self.k
        dp = np.full((k + 1, m), math.inf)
        dp[0, self.I.empty] = 0.0
        lo, hi = self._windows(ub)
        cum = np.cumsum(hi - lo)
        a, n = 0, len(lo)
        while a < n:
            b = max(a + 1, int(np.searchsorted(cum, (cum[a - 1] if a else 0) + _PAIR_BUDGET, side="right")))
            q, p, load = self._pairs(np.arange(a, b), lo[a:b], hi[a:b])
            a = b
            if not len(q):
                continue
            starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
            uq = q[starts]
            for j in range(1, k + 1):
                dp[j, uq] = np.minimum.reduceat(np.maximum(dp[j - 1, p], load), starts)
        value = float(dp[k, self.I.full])
        if not math.isfinite(value):
            return None
        chain, q_ideal = [self.I.full], self.I.full
        pos = {int(i): j for j, i in enumerate(self.order)}
        for j in range(k, 0, -1):
            qpos = np.array([pos[q_ideal]])
            _, p, load = self._pairs(qpos, lo[qpos], hi[qpos])
            vals = np.maximum(dp[j - 1, p], load)
            q_ideal = int(p[int(np.argmin(vals))])
            chain.append(q_ideal)
        assert q_ideal == self.I.empty
        return value, chain[::-1]

    def _pairs(self, qpos: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ideal pairs (I, J), J ⊊ I, I at sorted positions ``qpos``, J at ``[lo, hi)``; with their load."""
        ideals = self.I
        counts = hi - lo
        total = int(counts.sum())
        q = np.repeat(self.order[qpos], counts)
        offsets = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(total)
        p = self.order[offsets]
        keep = ideals.size[p] < ideals.size[q]
        q, p = q[keep], p[keep]
        # J ⊆ I iff every maximal node of J is in I.
        keep = ideals.has(q[:, None], ideals.maxel[p]).all(axis=1)
        q, p = q[keep], p[keep]
        memw = self.memw[q] - self.memw[p]
        if self.limit is not None:
            keep = memw <= self.limit
            q, p, memw = q[keep], p[keep], memw[keep]
        self.pairs += len(q)
        if self.kind == "memory":
            load = memw.astype(np.float64)
        elif self.kind == "gpipe":
            load = ideals.comp[q] - ideals.comp[p] + ideals.cut[q] + ideals.cut[p]
        else:
            fq = ideals.front[q]
            send = (ideals.tc[fq] * (1 - ideals.has(p[:, None], ideals.tsrc[fq]))).sum(axis=1)
            fresh = ideals.has(q[:, None, None], ideals.pending[p]).any(axis=2)  # consumed in I \ J
            recv = (ideals.tc[ideals.front[p]] * fresh).sum(axis=1)
            load = ideals.comp[q] - ideals.comp[p] + send + recv
        return q, p, load


# -- ILP ------------------------------------------------------------------------------------------------------------

class _Model:
    """A MILP in rows ``lo <= sum coef * var <= hi``, minimizing one variable; solved by PuLP or OR-tools."""

    def __init__(self) -> None:
        self.vars: list[tuple[float, float, bool]] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, lb: float = 0.0, ub: float = 1.0, integer: bool = False) -> int:
        self.vars.append((lb, ub, integer))
        return len(self.vars) - 1

    def add(self, coeffs: dict[int, float], lo: float = -math.inf, hi: float = math.inf) -> None:
        self.rows.append((coeffs, lo, hi))


class _Solution(NamedTuple):
    status: str  # "optimal", "feasible" (stopped early), "infeasible", "none" (no solution in time)
    values: list[float]
    objective: float
    bound: float | None


def _solve_pulp(model: _Model, goal: int, time_limit: float | None) -> _Solution:
    import pulp

    prob = pulp.LpProblem("partition", pulp.LpMinimize)
    make = getattr(prob, "add_variable", None) or pulp.LpVariable  # PuLP >= 3.3 deprecates LpVariable(...)
    xs = [make(f"v{i}", lb, None if math.isinf(ub) else ub,
               cat=pulp.LpBinary if integer and (lb, ub) == (0, 1) else pulp.LpInteger if integer else pulp.LpContinuous)
          for i, (lb, ub, integer) in enumerate(model.vars)]
    prob += xs[goal]
    for coeffs, lo, hi in model.rows:
        expr = pulp.lpSum(c * xs[i] for i, c in coeffs.items())
        if lo == hi:
            prob += expr == lo
        else:
            if not math.isinf(lo):
                prob += expr >= lo
            if not math.isinf(hi):
                prob += expr <= hi
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cbc.log"
        with warnings.catch_warnings():  # PULP_CBC_CMD (the bundled CBC) is deprecated in favour of an extra
            warnings.simplefilter("ignore", DeprecationWarning)
            cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=_RTOL, logPath=str(log))
        prob.solve(cbc)
        text = log.read_text() if log.exists() else ""
    if prob.sol_status == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return _Solution("infeasible", [], math.inf, None)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return _Solution("none", [], math.inf, None)
    values = [x.value() or 0.0 for x in xs]
    optimal = prob.sol_status == pulp.LpSolutionOptimal and "Stopped on" not in text
    found = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
    bound = float(found.group(1)) if found else None
    return _Solution("optimal" if optimal else "feasible", values, values[goal], bound)


_CPSAT_RESOLUTION = 1e9
"""CP-SAT works in integers: rows with fractional coefficients (scaled times, about 1 for the lower bound)
are multiplied by this (less if a coefficient would exceed 2^31) and rounded; the goal variable counts
units of one over it."""


def _solve_ortools(model: _Model, goal: int, time_limit: float | None) -> _Solution:
    """OR-tools CP-SAT. Every variable but the goal is 0/1 in this model (send/receive/live indicators are
    0/1 at any vertex), so only the goal and the time coefficients need the integer scaling."""
    from ortools.sat.python import cp_model

    fractional = [abs(c) for coeffs, _, _ in model.rows for c in coeffs.values() if not float(c).is_integer()]
    res = min(_CPSAT_RESOLUTION, 2**31 / max(fractional, default=1.0))  # keep coefficients below 2^31
    top = max(sum(round(-c * res) for i, c in coeffs.items() if c < 0) for coeffs, _, _ in model.rows
              if goal in coeffs)  # the largest load any assignment can have
    if top >= 2**61:
        raise PartitionError("times span too many orders of magnitude for CP-SAT's integers; use solver 'ilp-pulp'")
    cp = cp_model.CpModel()
    xs = []
    for i, (lb, ub, _) in enumerate(model.vars):
        if i == goal:
            xs.append(cp.new_int_var(0, top, "goal"))
        else:
            assert (lb, ub) == (0, 1), "CP-SAT backend: only 0/1 variables besides the goal"
            xs.append(cp.new_bool_var(f"v{i}"))
    for coeffs, lo, hi in model.rows:
        scaled = goal in coeffs or any(not float(c).is_integer() for c in coeffs.values())
        factor = res if scaled else 1.0
        expr = sum((1 if i == goal else round(c * factor)) * xs[i] for i, c in coeffs.items())
        if not math.isinf(lo):
            cp.add(expr >= math.ceil(lo * factor))
        if not math.isinf(hi):
            cp.add(expr <= math.floor(hi * factor))
    cp.minimize(xs[goal])
    solver = cp_model.CpSolver()
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.relative_gap_limit = 0.0
    status = solver.solve(cp)
    if status == cp_model.INFEASIBLE:
        return _Solution("infeasible", [], math.inf, None)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Solution("none", [], math.inf, None)
    values = [float(solver.value(x)) for x in xs]
    values[goal] /= res
    return _Solution("optimal" if status == cp_model.OPTIMAL else "feasible", values, values[goal],
                     solver.best_objective_bound / res)


def _ilp(ctx: _Ctx, k: int, kind: str, mb: int, limit: int | None, contiguous: bool, backend: str,
         time_limit: float | None, info: dict[str, Any]) -> tuple[_Solution, list[int]]:
    """Tarnawski et al.'s ILP: ``x[v][s] = 1`` iff node ``v`` is on stage ``s``; minimize ``L >= load_s``.
    Times are scaled by a lower bound of the optimum, so that the solvers' absolute tolerances (about 1e-6)
    are relative ones; the solution is returned in seconds. Memory rows stay in integer bytes."""
    n, mdl = ctx.n, _Model()
    scale = 1.0 / (_lower_bound(ctx, k) or 1.0)
    x = [[mdl.var(0, 1, True) for _ in range(k)] for _ in range(n)]
    for v in range(n):
        mdl.add({x[v][s]: 1 for s in range(k)}, 1, 1)
    for s in range(k):
        mdl.add({x[v][s]: 1 for v in range(n)}, 1)
    if limit is not None:
        # Memory rows in integer units of g bytes: exact when g divides every size (g = their gcd); the
        # solvers' presolve mishandles coefficients beyond ~2^32, so larger numbers are rounded to coarser
        # units, conservatively (sizes up, the limit down): a stage may then be refused for lying within
        # n * g bytes of the limit, never admitted over it.
        memw = ctx.memw(mb)
        g = math.gcd(limit, *memw) or 1
        if limit // g > 2**31:
            g = -(-limit // 2**31)
            info["memory_unit_bytes"] = g
        for s in range(k):
            mdl.add({x[v][s]: -(-w // g) for v, w in enumerate(memw) if w}, hi=limit // g)

    def prefix(v: int, j: int, sign: float = 1.0) -> dict[int, float]:  # [stage of v <= j]
        return {x[v][i]: sign for i in range(j + 1)}

    if contiguous:  # every prefix of stages is down-closed
        for v in range(n):
            for u in ctx.preds[v]:
                for j in range(k - 1):
                    mdl.add(prefix(u, j) | prefix(v, j, -1.0), 0)
    else:  # symmetry: stages ordered by their first node
        for v in range(n):
            for s in range(1, k):
                if s > v:
                    mdl.add({x[v][s]: 1}, hi=0)
                else:
                    mdl.add({x[v][s]: 1} | {x[u][s - 1]: -1 for u in range(v)}, hi=0)
    loads: list[dict[int, float]] = [{x[v][s]: ctx.comp[v] * scale for v in range(n) if ctx.comp[v]}
                                     for s in range(k)]
    for src, cons, c in ctx.tensors:
        if not c:
            continue
        c *= scale
        if kind == "gpipe":  # live[j] >= [src in prefix j] - [w in prefix j]; paid by stages j and j + 1
            for j in range(k - 1):
                live = mdl.var()
                for w in cons:
                    mdl.add({live: 1} | prefix(src, j, -1.0) | prefix(w, j), 0)
                for s in (j, j + 1):
                    loads[s][live] = c
        else:  # send >= x[src] - x[w], receive >= x[w] - x[src], per stage
            for s in range(k):
                send, recv = mdl.var(), mdl.var()
                for w in cons:
                    mdl.add({send: 1, x[src][s]: -1, x[w][s]: 1}, 0)
                    mdl.add({recv: 1, x[w][s]: -1, x[src][s]: 1}, 0)
                loads[s][send] = loads[s][recv] = c
    goal = mdl.var(0, math.inf)
    for s in range(k):
        mdl.add({goal: 1} | {i: -c for i, c in loads[s].items()}, 0)
    sol = (_solve_pulp if backend == "ilp-pulp" else _solve_ortools)(mdl, goal, time_limit)
    sol = sol._replace(objective=sol.objective / scale, bound=None if sol.bound is None else sol.bound / scale)
    sigma = [max(range(k), key=lambda s, v=v: sol.values[x[v][s]]) for v in range(n)] if sol.values else []
    return sol, sigma


# -- brute force ----------------------------------------------------------------------------------------------------

def _assignments(ctx: _Ctx, k: int, contiguous: bool) -> Any:
    """Every assignment with all ``k`` stages used: monotone along edges (contiguous), or up to relabelling
    of the stages (restricted growth strings, non-contiguous)."""
    n, sigma = ctx.n, [0] * ctx.n

    def rec(v: int, top: int) -> Any:
        if n - v < k - 1 - top:
            return
        if v == n:
            if top == k - 1 and (not contiguous or len(set(sigma)) == k):
                yield sigma
            return
        if contiguous:
            lo = max((sigma[u] for u in ctx.preds[v]), default=0)
            choices = range(lo, k)
        else:
            choices = range(min(top + 2, k))
        for s in choices:
            sigma[v] = s
            yield from rec(v + 1, max(top, s))

    return rec(0, -1)


def _brute(ctx: _Ctx, k: int, kind: str, mb: int, limit: int | None, contiguous: bool) -> tuple[list[int], int]:
    """The best assignment (empty if none fits ``limit``) and the smallest achievable largest-stage memory."""
    if ctx.n > BRUTE_MAX_NODES:
        raise PartitionError(f"brute force is for tests: {ctx.n} nodes > {BRUTE_MAX_NODES}; use 'dp' or an ILP")
    best: list[int] = []
    best_value, min_mem = math.inf, math.inf
    for sigma in _assignments(ctx, k, contiguous):
        loads, mem = _evaluate(ctx, sigma, k, kind, mb)
        min_mem = min(min_mem, max(mem))
        if limit is not None and max(mem) > limit:
            continue
        value = _value(loads, kind, mb)
        if value < best_value:
            best, best_value = list(sigma), value
    return best, int(min_mem)


# -- the public entry points ----------------------------------------------------------------------------------------

def partition(dag: CostDAG, stages: int, *, objective: str = "throughput", microbatches: int = 1,
              memory_limit: float | None = None, contiguous: bool = True, solver: str = "auto",
              time_limit: float | None = None, max_ideals: int = MAX_IDEALS) -> Partition:
    """Split ``dag`` into ``stages`` non-empty pipeline stages minimizing ``objective`` (see the module
    docstring), each stage's memory within ``memory_limit`` bytes.

    ``solver``: ``"dp"`` (exact, contiguous), ``"ilp-pulp"`` / ``"ilp-ortools"`` (exact unless stopped by
    ``time_limit`` seconds; contiguous or not), ``"brute"`` (tests), ``"auto"`` (the DP for contiguous
    stages unless the DAG has more than ``max_ideals`` down-closed sets, then OR-tools for at most
    :data:`AUTO_ILP_TIME_LIMIT` seconds unless ``time_limit`` says otherwise; OR-tools for non-contiguous
    ones). Raises :class:`PartitionError` when no partition fits the memory limit, naming the smallest
    achievable largest-stage memory (or a lower bound on it).
    """
    _check_objective(objective, microbatches)
    if solver not in SOLVERS:
        raise PartitionError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    ctx = _Ctx(dag)
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise PartitionError(f"stages must be an integer >= 1, got {stages!r}")
    if stages > ctx.n:
        raise PartitionError(f"cannot split {ctx.n} nodes of cost DAG {dag.name!r} into {stages} non-empty stages")
    if not contiguous and objective == "gpipe":
        raise PartitionError("the gpipe objective needs contiguous stages (a micro-batch visits the stages in "
                             "order); drop --non-contiguous or use the throughput objective")
    if solver == "dp" and not contiguous:
        raise PartitionError("the DP covers contiguous stages only; use solver 'ilp-ortools' or 'ilp-pulp'")
    if memory_limit is not None and not memory_limit >= 0:
        raise PartitionError(f"memory_limit must be a number of bytes >= 0, got {memory_limit!r}")
    limit = None if memory_limit is None else int(memory_limit)
    if time_limit is not None and time_limit <= 0:
        raise PartitionError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    if limit is not None:
        memw = ctx.memw(microbatches)
        v = max(range(ctx.n), key=memw.__getitem__)
        if memw[v] > limit:
            raise PartitionError(_memory_message(dag, stages, microbatches, limit, memw[v], exact=False,
                                                 culprit=ctx.names[v]))
    info: dict[str, Any] = {}
    ideals = None
    if solver == "auto":
        solver = "dp" if contiguous else "ilp-ortools"
        if contiguous:
            try:
                ideals = _Ideals(ctx, max_ideals)
            except _TooManyIdeals:
                solver, info["fallback"] = "ilp-ortools", f"more than {max_ideals} down-closed sets: used the ILP"
                if time_limit is None:
                    time_limit = info["time_limit"] = AUTO_ILP_TIME_LIMIT
    if solver == "dp":
        sigma = _run_dp(ctx, ideals, stages, objective, microbatches, limit,
                        max_ideals, info)
        return _make(ctx, sigma, stages, objective, microbatches, "dp", True, 0.0, info, limit)
    if solver == "brute":
        sigma, min_mem = _brute(ctx, stages, objective, microbatches, limit, contiguous)
        if not sigma:
            assert limit is not None
            raise PartitionError(_memory_message(dag, stages, microbatches, limit, min_mem, exact=True))
        return _make(ctx, sigma, stages, objective, microbatches, "brute force", True, 0.0, info, limit)
    sol, sigma = _ilp(ctx, stages, objective, microbatches, limit, contiguous, solver, time_limit, info)
    if sigma and limit is not None and max(_evaluate(ctx, sigma, stages, objective, microbatches)[1]) > limit:
        # The solver's feasibility tolerance (about 1e-6, relative) let a stage exceed the limit by a hair:
        # solve again with the limit tightened by more than that tolerance.
        tighter = limit - max(1, math.ceil(limit * 2e-6))
        info["memory_limit_tightened_to"] = tighter
        sol, sigma = _ilp(ctx, stages, objective, microbatches, tighter, contiguous, solver, time_limit, info)
    if sol.status == "infeasible":
        assert limit is not None
        raise PartitionError(_memory_error_bound(ctx, dag, stages, microbatches, limit, contiguous, max_ideals))
    if sol.status == "none":
        raise PartitionError(f"{solver} found no partition within the time limit of {time_limit} s; "
                             "raise --time-limit")
    factor = microbatches + stages - 1 if objective == "gpipe" else 1
    part = _make(ctx, sigma, stages, objective, microbatches, solver, sol.status == "optimal", None, info, limit)
    value, tol = part.objective, 1e-5 * sol.objective * factor
    if value > sol.objective * factor + tol or (sol.status == "optimal" and value < sol.objective * factor - tol):
        raise AssertionError(f"ILP value {sol.objective * factor} disagrees with stage_loads {value}")
    if sol.status == "optimal":
        gap = 0.0
    else:
        bounds = [_lower_bound(ctx, stages)] + ([sol.bound] if sol.bound is not None else [])
        gap = max(0.0, (value - max(bounds) * factor) / value) if value > 0 else 0.0
    return Partition(part.stages, part.loads, part.memory, part.objective, part.method, part.optimal, gap,
                     part.kind, part.microbatches, part.info)


def _run_dp(ctx: _Ctx, ideals: _Ideals | None, k: int, kind: str, mb: int, limit: int | None, max_ideals: int,
            info: dict[str, Any]) -> list[int]:
    if ideals is None:
        try:
            ideals = _Ideals(ctx, max_ideals)
        except _TooManyIdeals:
            raise PartitionError(
                f"cost DAG {ctx.dag.name!r} has more than {max_ideals} down-closed sets: the exact DP is "
                "impractical; use solver 'ilp-ortools' (with a time limit) or raise max_ideals") from None
    # The best split into intervals of the topological order is a quick upper bound for the exact pass.
    lower = _lower_bound(ctx, k)
    prefixes = np.array([ideals.index[(1 << i) - 1] for i in range(ctx.n + 1)])
    interval = _DP(ideals, k, kind, mb, limit, subset=prefixes)
    first = interval.solve(lower)
    dp = _DP(ideals, k, kind, mb, limit)
    got = dp.solve(lower, None if first is None else first[0])
    info.update(ideals=ideals.m, pairs=interval.pairs + dp.pairs, rounds=interval.rounds + dp.rounds)
    if first is not None:
        info["interval_split"] = first[0] * (mb + k - 1 if kind == "gpipe" else 1)
    if got is None:
        assert limit is not None
        mem = _DP(ideals, k, "memory", mb, None).solve(0.0)
        assert mem is not None
        raise PartitionError(_memory_message(ctx.dag, k, mb, limit, int(mem[0]), exact=True))
    value, chain = got
    sigma = [0] * ctx.n
    for s in range(k):
        stage = ideals.bits[chain[s + 1]] & ~ideals.bits[chain[s]]
        for v in range(ctx.n):
            if stage >> v & 1:
                sigma[v] = s
    loads, _ = _evaluate(ctx, sigma, k, kind, mb)
    if abs(max(loads) - value) > _RTOL * max(1.0, value) * 10:
        raise AssertionError(f"DP value {value} disagrees with stage_loads {max(loads)}")
    return sigma


def _lower_bound(ctx: _Ctx, k: int) -> float:
    """A lower bound on the largest stage load (and stage time): loads are at least compute."""
    return max(math.fsum(ctx.comp) / k, max(ctx.comp))


def _memory_error_bound(ctx: _Ctx, dag: CostDAG, k: int, mb: int, limit: int, contiguous: bool,
                        max_ideals: int) -> str:
    if contiguous:
        try:
            mem = _DP(_Ideals(ctx, max_ideals), k, "memory", mb, None).solve(0.0)
            assert mem is not None
            return _memory_message(dag, k, mb, limit, int(mem[0]), exact=True)
        except _TooManyIdeals:
            pass
    memw = ctx.memw(mb)
    return _memory_message(dag, k, mb, limit, max(max(memw), -(-sum(memw) // k)), exact=False)


def _memory_message(dag: CostDAG, k: int, mb: int, limit: int, best: int, exact: bool, culprit: str = "") -> str:
    why = f" (node {culprit!r} alone needs that much)" if culprit else ""
    what = "is" if exact else "is at least"
    per_mb = f" with {mb} micro-batches in flight" if mb > 1 else ""
    return (f"no partition of cost DAG {dag.name!r} into {k} stages fits the memory limit of {_fmt_bytes(limit)}"
            f"{per_mb}: the smallest achievable largest-stage memory {what} {_fmt_bytes(best)}{why}; raise the "
            "limit, use more stages or fewer micro-batches")


def _fmt_bytes(n: float) -> str:
    """``17179869184 B (16.00 GiB)``: exact bytes, then a readable size."""
    return f"{int(n)} B" if abs(n) < 1024 else f"{int(n)} B ({format_bytes(n)})"


def _make(ctx: _Ctx, sigma: Sequence[int], k: int, kind: str, mb: int, method: str, optimal: bool,
          gap: float | None, info: Mapping[str, Any], limit: int | None) -> Partition:
    loads, mem = _evaluate(ctx, sigma, k, kind, mb)
    if limit is not None and max(mem) > limit:
        raise AssertionError(f"{method} returned a partition over the memory limit")
    stages = tuple(tuple(ctx.names[v] for v in range(ctx.n) if sigma[v] == s) for s in range(k))
    return Partition(stages, tuple(loads), tuple(mem), _value(loads, kind, mb), method, optimal, gap, kind, mb,
                     dict(info))


def equal_split(dag: CostDAG, stages: int, *, objective: str = "throughput", microbatches: int = 1,
                by: str = "auto") -> Partition:
    """The baseline: equal numbers of layers per stage (``by="layers"``; nodes carry a ``layer``) or of
    nodes in topological order (``by="nodes"``); ``"auto"`` uses layers when every node has one and there
    are at least ``stages`` layers. Earlier stages take the remainder. Priced by :func:`stage_loads`."""
    _check_objective(objective, microbatches)
    ctx = _Ctx(dag)
    layers = [dag.node(name).layer for name in ctx.names]
    if by == "auto":
        layered = all(layer is not None for layer in layers) and len(set(layers)) >= stages
        by = "layers" if layered else "nodes"
    if by == "layers":
        if any(layer is None for layer in layers):
            raise PartitionError("equal split by layers needs a 'layer' on every node")
        units = sorted(set(layers))  # type: ignore[type-var]
        key = [units.index(layer) for layer in layers]
    elif by == "nodes":
        units, key = list(range(ctx.n)), list(range(ctx.n))
    else:
        raise PartitionError(f"unknown split unit {by!r}; choose layers, nodes or auto")
    if stages < 1 or stages > len(units):
        raise PartitionError(f"cannot split {len(units)} {by} into {stages} non-empty stages")
    base, extra = divmod(len(units), stages)
    bounds = np.cumsum([base + (s < extra) for s in range(stages)])
    sigma = [int(np.searchsorted(bounds, u, side="right")) for u in key]
    return _make(ctx, sigma, stages, objective, microbatches, f"equal {by}", False, None, {}, None)


def against_equal_split(dag: CostDAG, part: Partition) -> dict[str, Any]:
    """``part`` against :func:`equal_split` into as many stages under the same objective: the split's method,
    objective and largest stage memory, and ``optimal_over_baseline`` (``part``'s objective / the split's;
    None when the split's is 0)."""
    base = equal_split(dag, part.num_stages, objective=part.kind, microbatches=part.microbatches)
    return {"method": base.method, "objective": base.objective, "max_memory": max(base.memory),
            "optimal_over_baseline": part.objective / base.objective if base.objective else None}
