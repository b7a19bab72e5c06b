"""The placement ILP (Tarnawski et al. 2020, Section 5), solved through the shared MILP layer.

**Variables.** ``x[v,s,k] = 1`` iff unit ``v`` is on slot ``s`` as a device of kind ``k`` (only where
``v`` may run on ``k``). Non-contiguous placements and one-kind problems give each slot a fixed device;
contiguous placements over several kinds let a slot choose its kind (``z[s,k]``, at most ``count_k``
slots per kind), since the pipeline may alternate kinds.

**Rows.** Every unit on one slot; memory per slot within its kind's limit (integer units of at most
``2^31``: exact when the sizes share a unit, else rounded conservatively); contiguity as "every prefix of
slots is down-closed" (``sum_{i<=j} X[u,i] >= sum_{i<=j} X[v,i]`` per order edge ``u -> v``); for
non-contiguous placements, devices of a kind ordered by their first unit (symmetry). Send and receive
indicators ``send >= H[src,s] - X[w,s]``, ``recv >= H[w,s] - X[src,s]`` (``H``: on ``s`` as a non-host
kind) price the transfers; GPipe uses live-across-cut indicators instead. ``L >= load_s`` (throughput,
GPipe); for latency ``F_s >= load_s``, ``F_s >= F_{s'} + load_s - M (1 - e[s',s])`` with
``e[s',s] >= X[u,s'] + X[w,s] - 1`` per dependency ``u -> w`` and ``L >= F_s``. ``L`` is also at least the
lower bound of :func:`.bounds.objective_bound` (the relaxation without communication; for latency also the
longest path of the units' fastest times and the path bound). For latency with a warm start, ``L`` (and so
every ``F_s``) is capped a hair above the start's latency and ``M`` is that cap (no optimum lies above a
known placement; without a start ``M`` is the sum of every time). Minimize ``L``.

Times are scaled by that lower bound so that the solvers' absolute tolerances act as relative ones.
A warm start (the DP's optimum, or the local search's placement) is handed to the solver as a complete hint:
the continuous variables (transfer indicators, finish times, ``L``) get the least values their rows allow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from layoutsearch.errors import PartitionError
from layoutsearch.solvers import milp
from layoutsearch.solvers.partition.bounds import objective_bound
from layoutsearch.solvers.partition.instance import Instance, evaluate, value

_CPSAT_RESOLUTION = 1e9
"""CP-SAT's integer resolution: scaled times (about 1 for the lower bound) in units of one over this."""
_UPPER_SLACK = 1e-4
"""Relative room above a known placement's latency left to ``L`` (the hint's rounding stays feasible)."""


def solve_ilp(inst: Instance, objective: str, mb: int, contiguous: bool, exact_k: bool, backend: str,
              time_limit: float | None, info: dict[str, Any], hint: Sequence[int] | None = None,
              memory_margin: int = 0, lower: float | None = None) -> tuple[milp.Result, list[int]]:
    """Build and solve the ILP; returns the MILP result (objective and bound in the DAG's time unit) and
    the assignment unit -> device (empty without a solution). ``memory_margin`` tightens every limit;
    ``lower``: :func:`.bounds.objective_bound` when already computed."""
    mdl = milp.Model()
    lower = objective_bound(inst, objective, mb) if lower is None else lower
    info["lower_bound"] = lower
    upper = None
    if objective == "latency" and hint:  # the start's latency: no better solution lies above it
        loads, _ = evaluate(inst, hint, objective, mb)
        upper = value(inst, hint, loads, objective, mb)
    f = _variables(inst, mdl, contiguous, 1.0 / (lower or 1.0))
    _placement_rows(f, exact_k)
    _memory_rows(inst, mdl, f.x, mb, memory_margin, info)
    if contiguous:
        _contiguity_rows(f)
    else:
        _symmetry_rows(f)
    loads = _loads(f)
    _transfer_rows(f, objective, loads)
    goal, res = _objective_rows(f, objective, loads, lower, upper)
    mdl.objective = {goal: 1.0}
    if hint:
        _hint(inst, mdl, f.x, hint, f.flexible, f.z)
        _complete_hint(mdl)
    return _solve(f, backend, time_limit, res)


@dataclass
class _Formulation:
    """The ILP under construction: its model, the kinds each slot may take and the assignment variables
    ``x[v][s][k]``, with the rows' views of them (``X[v][s]``: unit ``v`` on slot ``s``; ``H[v][s]``: there as a
    non-host kind) and, for flexible slots, the slot-kind variables ``z[s][k]``."""

    inst: Instance
    mdl: milp.Model
    scale: float
    """Times are multiplied by this (one over the lower bound)."""
    flexible: bool
    slot_kinds: list[list[int]]
    x: list[list[dict[int, int]]]
    X: list[list[dict[int, float]]]
    H: list[list[dict[int, float]]]
    z: list[dict[int, int]] | None = None

    @property
    def nslots(self) -> int:
        return len(self.slot_kinds)


def _variables(inst: Instance, mdl: milp.Model, contiguous: bool, scale: float) -> _Formulation:
    """The slots and the assignment variables: one per unit, slot and kind the unit may run on."""
    n, nk = inst.n, len(inst.kinds)
    flexible = contiguous and nk > 1
    slot_kinds = ([list(range(nk))] * inst.num_devices if flexible else [[k] for k in inst.device_kind])
    nslots = len(slot_kinds)
    x: list[list[dict[int, int]]] = [[{} for _ in range(nslots)] for _ in range(n)]
    for v in range(n):
        for s in range(nslots):
            for k in slot_kinds[s]:
                if math.isfinite(inst.time[k][v]) and inst.kinds[k].count:
                    x[v][s][k] = mdl.var()
    X = [[dict.fromkeys(x[v][s].values(), 1.0) for s in range(nslots)] for v in range(n)]
    H = [[{i: 1.0 for k, i in x[v][s].items() if not inst.kinds[k].host} for s in range(nslots)] for v in range(n)]
    return _Formulation(inst, mdl, scale, flexible, slot_kinds, x, X, H)


def _placement_rows(f: _Formulation, exact_k: bool) -> None:
    """Every unit on one slot; flexible slots of one kind each, at most ``count_k`` of kind ``k`` (the
    variables ``z``); with ``exact_k``, no slot empty."""
    inst, mdl, x, n, nslots = f.inst, f.mdl, f.x, f.inst.n, f.nslots
    for v in range(n):
        mdl.add({i: 1 for s in range(nslots) for i in x[v][s].values()}, 1, 1)
    if f.flexible:
        nk = len(inst.kinds)
        z = f.z = [{k: mdl.var() for k in range(nk)} for _ in range(nslots)]
        for s in range(nslots):
            mdl.add(dict.fromkeys(z[s].values(), 1), hi=1)
            for v in range(n):
                for k, i in x[v][s].items():
                    mdl.add({i: 1, z[s][k]: -1}, hi=0)
        for k in range(nk):
            mdl.add({z[s][k]: 1 for s in range(nslots)}, hi=inst.kinds[k].count)
    if exact_k:
        for s in range(nslots):
            mdl.add({i: 1 for v in range(n) for i in f.X[v][s]}, 1)


def _contiguity_rows(f: _Formulation) -> None:
    """Contiguous placements: every prefix of slots is down-closed (per order edge ``u -> v`` and slot ``j``,
    ``sum_{i<=j} X[u,i] >= sum_{i<=j} X[v,i]``)."""
    X = f.X
    for v in range(f.inst.n):
        for u in f.inst.preds[v]:
            for j in range(f.nslots - 1):
                row: dict[int, float] = {}
                for i in range(j + 1):
                    for var in X[u][i]:
                        row[var] = row.get(var, 0.0) + 1
                    for var in X[v][i]:
                        row[var] = row.get(var, 0.0) - 1
                f.mdl.add(row, 0)


def _symmetry_rows(f: _Formulation) -> None:
    """Non-contiguous placements: the devices of a kind ordered by their first unit (a unit on a device only
    when an earlier unit is on the device before it)."""
    inst, X = f.inst, f.X
    for s in range(1, f.nslots):
        if inst.device_kind[s] != inst.device_kind[s - 1]:
            continue
        for v in range(inst.n):
            row = dict(X[v][s]) | {var: -1.0 for u in range(v) for var in X[u][s - 1]}
            f.mdl.add(row, hi=0)


def _loads(f: _Formulation) -> list[dict[int, float]]:
    """Per slot, the compute part of its load: variable -> scaled time (the transfer rows add to it)."""
    inst, x = f.inst, f.x
    loads: list[dict[int, float]] = [{} for _ in range(f.nslots)]
    for s in range(f.nslots):
        for v in range(inst.n):
            for k, i in x[v][s].items():
                if inst.time[k][v]:
                    loads[s][i] = inst.time[k][v] * f.scale
    return loads


def _transfer_rows(f: _Formulation, objective: str, loads: list[dict[int, float]]) -> None:
    """Price the tensors crossing slots into ``loads``: live-across-cut indicators for GPipe, else send and
    receive indicators on every slot that may hold a non-host kind."""
    inst, mdl, X, H = f.inst, f.mdl, f.X, f.H
    for src, cons, c in inst.tensors:
        if not c:
            continue
        c *= f.scale
        if objective == "gpipe":  # live[j] >= [src in prefix j] - [w in prefix j]; paid by stages j and j + 1
            for j in range(f.nslots - 1):
                live = mdl.var(kind="continuous")
                for w in cons:
                    row = {live: 1.0}
                    for i in range(j + 1):
                        for var in X[src][i]:
                            row[var] = row.get(var, 0.0) - 1
                        for var in X[w][i]:
                            row[var] = row.get(var, 0.0) + 1
                    mdl.add(row, 0)
                for s in (j, j + 1):
                    loads[s][live] = loads[s].get(live, 0.0) + c
            continue
        for s in range(f.nslots):
            if all(inst.kinds[k].host for k in f.slot_kinds[s]):
                continue
            send, recv = mdl.var(kind="continuous"), mdl.var(kind="continuous")
            for w in cons:
                mdl.add({send: 1.0} | _neg(H[src][s]) | X[w][s], 0)
                mdl.add({recv: 1.0} | _neg(H[w][s]) | X[src][s], 0)
            loads[s][send] = loads[s][recv] = c


def _objective_rows(f: _Formulation, objective: str, loads: list[dict[int, float]], lower: float,
                    upper: float | None = None) -> tuple[int, float]:
    """The objective variable ``L`` (at least the scaled lower bound, 1) and its rows: ``L >= load_s`` per slot,
    or for latency the finish times of the slots. Returns ``L`` and CP-SAT's resolution for it.

    ``upper`` (latency only): the latency of a known placement (the warm start). ``L`` and so every finish
    time are then capped a hair above it, and the big-M of the precedence rows is that cap instead of the
    sum of every time: an optimum is never above a known placement, so no optimum is cut off (the start
    itself stays feasible: it is hinted with ``L`` at its latency), and the LP relaxation is much tighter."""
    inst, mdl, scale = f.inst, f.mdl, f.scale
    nk, nslots = len(inst.kinds), f.nslots
    top = sum(max((inst.time[k][v] for k in range(nk) if math.isfinite(inst.time[k][v])), default=0.0)
              for v in range(inst.n)) * scale + 2 * sum(c for _, _, c in inst.tensors) * scale
    if objective == "gpipe":
        top += 2 * nslots * sum(c for _, _, c in inst.tensors) * scale
    res = min(_CPSAT_RESOLUTION, 2**31 / max([abs(c) for ld in loads for c in ld.values()] + [1.0]))
    cap = max(top, 1.0) * 1.01 + 1.0
    if objective == "latency" and upper is not None and math.isfinite(upper):
        cap = min(cap, max(upper * scale, 1.0) * (1 + _UPPER_SLACK) + 10 / res)
    goal = mdl.var(0, cap, kind="continuous", unit=1 / res)
    mdl.add({goal: 1.0}, lo=1.0 - 1e-9 if lower else 0.0)
    if objective == "latency":
        _latency_rows(f, goal, loads, top, res)
    else:
        for s in range(nslots):
            mdl.add({goal: 1.0} | _neg(loads[s]), 0)
    return goal, res


def _latency_rows(f: _Formulation, goal: int, loads: list[dict[int, float]], top: float, res: float) -> None:
    """Latency: ``F_s >= load_s``, ``F_s >= F_{s'} + load_s - M (1 - e[s',s])`` with ``e[s',s] >= X[u,s'] +
    X[w,s] - 1`` per dependency ``u -> w``, and ``L >= F_s``."""
    mdl, X, nslots = f.mdl, f.X, f.nslots
    cap = mdl.vars[goal].ub  # F_s <= L <= cap, so M = cap makes the row void when e = 0
    finish = [mdl.var(0, cap, kind="continuous", unit=1 / res) for _ in range(nslots)]
    big = cap
    deps = {(src, w) for src, cons, _ in f.inst.tensors for w in cons}
    for s in range(nslots):
        mdl.add({finish[s]: 1.0} | _neg(loads[s]), 0)
        mdl.add({goal: 1.0, finish[s]: -1.0}, 0)
        for r in range(s):
            e = mdl.var(kind="continuous")
            for u, w in deps:
                mdl.add({e: 1.0} | _neg(X[u][r]) | _neg(X[w][s]), -1)
            mdl.add({finish[s]: 1.0, finish[r]: -1.0, e: -big} | _neg(loads[s]), -big)


def _solve(f: _Formulation, backend: str, time_limit: float | None, res: float) -> tuple[milp.Result, list[int]]:
    """Solve the model; the result's objective and bound back in the DAG's time unit, and the assignment."""
    sol = milp.solve(f.mdl, "ortools" if backend == "ilp-ortools" else "pulp", time_limit=time_limit,
                     cp_scale=res, gap=1e-9 if backend == "ilp-pulp" else 0.0)
    scale = f.scale
    sol = milp.Result(sol.status, sol.values, sol.objective / scale, None if sol.bound is None else sol.bound / scale)
    if not sol.values:
        return sol, []
    return sol, _assignment(f.inst, f.x, sol.values, f.flexible, f.slot_kinds)


def _neg(row: dict[int, float]) -> dict[int, float]:
    return {i: -c for i, c in row.items()}


def _memory_rows(inst: Instance, mdl: milp.Model, x: list[list[dict[int, int]]], mb: int, margin: int,
                 info: dict[str, Any]) -> None:
    """Memory per slot and kind in integer units of ``g`` bytes: exact when ``g`` divides every size (their
    gcd); the solvers' presolve mishandles coefficients beyond ~2^32, so larger numbers are rounded to coarser
    units, conservatively (sizes up, the limit down): a stage may then be refused for lying within ``n g``
    bytes of the limit, never admitted over it."""
    memw = inst.memw(mb)
    for k, kind in enumerate(inst.kinds):
        if kind.limit is None:
            continue
        limit = max(0, kind.limit - margin)
        g = math.gcd(limit, *memw) or 1
        if limit // g > 2**31:
            g = -(-limit // 2**31)
            info["memory_unit_bytes"] = g
        for s in range(len(x[0]) if x else 0):
            row = {x[v][s][k]: -(-w // g) for v, w in enumerate(memw) if w and k in x[v][s]}
            if row:
                mdl.add(row, hi=limit // g)


def _hint(inst: Instance, mdl: milp.Model, x: list[list[dict[int, int]]], sigma: Sequence[int], flexible: bool,
          z: list[dict[int, int]] | None) -> None:
    """Hint a known assignment (devices numbered kind by kind); flexible slots follow its pipeline order."""
    import networkx as nx

    used = sorted(set(sigma))
    if flexible:
        graph = nx.DiGraph()
        graph.add_nodes_from(used)
        graph.add_edges_from((sigma[u], sigma[v]) for v in range(inst.n) for u in inst.preds[v] if sigma[u] != sigma[v])
        slot = {d: i for i, d in enumerate(nx.lexicographical_topological_sort(graph))}
    else:
        slot = {d: d for d in used}
    for v, d in enumerate(sigma):
        k = inst.device_kind[d]
        for s in range(len(x[v])):
            for kk, i in x[v][s].items():
                mdl.hint[i] = float(s == slot[d] and kk == k)
    if z is not None:
        kind_of = {slot[d]: inst.device_kind[d] for d in used}
        for s, row in enumerate(z):
            for k, i in row.items():
                mdl.hint[i] = float(kind_of.get(s) == k)


def _complete_hint(mdl: milp.Model) -> None:
    """Give every continuous variable left out of the hint the least value its rows allow given the others
    (send/receive indicators, loads, finish times, the objective; all bounded from below only), so that the
    solver starts from a complete solution, a hair above the rows' rounding."""
    free = {i for i, v in enumerate(mdl.vars) if v.kind == "continuous" and i not in mdl.hint}
    for i in free:
        mdl.hint[i] = mdl.vars[i].lb
    rows = [(c, lo) for c, lo, _ in mdl.rows if math.isfinite(lo) and any(a > 0 and i in free for i, a in c.items())]
    for _ in range(100):
        changed = False
        for coeffs, lo in rows:
            got = math.fsum(c * mdl.hint.get(i, 0.0) for i, c in coeffs.items())
            if got >= lo - 1e-12:
                continue
            i = max((i for i, c in coeffs.items() if c > 0 and i in free), key=lambda i: coeffs[i], default=None)
            if i is None:
                continue
            mdl.hint[i] += (lo - got) / coeffs[i]
            changed = True
        if not changed:
            break
    for i in free:
        var = mdl.vars[i]
        bump = mdl.hint[i] * 1e-7 + (var.unit or 0.0) if var.unit is not None else 0.0
        mdl.hint[i] = min(var.ub, mdl.hint[i] + bump)


def _assignment(inst: Instance, x: list[list[dict[int, int]]], values: list[float], flexible: bool,
                slot_kinds: list[list[int]]) -> list[int]:
    """Unit -> device from the solution; flexible slots take the devices of their kind in slot order."""
    place = []
    for v in range(inst.n):
        best = max(((values[i], s, k) for s in range(len(x[v])) for k, i in x[v][s].items()), key=lambda t: t[0])
        place.append((best[1], best[2]))
    if not flexible:
        return [s for s, _ in place]
    offset = [sum(k.count for k in inst.kinds[:i]) for i in range(len(inst.kinds))]
    device: dict[tuple[int, int], int] = {}
    used = [0] * len(inst.kinds)
    for s, k in sorted(set(place)):
        if used[k] >= inst.kinds[k].count:
            raise PartitionError("the ILP used more devices of a kind than there are")
        device[(s, k)] = offset[k] + used[k]
        used[k] += 1
    return [device[p] for p in place]
