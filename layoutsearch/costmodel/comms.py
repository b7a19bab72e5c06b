"""The collectives a layout causes: resharding a tensor from one layout to another, and finishing the partial
sums of a reduced dim split over mesh axes.

:class:`Comm` is one such collective (payload per device, see :mod:`layoutsearch.costmodel.collectives` for the
byte conventions); :func:`on_mesh` puts a list of them as the devices run them. The per-op rules that call these
are in :mod:`layoutsearch.costmodel.ops`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Axes, DimLayout
from layoutsearch.mesh import Mesh


@dataclass(frozen=True)
class Comm:
    """One collective an op causes: payload per device per execution (see
    :mod:`layoutsearch.costmodel.collectives` for the byte conventions)."""

    kind: str
    axes: Axes
    bytes: int
    tensor: str
    cause: str
    shared: tuple | None = None
    """Identity of a collective several ops need (the same reshard of the same
    tensor): XLA computes it once per step (CSE). See :meth:`OpRules.step_costs`.
    Its strings (the tensor's name) are its top-level entries; nested tuples hold
    layouts (dim and axis names only), which renaming a repeated op leaves alone."""


def on_mesh(comms: Sequence[Comm], mesh: Mesh) -> list[Comm]:
    """``comms`` as the devices run them: a collective's axes in mesh order (its groups of devices are the same
    whatever order the rule split a dim in: ``heads:b+a`` all-reduces over ``a+b``), axes of size 1 left out, and
    a collective over a group of one device (only axes of size 1) dropped: there is nothing to exchange, and XLA
    emits nothing."""
    out = []
    for c in comms:
        axes = tuple(a for a in mesh.names if a in c.axes and mesh.axis_size(a) > 1)
        if axes:
            out.append(c if axes == c.axes else dataclasses.replace(c, axes=axes))
    return out


def local_bytes(tensor: Tensor, lay: DimLayout, mesh: Mesh) -> int:
    """Per-device bytes of ``tensor`` laid out as ``lay``."""
    n = tensor.nbytes
    for d, axes in lay.items():
        if d in tensor.dim_names:
            n //= mesh.group_size(axes)
    return n


def restrict(lay: DimLayout, dims: Sequence[str]) -> DimLayout:
    """The part of a layout that concerns ``dims``."""
    return {d: lay[d] for d in dims if lay.get(d)}


def reshard(tensor: Tensor, src: DimLayout, dst: DimLayout, mesh: Mesh, cause: str) -> list[Comm]:
    """Collectives turning ``tensor`` laid out as ``src`` into ``dst``.

    Axes moving to another dim: one all-to-all (payload: the local bytes);
    axes dropped: one all-gather (payload: the local bytes after it); axes
    added: a free local slice; blocks that only move between devices: one
    collective-permute (:func:`_permute`)."""
    if src == dst:  # (most of the reshards the op rules ask for: nothing moves)
        return []
    permute = _permute(tensor, src, dst, mesh, cause)
    if permute is not None:
        return [permute]
    where_src = {a: d for d, axes in src.items() for a in axes}
    where_dst = {a: d for d, axes in dst.items() for a in axes}
    moved = tuple(a for a in mesh.names if a in where_src and a in where_dst and where_src[a] != where_dst[a])
    dropped = tuple(a for a in mesh.names if a in where_src and a not in where_dst)
    out: list[Comm] = []
    cur = dict(src)
    if moved:
        out.append(Comm("all-to-all", moved, local_bytes(tensor, cur, mesh), tensor.name,
                        f"{cause}: {', '.join(f'{a} from {where_src[a]} to {where_dst[a]}' for a in moved)}"))
        cur = {d: tuple(a for a in axes if a not in moved) for d, axes in cur.items()}
        for a in moved:
            cur[where_dst[a]] = (*cur.get(where_dst[a], ()), a)
    if dropped:
        cur = {d: tuple(a for a in axes if a not in dropped) for d, axes in cur.items()}
        out.append(Comm("all-gather", dropped, local_bytes(tensor, cur, mesh), tensor.name,
                        f"{cause}: {', '.join(f'{where_src[a]} unsplit over {a}' for a in dropped)}"))
    return out


def _permute(tensor: Tensor, src: DimLayout, dst: DimLayout, mesh: Mesh, cause: str) -> Comm | None:
    """The one collective-permute XLA reshards ``src`` into ``dst`` with when every device's new block lies
    within a block some device holds (on every dim the new split is at least as fine as the old one: its number
    of pieces a multiple of the old number), but not within its own (some dim's old axes are no major prefix of
    its new axes, e.g. ``d:a`` to ``d:c``, or ``d:a,e:b`` to ``d:b,e:a``): each device receives its new block
    (payload: the new local bytes) over the axes of the dims that change; None otherwise."""
    axes: set[str] = set()
    for d in tensor.dim_names:
        old = tuple(a for a in src.get(d, ()) if mesh.axis_size(a) > 1)
        new = tuple(a for a in dst.get(d, ()) if mesh.axis_size(a) > 1)
        if mesh.group_size(new) % mesh.group_size(old):
            return None
        if old and new[:len(old)] != old:
            axes.update(old + new)
    if not axes:
        return None
    return Comm("collective-permute", tuple(a for a in mesh.names if a in axes), local_bytes(tensor, dst, mesh),
                tensor.name, f"{cause}: blocks move between devices ({fmt_layout(src)} to {fmt_layout(dst)})")


def _slice(after: DimLayout, stored: DimLayout, axes: Sequence[str], kept: Mapping[str, str]) -> None:
    """``after`` split over ``axes`` too, each on the dim ``kept`` names, in the order of ``stored`` (a
    reduce-scatter or an all-reduce and slice leaves any arrangement of the blocks: the stored one, with the
    stored dim's axes that split nothing yet sliced too: the result is whole over them)."""
    for d in {kept[a] for a in axes}:
        used = {a for x, ax in after.items() if x != d for a in ax}
        have = set(after.get(d, ())) | {a for a in axes if kept[a] == d} | (set(stored.get(d, ())) - used)
        after[d] = tuple(a for a in stored.get(d, ()) if a in have) + tuple(
            a for a in after.get(d, ()) if a not in stored.get(d, ()))


def partial_sums(out: Tensor, produced: DimLayout, partial: Sequence[tuple[str, Axes]], stored: DimLayout,
                  mesh: Mesh, reduce_scatter: bool, cause: str, kept_first: bool = False) -> tuple[list[Comm], DimLayout]:
    """Collectives finishing the partial sums of the reduced dims split over
    axes (``partial``: (dim, axes) pairs); returns them and the layout after.

    One all-reduce per reduced dim (XLA finishes the partial sums of each split
    contracted dim separately: ``w[io,h]`` contracted over ``batch`` on ``data``
    and ``seq`` on ``seq`` is all-reduced over ``seq``, then over ``data``).
    With ``reduce_scatter``, the axes the stored output keeps split are first
    reduce-scattered (one collective), and each dim's remaining axes all-reduced. Without it, ``kept_first``
    (an einsum: XLA's dot partitioner): the axes that the stored output keeps split, of every reduced dim, are
    all-reduced first (one collective), the result sliced, and each dim's other axes all-reduced."""
    if not partial:
        return [], produced
    axes_all = tuple(a for _, axes in partial for a in axes)
    kept = {a: d for d, axes in stored.items() for a in axes if a in axes_all and a not in produced.get(d, ())}
    rs = tuple(a for a in mesh.names if a in kept and a in axes_all) if reduce_scatter else ()
    comms: list[Comm] = []
    after = dict(produced)
    if rs:
        comms.append(Comm("reduce-scatter", rs, local_bytes(out, after, mesh), out.name,
                          f"{cause}; output keeps {', '.join(f'{kept[a]} split over {a}' for a in rs)}"))
        _slice(after, stored, rs, kept)
    first = tuple(a for a in mesh.names if a in kept and a in axes_all) if kept_first and not reduce_scatter else ()
    if first:
        # without reduce-scatter, XLA's dot partitioner all-reduces over the axes the stored output keeps split
        # (of every reduced dim at once), slices, and all-reduces the slice over each dim's other axes (hybrid
        # FSDP: the gradient over fsdp, then half of it over data, rather than all of it over both)
        comms.append(Comm("all-reduce", first, local_bytes(out, after, mesh), out.name,
                          f"{cause} (over {'+'.join(first)}, kept split)"))
        _slice(after, stored, first, kept)
    for d, axes in partial:
        ar = tuple(a for a in axes if a not in rs and a not in first)
        if ar:
            comms.append(Comm("all-reduce", ar, local_bytes(out, after, mesh), out.name,
                              f"{cause} ({d} over {'+'.join(ar)})"))
    return comms, after


def layout_key(lay: DimLayout) -> tuple[tuple[str, Axes], ...]:
    """``lay`` as a hashable key (its split dims, sorted)."""
    return tuple(sorted((d, a) for d, a in lay.items() if a))


def fmt_layout(lay: DimLayout) -> str:
    """``lay`` as text for a collective's cause (``{d:a+b,...}`` or ``replicated``)."""
    return "{" + ",".join(f"{d}:{'+'.join(a)}" for d, a in lay.items()) + "}" if lay else "replicated"
