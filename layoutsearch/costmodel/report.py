"""The cost of one training step under a layout: time, bytes, FLOPs and memory, by cause.

:func:`estimate` prices every op of the training graph (forward, backward,
optimizer; :mod:`layoutsearch.ir.training`) with the op rules of
:mod:`layoutsearch.costmodel.ops`, the collectives they cause with
:func:`~layoutsearch.costmodel.collectives.collective_time`, and the memory
with :mod:`layoutsearch.costmodel.memory`.

Model
-----
The training graph is derived under a precision policy
(:mod:`layoutsearch.ir.precision`; default ``mixed``). Per op (per device)::

    compute_s = max(flops / rate, hbm_bytes / (hbm_bandwidth * memory_efficiency))
                (rate: the matmul peak of the op's dtype times a shape-dependent
                efficiency for einsums, :mod:`layoutsearch.costmodel.compute`;
                hbm_bytes: per fusion group where the backend fuses,
                :mod:`layoutsearch.costmodel.fusion`)
    comm_s    = sum of the op's collectives' alpha-beta times

    launch_s  = Hardware.kernel_latency if the op starts a kernel (FusionPlan.kernels)

Totals: ``compute_s``, ``launch_s`` and ``comm_s`` are sums over ops (``kernels``: the kernels launched).
``step_s`` comes from the schedule of the step on a compute stream (busy for
``compute_s + launch_s``) and one stream per communicator
(:mod:`layoutsearch.costmodel.overlap`, ``overlap="auto"``, the default):
weight gathers are prefetched, gradient reductions run behind the backward
pass, the other collectives are on the critical path; ``comm_exposed_s`` is
``step_s - compute_s - launch_s``. On ``cpu-sim`` (XLA on CPU runs collectives in line)
``step_s = compute_s + comm_s``. A number ``overlap`` in [0, 1] instead uses
``step_s = busy + comm_s - overlap * min(busy, comm_s)``, ``busy = compute_s + launch_s``.
Recomputed ops (remat, flash attention's backward) are priced again (phase
``recompute``), communication included.

``flops_per_device``: FLOPs each device executes (every op, optimizer and
recomputation included). ``model_flops``: the global FLOPs of the forward and
backward ops, without recomputation or optimizer (the "6 · parameters ·
tokens" count of MFU, Chowdhery et al. 2022, appendix B, here counted op by
op, attention included). ``mfu = model_flops / (devices · peak_flops ·
step_s)``. ``bytes_per_axis``: bytes each device sends over each mesh axis's
links (ring decomposition; :class:`CollectiveCost.link_bytes`).

Every time and byte is kept with its cause (calculon style): per op, per
collective (the tensor and the dims that caused it), per phase, per kind of
collective and group of axes, and memory per category at the peak.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any

from layoutsearch.costmodel.collectives import CollectiveCost, collective_time
from layoutsearch.costmodel.compute import compute_seconds
from layoutsearch.costmodel.costreport import PHASES, CollectiveRecord, CostReport, OpReport
from layoutsearch.costmodel.fusion import FusionPlan, fusion_plan, resolve_attention
from layoutsearch.costmodel.memory import RematPlan, remat_plan, simulate
from layoutsearch.costmodel.ops import OpCost, op_flops
from layoutsearch.costmodel.overlap import Overlap, collective_classes, schedule
from layoutsearch.costmodel.render import MEMORY_MEANING as MEMORY_MEANING
from layoutsearch.costmodel.render import render_report
from layoutsearch.costmodel.step import checked, graph_cached, graph_ref, made, step_costs, training_step
from layoutsearch.errors import CostModelError, LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.remat import check_remat
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware

# -- estimation -----------------------------------------------------------------------------------------------------

def _check_links(hw: Hardware, layout: Layout) -> None:
    for axis, link in hw.links_for(layout.mesh).items():
        if layout.mesh.axis_size(axis) > 1 and not (link.bandwidth > 0 and link.efficiency > 0
                                                    and math.isfinite(link.bandwidth)):
            err = CostModelError(f"mesh axis {axis!r} has no bandwidth on hardware {hw.name!r} "
                                 f"(link bandwidth {link.bandwidth!r}, efficiency {link.efficiency!r}): "
                                 "set one, e.g. the hardware figure fast_link.bandwidth=100e9")
            err.hardware_figure = "fast_link.bandwidth=100e9"  # type: ignore[attr-defined]  # the CLI's --hw hint
            raise err


def estimate(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *,
             optimizer: Optimizer | str = "adam", precision: Precision | str = DEFAULT_PRECISION,
             remat: str = "none", attention: str = "auto", overlap: float | str = "auto") -> CostReport:
    """Predicted time, communication, FLOPs and memory of one training step.

    ``graph``: a forward graph (its training graph is derived with
    ``optimizer``; derivations are cached per graph object) or an already
    derived training graph (``optimizer`` and ``precision`` are then ignored).
    ``precision``: ``"mixed"`` (default), ``"bf16"`` or ``"fp32"``
    (:mod:`layoutsearch.ir.precision`). ``attention``: ``"standard"``
    (scores materialized), ``"flash"`` (a flash-attention kernel) or ``"auto"``
    (flash where the backend fuses kernels, i.e. GPU/TPU presets; standard on
    ``cpu-sim``); see :mod:`layoutsearch.costmodel.fusion`. ``layout`` is
    checked against the graph. ``hardware``: a preset name or a
    :class:`Hardware`. ``remat``: ``"none"``, ``"selective"``, ``"full"`` or
    ``"full:N"`` (see :mod:`layoutsearch.ir.remat`). ``overlap``: ``"auto"`` (the
    schedule of :mod:`layoutsearch.costmodel.overlap`) or a number in [0, 1],
    the fraction of the shorter of compute and communication hidden behind
    the other.

    Raises HardwareError (unknown hardware), LayoutError (a dim the model
    lacks, an indivisible split, an axis not in the mesh), CostModelError (a
    mesh axis without bandwidth, an unknown remat policy, a bad overlap).
    """
    hw = _hardware(hardware)
    check_remat(remat, CostModelError)
    if overlap != "auto" and (isinstance(overlap, bool) or not isinstance(overlap, int | float)
                              or not 0 <= overlap <= 1):
        raise CostModelError(f"overlap must be 'auto' or a number in [0, 1], got {overlap!r}")
    if not isinstance(layout, Layout):
        raise LayoutError(f"estimate needs a Layout (Layout.from_rules(mesh, rules)), got {type(layout).__name__}")
    g = training_step(graph, optimizer, precision)
    key = (id(g), layout, hw, Optimizer.of(optimizer), remat, attention, overlap)
    hit = _REPORTS.get(key)
    if hit is not None and hit[0]() is g:
        _REPORTS.move_to_end(key)
        return hit[1]
    rep = _estimate(g, layout, hw, optimizer, remat, attention, overlap)
    _remember(_REPORTS, key, g, rep)
    return rep


def _remember(cache: OrderedDict[tuple, tuple[weakref.ref[Graph], Any]], key: tuple, g: Graph, value: Any) -> None:
    """``value`` in LRU ``cache`` under ``key`` for graph ``g``, until ``g`` goes (a search's reports do not
    outlive its graphs) or :data:`_REPORTS_SIZE` newer entries push it out."""
    cache[key] = (graph_ref(g, cache, key), value)
    while len(cache) > _REPORTS_SIZE:
        cache.popitem(last=False)


_REPORTS: OrderedDict[tuple, tuple[weakref.ref[Graph], CostReport]] = OrderedDict()
_REPORTS_SIZE = 24
"""The last reports :func:`estimate` returned (a report is immutable): a search prices a plan again as an
accumulated step, a baseline or a runner-up, and gets the same report."""
_OP_COSTS: OrderedDict[tuple, tuple[weakref.ref[Graph], tuple[list[OpCost], list[OpCost]]]] = OrderedDict()
"""The last op costs :func:`estimate` computed (per graph, layout and the backend's behaviour): the same
layout priced under another remat policy or overlap (a search tries each) reuses them."""


def _estimate(g: Graph, layout: Layout, hw: Hardware, optimizer: Optimizer | str, remat: str, attention: str,
              overlap: float | str) -> CostReport:
    checked(layout, g)
    _check_links(hw, layout)
    mesh = layout.mesh
    attention = resolve_attention(attention, hw)
    fusion = fusion_plan(g, hw.fusion, attention)
    each, costs = _op_costs(g, layout, hw, attention, fusion)
    plan = remat_plan(g, remat)
    memory = simulate(g, layout, plan, each, combined_gradient_all_reduce=hw.combined_gradient_all_reduce,
                      on_chip=fusion.on_chip)
    ops = _op_reports(g, costs, _recomputations(g, plan, fusion, remat), _op_reporter(g, mesh, hw, fusion.kernels))
    model_flops = graph_cached(g, "model_flops", lambda: sum(op_flops(g, op) for op in g.ops
                                                               if op.phase != "optimizer"))

    compute_s = sum(o.compute_s for o in ops)
    launch_s = sum(o.launch_s for o in ops)
    comm_s = sum(c.seconds for o in ops for c in o.collectives)
    step_s, exposure = _step_seconds(g, ops, hw, overlap, compute_s + launch_s, comm_s)
    per_axis = _bytes_per_axis(ops, mesh)
    mfu = model_flops / (mesh.size * hw.peak_flops * step_s) if step_s > 0 else 0.0
    training = g.meta.get("training", {})
    opt = training.get("optimizer", {}).get("kind", Optimizer.of(optimizer).kind)
    return CostReport(
        model=g.name, mesh=mesh, devices=mesh.size, layout=layout.describe(), hardware=hw, optimizer=opt,
        precision=training.get("precision") or "as built", remat=remat, attention=attention,
        overlap=overlap if overlap == "auto" else float(overlap), compute_s=compute_s, comm_s=comm_s, step_s=step_s,
        launch_s=launch_s, kernels=sum(o.kernels for o in ops),
        flops_per_device=sum(o.flops for o in ops), model_flops=model_flops, mfu=mfu, bytes_per_axis=per_axis,
        memory=memory, ops=tuple(ops), exposure=exposure, op_costs=tuple(each))


def _op_costs(g: Graph, layout: Layout, hw: Hardware, attention: str,
              fusion: FusionPlan) -> tuple[list[OpCost], list[OpCost]]:
    """The op rules' cost of every op (each with all its collectives) and the same costs with the backend's
    fusion applied (what the step pays), from :data:`_OP_COSTS` when this layout was priced already."""
    key = (id(g), layout, hw.reduce_scatter, hw.float32_collectives, hw.regather_weights, hw.fusion, attention)
    hit = _OP_COSTS.get(key)
    if hit is not None and hit[0]() is g:
        _OP_COSTS.move_to_end(key)
        each, costs = hit[1]
    else:
        each, costs = step_costs(g, layout, hw.reduce_scatter, float32_collectives=hw.float32_collectives,
                                 regather_weights=hw.regather_weights)
        costs = [fusion.cost(op, c) for op, c in zip(g.ops, costs, strict=True)]
        _remember(_OP_COSTS, key, g, (each, costs))
    return each, costs


def _op_reporter(g: Graph, mesh: Mesh, hw: Hardware, kernels: frozenset[str]) -> Callable[..., OpReport]:
    """A function ``report(cost, phase, prefix="", launches=True)`` pricing one op execution: its compute time
    (roofline), the launch of its kernel when it starts one (``kernels``, and ``launches``: a flash-attention
    backward's recomputation runs inside that kernel) and its collectives (``prefix`` leads their causes); each
    collective of one kind, axes and size is priced once."""
    priced: dict[tuple[str, tuple[str, ...], int], tuple[CollectiveCost, tuple[str, ...]]] = {}
    timed: dict[tuple, tuple[float, str]] = {}

    def price(kind: str, axes: tuple[str, ...], nbytes: int) -> tuple[CollectiveCost, tuple[str, ...]]:
        """The collective's cost and its communicator (the axes of size > 1)."""
        key = (kind, axes, nbytes)
        c = priced.get(key)
        if c is None:
            communicator = tuple(a for a in axes if mesh.axis_size(a) > 1) or tuple(axes)
            c = priced[key] = (collective_time(kind, nbytes, axes, mesh, hw), communicator)
        return c

    def report(cost: OpCost, phase: str, prefix: str = "", launches: bool = True) -> OpReport:
        key = (cost.flops, cost.hbm_bytes, cost.matmul, cost.dtype, cost.matmul_dims)
        hit = timed.get(key)
        seconds, bound = hit if hit is not None else timed.setdefault(key, compute_seconds(cost, hw))
        colls = []
        for c in cost.comms:
            p, axes = price(c.kind, c.axes, c.bytes)
            colls.append(made(CollectiveRecord, cost.op, phase, c.kind, axes, c.bytes, p.seconds, c.tensor,
                              prefix + c.cause, p.link_bytes))
        n = int(launches and cost.op in kernels)
        return made(OpReport, cost.op, cost.kind, phase, cost.block, cost.flops, cost.hbm_bytes, cost.matmul,
                    seconds, bound, tuple(colls), g.op(cost.op).output, n, n * hw.kernel_latency)

    return report


def _recomputations(g: Graph, plan: RematPlan, fusion: FusionPlan,
                    remat: str) -> dict[int, list[tuple[str, str, bool]]]:
    """Schedule index -> the ops recomputed just before it, each with the cause of its recomputation (the remat
    policy's, or flash attention's backward, which recomputes q·k and the softmax) and whether it launches its
    kernels again (flash attention's recomputation runs inside its backward kernel)."""
    redo: dict[int, list[tuple[str, str, bool]]] = defaultdict(list)  # schedule index -> ops recomputed before it
    for name in plan.recomputed:
        redo[plan.points[g.op(name).block]].append((name, f"recompute ({remat} remat): ", True))  # type: ignore
    backward_ops: dict[str | None, list[int]] = defaultdict(list)  # block -> its backward ops (schedule order)
    if fusion.flash:
        for i, op in enumerate(g.ops):
            if op.phase == "backward":
                backward_ops[op.block].append(i)
    for core in fusion.flash:  # flash attention's backward recomputes q·k and the softmax
        first = next((i for i in backward_ops[core.block] if core.keeps(g.ops[i].output)), None)
        if first is not None:  # None: the core reaches no loss, so it has no backward pass to recompute for
            redo[first] += [(name, "recompute (flash attention backward): ", False) for name in core.recompute]
    return redo


def _op_reports(g: Graph, costs: list[OpCost], redo: dict[int, list[tuple[str, str, bool]]],
                report: Callable[..., OpReport]) -> list[OpReport]:
    """Every op execution of the step in schedule order, recomputations (``redo``) before the op needing them."""
    index = {op.name: i for i, op in enumerate(g.ops)}
    ops: list[OpReport] = []
    for i, (op, cost) in enumerate(zip(g.ops, costs, strict=True)):
        for name, why, launches in redo.get(i, ()):
            ops.append(report(costs[index[name]], "recompute", why, launches))
        ops.append(report(cost, op.phase))
    return ops


def _step_seconds(g: Graph, ops: list[OpReport], hw: Hardware, overlap: float | str, busy_s: float,
                  comm_s: float) -> tuple[float, Overlap | None]:
    """The step time and, with ``overlap="auto"``, the schedule that gives it (else the fixed-overlap formula
    over the compute stream's busy time ``busy_s``: compute and kernel launches)."""
    exposure = None
    if overlap == "auto":
        exposure = schedule(ops, collective_classes(g), hw.async_collectives, hw.collective_matmul)
        step_s = exposure.step_s
    else:
        step_s = busy_s + comm_s - overlap * min(busy_s, comm_s)
    return step_s, exposure


def _bytes_per_axis(ops: list[OpReport], mesh: Mesh) -> dict[str, float]:
    """Bytes each device sends over each mesh axis's links in the step."""
    per_axis = {a: 0.0 for a in mesh.names}
    for o in ops:
        for c in o.collectives:
            for a, b in c.link_bytes.items():
                per_axis[a] += b
    return per_axis


__all__ = ["PHASES", "CollectiveRecord", "CostReport", "OpReport", "estimate", "render_report"]
