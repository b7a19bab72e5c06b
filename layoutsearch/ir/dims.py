"""Named dimensions (Mesh-TensorFlow ``Dimension``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from layoutsearch.errors import GraphError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class Dim:
    """A named dimension with a size, e.g. ``Dim("batch", 64)``.

    Within one graph a dim name always has the same size; that is what lets a
    layout say "split ``batch`` over ``data``" once for every tensor.
    """

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise GraphError(f"invalid dim name {self.name!r}: use letters, digits and '_'")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise GraphError(f"dim {self.name!r} has invalid size {self.size!r}: must be a positive integer")

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
