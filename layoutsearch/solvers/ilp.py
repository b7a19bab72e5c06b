"""One integer program for the strategy problem, solved by PuLP/CBC or by OR-tools.

Problem: :class:`~.problem.Problem` (one strategy per node, unary and edge
costs, memory rows under a limit).

Formulation (Alpa's, Zheng et al. 2022, OSDI, section 4.2, with the edge
variables written as a joint distribution over key pairs, which keeps the LP
relaxation tight on trees):

* ``x[n,s]`` in {0,1}: node ``n`` takes strategy ``s``; ``sum_s x[n,s] = 1``;
* ``y[f,a]`` in [0,1] for each factor ``f`` over nodes ``n_1..n_k`` and key
  tuple ``a``: the joint distribution of the nodes' keys, tied to each node
  by ``sum_{a: a_j = b} y[f,a] = sum_{s: key_j[s] = b} x[n_j,s]`` (for an
  edge, the two marginals; ``y`` is integral whenever ``x`` is);
* minimize ``sum unary[n,s] x[n,s] + sum cost[f,a] y[f,a]``;
* for every memory row: ``const + sum count * (bytes x or bytes y) <= limit``.

Memory rows are added lazily (the rows the current plan violates, then
re-solve), as most of the schedule's points never bind. Runner-up plans come
from re-solving with a no-good cut excluding the plans found. With a time limit
the best plan so far is returned with status ``feasible`` and the proven bound. When no plan fits, a second program
minimizes the peak memory, so the message can name the smallest peak any
plan needs. NP-hard in general; CBC (branch and cut) or CP-SAT (lazy clause
generation with LP relaxations) solve the tied problems of real models in
seconds.

Backends (through :mod:`layoutsearch.solvers.milp`, the MILP layer the
partitioner shares): ``"pulp"`` (PuLP's bundled CBC) and ``"ortools"``
(CP-SAT; costs are scaled to integers with 2**50 / their range, an error
below 1e-13 relative).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers import milp
from layoutsearch.solvers.problem import FEASIBLE, OPTIMAL, Problem, Solution, infeasible, solution

BACKENDS = ("pulp", "ortools")
_MIN_SOLVE_S = 0.1
"""The least time a solve is given, however late (a solver needs a moment to return any plan)."""


@dataclass
class _Model:
    """The program in neutral form: binary x, continuous-or-binary y, linear rows."""

    x: list[list[int]] = field(default_factory=list)  # var ids per node
    obj: dict[int, float] = field(default_factory=dict)
    eqs: list[tuple[dict[int, float], float]] = field(default_factory=list)
    les: list[tuple[dict[int, float], float]] = field(default_factory=list)
    mem: list[tuple[dict[int, float], float]] = field(default_factory=list)  # rows: sum <= limit - const
    nvars: int = 0
    binary: set[int] = field(default_factory=set)
    ys: list[tuple[np.ndarray, tuple[np.ndarray, ...]]] = field(default_factory=list)  # factor vars, keys

    def hint_values(self, assign: tuple[int, ...]) -> dict[int, int]:
        """Values of every variable for assignment ``assign``."""
        out = {i: int(k == s) for ids, s in zip(self.x, assign, strict=True) for k, i in enumerate(ids)}
        for y, keys in self.ys:
            at = tuple(int(k[assign[n]]) for n, k in keys)
            for idx, v in np.ndenumerate(y):
                out[int(v)] = int(idx == at)
        return out

    def var(self, binary: bool) -> int:
        self.nvars += 1
        if binary:
            self.binary.add(self.nvars - 1)
        return self.nvars - 1


def _build(problem: Problem) -> _Model:
    m = _Model()
    for u in problem.unary:
        ids = [m.var(True) for _ in range(len(u))]
        m.x.append(ids)
        m.eqs.append(({i: 1.0 for i in ids}, 1.0))
        for i, c in zip(ids, u, strict=True):
            if c:
                m.obj[i] = float(c)
    ys: list[np.ndarray] = []
    for f in problem.factors:
        shape = f.cost.shape
        y = np.arange(m.nvars, m.nvars + f.cost.size).reshape(shape)
        for _ in range(f.cost.size):
            m.var(False)
        ys.append(y)
        m.ys.append((y, tuple(zip(f.nodes, f.keys, strict=True))))
        for j, (n, k) in enumerate(zip(f.nodes, f.keys, strict=True)):
            moved = np.moveaxis(y, j, 0)
            for a in range(shape[j]):
                row = {int(v): 1.0 for v in moved[a].reshape(-1)}
                for s in np.nonzero(k == a)[0]:
                    row[m.x[n][s]] = -1.0
                m.eqs.append((row, 0.0))
        for idx, c in np.ndenumerate(f.cost):
            if c:
                m.obj[int(y[idx])] = float(c)
    terms: list[dict[int, float]] = []
    for it in problem.mem_items:
        if it.factor is None:
            terms.append({m.x[it.node][s]: float(b) for s, b in enumerate(it.bytes) if b})
        else:
            y = ys[it.factor]
            terms.append({int(y[idx]): float(v) for idx, v in np.ndenumerate(it.bytes) if v})
    for r in problem.mem_rows:
        row: dict[int, float] = {}
        for i, c in r.items:
            for v, b in terms[i].items():
                row[v] = row.get(v, 0.0) + c * b
        m.mem.append((row, r.const))
    return m


@dataclass
class _Result:
    status: str  # optimal, feasible, infeasible, unknown
    values: list[float] | None
    bound: float | None


def _assignment(m: _Model, values: list[float]) -> tuple[int, ...]:
    return tuple(int(np.argmax([values[i] for i in ids])) for ids in m.x)


# -- both backends, through the shared MILP layer ---------------------------------------------------------------------

def _run(backend: str, m: _Model, scale: float, limit: float | None, stop_at: float | None, threads: int,
         cuts: list[tuple[int, ...]], minimize_peak: bool = False, hint: tuple[int, ...] | None = None) -> _Result:
    """Solve the program (or, with ``minimize_peak``, the least peak memory of any plan) by ``backend``;
    ``stop_at``: the :func:`time.perf_counter` time by which to stop (building the solver's model counts).

    Memory rows stay in integer bytes (a scaled row can round above its right-hand side); CBC's preprocessing
    can call a row met with equality infeasible, so CBC's rows get half a byte of slack (exact, as bytes are
    integers) or a relative 1e-9 for fractional rows. CBC runs without integer preprocessing: it returned a
    worse plan as "optimal" on a 4-node problem with two lazily added memory rows (tests/test_solvers.py,
    example seed 8137).
    """
    mdl = milp.Model()
    for i in range(m.nvars):
        mdl.var(kind="binary" if i in m.binary else "continuous")
    for row, rhs in m.eqs:
        mdl.add(row, rhs, rhs)
    peak = None
    if minimize_peak:
        peak = mdl.var(0, 2.0**61, kind="continuous", unit=1.0)
        for row, const in m.mem:
            mdl.add(row | {peak: -1.0}, hi=-math.ceil(const) if backend == "ortools" else -const)
        mdl.objective = {peak: 1.0}
    else:
        if limit is not None:
            for row, const in m.mem:
                integral = float(const).is_integer() and all(float(c).is_integer() for c in row.values())
                rhs = limit - const
                if backend == "ortools":
                    mdl.add(row, hi=math.floor(rhs))
                else:
                    # an integral row's sum is an integer: at most floor(rhs), with half a unit of slack for
                    # CBC's tolerances (rhs + 0.5 admitted floor(rhs) + 1 where the limit is fractional)
                    tol = 1e-9 * max(1.0, abs(rhs))
                    mdl.add(row, hi=math.floor(rhs + tol) + 0.5 if integral else rhs + tol)
        mdl.objective = {i: c * scale for i, c in m.obj.items()}
    for cut in cuts:
        mdl.add({m.x[n][s]: 1.0 for n, s in enumerate(cut)}, hi=len(cut) - 1)
    if hint is not None:
        mdl.hint = {i: float(v) for i, v in m.hint_values(hint).items()}
    left = None if stop_at is None else max(_MIN_SOLVE_S, stop_at - time.perf_counter())
    res = milp.solve(mdl, backend, time_limit=left, threads=threads, cp_scale=1.0, preprocess=backend != "pulp")
    if res.status == "infeasible":
        return _Result("infeasible", None, None)
    if res.status == "none":
        return _Result("unknown", None, None)
    if minimize_peak:
        assert peak is not None
        return _Result(res.status, res.values, res.values[peak])
    return _Result(res.status, res.values, None if res.status == "optimal" or res.bound is None else res.bound / scale)


def _scale(problem: Problem, backend: str) -> float:
    """Objective multiplier: costs to ~1e6 for the MIP solvers, to integers below 2**50 for CP-SAT."""
    span = sum(float(np.abs(u).max()) for u in problem.unary if len(u)) + sum(
        float(np.abs(f.cost).max()) for f in problem.factors)
    span = span or 1.0
    return (2.0**50 if backend == "ortools" else 1e6) / span


def solve(problem: Problem, memory_limit: float | None = None, backend: str = "ortools", top: int = 1,
          time_limit: float | None = None, threads: int | None = None,
          hint: tuple[int, ...] | None = None) -> list[Solution]:
    """The ``top`` best assignments that fit ``memory_limit`` (bytes per device), best first.

    Each is ``optimal`` when proven, ``feasible`` (with its bound) when
    ``time_limit`` seconds (for all the solves together) ran out first. When
    nothing fits, one infeasible Solution carrying the smallest peak memory.
    ``hint``: a known assignment to start from (e.g. a feasible plan).
    """
    if backend not in BACKENDS:
        raise LayoutSearchError(f"unknown ILP backend {backend!r} (known: {', '.join(BACKENDS)})")
    t0 = time.perf_counter()  # building the programs counts against the time limit
    stop_at = None if time_limit is None else t0 + time_limit
    threads = threads or (milp.DEFAULT_THREADS if backend == "ortools" else 1)
    m = _build(problem)
    scale = _scale(problem, backend)

    def run(*args: object, **kw: object) -> _Result:
        return _run(backend, *args, **kw)  # type: ignore[arg-type]

    name = f"ilp-{backend}"
    out: list[Solution] = []
    cuts: list[tuple[int, ...]] = []
    # memory rows are added lazily: solve with the rows violated so far, add the ones the plan violates, repeat
    # (a plan optimal under some rows that fits all of them is optimal under all)
    active: list[int] = []
    if hint is not None and memory_limit is not None and problem.mem_rows:
        active = [int(np.argmax(problem.rows(hint)))]
    while len(out) < top:
        if out and stop_at is not None and time.perf_counter() >= stop_at:
            break
        sub = dataclasses.replace(m, mem=[m.mem[i] for i in active])
        res = run(sub, scale, memory_limit, stop_at, threads, cuts, hint=hint if not out else None)
        if res.status in ("infeasible", "unknown"):
            if not out and res.status == "infeasible":
                peak = run(m, scale, None, None, threads, [], minimize_peak=True)
                return [infeasible(name, time.perf_counter() - t0, peak.bound)]
            if not out and hint is not None and problem.fits(hint, memory_limit):
                out.append(solution(problem, hint, FEASIBLE, name, time.perf_counter() - t0, res.bound))
                break
            if not out:
                raise LayoutSearchError(f"{name} found no plan within {time_limit} s: raise the time limit")
            break
        assign = _assignment(m, res.values)
        if memory_limit is not None and problem.mem_rows:
            over = np.nonzero(problem.rows(assign) > memory_limit * (1 + 1e-12))[0]
            if len(over):
                if res.status == "feasible" and stop_at is not None and time.perf_counter() >= stop_at:
                    if not out and hint is not None and problem.fits(hint, memory_limit):
                        out.append(solution(problem, hint, FEASIBLE, name, time.perf_counter() - t0, res.bound))
                    break
                new = [int(r) for r in over if int(r) not in active]
                if not new:  # the solver broke a row it was given: asking again would loop forever
                    raise LayoutSearchError(f"{name} returned a plan over memory rows it was given "
                                            f"({', '.join(map(str, over[:5]))}): a numerical tolerance")
                active += new
                continue
        bound = res.bound if res.status == "feasible" and res.bound is not None else None
        sol = solution(problem, assign, OPTIMAL if res.status == "optimal" else FEASIBLE, name,
                       time.perf_counter() - t0, bound)
        out.append(sol)
        cuts.append(assign)
        if len(cuts) >= problem.num_assignments:
            break
    return out
