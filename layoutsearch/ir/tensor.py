"""Tensors of the IR: a name, named dims, a dtype and a role."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from layoutsearch.errors import GraphError
from layoutsearch.ir.dims import MAX_TENSOR_ELEMENTS, Dim, Shape, dim_names, num_elements, short_repr

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "uint8": 1}
"""Supported dtypes and their size in bytes (``uint8``: byte masks, e.g. dropout's)."""

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
"""The floating-point dtypes (gradients flow through them; precision policies retype them)."""

ROLES = ("input", "parameter", "activation", "loss", "gradient", "optimizer_state")
"""What a tensor is for. ``input`` (data and labels), ``parameter`` and
``optimizer_state`` tensors are fed in; the others are produced by ops."""

SOURCE_ROLES = ("input", "parameter", "optimizer_state")


def is_label(text: object) -> bool:
    """Whether ``text`` can name a tensor, an op or a block: a non-empty string of printable characters
    (no control characters, no lone surrogates: names are printed on one line, in UTF-8)."""
    return isinstance(text, str) and text != "" and text.isprintable()


@dataclass(frozen=True)
class Tensor:
    """A tensor with named dims.

    ``updates`` names the tensor this one replaces after the step (a parameter
    or optimizer state written by the optimizer): the two share one buffer.
    """

    name: str
    dims: Shape
    dtype: str = "float32"
    role: str = "activation"
    updates: str | None = None

    def __post_init__(self) -> None:
        if not is_label(self.name):
            raise GraphError(f"tensor names must be non-empty strings of printable characters, got {short_repr(self.name)}")
        if isinstance(self.dims, list):
            object.__setattr__(self, "dims", tuple(self.dims))
        if not isinstance(self.dims, tuple):
            raise GraphError(f"tensor {self.name!r}: dims must be a tuple of Dim objects, got {short_repr(self.dims)}")
        for d in self.dims:
            if not isinstance(d, Dim):
                raise GraphError(f"tensor {self.name!r}: dims must be Dim objects, got {short_repr(d)}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise GraphError(f"tensor {self.name!r}: unknown dtype {short_repr(self.dtype)} (known: {', '.join(DTYPE_BYTES)})")
        if not isinstance(self.role, str) or self.role not in ROLES:
            raise GraphError(f"tensor {self.name!r}: unknown role {short_repr(self.role)} (known: {', '.join(ROLES)})")
        if self.updates is not None and not is_label(self.updates):
            raise GraphError(f"tensor {self.name!r}: updates must be a tensor name (a non-empty string), "
                             f"got {short_repr(self.updates)}")
        names = dim_names(self.dims)
        if len(set(names)) != len(names):
            raise GraphError(f"tensor {self.name!r} repeats a dim: {list(names)}")
        n = num_elements(self.dims)
        if n > MAX_TENSOR_ELEMENTS:
            raise GraphError(f"tensor {self.name!r} has {n:,} elements ({' x '.join(map(str, self.dims))}): "
                             f"more than the limit of 2**50 ({MAX_TENSOR_ELEMENTS:,}) per tensor")
        self.__dict__.update(dim_names=names, num_elements=n)  # (the cached properties below, known already)

    @functools.cached_property
    def dim_names(self) -> tuple[str, ...]:
        return dim_names(self.dims)

    @functools.cached_property
    def num_elements(self) -> int:
        return num_elements(self.dims)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.num_elements * DTYPE_BYTES[self.dtype]

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise GraphError(f"tensor {self.name!r} has no dim {name!r} (dims: {list(self.dim_names)})")
