"""Brute force: the exact oracle for small problems.

Problem: pick one strategy per node of a :class:`~.problem.Problem` to
minimize unary + edge costs with every memory row under the limit.

Algorithm: evaluate every assignment at once as a dense array of shape
``(K_1, ..., K_N)`` (each cost term broadcast along its nodes' axes), mask the
assignments over the memory limit, take the ``top`` smallest. Time and memory
``O(prod K_n * (N + F + rows * items))``; refused above ``max_assignments``.
Exact by construction, which is why the other solvers are tested against it.
"""

from __future__ import annotations

import math
import time

import numpy as np

from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers.problem import OPTIMAL, Problem, Solution, infeasible, solution

MAX_ASSIGNMENTS = 2_000_000
"""The largest number of assignments :func:`solve` evaluates by default."""


def _along(arr: np.ndarray, nodes: tuple[int, ...], axis: list[int | None], ndim: int) -> np.ndarray:
    """``arr`` (one dimension per node of ``nodes``) broadcast over the assignment array: nodes with one
    strategy have no axis (their dimension is dropped)."""
    arr = arr[tuple(0 if axis[n] is None else slice(None) for n in nodes)]
    shape = [1] * ndim
    for n in nodes:
        if axis[n] is not None:
            shape[axis[n]] = arr.shape[sum(axis[m] is not None for m in nodes[:nodes.index(n)])]
    return arr.reshape(shape)


def _item(problem: Problem, i: int, axis: list[int | None], ndim: int) -> np.ndarray:
    it = problem.mem_items[i]
    if it.factor is None:
        return _along(it.bytes, (it.node,), axis, ndim)
    f = problem.factors[it.factor]
    return _along(f.full(it.bytes), f.nodes, axis, ndim)


def solve(problem: Problem, memory_limit: float | None = None, top: int = 1,
          max_assignments: int = MAX_ASSIGNMENTS) -> list[Solution]:
    """The ``top`` best assignments that fit ``memory_limit`` (bytes per device), best first.

    Returns one infeasible :class:`Solution` (with the smallest peak memory of
    any assignment) when none fits. Raises LayoutSearchError when the problem
    has more than ``max_assignments`` assignments."""
    t0 = time.perf_counter()
    check_size(problem.num_assignments, max_assignments)
    free = [k for k, size in enumerate(problem.sizes) if size > 1]
    axis: list[int | None] = [None] * len(problem.unary)
    for a, k in enumerate(free):
        axis[k] = a
    ndim = len(free)
    shape = tuple(problem.sizes[k] for k in free)
    total = np.full(shape, problem.const, dtype=float)
    for k, u in enumerate(problem.unary):
        total = total + _along(u, (k,), axis, ndim)
    for f in problem.factors:
        total = total + _along(f.full(), f.nodes, axis, ndim)
    peak = np.zeros(shape)
    if problem.mem_rows:
        items = [_item(problem, i, axis, ndim) for i in range(len(problem.mem_items))]
        peak = np.full(shape, -np.inf)
        for r in problem.mem_rows:
            row = np.full(shape, r.const, dtype=float)
            for i, c in r.items:
                row = row + c * items[i]
            peak = np.maximum(peak, row)
    flat_cost, flat_peak = total.reshape(-1), np.broadcast_to(peak, shape).reshape(-1)
    ok = np.ones(flat_cost.shape, bool) if memory_limit is None else flat_peak <= memory_limit * (1 + 1e-12)
    if not ok.any():
        return [infeasible("enumerate", time.perf_counter() - t0, float(flat_peak.min()))]
    idx = np.nonzero(ok)[0]
    order = idx[np.argsort(flat_cost[idx], kind="stable")[:top]]
    seconds = time.perf_counter() - t0
    out = []
    for k in order:
        assign = [0] * len(problem.unary)
        for n, s in zip(free, np.unravel_index(int(k), shape), strict=True):
            assign[n] = int(s)
        out.append(solution(problem, assign, OPTIMAL, "enumerate", seconds))
    return out


def check_size(n: int, max_assignments: int = MAX_ASSIGNMENTS) -> None:
    """Raise LayoutSearchError when ``n`` assignments are more than enumeration evaluates."""
    if n > max_assignments:
        raise LayoutSearchError(f"enumeration would evaluate {_magnitude(n)} assignments "
                                f"(limit {max_assignments:.3g}): "
                                "use solver 'ilp-ortools', 'ilp-pulp' or 'dp'")


def min_memory(problem: Problem, max_assignments: int = MAX_ASSIGNMENTS) -> float:
    """The smallest peak memory of any assignment."""
    sols = solve(problem, memory_limit=-1.0, max_assignments=max_assignments)
    return float(sols[0].min_memory)


def _magnitude(n: int) -> str:
    """A count of any size, e.g. ``1.2e+05`` or ``about 10**400`` (beyond the range of a float)."""
    return f"{n:.3g}" if n < 1e300 else f"about 10**{int((n.bit_length() - 1) * math.log10(2))}"
