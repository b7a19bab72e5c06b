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

Totals: ``compute_s`` and ``comm_s`` are sums over ops. ``step_s`` comes from
the schedule of the step on a compute stream and one stream per communicator
(:mod:`layoutsearch.costmodel.overlap`, ``overlap="auto"``, the default):
weight gathers are prefetched, gradient reductions run behind the backward
pass, the other collectives are on the critical path; ``comm_exposed_s`` is
``step_s - compute_s``. On ``cpu-sim`` (XLA on CPU runs collectives in line)
``step_s = compute_s + comm_s``. A number ``overlap`` in [0, 1] instead uses
``step_s = compute_s + comm_s - overlap * min(compute_s, comm_s)``.
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
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.costmodel.collectives import CollectiveCost, collective_time
from layoutsearch.costmodel.compute import compute_seconds
from layoutsearch.costmodel.fusion import fusion_plan, resolve_attention
from layoutsearch.costmodel.memory import REMAT_POLICIES, MemoryReport, remat_plan, simulate
from layoutsearch.costmodel.ops import OpCost, op_flops
from layoutsearch.costmodel.overlap import Overlap, collective_classes, schedule
from layoutsearch.costmodel.step import checked, graph_cached, step_costs, training_step
from layoutsearch.errors import CostModelError, LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import fold_block_numbers
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.mesh import hardware as _hardware
from layoutsearch.units import format_bytes, format_seconds

PHASES = ("forward", "backward", "optimizer", "recompute")

MEMORY_MEANING = {
    "parameters": "the weights the step computes with (their slices under the layout), all step",
    "optimizer_state": "what the optimizer keeps: master weights (mixed precision) and Adam's m and v, all step",
    "inputs": "the batch (token ids, labels), all step",
    "gradients": "parameter gradients produced so far, kept for the optimizer",
    "activations": "forward outputs kept for the backward pass (all of them, or block inputs with remat)",
    "activation_gradients": "gradients of activations, from their producer to their last use",
    "transient": "buffers of the collectives running at the peak op (gathered weights, partial sums)",
}
"""What each memory category holds (the rows of the memory table)."""
"""Phases of a step in a report (``recompute``: forward ops run again by remat)."""


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of the step: the op that causes it, what and why.

    ``bytes``: payload per device (conventions of
    :mod:`~layoutsearch.costmodel.collectives`); ``link_bytes``: bytes each
    device sends over each axis; ``cause``: the tensor and dims behind it."""

    op: str
    phase: str
    kind: str
    axes: tuple[str, ...]
    bytes: int
    seconds: float
    tensor: str
    cause: str
    link_bytes: dict[str, float] = field(hash=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "phase": self.phase, "kind": self.kind, "axes": list(self.axes), "bytes": self.bytes,
                "seconds": self.seconds, "tensor": self.tensor, "cause": self.cause}


@dataclass(frozen=True)
class OpReport:
    """Per-device cost of one op execution: ``bound`` is ``"flops"`` or ``"memory"``
    (which roofline term set ``compute_s``); ``collectives`` its communication."""

    op: str
    kind: str
    phase: str
    block: str | None
    flops: float
    hbm_bytes: float
    matmul: bool
    compute_s: float
    bound: str
    collectives: tuple[CollectiveRecord, ...]
    output: str = ""

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "phase": self.phase, "block": self.block, "flops": self.flops,
                "hbm_bytes": self.hbm_bytes, "matmul": self.matmul, "compute_s": self.compute_s,
                "bound": self.bound, "comm_s": self.comm_s}


@dataclass(frozen=True)
class CostReport:
    """Predicted cost of one training step of ``model`` under ``layout`` on ``hardware``.

    Times in seconds, bytes and FLOPs per device unless named global (see the
    module docstring for the model). ``ops``: one entry per executed op, in
    schedule order (recomputed ops appear again with phase ``recompute``).
    """

    model: str
    mesh: Mesh
    devices: int
    layout: str
    hardware: Hardware = field(repr=False)
    optimizer: str
    precision: str
    remat: str
    attention: str
    overlap: float | str
    compute_s: float
    comm_s: float
    step_s: float
    flops_per_device: float
    model_flops: float
    mfu: float
    bytes_per_axis: dict[str, float]
    memory: MemoryReport
    ops: tuple[OpReport, ...] = field(repr=False)
    exposure: Overlap | None = field(default=None, repr=False)
    op_costs: tuple[OpCost, ...] = field(default=(), repr=False, compare=False)
    """The op rules' cost of every op of the training graph, each with all its collectives (the input of the
    memory simulation), for callers that split the step further (pipeline stages)."""

    @property
    def comm_exposed_s(self) -> float:
        """Communication on the critical path: ``step_s - compute_s``."""
        return self.step_s - self.compute_s

    @property
    def comm_hidden_s(self) -> float:
        """Communication hidden behind compute."""
        return self.comm_s - self.comm_exposed_s

    @property
    def memory_bytes(self) -> int:
        """Peak memory per device."""
        return self.memory.peak_bytes

    @property
    def fits(self) -> bool:
        """Whether the peak fits in the device's usable memory (:attr:`Hardware.usable_bytes`)."""
        return self.memory.peak_bytes <= self.hardware.usable_bytes

    @property
    def collectives(self) -> list[CollectiveRecord]:
        """Every collective of the step, in schedule order."""
        return [c for op in self.ops for c in op.collectives]

    def bytes_by_kind(self) -> dict[str, int]:
        """Payload bytes per device per step, by collective kind."""
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[c.kind] += c.bytes
        return dict(sorted(out.items()))

    def by_phase(self) -> dict[str, dict[str, float]]:
        """Compute and communication seconds and FLOPs per device, by phase."""
        out = {p: {"compute_s": 0.0, "comm_s": 0.0, "flops": 0.0} for p in PHASES}
        for op in self.ops:
            d = out[op.phase]
            d["compute_s"] += op.compute_s
            d["comm_s"] += op.comm_s
            d["flops"] += op.flops
        return {p: d for p, d in out.items() if any(d.values())}

    def compute_by_bound(self) -> dict[str, float]:
        """Compute seconds split by what bounds them: matmul FLOPs, other FLOPs, HBM bandwidth."""
        out = {"matmul": 0.0, "other_flops": 0.0, "memory": 0.0}
        for op in self.ops:
            key = "memory" if op.bound == "memory" else "matmul" if op.matmul else "other_flops"
            out[key] += op.compute_s
        return out

    def comm_groups(self) -> list[dict[str, Any]]:
        """Collectives grouped by (kind, axes): count, bytes, seconds, and their causes
        (with layer numbers folded, ``layer.*``), largest time first."""
        groups: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        for c in self.collectives:
            g = groups.setdefault((c.kind, c.axes), {"kind": c.kind, "axes": list(c.axes), "count": 0, "bytes": 0,
                                                      "seconds": 0.0, "causes": defaultdict(lambda: [0, 0, 0.0])})
            g["count"] += 1
            g["bytes"] += c.bytes
            g["seconds"] += c.seconds
            cause = g["causes"][(c.phase, fold_block_numbers(c.cause))]
            cause[0] += 1
            cause[1] += c.bytes
            cause[2] += c.seconds
        out = []
        for g in sorted(groups.values(), key=lambda g: -g["seconds"]):
            causes = [{"phase": p, "cause": why, "count": n, "bytes": b, "seconds": s}
                      for (p, why), (n, b, s) in g["causes"].items()]
            out.append({**g, "causes": sorted(causes, key=lambda c: -c["seconds"])})
        return out

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        """JSON-ready report; ``ops=False`` leaves out the per-op and per-collective lists."""
        hw = self.hardware
        d: dict[str, Any] = {
            "model": self.model, "mesh": str(self.mesh), "devices": self.devices, "layout": self.layout,
            "optimizer": self.optimizer, "precision": self.precision, "remat": self.remat,
            "attention": self.attention, "overlap": self.overlap,
            "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
            "comm_exposed_s": self.comm_exposed_s, "comm_hidden_s": self.comm_hidden_s,
            "overlap_by_class": self.exposure.to_dict()["by_class"] if self.exposure else None,
            "memory_bytes": self.memory_bytes, "fits": self.fits,
            "flops_per_device": self.flops_per_device, "model_flops": self.model_flops, "mfu": self.mfu,
            "bytes_per_axis": dict(self.bytes_per_axis), "bytes_by_kind": self.bytes_by_kind(),
            "compute_by_bound_s": self.compute_by_bound(), "phases": self.by_phase(),
            "memory": self.memory.to_dict(), "comm_groups": self.comm_groups(),
            "hardware": {
                "name": hw.name, "peak_flops": hw.peak_flops, "matmul_efficiency": hw.matmul_efficiency,
                "hbm_bytes": hw.hbm_bytes, "usable_bytes": hw.usable_bytes, "hbm_bandwidth": hw.hbm_bandwidth,
                "memory_efficiency": hw.memory_efficiency, "reduce_scatter": hw.reduce_scatter,
                "links": {a: {"kind": "fast" if link == hw.fast_link else "slow", "bandwidth": link.bandwidth,
                              "efficiency": link.efficiency, "latency": link.latency}
                          for a, link in hw.links_for(self.mesh).items()},
                "source": hw.source,
            },
        }
        if ops:
            d["collectives"] = [c.to_dict() for c in self.collectives]
            d["ops"] = [o.to_dict() for o in self.ops]
        return d

    def render(self, top: int = 15) -> list[Any]:
        """Rich renderables (strings and tables) of the report; see :func:`render_report`."""
        return render_report(self.to_dict(), top=top)

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=160, record=True, file=_Null(), force_terminal=False, highlight=False,
                          markup=False, emoji=False)
        for item in self.render():
            console.print(item)
        return "\n".join(line.rstrip() for line in console.export_text().splitlines())


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


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
    :class:`Hardware`. ``remat``: ``"none"``, ``"selective"`` or ``"full"``
    (see :mod:`layoutsearch.costmodel.memory`). ``overlap``: ``"auto"`` (the
    schedule of :mod:`layoutsearch.costmodel.overlap`) or a number in [0, 1],
    the fraction of the shorter of compute and communication hidden behind
    the other.

    Raises HardwareError (unknown hardware), LayoutError (a dim the model
    lacks, an indivisible split, an axis not in the mesh), CostModelError (a
    mesh axis without bandwidth, an unknown remat policy, a bad overlap).
    """
    hw = _hardware(hardware)
    if remat not in REMAT_POLICIES:
        raise CostModelError(f"unknown remat policy {remat!r} (known: {', '.join(REMAT_POLICIES)})")
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
    _REPORTS[key] = (weakref.ref(g), rep)
    while len(_REPORTS) > _REPORTS_SIZE:
        _REPORTS.popitem(last=False)
    return rep


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
    key = (id(g), layout, hw.reduce_scatter, hw.float32_collectives, hw.regather_weights, hw.fusion, attention)
    hit = _OP_COSTS.get(key)
    if hit is not None and hit[0]() is g:
        _OP_COSTS.move_to_end(key)
        each, costs = hit[1]
    else:
        each, costs = step_costs(g, layout, hw.reduce_scatter, float32_collectives=hw.float32_collectives,
                                 regather_weights=hw.regather_weights)
        costs = [fusion.cost(op, c) for op, c in zip(g.ops, costs, strict=True)]
        _OP_COSTS[key] = (weakref.ref(g), (each, costs))
        while len(_OP_COSTS) > _REPORTS_SIZE:
            _OP_COSTS.popitem(last=False)
    plan = remat_plan(g, remat)
    memory = simulate(g, layout, plan, each, combined_gradient_all_reduce=hw.combined_gradient_all_reduce,
                      on_chip=fusion.on_chip)

    priced: dict[tuple[str, tuple[str, ...], int], CollectiveCost] = {}

    def price(kind: str, axes: tuple[str, ...], nbytes: int) -> CollectiveCost:
        key = (kind, axes, nbytes)
        c = priced.get(key)
        if c is None:
            c = priced[key] = collective_time(kind, nbytes, axes, mesh, hw)
        return c

    def report(cost: OpCost, phase: str, prefix: str = "") -> OpReport:
        seconds, bound = compute_seconds(cost, hw)
        colls = []
        for c in cost.comms:
            p = price(c.kind, c.axes, c.bytes)
            axes = tuple(a for a in c.axes if mesh.axis_size(a) > 1) or tuple(c.axes)  # one communicator
            colls.append(CollectiveRecord(cost.op, phase, c.kind, axes, c.bytes, p.seconds, c.tensor,
                                          prefix + c.cause, p.link_bytes))
        return OpReport(cost.op, cost.kind, phase, cost.block, cost.flops, cost.hbm_bytes, cost.matmul, seconds,
                        bound, tuple(colls), g.op(cost.op).output)

    index = {op.name: i for i, op in enumerate(g.ops)}
    redo: dict[int, list[tuple[str, str]]] = defaultdict(list)  # schedule index -> ops recomputed just before it
    for name in plan.recomputed:
        redo[plan.points[g.op(name).block]].append((name, f"recompute ({remat} remat): "))  # type: ignore[index]
    backward_ops: dict[str | None, list[int]] = defaultdict(list)  # block -> its backward ops (schedule order)
    if fusion.flash:
        for i, op in enumerate(g.ops):
            if op.phase == "backward":
                backward_ops[op.block].append(i)
    for core in fusion.flash:  # flash attention's backward recomputes q·k and the softmax
        first = next((i for i in backward_ops[core.block] if core.keeps(g.ops[i].output)), None)
        if first is not None:  # None: the core reaches no loss, so it has no backward pass to recompute for
            redo[first] += [(name, "recompute (flash attention backward): ") for name in core.recompute]
    ops: list[OpReport] = []
    for i, (op, cost) in enumerate(zip(g.ops, costs, strict=True)):
        for name, why in redo.get(i, ()):
            ops.append(report(costs[index[name]], "recompute", why))
        ops.append(report(cost, op.phase))
    model_flops = graph_cached(g, "model_flops", lambda: sum(op_flops(g, op) for op in g.ops
                                                               if op.phase != "optimizer"))

    compute_s = sum(o.compute_s for o in ops)
    comm_s = sum(c.seconds for o in ops for c in o.collectives)
    exposure = None
    if overlap == "auto":
        exposure = schedule(ops, collective_classes(g), hw.async_collectives, hw.collective_matmul)
        step_s = exposure.step_s
    else:
        step_s = compute_s + comm_s - overlap * min(compute_s, comm_s)
    per_axis = {a: 0.0 for a in mesh.names}
    for o in ops:
        for c in o.collectives:
            for a, b in c.link_bytes.items():
                per_axis[a] += b
    mfu = model_flops / (mesh.size * hw.peak_flops * step_s) if step_s > 0 else 0.0
    training = g.meta.get("training", {})
    opt = training.get("optimizer", {}).get("kind", Optimizer.of(optimizer).kind)
    return CostReport(
        model=g.name, mesh=mesh, devices=mesh.size, layout=layout.describe(), hardware=hw, optimizer=opt,
        precision=training.get("precision") or "as built", remat=remat, attention=attention,
        overlap=overlap if overlap == "auto" else float(overlap), compute_s=compute_s, comm_s=comm_s, step_s=step_s,
        flops_per_device=sum(o.flops for o in ops), model_flops=model_flops, mfu=mfu, bytes_per_axis=per_axis,
        memory=memory, ops=tuple(ops), exposure=exposure, op_costs=tuple(each))


# -- rendering ------------------------------------------------------------------------------------------------------

def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _table(columns: list[str], rows: list[list[Any]], title: str, right: set[int]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in right:
        t.columns[i].justify = "right"
    for r in rows:
        t.add_row(*(Text(str(c)) for c in r))
    return t


def render_report(d: dict[str, Any], top: int = 15) -> list[Any]:
    """Human rendering of :meth:`CostReport.to_dict` (strings and rich tables): totals,
    time by cause, memory at the peak, collectives grouped by kind and axes with
    their causes, and the ``top`` ops by time."""
    hw = d["hardware"]
    mem = d["memory"]
    out: list[Any] = [
        (f"{d['model']} on mesh {d['mesh']} ({d['devices']} devices, {hw['name']}), layout "
         f"{d['layout'] or '(replicated)'}; optimizer {d['optimizer']}, precision {d['precision']}, "
         f"attention {d['attention']}, remat {d['remat']}, overlap {d['overlap']}"),
    ]
    phases = d["phases"]
    if d["overlap"] == "auto":
        how = (f"compute + exposed communication ({format_seconds(d['comm_exposed_s'])} exposed, "
               f"{format_seconds(d['comm_hidden_s'])} hidden behind compute)")
        if d["overlap_by_class"]:
            how += "; " + ", ".join(f"{k} collectives {format_seconds(v['seconds'])} ({format_seconds(v['exposed_s'])} "
                                    "exposed)" for k, v in d["overlap_by_class"].items() if v["seconds"])
    else:
        how = "compute + communication" + (f" - {d['overlap']:g} x overlap" if d["overlap"] else "")
    rows = [["step", format_seconds(d["step_s"]), how],
            ["compute", format_seconds(d["compute_s"]), ", ".join(f"{k} {format_seconds(v)}" for k, v in d["compute_by_bound_s"].items())],
            ["communication", format_seconds(d["comm_s"]), ", ".join(f"{k} {format_bytes(v)}" for k, v in d["bytes_by_kind"].items())
             or "none"]]
    rows += [[f"  {p}", format_seconds(v["compute_s"] + v["comm_s"]),
              f"compute {format_seconds(v['compute_s'])}, comm {format_seconds(v['comm_s'])}, {_si(v['flops'], 'FLOP')}"]
             for p, v in phases.items()]
    rows += [["FLOPs per device", _si(d["flops_per_device"], "FLOP"),
              f"model FLOPs {_si(d['model_flops'], 'FLOP')} (global, forward + backward)"],
             ["MFU", f"{100 * d['mfu']:.1f}%",
              f"peak {_si(hw['peak_flops'], 'FLOP/s')}, matmul efficiency {hw['matmul_efficiency']:g}"],
             ["peak memory", format_bytes(d["memory_bytes"]),
              (f"{'fits' if d['fits'] else 'DOES NOT FIT'} in {format_bytes(hw['usable_bytes'])} usable of "
               f"{format_bytes(hw['hbm_bytes'])} HBM; "
               f"at op {mem['peak_op']} ({mem['peak_phase']})")]]
    rows += [["bytes sent", format_bytes(sum(d["bytes_per_axis"].values())),
              ", ".join(f"{a}: {format_bytes(b)}" for a, b in d["bytes_per_axis"].items())]]
    out.append(_table(["total", "value", "breakdown"], rows, "step (per device)", {1}))
    out.append(_table(["memory at peak", "bytes", "what"],
                      [[k, format_bytes(v), MEMORY_MEANING.get(k, "")] for k, v in mem["breakdown"].items() if v],
                      f"memory per device at the peak (op {mem['peak_op']}, {mem['peak_phase']}; precision "
                      f"{d['precision']})", {1}))
    out.append(f"remat {mem['remat']}: {mem['recomputed_ops']} forward ops recomputed in the backward pass")
    rows = []
    for g in d["comm_groups"]:
        rows.append([g["kind"], "+".join(g["axes"]), g["count"], format_bytes(g["bytes"]), format_seconds(g["seconds"]), ""])
        for c in g["causes"][:5]:
            rows.append(["", "", c["count"], format_bytes(c["bytes"]), format_seconds(c["seconds"]), f"{c['phase']}: {c['cause']}"])
        if len(g["causes"]) > 5:
            rows.append(["", "", "", "", "", f"... {len(g['causes']) - 5} more causes"])
    if rows:
        out.append(_table(["collective", "axes", "count", "bytes", "time", "cause"], rows,
                          "collectives by kind and axes (bytes per device per step)", {2, 3, 4}))
    if "ops" in d:
        ranked = sorted(d["ops"], key=lambda o: -(o["compute_s"] + o["comm_s"]))[:top]
        rows = [[o["op"], o["kind"], o["phase"], format_seconds(o["compute_s"] + o["comm_s"]), format_seconds(o["compute_s"]),
                 o["bound"], format_seconds(o["comm_s"]), _si(o["flops"], "FLOP")] for o in ranked]
        out.append(_table(["op", "kind", "phase", "time", "compute", "bound", "comm", "FLOPs"], rows,
                          f"top {len(rows)} ops by time", {3, 4, 6, 7}))
    return out


__all__ = ["PHASES", "CollectiveRecord", "CostReport", "OpReport", "estimate", "render_report"]
