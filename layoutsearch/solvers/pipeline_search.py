"""Pipelines in the solvers: choosing the stages of a micro-batched step, and the joint search of stage
axis, K, micro-batches, remat and inner layout.

:func:`estimate_pipeline` prices a micro-batched step with the pipeline cost
model (:mod:`layoutsearch.costmodel.pipeline`, which prices given stages),
choosing the stages, when not given, exactly (:func:`choose_stages`: the
slowest stage minimized under the memory limit).

:func:`search_pipeline`: for each mesh axis that may carry stages (K = its
size), candidate layouts over the other axes come from
the rules space on the model (its best two under the serial objective,
without remat, by :class:`~.rules_search.RulesSearch`) and the textbook baselines' rules; then
every number of micro-batches M (divisors of the batch up to ``4 K``, or the
one given) is priced with :func:`estimate_pipeline` (the given schedule,
default 1F1B; its stage partition is exact) under the remat policies in order
none, selective, full, stopping at the first that fits (remat only adds work),
and the fastest plan whose largest stage fits the memory limit wins. Given a
step time to beat, lower bounds skip what cannot beat it before it is priced
(:func:`search_pipeline`). Cost: one inner search per candidate axis plus at
most ``|candidates| x |M| x 3`` pipeline estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.costdag import CostDAG
from layoutsearch.costmodel.memory import REMAT_POLICIES, remat_plan
from layoutsearch.costmodel.overlap import collective_class, once_per_step
from layoutsearch.costmodel.pipeline import MicrobatchStep, PipelineReport, Schedule, microbatch_step
from layoutsearch.costmodel.report import OpReport
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import LayoutSearchError, PartitionError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware
from layoutsearch.solvers.baselines import baseline_rules, baseline_sets
from layoutsearch.solvers.clock import Deadline, Progress
from layoutsearch.solvers.dispatch import solve
from layoutsearch.solvers.pricer import Pricer
from layoutsearch.solvers.rules_search import RulesSearch, dims_mask, rules_candidates
from layoutsearch.solvers.rulesets import RuleSets, rules_of
from layoutsearch.solvers.stage_chain import split_chain


def estimate_pipeline(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *,
                      stage_axis: str | None, microbatches: int, schedule: Schedule | str = "1f1b",
                      remat: str = "none", optimizer: Optimizer | str = "adam",
                      precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
                      stages: Sequence[Sequence[str]] | None = None, memory_limit: float | None = None,
                      batch_dim: str = "batch", overlap: str | float = "auto") -> PipelineReport:
    """Predicted cost of a micro-batched step: ``microbatches`` micro-batches on pipeline stages over
    ``stage_axis`` of ``layout.mesh`` run by ``schedule`` (``gpipe``, ``1f1b``, ``interleaved:V``), or
    gradient accumulation when ``stage_axis`` is None.

    ``stages``: the units of each stage in order (see :func:`~layoutsearch.costmodel.pipeline.unit_of_ops`;
    for ``interleaved:V``, the K V chunks, device ``d`` running chunks ``d, d + K, ...``); by default the
    partition minimizing the slowest stage, exactly, under ``memory_limit`` (:func:`choose_stages`). The
    other arguments are :func:`~layoutsearch.costmodel.pipeline.price_pipeline`'s, which prices given stages.

    >>> import layoutsearch as ls
    >>> g = ls.zoo.gpt(layers=2, d_model=64, heads=4, seq=16, batch=8, vocab=128)
    >>> rep = estimate_pipeline(g, ls.Layout.from_rules("stage:2", ""), "h100", stage_axis="stage", microbatches=4)
    >>> rep.num_stages, rep.partition_method
    (2, 'chain dp')
    """
    step = microbatch_step(graph, layout, hardware, stage_axis=stage_axis, microbatches=microbatches,
                           schedule=schedule, remat=remat, optimizer=optimizer, precision=precision,
                           attention=attention, batch_dim=batch_dim, overlap=overlap)
    if stage_axis is None or stages is not None:
        return step.report(stages)
    groups, method, optimal = choose_stages(step, memory_limit)
    return step.report(groups, method, optimal)


def choose_stages(step: MicrobatchStep, memory_limit: float | None = None
                  ) -> tuple[tuple[tuple[str, ...], ...], str, bool]:
    """The stages of a pipelined ``step``: its units split into ``step.chunks`` contiguous groups minimizing
    the slowest stage under ``memory_limit``. Where the schedule runs one stage per device, exactly, each
    stage holding its own micro-batches in flight (1F1B: ``min(K - k, M)``; :func:`_chain_split`). With
    interleaved chunks (a device runs ``V`` of them), by the exact partitioner with every chunk held to the
    whole limit and the first device's in-flight count; when its split leaves a device over the limit,
    split again with every chunk held to ``limit / V`` and its device's in-flight count (every device then
    fits; not proven fastest) if such a split exists. Returns (groups, the method, whether proven optimal)."""
    if step.schedule.kind == "maxtext":
        return _equal_stages(step), "equal stages (MaxText's num_layers_per_pipeline_stage)", True
    dag = step.costdag()
    if step.chunks == step.devices:
        return _chain_split(step, dag, memory_limit), "chain dp", True
    from layoutsearch.solvers.partition import partition

    part = partition(dag, step.chunks, objective="throughput", microbatches=math.ceil(step.in_flight),
                     memory_limit=memory_limit)
    groups = tuple(tuple(s) for s in part.stages)
    if memory_limit is None or step.report(groups).memory_bytes <= memory_limit:
        return groups, part.method, part.optimal
    V = step.chunks // step.devices
    try:  # (a byte per chunk spare: the report rounds a device's activations down once, not per chunk)
        return _chain_split(step, dag, memory_limit / V - V), f"chain dp (limit / {V} per chunk)", False
    except PartitionError:
        return groups, part.method, part.optimal


def _equal_stages(step: MicrobatchStep) -> tuple[tuple[str, ...], ...]:
    """The blocks in ``step.devices`` equal contiguous stages, as MaxText runs them (PartitionError when they
    do not divide)."""
    units, K = step.units, step.devices
    if len(units) % K:
        raise PartitionError(f"{len(units)} layers do not split into {K} equal stages (MaxText: "
                             "num_layers_per_pipeline_stage = layers / stages)")
    n = len(units) // K
    return tuple(tuple(units[k * n:(k + 1) * n]) for k in range(K))


def _chain_split(step: MicrobatchStep, dag: CostDAG, limit: float | None) -> tuple[tuple[str, ...], ...]:
    """The units of ``step`` (``dag``: :meth:`~MicrobatchStep.costdag`) split into ``step.chunks`` contiguous
    groups by :func:`.stage_chain.split_chain`, chunk ``c`` holding device ``c mod K``'s micro-batches in
    flight within ``limit``, its memory counted as the stage report counts a device's."""
    names = [node.name for node in dag.nodes]
    transfers = [0.0] * len(names)
    for edge in dag.edges:
        transfers[names.index(edge.dst)] = edge.transfer_s
    K = step.devices
    in_flight = [max(step.schedule.in_flight(c % K, K, step.microbatches), 1.0) for c in range(step.chunks)]
    units = [step.priced.units[name] for name in names]
    firsts = split_chain([node.compute_s for node in dag.nodes], transfers,
                         [u.parameters + u.optimizer_state + u.gradients + u.accumulator for u in units],
                         [u.saved for u in units], in_flight, limit,
                         ([u.workspace for u in units], [u.working for u in units]))
    ends = [*firsts[1:], len(names)]
    return tuple(tuple(names[a:b]) for a, b in zip(firsts, ends, strict=True))


@dataclass(frozen=True)
class PipelineCandidate:
    """One priced pipelined configuration."""

    stage_axis: str
    stages: int
    microbatches: int
    remat: str
    inner_rules: str
    step_s: float
    memory_bytes: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PipelinePlan:
    """The best pipelined plan found and every candidate priced on the way."""

    report: PipelineReport
    candidates: tuple[PipelineCandidate, ...] = field(repr=False)

    @property
    def step_s(self) -> float:
        return self.report.step_s

    @property
    def memory_bytes(self) -> int:
        return self.report.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        d = self.report.to_dict()
        d["candidates"] = [c.to_dict() for c in sorted(self.candidates, key=lambda c: c.step_s)]
        return d


def microbatch_candidates(batch: int, stages: int, limit: int | None = None) -> list[int]:
    """Numbers of micro-batches worth trying: divisors of ``batch`` up to ``4 * stages``
    (GPipe's bubble is small once M >= 4K; more only shrinks micro-batches)."""
    top = limit or 4 * stages
    return [m for m in range(1, min(batch, top) + 1) if batch % m == 0]


def search_pipeline(graph: Graph, mesh: Mesh | str, memory_limit: float | None = None, *,
                    hardware: Hardware | str = "cpu-sim", stages: int | None = None,
                    microbatches: int | None = None, optimizer: str = "adam",
                    precision: Precision | str = DEFAULT_PRECISION, schedule: str = "1f1b",
                    attention: str = "auto", overlap: str | float = "auto", batch_dim: str = "batch",
                    upper: float | None = None, progress: Progress | None = None,
                    deadline: Deadline | None = None) -> PipelinePlan:
    """The fastest pipelined plan of ``graph`` on ``mesh`` (``schedule``: ``gpipe``, ``1f1b`` or
    ``interleaved:V``) whose stages fit ``memory_limit``.

    ``stages``: only axes of this size carry stages (None: any axis of size >= 2);
    ``microbatches``: fixed M (None: searched); ``upper``: a step time to beat (the best unpipelined plan):
    a configuration whose lower bound reaches it, or the best pipelined plan found so far, is not priced:
    the loop's length ``steps(K, M) / M`` times a ``K``-th of a lower bound of the inner layout's
    full-batch step (its roofline bound, or a sharper one: :func:`_stage_layouts`), then, once the step
    without remat is priced, the loop's length times a ``K``-th of its micro-batch's compute and critical
    collectives, with the recomputations of the policy about to be priced (:func:`_loop_bound`).
    ``deadline``: once it has passed and a pipelined plan fits, nothing more is priced. Raises
    LayoutSearchError when no axis can carry stages or no pipelined plan fits."""
    deadline = deadline or Deadline()
    m = Mesh.of(mesh)
    hw = _hardware(hardware)
    B, axes = _pipeline_axes(graph, m, stages, microbatches, batch_dim)
    priced: list[tuple[PipelineCandidate, PipelineReport]] = []
    reasons: list[str] = []
    bounded = 0  # configurations ruled out by a lower bound
    trained_graph = training_step(graph, optimizer, precision)
    sched = Schedule.parse(schedule)
    for axis in _untwinned_stage_axes(m, hw, axes):
        K = m.axis_size(axis)
        inner_mesh = Mesh(tuple((a, s) for a, s in m.axes if a != axis))
        if progress and inner_mesh.axes:
            progress(f"pipeline over {axis} ({K} stages): searching the layout inside a stage")
        full_mesh = Mesh(((axis, K),) + inner_mesh.axes)
        counts = [microbatches] if microbatches else microbatch_candidates(B, K)
        inner = _inner_space(trained_graph, inner_mesh, hw, attention)
        beat = min([c.step_s for c, _ in priced if c.fits] + ([upper] if upper is not None else []), default=math.inf)

        def tried(mb: int, split: int) -> bool:
            """Whether M = ``mb`` is priced for a layout splitting the batch ``split`` ways: given, or searched
            and splittable (priced, the others would raise)."""
            return bool(microbatches) or (B // mb) % split == 0

        def loop(split: int, K: int = K, counts: list[int] = counts) -> float:
            """The shortest loop per full-batch step time, steps(K, M) / M / K, of the M tried for a layout
            splitting the batch ``split`` ways."""
            return min((sched.steps(K, mb) / mb / K for mb in counts if tried(mb, split)), default=math.inf)

        for rules, bound in _stage_layouts(inner, trained_graph, inner_mesh, deadline, beat, loop, batch_dim,
                                           serial=overlap != "auto" or not hw.async_collectives):
            layout = Layout(full_mesh, rules)
            split = full_mesh.group_size(layout.rules_layout((batch_dim,)).get(batch_dim, ()))
            for mb in counts:
                if not tried(mb, split):
                    continue
                beat = min([c.step_s for c, _ in priced if c.fits] + ([upper] if upper is not None else []),
                           default=math.inf)
                if bound / K * sched.steps(K, mb) / mb >= beat:
                    bounded += 1
                    continue  # cannot beat what is known
                if beat < math.inf and deadline.passed():
                    break  # a plan that fits is known and the time limit has passed
                unremat: MicrobatchStep | None = None  # the step without remat: bounds every policy's
                for remat in REMAT_POLICIES:  # least recomputation first: the first that fits is the fastest
                    try:
                        if unremat is not None and _loop_bound(unremat, remat) >= beat:
                            bounded += 1
                            break  # this policy cannot beat what is known, nor one recomputing more
                        step = microbatch_step(graph, layout, hw, stage_axis=axis, microbatches=mb, remat=remat,
                                               schedule=schedule, attention=attention,
                                               overlap=overlap if overlap == "auto" else 0, optimizer=optimizer,
                                               precision=precision, batch_dim=batch_dim)
                        if remat == REMAT_POLICIES[0]:
                            unremat = step
                            if _loop_bound(step) >= beat:
                                bounded += 1
                                break  # no policy can beat what is known: recomputation only adds work
                        rep = step.report(*choose_stages(step, memory_limit))
                    except LayoutSearchError as e:
                        reasons.append(f"{axis} K={K} M={mb} remat={remat}: {e}")
                        continue
                    fits = memory_limit is None or rep.memory_bytes <= memory_limit
                    priced.append((PipelineCandidate(axis, K, mb, remat, layout.describe(), rep.step_s,
                                                     rep.memory_bytes, fits), rep))
                    if fits:
                        break
    ok = [(c, r) for c, r in priced if c.fits]
    if not ok:
        raise LayoutSearchError(f"no pipelined plan of {graph.name!r} on mesh {m} "
                                + _why_none(reasons, bounded, bool(priced)))
    best = min(ok, key=lambda cr: cr[0].step_s)
    return PipelinePlan(best[1], tuple(c for c, _ in priced))


def _why_none(reasons: list[str], bounded: int, priced: bool) -> str:
    """Why no pipelined plan was found, to follow "no pipelined plan ...": ruled out by lower bounds (none can
    beat the best plan known), the last errors met, or memory."""
    if bounded:
        return (f"can beat the best plan found ({bounded} configurations ruled out by their lower bounds"
                + (f"; the others: {reasons[-1]}" if reasons else "") + ")")
    if reasons:
        return "fits: " + "; ".join(reasons[-3:])
    return "fits: every candidate exceeds the memory limit" if priced else "can beat the unpipelined plan"


def _untwinned_stage_axes(m: Mesh, hw: Hardware, axes: list[str]) -> list[str]:
    """``axes`` less those whose pipelined mesh (the stage axis first, the others in order) has, position by
    position, the sizes and links of an earlier one's: pipelining over ``fsdp`` or over ``model`` of
    ``data:16,fsdp:8,model:8`` on one TPU slice gives the same plans with those two axes renamed (the cost model
    sees an axis's size and link, and the mesh order), so only the first is searched."""
    seen: set[tuple] = set()
    out = []
    for axis in axes:
        full = Mesh(((axis, m.axis_size(axis)),) + tuple((a, s) for a, s in m.axes if a != axis))
        links = hw.links_for(full)
        shape = tuple((s, links[a]) for a, s in full.axes)
        if shape not in seen:
            seen.add(shape)
            out.append(axis)
    return out


STAGE_AXES: ContextVar[tuple[str, ...] | None] = ContextVar("STAGE_AXES", default=None)
"""The mesh axes a search lets carry stages (``search(target="maxtext")``: the axis MaxText names ``stage``);
None: any."""


def _pipeline_axes(graph: Graph, m: Mesh, stages: int | None, microbatches: int | None,
                   batch_dim: str) -> tuple[int, list[str]]:
    """The batch size and the mesh axes that can carry ``stages`` stages (any of size >= 2 when None);
    LayoutSearchError when there is no batch dim, ``microbatches`` does not divide it, or no axis fits."""
    B = graph.dims.get(batch_dim)
    if B is None:
        raise LayoutSearchError(f"model {graph.name!r} has no {batch_dim!r} dim to split into micro-batches")
    if microbatches is not None and B % microbatches:
        raise LayoutSearchError(f"{microbatches} micro-batches do not divide {batch_dim}={B}")
    allowed = STAGE_AXES.get()
    axes = [a for a, s in m.axes if s >= 2 and (stages is None or s == stages) and (allowed is None or a in allowed)]
    if not axes:
        raise LayoutSearchError(f"no axis of mesh {m} can carry {stages or 'at least 2'} pipeline stages"
                                + (f" (the target framework's: {', '.join(allowed)})" if allowed is not None else ""))
    return B, axes


def _inner_space(trained: Graph, inner_mesh: Mesh, hw: Hardware, attention: str
                 ) -> tuple[Pricer, tuple[RuleSets, np.ndarray]] | None:
    """The rules space inside a stage (the textbook layouts among its candidates) with the candidates'
    roofline bounds of the full-batch step; None when the inner mesh is trivial."""
    if not inner_mesh.axes:
        return None
    pricer = Pricer(trained, inner_mesh, hw, attention)
    return pricer, rules_candidates(trained, inner_mesh, hw, pricer, baseline_sets(baseline_rules(trained,
                                                                                                  inner_mesh)))


def _stage_layouts(inner: tuple[Pricer, tuple[RuleSets, np.ndarray]] | None, trained: Graph, inner_mesh: Mesh,
                   deadline: Deadline, beat: float = math.inf, loop: Callable[[int], float] = lambda split: 0.0,
                   batch_dim: str = "batch", serial: bool = False) -> list[tuple[tuple, float]]:
    """Candidates for the layout inside a stage, each with a lower bound of its full-batch step: the best two
    rule sets of the serial objective (the step without overlap, remat none, no memory limit) of the
    ``inner`` space (:func:`_inner_space`) among those that may beat ``beat``, by bound-and-price (each
    priced again as a pipeline by the caller), and the textbook layouts; replicated when the inner mesh is
    trivial.

    A pipelined step of a layout with bound ``r`` takes at least ``r * steps(K, M) / M / K``: its loop runs
    ``steps(K, M)`` times the slowest device's micro-batch, at least a ``K``-th of what the micro-batch holds
    the compute stream or a communicator for, summed over the devices (:func:`_loop_bound`), and ``M``
    micro-batches add up to at least the batch (the same FLOPs, weights read and gathered once per
    micro-batch, activation collectives of an ``M``-th of the bytes each). ``loop(split)``: the least
    ``steps(K, M) / M / K`` of the M tried for a layout splitting ``batch_dim`` ``split`` ways; a candidate
    may beat ``beat`` while its bound times that is below it.

    The bound is the roofline bound; with a finite ``beat``, for the candidates whose roofline bound may
    beat it, the larger of that and the largest entry of their bound vector without the optimizer
    (:meth:`~.rules_search.RulesSearch.overlap_bounds`, one build for all of them: the compute and critical
    collectives, or one communicator's collectives, of the forward and backward passes; no more than the
    serial step either; ``serial``, where no collective overlaps compute: the serial step itself)."""
    if inner is None:
        return [((), 0.0)]
    pricer, (cands, lb) = inner
    may_beat = np.ones(len(lb), bool)
    if beat < math.inf:  # (with nothing to beat, a sharper bound prunes nothing)
        sizes = tuple(s for _, s in inner_mesh.axes)
        splits = cands.split(dims_mask(list(trained.dims), (batch_dim,)), sizes)
        factor = {s: loop(int(s)) for s in np.unique(splits).tolist()}
        least = np.array([factor[s] for s in splits.tolist()])  # per candidate: loop(its split)
        below = np.nonzero(lb * least < beat)[0]
        if len(below):
            vectors, _ = RulesSearch(trained, inner_mesh, pricer.hw, pricer, (cands, lb)).overlap_bounds(
                below, optimizer=False, serial=serial)
            lb = lb.copy()
            lb[below] = np.maximum(vectors, lb[below])
        may_beat = lb * least < beat
    picks: list[int] = []
    if may_beat.any():
        rs = RulesSearch(trained, inner_mesh, pricer.hw, pricer, (cands, lb))
        priced = rs.bound_and_price(None, 2, None, deadline, among=may_beat)
        sols = solve(rs.problem(priced), "enumerate", None, 2, None) if len(priced) else []
        picks = [int(priced[s.assign[0]]) for s in sols if s.assign]
    picks += [k for sets, _ in baseline_rules(trained, inner_mesh).values() if sets is not None
              for k in [cands.index(sets)] if k is not None]
    out: dict[tuple, float] = {}
    for k in picks:
        out.setdefault(rules_of(cands, k, list(trained.dims), inner_mesh), float(lb[k]))
    return list(out.items())


def _loop_bound(step: MicrobatchStep, remat: str | None = None) -> float:
    """A lower bound of pipelined ``step`` under remat policy ``remat`` (default: ``step``'s; one that
    recomputes at least what ``step``'s does): its loop runs ``steps(K, M)`` times the slowest device's
    micro-batch, which is at least a ``K``-th of what all devices' micro-batches hold their compute streams
    for: every forward, backward and recomputing op's compute, kernel launch and the collectives it always waits for
    (critical: see :mod:`~layoutsearch.costmodel.overlap`; the once-per-step gradient all-reduces are not in
    the loop), plus the same for each op ``remat`` recomputes beyond ``step``'s policy (a recomputation
    replays the op and its collectives). Recomputing more only adds to it."""
    p, hw = step.priced, step.hardware

    def held(o: OpReport) -> float:  # how long op execution ``o`` holds its device's compute stream at least
        return o.compute_s + o.launch_s + sum(c.seconds for c in o.collectives if not once_per_step(c, p.classes)
                                 and collective_class(c, p.classes, o, hw.async_collectives,
                                                      hw.collective_matmul) == "critical")

    ops = [o for o in p.report.ops if o.phase != "optimizer"]
    more = set(remat_plan(p.graph, remat or step.remat).recomputed) - set(remat_plan(p.graph, step.remat).recomputed)
    busy = sum(held(o) for o in ops) + sum(held(o) for o in ops if o.phase == "forward" and o.op in more)
    return step.schedule.steps(step.devices, step.microbatches) * busy / step.devices
