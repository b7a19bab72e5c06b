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
"""

from __future__ import annotations

import math

from layoutsearch.solvers.partition.dp import lower_bound
from layoutsearch.solvers.partition.instance import Instance


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


def objective_bound(inst: Instance, objective: str) -> float:
    """A lower bound on the largest load (throughput, GPipe per micro-batch) or on the latency."""
    bound = no_communication_bound(inst)
    if objective == "latency":
        bound = max(bound, critical_path(inst))
    return bound


__all__ = ["critical_path", "no_communication_bound", "objective_bound"]
