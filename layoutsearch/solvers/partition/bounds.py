"""Lower bounds on the objectives, from relaxations cheap enough to compute before any solve.

**Without communication** (every objective): a device's load is at least the time of its units, so the
largest load is at least the least ``L`` at which the units can be spread *fractionally* over the devices
with no device above ``L``, a unit going only to kinds on which it takes at most ``L`` (a unit placed
whole on a device of kind ``k`` makes that device's load at least its time there). With one kind that is
``max(total / count, largest unit)``; with two kinds the fractional split at a given ``L`` is a fractional
knapsack (units sorted by the time they save on the first kind per unit of time on the second), and the
least feasible ``L`` is found by bisection; with more kinds the units' fastest times shared by all
devices (:func:`~.dp.lower_bound`).

**Latency** also: every dependency path of units is run one unit after another (the devices along a path
follow each other in the device graph, which is acyclic, each working at least for the path's units on
it), so the latency is at least the longest path of the units' fastest times (transfers left out); and it
is at least the largest load.

**Latency along a path, with memory and transfers** (:func:`path_bound`). Take any path ``p_1 -> ... ->
p_L`` of tensor edges (``p_i`` produces a tensor that ``p_{i+1}`` consumes) and any contiguous placement
``sigma`` (its device graph, built from the tensors crossing devices, acyclic). Then:

1. *Each device holds one run of the path.* If ``p_i`` and ``p_j`` (``i < j``) are on device ``d`` and some
   ``p_l`` between them on ``d' != d``, the path's walk ``d -> ... -> d' -> ... -> d`` in the device graph
   closes a cycle. So the path cuts into maximal runs (blocks) ``p_i .. p_j`` on pairwise distinct devices,
   and consecutive blocks' devices are joined by a device-graph edge (the tensor ``p_j -> p_{j+1}`` crosses):
   the blocks' devices form a path of the device graph, and the latency is at least the sum of their loads.
2. *A block's device holds its hull.* Every unit ``x`` with ``p_i ~> x ~> p_j`` (tensor paths) lies on
   ``d`` too, else ``d ~> sigma(x) ~> d`` is a cycle. So the device's load is at least the time of the hull
   ``H(i, j) = desc(p_i) ∩ anc(p_j)`` (both inclusive) on the device's kind, its memory at least the
   hull's memory (at most the kind's limit), and every hull unit may run on that kind.
3. *Transfers it surely pays.* A tensor produced in the hull of block ``p_i .. p_j`` (device ``d``) and
   consumed by a descendant ``y`` of ``p_{j+1}`` crosses: ``y`` on ``d`` would put ``p_{j+1}`` (between
   ``p_j`` and ``y``) on ``d``. So unless a host, ``d`` pays ``send(i, j)``, the cost of those tensors (once
   each). Likewise a tensor consumed in the hull whose source is an ancestor of ``p_{i-1}`` crosses
   (``x ~> p_{i-1} ~> p_i``), and ``d`` pays ``recv(i, j)``, their cost, once each. These are distinct terms
   of ``d``'s load (sends of tensors made on ``d``, receives of tensors made elsewhere), and the blocks'
   devices are distinct.
4. *Devices.* The blocks are on distinct devices: at most ``count_k`` of kind ``k``.
5. *Min cuts.* More strongly, a block's device ``d`` (not a host) holds some set ``S`` with ``H(i, j) ⊆ S``
   and, by the arguments of point 3, ``S`` disjoint from ``desc(p_{j+1})`` and ``anc(p_{i-1})``; its load is
   ``time(S)`` plus every tensor made in ``S`` with a consumer outside (once) plus every tensor made
   outside with a consumer in ``S`` (once). The least such value over all those ``S`` (memory and
   contiguity dropped: a relaxation) is a minimum s-t cut (:class:`_MinCut`), at least the load of point 3.
   Pricing every block so costs a max-flow each; only the blocks of the current best cut are raised to
   their min cuts, and the best cut found again, until it uses raised blocks only or time is up: every
   block's price stays a lower bound on its device's load, so every round's value is a bound.

Hence ``latency(sigma) >= sum over blocks of (time_k(H) + recv + send)`` for the blocks ``sigma`` induces,
and the least such sum over *every* cut of the path into blocks, each given a kind whose memory limit its
hull fits, with at most ``count_k`` blocks of kind ``k`` (a shortest path over the cut points with the
devices used as state, ``O(L n d)`` to price the blocks), is a lower bound on the latency of every
contiguous placement. Hulls of different blocks may overlap in the minimization (only in cuts no
placement induces): that only lowers the minimum. Any path gives a bound; a few are tried (the longest by
the units' fastest times, by memory, by both).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import networkx as nx
import numpy as np

from layoutsearch.solvers.partition.dp import lower_bound
from layoutsearch.solvers.partition.instance import Instance, Kind


def no_communication_bound(inst: Instance) -> float:
    """A lower bound on the largest load: the fractional relaxation without transfers (module docstring)."""
    trivial = lower_bound(inst)
    counts = [k.count for k in inst.kinds]
    live = [k for k, c in enumerate(counts) if c > 0]
    if len(live) != 2:
        return trivial
    a, b = live
    ta, tb = inst.time[a], inst.time[b]
    # units by the time they save on kind a per unit of time on kind b, most first
    order = sorted(range(inst.n), key=lambda v: -(ta[v] / tb[v] if tb[v] > 0 else math.inf))

    def feasible(cap: float) -> bool:
        load_a = load_b = 0.0
        flexible = []
        for v in range(inst.n):
            on_a, on_b = ta[v] <= cap, tb[v] <= cap
            if not (on_a or on_b):
                return False
            if on_a and on_b:
                flexible.append(v)
            elif on_a:
                load_a += ta[v]
            else:
                load_b += tb[v]
        room = counts[b] * cap - load_b
        if room < 0:
            return False
        chosen = set(flexible)
        for v in order:
            if v not in chosen:
                continue
            if tb[v] <= room:
                room -= tb[v]
            else:  # this unit only in part on kind b; the rest (and every later unit) on kind a
                load_a += ta[v] * (1 - room / tb[v]) if tb[v] > 0 else 0.0
                room = 0.0
        return load_a <= counts[a] * cap

    lo = trivial * (1 - 1e-12)
    if feasible(lo) or not math.isfinite(lo):
        return trivial
    hi = max(lo, 1e-300) * 2
    for _ in range(200):
        if feasible(hi):
            break
        lo, hi = hi, hi * 2
    else:
        return trivial
    for _ in range(60):
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return max(trivial, lo)


def critical_path(inst: Instance) -> float:
    """The longest dependency path of the units' fastest times (transfers left out)."""
    key = inst.key()
    succ: list[list[int]] = [[] for _ in range(inst.n)]
    for src, cons, _ in inst.tensors:
        succ[src].extend(w for w in cons if w != src)
    for v in range(inst.n):
        for u in inst.preds[v]:
            succ[u].append(v)
    finish = [0.0] * inst.n
    indeg = [0] * inst.n
    for v in range(inst.n):
        for w in succ[v]:
            indeg[w] += 1
    ready = [v for v in range(inst.n) if indeg[v] == 0]
    for v in ready:
        finish[v] = key[v]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for w in succ[v]:
            finish[w] = max(finish[w], finish[v] + key[w])
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if seen < inst.n:  # a cycle of order edges (training graphs): no latency there; fall back to the largest unit
        return max(key, default=0.0)
    return max(finish, default=0.0)


PATH_BOUND_REFINE_S = 2.0
"""Seconds :func:`path_bound` spends at most raising block loads to their min cuts (point 5)."""


def path_bound(inst: Instance, microbatches: int = 1, refine_s: float = PATH_BOUND_REFINE_S) -> float:
    """A lower bound on the latency of every contiguous placement: the least cost of cutting a path of
    tensor edges into blocks on distinct devices, each paying at least its hull's time and the transfers it
    surely makes, raised to a min cut for the blocks of the best cuts within ``refine_s`` seconds (module
    docstring), maximized over a few paths. 0 when the tensor graph has a cycle."""
    deadline = time.monotonic() + refine_s
    n = inst.n
    if n == 0:
        return 0.0
    succ: list[set[int]] = [set() for _ in range(n)]
    for src, cons, _ in inst.tensors:
        succ[src].update(w for w in cons if w != src)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((u, w) for u in range(n) for w in succ[u])
    if not nx.is_directed_acyclic_graph(graph):
        return 0.0
    order = list(nx.topological_sort(graph))
    anc = [1 << v for v in range(n)]
    for v in order:
        for w in succ[v]:
            anc[w] |= anc[v]
    desc = [1 << v for v in range(n)]
    for v in reversed(order):
        for w in succ[v]:
            desc[v] |= desc[w]
    key, memw = inst.key(), inst.memw(microbatches)
    total_key, total_mem = math.fsum(key) or 1.0, sum(memw) or 1
    weights = [key, [float(m) for m in memw], [key[v] / total_key + memw[v] / total_mem for v in range(n)]]
    best, tried = 0.0, set()
    for w in weights:
        path = _heaviest_path(order, succ, w)
        if tuple(path) in tried:
            continue
        tried.add(tuple(path))
        best = max(best, _cut_path(inst, path, anc, desc, memw, deadline))
    return best


def _heaviest_path(order: list[int], succ: list[set[int]], weight: list[float]) -> list[int]:
    """A path of the DAG (``order`` topological) of the largest total ``weight``."""
    tail = dict.fromkeys(order, 0.0)
    nxt: dict[int, int | None] = {}
    for v in reversed(order):
        w = max(succ[v], key=lambda x: (tail[x], -x), default=None)
        nxt[v] = w
        tail[v] = weight[v] + (tail[w] if w is not None else 0.0)
    v: int | None = max(order, key=lambda x: (tail[x], -x))
    path = []
    while v is not None:
        path.append(v)
        v = nxt[v]
    return path


def _cut_path(inst: Instance, path: list[int], anc: list[int], desc: list[int], memw: list[int],
              deadline: float | None = None) -> float:
    """The least cost of cutting ``path`` into blocks on distinct devices (module docstring, points 3 and 4):
    ``g[j][s]``, the least cost of blocks covering ``p_1 .. p_j`` using ``s`` devices of each kind, is
    ``min over i <= j and kinds k of g[i - 1][s - e_k] + time_k(H(i, j))`` plus, unless ``k`` is a host,
    ``recv(i, j) + send(i, j)``; state vectors dominated by one with no more devices at no more cost are
    dropped. With a ``deadline``, the loads of the blocks a best cut uses are raised to their min cuts
    (point 5, :func:`_raise_to_min_cuts`)."""
    length = len(path)
    kinds = [(k, kind) for k, kind in enumerate(inst.kinds) if kind.count > 0]
    tensors = [(src, cons, c) for src, cons, c in inst.tensors if any(w != src for w in cons)]
    blocks = _path_blocks(inst, path, anc, desc, memw, kinds, tensors)
    send = _block_sends(inst.n, path, anc, desc, blocks, tensors)
    loads: dict[tuple[int, int, int], float] = {}
    for i in range(length):
        for j in range(i, i + len(blocks[i])):
            times, mem, recv = blocks[i][j - i]
            for a, (_, kind) in enumerate(kinds):
                if not (math.isinf(times[a]) or (kind.limit is not None and mem > kind.limit)):
                    loads[(i, j, a)] = times[a] + (0.0 if kind.host else recv + send[i][j - i])
    value, used = _best_cut(length, kinds, loads)
    if deadline is None or not math.isfinite(value):
        return value if math.isfinite(value) else 0.0
    return _raise_to_min_cuts(inst, path, anc, desc, kinds, tensors, loads, used, deadline)


def _path_blocks(inst: Instance, path: list[int], anc: list[int], desc: list[int], memw: list[int],
                 kinds: list[tuple[int, Any]], tensors: list[tuple[int, Any, float]]
                 ) -> list[list[tuple[list[float], int, float]]]:
    """Per block ``(i, j)`` of ``path`` still holdable on some kind (``blocks[i][j - i]``): its hull's time on
    each kind, memory, and the tensors it surely receives (produced before ``p_i``)."""
    nk = len(kinds)
    consumed_by: list[list[int]] = [[] for _ in range(inst.n)]
    for t, (src, cons, _) in enumerate(tensors):
        for w in set(cons):
            if w != src:
                consumed_by[w].append(t)
    blocks: list[list[tuple[list[float], int, float]]] = []
    for i in range(len(path)):
        before = anc[path[i - 1]] if i > 0 else 0
        hull, mem, recv = 0, 0, 0.0
        times = [0.0] * nk
        seen: set[int] = set()
        row: list[tuple[list[float], int, float]] = []
        for j in range(i, len(path)):
            grown = desc[path[i]] & anc[path[j]]
            new, hull = grown & ~hull, grown
            for v in _bits(new):
                mem += memw[v]
                for a, (k, _) in enumerate(kinds):
                    times[a] += inst.time[k][v]
                for t in consumed_by[v]:
                    if t not in seen and before >> tensors[t][0] & 1:
                        seen.add(t)
                        recv += tensors[t][2]
            if all(math.isinf(times[a]) or (kind.limit is not None and mem > kind.limit)
                   for a, (_, kind) in enumerate(kinds)):
                break  # the hull only grows with j
            row.append((list(times), mem, recv))
        blocks.append(row)
    return blocks


def _bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _block_sends(n: int, path: list[int], anc: list[int], desc: list[int],
                 blocks: list[list[tuple[list[float], int, float]]], tensors: list[tuple[int, Any, float]]
                 ) -> list[list[float]]:
    """Per block ``(i, j)`` (``send[i][j - i]``): the tensors it surely sends, produced in its hull and
    consumed by a descendant of ``p_{j+1}``."""
    cons_mask = [sum(1 << w for w in cons) for _, cons, _ in tensors]
    produced_by: list[list[int]] = [[] for _ in range(n)]
    for t, (src, _, _) in enumerate(tensors):
        produced_by[src].append(t)
    length = len(path)
    send = [[0.0] * len(blocks[i]) for i in range(length)]
    for j in range(length - 1):
        after = desc[path[j + 1]]
        hull, out = 0, 0.0
        for i in range(j, -1, -1):
            if j - i >= len(blocks[i]):
                break  # (i, j) holds on no kind; a smaller i makes a larger hull: none of them either
            grown = desc[path[i]] & anc[path[j]]
            new, hull = grown & ~hull, grown
            for v in _bits(new):
                out += math.fsum(tensors[t][2] for t in produced_by[v] if cons_mask[t] & after)
            send[i][j - i] = out
    return send


def _raise_to_min_cuts(inst: Instance, path: list[int], anc: list[int], desc: list[int],
                       kinds: list[tuple[int, Any]], tensors: list[tuple[int, Any, float]],
                       loads: dict[tuple[int, int, int], float], used: list[tuple[int, int, int]],
                       deadline: float) -> float:
    """Point 5: the loads of the blocks a best cut uses raised to their min cuts, until a best cut uses raised
    ones only or ``deadline`` passes (first with the device counts dropped, a quicker shortest path, then with
    them); returns the best cut's value."""
    length = len(path)
    cutter = _MinCut(inst, tensors, [k for k, _ in kinds])
    raised: set[tuple[int, int, int]] = set()
    value = math.inf
    for counted in (False, True):
        while True:
            if not counted:
                used = _best_cut_uncounted(length, loads)
            todo = [b for b in used if b not in raised and not kinds[b[2]][1].host]
            if not todo or time.monotonic() >= deadline:
                break
            for i, j, a in todo:
                raised.add((i, j, a))
                hull = desc[path[i]] & anc[path[j]]
                out = (desc[path[j + 1]] if j + 1 < length else 0) | (anc[path[i - 1]] if i > 0 else 0)
                loads[(i, j, a)] = max(loads[(i, j, a)], cutter.least_load(a, hull, out))
            if counted:
                value, used = _best_cut(length, kinds, loads)
        if not counted:
            value, used = _best_cut(length, kinds, loads)
    return value


def _best_cut_uncounted(length: int, loads: dict[tuple[int, int, int], float]) -> list[tuple[int, int, int]]:
    """The blocks of a best cut of the path with any number of devices of each kind."""
    ends: list[list[tuple[int, int, float]]] = [[] for _ in range(length)]
    for (i, j, a), load in loads.items():
        ends[j].append((i, a, load))
    g = [0.0] + [math.inf] * length
    back: list[tuple[int, int, int] | None] = [None] * (length + 1)
    for j in range(length):
        for i, a, load in ends[j]:
            if g[i] + load < g[j + 1]:
                g[j + 1], back[j + 1] = g[i] + load, (i, j, a)
    used = []
    at = length
    while at > 0 and back[at] is not None:
        block = back[at]
        assert block is not None
        used.append(block)
        at = block[0]
    return used[::-1]


def _best_cut(length: int, kinds: list[tuple[int, Kind]], loads: dict[tuple[int, int, int], float]
              ) -> tuple[float, list[tuple[int, int, int]]]:
    """The least sum of block loads over the cuts of the path (``loads[(i, j, a)]``: block ``p_i .. p_j`` on
    the ``a``-th kind), at most ``count`` blocks of each kind, and the blocks of a best cut."""
    nk = len(kinds)
    starts: list[list[tuple[int, int, float]]] = [[] for _ in range(length)]
    for (i, j, a), load in loads.items():
        starts[i].append((j, a, load))
    front: list[dict[tuple[int, ...], tuple[float, tuple[int, int, int, tuple[int, ...]] | None]]] = [
        {} for _ in range(length + 1)]
    front[0][(0,) * nk] = (0.0, None)
    for i in range(length):
        states = _pareto({s: c for s, (c, _) in front[i].items()})
        for j, a, load in starts[i]:
            here = front[j + 1]
            for state, cost in states:
                if state[a] >= kinds[a][1].count:
                    continue
                nxt = state[:a] + (state[a] + 1,) + state[a + 1:]
                if cost + load < here.get(nxt, (math.inf, None))[0]:
                    here[nxt] = (cost + load, (i, j, a, state))
    if not front[length]:
        return math.inf, []
    state = min(front[length], key=lambda st: front[length][st][0])
    value = front[length][state][0]
    used = []
    at = length
    while at > 0:
        back = front[at][state][1]
        assert back is not None
        i, j, a, state = back
        used.append((i, j, a))
        at = i
    return value, used[::-1]


class _MinCut:
    """Point 5 of the module docstring: the least load of a device of a non-host kind holding a set ``S`` with
    ``hull ⊆ S`` and ``S ∩ out = ∅``: ``time(S)`` plus each tensor made in ``S`` with a consumer outside
    (sent once) and each tensor made outside with a consumer in ``S`` (received once), as a minimum s-t cut
    (source side: ``S``). Unit ``v``: an arc ``v -> t`` of its time. Tensor ``(x, C, c)``: a node ``a`` with
    ``x -> a`` of ``c`` and ``a -> w`` unbounded for ``w`` in ``C`` (``x`` in ``S``, some ``w`` out: ``a``
    must be out, paying ``c``), and a node ``b`` with ``w -> b`` unbounded and ``b -> x`` of ``c`` (some ``w``
    in ``S``, ``x`` out: ``b`` must be in, paying ``c``). Capacities are integers, rounded down (a cut's
    value only drops: the bound stays valid)."""

    def __init__(self, inst: Instance, tensors: list[tuple[int, tuple[int, ...], float]], kinds: list[int]) -> None:
        n, nt = inst.n, len(tensors)
        self.n, self.source, self.sink = n, n + 2 * nt, n + 2 * nt + 1
        finite = [t for k in kinds for t in inst.time[k] if math.isfinite(t)]
        total = math.fsum(finite) + 2 * math.fsum(c for _, _, c in tensors)
        self.scale = float(2**29) / total if total > 0 else 1.0
        self.big = 2**30
        tails, heads, caps = [], [], []
        for t, (src, cons, c) in enumerate(tensors):
            a, b = n + t, n + nt + t
            tails += [src, b]
            heads += [a, src]
            caps += [int(c * self.scale)] * 2
            for w in set(cons):
                if w != src:
                    tails += [a, w]
                    heads += [w, b]
                    caps += [self.big, self.big]
        self.arcs = (np.array(tails, dtype=np.int32), np.array(heads, dtype=np.int32), np.array(caps, dtype=np.int64))
        self.unit_caps = [np.array([self.big if math.isinf(x) else int(x * self.scale) for x in inst.time[k]],
                                   dtype=np.int64) for k in kinds]

    def least_load(self, a: int, hull: int, out: int) -> float:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow

        n, units = self.n, np.arange(self.n, dtype=np.int32)
        inside = np.array([hull >> v & 1 for v in range(n)], dtype=bool)
        outside = np.array([out >> v & 1 for v in range(n)], dtype=bool)
        tails, heads, caps = self.arcs
        unit_caps = np.where(outside, self.big, self.unit_caps[a])
        tails = np.concatenate([tails, units, np.full(int(inside.sum()), self.source, dtype=np.int32)])
        heads = np.concatenate([heads, np.full(n, self.sink, dtype=np.int32), units[inside]])
        caps = np.concatenate([caps, unit_caps, np.full(int(inside.sum()), self.big, dtype=np.int64)])
        size = self.sink + 1
        graph = csr_matrix((np.minimum(caps, self.big).astype(np.int32), (tails, heads)), shape=(size, size))
        flow = maximum_flow(graph, self.source, self.sink).flow_value
        return flow / self.scale


def _pareto(states: dict[tuple[int, ...], float]) -> list[tuple[tuple[int, ...], float]]:
    """The states not dominated by one using no more devices of each kind at no more cost."""
    kept: list[tuple[tuple[int, ...], float]] = []
    for c, s in sorted((c, s) for s, c in states.items()):
        if not any(all(a <= b for a, b in zip(t, s, strict=True)) for t, _ in kept):
            kept.append((s, c))
    return kept


def objective_bound(inst: Instance, objective: str, microbatches: int = 1) -> float:
    """A lower bound on the largest load (throughput, GPipe per micro-batch) or on the latency."""
    bound = no_communication_bound(inst)
    if objective == "latency":
        bound = max(bound, critical_path(inst), path_bound(inst, microbatches))
    return bound


__all__ = ["critical_path", "no_communication_bound", "objective_bound", "path_bound"]
