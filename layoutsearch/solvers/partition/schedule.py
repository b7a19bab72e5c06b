"""Non-contiguous latency: node-level schedules (P|prec,c_ij|Cmax), a list-scheduling heuristic and the driver.

The objective (:mod:`.instance`, :func:`~.instance.schedule_makespan`): every node runs on its device for its
time on that device's kind, a device runs one node at a time (nodes of time 0 take no device time), a node
starts once each predecessor has finished plus, across devices, the edge's transfer delay (its tensors'
transfer time, paid by the sender and by the receiver unless a host); the latency is the makespan.

**Heuristic** (:func:`heuristic`): HEFT-style list scheduling (Topcuoglu et al. 2002). Units are taken in
order of their upward rank (the longest path to a sink of mean times and, weighted by a factor tried at a few
values, transfer times) among those whose predecessors are placed; each goes to the device where it
*finishes* earliest, inserted into an idle gap of the device when one is long enough, among the devices its
kind can run it on whose memory holds it (a co-location group goes, whole, where its first node goes, its
memory reserved then; of identical empty devices only the first is tried). Also the given assignments (the
contiguous latency heuristic's placement) scheduled as they are, in topological order per device and by
list scheduling with the devices fixed. Then a local search moves single units (whole groups) of the
critical path to other devices while the list-scheduled makespan improves. Every candidate is priced by
:func:`~.instance.schedule_makespan`, the one definition; the best wins.

**Lower bound** (:func:`lower_bound`): the path bound of :mod:`.bounds` is *not* valid here (it relies on an
acyclic device graph: a path of a non-contiguous schedule may come back to a device), so the bound is the
longest dependency path of the nodes' fastest times (the nodes of a path run one after another; transfers
only add) and the relaxation without communication (the makespan is at least the busiest device's work,
which is at least that relaxation's largest load).
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from layoutsearch.solvers.partition.bounds import _heaviest_path, critical_path, no_communication_bound
from layoutsearch.solvers.partition.instance import Instance, edge_delays, schedule_makespan

HEURISTIC_TIME_LIMIT = 10.0
"""Seconds the list scheduler's local search runs at most unless told otherwise."""
_RANK_WEIGHTS = (0.0, 1.0, 2.0)
"""Weights of the transfer times in the upward ranks tried."""


@dataclass(frozen=True)
class Schedule:
    """An assignment (unit -> device), each device's units in run order, and its makespan."""

    sigma: tuple[int, ...]
    order: tuple[tuple[int, ...], ...]
    value: float
    starts: tuple[float, ...]


def priced(inst: Instance, sigma: Sequence[int], order: Sequence[Sequence[int]]) -> Schedule:
    """The schedule priced by the one definition."""
    value, starts = schedule_makespan(inst, sigma, order)
    return Schedule(tuple(sigma), tuple(tuple(o) for o in order), value, tuple(starts))


def lower_bound(inst: Instance, at_most: bool = True) -> float:
    """A lower bound on the makespan of every schedule (module docstring)."""
    return max(no_communication_bound(inst), critical_path(inst), path_bound(Problem(inst, at_most)))


def path_bound(p: Problem) -> float:
    """The least time of a dependency path ``p_1 .. p_L`` cut into *runs*, maximal stretches on one device: a
    run on a device of kind ``k`` takes at least its nodes' times on ``k``, every node of the groups of its
    nodes may run on ``k`` and those groups' memory fits one device of ``k``; consecutive runs are on
    different devices (of a kind with one device, different kinds), so the edge between them pays its delay
    (the transfer time once per non-host end). Every schedule's makespan is at least this (its path runs in
    that order, whatever else the devices do, and may come back to a device: each run alone must still fit).
    Maximized over the heaviest paths by fastest time, by memory and by both."""
    inst = p.inst
    n = inst.n
    if n == 0:
        return 0.0
    succ = [set(inst.succs[v]) for v in range(n)]
    key = inst.key()
    mem = [float(p.group_mem[p.rep[v]]) for v in range(n)]
    total_key, total_mem = math.fsum(key) or 1.0, math.fsum(mem) or 1.0
    best = 0.0
    for weight in (key, mem, [key[v] / total_key + mem[v] / total_mem for v in range(n)]):
        best = max(best, _cut_path(p, _heaviest_path(list(range(n)), succ, weight)))
    return best


def _cut_path(p: Problem, path: list[int]) -> float:
    """``g[j][k]``: the least time of ``p_1 .. p_j`` whose last run, ending at ``p_j``, is on kind ``k``."""
    inst = p.inst
    kinds = [k for k, kind in enumerate(inst.kinds) if kind.count > 0]
    first = {k: inst.device_kind.index(k) for k in kinds}
    ok = {(p.rep[v], k) for v in path for k in kinds if first[k] in p.eligible[p.rep[v]]
          or any(inst.device_kind[d] == k for d in p.eligible[p.rep[v]])}
    g: list[dict[int, float]] = []
    for j in range(len(path)):
        row = dict.fromkeys(kinds, math.inf)
        for k in kinds:
            limit, host = inst.kinds[k].limit, inst.kinds[k].host
            t, groups, used = 0.0, set(), 0
            for i in range(j, -1, -1):
                v = path[i]
                r = p.rep[v]
                if (r, k) not in ok:
                    break
                if r not in groups:
                    groups.add(r)
                    used += p.group_mem[r]
                    if limit is not None and used > limit:
                        break
                t += inst.time[k][v]
                if i == 0:
                    row[k] = min(row[k], t)
                    continue
                c = p.delays.get((path[i - 1], v), 0.0)
                for k2, before in g[i - 1].items():
                    if k2 == k and inst.kinds[k].count < 2:
                        continue
                    row[k] = min(row[k], before + t + c * ((not inst.kinds[k2].host) + (not host)))
        g.append(row)
    got = min(g[-1].values())
    return got if math.isfinite(got) else 0.0


class Problem:
    """What the list scheduler needs, precomputed: groups, eligibility, memory, transfer delays."""

    def __init__(self, inst: Instance, at_most: bool) -> None:
        self.inst, self.at_most = inst, at_most
        n, nd = inst.n, inst.num_devices
        first: dict[str, int] = {}
        self.rep = [first.setdefault(inst.dag.nodes[inst.members[v][0]].group or f"\0{v}", v) for v in range(n)]
        self.members: dict[int, list[int]] = {}
        for v in range(n):
            self.members.setdefault(self.rep[v], []).append(v)
        self.reps = sorted(self.members)
        self.host = [inst.kinds[k].host for k in inst.device_kind]
        self.limit = [inst.kinds[k].limit for k in inst.device_kind]
        memw = inst.memw(1)
        self.group_mem = {r: sum(memw[v] for v in ms) for r, ms in self.members.items()}
        self.dur = [[inst.time[inst.device_kind[d]][v] for d in range(nd)] for v in range(n)]
        self.eligible = {r: [d for d in range(nd) if all(math.isfinite(self.dur[v][d]) for v in ms)
                             and (self.limit[d] is None or self.group_mem[r] <= self.limit[d])]
                         for r, ms in self.members.items()}
        self.delays = edge_delays(inst)
        # identical devices: same kind (same times, limit and host flag)
        self.twin = [d > 0 and inst.device_kind[d] == inst.device_kind[d - 1] for d in range(nd)]

    def hop(self, u: int, w: int, du: int, dw: int) -> float:
        """The delay of edge ``u -> w`` from device ``du`` to ``dw``."""
        if du == dw:
            return 0.0
        return self.delays.get((u, w), 0.0) * ((not self.host[du]) + (not self.host[dw]))

    def ranks(self, weight: float) -> list[float]:
        """Upward ranks: mean time over the devices that may run the unit, plus the heaviest path below it with
        transfers weighted by ``weight``."""
        inst = self.inst
        mean = []
        for v in range(inst.n):
            finite = [t for t in self.dur[v] if math.isfinite(t)]
            mean.append(math.fsum(finite) / len(finite) if finite else 0.0)
        rank = [0.0] * inst.n
        for v in reversed(range(inst.n)):  # unit order is topological
            rank[v] = mean[v] + max((weight * self.delays.get((v, w), 0.0) + rank[w] for w in inst.succs[v]),
                                    default=0.0)
        return rank


def list_schedule(p: Problem, rank: Sequence[float], fixed: Sequence[int] | None = None) -> Schedule | None:
    """HEFT (module docstring): ready units by rank, each to its earliest-finish device (``fixed``: the given
    one), inserted into an idle gap; None when a unit fits no device (memory, eligibility, exactly-k)."""
    inst = p.inst
    n, nd = inst.n, inst.num_devices
    missing = [len(inst.preds[v]) for v in range(n)]
    heap = [(-rank[v], v) for v in range(n) if not missing[v]]
    heapq.heapify(heap)
    sigma, finish = [-1] * n, [0.0] * n
    busy: list[list[tuple[float, float]]] = [[] for _ in range(nd)]
    mem = [0] * nd
    group_at: dict[int, int] = {}
    used, left = [False] * nd, len(p.reps)
    while heap:
        _, v = heapq.heappop(heap)
        r = p.rep[v]
        if fixed is not None:
            options = [fixed[v]]
        elif r in group_at:
            options = [group_at[r]]
        else:
            options = _options(p, r, mem, used, left)
        best: tuple[float, float, int] | None = None
        for d in options:
            ready = max((finish[u] + p.hop(u, v, sigma[u], d) for u in inst.preds[v]), default=0.0)
            start = _gap(busy[d], ready, p.dur[v][d])
            if best is None or start + p.dur[v][d] < best[0]:
                best = (start + p.dur[v][d], start, d)
        if best is None:
            return None
        finish[v], start, d = best
        sigma[v] = d
        if p.dur[v][d] > 0:
            bisect.insort(busy[d], (start, finish[v]))
        if r not in group_at:
            group_at[r] = d
            mem[d] += p.group_mem[r]
            left -= 1
            used[d] = True
        for w in inst.succs[v]:
            missing[w] -= 1
            if not missing[w]:
                heapq.heappush(heap, (-rank[w], w))
    if not p.at_most and not all(used):
        return None
    return by_start(inst, sigma, finish)


def _options(p: Problem, r: int, mem: list[int], used: list[bool], left: int) -> list[int]:
    """The devices unit group ``r`` may go to: eligible, its memory fits, of identical empty devices only the
    first; when exactly every device must be used and no more groups are left than empty devices, an empty one."""
    empty = used.count(False)
    out = []
    for d in p.eligible[r]:
        if p.limit[d] is not None and mem[d] + p.group_mem[r] > p.limit[d]:
            continue
        if not used[d] and p.twin[d] and not used[d - 1]:
            continue
        if not p.at_most and left <= empty and used[d]:
            continue
        out.append(d)
    return out


def _gap(busy: list[tuple[float, float]], ready: float, dur: float) -> float:
    """The earliest start at or after ``ready`` of an idle stretch of length ``dur`` between the busy intervals."""
    if dur <= 0:
        return ready
    at = ready
    i = max(0, bisect.bisect_left(busy, (ready, -math.inf)) - 1)
    for s, f in busy[i:]:
        if f <= at:
            continue
        if s >= at + dur:
            return at
        at = max(at, f)
    return at


def by_start(inst: Instance, sigma: Sequence[int], finish: Sequence[float]) -> Schedule:
    """Each device's units ordered by their start (``finish`` minus time; ties by unit order), priced."""
    nd = inst.num_devices
    start = [finish[v] - inst.time[inst.device_kind[sigma[v]]][v] for v in range(inst.n)]
    order: list[list[int]] = [[] for _ in range(nd)]
    for v in sorted(range(inst.n), key=lambda v: (start[v], v)):
        order[sigma[v]].append(v)
    return priced(inst, sigma, order)


def fixed_schedules(p: Problem, sigma: Sequence[int], ranks: Sequence[Sequence[float]]) -> Schedule:
    """The best schedule of the assignment ``sigma`` as it is: topological order per device, or list-scheduled."""
    inst = p.inst
    best = priced(inst, sigma, [[v for v in range(inst.n) if sigma[v] == d] for d in range(inst.num_devices)])
    for rank in ranks:
        got = list_schedule(p, rank, sigma)
        if got is not None and got.value < best.value:
            best = got
    return best


def heuristic(inst: Instance, at_most: bool, starts: Sequence[Sequence[int]] = (),
              time_limit: float = HEURISTIC_TIME_LIMIT) -> Schedule | None:
    """The best of list scheduling with a few rank weights and of the assignments ``starts`` scheduled as they
    are, improved by local search within ``time_limit`` seconds (module docstring); None when none fits."""
    deadline = time.monotonic() + time_limit
    p = Problem(inst, at_most)
    ranks = [p.ranks(w) for w in _RANK_WEIGHTS]
    found = [s for s in (list_schedule(p, rank) for rank in ranks) if s is not None]
    found += [fixed_schedules(p, sigma, ranks) for sigma in starts
              if at_most or len(set(sigma)) == inst.num_devices]
    if not found:
        return None
    best = min(found, key=lambda s: s.value)
    return improve(p, best, ranks[1], deadline)


def improve(p: Problem, best: Schedule, rank: Sequence[float], deadline: float) -> Schedule:
    """Move one group of a critical unit to another device while the list-scheduled makespan drops."""
    inst = p.inst
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        sigma = list(best.sigma)
        mem = [0] * inst.num_devices
        for r in p.reps:
            mem[sigma[r]] += p.group_mem[r]
        used = set(sigma)
        for r in _critical_groups(p, best):
            here = sigma[r]
            for d in p.eligible[r]:
                if d == here or (p.limit[d] is not None and mem[d] + p.group_mem[r] > p.limit[d]):
                    continue
                if d not in used and p.twin[d] and d - 1 not in used:
                    continue  # of identical empty devices only the first
                moved = [d if p.rep[v] == r else s for v, s in enumerate(sigma)]
                if not p.at_most and len(set(moved)) < inst.num_devices:
                    continue
                got = list_schedule(p, rank, moved)
                if got is not None and got.value < best.value * (1 - 1e-12):
                    best, improved = got, True
                    break
            if improved or time.monotonic() >= deadline:
                break
    return best


def _critical_groups(p: Problem, s: Schedule) -> list[int]:
    """The groups of the units on a critical path of ``s`` (walking back from the last finish through the
    predecessor or device neighbour that set each start), last first."""
    inst = p.inst
    dur = [p.dur[v][s.sigma[v]] for v in range(inst.n)]
    fin = [s.starts[v] + dur[v] for v in range(inst.n)]
    prev = {}
    for run in s.order:
        last = None
        for v in run:
            if dur[v] > 0:
                prev[v] = last
                last = v
    v: int | None = max(range(inst.n), key=lambda x: (fin[x], -x), default=None)
    out: dict[int, None] = {}
    while v is not None:
        out[p.rep[v]] = None
        at = s.starts[v]
        nxt = None
        for u in inst.preds[v]:
            if math.isclose(fin[u] + p.hop(u, v, s.sigma[u], s.sigma[v]), at, rel_tol=1e-12, abs_tol=1e-12):
                nxt = u
                break
        if nxt is None and prev.get(v) is not None and math.isclose(fin[prev[v]], at, rel_tol=1e-12, abs_tol=1e-12):
            nxt = prev[v]
        v = nxt
    return list(out)
