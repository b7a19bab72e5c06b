"""Named dimensions (Mesh-TensorFlow ``Dimension``), and the size bounds of graphs.

Sizes are bounded so that every count derived from a graph is an exact integer well below ``2**63``,
whatever holds it (a Python int, a numpy ``int64`` array, an XLA shape): see :data:`MAX_DIM_SIZE`,
:data:`MAX_TENSOR_ELEMENTS` and :data:`MAX_GRAPH_ELEMENTS`, and the "Validation rules" section of
``docs/graph-format.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from layoutsearch.errors import GraphError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

MAX_DIM_SIZE = 2**40
"""The largest size of a dim (1,099,511,627,776): a dim times a mesh (at most ``2**20`` devices,
:data:`layoutsearch.mesh.MAX_MESH_DEVICES`) stays below ``2**60``."""

MAX_TENSOR_ELEMENTS = 2**50
"""The largest element count of one tensor (a petabyte of 4-byte elements: ``2**52`` bytes)."""

MAX_GRAPH_ELEMENTS = 2**56
"""The largest *weighted* element count of a graph (as read from a file or built, before the training
step is derived): the sum over its tensors of the tensor's elements times one plus the number of times ops
read it -- its tensors and what its ops read, at most ``2**58`` bytes. The training step derived from such
a graph (a gradient per tensor, at most three tensors per read plus the sum of the contributions, seven
tensors per parameter for master weights and Adam) holds at most 15 times as many elements, 60 times as
many bytes: below ``2**62``."""


def is_name(text: object) -> bool:
    """Whether ``text`` is a valid dim name (``[A-Za-z_][A-Za-z0-9_]*``)."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def check_size(name: str, size: object) -> None:
    """Raise GraphError unless ``size`` is an integer in ``[1, MAX_DIM_SIZE]``."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise GraphError(f"dim {name!r} has invalid size {short_repr(size)}: must be a positive integer")
    if size > MAX_DIM_SIZE:
        raise GraphError(f"dim {name!r} has invalid size {short_repr(size)}: must be at most 2**40 "
                         f"({MAX_DIM_SIZE:,})")


def short_repr(v: object) -> str:
    """``repr(v)``, cut short for huge numbers and long strings (a message stays one readable line)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 200:
        return f"{'-' if v < 0 else ''}(an integer of {v.bit_length()} bits)"
    text = repr(v)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


@dataclass(frozen=True, order=True)
class Dim:
    """A named dimension with a size, e.g. ``Dim("batch", 64)``.

    Within one graph a dim name always has the same size; that is what lets a
    layout say "split ``batch`` over ``data``" once for every tensor. A size is
    an integer from 1 to :data:`MAX_DIM_SIZE`.
    """

    name: str
    size: int

    def __post_init__(self) -> None:
        if not is_name(self.name):
            raise GraphError(f"invalid dim name {short_repr(self.name)}: use letters, digits and '_'")
        check_size(self.name, self.size)

    def __str__(self) -> str:
        return f"{self.name}:{self.size}"


Shape = tuple[Dim, ...]
"""An ordered tuple of distinct named dims: the shape of a tensor."""


def dim_names(shape: Shape) -> tuple[str, ...]:
    """The names of a shape's dims, in order."""
    return tuple(d.name for d in shape)


def num_elements(shape: Shape) -> int:
    """Product of the dim sizes (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= d.size
    return n
