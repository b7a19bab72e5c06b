"""One small mixed-integer linear program layer for every solver: a neutral model, two backends.

A :class:`Model` holds variables (binary, integer, continuous), rows ``lo <= sum coef * var <= hi``, a
linear objective to minimize and an optional hint (a known solution to start from). :func:`solve` hands
it to CBC (through PuLP's MPS writer and solution reader, the bundled ``cbc`` run as a child process we
own) or to OR-tools CP-SAT, and returns a :class:`Result` in the model's own units.

Conventions, the same for every caller:

* **CP-SAT works in integers.** A binary or integer variable is itself. A continuous variable either has
  a ``unit`` (CP-SAT counts multiples of it) or is *implied integral* (``unit=None``: integral at every
  integral point of the others, e.g. an indicator ``s >= x_a - x_b`` or the joint distribution of two
  one-hot vectors; CP-SAT makes it an integer). A row whose coefficients (times the units) are all
  integers is kept as is; any other row, and the objective, is multiplied by ``cp_scale`` and rounded
  (bounds rounded inwards). Choose ``cp_scale`` so that the rounding error is negligible and the
  coefficients stay below ``2^31``.
* **Determinism.** CP-SAT runs ``threads`` workers with ``interleave_search`` (deterministic
  parallelism) and a fixed seed; CBC is single-process and seeded. The same model gives the same
  solution in every process, unless a time limit cuts the search short.
* **Ctrl-C.** CP-SAT would catch SIGINT itself and return its best solution as if a time limit had hit;
  it is told not to, and solves in a worker thread while the main thread waits: Ctrl-C stops the search
  and raises :class:`KeyboardInterrupt`. CBC runs in a
  temporary directory of its own; an interrupt terminates the ``cbc`` child, removes the directory and
  re-raises. Nothing is left behind in the temporary directory.
* **Status.** ``optimal`` (proven), ``feasible`` (a solution, stopped by the time limit; ``bound`` is the
  solver's proven lower bound when it reports one), ``infeasible``, ``none`` (no solution in time).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutSearchError

BACKENDS = ("pulp", "ortools")
KINDS = ("binary", "integer", "continuous")
DEFAULT_THREADS = 8
"""CP-SAT workers: fixed (not the machine's core count) so that every machine gives the same answer."""


@dataclass(frozen=True)
class Var:
    """A variable: bounds, kind, and for continuous ones the CP-SAT unit (None: implied integral)."""

    lb: float
    ub: float
    kind: str
    unit: float | None = None


@dataclass
class Model:
    """A MILP in neutral form, minimizing ``objective`` (variable index -> coefficient)."""

    vars: list[Var] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)
    hint: dict[int, float] = field(default_factory=dict)

    def var(self, lb: float = 0.0, ub: float = 1.0, kind: str = "binary", unit: float | None = None) -> int:
        """Add a variable; returns its index."""
        if kind not in KINDS:
            raise ValueError(f"unknown variable kind {kind!r}")
        self.vars.append(Var(float(lb), float(ub), kind, unit))
        return len(self.vars) - 1

    def add(self, coeffs: Mapping[int, float], lo: float = -math.inf, hi: float = math.inf) -> None:
        """Add the row ``lo <= sum coeffs[i] * var_i <= hi``."""
        self.rows.append((dict(coeffs), lo, hi))


@dataclass(frozen=True)
class Result:
    """A solve's outcome: ``values`` per variable (empty without a solution), the objective and the bound."""

    status: str
    values: list[float]
    objective: float
    bound: float | None


def solve(model: Model, backend: str, *, time_limit: float | None = None, threads: int | None = None,
          cp_scale: float = 1.0, gap: float = 0.0, preprocess: bool = True) -> Result:
    """Solve ``model`` with ``backend`` (``"pulp"``: CBC, ``"ortools"``: CP-SAT); see the module docstring.

    ``time_limit``: seconds, then the best solution so far; ``threads``: workers (default
    :data:`DEFAULT_THREADS` for CP-SAT, 1 for CBC); ``gap``: relative optimality gap at which to stop
    (0: prove optimality); ``preprocess=False`` turns CBC's integer preprocessing off.
    """
    if backend not in BACKENDS:
        raise LayoutSearchError(f"unknown MILP backend {backend!r} (known: {', '.join(BACKENDS)})")
    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise LayoutSearchError(f"the time limit must be a finite number of seconds > 0, got {time_limit!r}")
    if backend == "ortools":
        return _solve_cpsat(model, time_limit, threads or DEFAULT_THREADS, cp_scale, gap)
    return _solve_cbc(model, time_limit, threads or 1, gap, preprocess)


# -- CP-SAT ---------------------------------------------------------------------------------------------------------

def _integral(values: list[float]) -> bool:
    return all(float(c).is_integer() for c in values)


def _solve_cpsat(model: Model, time_limit: float | None, threads: int, scale: float, gap: float) -> Result:
    from ortools.sat.python import cp_model

    cp = cp_model.CpModel()
    units = [1.0 if v.kind != "continuous" or v.unit is None else v.unit for v in model.vars]
    xs = []
    for i, v in enumerate(model.vars):
        if v.kind == "binary" or (v.kind == "continuous" and v.unit is None and (v.lb, v.ub) == (0, 1)):
            xs.append(cp.new_bool_var(f"v{i}"))
            continue
        lo, hi = math.ceil(v.lb / units[i] - 1e-9), math.floor(v.ub / units[i] + 1e-9)
        if not (math.isfinite(v.lb) and math.isfinite(v.ub)) or max(abs(lo), abs(hi)) > 2**61:
            raise LayoutSearchError("a variable's range is too large for CP-SAT's integers; use the CBC backend")
        xs.append(cp.new_int_var(lo, hi, f"v{i}"))
    for coeffs, lo, hi in model.rows:
        terms = {i: c * units[i] for i, c in coeffs.items()}
        factor = 1.0 if _integral(list(terms.values())) else scale
        expr = sum(round(c * factor) * xs[i] for i, c in terms.items() if round(c * factor))
        if not math.isinf(lo):
            cp.add(expr >= math.ceil(lo * factor - 1e-9 * max(1.0, abs(lo * factor))))
        if not math.isinf(hi):
            cp.add(expr <= math.floor(hi * factor + 1e-9 * max(1.0, abs(hi * factor))))
    cp.minimize(sum(round(c * units[i] * scale) * xs[i] for i, c in model.objective.items()))
    for i, val in model.hint.items():
        cp.add_hint(xs[i], round(val / units[i]))
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = threads
    params.interleave_search = threads > 1
    params.random_seed = 0
    params.relative_gap_limit = gap
    if time_limit is not None:
        params.max_time_in_seconds = float(time_limit)
    params.catch_sigint_signal = False  # Ctrl-C is ours: see _interruptible
    status = _interruptible(lambda: solver.solve(cp), solver.stop_search)
    if status == cp_model.INFEASIBLE:
        return Result("infeasible", [], math.inf, None)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Result("none", [], math.inf, None)
    values = [float(solver.value(x)) * u for x, u in zip(xs, units, strict=True)]
    objective = math.fsum(c * values[i] for i, c in model.objective.items())
    optimal = status == cp_model.OPTIMAL and gap == 0.0
    return Result("optimal" if optimal else "feasible", values, objective, solver.best_objective_bound / scale)


def _interruptible(run: Callable[[], Any], stop: Callable[[], None]) -> Any:
    """``run()`` (a native solve that holds the main thread, where Python runs signal handlers only
    between bytecodes) in a worker thread while the main thread waits: on Ctrl-C, ``stop()`` asks the solve
    to end and KeyboardInterrupt is raised within a second, whether it has or not. Off the main thread
    ``run()`` runs directly."""
    if threading.current_thread() is not threading.main_thread():
        return run()
    out: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            out.append(run())
        except BaseException as e:  # handed to the main thread
            errors.append(e)

    worker = threading.Thread(target=work, name="cp-sat", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        stop()  # CP-SAT checks it only now and then (not during parts of its presolve): wait a moment, no more;
        worker.join(1.0)  # a solve still running goes with the process (a daemon thread)
        raise
    if errors:
        raise errors[0]
    return out[0]


# -- CBC ------------------------------------------------------------------------------------------------------------

def _solve_cbc(model: Model, time_limit: float | None, threads: int, gap: float, preprocess: bool) -> Result:
    import pulp

    prob = pulp.LpProblem("milp", pulp.LpMinimize)
    cats = {"binary": pulp.LpBinary, "integer": pulp.LpInteger, "continuous": pulp.LpContinuous}
    xs = [prob.add_variable(f"v{i}", None if math.isinf(v.lb) else v.lb, None if math.isinf(v.ub) else v.ub,
                            cat=cats[v.kind] if (v.kind, v.lb, v.ub) != ("integer", 0, 1) else pulp.LpBinary)
          for i, v in enumerate(model.vars)]
    prob += pulp.lpSum(c * xs[i] for i, c in model.objective.items())
    for coeffs, lo, hi in model.rows:
        expr = pulp.lpSum(c * xs[i] for i, c in coeffs.items())
        if lo == hi:
            prob += expr == lo
            continue
        if not math.isinf(lo):
            prob += expr >= lo
        if not math.isinf(hi):
            prob += expr <= hi
    for i, val in model.hint.items():
        xs[i].setInitialValue(val)
    with warnings.catch_warnings():  # PuLP 3 deprecates its bundled CBC for PuLP 4
        warnings.simplefilter("ignore", DeprecationWarning)
        cbc = pulp.PULP_CBC_CMD(msg=False)
    with tempfile.TemporaryDirectory(prefix="layoutsearch-cbc-") as tmp:
        mps, sol, mst = (str(Path(tmp) / f"model.{ext}") for ext in ("mps", "sol", "mst"))
        vs, var_names, row_names, _ = prob.writeMPS(mps, rename=1)
        args = [cbc.path, mps]
        if model.hint:
            cbc.writesol(mst, prob, vs, var_names, row_names)
            args += ["-mips", mst]
        if time_limit is not None:
            args += ["-sec", repr(float(time_limit))]
        args += ["-ratio", repr(gap), "-allow", "0", "-randomCbcSeed", "1"]
        if threads > 1:  # (CBC's thread pool, even of one thread, can stall in a timed wait: not asked for, none)
            args += ["-threads", str(threads)]
        if not preprocess:
            args += ["-preprocess", "off"]
        args += ["-solve", "-printingOptions", "all", "-solution", sol]
        log = _run(args)
        if not os.path.exists(sol):
            raise LayoutSearchError(f"CBC wrote no solution; its output ends with: {log[-300:]!r}")
        status, values, _, _, _, sol_status = cbc.readsol_MPS(sol, prob, vs, var_names, row_names)
    if sol_status == pulp.LpSolutionInfeasible or status == pulp.LpStatusInfeasible:
        return Result("infeasible", [], math.inf, None)
    if sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return Result("none", [], math.inf, None)
    out = [float(values.get(x.name, 0.0)) for x in xs]
    objective = math.fsum(c * out[i] for i, c in model.objective.items())
    if sol_status == pulp.LpSolutionOptimal and "Stopped on" not in log:
        return Result("optimal", out, objective, objective)
    found = re.search(r"Lower bound:\s*([-+0-9.eE]+)", log)
    return Result("feasible", out, objective, float(found.group(1)) if found else None)


def _run(args: list[str]) -> str:
    """Run ``cbc`` to completion and return its output; an interrupt (or any error) terminates it first."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True) as proc:
        try:
            out, _ = proc.communicate()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    return out
