"""Pipeline-stage partitioning and device placement of a cost DAG: one front door, one module per method.

**Problem** (:mod:`.instance`): put the nodes of a :class:`~layoutsearch.costdag.CostDAG` on devices —
``K`` identical pipeline stages, or the device kinds the DAG names (accelerators with a memory limit,
CPU cores) — honouring co-location groups, eligibility and memory limits, minimizing the throughput
(max load), latency or GPipe objective, over contiguous placements or any.

**Methods.** :mod:`.dp` (exact DP over down-closed sets, contiguous; Tarnawski et al. 2020, Section 4),
:mod:`.ilp` (Tarnawski et al.'s ILP through :mod:`layoutsearch.solvers.milp`, CBC or CP-SAT; contiguous
or not; exact unless a time limit stops it, then with its gap), :mod:`.brute` (tests), and the baselines
of :mod:`.baselines`; :mod:`.bounds` gives lower bounds (relaxations) for the ILPs and the gaps. The
non-contiguous latency is a node-level schedule: :mod:`.schedule` (list scheduling, its bound) and
:mod:`.schedule_ilp` (the scheduling MILP).
:mod:`.reduce` contracts the problem exactly first. Every result is priced again on the original DAG by
:func:`.instance.evaluate`, the one definition of the objectives.

References: J. Tarnawski, A. Phanishayee, N. Devanur, D. Mahajan, F. Nina Paravecino, "Efficient
Algorithms for Device Placement of DNN Graph Operators", NeurIPS 2020. Y. Huang et al., "GPipe:
Efficient Training of Giant Neural Networks using Pipeline Parallelism", NeurIPS 2019.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from layoutsearch.costdag import MAX_DEVICES, CostDAG
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.baselines import (
    against_equal_split,
    equal_split,
    expert_split,
    interval_split,
    one_device,
    read_expert,
)
from layoutsearch.solvers.partition.bounds import objective_bound
from layoutsearch.solvers.partition.brute import BRUTE_MAX_NODES, brute
from layoutsearch.solvers.partition.chain import chain_start
from layoutsearch.solvers.partition.dp import run_dp
from layoutsearch.solvers.partition.ideals import MAX_IDEALS, Ideals, TooManyIdeals, count_ideals
from layoutsearch.solvers.partition.ilp import solve_ilp
from layoutsearch.solvers.partition.instance import (
    OBJECTIVES,
    Instance,
    Partition,
    StageCosts,
    check_objective,
    compile_dag,
    evaluate,
    kinds_of,
    make_partition,
    memory_message,
    stage_loads,
    value,
)
from layoutsearch.solvers.partition.local import LOCAL_TIME_LIMIT, greedy_start, local_search
from layoutsearch.solvers.partition.reduce import expand, reduce
from layoutsearch.solvers.partition.schedule import Problem
from layoutsearch.solvers.partition.schedule import heuristic as schedule_heuristic
from layoutsearch.solvers.partition.schedule import lower_bound as schedule_lower_bound
from layoutsearch.solvers.partition.schedule_ilp import TooLarge, solve_schedule_ilp

SOLVERS = ("auto", "dp", "ilp-pulp", "ilp-ortools", "brute", "local")
AUTO_ILP_TIME_LIMIT = 60.0
"""Seconds given to the ILP when ``solver="auto"`` falls back to it without a ``time_limit``."""
_PROVEN_RTOL = 1e-9
"""A latency start within this relative distance of the lower bound is reported optimal without a solve."""

__all__ = ["AUTO_ILP_TIME_LIMIT", "BRUTE_MAX_NODES", "MAX_IDEALS", "OBJECTIVES", "SOLVERS", "Partition",
           "StageCosts", "against_equal_split", "count_ideals", "equal_split", "expert_split", "one_device",
           "partition", "read_expert", "stage_loads"]


def partition(dag: CostDAG, stages: int | None = None, *, objective: str = "throughput", microbatches: int = 1,
              memory_limit: float | None = None, contiguous: bool = True, solver: str = "auto",
              time_limit: float | None = None, max_ideals: int = MAX_IDEALS, at_most: bool | None = None) -> Partition:
    """Place the nodes of ``dag`` on devices minimizing ``objective`` (``"throughput"``, ``"latency"`` or
    ``"gpipe"``; see :mod:`.instance`).

    Devices: ``stages`` identical stages, or the DAG's device kinds (``stages`` and ``memory_limit`` then
    override the first kind's count and per-device limit). ``at_most``: use at most (True) or exactly (False)
    that many devices; default exactly for a pipeline of stages, at most for a DAG with device kinds.
    ``solver``: ``"dp"`` (exact, contiguous), ``"ilp-pulp"`` / ``"ilp-ortools"`` (exact unless stopped by
    ``time_limit`` seconds; for latency and non-contiguous throughput started from the local search, and
    never worse than that start; a result not proven optimal states its gap against the best lower bound,
    ``info["lower_bound"]``, see :mod:`.bounds`), ``"brute"`` (tests), ``"local"`` (a heuristic: local search
    from the DP's contiguous throughput optimum when the DP is cheap and from greedy intervals, the better;
    throughput and latency; see :mod:`.local`), ``"auto"`` (the DP for contiguous throughput or GPipe
    placements unless the reduced DAG has more than ``max_ideals`` down-closed sets, else OR-tools for at
    most :data:`AUTO_ILP_TIME_LIMIT` seconds unless ``time_limit`` says otherwise; the ILPs start from the
    DP's optimum when there is one). Raises :class:`PartitionError` when nothing fits.

    Non-contiguous latency (``objective="latency", contiguous=False``) is the makespan of a node-level schedule
    (see :mod:`.instance`): ``local`` is the list scheduler of :mod:`.schedule`, the ILPs the scheduling MILP
    of :mod:`.schedule_ilp` started from it (``auto``: OR-tools, 60 s unless ``time_limit`` says otherwise);
    the result's stages list each device's nodes in the order it runs them, ``info["start_times"]`` their starts.
    """
    _check_arguments(objective, microbatches, solver, stages, memory_limit, time_limit)
    limit = None if memory_limit is None else int(memory_limit)
    at_most = bool(dag.devices) if at_most is None else at_most
    if stages is not None and stages > len(dag.nodes):  # more stages than nodes: some would be empty
        if not at_most:
            raise PartitionError(f"cannot split {len(dag.nodes)} nodes of cost DAG {dag.name!r} into {stages:,} "
                                 "non-empty stages")
        stages = len(dag.nodes)  # at most K: no placement uses more devices than there are nodes
    kinds = kinds_of(dag, stages, limit)
    if sum(k.count for k in kinds) < 1:
        raise PartitionError(f"cost DAG {dag.name!r}: there are no devices to place it on")
    one_kind = len(kinds) == 1 and not kinds[0].host
    _check_method(dag, objective, contiguous, solver, one_kind)
    if objective == "gpipe" and at_most and kinds[0].count > 1:
        return _gpipe_at_most(dag, kinds[0].count, microbatches, limit, solver, time_limit, max_ideals)
    full = compile_dag(dag, kinds)
    if not at_most and kinds[0].count > full.n:
        raise PartitionError(f"cannot split {full.n} nodes of cost DAG {dag.name!r} into {kinds[0].count} "
                             "non-empty stages")
    if one_kind and limit is not None:
        memw = full.memw(microbatches)
        v = max(range(full.n), key=memw.__getitem__)
        if memw[v] > limit:
            raise PartitionError(memory_message(dag, kinds[0].count, microbatches, limit, memw[v], exact=False,
                                                culprit=full.names[v]))
    inst = reduce(full, contiguous=contiguous, at_most=at_most, microbatches=microbatches)
    if not at_most and kinds[0].count > inst.n:
        raise PartitionError(f"cannot split cost DAG {dag.name!r} into {kinds[0].count} non-empty stages: its "
                             f"co-location groups leave {inst.n} units")
    if objective == "latency" and not contiguous:
        return _schedule(full, at_most, solver, time_limit, max_ideals)
    info: dict[str, Any] = {"units": inst.n} if inst.n != full.n else {}
    method, sigma_r, optimal, gap = _solve(full, inst, objective, microbatches, contiguous, at_most, solver,
                                           time_limit, max_ideals, info)
    sigma = expand(full, inst, sigma_r)
    part = make_partition(full, sigma, objective, microbatches, method, optimal, gap, info)
    if gap is None:  # an ILP stopped early: its gap against the best proven bound
        bounds = [b for b in (info.pop("bound", None), info.get("lower_bound"),
                              objective_bound(inst, objective, microbatches) if "lower_bound" not in info else None)
                  if b is not None]
        info["lower_bound"] = max(bounds)
        factor = microbatches + part.num_stages - 1 if objective == "gpipe" else 1
        gap = max(0.0, (part.objective - max(bounds) * factor) / part.objective) if part.objective > 0 else 0.0
        part = make_partition(full, sigma, objective, microbatches, method, optimal, gap, info)
    return part



def _check_arguments(objective: str, microbatches: int, solver: str, stages: int | None,
                     memory_limit: float | None, time_limit: float | None) -> None:
    """PartitionError for an argument of :func:`partition` out of its range."""
    check_objective(objective, microbatches)
    if solver not in SOLVERS:
        raise PartitionError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if stages is not None and (not isinstance(stages, int) or isinstance(stages, bool)
                               or not 1 <= stages <= MAX_DEVICES):
        raise PartitionError(f"the number of stages (devices) must be an integer from 1 to {MAX_DEVICES}, "
                             f"got {stages!r}")
    if memory_limit is not None and not memory_limit >= 0:
        raise PartitionError(f"memory_limit must be a number of bytes >= 0, got {memory_limit!r}")
    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise PartitionError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")


def _check_method(dag: CostDAG, objective: str, contiguous: bool, solver: str, one_kind: bool) -> None:
    """PartitionError when ``objective`` does not apply to ``dag`` or ``solver`` does not cover it."""
    if objective == "gpipe" and not (one_kind and not any(n.backward for n in dag.nodes)):
        raise PartitionError("the gpipe objective prices one kind of identical stages; this DAG names several "
                             "device kinds or backward nodes")
    if objective == "latency" and any(n.backward for n in dag.nodes):
        raise PartitionError("the latency objective prices one sample's forward pass (inference graphs); this DAG "
                             "has backward nodes")
    if not contiguous and objective == "gpipe":
        raise PartitionError("the gpipe objective needs contiguous stages (a micro-batch visits the stages in "
                             "order); allow contiguous placements only, or use the throughput or latency objective")
    if solver == "local" and objective == "gpipe":
        raise PartitionError("the local search covers the throughput and latency objectives; use 'dp' for gpipe")
    if solver == "dp" and (not contiguous or objective == "latency"):
        raise PartitionError("the DP covers contiguous throughput and gpipe placements; use solver 'ilp-ortools' "
                             "or 'ilp-pulp'")


def _schedule(full: Instance, at_most: bool, solver: str, time_limit: float | None, max_ideals: int) -> Partition:
    """Non-contiguous latency, a node-level schedule (:mod:`.schedule`): the list scheduler started also from the
    contiguous latency heuristic's placement (a third of the time limit, at most 10 s), then unless ``local``
    the scheduling ILP (:mod:`.schedule_ilp`) capped by and started from it; the better is returned, with each
    device's order."""
    if solver == "brute":
        raise PartitionError("the brute force covers contiguous latency placements; use 'ilp-ortools', 'ilp-pulp' "
                             "or 'local' for a non-contiguous latency")
    info: dict[str, Any] = {}
    if solver == "auto":
        solver = "ilp-ortools"
        if time_limit is None:
            time_limit = info["time_limit"] = AUTO_ILP_TIME_LIMIT
    started = time.monotonic()
    budget = LOCAL_TIME_LIMIT if time_limit is None else min(LOCAL_TIME_LIMIT, time_limit / 3)
    starts = [s for s in [_contiguous_latency(full, at_most, max_ideals, budget / 2)] if s is not None]
    best = schedule_heuristic(full, at_most, starts, budget / 2)
    lower = info["lower_bound"] = schedule_lower_bound(full, at_most)
    method, optimal, bound = "list scheduling", False, lower
    if best is not None:
        info["heuristic"] = best.value
        optimal = best.value <= lower * (1 + _PROVEN_RTOL)
        info |= {"proven_by": "the lower bound"} if optimal else {}
    if not optimal and solver != "local":
        if best is None and time_limit is None:  # no start: CP-SAT may idle to its limit after the optimum
            time_limit = info["time_limit"] = AUTO_ILP_TIME_LIMIT
        left = None if time_limit is None else max(1.0, time_limit - (time.monotonic() - started))
        try:
            sol, got = solve_schedule_ilp(Problem(full, at_most), solver, left, lower, best, info)
        except TooLarge:
            sol, got = None, None
            info["ilp"] = "not built: too many pairs of units that may share a device"
        if sol is not None and sol.status == "infeasible" and best is None:
            raise PartitionError(f"no placement of cost DAG {full.dag.name!r} fits the devices' memory")
        if got is not None and (best is None or got.value < best.value):
            best, method = got, solver
        elif best is not None:
            method, info["kept_warm_start"] = solver, True
        optimal = sol is not None and sol.status == "optimal"
        if sol is not None and sol.bound is not None and math.isfinite(sol.bound):
            bound = max(bound, sol.bound)
    if best is None:
        raise PartitionError("no schedule found: the list scheduler placed no node sequence within the devices' "
                             "memory" + ("" if solver == "local" else " and the ILP found none in time"))
    gap = 0.0 if optimal else max(0.0, (best.value - bound) / best.value) if best.value > 0 else 0.0
    info["lower_bound"] = best.value if optimal and bound > best.value else bound
    return make_partition(full, list(best.sigma), "latency", 1, method, optimal, gap, info, order=best.order)


def _contiguous_latency(full: Instance, at_most: bool, max_ideals: int, budget: float) -> list[int] | None:
    """The contiguous latency heuristic's placement of ``full``'s nodes (None when it has none)."""
    try:
        inst = reduce(full, contiguous=True, at_most=at_most, microbatches=1)
    except PartitionError:
        return None
    sub: dict[str, Any] = {}
    hint = _warm_start(full, inst, True, "latency", 1, at_most, max_ideals, sub)
    sigma = _heuristic(inst, hint, "latency", 1, True, budget, sub)
    return None if sigma is None else expand(full, inst, sigma)


def _gpipe_at_most(dag: CostDAG, k: int, mb: int, limit: int | None, solver: str, time_limit: float | None,
                   max_ideals: int) -> Partition:
    """GPipe over at most ``k`` stages: the step time ``(M + K - 1) max_k t_k`` depends on the number of
    stages used, so each ``K`` is solved exactly and the best kept (the fewest stages on ties)."""
    best: Partition | None = None
    error: PartitionError | None = None
    proven = True
    for stages in range(1, min(k, len(dag.nodes)) + 1):
        try:
            got = partition(dag, stages, objective="gpipe", microbatches=mb, memory_limit=limit, solver=solver,
                            time_limit=time_limit, max_ideals=max_ideals, at_most=False)
        except PartitionError as e:
            error = e
            continue
        proven &= got.optimal
        if best is None or got.objective < best.objective:
            best = got
    if best is None:
        assert error is not None
        raise error
    return best if proven or not best.optimal else replace(best, optimal=False, gap=None)


def _solve(full: Instance, inst: Instance, objective: str, mb: int, contiguous: bool, at_most: bool, solver: str,
           time_limit: float | None, max_ideals: int, info: dict[str, Any]
           ) -> tuple[str, list[int], bool, float | None]:
    """(method, unit of ``inst`` -> device, optimal, gap; None when to be computed from ``info["bound"]``);
    ``full`` is the problem before its reductions."""
    exact_k = not at_most
    dp_ok = contiguous and objective != "latency"
    ideals = None
    if solver == "auto":
        solver = "dp" if dp_ok else "ilp-ortools"
        if dp_ok:
            try:
                ideals = Ideals(inst, max_ideals)
            except TooManyIdeals:
                solver, info["fallback"] = "ilp-ortools", f"more than {max_ideals} down-closed sets: used the ILP"
                if time_limit is None:
                    time_limit = info["time_limit"] = AUTO_ILP_TIME_LIMIT
    if solver == "dp":
        return "dp", run_dp(inst, ideals, objective, mb, at_most, max_ideals, info), True, 0.0
    if solver == "brute":
        sigma, min_mem = brute(inst, objective, mb, contiguous, exact_k)
        if not sigma:
            kind = inst.kinds[0]
            if len(inst.kinds) == 1 and kind.limit is not None:
                raise PartitionError(memory_message(inst.dag, kind.count, mb, kind.limit, min_mem, exact=True))
            raise PartitionError(f"no placement of cost DAG {inst.dag.name!r} fits the devices' memory")
        return "brute force", sigma, True, 0.0
    hint = _warm_start(full, inst, contiguous, objective, mb, at_most, max_ideals, info)
    if solver == "local":
        sigma = _heuristic(inst, hint, objective, mb, contiguous, time_limit or LOCAL_TIME_LIMIT, info)
        if sigma is None:
            raise PartitionError("the local search found no placement to start from (the DP is too costly here and "
                                 "the first device kind cannot hold the DAG in order); use 'ilp-ortools'")
        return "local search", sigma, False, None
    if objective == "latency" or (not contiguous and objective == "throughput"):
        # improve the start with the local search (its time taken from the ILP's), so that the exact method
        # is never worse than the heuristic
        started = time.monotonic()
        budget = LOCAL_TIME_LIMIT if time_limit is None else min(LOCAL_TIME_LIMIT, time_limit / 2)
        better = _heuristic(inst, hint, objective, mb, contiguous, budget, info)
        hint = next((h for h in (better, hint) if h is not None and (at_most or len(set(h)) == inst.num_devices)),
                    None)  # exactly k devices: a start that leaves one empty is no start
        if time_limit is not None:
            time_limit = max(1.0, time_limit - (time.monotonic() - started))
    lower = None
    if objective == "latency" and hint is not None:
        # a start that meets the lower bound (a valid one, see .bounds) is optimal: nothing left to solve
        lower = info["lower_bound"] = objective_bound(inst, objective, mb)
        if _value(inst, hint, objective, mb) <= lower * (1 + _PROVEN_RTOL):
            info["proven_by"] = "the lower bound"
            return solver, list(hint), True, 0.0
    sol, sigma = solve_ilp(inst, objective, mb, contiguous, exact_k, solver, time_limit, info, hint, lower=lower)
    if sigma and _over_memory(inst, sigma, objective, mb):
        # The solver's feasibility tolerance (about 1e-6, relative) let a device exceed its limit by a hair:
        # solve again with the limits tightened by more than that tolerance.
        margin = max(1, math.ceil(max(k.limit or 0 for k in inst.kinds) * 2e-6))
        info["memory_limit_tightened_by"] = margin
        sol, sigma = solve_ilp(inst, objective, mb, contiguous, exact_k, solver, time_limit, info, hint, margin,
                               lower=lower)
    if not sigma and hint is not None:  # nothing in time (or refused by the conservative memory rounding)
        info["kept_warm_start"] = True
        return solver, list(hint), False, None
    if sol.status == "infeasible":
        raise PartitionError(_infeasible_message(inst, mb, contiguous, max_ideals))
    if sol.status == "none":
        raise PartitionError(f"{solver} found no partition within the time limit of {time_limit} s; give it "
                             "more time")
    if hint is not None and _value(inst, hint, objective, mb) < _value(inst, sigma, objective, mb):
        sigma, info["kept_warm_start"] = list(hint), True  # stopped before it beat its start (or rounding)
    if sol.status == "optimal":
        return solver, sigma, True, 0.0
    if sol.bound is not None:
        info["bound"] = sol.bound
    return solver, sigma, False, None


def _heuristic(inst: Instance, hint: list[int] | None, objective: str, mb: int, contiguous: bool, limit: float,
               info: dict[str, Any]) -> list[int] | None:
    """The local search from the DP's start (``hint``) and from greedy intervals (for latency also from devices
    filled in order, the PipeDream-style split and the best interval chain of :mod:`.chain`, found within a
    third of the time), the best of them (the time ``limit`` shared); None when there is no start."""
    starts = [(info.get("warm_start", "dp"), hint)] if hint is not None else []
    for name, balance in (("greedy intervals", True), ("devices filled in order", False)):
        greedy = greedy_start(inst, mb, balance)
        if greedy is not None and all(greedy != s for _, s in starts) and (balance or objective == "latency"):
            starts.append((name, greedy))
    deadline = time.monotonic() + limit
    if objective == "latency":
        split = interval_split(inst, mb)
        if split is not None and all(split != s for _, s in starts):
            starts.append(("the PipeDream-style split", split))
        chain = chain_start(inst, mb, limit / 3)
        if chain is not None and all(chain != s for _, s in starts):
            starts.insert(0, ("the best interval chain", chain))
    best: tuple[float, list[int], str] | None = None
    for i, (name, start) in enumerate(starts):
        left = max(0.05, (deadline - time.monotonic()) / (len(starts) - i))
        sigma = local_search(inst, start, objective, mb, contiguous, left)
        got = _value(inst, sigma, objective, mb)
        if best is None or got < best[0]:
            best = (got, sigma, name)
    if best is None:
        return None
    info["start"] = f"local search from {best[2]}"
    return best[1]


def _warm_start(full: Instance, inst: Instance, contiguous: bool, objective: str, mb: int, at_most: bool,
                max_ideals: int, info: dict[str, Any]) -> list[int] | None:
    """The DP's contiguous throughput optimum as an ILP start (unit of ``inst`` -> device), when the DP is
    cheap enough (1/4 of the cap; 1/20 for latency); a non-contiguous problem starts from its contiguous optimum."""
    if objective == "gpipe":
        return None
    try:
        base = inst if contiguous else reduce(full, contiguous=True, at_most=at_most, microbatches=mb)
        # (a latency problem may name many devices, which the DP pays for per down-closed set: a smaller cap)
        ideals = Ideals(base, max(1, max_ideals // (20 if objective == "latency" else 4)))
        sigma = run_dp(base, ideals, "throughput", mb, at_most, max_ideals, {})
    except (TooManyIdeals, PartitionError):
        return None
    if base is not inst:
        device = {x: sigma[u] for u, members in enumerate(base.members) for x in members}
        sigma = [device[members[0]] for members in inst.members]
    info["warm_start"] = "dp"
    return sigma


def _value(inst: Instance, sigma: list[int], objective: str, mb: int) -> float:
    loads, _ = evaluate(inst, sigma, objective, mb)
    return value(inst, sigma, loads, objective, mb)


def _over_memory(inst: Instance, sigma: list[int], objective: str, mb: int) -> bool:
    _, mem = evaluate(inst, sigma, objective, mb)
    return any(inst.kinds[inst.device_kind[d]].limit is not None and m > inst.kinds[inst.device_kind[d]].limit
               for d, m in enumerate(mem))


def _infeasible_message(inst: Instance, mb: int, contiguous: bool, max_ideals: int) -> str:
    kind = inst.kinds[0]
    if len(inst.kinds) != 1 or kind.limit is None:
        return f"no placement of cost DAG {inst.dag.name!r} fits the devices' memory"
    if contiguous:
        from layoutsearch.solvers.partition.dp import DP

        try:
            mem = DP(inst, Ideals(inst, max_ideals), "memory", mb, False).solve(0.0)
            assert mem is not None
            return memory_message(inst.dag, kind.count, mb, kind.limit, int(mem[0]), exact=True)
        except TooManyIdeals:
            pass
    memw = inst.memw(mb)
    return memory_message(inst.dag, kind.count, mb, kind.limit, max(max(memw), -(-sum(memw) // kind.count)),
                          exact=False)
