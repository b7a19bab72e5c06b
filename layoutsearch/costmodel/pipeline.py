"""Micro-batched training steps: gradient accumulation and pipeline schedules.

A step of global batch ``B`` may run as ``M`` micro-batches of ``B / M``:

* **gradient accumulation** (no stage axis): one device group runs the M
  micro-batches one after another, adding their gradients up, and synchronizes
  and applies them once (Megatron-LM, MaxText ``gradient_accumulation_steps``);
* **pipelining** (a *stage axis* of the mesh): the model's repeated blocks
  (``layer.0 .. layer.L-1``) are split into K contiguous stages, one per
  position on the stage axis; each stage lays out its ops over the other axes
  with an inner layout, and the micro-batches flow through the stages.

A schedule (:mod:`layoutsearch.costmodel.schedule`: ``gpipe``, ``1f1b``,
``interleaved:V``) sets the loop's length, ``loop = steps * t`` with ``steps =
M + K - 1`` (``M + (K - 1) / V`` interleaved), and how many micro-batches'
activations each stage holds.

``t`` is the slowest stage's time for one micro-batch (forward, backward and
recomputation, with the critical communication of its inner layout and the
point-to-point transfers of the activations entering it and the gradients
leaving it). Step::

    step_s = loop + max_k once_k + tied

``once_k``: what stage k does once per step because gradients accumulate over
the micro-batches: the gradient all-reduces of its parameters (exposed as far
as they do not hide behind the last micro-batch's backward pass, see
:mod:`layoutsearch.costmodel.overlap`) and the optimizer; ``tied``: the
all-reduce over the stage axis of the gradients of a parameter used on several
stages (tied input/output embeddings). Reduce-scatters of gradients (FSDP
inside a stage) run every micro-batch, into the sharded accumulator.

Each stage's time comes from the schedule of its ops on one micro-batch (the
inner cost model on the graph resized to ``B / M``, with its precision, fusion,
attention and remat policy): :func:`~layoutsearch.costmodel.overlap.schedule`
once without the once-per-step reductions (every micro-batch but the last)
and once with them and the optimizer (the last).

Memory of stage k (per device)::

    parameters + optimizer state + gradients          (gradients accumulate in the master weights'
                                                       dtype, float32 under ``mixed``, when M > 1)
    + in_flight_k * saved_k                           (activations kept for the backward pass, per
                                                       micro-batch, under the remat policy)
    + max over its blocks of the recomputation workspace (remat: one block's recomputed activations)
    + max over its ops of the working set             (an op's activation gradients and the buffers
                                                       of its collectives)

A stage's *saved* activations are the tensors its backward (or recomputing)
ops read, kept from the forward pass: all of them without remat, the block
inputs (and with ``selective`` the projections' outputs) with remat; on-chip
tensors (fused, flash-attention scores) take nothing. Without a stage axis
the memory is the inner cost model's simulated peak for one micro-batch, plus
the float32 accumulation buffer when M > 1.

Units (:mod:`layoutsearch.costmodel.pipeline_units`): the ops of each
top-level block form one unit; ops outside blocks form ``pre`` (forward ops no
block op precedes, e.g. the embedding, and their backward) and ``post`` (the
head and loss). This module prices given stages
(:func:`price_pipeline`, :meth:`MicrobatchStep.report`, into a
:class:`~layoutsearch.costmodel.pipeline_report.PipelineReport`); choosing
them is the solvers' work:
:func:`layoutsearch.solvers.pipeline_search.estimate_pipeline` partitions the
chain ``pre, layer.0, ..., post`` (:meth:`MicrobatchStep.costdag`, a
:class:`~layoutsearch.costdag.CostDAG`) exactly, minimizing the slowest stage
under the memory limit (:func:`~layoutsearch.solvers.pipeline_search.choose_stages`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from layoutsearch.costdag import CostDAG, Edge, Node
from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.fusion import fusion_plan, resolve_attention
from layoutsearch.costmodel.overlap import collective_classes, once_per_step
from layoutsearch.costmodel.overlap import schedule as overlap_schedule
from layoutsearch.costmodel.pipeline_report import PipelineReport, StageReport
from layoutsearch.costmodel.pipeline_units import POST, PRE, Unit, accumulators, unit_chain, unit_costs, unit_of_ops
from layoutsearch.costmodel.report import CostReport, OpReport, estimate
from layoutsearch.costmodel.schedule import SCHEDULE_KINDS, Schedule, speedup
from layoutsearch.costmodel.step import resized, training_step
from layoutsearch.errors import CostModelError, PartitionError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.remat import parse_remat
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware


def _views(ops: Sequence[OpReport], classes: dict[str, str], once: bool) -> list[OpReport]:
    """``ops`` for the schedule: with (``once``) or without the once-per-step gradient all-reduces."""
    if once:
        return ops
    out = []
    for o in ops:
        kept = tuple(c for c in o.collectives if not once_per_step(c, classes))
        out.append(o if len(kept) == len(o.collectives) else dataclasses.replace(o, collectives=kept))
    return out


@dataclass(frozen=True)
class _Priced:
    """The micro-batch step priced under the inner layout, split into units (their costs computed when first
    asked for: gradient accumulation needs only the accumulators)."""

    graph: Graph
    report: CostReport
    unit: dict[str, str]
    chain: list[str]
    classes: dict[str, str]
    inner: Layout
    remat: str
    accumulate: bool
    on_chip: frozenset[str]

    @functools.cached_property
    def units(self) -> dict[str, Unit]:
        return unit_costs(self.graph, self.report, self.inner, self.unit, self.remat, self.accumulate, self.on_chip)


def _price(graph: Graph, inner: Layout, hw: Hardware, microbatches: int, remat: str, optimizer: Optimizer | str,
           precision: Precision | str, attention: str, batch_dim: str) -> _Priced:
    B = graph.dims.get(batch_dim)
    if B is None:
        raise CostModelError(f"model {graph.name!r} has no {batch_dim!r} dim to split into micro-batches")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1 or B % microbatches:
        raise CostModelError(f"{microbatches} micro-batches do not divide {batch_dim}={B}")
    split = inner.mesh.group_size(inner.rules_layout((batch_dim,)).get(batch_dim, ()))
    if (B // microbatches) % split:
        raise CostModelError(f"micro-batches of {B // microbatches} cannot be split {split} ways over "
                             f"{'+'.join(inner.rules_layout((batch_dim,))[batch_dim])} as the layout splits "
                             f"{batch_dim}: use fewer micro-batches")
    mb_graph = training_step(resized(graph, {batch_dim: B // microbatches}), optimizer, precision)
    rep = estimate(mb_graph, inner, hw, remat=remat, attention=attention)
    unit = unit_of_ops(mb_graph)
    on_chip = fusion_plan(mb_graph, hw.fusion, resolve_attention(attention, hw)).on_chip
    return _Priced(mb_graph, rep, unit, unit_chain(mb_graph, unit), collective_classes(mb_graph), inner, remat,
                   microbatches > 1, on_chip)


def _unit_seconds(p: _Priced, u: str, hw: Hardware) -> float:
    """One micro-batch through unit ``u`` alone (its schedule without the once-per-step reductions)."""
    return overlap_schedule(_views(p.units[u].ops, p.classes, once=False), p.classes, hw.async_collectives,
                            hw.collective_matmul).step_s


def pipeline_costdag(graph: Graph, inner: Layout, stage_axis: str, hardware: Hardware | str, *,
                     microbatches: int, remat: str = "none", optimizer: Optimizer | str = "adam",
                     precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
                     batch_dim: str = "batch", stage_link_mesh: Mesh | None = None
                     ) -> tuple[CostDAG, CostReport, dict]:
    """The chain of pipeline units as a cost DAG, priced by the inner cost model on one micro-batch.

    Node memory: parameters, optimizer state, gradients (and their accumulator when M > 1), the
    recomputation workspace and the working set
    (``memory_bytes``) and the saved activations per micro-batch (``activation_bytes``; the partitioner
    multiplies them by the micro-batches in flight). Returns the DAG, the inner report on the micro-batch
    graph and the units."""
    hw = _hardware(hardware)
    p = _price(graph, inner, hw, microbatches, remat, optimizer, precision, attention, batch_dim)
    if len(p.chain) < 2:
        raise CostModelError(f"model {graph.name!r} has no repeated blocks to pipeline (ops need block tags)")
    dag = _costdag(p, hw, stage_axis, stage_link_mesh or Mesh(((stage_axis, 2),) + inner.mesh.axes))
    return dag, p.report, {u: p.units[u] for u in p.chain}


@dataclass(frozen=True)
class MicrobatchStep:
    """A micro-batched step priced unit by unit under its inner layout, before its stages are chosen: what
    :func:`price_pipeline` prices given stages, and what a stage chooser partitions (:meth:`costdag`)."""

    priced: _Priced = field(repr=False)
    hardware: Hardware
    mesh: Mesh
    stage_axis: str | None
    inner: Layout
    schedule: Schedule
    devices: int
    microbatches: int
    remat: str

    @property
    def units(self) -> tuple[str, ...]:
        """The units the stages split, in order: ``pre``, the blocks, ``post``; the blocks alone where the
        schedule runs ``pre`` and ``post`` outside the stages (``maxtext``)."""
        if self.stage_axis is not None and self.schedule.outside:
            return tuple(u for u in self.priced.chain if u not in (PRE, POST))
        return tuple(self.priced.chain)

    @property
    def outside_units(self) -> tuple[str, ...]:
        """The units every device runs outside the stages (``maxtext``: ``pre`` and ``post``), else none."""
        if self.stage_axis is None or not self.schedule.outside:
            return ()
        return tuple(u for u in self.priced.chain if u in (PRE, POST))

    @property
    def chunks(self) -> int:
        """How many contiguous groups of units the stages form (K, or K V with ``interleaved:V``)."""
        return self.devices * (self.schedule.virtual if self.schedule.kind == "interleaved" else 1)

    @property
    def in_flight(self) -> float:
        """Micro-batches' worth of activations the first stage holds (at least one)."""
        return max(self.schedule.in_flight(0, self.devices, self.microbatches), 1.0)

    def costdag(self) -> CostDAG:
        """The units as a chain cost DAG (see :func:`pipeline_costdag`), transfers over the stage axis."""
        if self.stage_axis is None:
            raise CostModelError("gradient accumulation has no stages to choose")
        return _costdag(self.priced, self.hardware, self.stage_axis, self.mesh, self.units)

    def check_stages(self, stages: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
        """``stages`` as groups of units; PartitionError unless they split :attr:`units` into :attr:`chunks`
        non-empty groups, each unit once."""
        groups = tuple(tuple(s) for s in stages)
        chunks, K = self.chunks, self.devices
        if len(groups) != chunks:
            raise PartitionError(f"{len(groups)} stages given for {chunks} stages"
                                 + (f" ({K} devices x {chunks // K} chunks)" if chunks > K else ""))
        flat = [u for g in groups for u in g]
        if sorted(flat) != sorted(self.units) or not all(groups):
            raise PartitionError(f"the stages must split the units {', '.join(self.units)} into {chunks} "
                                 "non-empty groups, each unit once")
        return groups

    def report(self, stages: Sequence[Sequence[str]] | None = None, method: str = "given",
               optimal: bool = False) -> PipelineReport:
        """The step priced with ``stages`` (the groups of units, in order; ignored without a stage axis, where
        every unit runs on one stage); ``method`` and ``optimal`` say how they were chosen."""
        p, hw, K, sched, M = self.priced, self.hardware, self.devices, self.schedule, self.microbatches
        if self.stage_axis is None:
            groups: tuple[tuple[str, ...], ...] = (tuple(p.chain),)
            method, optimal = "one stage", True
        else:
            if stages is None:
                raise CostModelError("a pipelined step is priced for given stages: choose them with "
                                     "layoutsearch.solvers.pipeline_search.estimate_pipeline")
            groups = self.check_stages(stages)
        # devices: the chunks each one runs
        devices = [[c for c in range(len(groups)) if c % K == d] for d in range(K)]
        reports = []
        for d, chunk_ids in enumerate(devices):
            names = tuple(u for c in chunk_ids for u in groups[c])
            reports.append(_stage(p, hw, names, chunk_ids, groups, d, K, sched, M, self.stage_axis, self.mesh))
        if self.outside_units:
            reports = [_with_outside(r, p, hw, self.outside_units, K, M, self.inner, self.stage_axis, self.mesh)
                       for r in reports]
        tied = _tied_sync(p, groups, devices, self.inner, self.stage_axis, self.mesh, hw) \
            if self.stage_axis is not None and not self.outside_units else 0.0
        loop = sched.steps(K, M) * max(s.microbatch_s for s in reports)
        step = loop + max(s.once_s for s in reports) + tied
        return PipelineReport(p.graph.name, self.mesh, self.stage_axis, sched, M, self.remat, self.inner.describe(),
                              tuple(reports), step, tied, method, optimal, p.report)


def microbatch_step(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *,
                    stage_axis: str | None, microbatches: int, schedule: Schedule | str = "1f1b",
                    remat: str = "none", optimizer: Optimizer | str = "adam",
                    precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
                    batch_dim: str = "batch", overlap: str | float = "auto") -> MicrobatchStep:
    """``microbatches`` micro-batches of ``graph`` priced unit by unit, for pipeline stages over
    ``stage_axis`` of ``layout.mesh`` run by ``schedule``, or for gradient accumulation when ``stage_axis``
    is None (arguments as :func:`price_pipeline`). CostModelError when the step cannot be split so."""
    hw = _hardware(hardware)
    if overlap != "auto":
        if isinstance(overlap, bool) or overlap != 0:
            raise CostModelError(f"overlap of a micro-batched step is 'auto' or 0, got {overlap!r}")
        hw = hw.replace(async_collectives=False)
    sched = Schedule.parse(schedule)
    mesh = layout.mesh
    if stage_axis is not None and parse_remat(remat, CostModelError).blocks is not None:
        raise CostModelError(f"remat {remat}: a pipeline's stages remat every block alike (none, selective or "
                             "full), as its executor runs them; the first blocks alone apply without a stage axis")
    if stage_axis is not None and sched.kind == "maxtext" and parse_remat(remat, CostModelError).kind == "none":
        raise CostModelError("remat none: MaxText's pipeline checkpoints every iteration whatever its policy "
                             "(layers/pipeline.py, set_remat_policy_on_pipeline_iterations): selective (minimal) or "
                             "full")
    if stage_axis is None:
        K, inner = 1, layout
    else:
        K = mesh.axis_size(stage_axis)
        inner_mesh = Mesh(tuple((a, s) for a, s in mesh.axes if a != stage_axis))
        staged = [f"{d}:{'+'.join(ax)}" for d, ax in layout.rules if stage_axis in ax] + [
            f"tensor {n!r} ({d}:{'+'.join(ax)})" for n, e in layout.tensors for d, ax in e if stage_axis in ax]
        if staged:
            raise CostModelError(f"the layout splits over the stage axis {stage_axis!r} ({', '.join(staged)}): that "
                                 "axis holds the pipeline's stages, and the layout applies inside each stage over "
                                 "the other axes; drop it from the layout or choose another stage axis")
        inner = Layout(inner_mesh, layout.rules, layout.tensors)
    sched.check(K, microbatches)
    p = _price(graph, inner, hw, microbatches, remat, optimizer, precision, attention, batch_dim)
    step = MicrobatchStep(p, hw, mesh, stage_axis, inner, sched, K, microbatches, remat)
    if stage_axis is not None:
        if len(p.chain) < 2:
            raise CostModelError(f"model {graph.name!r} has no repeated blocks to pipeline (ops need block tags)")
        if step.chunks > len(step.units):
            raise CostModelError(f"cannot split {len(step.units)} pipeline units of {graph.name!r} into "
                                 f"{step.chunks} stages{' (chunks)' if step.chunks > K else ''}")
    return step


def price_pipeline(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *,
                   stage_axis: str | None, microbatches: int, stages: Sequence[Sequence[str]] | None = None,
                   schedule: Schedule | str = "1f1b", remat: str = "none", optimizer: Optimizer | str = "adam",
                   precision: Precision | str = DEFAULT_PRECISION, attention: str = "auto",
                   batch_dim: str = "batch", overlap: str | float = "auto") -> PipelineReport:
    """Predicted cost of a micro-batched step with given stages: ``microbatches`` micro-batches on pipeline
    stages over ``stage_axis`` of ``layout.mesh`` run by ``schedule`` (``gpipe``, ``1f1b``,
    ``interleaved:V``), or gradient accumulation when ``stage_axis`` is None.

    ``layout``'s rules and tensor entries lay out each stage over the other axes (naming the stage axis is an
    error).
    ``stages``: the units of each stage in order (see :func:`unit_of_ops`; for ``interleaved:V``, the K V
    chunks, device ``d`` running chunks ``d, d + K, ...``); required with a stage axis (the solvers choose
    them: :func:`layoutsearch.solvers.pipeline_search.estimate_pipeline`). ``remat``: ``none``,
    ``selective`` or ``full``. ``overlap``: ``"auto"`` (what the hardware's asynchronous collectives allow)
    or ``0`` (every collective on the critical path, as frameworks that reduce gradients after the backward
    pass run)."""
    step = microbatch_step(graph, layout, hardware, stage_axis=stage_axis, microbatches=microbatches,
                           schedule=schedule, remat=remat, optimizer=optimizer, precision=precision,
                           attention=attention, batch_dim=batch_dim, overlap=overlap)
    return step.report(stages)


def _costdag(p: _Priced, hw: Hardware, stage_axis: str, mesh: Mesh, chain: Sequence[str] | None = None) -> CostDAG:
    """The cost DAG of priced units (``chain``, default all of them; see :func:`pipeline_costdag`); transfers over
    ``stage_axis`` of ``mesh``. Each loop step a stage sends one tensor per neighbour, the activation forward and
    its gradient backward: paid on both sides of the cut, the two cuts of a stage add up to its two permutes."""
    nodes, edges = [], []
    chain = list(p.chain if chain is None else chain)
    for u in chain:
        d = p.units[u]
        fixed = d.parameters + d.optimizer_state + d.gradients + d.accumulator + d.workspace + d.working
        nodes.append(Node(u, _unit_seconds(p, u, hw), fixed, d.parameters, d.saved))
    for a, b in itertools.pairwise(chain):
        nbytes = p.units[b].boundary
        edges.append(Edge(a, b, collective_time("collective-permute", nbytes, (stage_axis,), mesh, hw).seconds,
                          nbytes))
    return CostDAG(tuple(nodes), tuple(edges), name=p.graph.name)


def _stage(p: _Priced, hw: Hardware, names: tuple[str, ...], chunk_ids: list[int],
           groups: Sequence[Sequence[str]], device: int, K: int, sched: Schedule, microbatches: int,
           stage_axis: str | None, mesh: Mesh) -> StageReport:
    mine = set(names)  # the stage's ops in the schedule's order: forwards, then backwards
    ops = [o for o in p.report.ops if p.unit[o.op] in mine and o.phase != "optimizer"]
    optimizer = [o for o in p.report.ops if p.unit[o.op] in mine and o.phase == "optimizer"]
    plain = overlap_schedule(_views(ops, p.classes, once=False), p.classes, hw.async_collectives,
                             hw.collective_matmul)
    if p.report.exposure is not None and len(ops) + len(optimizer) == len(p.report.ops) \
            and ops + optimizer == list(p.report.ops):  # the whole step in its order: the report's schedule
        last = p.report.exposure
    else:
        last = overlap_schedule(ops + optimizer, p.classes, hw.async_collectives, hw.collective_matmul)
    sends: list[int] = []  # bytes this device sends per micro-batch: activations forward, gradients backward
    if stage_axis is not None and K > 1:  # (interleaved over one device: its chunks hand over locally)
        chain = [u for g in groups for u in g]
        for c in chunk_ids:
            first, last_unit = chain.index(groups[c][0]), chain.index(groups[c][-1])
            if first > 0:
                sends.append(p.units[chain[first]].boundary)  # the gradient of the activation that entered
            if last_unit < len(chain) - 1:
                sends.append(p.units[chain[last_unit + 1]].boundary)  # the activation leaving
    transfer = sum(collective_time("collective-permute", b, (stage_axis,), mesh, hw).seconds
                   for b in sends) if stage_axis is not None else 0.0
    in_flight = sched.in_flight(device, K, microbatches) if stage_axis is not None else 1.0
    if stage_axis is None:  # the simulated peak of one micro-batch, plus the wider gradient accumulator
        accumulator = sum(accumulators(p.graph, p.inner, p.unit).values()) if p.accumulate else 0
        memory = dict(p.report.memory.breakdown)
        memory["gradients"] = memory.get("gradients", 0) + accumulator
        total = p.report.memory.peak_bytes + accumulator
    else:
        us = [p.units[n] for n in names]
        accumulator = sum(u.accumulator for u in us)
        memory = {"parameters": sum(u.parameters for u in us), "optimizer_state": sum(u.optimizer_state for u in us),
                  "gradients": sum(u.gradients for u in us) + accumulator,
                  "activations": int(in_flight * sum(u.saved for u in us)),
                  "recompute_workspace": max((u.workspace for u in us), default=0),
                  "working": max((u.working for u in us), default=0)}
        total = sum(memory.values())
    colls = _permutes(sends, stage_axis, sched, K, microbatches)
    for o in ops:
        for c in o.collectives:
            colls.append((c.kind, c.axes, c.bytes, 1 if once_per_step(c, p.classes) else microbatches))
    return StageReport(names, plain.step_s + transfer, transfer, last.step_s - plain.step_s, in_flight,
                       int(total), memory, tuple(colls), tuple(tuple(groups[c]) for c in chunk_ids),
                       compute_s=(microbatches - 1) * plain.compute_s + last.compute_s,
                       comm_s=(microbatches - 1) * plain.comm_s + last.comm_s + microbatches * transfer,
                       launch_s=(microbatches - 1) * plain.launch_s + last.launch_s)


def _with_outside(r: StageReport, p: _Priced, hw: Hardware, outside: Sequence[str], K: int, microbatches: int,
                  inner: Layout, stage_axis: str, mesh: Mesh) -> StageReport:
    """Stage report ``r`` with what its device does outside the stages (MaxText's pipeline): the ``outside``
    units (embedding, head, loss) on its ``M / K`` micro-batches' share of the batch (the batch split over the
    stage axis too), once per step, and the all-reduce over the stage axis of those units' parameter gradients
    (every device computes them on its share); their parameters, optimizer state and gradients on every device,
    and their saved activations for its share."""
    share = microbatches / K
    us = [p.units[u] for u in outside]
    run = share * sum(_unit_seconds(p, u, hw) for u in outside)
    g = p.graph
    params = [t for t in g.parameters if p.unit.get(next((c.name for c in g.consumers[t.name] if c.phase == "forward"),
                                                         ""), "") in outside]
    sync = sum(collective_time("all-reduce", inner.local_bytes(t), (stage_axis,), mesh, hw).seconds for t in params)
    memory = dict(r.memory)
    memory["parameters"] += sum(u.parameters for u in us)
    memory["optimizer_state"] += sum(u.optimizer_state for u in us)
    memory["gradients"] += sum(u.gradients + u.accumulator for u in us)
    memory["activations"] += int(share * sum(u.saved for u in us))
    memory["recompute_workspace"] = max([memory["recompute_workspace"], *(u.workspace for u in us)])
    memory["working"] = max([memory["working"], *(u.working for u in us)])
    colls = list(r.collectives) + [("all-reduce", (stage_axis,), inner.local_bytes(t), 1) for t in params]
    return dataclasses.replace(r, once_s=r.once_s + run + sync, memory_bytes=int(sum(memory.values())),
                               memory=memory, collectives=tuple(colls), compute_s=r.compute_s + run,
                               comm_s=r.comm_s + sync)


def _permutes(sends: list[int], stage_axis: str | None, sched: Schedule, K: int, microbatches: int
              ) -> list[tuple[str, tuple[str, ...], int, int]]:
    """The collective-permutes of a device per step, as the executor (``backend/pipeline.py``) runs them.

    GPipe and 1F1B: each of the device's transfers (``sends``: an activation to the next stage, a gradient to
    the previous one) once per step of the loop, ``ceil(steps)`` times (the time model charges them so; bubble
    steps move data too). Interleaved (``V > 1``; ``backend/tick_tables.py``): the loop is ``2(M V + K - 1)``
    ticks, each one chunk forward or backward per device, and after each tick one permute per ring direction:
    an activation goes right (from device ``K - 1`` to device 0 between chunks too) while a gradient goes left,
    and a device may receive both at once, so a static SPMD program runs both shifts every tick (zeros where
    the device has nothing to send); with ``K = 2`` both neighbours are the other device and one swap per tick
    carries either. The time model charges a device's own transfers, ``2V`` per micro-batch (``2V - 1`` on
    device 0 and ``K - 1``); for ``K > 2`` the executor moves twice that, half of it zeros, over both
    directions of the links at once."""
    if stage_axis is None or not sends:
        return []
    if sched.kind == "interleaved" and sched.virtual > 1:
        ticks = 2 * (microbatches * sched.virtual + K - 1)
        return [("collective-permute", (stage_axis,), max(sends), ticks)] * (1 if K == 2 else 2)
    loop_steps = math.ceil(sched.steps(K, microbatches))
    return [("collective-permute", (stage_axis,), b, loop_steps) for b in sends]


def _tied_sync(p: _Priced, groups: Sequence[Sequence[str]], devices: list[list[int]], inner: Layout,
               stage_axis: str, mesh: Mesh, hw: Hardware) -> float:
    """All-reduce over the stage axis of the gradients of parameters used on several devices (tied weights)."""
    g = p.graph
    device_of = {u: d for d, chunk_ids in enumerate(devices) for c in chunk_ids for u in groups[c]}
    seconds = 0.0
    for prm in g.parameters:
        users = {device_of[p.unit[c.name]] for c in g.consumers[prm.name] if c.phase == "forward"}
        if len(users) > 1:
            seconds += collective_time("all-reduce", inner.local_bytes(prm), (stage_axis,), mesh, hw).seconds
    return seconds


__all__ = ["SCHEDULE_KINDS", "MicrobatchStep", "PipelineReport", "Schedule", "StageReport", "microbatch_step",
           "pipeline_costdag", "price_pipeline", "speedup", "unit_of_ops"]
