"""Exact DP over down-closed sets for contiguous placements (Tarnawski et al. 2020, Section 4).

**Problem.** Contiguous placements (see :mod:`.instance`) minimizing the throughput (max load) or GPipe
objective, each device within its kind's memory limit. Each device holds ``I \\ J`` for ideals
``J ⊊ I`` of the order graph, the ideals forming a chain.

**Recurrence.** ``dp[s][I] = min over kinds k with s_k >= 1, ideals J ⊊ I of max(dp[s - e_k][J],
load_k(I \\ J))`` with ``dp[0][∅] = 0``, where ``s`` counts the devices used of each kind; the answer is
``dp[counts][V]`` (exactly ``K`` stages of one kind) or the least ``dp[s][V]`` over ``s <= counts`` (at
most that many devices). A stage's load on kind ``k``: its time on ``k`` (infinite when a unit may not run
there or the stage exceeds the kind's memory) plus, unless ``k`` is a host kind, the transfer time of
every tensor crossing the stage's boundary; such a tensor crosses the boundary of ``I`` or of ``J``, so
only those are priced. Pairs are pruned to ``key(I) - key(J) <= U`` for an upper bound ``U`` (the key, the
least time of the units on any kind, lower-bounds every load), found by a first pass over the prefixes of
the unit order (intervals of one topological order); the result is exact.

**Complexity.** ``O(P (w + f d) S)`` for ``P <= m^2`` priced pairs of the ``m`` ideals, ``f`` the largest
cut, ``d`` the largest fan-out and ``S`` the number of device-count vectors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.ideals import MAX_IDEALS, Ideals, TooManyIdeals
from layoutsearch.solvers.partition.instance import Instance, evaluate, memory_message

_RTOL = 1e-9
_CANDIDATES = 2_000_000
"""Candidate pairs (I, J) tested per block."""
_GATHER_BUDGET = 20_000_000
"""Elements gathered at once when pricing transfers (pairs x cut width x fan-out)."""


class DP:
    """The recurrence of the module docstring over ideals sorted by (key, size); ``subset`` restricts the
    ideals (the prefixes of one topological order give the best interval split, a quick upper bound).
    ``objective="memory"`` minimizes the largest stage memory instead (for error messages)."""

    def __init__(self, inst: Instance, ideals: Ideals, objective: str, microbatches: int, at_most: bool,
                 subset: np.ndarray | None = None) -> None:
        self.inst, self.I, self.objective, self.mb, self.at_most = inst, ideals, objective, microbatches, at_most
        # int64 unless the largest ideal's memory could reach 2^62 (then exact Python integers)
        wide = int(ideals.mem.max(initial=0)) + microbatches * int(ideals.act.max(initial=0)) >= 2**62
        mem, act = (ideals.mem.astype(object), ideals.act.astype(object)) if wide else (ideals.mem, ideals.act)
        self.memw = mem + microbatches * act
        self.key = self.memw.astype(np.float64) if objective == "memory" else ideals.key
        idx = np.arange(ideals.m) if subset is None else np.asarray(subset)
        self.order = idx[np.lexsort((ideals.size[idx], self.key[idx]))]
        self.key_sorted = self.key[self.order]
        self.words = ideals.words[self.order]
        self.total = float(self.key[ideals.full])
        self.counts = tuple(k.count for k in inst.kinds)
        self.k = sum(self.counts)
        kind_cap = [self._capacity(k) for k in range(len(self.counts))]
        caps = sorted((c for k, n in enumerate(self.counts) for c in [kind_cap[k]] * n), reverse=True)
        self.prefix = np.concatenate([[0.0], np.cumsum(caps)]) * (1 + 1e-12)
        # from this bound on, every device that can hold anything could hold all the key: every pair is in the
        # windows, so no solution within it means none at all (a slow CPU core holds less than one unit per
        # unit of load: the optimum may exceed the total key)
        self.unbounded = self.total / min((c for c in caps if c > 0), default=1.0)
        self.states = list(np.ndindex(*(c + 1 for c in self.counts)))
        self.held = np.unique([sum(n * c for n, c in zip(s, kind_cap, strict=True)) for s in self.states]) * (1 + 1e-12)
        self.sid = {s: i for i, s in enumerate(self.states)}
        limits = [k.limit for k in inst.kinds]
        self.limit = None if objective == "memory" or any(lim is None for lim in limits) else max(limits)
        self.possible = np.ones(ideals.m if subset is None else len(self.order), dtype=bool)
        """Per sorted position: whether the ideal may end a chain of stages within the current bound."""
        self.pairs = 0
        self.rounds = 0

    def _capacity(self, k: int) -> float:
        """The most key a device of kind ``k`` holds per unit of load: ``1 / r`` where ``r`` is the least
        ratio of a unit's time on ``k`` to its key (a CPU core about ten times slower holds a tenth)."""
        if self.objective == "memory":
            return 1.0
        time, key = self.inst.time[k], self.inst.key()
        ratios = [time[v] / key[v] for v in range(self.inst.n) if key[v] > 0]
        return 1.0 / min(ratios) if ratios else 1.0

    def solve(self, lower: float, upper: float | None = None) -> tuple[float, list[tuple[int, int]]] | None:
        """The optimum and its chain ``[(ideal, kind)]`` from ``∅`` to ``V`` (the kind of the stage ending at
        each ideal; None if infeasible). ``upper``: the value of a known solution, if any."""
        if self.prefix[-1] > 0:
            lower = max(lower, self.total / self.prefix[-1])
        ub = upper if upper is not None else max(lower * 1.25, 1e-300)
        while True:
            self.rounds += 1
            got = self._run(ub)
            if got is not None and got[0] <= ub * (1 + _RTOL):
                return got
            if got is None and ub >= self.unbounded:  # every pair was in the window: nothing fits
                return None
            ub = got[0] if got is not None else ub * 2

    def _windows(self, ub: float) -> tuple[np.ndarray, np.ndarray]:
        """Per sorted position of I: the sorted positions ``[lo, hi)`` of the J worth pairing with it.

        Devices hold at most their capacity (:meth:`_capacity`) times ``ub`` of key; ``P[s]``, the sum of
        the ``s`` largest, bounds what ``s`` devices hold. If ``J`` takes ``j`` devices and ``I \\ J`` one
        more, then ``key(I) <= P[j + 1]`` and ``total - key(I) <= P[k - j - 1]`` (the range ``jmin ..
        jmax`` of ``j``), so ``total - P[k - jmin] <= key(J) <= P[jmax]`` and ``key(I) - key(J) <= P[1]``."""
        u, ks, k, total = ub * (1 + _RTOL) + 1e-300, self.key_sorted, self.k, self.total
        cap = self.prefix * u
        jmin = np.searchsorted(cap[1:], ks, side="left")
        jmax = k - 1 - np.searchsorted(cap, total - ks, side="left")
        ok = (jmin <= jmax) & (jmin < k) & (jmax >= 0)
        jmin, jmax = np.clip(jmin, 0, k - 1), np.clip(jmax, 0, k - 1)
        lo = np.maximum(np.searchsorted(ks, ks - cap[1], side="left"),
                        np.searchsorted(ks, total - cap[k - jmin], side="left"))
        hi = np.minimum(np.arange(len(ks)), np.searchsorted(ks, cap[jmax], side="right"))
        return lo, np.where(ok & self._possible(ub), np.maximum(hi, lo), lo)

    def _possible(self, ub: float) -> np.ndarray:
        """Per sorted position: whether the ideal can be the union of the stages on some set of devices within
        ``ub``. Devices ``D`` hold at most ``c(D) ub`` of key (``c``: the sum of their capacities) and the
        others at most ``(C - c(D)) ub`` (``C``: all capacities), so ``c(D) ub - slack <= key <= c(D) ub``
        with ``slack = C ub - total``."""
        u, ks = ub * (1 + _RTOL) + 1e-300, self.key_sorted
        eps = 1e-9 * max(self.total, 1e-300)
        held = self.held * u
        slack = self.prefix[-1] * u - self.total
        i = np.minimum(np.searchsorted(held, ks - eps, side="left"), len(held) - 1)
        return (held[i] >= ks - eps) & (held[i] - slack <= ks + eps)

    def _run(self, ub: float) -> tuple[float, list[tuple[int, int]]] | None:
        m, nk = self.I.m, len(self.counts)
        dp = np.full((len(self.states), m), math.inf)
        dp[0, self.I.empty] = 0.0
        self.possible = self._possible(ub)
        lo, hi = self._windows(ub)
        a, n = 0, len(lo)
        steps = [(i, k, self.sid[s[:k] + (s[k] - 1,) + s[k + 1:]])
                 for i, s in enumerate(self.states) for k in range(nk) if s[k] >= 1]
        while a < n:
            b = min(n, a + max(1, _CANDIDATES // max(1, int(hi[a] - lo[a]))))
            while b - a > 1 and (b - a) * int(hi[a:b].max() - lo[a:b].min()) > 2 * _CANDIDATES:
                b = a + (b - a) // 2
            q, p, loads = self._pairs(a, b, lo, hi)
            a = b
            if not len(q):
                continue
            starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
            uq = q[starts]
            for i, k, prev in steps:
                dp[i, uq] = np.minimum(dp[i, uq], np.minimum.reduceat(np.maximum(dp[prev, p], loads[k]), starts))
        ends = dp[:, self.I.full]
        end = int(np.argmin(ends)) if self.at_most else len(self.states) - 1
        value = float(ends[end])
        if not math.isfinite(value):
            return None
        chain: list[tuple[int, int]] = []
        q_ideal, state = self.I.full, end
        pos = {int(i): j for j, i in enumerate(self.order)}
        while state != 0:
            _, p, loads = self._pairs(pos[q_ideal], pos[q_ideal] + 1, lo, hi)
            best = None
            for i, k, prev in steps:
                if i != state:
                    continue
                vals = np.maximum(dp[prev, p], loads[k])
                j = int(np.argmin(vals))
                if best is None or vals[j] < best[0]:
                    best = (float(vals[j]), k, prev, int(p[j]))
            assert best is not None
            chain.append((q_ideal, best[1]))
            state, q_ideal = best[2], best[3]
        assert q_ideal == self.I.empty
        return value, chain[::-1]

    def _pairs(self, a: int, b: int, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Ideal pairs (I, J), J ⊊ I, I at sorted positions ``a .. b - 1``, J at ``[lo, hi)`` of I's; with
        the load of ``I \\ J`` on each kind. The candidates are tested as one block of bitsets
        (``J ⊆ I`` iff ``J & ~I`` is empty)."""
        ideals, inst = self.I, self.inst
        jlo = int(lo[a:b].min())
        jhi = max(jlo, int(hi[a:b].max()))
        jpos = np.arange(jlo, jhi)
        mask = (jpos[None, :] >= lo[a:b, None]) & (jpos[None, :] < hi[a:b, None]) & self.possible[None, jlo:jhi]
        inside, outside = self.words[jlo:jhi], ~self.words[a:b]
        for w in range(self.words.shape[1]):
            mask &= (inside[None, :, w] & outside[:, None, w]) == 0
        qi, pj = np.nonzero(mask)  # grouped by I, as the DP's reduction needs
        q, p = self.order[a + qi], self.order[jlo + pj]
        memw = self.memw[q] - self.memw[p]
        if self.limit is not None:
            keep = memw <= self.limit
            q, p, memw = q[keep], p[keep], memw[keep]
        self.pairs += len(q)
        if self.objective == "memory":
            return q, p, [memw.astype(np.float64)] * len(inst.kinds)
        if self.objective == "gpipe":  # every tensor goes forward: the cuts are the live tensors
            transfers = ideals.cut[q] + ideals.cut[p]
        else:
            transfers = self._transfers(q, p)
        loads = []
        for k, kind in enumerate(inst.kinds):
            load = ideals.time[k][q] - ideals.time[k][p] + (0.0 if kind.host else transfers)
            bad = ideals.inel[k][q] != ideals.inel[k][p]
            if kind.limit is not None and kind.limit != self.limit:
                bad |= memw > kind.limit
            loads.append(np.where(bad, math.inf, load))
        return q, p, loads

    def _transfers(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """The transfer time of the tensors crossing the boundary of ``I \\ J``. Tensors follow order edges
        (an ideal holding a consumer holds the source), so ``I \\ J`` sends the tensors of cut(I) whose
        source is not in ``J`` and receives the tensors of cut(J) with a consumer in ``I``."""
        ideals = self.I
        total = np.empty(len(q))
        step = max(1000, _GATHER_BUDGET // ideals.pending[0].size)
        one = np.uint64(1)
        for i in range(0, len(q), step):
            qs, ps = q[i:i + step], p[i:i + step]
            rows = ideals.cut_t[qs]
            in_j = (ideals.words[ps[:, None], ideals.src_word[rows]] >> ideals.src_bit[rows]) & one
            sent = (ideals.tc[rows] * (in_j == 0)).sum(axis=1)
            fresh = (ideals.pending[ps] & ideals.words[qs][:, None, :]).any(axis=2)
            total[i:i + step] = sent + (ideals.tc[ideals.cut_t[ps]] * fresh).sum(axis=1)
            if ideals.backward:
                total[i:i + step] += self._backward_transfers(qs, ps)
        return total

    def _backward_transfers(self, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        """The transfer time of the other tensors crossing the boundary of ``S = I \\ J``: such a tensor
        crosses the boundary of ``I`` or of ``J``; those of cut(J) that also cross I are counted once."""
        ideals = self.I
        inside_i, stage = ideals.words[q], ideals.words[q] & ~ideals.words[p]
        total = np.zeros(len(q))
        for rows, dedupe in ((ideals.cut_b[q], False), (ideals.cut_b[p], True)):
            cons = ideals.consumers[rows]
            crosses = _crosses(stage, rows, cons, ideals)
            if dedupe:
                crosses &= ~_crosses(inside_i, rows, cons, ideals)
            total += (ideals.tc[rows] * crosses).sum(axis=1)
        return total


def _crosses(sets: np.ndarray, rows: np.ndarray, cons: np.ndarray, ideals: Ideals) -> np.ndarray:
    """Whether tensor ``rows[i, j]`` (consumers ``cons[i, j]``) crosses the boundary of unit set ``sets[i]``
    (bitsets): its source inside and a consumer outside, or the reverse."""
    one = np.uint64(1)
    src_in = ((sets[np.arange(len(sets))[:, None], ideals.src_word[rows]] >> ideals.src_bit[rows]) & one) == 1
    some_in = (cons & sets[:, None, :]).any(axis=2)
    some_out = (cons & ~sets[:, None, :]).any(axis=2)
    return np.where(src_in, some_out, some_in)


def run_dp(inst: Instance, ideals: Ideals | None, objective: str, mb: int, at_most: bool, max_ideals: int,
           info: dict[str, Any]) -> list[int]:
    """The optimal contiguous assignment (unit -> device), or PartitionError."""
    if ideals is None:
        try:
            ideals = Ideals(inst, max_ideals)
        except TooManyIdeals:
            raise PartitionError(
                f"cost DAG {inst.dag.name!r} has more than {max_ideals} down-closed sets after its exact "
                "reductions: the exact DP is impractical; use solver 'ilp-ortools' (with a time limit) or raise "
                "max_ideals") from None
    lower = lower_bound(inst)
    prefixes = np.array([ideals.index[(1 << i) - 1] for i in range(inst.n + 1)])
    interval = DP(inst, ideals, objective, mb, at_most, subset=prefixes)
    first = interval.solve(lower)
    dp = DP(inst, ideals, objective, mb, at_most)
    got = dp.solve(lower, None if first is None else first[0])
    info.update(units=inst.n, ideals=ideals.m, pairs=interval.pairs + dp.pairs, rounds=interval.rounds + dp.rounds)
    if first is not None:
        info["interval_split"] = first[0] * (mb + dp.k - 1 if objective == "gpipe" else 1)
    if got is None:
        kind = inst.kinds[0]
        if len(inst.kinds) == 1 and kind.limit is not None:
            mem = DP(inst, ideals, "memory", mb, at_most).solve(0.0)
            if mem is None:  # fewer units (co-location groups contracted) than stages to fill
                raise PartitionError(f"cannot split cost DAG {inst.dag.name!r} into {kind.count} non-empty stages: "
                                     f"its co-location groups leave {inst.n} units")
            raise PartitionError(memory_message(inst.dag, kind.count, mb, kind.limit, int(mem[0]),
                                                exact=True))
        raise PartitionError(f"no contiguous placement of cost DAG {inst.dag.name!r} fits the devices' memory")
    value, chain = got
    sigma = chain_assignment(inst, ideals, chain)
    loads, _ = evaluate(inst, sigma, objective, mb)
    if abs(max(loads) - value) > _RTOL * max(1.0, value) * 10:
        raise AssertionError(f"DP value {value} disagrees with the evaluated loads {max(loads)}")
    return sigma


def chain_assignment(inst: Instance, ideals: Ideals, chain: list[tuple[int, int]]) -> list[int]:
    """Unit -> device of a chain ``[(ideal, kind)]`` of the DP: stage ``I \\ J`` on the next device of its kind."""
    sigma = [0] * inst.n
    used = [0] * len(inst.kinds)
    offset = np.cumsum([0] + [k.count for k in inst.kinds])
    prev = ideals.empty
    for ideal, k in chain:
        stage = ideals.bits[ideal] & ~ideals.bits[prev]
        device = int(offset[k]) + used[k]
        used[k] += 1
        for v in range(inst.n):
            if stage >> v & 1:
                sigma[v] = device
        prev = ideal
    return sigma


def lower_bound(inst: Instance) -> float:
    """A lower bound on the largest load: loads are at least the time of their units (on the fastest kind
    each may use), and the devices share the whole."""
    key = inst.key()
    return max(math.fsum(key) / max(1, inst.num_devices), max(key))


__all__ = ["DP", "MAX_IDEALS", "chain_assignment", "lower_bound", "run_dp"]
