"""The stages of a pipeline whose stages hold different numbers of micro-batches: an exact chain DP.

Under 1F1B (PipeDream-flush, Narayanan et al. 2021) stage ``k`` of ``K`` holds the activations of at most
``min(K - k, M)`` micro-batches: the first stage ``K``, the last one. The general partitioner
(:mod:`.partition`) gives every stage one in-flight count, so with the first stage's it rejects splits that
put more layers on later stages, which is what fits when the first stage's memory binds.

**Problem.** Cut the chain of units ``u_0 .. u_{n-1}`` into ``K`` non-empty contiguous stages minimizing the
slowest stage's load, stage ``k`` within ``limit``. Load = its units' times plus the transfer of each edge
crossing its boundary (an edge between units ``i - 1`` and ``i`` is paid by both stages it joins, as
:func:`~.partition.instance.evaluate` prices a cut); memory = its units' fixed bytes plus ``in_flight[k]``
times their activation bytes plus the largest of its units' peak buffers (as
:mod:`layoutsearch.costmodel.pipeline` prices a stage). The slowest stage sets the loop (``steps`` times
it); like the general partitioner's throughput objective, the choice leaves out what each stage runs once
per step (the optimizer, the gradient all-reduces), which decides the step only when the loop is short.

**Recurrence.** ``best[k][i] = min over j < i of max(best[k - 1][j], load(j, i))`` over the ``j`` whose
stage ``u_j .. u_{i-1}`` fits as stage ``k - 1``; ``best[0][0] = 0``; the answer is ``best[K][n]``. ``O(K n^2)``
(vectorized over ``j``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from layoutsearch.errors import PartitionError
from layoutsearch.units import format_exact_bytes


def split_chain(times: Sequence[float], transfers: Sequence[float], fixed: Sequence[float],
                activations: Sequence[float], in_flight: Sequence[float], limit: float | None,
                peaks: Sequence[Sequence[float]] = ()) -> list[int]:
    """The exact split of the chain (see the module docstring): ``transfers[i]`` the edge between units
    ``i - 1`` and ``i`` (``transfers[0]`` unused); ``in_flight[k]`` the micro-batches stage ``k`` holds
    (``K = len(in_flight)`` stages); ``peaks``: per-unit bytes of which a stage holds the largest of its
    units' (a buffer one unit at a time uses: a remat workspace, an op's working set), each added to its
    memory. Returns the first unit of each stage. PartitionError when no split fits, naming the smallest
    achievable largest-stage memory."""
    n, K = len(times), len(in_flight)
    if K > n:
        raise PartitionError(f"cannot split {n} pipeline units into {K} non-empty stages")
    e = np.zeros(n + 1)
    e[1:n] = np.asarray(transfers, dtype=float)[1:n]
    T = np.concatenate([[0.0], np.cumsum(np.asarray(times, dtype=float))])
    F = np.concatenate([[0.0], np.cumsum(np.asarray(fixed, dtype=float))])
    A = np.concatenate([[0.0], np.cumsum(np.asarray(activations, dtype=float))])
    P = [np.asarray(p, dtype=float) for p in peaks]
    cap = math.inf if limit is None else limit * (1 + 1e-12)
    best = np.full((K + 1, n + 1), math.inf)
    peak = np.full((K + 1, n + 1), math.inf)  # the least largest stage memory (for the error)
    best[0, 0], peak[0, 0] = 0.0, -math.inf
    start = np.zeros((K + 1, n + 1), dtype=np.int64)
    for k in range(1, K + 1):
        for i in range(k, n - (K - k) + 1):
            j = np.arange(k - 1, i)
            load = T[i] - T[j] + e[j] + e[i]
            mem = F[i] - F[j] + np.floor(in_flight[k - 1] * (A[i] - A[j]))  # (whole bytes, as the report)
            for p in P:  # the largest of units j .. i - 1, for every j
                mem = mem + np.maximum.accumulate(p[k - 1:i][::-1])[::-1]
            peak[k, i] = np.min(np.maximum(peak[k - 1, j], mem))
            value = np.where(mem <= cap, np.maximum(best[k - 1, j], load), math.inf)
            m = int(np.argmin(value))
            best[k, i], start[k, i] = value[m], j[m]
    if not math.isfinite(best[K, n]):
        held = ", ".join(f"{f:g}" for f in in_flight)
        raise PartitionError(f"no split of {n} pipeline units into {K} stages fits the memory limit of "
                             f"{format_exact_bytes(limit or 0)} with the stages holding {held} micro-batches' "
                             "activations: the smallest achievable largest-stage memory is "
                             f"{format_exact_bytes(peak[K, n])}; raise the limit, use more stages or fewer "
                             "micro-batches")
    firsts, i = [], n
    for k in range(K, 0, -1):
        i = int(start[k, i])
        firsts.append(i)
    return firsts[::-1]


__all__ = ["split_chain"]
