"""Pricing layouts for the spaces: :class:`Pricer` (cached seconds of op costs and collectives) and
:func:`evaluate` (a layout priced op by op, what a space's objective and memory rows must reproduce).

Prices come from the cost model (:class:`~layoutsearch.costmodel.ops.OpRules`,
:func:`~layoutsearch.costmodel.collectives.collective_time`, the fusion plan
and the roofline); a bounding pricer gives vectors instead, whose largest entry
is a lower bound of the overlapped step (:meth:`Pricer.bound`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.compute import compute_seconds
from layoutsearch.costmodel.fusion import fusion_plan, resolve_attention
from layoutsearch.costmodel.memory import remat_plan, simulate
from layoutsearch.costmodel.ops import OpCost, OpRules, dedupe_shared
from layoutsearch.costmodel.overlap import collective_class, collective_classes, once_per_step
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import Hardware, Mesh


@dataclass(frozen=True)
class _OpView:
    """What :func:`~layoutsearch.costmodel.overlap.classify` reads of an op."""

    matmul: bool
    output: str


class Pricer:
    """Seconds of op costs and collectives on one mesh and hardware (cached)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, attention: str = "auto") -> None:
        self.graph, self.mesh, self.hw = graph, mesh, hw
        self.rules = OpRules(graph, mesh, hw.reduce_scatter, hw.float32_collectives, hw.regather_weights)
        self.fusion = fusion_plan(graph, hw.fusion, resolve_attention(attention, hw))
        """HBM traffic per op and on-chip tensors (:mod:`layoutsearch.costmodel.fusion`)."""
        self.flash_recomputed = frozenset(n for core in self.fusion.flash for n in core.recompute)
        """Forward ops a flash-attention backward pass runs again."""
        self._coll: dict[tuple, float] = {}
        self.cache: dict[tuple, Any] = {}
        """Prices of op and reshard variants, shared by the spaces built with this pricer."""
        self.counted = "all"
        """What the prices are: ``all`` (seconds: compute and every collective), or ``bound`` (vectors whose
        largest entry is a lower bound of the overlapped step, see :meth:`bound`)."""
        self.classes = collective_classes(graph)
        self.optimizer = True
        """Whether the optimizer's ops are priced (False: a space built with this pricer prices one micro-batch's
        forward and backward passes, see :meth:`bound`)."""
        axes = [a for a, _ in mesh.axes]
        streams = [p for k in range(1, len(axes) + 1) for p in itertools.permutations(axes, k)]
        self.streams = {s: 1 + i for i, s in enumerate(streams)}
        """Communicator (a tuple of mesh axes) -> its entry in a bound vector (see :meth:`bound`)."""

    def bound(self, optimizer: bool = True, serial: bool = False) -> Pricer:
        """A copy (sharing this pricer's caches) whose prices are vectors: entry 0 the compute and the critical
        collectives, entry ``streams[axes]`` the collectives over the communicator ``axes``. Summed over a
        step, each entry is a lower bound of the step that :mod:`~layoutsearch.costmodel.overlap` schedules:
        compute runs on one stream and a critical collective holds it for at least its time, a matmul at
        least as long as the decomposed collectives it runs beside it (:meth:`decomposed`; the spaces' hold
        items); each communicator runs its collectives one at a time, and the step ends after the last. So is
        the largest entry. ``serial``: seconds instead (compute and every collective, as this pricer's), the step itself
        where no collective overlaps compute (overlap 0, or hardware without asynchronous collectives).
        ``optimizer=False`` leaves out the optimizer's ops and the gradient all-reduces that run once per step
        (:func:`~layoutsearch.costmodel.overlap.once_per_step`): a lower bound of one micro-batch's share of a
        gradient-accumulation step, which runs them once for all micro-batches."""
        other = copy.copy(self)
        other.counted = "all" if serial else "bound"
        other.optimizer = optimizer
        return other

    def critical(self, c: Any, op_name: str | None = None, matmul: bool = False) -> bool:
        """Whether the step always waits for collective ``c``: of op ``op_name``, a matmul or not, or without
        ``op_name`` of a reshard of an operand of an op that is a matmul (``matmul``) or not; XLA on TPU runs
        an all-gather of a matmul's operand beside the matmul (``decomposed``)."""
        hw = self.hw
        view = _OpView(matmul, self.graph.op(op_name).output if op_name is not None else "")  # "": no tensor
        return collective_class(c, self.classes, view, hw.async_collectives, hw.collective_matmul) == "critical"

    def collectives(self, comms: Iterable[Any], op_name: str | None = None, matmul: bool = False,
                    tensor: str | None = None) -> float | np.ndarray:
        """The price of collectives ``comms`` (of op ``op_name``, or of a reshard of ``tensor`` for an op that
        is a matmul or not, ``matmul``): seconds, or a bound vector."""
        if tensor is not None and (self.counted == "bound" or not self.optimizer):  # (classified by tensor)
            comms = [dataclasses.replace(x, tensor=tensor) for x in comms]
        if not self.optimizer:  # one micro-batch's share: the gradient all-reduces run once per step
            comms = [x for x in comms if not once_per_step(x, self.classes)]
        if self.counted == "all":
            return sum(self.collective(x.kind, x.bytes, x.axes) for x in comms)
        v = np.zeros(1 + len(self.streams))
        for x in comms:
            t = self.collective(x.kind, x.bytes, x.axes)
            if self.critical(x, op_name, matmul):
                v[0] += t
            v[self.streams[x.axes]] += t
        return v

    def collective(self, kind: str, nbytes: int, axes: Axes) -> float:
        key = (kind, nbytes, axes)
        if key not in self._coll:
            self._coll[key] = collective_time(kind, nbytes, axes, self.mesh, self.hw).seconds
        return self._coll[key]

    def compute(self, c: OpCost, op: O.Op | None = None) -> float | np.ndarray:
        """Roofline time of an op (:func:`~layoutsearch.costmodel.compute.compute_seconds`); ``c`` may be
        priced for another op of the same shapes: ``op`` gives the HBM traffic of the fusion plan."""
        return self.on_compute_stream(compute_seconds(self.fusion.cost(op, c) if op is not None else c, self.hw)[0])

    def launch(self, op: O.Op) -> float | np.ndarray:
        """The kernel launch of one execution of ``op`` (:attr:`~layoutsearch.mesh.Hardware.kernel_latency` if
        it starts a kernel, ``FusionPlan.kernels``; else 0), on the compute stream: seconds, or a bound vector
        (entry 0). It does not depend on the layout; a flash-attention backward's recomputation launches none."""
        return self.on_compute_stream(self.hw.kernel_latency if op.name in self.fusion.kernels else 0.0)

    def on_compute_stream(self, seconds: float) -> float | np.ndarray:
        """``seconds`` the compute stream is held: as is, or as a bound vector (entry 0, no communicator's)."""
        if self.counted == "all":
            return seconds
        v = np.zeros(1 + len(self.streams))
        v[0] = seconds
        return v

    def comm(self, c: OpCost) -> float | np.ndarray:
        return self.collectives(c.comms, c.op, c.matmul)

    def seconds(self, c: OpCost, op: O.Op | None = None) -> float | np.ndarray:
        return self.compute(c, op) + self.comm(c)

    def decomposed(self, comms: Iterable[Any], op_name: str, tensor: str | None = None) -> dict[Axes, float]:
        """Per communicator, the seconds of those of ``comms`` (of matmul ``op_name``, or of a reshard of its
        operand ``tensor``) that run as ring steps beside the matmul (``Hardware.collective_matmul``): the
        matmul ends when its compute and each of them has (:func:`~layoutsearch.costmodel.overlap.schedule`)."""
        hw = self.hw
        per: dict[Axes, float] = {}
        if not (hw.collective_matmul and hw.async_collectives):
            return per
        view = _OpView(True, self.graph.op(op_name).output)
        for x in comms:
            if tensor is not None:
                x = dataclasses.replace(x, tensor=tensor)
            if collective_class(x, self.classes, view, True, True) == "decomposed":
                per[x.axes] = per.get(x.axes, 0.0) + self.collective(x.kind, x.bytes, x.axes)
        return per


def evaluate(graph: Graph, mesh: Mesh, hw: Hardware, iteration: dict[str, DimLayout],
             storage: dict[str, DimLayout], remat: str = "none") -> tuple[float, float, int]:
    """(compute s, communication s, peak memory bytes) of training graph ``graph`` computed op by op with
    ``iteration`` and every tensor stored as ``storage``, by the cost model's own rules (collectives shared
    by several ops counted once; recomputed ops priced again; kernel launches counted with the compute, a
    remat recomputation launching again, a flash-attention backward's not; memory by its live-set
    simulation): what a space's objective and memory rows must reproduce."""
    p = Pricer(graph, mesh, hw)
    t = graph.tensors
    each = [p.rules.cost(op, iteration.get(op.name, {}), [storage[i] for i in op.inputs], storage[op.output])
            for op in graph.ops]
    costs = [p.fusion.cost(op, c) for op, c in zip(graph.ops, dedupe_shared(each), strict=True)]
    plan = remat_plan(graph, remat)
    index = {op.name: i for i, op in enumerate(graph.ops)}
    costs += [costs[index[name]] for name in (*plan.recomputed, *p.flash_recomputed)]
    layout = Layout(mesh, (), tuple((n, tuple(storage[n].items())) for n in t if storage[n]))
    mem = simulate(graph, layout, plan, each, on_chip=p.fusion.on_chip,
                   combined_gradient_all_reduce=getattr(hw, "combined_gradient_all_reduce", False))
    launches = sum(p.launch(graph.ops[index[name]]) for name in (*index, *plan.recomputed))
    return sum(p.compute(c) for c in costs) + launches, sum(p.comm(c) for c in costs), mem.peak_bytes
