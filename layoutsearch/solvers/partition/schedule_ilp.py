"""The exact method for non-contiguous latency: a scheduling MILP through :mod:`layoutsearch.solvers.milp`.

**Variables.** ``x[r,d] = 1`` iff co-location group (or lone unit) ``r`` is on device ``d`` (only where every
member may run on ``d``'s kind and the group's memory fits); unit ``v`` is on ``d`` iff ``x[rep(v),d]``. Start
times ``S_v >= 0``; the makespan ``L``.

**Rows.** Every group on one device; memory per device within its kind's limit (the conservative integer
units of :mod:`.ilp`); exactly-k: no device empty; devices of a kind ordered by their first group (identical
devices are interchangeable: any schedule relabels to one that obeys this). Per dependency ``u -> w`` with
a transfer ``c``: send and receive indicators ``send >= H[u,d] - X[w,d]``, ``recv >= H[w,d] - X[u,d]`` (``H``:
on ``d``, a non-host device) and ``S_w >= S_u + p_u + c (send + recv)``, ``p_u = sum_d t(u, d) X[u,d]`` (no
transfer: ``S_w >= S_u + p_u``). Per pair of units neither of which depends on the other, that may share a
device on which both take time: ``same >= X[u,d] + X[w,d] - 1`` on each such device, an order variable ``o``
and the disjunction ``S_w >= S_u + p_u - M (1 - o) - M (1 - same)``, ``S_u >= S_w + p_w - M o - M (1 -
same)``. ``L >= S_v + p_v``; ``L >= `` the lower bound of :func:`.schedule.lower_bound` (valid here: see
there; the path bound of :mod:`.bounds` is not); with a start (the heuristic's schedule), ``L`` is capped a
hair above its makespan, which also serves as ``M`` (every ``S_v + p_v <= L``, so ``M = cap`` voids a row).
Minimize ``L``.

Times are scaled by the lower bound (the solvers' absolute tolerances act as relative ones); CP-SAT proves
optimality to a relative gap of :data:`PROOF_GAP`, CBC to 1e-9. The start is
handed to the solver as a complete hint: assignment, orders and starts, the starts raised by a few solver
units per position so that rounding keeps every row satisfied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from layoutsearch.solvers import milp
from layoutsearch.solvers.partition.ilp import _complete_hint, _memory_rows
from layoutsearch.solvers.partition.schedule import Problem, Schedule, priced

PROOF_GAP = 1e-6
"""CP-SAT stops, and the result counts as optimal, within this relative gap: the rounding of its integer times
(about 1e-9) and of the hint leave it a few units above its bound, which it may spend its whole time limit
closing; CBC runs to 1e-9."""
THREADS: int | None = 1
"""CP-SAT workers: one (CP-SAT 9.15 with several interleaved workers idles to its time limit on some small
models after reaching the optimum)."""
MAX_PAIR_ROWS = 2_000_000
"""The ILP is not built when its disjunctive rows would exceed this (the heuristic's schedule stands)."""
_CPSAT_RESOLUTION = 1e9
_UPPER_SLACK = 1e-4


class TooLarge(Exception):
    """The disjunctive formulation would be too large to build."""


def pairs(p: Problem) -> list[tuple[int, int, list[int]]]:
    """Units ``u < w`` neither of which depends on the other, with the devices on which both take time."""
    inst = p.inst
    anc = [0] * inst.n
    for v in range(inst.n):  # unit order is topological
        for u in inst.preds[v]:
            anc[v] |= anc[u] | (1 << u)
    out = []
    rows = 0
    for w in range(inst.n):
        if not any(t > 0 for t in p.dur[w] if math.isfinite(t)):
            continue
        for u in range(w):
            if anc[w] >> u & 1:
                continue
            ru, rw = p.eligible[p.rep[u]], set(p.eligible[p.rep[w]])
            devs = [d for d in ru if d in rw and p.dur[u][d] > 0 and p.dur[w][d] > 0]
            if devs:
                out.append((u, w, devs))
                rows += len(devs) + 2
                if rows > MAX_PAIR_ROWS:
                    raise TooLarge
    return out


def solve_schedule_ilp(p: Problem, backend: str, time_limit: float | None, lower: float, hint: Schedule | None,
                       info: dict[str, Any], memory_margin: int = 0) -> tuple[milp.Result, Schedule | None]:
    """Build and solve the MILP (module docstring); the result's objective and bound in the DAG's time unit,
    and the schedule it found (priced by the one definition), None without one. Raises TooLarge."""
    inst, mdl = p.inst, milp.Model()
    nd = inst.num_devices
    scale = 1.0 / (lower or 1.0)
    disjoint = pairs(p)
    x = {r: {d: mdl.var() for d in p.eligible[r]} for r in p.reps}
    X = [{d: x[p.rep[v]][d] for d in p.eligible[p.rep[v]]} for v in range(inst.n)]
    for r in p.reps:
        mdl.add(dict.fromkeys(x[r].values(), 1), 1, 1)
    shim = SimpleNamespace(kinds=inst.kinds, memw=lambda mb: [p.group_mem[r] for r in p.reps])
    xk = [[({inst.device_kind[d]: x[r][d]} if d in x[r] else {}) for d in range(nd)] for r in p.reps]
    _memory_rows(shim, mdl, xk, 1, memory_margin, info)  # type: ignore[arg-type]
    for d in range(nd):
        if not p.at_most:
            mdl.add({x[r][d]: 1 for r in p.reps if d in x[r]}, 1)
        if p.twin[d]:  # a group on d only when an earlier group is on d - 1
            for i, r in enumerate(p.reps):
                if d in x[r]:
                    mdl.add({x[r][d]: 1.0} | {x[q][d - 1]: -1.0 for q in p.reps[:i] if d - 1 in x[q]}, hi=0)
    top = (math.fsum(max((t for t in p.dur[v] if math.isfinite(t)), default=0.0) for v in range(inst.n))
           + 2 * math.fsum(p.delays.values())) * scale
    cap = max(top, 1.0) * 1.01 + 1.0
    coef = max([t * scale for v in range(inst.n) for t in p.dur[v] if math.isfinite(t)]
               + [c * scale for c in p.delays.values()] + [1.0])
    res = min(_CPSAT_RESOLUTION, 2**31 / max(coef, cap))
    if hint is not None:
        cap = min(cap, max(hint.value * scale, 1.0) * (1 + _UPPER_SLACK) + 10 / res)
        res = min(_CPSAT_RESOLUTION, 2**31 / max(coef, cap))
    goal = mdl.var(0, cap, kind="continuous", unit=1 / res)
    mdl.add({goal: 1.0}, lo=1.0 - 1e-9 if lower else 0.0)
    start = [mdl.var(0, cap, kind="continuous", unit=1 / res) for _ in range(inst.n)]
    dur = [{i: p.dur[v][d] * scale for d, i in X[v].items() if p.dur[v][d]} for v in range(inst.n)]
    for v in range(inst.n):
        mdl.add({goal: 1.0, start[v]: -1.0} | _neg(dur[v]), 0)
    _precedence_rows(p, mdl, X, start, dur, scale)
    orders = _disjunctive_rows(mdl, X, start, dur, disjoint, cap)
    mdl.objective = {goal: 1.0}
    if hint is not None:
        _hint(p, mdl, x, start, orders, hint, scale, res)
        _complete_hint(mdl)
    sol = milp.solve(mdl, "ortools" if backend == "ilp-ortools" else "pulp", time_limit=time_limit, cp_scale=res,
                     gap=1e-9 if backend == "ilp-pulp" else PROOF_GAP, threads=THREADS)
    if sol.status == "feasible" and sol.bound is not None and sol.objective - sol.bound <= PROOF_GAP * sol.objective:
        sol = milp.Result("optimal", sol.values, sol.objective, sol.objective)
    sol = milp.Result(sol.status, sol.values, sol.objective / scale, None if sol.bound is None else sol.bound / scale)
    if not sol.values:
        return sol, None
    sigma = [max(X[v], key=lambda d: sol.values[X[v][d]]) for v in range(inst.n)]
    order: list[list[int]] = [[] for _ in range(nd)]
    for v in sorted(range(inst.n), key=lambda v: (round(sol.values[start[v]] * res), v)):
        order[sigma[v]].append(v)
    mem = [0] * nd
    for r in p.reps:
        mem[sigma[r]] += p.group_mem[r]
    if any(p.limit[d] is not None and mem[d] > p.limit[d] for d in range(nd)):
        info["ilp_over_memory"] = True  # CBC's feasibility tolerance let a device exceed its limit by a hair
        return sol, None
    return sol, priced(inst, sigma, order)


def _precedence_rows(p: Problem, mdl: milp.Model, X: list[dict[int, int]], start: list[int],
                     dur: list[dict[int, float]], scale: float) -> list[int]:
    """``S_w >= S_u + p_u + c (send + recv)`` per dependency; returns the indicator variables."""
    inst = p.inst
    made = []
    for w in range(inst.n):
        for u in inst.preds[w]:
            row = {start[w]: 1.0, start[u]: -1.0} | _neg(dur[u])
            c = p.delays.get((u, w), 0.0) * scale
            if c and p.rep[u] != p.rep[w]:
                for a, b in ((u, w), (w, u)):  # send: u on a non-host d, w elsewhere; recv: the reverse
                    ind = mdl.var(kind="continuous")
                    made.append(ind)
                    for d, i in X[a].items():
                        if not p.host[d]:
                            mdl.add({ind: 1.0, i: -1.0} | ({X[b][d]: 1.0} if d in X[b] else {}), 0)
                    row[ind] = -c
            mdl.add(row, 0)
    return made


def _disjunctive_rows(mdl: milp.Model, X: list[dict[int, int]], start: list[int], dur: list[dict[int, float]],
                      disjoint: list[tuple[int, int, list[int]]], big: float) -> dict[tuple[int, int], int]:
    """No two units overlapping on a device where both take time; returns the order variables (1: ``u`` first)."""
    orders = {}
    for u, w, devs in disjoint:
        same, o = mdl.var(kind="continuous"), mdl.var()
        orders[(u, w)] = o
        for d in devs:  # (one variable when u and w are of one group: same >= 2 x - 1)
            row = {same: 1.0, X[u][d]: -1.0}
            row[X[w][d]] = row.get(X[w][d], 0.0) - 1.0
            mdl.add(row, -1)
        mdl.add({start[w]: 1.0, start[u]: -1.0, o: -big, same: -big} | _neg(dur[u]), -2 * big)
        mdl.add({start[u]: 1.0, start[w]: -1.0, o: big, same: -big} | _neg(dur[w]), -big)
    return orders


def _hint(p: Problem, mdl: milp.Model, x: dict[int, dict[int, int]], start: list[int],
          orders: dict[tuple[int, int], int], hint: Schedule, scale: float, res: float) -> None:
    """The start as a complete hint, its devices relabelled to obey the symmetry rows; starts raised by 3 solver
    units per position in the start order (rounding never breaks a row), orders from those positions."""
    inst = p.inst
    sigma = canonical(p, hint.sigma)
    for r in p.reps:
        for d, i in x[r].items():
            mdl.hint[i] = float(sigma[r] == d)
    pos = {v: k for k, v in enumerate(sorted(range(inst.n), key=lambda v: (hint.starts[v], v)))}
    for v in range(inst.n):
        mdl.hint[start[v]] = hint.starts[v] * scale * (1 + 1e-9) + 3 * pos[v] / res
    for (u, w), o in orders.items():
        mdl.hint[o] = float(pos[u] < pos[w])


def canonical(p: Problem, sigma: Sequence[int]) -> list[int]:
    """``sigma`` with the devices of each kind relabelled in the order of their first group, empty ones last."""
    inst = p.inst
    nd = inst.num_devices
    firsts: dict[int, int] = {}
    for r in p.reps:
        firsts.setdefault(sigma[r], r)
    relabel = {}
    for k in range(len(inst.kinds)):
        devs = [d for d in range(nd) if inst.device_kind[d] == k]
        ranked = sorted(devs, key=lambda d: (firsts.get(d, math.inf), d))
        relabel.update(zip(ranked, devs, strict=True))
    return [relabel[d] for d in sigma]


def _neg(row: dict[int, float]) -> dict[int, float]:
    return {i: -c for i, c in row.items()}
