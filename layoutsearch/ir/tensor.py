"""Tensors of the IR: a name, named dims, a dtype and a role."""

from __future__ import annotations

from dataclasses import dataclass

from layoutsearch.errors import GraphError
from layoutsearch.ir.dims import Dim, Shape, dim_names, num_elements

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "uint8": 1}
"""Supported dtypes and their size in bytes (``uint8``: byte masks, e.g. dropout's)."""

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
"""The floating-point dtypes (gradients flow through them; precision policies retype them)."""

ROLES = ("input", "parameter", "activation", "loss", "gradient", "optimizer_state")
"""What a tensor is for. ``input`` (data and labels), ``parameter`` and
``optimizer_state`` tensors are fed in; the others are produced by ops."""

SOURCE_ROLES = ("input", "parameter", "optimizer_state")


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
        if self.dtype not in DTYPE_BYTES:
            raise GraphError(f"tensor {self.name!r}: unknown dtype {self.dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        if self.role not in ROLES:
            raise GraphError(f"tensor {self.name!r}: unknown role {self.role!r} (known: {', '.join(ROLES)})")
        names = dim_names(self.dims)
        if len(set(names)) != len(names):
            raise GraphError(f"tensor {self.name!r} repeats a dim: {list(names)}")
        for d in self.dims:
            if not isinstance(d, Dim):
                raise GraphError(f"tensor {self.name!r}: dims must be Dim objects, got {d!r}")

    @property
    def dim_names(self) -> tuple[str, ...]:
        return dim_names(self.dims)

    @property
    def num_elements(self) -> int:
        return num_elements(self.dims)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.num_elements * self.itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise GraphError(f"tensor {self.name!r} has no dim {name!r} (dims: {list(self.dim_names)})")
