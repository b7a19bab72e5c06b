"""Brute force over every assignment, for tests on tiny problems.

One kind of ``K`` devices: every assignment monotone along the order edges (contiguous; with all ``K``
stages used unless at most ``K`` are asked for), or every assignment up to relabelling of the devices
(restricted growth strings, non-contiguous). Several kinds: every assignment of eligible devices (using
every device unless at most the devices are asked for), contiguous ones being those whose device graph of
order edges is acyclic. ``O(D^n (n + |E|))``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import networkx as nx

from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.instance import Instance, evaluate, value

BRUTE_MAX_NODES = 12


def _one_kind(inst: Instance, k: int, contiguous: bool, exact_k: bool) -> Iterator[list[int]]:
    n, sigma = inst.n, [0] * inst.n

    def rec(v: int, top: int) -> Iterator[list[int]]:
        if exact_k and n - v < k - 1 - top:
            return
        if v == n:
            if not exact_k or (top == k - 1 and (not contiguous or len(set(sigma)) == k)):
                yield sigma
            return
        if contiguous:
            choices = range(max((sigma[u] for u in inst.preds[v]), default=0), k)
        else:
            choices = range(min(top + 2, k))
        for s in choices:
            sigma[v] = s
            yield from rec(v + 1, max(top, s))

    return rec(0, -1)


def _kinds(inst: Instance, contiguous: bool, exact_k: bool) -> Iterator[list[int]]:
    options = [[d for d in range(inst.num_devices) if math.isfinite(inst.time[inst.device_kind[d]][v])]
               for v in range(inst.n)]
    for sigma in itertools.product(*options):
        if exact_k and len(set(sigma)) < inst.num_devices:
            continue  # every device holds a unit
        if contiguous:
            graph = nx.DiGraph((sigma[u], sigma[v]) for v in range(inst.n) for u in inst.preds[v]
                               if sigma[u] != sigma[v])
            if not nx.is_directed_acyclic_graph(graph):
                continue
        yield list(sigma)


def brute(inst: Instance, objective: str, mb: int, contiguous: bool, exact_k: bool) -> tuple[list[int], int]:
    """The best assignment (empty if none fits the memory limits) and the smallest achievable largest-device
    memory."""
    if inst.n > BRUTE_MAX_NODES:
        raise PartitionError(f"brute force is for tests: {inst.n} units > {BRUTE_MAX_NODES}; use 'dp' or an ILP")
    if len(inst.kinds) == 1:
        candidates = _one_kind(inst, inst.kinds[0].count, contiguous, exact_k)
    else:
        candidates = _kinds(inst, contiguous, exact_k)
    best: list[int] = []
    best_value, min_mem = math.inf, math.inf
    for sigma in candidates:
        if any(math.isinf(inst.time[inst.device_kind[d]][v]) for v, d in enumerate(sigma)):
            continue
        loads, mem = evaluate(inst, sigma, objective, mb)
        min_mem = min(min_mem, max(mem))
        if any(inst.kinds[inst.device_kind[d]].limit is not None and m > inst.kinds[inst.device_kind[d]].limit
               for d, m in enumerate(mem)):
            continue
        got = value(inst, sigma, loads, objective, mb)
        if got < best_value:
            best, best_value = list(sigma), got
    return best, int(min_mem) if math.isfinite(min_mem) else 0
