"""Axis maps: how the solvers store a layout of a set of dims, one entry per mesh axis.

An axis map has one entry per mesh axis (mesh order): the index of the dim that
axis splits, or :data:`NONE`. Several axes may split one dim (major first, as
in mesh order); an axis splits at most one dim. Every space's strategies are
axis maps (:mod:`.space`); :func:`to_dim_layout` turns one back into a
:data:`~layoutsearch.layout.DimLayout`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layoutsearch.layout import DimLayout
from layoutsearch.mesh import Mesh

NONE = -1
"""Axis-map entry of an axis that splits nothing."""


def choice_maps(choices: Sequence[Sequence[int]], dim_sizes: Sequence[int],
                axis_sizes: Sequence[int]) -> np.ndarray:
    """Every divisible assignment of the mesh axes to ``choices`` (each a group of dim indices that one axis
    splits together), axes of size 1 splitting nothing: shape ``[K, num_axes]``, an entry the index of the
    choice the axis splits or :data:`NONE`; rows in depth-first order, :data:`NONE` before the choices in order."""
    out: list[tuple[int, ...]] = []
    split = {d: 1 for members in choices for d in members}

    def rec(a: int, cur: list[int]) -> None:
        if a == len(axis_sizes):
            out.append(tuple(cur))
            return
        cur.append(NONE)
        rec(a + 1, cur)
        cur.pop()
        if axis_sizes[a] == 1:
            return
        for c, members in enumerate(choices):
            if all(dim_sizes[d] % (split[d] * axis_sizes[a]) == 0 for d in members):
                for d in members:
                    split[d] *= axis_sizes[a]
                cur.append(c)
                rec(a + 1, cur)
                cur.pop()
                for d in members:
                    split[d] //= axis_sizes[a]

    rec(0, [])
    return np.array(out, dtype=np.int32).reshape(len(out), len(axis_sizes))


def axis_maps(dims: Sequence[int], dim_sizes: Sequence[int], axis_sizes: Sequence[int]) -> np.ndarray:
    """Every divisible axis map over ``dims`` (axes of size 1 never split); shape ``[K, num_axes]``."""
    dim_of = np.array([*dims, NONE], dtype=np.int32)  # choice index -> dim index; NONE (-1) -> NONE
    return dim_of[choice_maps([(d,) for d in dims], dim_sizes, axis_sizes)]


def project(maps: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Axis maps restricted to the dims in boolean ``mask`` (indexed by dim; ``mask[-1]`` must be False)."""
    return np.where(mask[maps], maps, NONE)


def to_dim_layout(amap: Sequence[int], dims: Sequence[str], mesh: Mesh) -> DimLayout:
    """An axis map as a DimLayout (dim -> axes in mesh order)."""
    out: dict[str, tuple[str, ...]] = {}
    for a, d in zip(mesh.names, amap.tolist() if isinstance(amap, np.ndarray) else amap, strict=True):
        if d >= 0:
            out[dims[d]] = (*out.get(dims[d], ()), a)
    return out

