"""Ops of the named-dimension IR.

Every op reads tensors by name and writes one output tensor. Shapes are named,
so broadcasting, contraction and reduction are all decided by dim names
(Mesh-TensorFlow semantics). Forward ops are written by model builders; the
``*Grad``/``ScatterAdd`` ops and the optimizer's elementwise functions appear
in the training graph derived by :mod:`layoutsearch.ir.training`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from layoutsearch.errors import GraphError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.elementwise_fns import ELEMENTWISE_FNS, UNARY_GRAD, ElementwiseFn
from layoutsearch.ir.tensor import Tensor, is_label

PHASES = ("forward", "backward", "optimizer")


def number(v: Any, fail: Any) -> float:
    """``v`` as a finite float; ``fail(message)`` (an exception) to raise otherwise: not a number (a bool is
    not one), or out of the float range, or infinite or NaN."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise fail(f"expected a number, got {short_repr(v)}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise fail(f"expected a finite number, got {short_repr(v)}")
    return f


def window_dims(op: Op) -> tuple[str, ...]:
    """The dims a slice, pad or concat moves data along (none for other ops): they run unsplit."""
    return op.window_dims() if isinstance(op, _Window | Concat) else ()


def is_dropout_mask(op: Op) -> bool:
    """Whether ``op`` is a ``dropout_mask``: its values come from its seed and its input's dims only, so it
    reads no input value (nor needs its input recomputed)."""
    return isinstance(op, Elementwise) and op.fn == "dropout_mask"


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base of all ops: a name, input tensor names, one output tensor name.

    ``phase`` says which part of the training step the op belongs to;
    ``block`` names the repeated block (e.g. ``"layer.3"``) the op is part of,
    so solvers can tie identical layers.
    """

    kind: ClassVar[str] = ""
    defaulted_attrs: ClassVar[frozenset[str]] = frozenset()
    """Attributes added to an op kind after graph files of it existed: written
    only when they differ from their default (see :meth:`file_attrs`)."""

    name: str
    inputs: tuple[str, ...]
    output: str
    phase: str = "forward"
    block: str | None = None

    def __post_init__(self) -> None:
        if not is_label(self.name):
            raise GraphError(f"{self.kind} op names must be non-empty strings of printable characters, "
                             f"got {short_repr(self.name)}")
        if isinstance(self.inputs, str) or not isinstance(self.inputs, list | tuple) or not all(
                is_label(t) for t in self.inputs):
            raise self._fail(f"inputs must be a list of tensor names, got {short_repr(self.inputs)}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not is_label(self.output):
            raise self._fail(f"output must be a tensor name, got {short_repr(self.output)}")
        if not isinstance(self.phase, str) or self.phase not in PHASES:
            raise GraphError(f"op {self.name!r}: unknown phase {short_repr(self.phase)} (known: {', '.join(PHASES)})")
        if self.block is not None and not is_label(self.block):
            raise self._fail(f"block must be a block name (a non-empty string) or null, got {short_repr(self.block)}")

    def _expect_str(self, field: str) -> None:
        """Raise GraphError unless attribute ``field`` is a string."""
        v = getattr(self, field)
        if not isinstance(v, str):
            raise self._fail(f"{field} must be a string, got {short_repr(v)}")

    # -- shape helpers shared by every consumer (cost model, backend, solvers)
    def iteration_dims(self, tensors: Mapping[str, Tensor]) -> tuple[str, ...]:
        """Names of all dims the op iterates over (inputs and output), in first-seen order."""
        seen: dict[str, None] = {}
        for t in (*self.inputs, self.output):
            for n in tensors[t].dim_names:
                seen.setdefault(n, None)
        return tuple(seen)

    def reduced_dims(self, tensors: Mapping[str, Tensor]) -> tuple[str, ...]:
        """Dims of the iteration space absent from the output (contracted or reduced)."""
        out = set(tensors[self.output].dim_names)
        return tuple(d for d in self.iteration_dims(tensors) if d not in out)

    def attrs(self) -> dict[str, Any]:
        """The op-specific attributes (everything but name/inputs/output/phase/block)."""
        base = {"name", "inputs", "output", "phase", "block"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base}

    def cost_attrs(self) -> dict[str, Any]:
        """:meth:`attrs` less those no cost depends on: ops differing only there (one layer's dropout mask and
        another's, drawn from other seeds) are priced, tied and memoized as repeats of one another."""
        return self.attrs()

    def file_attrs(self) -> dict[str, Any]:
        """:meth:`attrs` as written to a graph file: a :attr:`defaulted_attrs`
        attribute at its default is left out, so the files of graphs that do
        not use it stay as they were (and files without it read as the default)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: v for k, v in self.attrs().items()
                if not (k in self.defaulted_attrs and type(v) is type(defaults[k]) and v == defaults[k])}

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        """Raise GraphError if the op's tensors do not fit its semantics."""
        self._expect_arity(len(self.inputs))

    # -- helpers for check()
    def _fail(self, msg: str) -> GraphError:
        return GraphError(f"{self.kind} op {self.name!r}: {msg}")

    def _expect_arity(self, n: int) -> None:
        if len(self.inputs) != n:
            raise self._fail(f"expects {n} inputs, got {len(self.inputs)}")

    def _dims(self, tensors: Mapping[str, Tensor], t: str) -> set[str]:
        return set(tensors[t].dim_names)

    def _expect_float(self, tensors: Mapping[str, Tensor], *names: str) -> None:
        for t in names:
            if not tensors[t].is_float:
                raise self._fail(f"tensor {t!r} must be floating point, got {tensors[t].dtype}")


@dataclass(frozen=True, kw_only=True)
class Einsum(Op):
    """Mesh-TF einsum: output dims are given; dims of the inputs missing from
    the output are contracted (summed); dims shared by inputs and output are
    batch dims; dims of one input only that reach the output are outer dims."""

    kind: ClassVar[str] = "einsum"

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        if not 1 <= len(self.inputs) <= 3:
            raise self._fail(f"expects 1 to 3 inputs, got {len(self.inputs)}")
        self._expect_float(tensors, *self.inputs, self.output)
        ins = set().union(*(self._dims(tensors, t) for t in self.inputs))
        extra = self._dims(tensors, self.output) - ins
        if extra:
            raise self._fail(f"output dims {sorted(extra)} appear in no input")


@dataclass(frozen=True, kw_only=True)
class Elementwise(Op):
    """Elementwise ``fn`` over its inputs, broadcasting by dim name.

    The output's dims must contain every input's dims (extra output dims
    broadcast, so ``identity`` with more output dims is a broadcast)."""

    kind: ClassVar[str] = "elementwise"
    fn: str
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expect_str("fn")
        params = self.params.items() if isinstance(self.params, Mapping) else self.params
        def bad() -> GraphError:
            return self._fail(f"params must map attribute names to numbers, got {short_repr(self.params)}")

        if isinstance(params, str | bytes) or not hasattr(params, "__iter__"):
            raise bad()
        pairs = []
        for kv in params:
            if isinstance(kv, str | bytes) or not isinstance(kv, tuple | list) or len(kv) != 2 or not isinstance(
                    kv[0], str):
                raise bad()
            where = f"params.{kv[0]}" if kv[0].isidentifier() else f"params[{kv[0]!r}]"
            pairs.append((kv[0], number(kv[1], lambda msg, w=where: self._fail(f"{w}: {msg}"))))
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise self._fail(f"params names an attribute twice: {sorted(keys)}")
        object.__setattr__(self, "params", tuple(sorted(pairs)))

    @property
    def param(self) -> dict[str, float]:
        return dict(self.params)

    def cost_attrs(self) -> dict[str, Any]:
        attrs = self.attrs()
        if self.fn == "dropout_mask":  # the seed picks the values, not the cost
            attrs["params"] = tuple(kv for kv in self.params if kv[0] != "seed")
        return attrs

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        spec = ELEMENTWISE_FNS.get(self.fn)
        if spec is None:
            raise self._fail(f"unknown elementwise function {self.fn!r}")
        self._expect_arity(spec.arity)
        # floating point throughout, but for byte masks (dropout_mask may write one, mul may read one) and
        # identity of integers (a cast of a mask or a count given as ints, a broadcast of ids)
        masks = {self.output} if self.fn == "dropout_mask" else set(self.inputs) if self.fn == "mul" else set()
        casts = set(self.inputs) if self.fn == "identity" else set()
        if casts and (all(tensors[t].dtype == "int32" for t in self.inputs) or tensors[self.output].dtype == "int32"):
            casts.add(self.output)  # ids broadcast, or integer values held as floats read back as ids
        self._expect_float(tensors, *(t for t in (*self.inputs, self.output)
                                      if not (t in masks and tensors[t].dtype == "uint8")
                                      and not (t in casts and tensors[t].dtype == "int32")))
        if set(self.param) != set(spec.attrs):
            raise self._fail(f"function {self.fn!r} takes attributes {list(spec.attrs)}, got {sorted(self.param)}")
        out = self._dims(tensors, self.output)
        for t in self.inputs:
            missing = self._dims(tensors, t) - out
            if missing:
                raise self._fail(f"input {t!r} has dims {sorted(missing)} missing from the output")
        if self.fn == "dropout_mask":
            self._check_dropout(tensors)

    def _check_dropout(self, tensors: Mapping[str, Tensor]) -> None:
        rate, seed = self.param["rate"], self.param["seed"]
        if not 0 <= rate < 1:
            raise self._fail(f"dropout rate must be in [0, 1), got {rate!r}")
        if not (seed.is_integer() and 0 <= seed < 2**31):
            raise self._fail(f"dropout seed must be an integer in [0, 2**31), got {seed!r}")
        if self._dims(tensors, self.output) != self._dims(tensors, self.inputs[0]):
            raise self._fail(f"dropout_mask output must have the dims of its input {self.inputs[0]!r}")


@dataclass(frozen=True, kw_only=True)
class Reduce(Op):
    """Reduce (``sum``, ``mean`` or ``max``) over the input dims absent from the output."""

    kind: ClassVar[str] = "reduce"
    fn: str = "sum"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expect_str("fn")

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(1)
        if self.fn not in ("sum", "mean", "max"):
            raise self._fail(f"unknown reduction {self.fn!r} (known: sum, mean, max)")
        self._expect_float(tensors, self.inputs[0], self.output)
        extra = self._dims(tensors, self.output) - self._dims(tensors, self.inputs[0])
        if extra:
            raise self._fail(f"output dims {sorted(extra)} are not input dims")


@dataclass(frozen=True, kw_only=True)
class _OnDim(Op):
    """An op about one named dim ``dim`` (normalized, gathered or classified over)."""

    dim: str

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expect_str("dim")


@dataclass(frozen=True, kw_only=True)
class _OverDim(_OnDim):
    """An op normalizing over one named dim; output has the input's dims."""

    arity: ClassVar[int] = 1

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(self.arity)
        self._expect_float(tensors, *self.inputs, self.output)
        x = self._dims(tensors, self.inputs[0])
        if self.dim not in x:
            raise self._fail(f"dim {self.dim!r} is not a dim of input {self.inputs[0]!r}")
        for t in (*self.inputs, self.output):
            if self._dims(tensors, t) != x:
                raise self._fail(f"tensor {t!r} must have the dims of {self.inputs[0]!r}: {sorted(x)}")


@dataclass(frozen=True, kw_only=True)
class Softmax(_OverDim):
    """Softmax over ``dim``."""

    kind: ClassVar[str] = "softmax"


@dataclass(frozen=True, kw_only=True)
class SoftmaxGrad(_OverDim):
    """Gradient of softmax: inputs (y, dy) -> dx = y * (dy - sum_dim(dy * y))."""

    kind: ClassVar[str] = "softmax_grad"
    arity: ClassVar[int] = 2


@dataclass(frozen=True, kw_only=True)
class _Norm(_OverDim):
    """A normalization over ``dim``: divide by ``sqrt(mean square + eps)``,
    after subtracting the mean when ``center`` (layer norm), without (RMSNorm)."""

    eps: float = 1e-5
    center: bool = True
    defaulted_attrs: ClassVar[frozenset[str]] = frozenset({"center"})

    def __post_init__(self) -> None:
        super().__post_init__()
        eps = number(self.eps, lambda msg: self._fail(f"eps: {msg}"))
        if eps < 0:
            raise self._fail(f"eps must be >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", eps)

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        super().check(tensors)
        if not isinstance(self.center, bool):
            raise self._fail(f"center must be true or false, got {self.center!r}")


@dataclass(frozen=True, kw_only=True)
class LayerNorm(_Norm):
    """Normalize over ``dim`` (scale and bias are separate elementwise ops):
    ``center=True`` (layer norm, Ba et al. 2016) to zero mean and unit variance,
    ``(x - mean(x)) / sqrt(var(x) + eps)``; ``center=False`` (RMSNorm, Zhang &
    Sennrich 2019) to unit root mean square, ``x / sqrt(mean(x**2) + eps)``."""

    kind: ClassVar[str] = "layer_norm"


@dataclass(frozen=True, kw_only=True)
class LayerNormGrad(_Norm):
    """Gradient of LayerNorm (with the same ``eps`` and ``center``): inputs (x, dy) -> dx."""

    kind: ClassVar[str] = "layer_norm_grad"
    arity: ClassVar[int] = 2


@dataclass(frozen=True, kw_only=True)
class Reshape(Op):
    """Split, merge or rename dims (and transpose, since dims are named).

    ``groups`` pairs input dim names with the output dim names replacing them,
    e.g. ``((("d_model",), ("heads", "d_kv")),)`` splits ``d_model`` (the first
    output dim is the major one). Dims in no group pass through unchanged."""

    kind: ClassVar[str] = "reshape"
    groups: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        def bad() -> GraphError:
            return self._fail("groups must be a list of [input dims, output dims] pairs of dim-name lists, "
                              f"got {short_repr(self.groups)}")

        def names(v: Any) -> tuple[str, ...]:
            if isinstance(v, str) or not isinstance(v, list | tuple) or not all(isinstance(n, str) for n in v):
                raise bad()
            return tuple(v)

        if isinstance(self.groups, str) or not isinstance(self.groups, list | tuple):
            raise bad()
        groups = []
        for g in self.groups:
            if isinstance(g, str) or not isinstance(g, list | tuple) or len(g) != 2:
                raise bad()
            groups.append((names(g[0]), names(g[1])))
        object.__setattr__(self, "groups", tuple(groups))

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(1)
        x, y = tensors[self.inputs[0]], tensors[self.output]
        xd, yd = {d.name: d.size for d in x.dims}, {d.name: d.size for d in y.dims}
        consumed: set[str] = set()
        produced: set[str] = set()
        for src, dst in self.groups:
            for n in src:
                if n not in xd:
                    raise self._fail(f"group dim {n!r} is not a dim of input {x.name!r}")
            for n in dst:
                if n not in yd:
                    raise self._fail(f"group dim {n!r} is not a dim of output {y.name!r}")
            s_in = s_out = 1
            for n in src:
                s_in *= xd[n]
            for n in dst:
                s_out *= yd[n]
            if s_in != s_out:
                raise self._fail(f"group {list(src)} -> {list(dst)} changes the size ({s_in} vs {s_out})")
            consumed.update(src)
            produced.update(dst)
        if set(xd) - consumed != set(yd) - produced:
            raise self._fail(
                f"dims outside the groups must pass through: input keeps {sorted(set(xd) - consumed)}, "
                f"output keeps {sorted(set(yd) - produced)}")
        if x.dtype != y.dtype:
            raise self._fail("reshape cannot change the dtype")


@dataclass(frozen=True, kw_only=True)
class Gather(_OnDim):
    """Embedding lookup: inputs (table, ids) -> table rows picked along ``dim``.

    Output dims = ids dims + table dims without ``dim``."""

    kind: ClassVar[str] = "gather"
    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(2)
        table, ids = tensors[self.inputs[0]], tensors[self.inputs[1]]
        if self.dim not in table.dim_names:
            raise self._fail(f"dim {self.dim!r} is not a dim of table {table.name!r}")
        if ids.is_float:
            raise self._fail(f"ids {ids.name!r} must be int32")
        want = set(ids.dim_names) | (set(table.dim_names) - {self.dim})
        if self._dims(tensors, self.output) != want:
            raise self._fail(f"output must have dims {sorted(want)}")


@dataclass(frozen=True, kw_only=True)
class ScatterAdd(_OnDim):
    """Gradient of Gather: inputs (ids, dy) -> d_table, summing dy rows into ``dim``."""

    kind: ClassVar[str] = "scatter_add"
    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(2)
        ids, dy, out = (tensors[self.inputs[0]], tensors[self.inputs[1]], tensors[self.output])
        self._expect_float(tensors, dy.name, out.name)
        if ids.is_float:
            raise self._fail(f"ids {ids.name!r} must be int32")
        if self.dim not in out.dim_names:
            raise self._fail(f"dim {self.dim!r} is not a dim of output {out.name!r}")
        want = set(ids.dim_names) | (set(out.dim_names) - {self.dim})
        if set(dy.dim_names) != want:
            raise self._fail(f"dy must have dims {sorted(want)}")


@dataclass(frozen=True, kw_only=True)
class CrossEntropy(_OnDim):
    """Softmax cross-entropy per example: inputs (logits, labels) -> loss.

    ``labels`` are int32 class indices along ``dim``; loss has the logits'
    dims without ``dim`` (the labels' dims)."""

    kind: ClassVar[str] = "cross_entropy"
    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(2)
        logits, labels = tensors[self.inputs[0]], tensors[self.inputs[1]]
        self._expect_float(tensors, logits.name, self.output)
        if labels.is_float:
            raise self._fail(f"labels {labels.name!r} must be int32")
        if self.dim not in logits.dim_names:
            raise self._fail(f"dim {self.dim!r} is not a dim of logits {logits.name!r}")
        want = set(logits.dim_names) - {self.dim}
        if set(labels.dim_names) != want or self._dims(tensors, self.output) != want:
            raise self._fail(f"labels and output must have dims {sorted(want)}")


@dataclass(frozen=True, kw_only=True)
class CrossEntropyGrad(_OnDim):
    """Gradient of CrossEntropy: inputs (logits, labels, dloss) -> dlogits
    = (softmax(logits) - onehot(labels)) * dloss."""

    kind: ClassVar[str] = "cross_entropy_grad"
    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(3)
        logits, labels, dloss = (tensors[t] for t in self.inputs)
        self._expect_float(tensors, logits.name, dloss.name, self.output)
        if self.dim not in logits.dim_names:
            raise self._fail(f"dim {self.dim!r} is not a dim of logits {logits.name!r}")
        if labels.is_float:
            raise self._fail(f"labels {labels.name!r} must be int32")
        want = set(logits.dim_names) - {self.dim}
        if set(dloss.dim_names) != want or self._dims(tensors, self.output) != set(logits.dim_names):
            raise self._fail("dloss must have the labels' dims and the output the logits' dims")


@dataclass(frozen=True, kw_only=True)
class _Window(_OnDim):
    """A copy between a dim and a window of another: ``dim`` of the input and ``out_dim`` of the output, one of
    them the window ``start .. start + n - 1`` of the other (``n`` the smaller size); every other dim passes
    through. It moves data and computes nothing (0 FLOPs)."""

    start: int
    out_dim: str

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expect_str("out_dim")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise self._fail(f"start must be an integer >= 0, got {short_repr(self.start)}")

    def window_dims(self) -> tuple[str, ...]:
        return (self.dim, self.out_dim)

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        self._expect_arity(1)
        x, y = tensors[self.inputs[0]], tensors[self.output]
        if self.dim not in x.dim_names:
            raise self._fail(f"dim {self.dim!r} is not a dim of input {x.name!r}")
        if self.out_dim not in y.dim_names or self.out_dim in x.dim_names:
            raise self._fail(f"out_dim {self.out_dim!r} must be a dim of the output {y.name!r} and not of the input")
        if set(x.dim_names) - {self.dim} != set(y.dim_names) - {self.out_dim}:
            raise self._fail(f"the other dims must pass through: input {list(x.dim_names)}, output {list(y.dim_names)}")
        if x.dtype != y.dtype:
            raise self._fail("a window op cannot change the dtype")
        sizes = {d.name: d.size for d in (*x.dims, *y.dims)}
        inner, outer = (self.out_dim, self.dim) if self.kind == "slice" else (self.dim, self.out_dim)
        if self.start + sizes[inner] > sizes[outer]:
            raise self._fail(f"the window {self.start}:{self.start + sizes[inner]} of {inner!r} does not fit in "
                             f"{outer!r} (size {sizes[outer]})")


@dataclass(frozen=True, kw_only=True)
class Slice(_Window):
    """``x[..., start:start + n, ...]`` along ``dim``, as dim ``out_dim`` of size ``n`` (a part of ``jnp.split``,
    half of ``rotate_half``). Gradient: a :class:`Pad` of ``dy``."""

    kind: ClassVar[str] = "slice"


@dataclass(frozen=True, kw_only=True)
class Pad(_Window):
    """``x`` placed at ``start`` along ``out_dim`` (the larger dim), zeros elsewhere: the gradient of a
    :class:`Slice` (and of one part of a :class:`Concat`)."""

    kind: ClassVar[str] = "pad"


@dataclass(frozen=True, kw_only=True)
class Concat(Op):
    """The inputs laid end to end along ``out_dim``: input ``i`` contributes its dim ``dims[i]`` (dims of
    several inputs may share a name); every other dim is the same in all inputs and the output. A copy
    (0 FLOPs). Gradient of input ``i``: a :class:`Slice` of ``dy``."""

    kind: ClassVar[str] = "concat"
    dims: tuple[str, ...]
    out_dim: str

    def __post_init__(self) -> None:
        super().__post_init__()
        self._expect_str("out_dim")
        if isinstance(self.dims, str) or not isinstance(self.dims, list | tuple) or not all(
                isinstance(d, str) for d in self.dims):
            raise self._fail(f"dims must be a list of dim names, one per input, got {short_repr(self.dims)}")
        object.__setattr__(self, "dims", tuple(self.dims))

    def window_dims(self) -> tuple[str, ...]:
        return (*dict.fromkeys(self.dims), self.out_dim)

    def offsets(self, tensors: Mapping[str, Tensor]) -> list[int]:
        """Where each input starts along ``out_dim``."""
        out, at = [], 0
        for t, d in zip(self.inputs, self.dims, strict=True):
            out.append(at)
            at += tensors[t].dim(d).size
        return out

    def check(self, tensors: Mapping[str, Tensor]) -> None:
        if len(self.inputs) < 1 or len(self.dims) != len(self.inputs):
            raise self._fail(f"expects one dim per input, got {len(self.dims)} dims for {len(self.inputs)} inputs")
        y = tensors[self.output]
        if self.out_dim not in y.dim_names:
            raise self._fail(f"out_dim {self.out_dim!r} is not a dim of the output {y.name!r}")
        rest = set(y.dim_names) - {self.out_dim}
        total = 0
        for t, d in zip(self.inputs, self.dims, strict=True):
            x = tensors[t]
            if d not in x.dim_names or d == self.out_dim:
                raise self._fail(f"dim {d!r} is not a dim of input {t!r} other than out_dim")
            if set(x.dim_names) - {d} != rest:
                raise self._fail(f"input {t!r} must have the output's dims but {self.out_dim!r}: {sorted(rest)}")
            if x.dtype != y.dtype:
                raise self._fail(f"input {t!r} has dtype {x.dtype}, the output {y.dtype}")
            total += x.dim(d).size
        if total != y.dim(self.out_dim).size:
            raise self._fail(f"the inputs' sizes along {list(self.dims)} add up to {total}, "
                             f"not to the size of {self.out_dim!r} ({y.dim(self.out_dim).size})")


OP_KINDS: dict[str, type[Op]] = {
    cls.kind: cls
    for cls in (Einsum, Elementwise, Reduce, Softmax, SoftmaxGrad, LayerNorm, LayerNormGrad,
                Reshape, Gather, ScatterAdd, CrossEntropy, CrossEntropyGrad, Slice, Pad, Concat)
}
"""Op classes by their ``kind`` string (as written in graph files)."""

__all__ = [
    "ELEMENTWISE_FNS", "OP_KINDS", "PHASES", "UNARY_GRAD", "Concat", "CrossEntropy", "CrossEntropyGrad",
    "Einsum", "Elementwise", "ElementwiseFn", "Gather", "LayerNorm", "LayerNormGrad", "Op", "Pad", "Reduce",
    "Reshape", "ScatterAdd", "Slice", "Softmax", "SoftmaxGrad", "is_dropout_mask", "window_dims",
]
