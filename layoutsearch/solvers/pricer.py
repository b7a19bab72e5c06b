"""Pricing layouts for the spaces: :class:`Pricer` (cached seconds of op costs and collectives) and
:func:`evaluate` (a layout priced op by op, what a space's objective and memory rows must reproduce).

Prices come from the cost model (:class:`~layoutsearch.costmodel.ops.OpRules`,
:func:`~layoutsearch.costmodel.collectives.collective_time`, the fusion plan
and the roofline); a pricer may count only the critical collectives, a lower
bound of the overlapped step (:meth:`Pricer.bound`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.compute import compute_seconds
from layoutsearch.costmodel.fusion import fusion_plan, resolve_attention
from layoutsearch.costmodel.memory import remat_plan, simulate
from layoutsearch.costmodel.ops import OpCost, OpRules, dedupe_shared
from layoutsearch.costmodel.overlap import classify, collective_classes
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
        """Which collectives the prices count: ``all``, or ``critical`` (those the step always waits for: a
        lower bound of the overlapped step, see :meth:`bound`)."""
        self.classes = collective_classes(graph)
        self.optimizer = True
        """Whether the optimizer's ops are priced (False: a space built with this pricer prices one micro-batch's
        forward and backward passes, see :meth:`bound`)."""

    def bound(self, optimizer: bool = True) -> Pricer:
        """A copy (sharing this pricer's caches) whose prices count only critical collectives: a space built
        with it has, per strategy, a lower bound of the step that :mod:`~layoutsearch.costmodel.overlap`
        schedules (compute runs on one stream, and a critical collective holds it for at least its time).
        ``optimizer=False`` leaves the optimizer's ops out: a lower bound of one micro-batch's share of a
        gradient-accumulation step, which runs the optimizer once for all micro-batches."""
        other = copy.copy(self)
        other.counted = "critical"
        other.optimizer = optimizer
        return other

    def counts(self, c: Any, op_name: str | None = None, matmul: bool = False) -> bool:
        """Whether this pricer counts collective ``c`` (of op ``op_name``, a matmul or not)."""
        if self.counted == "all":
            return True
        if not self.hw.async_collectives:
            return True
        view = _OpView(matmul, self.graph.op(op_name).output) if op_name is not None else None
        return classify(c, self.classes, view, self.hw.collective_matmul) == "critical"

    def collective(self, kind: str, nbytes: int, axes: Axes) -> float:
        key = (kind, nbytes, axes)
        if key not in self._coll:
            self._coll[key] = collective_time(kind, nbytes, axes, self.mesh, self.hw).seconds
        return self._coll[key]

    def compute(self, c: OpCost, op: O.Op | None = None) -> float:
        """Roofline time of an op (:func:`~layoutsearch.costmodel.compute.compute_seconds`); ``c`` may be
        priced for another op of the same shapes: ``op`` gives the HBM traffic of the fusion plan."""
        return compute_seconds(self.fusion.cost(op, c) if op is not None else c, self.hw)[0]

    def comm(self, c: OpCost) -> float:
        return sum(self.collective(x.kind, x.bytes, x.axes) for x in c.comms if self.counts(x, c.op, c.matmul))

    def seconds(self, c: OpCost, op: O.Op | None = None) -> float:
        return self.compute(c, op) + self.comm(c)


def evaluate(graph: Graph, mesh: Mesh, hw: Hardware, iteration: dict[str, DimLayout],
             storage: dict[str, DimLayout], remat: str = "none") -> tuple[float, float, int]:
    """(compute s, communication s, peak memory bytes) of training graph ``graph`` computed op by op with
    ``iteration`` and every tensor stored as ``storage``, by the cost model's own rules (collectives shared
    by several ops counted once; recomputed ops priced again; memory by its live-set simulation): what a
    space's objective and memory rows must reproduce."""
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
    return sum(p.compute(c) for c in costs), sum(p.comm(c) for c in costs), mem.peak_bytes
