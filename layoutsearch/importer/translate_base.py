"""The translator's state: each program value as an IR tensor with a label per axis, and the ops emitted
for them (:class:`TranslatorBase`). The rules per primitive family build on it: :mod:`.translate_elementwise`,
:mod:`.translate_shape`, :mod:`.translate_reduce`; :class:`~layoutsearch.importer.translate.Translator`
runs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from layoutsearch.errors import GraphError
from layoutsearch.importer.labels import Labels
from layoutsearch.importer.pending import DimRef, PendingGraph, PendingTensor
from layoutsearch.importer.trace import Const, Lit, Node, Operand, Var
from layoutsearch.ir import ops as O

FLOAT_DTYPES = {"float32", "bfloat16", "float16"}
"""The float dtypes a graph tensor may have."""


@dataclass(eq=False)
class Val:
    """What a program value is in the graph: an IR tensor and a label per axis (None: a size-1 axis the
    tensor does not have). Labels absent from the tensor are broadcast axes (virtual)."""

    tensor: str
    labels: tuple[int | None, ...]


class TranslatorBase:
    """The values of a flattened program as IR tensors, and the ops written for them so far."""

    def __init__(self, splits: Mapping[str, Sequence[str]] | None = None) -> None:
        self.labels = Labels()
        self.vals: dict[Var, Val] = {}
        self.keep: list[Val] = []  # every Val stays alive: their ids are label holders
        self.pending = PendingGraph(self.labels)
        self.tensors = self.pending.tensors
        self.splits = {k: tuple(v) for k, v in (splits or {}).items()}
        self.broadcasts: dict[tuple[str, tuple[int | None, ...]], Val] = {}
        self.casts: dict[tuple[str, str], Val] = {}  # integer tensors read as floats
        self.negated: dict[str, Var] = {}  # the tensors of negations, with the value each negates
        self.given: dict[str, str] = {}  # dim names the user gave, with the first array given each
        self.views: dict[str, Val] = {}  # parts of function arguments read as tensors of their own
        self.constants: dict[str, np.ndarray] = {}  # the values of constant tensors, by name
        self._constant_keys: dict[tuple[Any, ...], str] = {}
        self.node: Node | None = None
        self.block: str | None = None

    # -- values
    def _val(self, tensor: str, labels: Sequence[int | None]) -> Val:
        v = Val(tensor, tuple(labels))
        self.keep.append(v)
        self.labels.hold(id(v), v.labels)
        return v

    def source(self, var: Var, name: str, dims: Sequence[str | None] | None, role: str) -> None:
        """A function input: ``dims`` names its axes (None: a placeholder named after the tensor)."""
        if dims is not None and len(dims) != len(var.shape):
            raise GraphError(f"{name}: {len(dims)} dim names {list(dims)} for an array of shape {list(var.shape)}")
        labels: list[int | None] = []
        for i, size in enumerate(var.shape):
            given = dims[i] if dims is not None else None
            if given is not None:
                if not isinstance(given, str) or not given.isidentifier():
                    raise GraphError(f"{name}: dim names must be identifiers, got {given!r}")
                first = self.given.setdefault(given, name)
                try:
                    labels.append(self.labels.named(given, size))
                except GraphError:
                    raise GraphError(f"{name}: dim {given!r} of size {size} (axis {i}) was given size "
                                     f"{self.labels.size(self.labels.named_label(given))} by {first}: "
                                     "one name, one size (give the axes different names)") from None
            else:
                labels.append(None if size == 1 else self.labels.placeholder(size, f"{_stem(name)}_{i}"))
        if len({self.labels.find(a) for a in labels if a is not None}) < sum(a is not None for a in labels):
            raise GraphError(f"{name}: a dim name appears twice in {list(dims or ())}")
        self.tensors[name] = PendingTensor(tuple(a for a in labels if a is not None), _dtype(var, name), role)
        self.vals[var] = self._val(name, labels)

    def val(self, v: Operand) -> Val:
        if isinstance(v, Lit):
            raise self.unsupported("a scalar constant in this position")
        if isinstance(v, Const):
            return self.constant(v)
        return self.vals[v]

    def constant(self, c: Const, dtype: str | None = None) -> Val:
        """A folded constant as an input tensor of the graph whose values it carries (``constant_N``,
        one tensor per distinct value), stored along the axes its values vary on only: a causal mask
        ``[1, 1, seq, seq]`` is stored ``[seq, seq]``, position ids broadcast over the batch ``[seq]``.
        ``dtype``: the tensor's (default: a float's own, int32 for integers, float32 0/1 for booleans)."""
        value = c.value
        keep = [i for i, s in enumerate(value.shape) if s != 1 and not _constant_along(value, i)]
        compact = np.array(value[tuple(slice(None) if i in keep else slice(0, 1)
                                                   for i in range(value.ndim))].reshape([value.shape[i] for i in keep]))
        if dtype is None:
            dtype = (value.dtype.name if value.dtype.name in FLOAT_DTYPES else "float32"
                     ) if value.dtype.kind in "fbV" else "int32"
        compact = compact.astype(np.dtype(dtype))
        key = (dtype, compact.shape, compact.tobytes())
        name = self._constant_keys.get(key)
        if name is None:
            name = self._constant_keys[key] = f"constant_{len(self._constant_keys) + 1}"
            stored = tuple(self.labels.placeholder(value.shape[i], f"{name}_{k}") for k, i in enumerate(keep))
            self.tensors[name] = PendingTensor(stored, dtype, "input")
            self.constants[name] = compact
        stored_labels = iter(self.tensors[name].labels)
        labels = [next(stored_labels) if i in keep else None if s == 1 else self.labels.placeholder(s, f"{name}_b{i}")
                  for i, s in enumerate(value.shape)]
        return self._val(name, labels)

    def as_float(self, v: Val, dtype: str = "float32") -> Val:
        """``v`` (an integer tensor: a mask or a count given as ints) cast to floats, once per tensor."""
        key = (v.tensor, dtype)
        if key not in self.casts:
            t = self.tensors[v.tensor]
            self.casts[key] = self.emit(O.Elementwise, "cast", [v.tensor], t.labels, dtype, fn="identity")
        return self._val(self.casts[key].tensor, v.labels)

    def as_ids(self, v: Val) -> Val:
        """``v`` as int32 ids: integer values computed as floats (positions counted from a mask) read back."""
        if self.dtype(v) not in FLOAT_DTYPES:
            return v
        t = self.tensors[v.tensor]
        return self._val(self.emit(O.Elementwise, "ids", [v.tensor], t.labels, "int32", fn="identity").tensor, v.labels)

    def stored(self, v: Val) -> set[int]:
        return {self.labels.find(a) for a in self.tensors[v.tensor].labels}

    def dense(self, v: Val) -> Val:
        """``v`` with its broadcast axes materialized (an identity op), for ops that read whole tensors."""
        have = self.stored(v)
        if all(a is None or self.labels.find(a) in have for a in v.labels):
            return v
        key = (v.tensor, tuple(self.labels.find(a) if a is not None else None for a in v.labels))
        if key not in self.broadcasts:  # one materialized broadcast for all its readers
            self.broadcasts[key] = self.emit(O.Elementwise, "broadcast", [v.tensor], v.labels, self.dtype(v),
                                             fn="identity")
        return self._val(self.broadcasts[key].tensor, v.labels)

    def dtype(self, v: Val) -> str:
        return self.tensors[v.tensor].dtype

    # -- ops
    def emit(self, cls: type[O.Op], stem: str, inputs: Sequence[str], labels: Sequence[int | None], dtype: str,
             **attrs: Any) -> Val:
        """Add an op writing a new tensor with the non-unit ``labels``; return its value."""
        name = self.pending.emit(cls, stem, inputs, [a for a in labels if a is not None], dtype, self.block, **attrs)
        return self._val(name, labels)

    def unsupported(self, why: str) -> GraphError:
        n = self.node
        assert n is not None
        dims = []
        for v in n.ins:
            if isinstance(v, Var) and v in self.vals:
                dims.append("[" + ", ".join(self.labels.base(a) if a is not None else "1"
                                            for a in self.vals[v].labels) + "]")
            else:
                dims.append("scalar" if isinstance(v, Lit) else str(list(v.shape)))
        return GraphError(f"cannot import primitive {n.prim!r} at {n.where}: {why} (operand dims: "
                          f"{', '.join(dims) or 'none'})")

    def relabel(self, v: Val, labels: Sequence[int | None]) -> Val:
        """``v`` with its axes renamed to ``labels`` (a reshape op renaming the stored ones)."""
        have = self.stored(v)
        groups = []
        for old, new in zip(v.labels, labels, strict=True):
            if old is not None and new is not None and self.labels.find(old) != self.labels.find(new) and (
                    self.labels.find(old) in have):
                groups.append(((DimRef(old),), (DimRef(new),)))
                self.labels.rename_placeholder(old, self.labels.base(new))  # a mask's axis met as seq: seq_N
        if not groups:
            return self._val(v.tensor, labels)
        renames = {self.labels.find(g[0][0].id): g[1][0].id for g in groups}
        out = tuple(renames.get(self.labels.find(a), a) for a in self.tensors[v.tensor].labels)
        r = self.emit(O.Reshape, "rename", [v.tensor], out, self.dtype(v), groups=tuple(groups))
        return self._val(r.tensor, labels)

    def conform(self, v: Val, labels: Sequence[int | None]) -> Val:
        """``v`` paired position by position with ``labels`` (size-1 axes broadcast): merged where
        allowed, else renamed."""
        want = list(v.labels)
        for i, (a, b) in enumerate(zip(v.labels, labels, strict=True)):
            if a is not None and b is not None and not self.labels.same(b, a):
                want[i] = b
        return v if want == list(v.labels) else self.relabel(v, want)

    def distinct(self, labels: Sequence[int | None]) -> list[int | None]:
        """``labels`` with repeats of a label replaced by fresh ones (``seq``, ``seq`` -> ``seq``, ``seq_2``)."""
        out: list[int | None] = []
        seen: set[int] = set()
        for a in labels:
            if a is not None and self.labels.find(a) in seen:
                a = self.labels.fresh(a, seen)
            if a is not None:
                seen.add(self.labels.find(a))
            out.append(a)
        return out

    def _axis_label(self, v: Val, axis: int) -> int:
        a = v.labels[axis]
        if a is None:
            raise self.unsupported("an op over a size-1 axis")
        return a


def _constant_along(value: np.ndarray, axis: int) -> bool:
    """Whether ``value`` is the same at every index of ``axis`` (a broadcast axis)."""
    if value.strides[axis] == 0:
        return True
    return bool(np.all(value == value.take([0], axis=axis)))


def _stem(name: str) -> str:
    stem = re.sub(r"\W+", "_", name.rsplit("/", 1)[-1]).strip("_") or "x"
    return stem if stem[0].isalpha() else f"x_{stem}"


def _dtype(var: Var, name: str) -> str:
    if var.dtype in FLOAT_DTYPES or var.dtype == "int32":
        return var.dtype
    if var.dtype in ("int64", "int16", "int8", "uint32"):
        return "int32"
    raise GraphError(f"{name}: arrays of dtype {var.dtype} cannot be imported (floats or integer ids)")
