"""Local search over placements: a fast heuristic for every objective, and the paper's local-search baseline.

From a feasible start, move one unit (a node, or a contracted co-location group) to another device while
that improves ``(objective, sum of squared loads)`` (the second term lets the search cross plateaus of
the largest load); only units on the devices that set the objective (the largest load, or the critical
path for latency) are tried. A move must keep eligibility, memory limits and, for contiguous placements,
an acyclic device graph. Stops at a local optimum or after ``time_limit`` seconds. Every step is priced
by :func:`~.instance.evaluate`, the one definition of the objectives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import networkx as nx

from layoutsearch.solvers.partition.instance import Instance, evaluate, value

LOCAL_TIME_LIMIT = 10.0
"""Seconds a local search runs at most unless told otherwise."""


def local_search(inst: Instance, start: Sequence[int], objective: str, mb: int, contiguous: bool,
                 time_limit: float = LOCAL_TIME_LIMIT) -> list[int]:
    """A locally optimal assignment (unit -> device) reached from the feasible assignment ``start``."""
    deadline = time.monotonic() + time_limit
    sigma = list(start)
    best = _score(inst, sigma, objective, mb)
    limits = [inst.kinds[inst.device_kind[d]].limit for d in range(inst.num_devices)]
    memw = inst.memw(mb)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        loads, mem = evaluate(inst, sigma, objective, mb)
        for v in _candidates(inst, sigma, loads, objective):
            here = sigma[v]
            for d in range(inst.num_devices):
                if d == here or math.isinf(inst.time[inst.device_kind[d]][v]):
                    continue
                if limits[d] is not None and mem[d] + memw[v] > limits[d]:
                    continue
                sigma[v] = d
                if contiguous and not _acyclic(inst, sigma):
                    sigma[v] = here
                    continue
                got = _score(inst, sigma, objective, mb)
                if got < best:
                    best, improved = got, True
                    break
                sigma[v] = here
            if improved or time.monotonic() >= deadline:
                break
    return sigma


def _score(inst: Instance, sigma: list[int], objective: str, mb: int) -> tuple[float, float]:
    loads, _ = evaluate(inst, sigma, objective, mb)
    return value(inst, sigma, loads, objective, mb), math.fsum(x * x for x in loads)


def _candidates(inst: Instance, sigma: list[int], loads: list[float], objective: str) -> list[int]:
    """The units worth moving: those on the most loaded device (throughput, GPipe) or on any device of the
    device graph's critical path (latency)."""
    if objective != "latency":
        top = max(range(len(loads)), key=loads.__getitem__)
        return [v for v in range(inst.n) if sigma[v] == top]
    graph = _device_graph(inst, sigma)
    finish: dict[int, float] = {}
    parent: dict[int, int | None] = {}
    for d in nx.topological_sort(graph):
        preds = list(graph.predecessors(d))
        p = max(preds, key=finish.__getitem__) if preds else None
        parent[d] = p
        finish[d] = (finish[p] if p is not None else 0.0) + loads[d]
    d: int | None = max(finish, key=finish.__getitem__)
    path = set()
    while d is not None:
        path.add(d)
        d = parent[d]
    return [v for v in range(inst.n) if sigma[v] in path]


def _device_graph(inst: Instance, sigma: Sequence[int]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(set(sigma))
    graph.add_edges_from((sigma[u], sigma[v]) for v in range(inst.n) for u in inst.preds[v] if sigma[u] != sigma[v])
    return graph


def _acyclic(inst: Instance, sigma: Sequence[int]) -> bool:
    return nx.is_directed_acyclic_graph(_device_graph(inst, sigma))


def greedy_start(inst: Instance, mb: int, balance: bool = True) -> list[int] | None:
    """Intervals of the unit order on the devices of the first kind, each filled up to the least time
    bound (ignoring transfers; bisection) at which they all fit its memory, or (``balance=False``: the fewest
    devices, few transfers, a start for latency) each filled up to its memory limit; None when the first kind
    cannot run every unit or hold them all."""
    kind = inst.kinds[0]
    times, memw = inst.time[0], inst.memw(mb)
    if kind.count < 1 or any(math.isinf(t) for t in times):
        return None

    def fill(bound: float) -> list[int] | None:
        sigma, device, load, mem = [], 0, 0.0, 0
        for v in range(inst.n):
            if sigma and (load + times[v] > bound or (kind.limit is not None and mem + memw[v] > kind.limit)):
                device, load, mem = device + 1, 0.0, 0
            if device >= kind.count or (kind.limit is not None and memw[v] > kind.limit):
                return None
            sigma.append(device)
            load, mem = load + times[v], mem + memw[v]
        return sigma

    lo, hi = max(times), math.fsum(times)
    best = fill(hi)
    if best is None or not balance:
        return best
    for _ in range(50):
        mid = (lo + hi) / 2
        got = fill(mid)
        if got is None:
            lo = mid
        else:
            best, hi = got, mid
    return best
