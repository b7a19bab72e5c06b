"""The layouts a reshape runs on without communication: which input splits pass through its dim groups, and
which must be gathered (or moved with one all-to-all) first. :class:`~layoutsearch.costmodel.ops.OpRules` prices
a reshape with these; :mod:`layoutsearch.validate` reads the layout it produces.
"""

from __future__ import annotations

from collections.abc import Sequence

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import DimLayout
from layoutsearch.mesh import Mesh


def reshape_layout(op: O.Reshape, src: DimLayout, graph: Graph, mesh: Mesh) -> tuple[DimLayout, DimLayout]:
    """The layout a reshape produces from ``src`` without communication, and
    the input layout it needs for that.

    Per group, only the major input dim may stay split: its axes pass to the
    major output dim when they divide it (a split ``d_model`` -> ``heads`` x
    ``d_kv`` keeps ``heads`` split); axes on minor input dims, or that do not
    divide the major output dim, are gathered first."""
    need = dict(src)
    out: DimLayout = {}
    grouped: set[str] = set()
    for ins, outs in op.groups:
        grouped.update(ins)
        for d in ins[1:]:
            need.pop(d, None)
        axes = src.get(ins[0], ())
        if axes and graph.dims[outs[0]] % mesh.group_size(axes) == 0:
            out[outs[0]] = axes
        else:
            need.pop(ins[0], None)
    for d, axes in src.items():
        if d not in grouped:
            out[d] = axes
    return out, need


def reshape_target(op: O.Reshape, src: DimLayout, need: DimLayout, output: DimLayout,
                    in_dims: Sequence[str]) -> DimLayout:
    """``need`` (the input layout a reshape can run on locally) with the axes it drops from ``src`` moved to the
    dims the reshape passes through (in neither of its groups) where the stored ``output`` splits them: XLA moves
    such an axis with one all-to-all before the reshape, instead of gathering it and slicing the output again."""
    grouped = {d for ins, _ in op.groups for d in ins}
    used = {a for axes in need.values() for a in axes}
    held = {a for axes in src.values() for a in axes}
    dropped = held - used
    target = dict(need)
    for d, axes in output.items():
        if (axes and d in in_dims and d not in grouped and not target.get(d) and used.isdisjoint(axes)
                and dropped & set(axes) and set(axes) <= dropped | (set(axes) - held)):
            target[d] = axes
            used.update(axes)
    return target
