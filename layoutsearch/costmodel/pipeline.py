"""Cost of a GPipe pipeline: K stages over one mesh axis, M micro-batches.

A pipelined plan puts the model's repeated blocks (``layer.0 .. layer.L-1``)
into K contiguous stages over a *stage axis* of the mesh; each stage lays out
its ops over the remaining axes with an inner layout. The batch is split into
M micro-batches that flow through the stages (Huang et al., "GPipe", NeurIPS
2019).

Model (per device, one training step)::

    t_k    = forward + backward (+ recompute, with remat) time of stage k's ops
             for ONE micro-batch (the inner cost model on the graph resized to
             batch / M), plus the point-to-point transfers of the activations
             and their gradients crossing its boundaries (collective-permute
             over the stage axis)
    step_s = (M + K - 1) * max_k t_k  +  max_k once_k

``once_k``: what a stage does once per step, not per micro-batch, because
gradients are accumulated over micro-batches outside the loop: the gradient
synchronization collectives (all-reduce / reduce-scatter of parameter
gradients over the inner axes), the optimizer update, and for a parameter
used on several stages (tied embeddings) an all-reduce of its gradient over
the stage axis. For identical stages the speed-up over one stage is
``K * M / (M + K - 1)``; the idle fraction (bubble) is ``(K - 1) / (M + K - 1)``.

Memory of stage k: parameters, gradients and optimizer state of its ops
(by the inner layout), plus for every micro-batch in flight (GPipe keeps all
M until the backward pass) the activations saved for the backward pass —
with remat only the tensors entering each block, plus one block's internal
activations while it is recomputed.

Units: the ops of each top-level block form one unit; ops outside blocks form
``pre`` (forward ops no block op precedes, e.g. the embedding, and their
backward) and ``post`` (the head and loss). The stage partition is found on
the chain ``pre, layer.0, ..., post`` as a :class:`~layoutsearch.costdag.CostDAG`
with :func:`~layoutsearch.solvers.partition.partition` (exact DP), or given.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.costdag import CostDAG, Edge, Node
from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.report import CostReport, estimate
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import CostModelError, PartitionError
from layoutsearch.gantt import bubble_fraction, render_gantt
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware

PRE, POST = "pre", "post"


def unit_of_ops(g: Graph) -> dict[str, str]:
    """Op name -> pipeline unit (``pre``, a top-level block name, ``post``) of a training graph."""
    unit: dict[str, str] = {}
    block_op = {op.name: op.block.split("/")[0] for op in g.ops if op.block}
    after_block: dict[str, bool] = {}
    for op in g.ops:  # forward: an unblocked op after any block op is post
        if op.phase != "forward":
            continue
        prods = [g.producer(t) for t in op.inputs]
        after_block[op.name] = any(p is not None and (p.name in block_op or after_block.get(p.name, False))
                                   for p in prods)
    feeds_block_bwd: dict[str, bool] = {}
    for op in reversed(g.ops):  # backward: an unblocked op some block's backward needs is post
        if op.phase != "backward":
            continue
        feeds_block_bwd[op.name] = any(c.phase == "backward" and (c.name in block_op or feeds_block_bwd.get(c.name))
                                       for c in g.consumers[op.output])
    for op in g.ops:
        if op.name in block_op:
            unit[op.name] = block_op[op.name]
        elif op.phase == "forward":
            unit[op.name] = POST if after_block[op.name] else PRE
        elif op.phase == "backward":
            unit[op.name] = POST if feeds_block_bwd[op.name] else PRE
    for op in g.ops:  # optimizer: follows the gradient it applies, or the parameter's first user
        if op.phase == "optimizer" and op.name not in unit:
            unit[op.name] = _optimizer_unit(g, op, unit)
    return unit


def _optimizer_unit(g: Graph, op: O.Op, unit: dict[str, str]) -> str:
    for t in op.inputs:
        p = g.producer(t)
        if p is not None and p.name in unit and p.phase == "backward":
            return unit[p.name]
    for t in op.inputs:
        users = [c for c in g.consumers[t] if c.phase == "forward"]
        if users:
            return unit[users[0].name]
    for t in op.inputs:
        p = g.producer(t)
        if p is not None and p.name in unit:
            return unit[p.name]
    return PRE


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage: its units and what it costs per device."""

    units: tuple[str, ...]
    microbatch_s: float       # forward + backward (+ recompute) of one micro-batch, transfers included
    transfer_s: float         # the point-to-point part of microbatch_s
    once_s: float             # gradient synchronization + optimizer, once per step
    memory_bytes: int
    static_bytes: int         # parameters, gradients, optimizer state
    activation_bytes: int     # activations kept for all micro-batches in flight (+ remat workspace)
    collectives: tuple[tuple[str, tuple[str, ...], int, int], ...] = ()  # (kind, axes, bytes, count) per step

    def to_dict(self) -> dict[str, Any]:
        colls = [{"kind": k, "axes": list(a), "bytes": b, "count": c} for k, a, b, c in self.collectives]
        return dict(self.__dict__, units=list(self.units), collectives=colls)


@dataclass(frozen=True)
class PipelineReport:
    """Predicted cost of a pipelined training step (see the module docstring)."""

    model: str
    mesh: Mesh
    stage_axis: str
    microbatches: int
    remat: bool
    inner_layout: str
    stages: tuple[StageReport, ...]
    step_s: float
    partition_method: str
    partition_optimal: bool
    inner: CostReport = field(repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.num_stages, self.microbatches)

    @property
    def pipeline_s(self) -> float:
        """The micro-batch loop: ``(M + K - 1) * max_k t_k``."""
        return (self.microbatches + self.num_stages - 1) * max(s.microbatch_s for s in self.stages)

    @property
    def memory_bytes(self) -> int:
        """Peak memory per device: the largest stage's."""
        return max(s.memory_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.inner.hardware.hbm_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "mesh": str(self.mesh), "stage_axis": self.stage_axis,
            "stages": self.num_stages, "microbatches": self.microbatches, "remat": self.remat,
            "inner_layout": self.inner_layout, "step_s": self.step_s, "pipeline_s": self.pipeline_s,
            "memory_bytes": self.memory_bytes,
            "bubble_fraction": self.bubble_fraction, "fits": self.fits,
            "partition": {"method": self.partition_method, "optimal": self.partition_optimal},
            "stage_costs": [s.to_dict() for s in self.stages],
        }

    def gantt(self) -> str:
        """The GPipe schedule as a text Gantt chart, with each stage's busy fraction."""
        labels = [f"stage {k} ({s.units[0]}..{s.units[-1]})" for k, s in enumerate(self.stages)]
        return render_gantt(self.num_stages, self.microbatches, labels=labels,
                            times=[s.microbatch_s for s in self.stages])


@dataclass
class _Unit:
    compute_s: float = 0.0
    once_s: float = 0.0
    static: int = 0
    saved: int = 0          # activations saved for backward per micro-batch (no remat)
    boundary: int = 0       # bytes of the tensors entering the unit per micro-batch (kept with remat)
    sync: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)  # once-per-step collectives


def _units(g: Graph, rep: CostReport, layout: Layout, unit: dict[str, str]) -> dict[str, _Unit]:
    """Per-unit costs of the micro-batch training graph ``g`` under ``layout``."""
    grads = {f"grad/{p.name}" for p in g.parameters}
    units: dict[str, _Unit] = defaultdict(_Unit)
    for r in rep.ops:
        u = units[unit[r.op]]
        if r.phase == "optimizer":
            u.once_s += r.seconds
            continue
        sync = [c for c in r.collectives if c.tensor in grads]
        u.sync += [(c.kind, c.axes, c.bytes) for c in sync]
        u.compute_s += r.seconds - sum(c.seconds for c in sync)
        u.once_s += sum(c.seconds for c in sync)
    lb = layout.local_bytes
    counted: set[tuple[str, str]] = set()
    for op in g.ops:
        u = unit[op.name]
        for t in (*op.inputs, op.output):
            tensor = g.tensors[t]
            fed_state = tensor.role in ("parameter", "optimizer_state") and g.producer(t) is None
            if (fed_state or t in grads) and (u, t) not in counted:
                counted.add((u, t))
                units[u].static += lb(tensor)
        if op.phase != "forward":
            continue
        out = g.tensors[op.output]
        if any(c.phase == "backward" for c in g.consumers[op.output]):
            units[u].saved += lb(out)
        for t in op.inputs:
            p = g.producer(t)
            entering = (p is None and g.tensors[t].role == "input") or (p is not None and unit[p.name] != u)
            if entering and (u, "in:" + t) not in counted:
                counted.add((u, "in:" + t))
                units[u].boundary += lb(g.tensors[t])
    return units


def _chain(g: Graph, unit: dict[str, str]) -> list[str]:
    blocks = list(dict.fromkeys(unit[op.name] for op in g.ops if op.phase == "forward"))
    mid = [b for b in blocks if b not in (PRE, POST)]
    return ([PRE] if PRE in blocks else []) + mid + ([POST] if POST in blocks else [])


def pipeline_costdag(graph: Graph, inner: Layout, stage_axis: str, hardware: Hardware | str, *,
                     microbatches: int, remat: bool = False, optimizer: Optimizer | str = "adam",
                     precision: Precision | str = DEFAULT_PRECISION, batch_dim: str = "batch",
                     stage_link_mesh: Mesh | None = None) -> tuple[CostDAG, CostReport, dict]:
    """The chain of pipeline units as a cost DAG, priced by the inner cost model on one micro-batch.

    Returns the DAG, the inner report on the micro-batch graph and per-unit
    extras (once-per-step seconds, remat workspace)."""
    hw = _hardware(hardware)
    fwd = graph
    B = graph.dims.get(batch_dim)
    if B is None:
        raise CostModelError(f"model {graph.name!r} has no {batch_dim!r} dim to split into micro-batches")
    if microbatches < 1 or B % microbatches:
        raise CostModelError(f"{microbatches} micro-batches do not divide {batch_dim}={B}")
    mb_graph = training_step(fwd.with_sizes({batch_dim: B // microbatches}), optimizer, precision)
    rep = estimate(mb_graph, inner, hw, remat="full" if remat else "none")
    unit = unit_of_ops(mb_graph)
    units = _units(mb_graph, rep, inner, unit)
    chain = _chain(mb_graph, unit)
    if len(chain) < 2:
        raise CostModelError(f"model {graph.name!r} has no repeated blocks to pipeline (ops need block tags)")
    link_mesh = stage_link_mesh or Mesh(((stage_axis, 2),) + inner.mesh.axes)
    nodes, edges = [], []
    for u in chain:
        d = units[u]
        act = d.boundary if remat else d.saved
        work = d.saved if remat else 0
        nodes.append(Node(u, d.compute_s, d.static + work, 0, act))
    for a, b in itertools.pairwise(chain):
        nbytes = units[b].boundary
        t = collective_time("collective-permute", nbytes, (stage_axis,), link_mesh, hw).seconds
        # Each loop step a stage sends one tensor per neighbour: the activation forward, its gradient
        # backward. Paid on both sides of the cut, the two cuts of a stage add up to its two permutes.
        edges.append(Edge(a, b, t, nbytes))
    dag = CostDAG(tuple(nodes), tuple(edges), name=graph.name)
    return dag, rep, {u: units[u] for u in chain}


def estimate_pipeline(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *, stage_axis: str,
                      microbatches: int, remat: bool = False, optimizer: Optimizer | str = "adam",
                      precision: Precision | str = DEFAULT_PRECISION, stages: Sequence[Sequence[str]] | None = None,
                      memory_limit: float | None = None, batch_dim: str = "batch") -> PipelineReport:
    """Predicted cost of a GPipe step with stages over ``stage_axis`` of ``layout.mesh``.

    ``layout``'s rules lay out each stage over the other axes (rules naming
    the stage axis are dropped). ``stages``: the units of each stage (see
    :func:`unit_of_ops`); by default the partition minimizing the GPipe step
    time, exactly, under ``memory_limit``."""
    from layoutsearch.solvers.partition import partition, stage_loads

    hw = _hardware(hardware)
    mesh = layout.mesh
    K = mesh.axis_size(stage_axis)
    inner_mesh = Mesh(tuple((a, s) for a, s in mesh.axes if a != stage_axis))
    inner = Layout(inner_mesh, tuple((d, ax) for d, ax in layout.rules if stage_axis not in ax))
    dag, rep, units = pipeline_costdag(graph, inner, stage_axis, hw, microbatches=microbatches, remat=remat,
                                       optimizer=optimizer, precision=precision, batch_dim=batch_dim,
                                       stage_link_mesh=mesh)
    if K > len(dag.nodes):
        raise CostModelError(f"cannot split {len(dag.nodes)} pipeline units of {graph.name!r} into {K} stages")
    if stages is None:
        part = partition(dag, K, objective="gpipe", microbatches=microbatches, memory_limit=memory_limit)
        groups, method, optimal = part.stages, part.method, part.optimal
    else:
        groups = tuple(tuple(s) for s in stages)
        if len(groups) != K:
            raise PartitionError(f"{len(groups)} stages given for a stage axis of size {K}")
        method, optimal = "given", False
    loads = stage_loads(dag, groups, "gpipe", microbatches)
    steps = microbatches + K - 1
    cut = [units[groups[k + 1][0]].boundary for k in range(K - 1)]  # bytes entering stage k+1
    reports = []
    for k, names in enumerate(groups):
        us = [units[n] for n in names]
        transfer = loads.loads[k] - sum(u.compute_s for u in us)
        static = sum(u.static for u in us)
        if remat:
            act = microbatches * sum(u.boundary for u in us) + max(u.saved for u in us)
        else:
            act = microbatches * sum(u.saved for u in us)
        sends = [cut[k - 1]] if k > 0 else []  # gradients to the previous stage
        sends += [cut[k]] if k < K - 1 else []  # activations to the next stage
        colls = tuple(("collective-permute", (stage_axis,), b, steps) for b in sends)
        colls += tuple((kind, axes, b, 1) for u in us for kind, axes, b in u.sync)
        reports.append(StageReport(tuple(names), loads.loads[k], transfer, sum(u.once_s for u in us),
                                   static + act, static, act, colls))
    shared = _shared_parameter_sync(training_step(graph, optimizer, precision), groups, inner, stage_axis, mesh, hw)
    step = (microbatches + K - 1) * max(s.microbatch_s for s in reports) + max(s.once_s for s in reports) + shared
    return PipelineReport(graph.name, mesh, stage_axis, microbatches, remat, inner.describe(), tuple(reports), step,
                          method, optimal, rep)


def _shared_parameter_sync(graph: Graph, groups: Sequence[Sequence[str]], inner: Layout, stage_axis: str,
                           mesh: Mesh, hw: Hardware) -> float:
    """All-reduce over the stage axis of the gradients of parameters used on several stages (tied weights);
    ``graph`` is the training graph."""
    unit = unit_of_ops(graph)
    stage_of = {u: k for k, us in enumerate(groups) for u in us}
    seconds = 0.0
    for p in graph.parameters:
        users = {stage_of[unit[c.name]] for c in graph.consumers[p.name] if c.phase == "forward"}
        if len(users) > 1:
            seconds += collective_time("all-reduce", inner.local_bytes(p), (stage_axis,), mesh, hw).seconds
    return seconds


def speedup(stages: int, microbatches: int) -> float:
    """GPipe speed-up of K identical stages over one: ``K * M / (M + K - 1)``."""
    return stages * microbatches / (microbatches + stages - 1)


__all__ = ["PipelineReport", "StageReport", "estimate_pipeline", "pipeline_costdag", "speedup", "unit_of_ops",
]
