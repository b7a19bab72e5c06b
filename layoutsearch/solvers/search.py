"""Search: the optimal plan of a training step on a mesh, proven, with its decisions and baselines.

Problem: given a model, a mesh, hardware and a per-device memory limit (by
default the device's usable memory), find the plan minimizing the predicted
step time of the cost model (:func:`~layoutsearch.costmodel.estimate`,
overlap included in the rules space) whose peak memory per device fits the
limit: a layout of one of the spaces of :mod:`.space`, a remat policy, and
optionally gradient accumulation or a pipeline (:func:`search`).

Method. The rules space is solved first, exactly, per remat policy, by
bound-and-evaluate: the candidates whose live-set memory bound exceeds the
limit are dropped; a lower bound of every other one (the einsums' roofline
compute alone, which the step can only exceed) orders them; they are priced
in that order, in batches, until the ``top``-th best plan that fits costs
less than the bound of every candidate left (Land & Doig 1960's branch and
bound with one level). The priced candidates form a one-node problem, which
the chosen solver solves (enumeration, ILP or DP: the same answer); its
serial optimum is then refined under overlap (:func:`overlapped_top`). The
``layers`` and ``ops`` spaces then start from the rules optimum: it is a
plan of theirs (their candidates include its projections), so its cost is an
upper bound and :func:`~.problem.prune` drops every strategy whose lower
bound exceeds it before the solver runs. Their plans are priced again by the
cost model's op rules (:func:`~.pricer.evaluate`), without overlap; the
better of the two is returned, so a plan is never worse than the rules
optimum, nor than any baseline (every baseline is a rule set of the space).
Gradient accumulation over ``M`` micro-batches is searched the same way on
one micro-batch's rules space, with the accumulated step as the objective
(:func:`~.rules_search.accumulated_top`: ``M`` times the micro-batch's
bounds bound it), and only for plans that can enter the ``top`` found so far.

Baselines: data parallelism (batch over every axis), FSDP (data parallelism
with parameters, gradients and optimizer state split over the same axes),
Megatron-style tensor parallelism (the heads / feed-forward / vocabulary dims
over the minor axis, batch over the others; Shoeybi et al. 2019) and the
Mesh-TensorFlow 2-D layout (batch over the major axis, the model dims over
the others; Shazeer et al. 2018).
"""


from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.costmodel.pipeline import unit_of_ops
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.remat import REMAT_POLICIES, block_groups, forward_blocks, parse_remat, recomputes_within
from layoutsearch.layout import Layout, format_rules
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware
from layoutsearch.solvers.accumulation import accumulated, micro_may_fit, micro_searches, microbatch_options
from layoutsearch.solvers.baselines import baseline_rules, baseline_sets
from layoutsearch.solvers.clock import Deadline, Progress, reporting
from layoutsearch.solvers.dispatch import SOLVERS, solve
from layoutsearch.solvers.finer import solve_finer
from layoutsearch.solvers.plan import Baseline, Costed, Decision, Plan
from layoutsearch.solvers.pricer import Pricer
from layoutsearch.solvers.rules_search import (
    CANDIDATE_FILTER,
    RulesSearch,
    costed_rules,
    first_fitting,
    overlapped_top,
    rules_candidates,
)
from layoutsearch.solvers.rulesets import RuleSets, rules_of
from layoutsearch.solvers.space import SPACES
from layoutsearch.units import format_bytes, parse_bytes


class InfeasibleError(LayoutSearchError):
    """No layout of the space fits the memory limit; ``min_memory`` is the smallest peak any layout needs;
    ``options``: arguments of :func:`search`, not tried, that could make a plan fit (e.g. ``{"pipeline":
    "auto"}``)."""

    def __init__(self, message: str, min_memory: float | None, options: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.min_memory = min_memory
        self.options = dict(options or {})


def memory_limit_bytes(memory_limit: float | str | None, hw: Hardware) -> float | None:
    """The per-device limit a search enforces: ``"auto"`` -> the device's usable memory
    (:attr:`~layoutsearch.mesh.Hardware.usable_bytes`: HBM less the runtime's reserve); None or ``"none"`` ->
    no limit; else bytes (a number, or a string like ``16GiB``)."""
    if memory_limit is None or (isinstance(memory_limit, str) and memory_limit.strip().lower() == "none"):
        return None
    if isinstance(memory_limit, str) and memory_limit.strip().lower() == "auto":
        return float(hw.usable_bytes)
    limit = float(parse_bytes(memory_limit))
    if limit <= 0:
        raise LayoutSearchError(f"memory limit must be positive, got {memory_limit!r}")
    return limit



def _pipelined(graph: Graph, mesh: Mesh, hw: Hardware, limit: float | None, pipeline: str | int,
               microbatches: int | str, schedule: str, optimizer: str, precision: Precision | str, attention: str,
               overlap: float | str, upper: float | None, deadline: Deadline, progress: Progress | None
               ) -> tuple[list[Costed], str]:
    """The best pipelined plan (:func:`~.pipeline_search.search_pipeline`; for ``pipeline="auto"`` only
    those that can beat ``upper``) as a Costed, or the reason none fits or applies."""
    from layoutsearch.solvers.pipeline_search import search_pipeline

    try:
        pp = search_pipeline(graph, mesh, limit, hardware=hw, stages=None if pipeline == "auto" else int(pipeline),
                             microbatches=None if microbatches == "auto" else int(microbatches),
                             optimizer=optimizer, precision=precision, schedule=schedule, attention=attention,
                             overlap=overlap, upper=upper if pipeline == "auto" else None, progress=progress,
                             deadline=deadline)
    except LayoutSearchError as e:
        return [], str(e)
    return [Costed.from_microbatched("pipelined", Layout.from_rules(mesh, pp.report.inner_layout), pp.report,
                                     limit, hw.usable_bytes)], ""


@dataclass
class _Found:
    """What the phases of a search found: the plans (fitting or not), the best per decision, the proof over
    unpipelined plans, the rules searches (one per remat policy) and what the time limit cut
    short, in words."""

    options: list[Costed] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    optimal: bool = True
    gap: float | None = 0.0
    solver: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    searches: list[RulesSearch] = field(default_factory=list)
    cut_short: list[str] = field(default_factory=list)
    gap_unknown: bool = False
    pruning: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per rules search (remat policy, micro-batches): how its space was pruned (:meth:`RulesSearch.pruning`)."""

    def add(self, plans: list[Costed], proven: bool, gap: float | None) -> None:
        """Plans of one remat policy, with their proof (none when nothing fits, or none can beat the plans
        found before: proven, or cut short by the time limit)."""
        self.options += plans
        if plans or not proven:
            self.optimal = self.optimal and proven
            self.gap_unknown = self.gap_unknown or (not proven and gap is None)
            self.gap = (self.gap or 0.0) if proven else max(gap or 0.0, self.gap or 0.0)

    def proof(self, chosen: Costed) -> tuple[bool, float | None]:
        """(optimal, gap) of ``chosen``: the proof over the unpipelined plans searched (layouts x remat policies
        x the micro-batch counts tried); none for a plan found by the heuristics of
        :func:`~.pipeline_search.search_pipeline`."""
        if chosen.pipelined:
            return False, None
        return self.optimal, None if self.gap_unknown else self.gap

    def upper(self, limit: float | None, top: int) -> float | None:
        """The ``top``-th fastest fitting step found so far (None while fewer fit): a plan of a later phase
        must beat it to make the top."""
        steps = sorted(p.step_s for p in self.options if p.within(limit))
        return steps[top - 1] if len(steps) >= top else None

    def skipped(self, what: str) -> None:
        """A phase not run because the time limit ran out: the result is not proven."""
        self.cut_short.append(f"{what}: not searched, the time limit ran out first")
        self.optimal, self.gap_unknown = False, True


def _check_arguments(graph: Graph, space: str, solver: str, top: int, remat: str, microbatches: int | str,
                     pipeline: str | int, time_limit: float | None) -> None:
    """LayoutSearchError for an argument of :func:`search` out of its range."""
    if space not in SPACES:
        raise LayoutSearchError(f"unknown search space {space!r} (known: {', '.join(SPACES)})")
    if solver not in SOLVERS:
        raise LayoutSearchError(f"unknown solver {solver!r} (known: {', '.join(SOLVERS)})")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise LayoutSearchError(f"top must be a positive integer, got {top!r}")
    if remat not in ("auto", "maxtext") and parse_remat(remat).blocks is not None and space != "rules":
        raise LayoutSearchError(f"remat {remat} (the first blocks only) is searched in the rules space, not "
                                f"{space!r}: its blocks would differ, where this space ties them")
    if microbatches != "auto" and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                   or microbatches < 1):
        raise LayoutSearchError(f"microbatches must be 'auto' or a positive integer, got {microbatches!r}")
    if pipeline not in ("off", "auto") and (isinstance(pipeline, bool) or not isinstance(pipeline, int)
                                            or pipeline < 2):
        raise LayoutSearchError(f"pipeline must be 'off', 'auto' or a number of stages >= 2, got {pipeline!r}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, int | float)
                                   or not math.isfinite(time_limit) or time_limit <= 0):
        raise LayoutSearchError(f"time limit must be a positive number of seconds, got {time_limit!r}")
    if isinstance(microbatches, int) and microbatches > 1 and graph.dims.get("batch", 1) % microbatches:
        raise LayoutSearchError(f"{microbatches} micro-batches do not divide batch={graph.dims.get('batch', 1)}")


def search(graph: Graph, mesh: Mesh | str, memory_limit: float | str | None = "auto", solver: str = "auto", *,
           hardware: Hardware | str = "cpu-sim", space: str = "rules", optimizer: str = "adam",
           precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto", overlap: float | str = "auto",
           remat: str = "auto", microbatches: int | str = "auto", pipeline: str | int = "off",
           schedule: str | None = None, top: int = 3, time_limit: float | None = None, tie: bool = True,
           baselines: bool = True, progress: Progress | None = None, target: str | None = None) -> Plan:
    """The plan of ``graph``'s training step on ``mesh`` minimizing the predicted step time under
    ``memory_limit`` per device, searched jointly over what practitioners decide:

    * the layout, in ``space`` (``rules``, ``layers`` or ``ops``, see :mod:`.space`), by ``solver``
      (:data:`SOLVERS`);
    * ``remat``: ``auto`` (each of ``none``, ``selective``, ``full``; ``none`` alone in the ops space and
      for a graph without blocks, where there is nothing to recompute) or one policy;
    * ``microbatches``: gradient accumulation, ``auto`` (tried when the memory limit binds: powers of two
      dividing the batch) or a number;
    * ``pipeline``: ``off``, ``auto`` (a pipeline over any mesh axis, chosen when faster) or ``K`` (stages
      over an axis of size K, forced), with ``schedule`` (``gpipe``, ``1f1b``, ``interleaved:V``).

    ``memory_limit``: ``"auto"`` (default: the device's usable memory, HBM less the runtime's reserve), None
    or ``"none"`` (no limit), bytes or a string like ``16GiB``. ``precision`` and ``attention`` are held
    fixed (``mixed``/``bf16``/``fp32``; ``auto``/``standard``/``flash``); ``overlap`` is the cost model's
    (``auto`` or a number in [0, 1]). Plans of the rules space are priced by the full cost model
    (overlap included) and proven optimal under it; the layers and ops spaces price a step without overlap.

    ``time_limit`` (seconds, > 0) covers the whole search: building the spaces and the solvers' models,
    solving, runner-ups, accumulation and pipelines. Once it has passed, the search stops at the next
    checkpoint that has a plan (it does not stop before it has one), returns the best plan found, labelled
    not proven, and says what was cut short in :attr:`Plan.cut_short` (phases not searched, runner-ups not
    found). The baselines are priced within it too: the phases before stop early enough to leave each of them
    as long as the slowest plan priced so far; one it still cannot fit is left unpriced (said in ``cut_short``).

    Returns a :class:`Plan`: the chosen plan, ``top - 1`` runner-ups, the baselines (priced unless
    ``baselines`` is False), and ``decisions``
    (the best plan per remat policy, micro-batch count and pipeline choice). ``optimal`` is the proof over
    unpipelined plans searched (layouts x remat policies x the micro-batch counts tried: 1, and with
    ``microbatches="auto"`` the first count whose micro-batch fits and the next); a chosen pipelined plan is
    labelled not proven (its stage layouts come from the best layouts of one stage). Raises
    :class:`InfeasibleError` naming the smallest peak memory and what would help when nothing fits,
    LayoutSearchError for a bad argument.
    """
    if target is None:
        with _fewer_collections():
            return _search(graph, mesh, memory_limit, solver, hardware, space, optimizer, precision, attention,
                           overlap, remat, microbatches, pipeline, schedule or "1f1b", top, time_limit, tie,
                           baselines, progress)
    from layoutsearch.export.maxtext import maxtext_stage_axes
    from layoutsearch.solvers.pipeline_search import STAGE_AXES

    keep, remat, schedule = _target(target, graph, Mesh.of(mesh), space, remat, pipeline, schedule)
    token, stage_token = CANDIDATE_FILTER.set(keep), STAGE_AXES.set(maxtext_stage_axes(Mesh.of(mesh).names))
    try:
        with _fewer_collections():
            return _search(graph, mesh, memory_limit, solver, hardware, space, optimizer, precision, attention,
                           overlap, remat, microbatches, pipeline, schedule, top, time_limit, tie, baselines, progress)
    finally:
        CANDIDATE_FILTER.reset(token)
        STAGE_AXES.reset(stage_token)


TARGETS = ("maxtext",)
"""The frameworks a search can be restricted to (``target``): what they can run and their config express."""


def _target(target: str, graph: Graph, mesh: Mesh, space: str, remat: str, pipeline: str | int,
            schedule: str | None):
    """The candidate filter, the remat policies and the pipeline schedule of a search for ``target``
    (:data:`TARGETS`): MaxText runs the rules space (its logical axis rules), the policies none/selective/full
    (no per-layer policy) and its own pipeline (schedule ``maxtext``: equal stages, the embeddings and the head
    outside them)."""
    from layoutsearch.export.maxtext import maxtext_expressible

    if target not in TARGETS:
        raise LayoutSearchError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    if space != "rules":
        raise LayoutSearchError(f"--target maxtext searches the rules space (MaxText's logical axis rules), not {space}")
    if schedule not in (None, "maxtext"):
        raise LayoutSearchError(f"MaxText runs its own pipeline (schedule maxtext), not {schedule}")
    if remat == "auto":
        remat = "maxtext"
    elif parse_remat(remat, LayoutSearchError).blocks is not None:
        raise LayoutSearchError(f"MaxText has no remat policy for the first blocks only ({remat}): one policy for "
                                "every layer (none, selective, full)")
    return maxtext_expressible(graph, mesh), remat, "maxtext"


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Python's cyclic garbage collector is off while a search runs: a search makes millions of small objects
    (op costs, reports) that live until it returns or are freed by reference counting, and each collection
    walks them all (about a tenth of a large search's time even with thresholds raised 100-fold; the few
    cycles made meanwhile are collected after it). A collector that was off stays off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _search(graph: Graph, mesh: Mesh | str, memory_limit: float | str | None, solver: str, hardware: Hardware | str,
            space: str, optimizer: str, precision: Precision | str, attention: str, overlap: float | str, remat: str,
            microbatches: int | str, pipeline: str | int, schedule: str, top: int, time_limit: float | None,
            tie: bool, baselines: bool, progress: Progress | None) -> Plan:
    t0 = time.perf_counter()
    _check_arguments(graph, space, solver, top, remat, microbatches, pipeline, time_limit)
    deadline = Deadline.after(time_limit)
    mesh = Mesh.of(mesh)
    hw = _hardware(hardware)
    limit = memory_limit_bytes(memory_limit, hw)
    g = training_step(graph, optimizer, precision)
    policies = _remat_policies(g, space, remat)
    pricer = Pricer(g, mesh, hw, attention)
    base = baseline_rules(g, mesh)
    if baselines:  # priced last, within the time limit: the phases before leave them time
        deadline.tail = sum(rules is not None for rules, _ in base.values())
    found = _Found()
    if pipeline in ("off", "auto"):
        with reporting(progress, "rules space: enumerating rule sets"):
            candidates = rules_candidates(g, mesh, hw, pricer, baseline_sets(base))
        alike = _alike(policies)
        for policy in alike:
            _search_remat(found, RulesSearch(g, mesh, hw, pricer, candidates, policy), limit, space, solver, top,
                          tie, deadline, optimizer, attention, overlap, progress)
        _search_accumulation(found, graph, g, mesh, hw, limit, alike, microbatches, top, deadline, optimizer,
                             precision, attention, overlap, progress)
        for policy in policies:  # the block groups, bounded by the plans found (with accumulation too)
            if policy not in alike:
                _search_remat(found, RulesSearch(g, mesh, hw, pricer, candidates, policy), limit, space, solver,
                              top, tie, deadline, optimizer, attention, overlap, progress)
    return _result(found, graph, g, mesh, hw, limit, space, top, pipeline, microbatches, schedule, optimizer,
                   precision, attention, overlap, policies, base, baselines, deadline, progress, t0)


def _result(found: _Found, graph: Graph, g: Graph, mesh: Mesh, hw: Hardware, limit: float | None, space: str,
            top: int, pipeline: str | int, microbatches: int | str, schedule: str, optimizer: str,
            precision: Precision | str, attention: str, overlap: float | str, policies: tuple[str, ...],
            base: dict[str, tuple[RuleSets | None, str]], baselines: bool, deadline: Deadline,
            progress: Progress | None, t0: float) -> Plan:
    """The search's last phases: pipelines (when asked), then the plan: the ``top`` fastest that fit, the
    proof, the baselines and the decisions; InfeasibleError when nothing fits."""
    why_not_piped = ""
    if pipeline != "off":
        if found.options and deadline.passed():
            found.skipped("pipelines")
        else:
            why_not_piped = _search_pipelines(found, graph, mesh, hw, limit, pipeline, microbatches, schedule,
                                              optimizer, precision, attention, overlap, deadline, progress)
    ranked = sorted((p for p in found.options if p.within(limit)), key=lambda c: c.step_s)[:top]
    if not ranked:
        with reporting(progress, "nothing fits: finding the smallest peak memory"):
            error = _infeasible(g, mesh, limit, found.searches, why_not_piped, microbatches, pipeline)
        raise error
    chosen, *others = (dataclasses.replace(p, name="chosen" if i == 0 else f"#{i + 1}") for i, p in enumerate(ranked))
    runner_ups = tuple(others)
    optimal, gap = found.proof(chosen)
    priced_baselines = _price_baselines(base, g, mesh, hw, policies, found, limit, optimizer, attention,
                                        overlap, deadline.final(), progress) if baselines else ()
    decisions = tuple(dataclasses.replace(d, chosen=_same_choice(d, chosen)) for d in found.decisions)
    stats = {**found.stats, "pruning": found.pruning} if found.pruning else found.stats
    return Plan(g, hw, space, found.solver or "enumerate", chosen, optimal, gap, limit, time.perf_counter() - t0,
                runner_ups, priced_baselines, stats, decisions, model=graph,
                precision=Precision.of(precision).name, optimizer=optimizer, attention=attention, overlap=overlap,
                cut_short=tuple(found.cut_short))


def _search_remat(found: _Found, rs: RulesSearch, limit: float | None, space: str, solver: str, top: int,
                  tie: bool, deadline: Deadline, optimizer: str, attention: str, overlap: float | str,
                  progress: Progress | None) -> None:
    """Unless the time limit has passed: the layouts of ``space`` under the remat policy of ``rs`` (the rules
    space's search under it), the rules space by bound-and-price, the finer spaces from its optimum."""
    g, mesh, hw, pricer, policy = rs.g, rs.mesh, rs.hw, rs.pricer, rs.remat
    if found.options and deadline.passed():
        found.skipped(f"remat {policy}")
        return
    found.searches.append(rs)
    if progress is not None:
        progress(f"remat {policy}: searching the {space} space")
    why = ""
    floor = rs.floor
    if space == "rules":
        upper = found.upper(limit, top)
        dominated = _dominated(found, rs, limit)
        plans, proven, pgap, found.solver = overlapped_top(rs, limit, top, solver, deadline, overlap, attention,
                                                           optimizer, progress, upper, dominated)
        left_out = dominated is not None and bool(dominated.any())
        floor = min(rs.floor, _dominated_floor(found, rs)) if left_out else rs.floor
        if not plans and upper is not None and rs.floor >= upper * (1 - 1e-9) and rs.floor < math.inf:
            why = _cannot_beat(top, upper) + (" (the layouts that fit with less recomputation left out: the same "
                                              "layout, no faster)" if left_out else "")
        elif not plans and left_out and rs.floor == math.inf:
            why = ("no plan can beat those found: the layouts that fit with it fit with less recomputation, which "
                   "is no slower (no runner-up either: the same layout, no faster)")
        found.pruning[f"remat {policy}"] = {**rs.pruning(limit),
                                            "dominated": int(dominated.sum()) if dominated is not None else 0}
        found.stats = {"candidates": len(rs.cands), "priced": int((~np.isnan(rs.cost)).sum()),
                       "memory_rows": rs.rows, "nodes": 1, "strategies": len(rs.cands), "factors": 0,
                       "variables": len(rs.cands)}
        found.cut_short += rs.cut_short
    else:
        priced = rs.bound_and_price(limit, top, progress, deadline)
        sols = solve(rs.problem(priced), "enumerate", limit, top, None) if len(priced) else []
        if not sols or not sols[0].assign:
            plans, proven, pgap = [], True, None
        else:
            res = solve_finer(g, mesh, hw, space, solver, limit, top, deadline, tie, pricer, rs,
                              rs.cands.take(priced), sols[0], optimizer, progress, policy, attention)
            plans = [p for p in (res.chosen, *res.runner_ups) if p.within(limit)]
            proven, pgap, found.stats = res.optimal and not rs.cut_short, res.gap, res.stats
            found.solver = res.solver
            found.cut_short += rs.cut_short + list(res.cut_short)
    at_least = floor if why and floor < math.inf else None
    if not plans and not why and limit is not None:  # (the smallest peak itself is priced only when needed)
        least = float(np.min(rs.peak_floors()))
        why = (f"nothing fits the memory limit in one micro-batch (the whole batch at once): every layout needs at "
               f"least {format_bytes(least, 'GiB')}")
    found.add(plans, proven, pgap)
    found.decisions.append(_decision("remat", policy, plans[0] if plans else None, None, why, at_least))


def _dominated(found: _Found, rs: RulesSearch, limit: float | None) -> np.ndarray | None:
    """The candidates whose plan fits under a policy searched before that recomputes less (selective and
    ``full:N`` after none, full after selective, ``full:N`` after ``full:M`` with M < N), priced or peak
    computed there; their plan here is no faster (it runs the same ops and more), so its search leaves them
    out. None when no such policy was searched (none, or the first policy asked for)."""
    less = _recomputing_less(found, rs)
    if not less:
        return None
    out = np.zeros(len(rs.cands), bool)
    for other in less:
        out |= other.mem <= (limit if limit is not None else math.inf) * (1 + 1e-12)  # (NaN: not known)
    return out


def _recomputing_less(found: _Found, rs: RulesSearch) -> list[RulesSearch]:
    """The searches of ``found`` under a policy other than ``rs``'s that recomputes only what it does."""
    return [other for other in found.searches
            if other is not rs and other.remat != rs.remat and recomputes_within(other.remat, rs.remat)]


def _rules_out(rs: RulesSearch, limit: float, best: float) -> bool:
    """Whether ``limit`` rules out some candidate of ``rs`` whose roofline bound is below ``best``."""
    below = np.nonzero(rs.lb < best)[0]
    return len(rs.may_fit_among(below, limit, any_out=True)) < len(below)


def _dominated_floor(found: _Found, rs: RulesSearch) -> float:
    """A lower bound of the plans of ``rs`` that its search left out as dominated: each is no faster than the
    same layout's plan under a policy recomputing less, searched before, which is at least the fastest plan
    that search priced with overlap or the smallest lower bound of those it did not (its floor)."""
    return min((min([other.floor, *(p.step_s for p in other.plans.values())])
                for other in _recomputing_less(found, rs)), default=0.0)


def _search_accumulation(found: _Found, graph: Graph, g: Graph, mesh: Mesh, hw: Hardware, limit: float | None,
                         policies: tuple[str, ...], microbatches: int | str, top: int, deadline: Deadline,
                         optimizer: str, precision: Precision | str, attention: str, overlap: float | str,
                         progress: Progress | None) -> None:
    """Gradient accumulation, when the memory limit binds (a plan faster than the best found does not fit)
    or ``microbatches`` is given: the first micro-batch count whose micro-batch may fit and the next, the
    larger first (its plans, often faster, then bound the smaller count's); only plans that can make the
    ``top`` are priced (the ``top``-th best found so far bounds them)."""
    best = min((p.step_s for p in found.options), default=math.inf)
    binds = limit is not None and any(_rules_out(rs, limit, best) for rs in found.searches)
    if "batch" not in g.dims or not (binds or microbatches != "auto"):
        return
    decisions: dict[int, Decision] = {}
    fitting: list[tuple[int, list[RulesSearch]]] = []
    # a plan that fits the whole batch fits one micro-batch of it (the same tensors, those with a batch dim
    # smaller): its micro-batch may fit without a bound computed
    fits = any(p.within(limit) for p in found.options)
    for M in microbatch_options(graph.dims["batch"], microbatches):
        if found.options and deadline.passed():
            found.skipped(f"gradient accumulation over {M} micro-batches")
            break
        searches = micro_searches(graph, mesh, hw, M, policies, optimizer, precision, attention)
        if fits or micro_may_fit(searches, limit):
            fitting.append((M, searches))
        else:
            decisions[M] = _decision("microbatches", str(M), None, None)
        if len(fitting) >= 2:  # the first count that fits and one more: more micro-batches only add overhead
            break
    for M, searches in reversed(fitting):
        if found.options and deadline.passed():
            found.skipped(f"gradient accumulation over {M} micro-batches")
            continue
        upper = found.upper(limit, top)
        plans, proven = accumulated(graph, mesh, hw, M, searches, limit, top, upper, optimizer, precision,
                                    attention, overlap, deadline, progress, found.pruning)
        plans = sorted((p for p in plans if p.within(limit)), key=lambda c: c.step_s)
        found.options += plans[:top]
        found.optimal = found.optimal and proven
        found.gap_unknown = found.gap_unknown or not proven
        why = _cannot_beat(top, upper) if not plans and upper is not None else ""
        decisions[M] = _decision("microbatches", str(M), plans[0] if plans else None, None, why)
    found.decisions += [decisions[M] for M in sorted(decisions)]


def _search_pipelines(found: _Found, graph: Graph, mesh: Mesh, hw: Hardware, limit: float | None,
                      pipeline: str | int, microbatches: int | str, schedule: str, optimizer: str,
                      precision: Precision | str, attention: str, overlap: float | str, deadline: Deadline,
                      progress: Progress | None) -> str:
    """The best pipelined plan (for ``pipeline="auto"``, only one that can beat the best plan found); returns
    why none fits or applies ("" when one does)."""
    upper = min((p.step_s for p in found.options if p.within(limit)), default=None)
    plans, why = _pipelined(graph, mesh, hw, limit, pipeline, microbatches, schedule, optimizer, precision,
                            attention, overlap, upper, deadline, progress)
    found.options += [p for p in plans if p.within(limit)]
    label = "any axis" if pipeline == "auto" else f"{pipeline} stages"
    if plans:
        p = plans[0]
        label = (f"{mesh.axis_size(p.stage_axis)} stages over {p.stage_axis}, {p.microbatches} micro-batches, "
                 f"{p.schedule}")
    found.decisions.append(_decision("pipeline", label, plans[0] if plans else None, None, why))
    return why


def _price_baselines(base: dict[str, tuple[RuleSets | None, str]], g: Graph, mesh: Mesh, hw: Hardware,
                     policies: tuple[str, ...], found: _Found, limit: float | None, optimizer: str,
                     attention: str, overlap: float | str, deadline: Deadline, progress: Progress | None
                     ) -> tuple[Baseline, ...]:
    """Each baseline at its fastest remat policy that fits (:func:`~.rules_search.first_fitting`), among
    those of ``policies`` applied to every block alike (:func:`_alike`), as the conventional layouts run;
    those left when ``deadline`` has passed are not priced (said in ``found.cut_short``)."""
    if progress is not None:
        progress("pricing the baselines")
    policies = _alike(policies)
    out = []
    for name, (rules, why) in base.items():
        if rules is not None and deadline.passed():
            rules, why = None, "not priced: the time limit ran out first"
            found.cut_short.append(f"baseline {name}: {why}")
        out.append(Baseline(name, None, why) if rules is None else
                   Baseline(name, first_fitting(g, mesh, hw, rules, policies, found.searches, limit, optimizer,
                                                attention, overlap, name)))
    return tuple(out)


def price_plan(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *, remat: str = "none",
               microbatches: int = 1, stage_axis: str | None = None, schedule: str | None = None,
               memory_limit: float | str | None = "auto", optimizer: str = "adam",
               precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
               overlap: float | str = "auto") -> Costed:
    """One plan of ``graph`` (a forward graph) priced as :func:`search` prices it: ``layout`` with the
    decisions (remat policy, gradient-accumulation or pipeline micro-batches, stage axis and schedule)."""
    hw = _hardware(hardware)
    limit = memory_limit_bytes(memory_limit, hw)
    if microbatches == 1 and stage_axis is None:
        return costed_rules("", training_step(graph, optimizer, precision), layout.mesh, hw, layout.rules, limit,
                             optimizer, remat, attention, overlap)
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    rep = estimate_pipeline(graph, layout, hw, stage_axis=stage_axis, microbatches=microbatches,
                            schedule=schedule or "1f1b", remat=remat, optimizer=optimizer, precision=precision,
                            attention=attention, overlap=overlap if overlap == "auto" else 0,
                            memory_limit=limit if stage_axis is not None else None)
    return Costed.from_microbatched("", layout, rep, limit, hw.usable_bytes)



def _alike(policies: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``policies`` that remat every block alike (none, selective, full: the block groups ``full:N``
    are searched for the step without accumulation, an alternative way to fit); ``policies`` itself when it
    holds none of them (a block group asked for)."""
    return tuple(p for p in policies if p in REMAT_POLICIES) or policies


def _remat_policies(g: Graph, space: str, remat: str) -> tuple[str, ...]:
    """The remat policies to search: ``remat`` when given; for ``auto``, none, selective and full, and in the
    rules space the block groups ``full:N`` (:func:`~layoutsearch.ir.remat.block_groups`) before full; but
    ``none`` alone in the ops space and when no forward op is in a block (remat recomputes blocks: without
    any, every policy prices the same step)."""
    if remat not in ("auto", "maxtext"):
        return (remat,)
    blocks = forward_blocks(g)
    if remat == "maxtext":  # (one policy for every layer)
        return ("none", "selective", "full") if blocks and space != "ops" else ("none",)
    if space == "ops" or not blocks:
        return ("none",)
    groups = block_groups(len(blocks)) if space == "rules" else ()
    return ("none", "selective", *groups, "full")


def _decision(kind: str, option: str, plan: Costed | None, min_memory: float | None, why: str = "",
              at_least_s: float | None = None) -> Decision:
    if plan is None:
        return Decision(kind, option, None, min_memory, False, why or "nothing fits the memory limit",
                        at_least_s=at_least_s)
    return Decision(kind, option, plan.step_s, plan.memory_bytes, True, why)


def _cannot_beat(top: int, upper: float) -> str:
    return f"no plan can beat the {top} fastest found (up to {upper:.4g} s): proven by its lower bounds"


def _same_choice(d: Decision, chosen: Costed) -> bool:
    if d.kind == "remat":
        return chosen.stage_axis is None and chosen.microbatches == 1 and chosen.remat == d.option
    if d.kind == "microbatches":
        return chosen.stage_axis is None and str(chosen.microbatches) == d.option
    return chosen.stage_axis is not None


def _infeasible(g: Graph, mesh: Mesh, limit: float | None, searches: list[RulesSearch], why_not_piped: str,
                microbatches: int | str, pipeline: str | int) -> InfeasibleError:
    """The error of a search where nothing fits: the smallest peak any layout needs, and what could help,
    naming the options of :func:`search` not tried: remat full when not searched, gradient accumulation when
    ``microbatches`` was fixed, a pipeline when ``pipeline`` was off and a mesh axis could carry stages
    (2 <= size <= the graph's pipeline units)."""
    if not searches:
        return InfeasibleError(why_not_piped, None)
    peaks = [rs.min_memory() + (rs,) for rs in searches]
    peak, k, rs = min(peaks, key=lambda p: p[0])
    lay = format_rules(rules_of(rs.cands, k, rs.dims, mesh)) or "replicated"
    helps = ["a larger memory limit or more devices"]
    options: dict[str, Any] = {}
    if all(r.remat != "full" for r in searches) and "full" in _remat_policies(g, "rules", "auto"):
        helps.append("remat full")
        options["remat"] = "full"
    if "batch" in g.dims and microbatches != "auto":
        helps.append("gradient accumulation (microbatches='auto')")
        options["microbatches"] = "auto"
    if pipeline == "off" and "batch" in g.dims:
        units = len(set(unit_of_ops(g).values()))
        if any(2 <= size <= units for _, size in mesh.axes):
            helps.append("a pipeline (pipeline='auto')")
            options["pipeline"] = "auto"
    return InfeasibleError(
        f"no plan of {g.name!r} on mesh {mesh} fits {format_bytes(limit, 'GiB')} per device: the smallest peak "
        f"memory any layout needs is {format_bytes(peak, 'GiB')} ({lay}, remat {rs.remat}); what could help: "
        f"{', '.join(helps)}"
        + (f"; pipelines: {why_not_piped}" if why_not_piped else ""), peak, options)

