"""A start for the latency heuristic: the best chain of intervals of a topological order, by the sum of loads.

Cut a topological order of the units into intervals, each on its own device (any kind that may run all its
units and, with its memory limit, hold them; at most ``count`` devices of each kind). The placement is
contiguous (an interval's tensors go to later intervals only), and its latency, the longest path of the
device graph weighted by the loads, is at most the sum of all the used devices' loads (a path visits each
device once). That sum is additive over the intervals, so the best cut for it is a shortest path over the
cut points with the devices used of each kind as state: ``g[j][s] = min over i <= j, kinds k of
g[i - 1][s - e_k] + load_k(v_i .. v_j)``, ``O(n^2 d + n^2 S)`` for ``n`` units of fan-out ``d`` and ``S``
device-count vectors. Loads are priced as :func:`~.instance.evaluate` prices them (the interval's time on
its kind plus, unless a host, each tensor crossing its boundary once per sending and once per receiving
device). A few orders are tried (the unit order, and one that keeps few tensors open); the local search
(:mod:`.local`) then improves the best, judged by the true objective.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence

from layoutsearch.solvers.partition.instance import Instance, evaluate, value


def chain_start(inst: Instance, mb: int, time_limit: float = 5.0) -> list[int] | None:
    """The placement (unit -> device) of the best interval chain over a few topological orders, judged by the
    latency; None when no chain fits (or the order graph has a cycle)."""
    deadline = time.monotonic() + time_limit
    best: tuple[float, list[int]] | None = None
    for order in _orders(inst):
        if time.monotonic() > deadline:
            break
        sigma = interval_chain(inst, order, mb, deadline)
        if sigma is None:
            continue
        loads, _ = evaluate(inst, sigma, "latency", mb)
        got = value(inst, sigma, loads, "latency", mb)
        if best is None or got < best[0]:
            best = (got, sigma)
    return None if best is None else best[1]


def _orders(inst: Instance) -> list[list[int]]:
    """Topological orders of the order graph: the unit order, and one taking next the ready unit that leaves
    the fewest tensors open (ties: the unit order)."""
    orders = [list(range(inst.n))]
    indeg = [len(set(p)) for p in inst.preds]
    succs = [sorted(set(s)) for s in inst.succs]
    # per unit: the tensors it produces and those it consumes
    produced: list[list[int]] = [[] for _ in range(inst.n)]
    consumed: list[list[int]] = [[] for _ in range(inst.n)]
    for t, (src, cons, _) in enumerate(inst.tensors):
        produced[src].append(t)
        for w in set(cons):
            consumed[w].append(t)
    left = [len(set(cons)) for _, cons, _ in inst.tensors]
    cost = [c for _, _, c in inst.tensors]
    heap = [(0.0, v) for v in range(inst.n) if indeg[v] == 0]
    order: list[int] = []
    done = [False] * inst.n

    def delta(v: int) -> float:  # the change of the open tensors' cost when v is taken
        opened = math.fsum(cost[t] for t in produced[v] if left[t] > 0)
        closed = math.fsum(cost[t] for t in consumed[v] if left[t] == 1)
        return opened - closed

    while heap:
        # re-price the ready units (their deltas change as tensors close)
        heap = [(delta(v), v) for _, v in heap]
        heapq.heapify(heap)
        _, v = heapq.heappop(heap)
        order.append(v)
        done[v] = True
        for t in consumed[v]:
            left[t] -= 1
        for w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heap.append((0.0, w))
    if len(order) == inst.n and order != orders[0]:
        orders.append(order)
    return orders


def interval_chain(inst: Instance, order: Sequence[int], mb: int, deadline: float = math.inf) -> list[int] | None:
    """The cut of ``order`` (a topological order of the order graph) into intervals on distinct devices of the
    least sum of loads (module docstring); None when none fits or past ``deadline``."""
    n, kinds = inst.n, inst.kinds
    pos = [0] * n
    for i, v in enumerate(order):
        pos[v] = i
    memw = inst.memw(mb)
    out_of, into = _crossings(inst, pos)
    counts = [k.count for k in kinds]
    nk = len(kinds)
    # g[j]: state (devices used of each kind) -> (least sum of loads covering positions < j, back pointer)
    g: list[dict[tuple[int, ...], tuple[float, tuple[int, int, tuple[int, ...]] | None]]] = [{} for _ in range(n + 1)]
    g[0][(0,) * nk] = (0.0, None)
    for i in range(n):  # an interval starting at position i, after the intervals covering positions < i
        if time.monotonic() > deadline:
            return None
        front = _pareto(g[i])
        if not front:
            continue
        times = [0.0] * nk
        mem = 0
        sends = 0.0  # tensors produced inside with a consumer beyond the interval
        recv_seen: set[int] = set()
        recvs = 0.0  # tensors from before the interval consumed inside (once each)
        pending: dict[int, float] = {}  # last-consumer position -> cost of the produced tensors closing there
        alive = [counts[k] > 0 for k in range(nk)]
        for j in range(i, n):
            v = order[j]
            mem += memw[v]
            for k in range(nk):
                times[k] += inst.time[k][v]
            for c, p_src, t in into[j]:
                if p_src < i and t not in recv_seen:
                    recv_seen.add(t)
                    recvs += c
            sends -= pending.pop(j, 0.0)
            for c, last in out_of[j]:
                sends += c
                pending[last] = pending.get(last, 0.0) + c
            here = g[j + 1]
            for k, kind in enumerate(kinds):
                if not alive[k]:
                    continue
                if math.isinf(times[k]) or (kind.limit is not None and mem > kind.limit):
                    alive[k] = False  # the interval only grows
                    continue
                load = times[k] + (0.0 if kind.host else sends + recvs)
                for state, before in front:
                    if state[k] >= counts[k]:
                        continue
                    nxt = state[:k] + (state[k] + 1,) + state[k + 1:]
                    cand = before + load
                    if cand < here.get(nxt, (math.inf, None))[0]:
                        here[nxt] = (cand, (i, k, state))
            if not any(alive):
                break
    return _traced_back(g, order, counts) if g[n] else None


def _crossings(inst: Instance, pos: list[int]
               ) -> tuple[list[list[tuple[float, int]]], list[list[tuple[float, int, int]]]]:
    """Per position of the order: the tensors produced there (cost, position of the last consumer) and those
    consumed there (cost, position of the source, tensor): a tensor crosses an interval's boundary when its
    source is inside and a consumer outside, or a consumer inside and the source outside."""
    out_of: list[list[tuple[float, int]]] = [[] for _ in range(inst.n)]
    into: list[list[tuple[float, int, int]]] = [[] for _ in range(inst.n)]
    for t, (src, cons, c) in enumerate(inst.tensors):
        ps = [pos[w] for w in set(cons) if w != src]
        if not ps:
            continue
        out_of[pos[src]].append((c, max(ps)))
        for p in sorted(set(ps)):
            into[p].append((c, pos[src], t))
    return out_of, into


def _traced_back(g: list[dict[tuple[int, ...], tuple[float, tuple[int, int, tuple[int, ...]] | None]]],
                 order: Sequence[int], counts: list[int]) -> list[int]:
    """The device of every node in the best state of the last position (devices numbered kind by kind)."""
    n, nk = len(order), len(counts)
    state = min(g[n], key=lambda s: (g[n][s][0], s))
    offset = [sum(counts[:k]) for k in range(nk)]
    sigma = [0] * n
    j = n
    while j > 0:
        back = g[j][state][1]
        assert back is not None
        i, k, prev = back
        for p in range(i, j):
            sigma[order[p]] = offset[k] + state[k] - 1  # the state counts this interval's device
        j, state = i, prev
    return sigma


def _pareto(states: dict[tuple[int, ...], tuple[float, object]]) -> list[tuple[tuple[int, ...], float]]:
    """The states not dominated by one using no more devices of any kind at no more cost."""
    items = sorted(((c, s) for s, (c, _) in states.items()), key=lambda t: (t[0], sum(t[1]), t[1]))
    kept: list[tuple[tuple[int, ...], float]] = []
    for c, s in items:
        if not any(all(a <= b for a, b in zip(t, s, strict=True)) for t, _ in kept):
            kept.append((s, c))
    return kept


__all__ = ["chain_start", "interval_chain"]
