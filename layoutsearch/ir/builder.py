"""A Mesh-TensorFlow-style builder for graphs.

Example (the two fully-connected layers of the Mesh-TF paper)::

    b = GraphBuilder("mtf-ffn")
    batch, io, hidden = b.dim("batch", 64), b.dim("io", 256), b.dim("hidden", 1024)
    x = b.input("x", [batch, io])
    w = b.parameter("w", [io, hidden])
    v = b.parameter("v", [hidden, io])
    h = b.relu(b.einsum([x, w], [batch, hidden]))
    y = b.einsum([h, v], [batch, io])
    loss = b.reduce(b.square(y - b.input("target", [batch, io])), [], fn="mean")
    graph = b.build(loss)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim, Shape
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import scoped
from layoutsearch.ir.tensor import Tensor

DimLike = Dim | str


@dataclass(frozen=True)
class Ref:
    """A handle on a tensor being built; arithmetic operators add elementwise ops."""

    name: str
    dims: Shape
    dtype: str
    builder: GraphBuilder = field(repr=False, compare=False)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def __add__(self, other: Ref) -> Ref:
        return self.builder.binary("add", self, other)

    def __sub__(self, other: Ref) -> Ref:
        return self.builder.binary("sub", self, other)

    def __mul__(self, other: Ref) -> Ref:
        return self.builder.binary("mul", self, other)

    def __truediv__(self, other: Ref) -> Ref:
        return self.builder.binary("div", self, other)

    def __neg__(self) -> Ref:
        return self.builder.unary("neg", self)


class GraphBuilder:
    """Builds a :class:`Graph` op by op; names are prefixed by the current block."""

    def __init__(self, name: str, dtype: str = "float32") -> None:
        self.name = name
        self.dtype = dtype
        self._dims: dict[str, Dim] = {}
        self._tensors: list[Tensor] = []
        self._ops: list[O.Op] = []
        self._names: set[str] = set()
        self._block: str | None = None
        self._counters: dict[str | None, int] = {}

    # -- dims and sources
    def dim(self, name: str, size: int) -> Dim:
        """Declare (or fetch) a named dim."""
        d = Dim(name, size)
        if name in self._dims and self._dims[name] != d:
            raise GraphError(f"dim {name!r} declared with two sizes: {self._dims[name].size} and {size}")
        self._dims[name] = d
        return d

    def _shape(self, dims: Iterable[DimLike]) -> Shape:
        out = []
        for d in dims:
            if isinstance(d, str):
                if d not in self._dims:
                    raise GraphError(f"unknown dim {d!r}: declare it with builder.dim({d!r}, size)")
                d = self._dims[d]
            else:
                self.dim(d.name, d.size)
            out.append(d)
        return tuple(out)

    def _scoped(self, name: str) -> str:
        full = scoped(self._block, name)
        if full in self._names:
            raise GraphError(f"name {full!r} is used twice")
        self._names.add(full)
        return full

    def _auto_name(self, base: str) -> str:
        """``base_N`` with N counted per block, so repeated blocks get the same names."""
        n = self._counters[self._block] = self._counters.get(self._block, 0) + 1
        return f"{base}_{n}"

    def _auto(self, kind: str, name: str | None) -> str:
        return self._scoped(name if name is not None else self._auto_name(kind))

    def _tensor(self, name: str, dims: Shape, dtype: str | None, role: str) -> Ref:
        t = Tensor(name, dims, dtype or self.dtype, role)
        self._tensors.append(t)
        return Ref(name, dims, t.dtype, self)

    def input(self, name: str, dims: Sequence[DimLike], dtype: str | None = None) -> Ref:
        """A fed-in data tensor (features, token ids, labels)."""
        shape = self._shape(dims)
        return self._tensor(self._scoped(name), shape, dtype, "input")

    def parameter(self, name: str, dims: Sequence[DimLike], dtype: str | None = None) -> Ref:
        """A trainable parameter."""
        shape = self._shape(dims)
        return self._tensor(self._scoped(name), shape, dtype, "parameter")

    @contextlib.contextmanager
    def block(self, name: str) -> Iterator[None]:
        """Names ops and tensors ``name/...`` and tags ops as part of block ``name``."""
        outer = self._block
        self._block = scoped(outer, name)
        try:
            yield
        finally:
            self._block = outer

    # -- ops
    def _op(self, cls: type[O.Op], inputs: Sequence[Ref], dims: Shape, name: str | None,
            dtype: str | None = None, **attrs: Any) -> Ref:
        out = self._auto(cls.kind, name)
        ref = self._tensor(out, dims, dtype, "activation")
        self._ops.append(cls(name=out, inputs=tuple(r.name for r in inputs), output=out,
                             block=self._block, **attrs))
        return ref

    def einsum(self, inputs: Sequence[Ref], out_dims: Sequence[DimLike], name: str | None = None) -> Ref:
        """Mesh-TF einsum: dims of the inputs absent from ``out_dims`` are summed."""
        return self._op(O.Einsum, inputs, self._shape(out_dims), name)

    def elementwise(self, fn: str, inputs: Sequence[Ref], out_dims: Sequence[DimLike] | None = None,
                    name: str | None = None, dtype: str | None = None, **params: float) -> Ref:
        """Elementwise ``fn``; output dims default to the union of the inputs' dims, the output dtype
        to the builder's."""
        if out_dims is None:
            seen: dict[str, Dim] = {}
            for r in inputs:
                for d in r.dims:
                    seen.setdefault(d.name, d)
            shape: Shape = tuple(seen.values())
        else:
            shape = self._shape(out_dims)
        return self._op(O.Elementwise, inputs, shape, name or self._auto_name(fn), dtype, fn=fn,
                        params=tuple(params.items()))

    def unary(self, fn: str, x: Ref, name: str | None = None, **params: float) -> Ref:
        return self.elementwise(fn, [x], name=name, **params)

    def binary(self, fn: str, a: Ref, b: Ref, name: str | None = None) -> Ref:
        return self.elementwise(fn, [a, b], name=name)

    def relu(self, x: Ref, name: str | None = None) -> Ref:
        return self.unary("relu", x, name)

    def gelu(self, x: Ref, name: str | None = None) -> Ref:
        return self.unary("gelu", x, name)

    def square(self, x: Ref, name: str | None = None) -> Ref:
        return self.unary("square", x, name)

    def scale(self, x: Ref, factor: float, name: str | None = None) -> Ref:
        return self.unary("scale", x, name, factor=factor)

    def reduce(self, x: Ref, out_dims: Sequence[DimLike], fn: str = "sum", name: str | None = None) -> Ref:
        """Reduce ``x`` over its dims absent from ``out_dims``."""
        return self._op(O.Reduce, [x], self._shape(out_dims), name, fn=fn)

    def softmax(self, x: Ref, dim: DimLike, name: str | None = None) -> Ref:
        return self._op(O.Softmax, [x], x.dims, name, dim=_name(dim))

    def layer_norm(self, x: Ref, dim: DimLike, eps: float = 1e-5, name: str | None = None,
                   center: bool = True) -> Ref:
        """Layer norm over ``dim``; ``center=False``: RMSNorm (no mean subtraction)."""
        return self._op(O.LayerNorm, [x], x.dims, name, dim=_name(dim), eps=eps, center=center)

    def reshape(self, x: Ref, groups: Sequence[tuple[Sequence[DimLike], Sequence[DimLike]]],
                name: str | None = None) -> Ref:
        """Replace each group's input dims by its output dims, in place."""
        dims = list(x.dims)
        named = []
        for src, dst in groups:
            src_n = [_name(d) for d in src]
            dst_d = list(self._shape(dst))
            idx = [x.dim_names.index(n) if n in x.dim_names else -1 for n in src_n]
            if -1 in idx:
                raise GraphError(f"reshape of {x.name!r}: dims {src_n} not all in {list(x.dim_names)}")
            pos = min(idx)
            dims = [d for d in dims if d.name not in src_n]
            at = sum(1 for d in x.dims[:pos] if d.name not in src_n)
            dims[at:at] = dst_d
            named.append((tuple(src_n), tuple(d.name for d in dst_d)))
        return self._op(O.Reshape, [x], tuple(dims), name, groups=tuple(named), dtype=x.dtype)

    def split(self, x: Ref, dim: DimLike, into: Sequence[DimLike], name: str | None = None) -> Ref:
        return self.reshape(x, [([dim], into)], name)

    def merge(self, x: Ref, dims: Sequence[DimLike], into: DimLike, name: str | None = None) -> Ref:
        return self.reshape(x, [(dims, [into])], name)

    def rename(self, x: Ref, dim: DimLike, to: DimLike, name: str | None = None) -> Ref:
        return self.reshape(x, [([dim], [to])], name)

    def gather(self, table: Ref, ids: Ref, dim: DimLike, name: str | None = None) -> Ref:
        """Embedding lookup of ``ids`` in ``table`` along ``dim``."""
        d = _name(dim)
        shape = ids.dims + tuple(x for x in table.dims if x.name != d)
        return self._op(O.Gather, [table, ids], shape, name, dim=d)

    def cross_entropy(self, logits: Ref, labels: Ref, dim: DimLike, name: str | None = None) -> Ref:
        """Per-example softmax cross-entropy of ``logits`` against int ``labels`` over ``dim``."""
        d = _name(dim)
        return self._op(O.CrossEntropy, [logits, labels], tuple(x for x in logits.dims if x.name != d),
                        name, dim=d)

    def build(self, loss: Ref | None = None, meta: dict[str, Any] | None = None) -> Graph:
        """Validate and return the graph; ``loss`` gets the role ``loss``."""
        tensors = [dataclasses.replace(t, role="loss") if loss is not None and t.name == loss.name else t
                   for t in self._tensors]
        return Graph(self.name, tensors, self._ops, loss=loss.name if loss else None, meta=meta)


def _name(d: DimLike) -> str:
    return d if isinstance(d, str) else d.name

