"""A JAX function as a flat list of primitive applications.

:func:`flatten` traces a function with :func:`jax.make_jaxpr` and flattens the jaxpr: calls
(``jit``/``pjit``, ``closed_call``, ``remat``, ``custom_jvp_call``, ``custom_vjp_call``) are inlined,
``scan`` loops are unrolled (iteration ``i`` of a loop tagged ``layer.i``, so the layers of a scanned
stack become the repeated blocks the cost model and the solvers tie), and each application keeps its
source line and its scope (``jax.named_scope`` names), for error messages and block tags. The calls
in :data:`COMPOSITES` (``log_softmax``, ``_one_hot``) are kept whole, with their body, for the
pattern pass (:mod:`layoutsearch.importer.patterns`).

Whatever the function computes from constants alone (literals, arrays captured by closure, ``iota``:
a causal mask or a rotary table built in a Flax ``setup()``, ``sqrt(depth)``, position ids) is
*folded*: evaluated once, here, into a scalar :class:`Lit` or an array :class:`Const` (at most
:data:`MAX_FOLDED_ELEMENTS` elements, except a broadcast, which stays a view). The translator makes
the arrays constant tensors of the graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax._src import source_info_util
from jax.extend import core as jcore

from layoutsearch.errors import GraphError
from layoutsearch.ir.names import block_name, scoped

COMPOSITES = frozenset({"log_softmax", "_one_hot"})
"""Named calls kept whole for the pattern pass: JAX's ``jax.nn.log_softmax`` and ``jax.nn.one_hot``."""

_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"}

_ids = itertools.count()


@dataclass(eq=False)
class Var:
    """A value of the flattened program: its shape and dtype (numpy name)."""

    shape: tuple[int, ...]
    dtype: str
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"v{self.id}:{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class Lit:
    """A scalar constant operand (``dtype``: its numpy dtype, for folding)."""

    value: float
    dtype: str = "float32"


@dataclass(eq=False)
class Const:
    """An array constant operand: a value the function computes from constants alone (see the module)."""

    value: np.ndarray
    where: str  # the source line that made it (or "a constant captured by the function")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> str:
        return self.value.dtype.name

    def uniform(self) -> Lit | None:
        """The one value of every element, as a literal, when all are equal (a broadcast scalar)."""
        v = self.value
        if v.size == 0:
            return None
        if all(st == 0 for st in v.strides) or (v.size <= 1 << 22 and bool(np.all(v == v.flat[0]))):
            return _literal(v.flat[0], "a constant")
        return None


@dataclass(eq=False)
class Opaque:
    """A constant that is not a number, captured by the function: a PRNG key (Flax NNX's ``Rngs`` state, which
    MaxText's model carries through its remat'd layers unused). It may pass through calls; a primitive the loss
    needs that reads it is refused with its line (:func:`refuse_opaque`)."""

    dtype: str
    shape: tuple[int, ...]
    where: str


Operand = Var | Lit | Const | Opaque

MAX_FOLDED_ELEMENTS = 1 << 26
"""The most elements a folded constant may have (256 MiB of float32): a larger one is refused, to be passed
as an argument. A broadcast of a smaller constant is a view, not counted."""

ELEMENTWISE_PRIMITIVES = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "pow", "integer_pow", "neg", "abs", "sign", "exp", "exp2",
    "log", "log1p", "expm1", "sqrt", "rsqrt", "cbrt", "square", "tanh", "logistic", "erf", "erfc", "erf_inv",
    "sin", "cos", "tan", "atan2", "floor", "ceil", "round", "is_finite", "convert_element_type", "eq", "ne",
    "lt", "le", "gt", "ge", "and", "or", "not", "xor", "select_n", "clamp", "nextafter", "reduce_precision",
    "stop_gradient", "copy", "copy_p", "shift_left", "shift_right_logical", "shift_right_arithmetic"})
"""Primitives computing each output element from the same element of each operand (equal shapes)."""


@dataclass(eq=False)
class Node:
    """One primitive application: ``outs = prim[params](*ins)``; ``where`` is its source line, ``scope``
    its ``named_scope`` path (``a/b/c``), ``block`` the repeated block (scan iteration) it belongs to."""

    prim: str
    ins: list[Operand]
    outs: list[Var]
    params: dict[str, Any]
    where: str
    scope: str
    block: str | None = None
    body: list[Node] | None = None  # a composite call's flattened body (its ins/outs are the call's)


@dataclass
class Program:
    """The flattened function: its inputs (one per pytree leaf), its outputs, and its nodes in order."""

    inputs: list[Var]
    outputs: list[Operand]
    nodes: list[Node]
    jaxpr: Any  # the ClosedJaxpr, shown by ``--debug``


def _var(aval: Any) -> Var:
    dtype = np.dtype(aval.dtype).name if _numeric(aval.dtype) else str(aval.dtype)  # a PRNG key: key<fry>
    return Var(tuple(int(d) for d in aval.shape), dtype)


def _where(eqn: Any) -> str:
    return source_info_util.summarize(eqn.source_info)


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _closed(j: Any) -> tuple[Any, Sequence[Any]]:
    """(jaxpr, consts) of a ``Jaxpr`` or ``ClosedJaxpr`` parameter."""
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, j.consts
    return j, ()


def _sub_jaxpr(eqn: Any) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    raise GraphError(f"call primitive {eqn.primitive.name} at {_where(eqn)} has no body to inline")


class _Flattener:
    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Operand], scope: str,
            block: str | None, outer: str = "") -> list[Operand]:
        """Flatten ``jaxpr`` applied to ``args``; ``outer`` is the source line of the call inlined (the
        line of an inner primitive whose frames are all JAX's own)."""
        env: dict[Any, Operand] = {}

        def read(a: Any) -> Operand:
            if isinstance(a, jcore.Literal):
                return _literal(a.val, "a literal")
            return env[a]

        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = _constant(c, outer or "a constant captured by the function")
        for v, a in zip(jaxpr.invars, args, strict=True):
            env[v] = a
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            where = _where(eqn) or outer
            ins = [read(a) for a in eqn.invars]
            inner = _join(scope, str(eqn.source_info.name_stack))
            folded = _fold(eqn, ins, where) if name not in _CALLS and name != "scan" else None
            if folded is not None:
                results = folded
            elif name in _CALLS and eqn.params.get("name") in COMPOSITES and any(isinstance(a, Var) for a in ins):
                outs = [_var(v.aval) for v in eqn.outvars]
                body = _Flattener()
                sub, sub_consts = _closed(_sub_jaxpr(eqn))
                results = body.run(sub, sub_consts, ins, inner, block, where)
                # the body writes its own output vars: map them onto the call's
                body_nodes = body.nodes
                for node in body_nodes:
                    node.outs = [outs[results.index(o)] if o in results else o for o in node.outs]
                self.nodes.append(Node(eqn.params["name"], ins, outs, {}, where, inner, block, body_nodes))
                results = outs
            elif name in _CALLS:
                sub, sub_consts = _closed(_sub_jaxpr(eqn))
                if name in ("custom_vjp_call", "custom_vjp_call_jaxpr"):
                    ins = ins[len(ins) - len(sub.invars):]
                results = self.run(sub, sub_consts, ins, inner, block, where)
            elif name == "scan":
                results = self._scan(eqn, ins, inner, block, where)
            elif not any(_numeric(v.aval.dtype) for v in eqn.outvars):  # PRNG key arithmetic: not a number
                results = [Opaque(str(v.aval.dtype), tuple(int(d) for d in v.aval.shape), f"made by {name} at {where}")
                           for v in eqn.outvars]
            else:
                outs = [_var(v.aval) for v in eqn.outvars]
                self.nodes.append(Node(name, ins, outs, dict(eqn.params), where, inner, block))
                results = list(outs)
            for v, r in zip(eqn.outvars, results, strict=True):
                env[v] = r
        return [read(a) for a in jaxpr.outvars]

    def _scan(self, eqn: Any, ins: list[Operand], scope: str, block: str | None, where: str) -> list[Operand]:
        """Unroll a scan: iteration ``i`` reads slice ``i`` of each scanned input (an ``index`` node)."""
        p = eqn.params
        body, body_consts = _closed(p["jaxpr"])
        n_consts, n_carry, length = *_scan_groups(p), p["length"]
        consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        ys: list[list[Operand]] = []
        order = range(length - 1, -1, -1) if p["reverse"] else range(length)
        for i in order:
            tag = scoped(block, block_name(i))
            sliced: list[Operand] = []
            for x in xs:
                if isinstance(x, Lit):
                    sliced.append(x)
                    continue
                if isinstance(x, Const):
                    sliced.append(_constant(x.value[i], x.where))
                    continue
                out = Var(x.shape[1:], x.dtype)
                self.nodes.append(Node("index", [x], [out], {"axis": 0, "index": i}, where, scope, tag))
                sliced.append(out)
            results = self.run(body, body_consts, [*consts, *carry, *sliced], scope, tag, where)
            carry = results[:n_carry]
            ys.append(results[n_carry:])
        if p["reverse"]:
            ys.reverse()
        stacked: list[Operand] = []
        for j, aval in enumerate(eqn.outvars[n_carry:]):
            if not any(isinstance(y[j], Var) for y in ys):
                stacked.append(_constant(np.stack([np.broadcast_to(_array(y[j]), aval.aval.shape[1:]) for y in ys]),
                                         where))
                continue
            out = _var(aval.aval)
            self.nodes.append(Node("stack", [y[j] for y in ys], [out], {"axis": 0}, where, scope, block))
            stacked.append(out)
        return [*carry, *stacked]


def _scan_groups(params: dict[str, Any]) -> tuple[int, int]:
    """How many of a scan's inputs are constants and how many the carry (the rest are scanned): JAX 0.10's
    ``num_consts``/``num_carry``, or the leaves of the first two groups of JAX 0.11's ``ft_in`` flat tree
    (constants, carry, scanned inputs; a carry the body passes through unchanged is a constant there)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))


def _literal(value: Any, what: str) -> Lit:
    arr = np.asarray(value)
    try:
        f = float(arr) if arr.ndim == 0 else None
    except (TypeError, ValueError):
        f = None
    if f is None:
        raise GraphError(f"{what} is not a number: {arr.dtype} of shape {list(arr.shape)}")
    dtype = arr.dtype.name
    try:  # the shortest decimal that rounds to the same value in its dtype: 1e-05, not 9.99e-06
        short = float(str(arr))
        if float(np.asarray(short, arr.dtype)) == f:
            return Lit(short, dtype)
    except (TypeError, ValueError, OverflowError):
        pass
    return Lit(f, dtype)


def _constant(value: Any, where: str) -> Lit | Const | Opaque:
    """A constant operand: a literal when a scalar, else an array (:class:`Opaque` when not a number)."""
    if isinstance(value, jax.core.Tracer):
        raise GraphError(f"internal: a traced value as a constant at {where}")
    dtype = getattr(value, "dtype", None)
    if not _numeric(dtype if dtype is not None else np.asarray(value).dtype):
        return Opaque(str(dtype), tuple(int(d) for d in getattr(value, "shape", ())), where)
    arr = np.asarray(value)
    return _literal(arr, f"the constant at {where}") if arr.ndim == 0 else Const(arr, where)


def _numeric(dtype: Any) -> bool:
    """Whether ``dtype`` is a number or boolean type (bfloat16 included; not a PRNG key)."""
    jnp = jax.numpy
    try:
        return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))
    except TypeError:
        return False


def _array(o: Lit | Const) -> np.ndarray:
    return o.value if isinstance(o, Const) else np.asarray(o.value, o.dtype)


_UNFOLDED = frozenset({"rng_uniform", "rng_bit_generator", "random_seed", "random_bits", "random_wrap",
                       "random_unwrap", "random_split", "random_fold_in", "threefry2x32"})
"""Primitives left to the translator even on constants: random streams (the importer refuses them with
their line)."""


def _fold(eqn: Any, ins: Sequence[Operand], where: str) -> list[Operand] | None:
    """The outputs of ``eqn`` evaluated, when every operand is a constant (else None)."""
    if any(isinstance(a, Var | Opaque) for a in ins) or eqn.effects or eqn.primitive.name in _UNFOLDED:
        return None
    name, params = eqn.primitive.name, eqn.params
    outs = [v.aval for v in eqn.outvars]
    if any(not hasattr(a, "shape") or not _numeric(a.dtype) for a in outs):
        return None
    values = [_array(a) for a in ins]  # type: ignore[arg-type]
    if name == "broadcast_in_dim" and outs[0].shape:  # a view: no copy, whatever its size
        src = values[0]
        shape = [1] * len(outs[0].shape)
        for i, d in enumerate(params["broadcast_dimensions"]):
            shape[d] = src.shape[i]
        return [Const(np.broadcast_to(src.reshape(shape), outs[0].shape), where)]
    shrunk = name in ELEMENTWISE_PRIMITIVES and all(
        v.ndim == 0 or all(st == 0 for st in v.strides) for v in values) and outs[0].shape
    if shrunk:  # every operand a broadcast scalar: compute one element, broadcast the result
        values = [v.reshape(-1)[:1].reshape((1,) * v.ndim) if v.ndim else v for v in values]
    elif any(int(np.prod(a.shape)) > MAX_FOLDED_ELEMENTS for a in outs):
        a = next(a for a in outs if int(np.prod(a.shape)) > MAX_FOLDED_ELEMENTS)
        raise GraphError(f"primitive {name!r} at {where} computes a constant of shape {list(a.shape)} "
                         f"({int(np.prod(a.shape)):,} elements) from constants alone: more than the "
                         f"{MAX_FOLDED_ELEMENTS:,} the importer folds (pass it to the function as an argument)")
    try:
        with jax.ensure_compile_time_eval():
            got = eqn.primitive.bind(*[jax.numpy.asarray(v) for v in values], **params)
    except Exception:  # noqa: BLE001 -- not evaluable here: the translator takes it as it is
        return None
    got = got if eqn.primitive.multiple_results else [got]
    results = [np.asarray(g) for g in got]
    if shrunk:
        results = [np.broadcast_to(r, a.shape) for r, a in zip(results, outs, strict=True)]
    return [_constant(r, where) for r in results]


def refuse_opaque(nodes: Sequence[Node]) -> None:
    """GraphError for the first of ``nodes`` (those the loss needs) reading a constant that is not a number."""
    for n in nodes:
        for a in n.ins:
            if isinstance(a, Opaque):
                raise GraphError(f"primitive {n.prim!r} at {n.where or a.where} reads a constant of dtype {a.dtype} "
                                 f"({a.where}): only numbers fold (pass it to the function as an argument)")


def flatten(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Program, Any]:
    """Trace ``fn(*args)`` and flatten it; returns the program and the output pytree structure."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    return flatten_jaxpr(closed), jax.tree_util.tree_structure(out_shape)


def flatten_jaxpr(closed: Any) -> Program:
    """Flatten the traced program ``closed`` (a ``ClosedJaxpr``, e.g. of :func:`jax.make_jaxpr`)."""
    flat = _Flattener()
    inputs = [_var(v.aval) for v in closed.jaxpr.invars]
    outputs = flat.run(closed.jaxpr, closed.consts, inputs, "", None)
    return Program(inputs, outputs, flat.nodes, closed)
