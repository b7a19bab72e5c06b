"""Turn an IR graph into a JAX function.

Each tensor is a ``jax.Array`` whose axes follow the tensor's dims in order.
Ops are evaluated in the graph's topological order; a ``constrain`` hook is
called on every produced tensor (the sharding module uses it to apply
``with_sharding_constraint`` from a layout). The same interpreter runs the
forward graph and the derived training graph (backward and optimizer ops).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from layoutsearch.costmodel.fusion import attention_cores, check_attention
from layoutsearch.errors import GraphError, LayoutError
from layoutsearch.ir import ops as O
from layoutsearch.ir.constants import constant_values
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import leaf_tensors, pytree_key
from layoutsearch.ir.remat import parse_remat, recomputed_blocks
from layoutsearch.ir.tensor import Tensor

Arrays = dict[str, jax.Array]
Constrain = Callable[[str, jax.Array], jax.Array]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "int32": jnp.int32,
           "uint8": jnp.uint8}


def jax_dtype(tensor: Tensor) -> Any:
    return _DTYPES[tensor.dtype]


def align(x: jax.Array, dims: Sequence[str], out: Sequence[str]) -> jax.Array:
    """Transpose ``x`` (axes named ``dims``) to the order of ``out`` and insert
    size-1 axes for dims of ``out`` it lacks, so it broadcasts against ``out``."""
    present = [d for d in out if d in dims]
    x = jnp.transpose(x, [list(dims).index(d) for d in present])
    shape = [x.shape[present.index(d)] if d in present else 1 for d in out]
    return x.reshape(shape)


def _unary(f: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    return lambda x, **_: f(x)


def _gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


_UNARY: dict[str, Callable[[jax.Array], jax.Array]] = {
    "identity": lambda x: x, "neg": jnp.negative, "square": jnp.square, "relu": jax.nn.relu, "gelu": _gelu,
    "silu": jax.nn.silu, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "exp": jnp.exp, "log": jnp.log,
    "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt, "erf": jax.lax.erf,
    "sin": jnp.sin, "cos": jnp.cos,
}


def _jvp_grad(f: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    """fn_grad(x, dy) = f'(x) * dy, by forward-mode differentiation of f."""
    return lambda x, dy, **_: jax.jvp(f, (x,), (dy,))[1]


def _keeping_input(f: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """``f`` whose backward pass keeps only its input ``x`` and computes ``f'(x) * dy`` from it, as the IR's
    derived ``fn_grad(x, dy)`` does (and a fused bias-GeLU kernel): JAX's own derivative of the tanh-GeLU
    keeps several intermediates of the input's size, which the cost model does not count."""
    g = jax.custom_vjp(f)
    g.defvjp(lambda x: (f(x), x), lambda x, dy: (_jvp_grad(f)(x, dy),))
    return g


def _power(x: jax.Array, exponent: float) -> jax.Array:
    """``x ** exponent``: repeated multiplication for an integer exponent (``lax.integer_pow``, as JAX
    lowers ``x ** 3``), else ``pow``."""
    if float(exponent).is_integer():
        return jax.lax.integer_pow(x, int(exponent))
    return jnp.power(x, exponent)


def _adam_update(p: jax.Array, m: jax.Array, v: jax.Array, *, lr: float, b1: float, b2: float, eps: float,
                 step: float) -> jax.Array:
    mhat = m / (1.0 - b1**step)
    vhat = v / (1.0 - b2**step)
    return p - lr * mhat / (jnp.sqrt(vhat) + eps)


def _dropout_mask(x: jax.Array, *, rate: float, seed: float) -> jax.Array:
    """1 with probability ``1 - rate``, else 0, per element of ``x``'s shape (cast to the output's dtype by
    the interpreter), from the threefry key of ``seed``: the same values for a given seed whatever the
    sharding: partitionable threefry (``jax_threefry_partitionable``, JAX's default; set here whatever the
    global setting) draws each element from its index in the whole array, so a partitioned program computes
    each device's block of the same mask."""
    with jax.threefry_partitionable(True):
        keep = jax.random.bernoulli(jax.random.key(int(seed)), 1.0 - rate, x.shape)
    return keep.astype(x.dtype)


ELEMENTWISE_IMPL: dict[str, Callable[..., jax.Array]] = {
    **{n: _unary(_keeping_input(f) if n in O.UNARY_GRAD else f) for n, f in _UNARY.items()},
    **{g: _jvp_grad(_UNARY[f]) for f, g in O.UNARY_GRAD.items()},
    "scale": lambda x, *, factor: x * factor,
    "fill": lambda x, *, value: jnp.full_like(x, value),
    "dropout_mask": _dropout_mask,
    "add": lambda a, b, **_: a + b, "sub": lambda a, b, **_: a - b, "mul": lambda a, b, **_: a * b,
    "div": lambda a, b, **_: a / b, "eq": lambda a, b, **_: (a == b).astype(jnp.result_type(a)),
    "div_rhs_grad": lambda a, b, dy, **_: -dy * a / (b * b),
    "shift": lambda x, *, offset: x + offset,
    "pow": lambda x, *, exponent: _power(x, exponent),
    "pow_grad": lambda x, dy, *, exponent: exponent * _power(x, exponent - 1) * dy,
    "stop_gradient": lambda x, **_: jax.lax.stop_gradient(x),
    "maximum": lambda a, b, **_: jnp.maximum(a, b),
    "maximum_grad": lambda x, other, dy, **_: dy * jnp.where(x > other, 1.0, jnp.where(x == other, 0.5, 0.0)),
    **{f: (lambda a, b, _op=cmp, **_: _op(a, b).astype(jnp.result_type(a)))
       for f, cmp in (("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal), ("gt", jnp.greater),
                      ("ge", jnp.greater_equal))},
    "where": lambda c, a, b, **_: jnp.where(c != 0, a, b),
    "where_grad_true": lambda c, dy, **_: jnp.where(c != 0, dy, 0.0),
    "where_grad_false": lambda c, dy, **_: jnp.where(c != 0, 0.0, dy),
    "sgd": lambda p, g, *, lr: p - lr * g,
    "adam_m": lambda m, g, *, b1: b1 * m + (1.0 - b1) * g,
    "adam_v": lambda v, g, *, b2: b2 * v + (1.0 - b2) * g * g,
    "adam_update": _adam_update,
}
"""JAX implementation of every elementwise function of the IR."""


def scope_name(op: str) -> str:
    """The ``jax.named_scope`` each op is traced under: compiled HLO instructions carry
    ``op_name=".../[<op>]/<primitive>"`` metadata, tracing them back to the IR op."""
    return f"[{op}]"


def flash_cores(graph: Graph) -> dict[str, tuple[O.Op, ...]]:
    """The attention cores of forward ``graph`` that run as flash attention (``attention="flash"``): the name of
    each core's context einsum (probabilities x values) -> the core's ops in graph order, ``q·k`` through the
    softmax and the attention dropout (the cores of :func:`~layoutsearch.costmodel.fusion.attention_cores`)
    and that einsum. A core whose scores feed any op outside it runs as the graph says."""
    order = {op.name: i for i, op in enumerate(graph.ops)}
    consumers = graph.consumers
    cores: dict[str, tuple[O.Op, ...]] = {}
    for c in attention_cores(graph):
        ops = [graph.op(n) for n in (*c.recompute, c.context)]
        names = {op.name for op in ops}
        if all(d.name in names for op in ops[:-1] for d in consumers[op.output]):
            cores[c.context] = tuple(sorted(ops, key=lambda op: order[op.name]))
    return cores


def unflashed_cores(graph: Graph, remat: str = "none") -> list[str]:
    """The attention cores of forward ``graph`` (by context einsum) that ``attention="flash"`` runs as standard
    attention, keeping their scores: those whose scores feed an op outside the core (not in
    :func:`flash_cores`) and, under a remat policy (which runs each run of consecutive ops of one block on its
    own), those whose ops span such runs. The cost model prices every core of
    :func:`~layoutsearch.costmodel.fusion.attention_cores`."""
    flash = flash_cores(graph)
    cores = [c.context for c in attention_cores(graph) if c.context not in flash]
    if remat != "none":
        run_of = {op.name: i for i, run in enumerate(_block_runs(graph.ops)) for op in run}
        cores += [name for name, core in flash.items() if len({run_of[op.name] for op in core}) > 1]
    return cores


def matmul(a: tuple[jax.Array, Sequence[str]], b: tuple[jax.Array, Sequence[str]],
           out: Sequence[str]) -> jax.Array | None:
    """The einsum of two named arrays ``(array, dims)`` into dims ``out`` as one ``lax.dot_general``, its
    transposes on its smallest tensors: a ``dot_general``'s result has its batch dims first, then each
    operand's free dims in that operand's order, so an output in another order needs a transpose of the
    output, or of an operand before it. ``jnp.einsum`` always transposes the output, which for grouped-query
    attention's scores (``q_per_kv`` before ``seq`` in the output, after it in the queries) is a seq x kv_seq
    copy in the forward pass and again in the backward pass, run by XLA:GPU as kernels of their own
    (bench/RESULTS_device.md); transposing the queries instead moves a d_kv-th of that. None where a dim is
    in one operand only and not in the output (summed before the product, as ``jnp.einsum`` does)."""
    (x, xd), (y, yd) = a, b
    if any(d not in out and d not in o for ds, o in ((xd, yd), (yd, xd)) for d in ds) or \
            any(d not in xd and d not in yd for d in out):
        return None
    out = list(out)
    batch = [d for d in out if d in xd and d in yd]
    size = lambda arr: int(np.prod(arr.shape))  # noqa: E731
    options = []  # (elements transposed, lhs, rhs, the order of each one's free dims)
    for (l, ld), (r, rd) in (((x, xd), (y, yd)), ((y, yd), (x, xd))):
        free_l, free_r = [d for d in ld if d not in rd], [d for d in rd if d not in ld]
        lo, ro = [d for d in out if d in free_l], [d for d in out if d in free_r]
        if out == [*batch, *lo, *ro]:  # in order once each operand's free dims follow the output's order
            options.append((size(l) * (free_l != lo) + size(r) * (free_r != ro), (l, ld, lo), (r, rd, ro)))
        out_size = int(np.prod([dict(zip((*ld, *rd), (*l.shape, *r.shape), strict=True))[d] for d in out]))
        options.append((out_size * (out != [*batch, *free_l, *free_r]), (l, ld, free_l), (r, rd, free_r)))
    _, (l, ld, fl), (r, rd, fr) = min(options, key=lambda o: o[0])
    dt = jnp.result_type(l, r)
    contract = [d for d in ld if d in rd and d not in out]
    operands = []
    for arr, dims, free in ((l, ld, fl), (r, rd, fr)):
        if [d for d in dims if d in free] != free:  # put the free dims in the order the result needs
            arr, dims = align(arr, dims, [*batch, *free, *contract]), [*batch, *free, *contract]
        operands.append((arr.astype(dt), list(dims)))
    (lhs, lhs_dims), (rhs, rhs_dims) = operands
    numbers = (([lhs_dims.index(d) for d in contract], [rhs_dims.index(d) for d in contract]),
               ([lhs_dims.index(d) for d in batch], [rhs_dims.index(d) for d in batch]))
    return align(jax.lax.dot_general(lhs, rhs, numbers), [*batch, *fl, *fr], out)


# -- the ops whose backward pass keeps what the IR's derived backward op reads (what the cost model counts):
# softmax its output, layer norm and cross-entropy their inputs. JAX's own derivatives keep intermediates
# besides (softmax: exp's output as well as the probabilities, a second seq x kv_seq tensor per attention
# core; layer norm: the centred input and the normalized output; cross-entropy: log-probabilities and the
# one-hot labels, each of the logits' size), as fused kernels (Megatron-LM's softmax, layer norm and
# cross-entropy) do not.

@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax(x: jax.Array, axis: int) -> jax.Array:
    return jax.nn.softmax(x, axis=axis)


def _softmax_backward(y: jax.Array, dy: jax.Array, axis: int) -> jax.Array:
    return y * (dy - jnp.sum(dy * y, axis=axis, keepdims=True))


def _softmax_fwd(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    y = jax.nn.softmax(x, axis=axis)
    return y, y


_softmax.defvjp(_softmax_fwd, lambda axis, y, dy: (_softmax_backward(y, dy, axis),))


def _normalized(x: jax.Array, ax: int, eps: float, center: bool) -> tuple[jax.Array, jax.Array]:
    """``(xhat, rstd)``: layer norm (``center``) or RMSNorm of ``x`` along ``ax``."""
    if center:
        x = x - jnp.mean(x, axis=ax, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=ax, keepdims=True) + eps)
    return x * rstd, rstd


def _layer_norm_backward(x: jax.Array, dy: jax.Array, ax: int, eps: float, center: bool) -> jax.Array:
    xhat, rstd = _normalized(x, ax, eps, center)
    mean = lambda a: jnp.mean(a, axis=ax, keepdims=True)  # noqa: E731
    if center:
        return rstd * (dy - mean(dy) - xhat * mean(dy * xhat))
    return rstd * (dy - xhat * mean(dy * xhat))


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _layer_norm(x: jax.Array, ax: int, eps: float, center: bool) -> jax.Array:
    return _normalized(x, ax, eps, center)[0]


_layer_norm.defvjp(lambda x, ax, eps, center: (_normalized(x, ax, eps, center)[0], x),
                   lambda ax, eps, center, x, dy: (_layer_norm_backward(x, dy, ax, eps, center),))


def _cross_entropy_parts(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-probabilities over the last dim, in float32 whatever the logits' dtype (as Megatron-LM's and
    MaxText's cross-entropy: :mod:`layoutsearch.ir.precision`), and the one-hot labels. One-hot form (not
    take_along_axis): with the class dim split over devices it partitions into local work plus all-reduces,
    as in Megatron-LM."""
    logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    return logp, jax.nn.one_hot(labels, logits.shape[-1], dtype=logp.dtype)


def _cross_entropy_backward(logits: jax.Array, labels: jax.Array, dloss: jax.Array) -> jax.Array:
    logp, onehot = _cross_entropy_parts(logits, labels)
    return (jnp.exp(logp) - onehot) * dloss[..., None]


def _cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp, onehot = _cross_entropy_parts(logits, labels)
    return -jnp.sum(logp * onehot, axis=-1)


_cross_entropy = jax.custom_vjp(_cross_entropy_loss)
_cross_entropy.defvjp(lambda logits, labels: (_cross_entropy_loss(logits, labels), (logits, labels)),
                      lambda res, dloss: (_cross_entropy_backward(*res, dloss).astype(res[0].dtype), None))


class _Interpreter:
    def __init__(self, graph: Graph, env: Arrays, constrain: Constrain | None,
                 flash: Mapping[str, tuple[O.Op, ...]] | None = None) -> None:
        self.g = graph
        self.env = env
        self.constrain = constrain
        self.flash = flash or {}  # the attention cores run as flash attention (flash_cores)

    def dims(self, name: str) -> tuple[str, ...]:
        return self.g.tensors[name].dim_names

    def arg(self, name: str, out: Sequence[str] | None = None) -> jax.Array:
        x = self.env[name]
        return x if out is None else align(x, self.dims(name), out)

    def run(self, ops: Sequence[O.Op] | None = None) -> Arrays:
        ops = self.g.ops if ops is None else ops
        flash: dict[str, tuple[O.Op, ...]] = {}
        if self.flash:  # the cores whose ops all run here
            names = {op.name for op in ops}
            flash = {name: core for name, core in self.flash.items() if all(op.name in names for op in core)}
        inside = {op.name for core in flash.values() for op in core[:-1]}  # run with their context einsum
        for op in ops:
            if op.name in inside:
                continue
            with jax.named_scope(scope_name(op.name)):
                y = self._flash(flash[op.name]) if op.name in flash else getattr(self, "_" + op.kind)(op)
                t = self.g.tensors[op.output]
                want = tuple(d.size for d in t.dims)
                if y.shape != want:
                    y = jnp.broadcast_to(y, want)
                y = y.astype(jax_dtype(t))
                self.env[op.output] = self.constrain(op.output, y) if self.constrain else y
        return self.env

    def _flash(self, core: tuple[O.Op, ...]) -> jax.Array:
        """A flash-attention core under ``jax.checkpoint``: its backward pass recomputes the scores from q, k
        and v instead of keeping them (a flash-attention kernel's memory and FLOPs; the scores still pass
        through memory in the forward pass and again in the backward pass, one core at a time)."""
        produced = {op.output for op in core}
        reads = list(dict.fromkeys(i for op in core for i in op.inputs if i not in produced))

        def run(vals: list[jax.Array]) -> jax.Array:
            return _Interpreter(self.g, dict(zip(reads, vals, strict=True)), self.constrain).run(core)[core[-1].output]

        return jax.checkpoint(run)([self.env[t] for t in reads])

    # -- one method per op kind
    def _einsum(self, op: O.Einsum) -> jax.Array:
        """The backend's default matmul precision, as the cost model prices it (``Hardware.peak_flops_fp32``:
        float32 operands on TF32 tensor cores on a GPU, in bfloat16 passes on a TPU; exact on CPU). A matmul
        of two operands runs as one ``dot_general`` (:func:`matmul`); others as ``jnp.einsum``."""
        if len(op.inputs) == 2:
            y = matmul(*((self.env[t], self.dims(t)) for t in op.inputs), self.dims(op.output))
            if y is not None:
                return y
        letters = {d: string.ascii_letters[i] for i, d in enumerate(op.iteration_dims(self.g.tensors))}
        sub = ",".join("".join(letters[d] for d in self.dims(t)) for t in op.inputs)
        sub += "->" + "".join(letters[d] for d in self.dims(op.output))
        return jnp.einsum(sub, *(self.env[t] for t in op.inputs))

    def _elementwise(self, op: O.Elementwise) -> jax.Array:
        out = self.dims(op.output)
        return ELEMENTWISE_IMPL[op.fn](*(self.arg(t, out) for t in op.inputs), **op.param)

    def _reduce(self, op: O.Reduce) -> jax.Array:
        x, xd = self.env[op.inputs[0]], self.dims(op.inputs[0])
        out = self.dims(op.output)
        axes = tuple(i for i, d in enumerate(xd) if d not in out)
        y = {"sum": jnp.sum, "mean": jnp.mean, "max": jnp.max}[op.fn](x, axis=axes)
        return align(y, [d for d in xd if d in out], out)

    def _axis(self, op: O.Op) -> int:
        return self.dims(op.output).index(op.dim)  # type: ignore[attr-defined]

    def _softmax(self, op: O.Softmax) -> jax.Array:
        return _softmax(self.arg(op.inputs[0], self.dims(op.output)), self._axis(op))

    def _softmax_grad(self, op: O.SoftmaxGrad) -> jax.Array:
        y, dy = (self.arg(t, self.dims(op.output)) for t in op.inputs)
        return _softmax_backward(y, dy, self._axis(op))

    def _layer_norm(self, op: O.LayerNorm) -> jax.Array:
        x = self.arg(op.inputs[0], self.dims(op.output))
        return _layer_norm(x, self._axis(op), op.eps, op.center)

    def _layer_norm_grad(self, op: O.LayerNormGrad) -> jax.Array:
        x, dy = (self.arg(t, self.dims(op.output)) for t in op.inputs)
        return _layer_norm_backward(x, dy, self._axis(op), op.eps, op.center)

    def _reshape(self, op: O.Reshape) -> jax.Array:
        x, xd = self.env[op.inputs[0]], self.dims(op.inputs[0])
        out = self.dims(op.output)
        items: list[tuple[tuple[str, ...], tuple[str, ...]]] = list(op.groups)
        grouped = {d for src, _ in op.groups for d in src}
        items += [((d,), (d,)) for d in xd if d not in grouped]
        items.sort(key=lambda it: min(out.index(d) for d in it[1]))
        order = [xd.index(d) for src, _ in items for d in src]
        sizes = self.g.dims
        mid = [d for _, dst in items for d in dst]
        y = jnp.transpose(x, order).reshape([sizes[d] for d in mid])
        return jnp.transpose(y, [mid.index(d) for d in out])

    def _gather(self, op: O.Gather) -> jax.Array:
        table, ids = op.inputs
        td = self.dims(table)
        ax = td.index(op.dim)
        index = (slice(None),) * ax + (self.env[ids],)
        y = self.env[table].at[index].get(mode="promise_in_bounds")  # ids are in range (no masking)
        yd = [*td[:ax], *self.dims(ids), *td[ax + 1:]]
        return align(y, yd, self.dims(op.output))

    def _scatter_add(self, op: O.ScatterAdd) -> jax.Array:
        # Index with the ids array as it is (no flattening: merging the ids' dims would
        # make XLA gather ids and dy over the axes splitting the minor ones).
        ids, dy = op.inputs
        out = self.dims(op.output)
        other = [d for d in out if d != op.dim]
        idd = self.dims(ids)
        upd = self.arg(dy, [*idd, *other])
        zeros = jnp.zeros([self.g.dims[op.dim], *(self.g.dims[d] for d in other)], upd.dtype)
        y = zeros.at[self.env[ids]].add(upd, mode="promise_in_bounds")
        return align(y, [op.dim, *other], out)

    def _slice(self, op: O.Slice) -> jax.Array:
        x, xd = self.env[op.inputs[0]], self.dims(op.inputs[0])
        ax = xd.index(op.dim)
        y = jax.lax.slice_in_dim(x, op.start, op.start + self.g.dims[op.out_dim], axis=ax)
        return align(y, [op.out_dim if d == op.dim else d for d in xd], self.dims(op.output))

    def _pad(self, op: O.Pad) -> jax.Array:
        x, xd = self.env[op.inputs[0]], self.dims(op.inputs[0])
        after = self.g.dims[op.out_dim] - op.start - self.g.dims[op.dim]
        y = jnp.pad(x, [(op.start, after) if d == op.dim else (0, 0) for d in xd])
        return align(y, [op.out_dim if d == op.dim else d for d in xd], self.dims(op.output))

    def _concat(self, op: O.Concat) -> jax.Array:
        out = self.dims(op.output)
        parts = [align(self.env[t], [op.out_dim if e == d else e for e in self.dims(t)], out)
                 for t, d in zip(op.inputs, op.dims, strict=True)]
        return jnp.concatenate(parts, axis=out.index(op.out_dim))

    def _class_last(self, logits: str, dim: str) -> tuple[jax.Array, list[str]]:
        """``logits`` with the class dim ``dim`` last, and the other dims in their order."""
        rest = [d for d in self.dims(logits) if d != dim]
        return self.arg(logits, [*rest, dim]), rest

    def _cross_entropy(self, op: O.CrossEntropy) -> jax.Array:
        logits, rest = self._class_last(op.inputs[0], op.dim)
        loss = _cross_entropy(logits, self.arg(op.inputs[1], rest))
        return align(loss, rest, self.dims(op.output))

    def _cross_entropy_grad(self, op: O.CrossEntropyGrad) -> jax.Array:
        logits, rest = self._class_last(op.inputs[0], op.dim)
        g = _cross_entropy_backward(logits, self.arg(op.inputs[1], rest), self.arg(op.inputs[2], rest))
        return align(g, [*rest, op.dim], self.dims(op.output))


    def run_blocks(self, policy: str) -> Arrays:
        """Run the ops, each block's run of consecutive ops (``op.block``, a transformer layer) under
        ``jax.checkpoint`` with the remat ``policy``: ``full`` saves only the block's inputs, ``selective`` also
        the outputs of matmuls with a parameter operand, ``full:N`` checkpoints the first N blocks as ``full``
        and runs the others plainly (the cost model's policies, :mod:`layoutsearch.ir.remat`). Tensors internal
        to a checkpointed block are not in the result."""
        first = recomputed_blocks(self.g, policy, ValueError)
        saved = selective_saved(self.g) if policy == "selective" else frozenset()
        jax_policy = jax.checkpoint_policies.save_only_these_names(*sorted(saved)) if saved else None
        constrain = self.constrain
        if saved:
            def constrain(name: str, x: jax.Array) -> jax.Array:
                x = self.constrain(name, x) if self.constrain else x
                return checkpoint_name(x, name) if name in saved else x
        consumers = self.g.consumers
        for seg in _block_runs(self.g.ops):
            if seg[0].block not in first:
                self.run(seg)
                continue
            produced = {op.output for op in seg}
            reads = list(dict.fromkeys(i for op in seg for i in op.inputs if i not in produced))
            names = {op.name for op in seg}
            leaving = [op.output for op in seg if op.output == self.g.loss
                       or any(c.name not in names for c in consumers[op.output])]

            def block(vals: list[jax.Array], seg: list[O.Op] = seg, reads: list[str] = reads,
                      leaving: list[str] = leaving) -> list[jax.Array]:
                env = _Interpreter(self.g, dict(zip(reads, vals, strict=True)), constrain, self.flash).run(seg)
                return [env[t] for t in leaving]

            outs = jax.checkpoint(block, policy=jax_policy)([self.env[t] for t in reads])
            self.env.update(zip(leaving, outs, strict=True))
        return self.env


def _block_runs(ops: Sequence[O.Op]) -> list[list[O.Op]]:
    """``ops`` cut into maximal runs of consecutive ops of the same block."""
    runs: list[list[O.Op]] = []
    for op in ops:
        if runs and runs[-1][0].block == op.block:
            runs[-1].append(op)
        else:
            runs.append([op])
    return runs


def selective_saved(graph: Graph) -> frozenset[str]:
    """What selective remat keeps of a block: the outputs of forward matmuls with a parameter operand (the
    projections; Korthikanti et al. 2022), as in :mod:`layoutsearch.costmodel.memory`."""
    params = {t.name for t in graph.parameters}
    return frozenset(op.output for op in graph.ops if isinstance(op, O.Einsum) and op.phase == "forward"
                     and any(i in params for i in op.inputs))


def run_graph(graph: Graph, feeds: Mapping[str, jax.Array], constrain: Constrain | None = None,
              remat: str = "none", attention: str = "standard") -> Arrays:
    """Evaluate every op of ``graph``; returns every tensor (fed and produced) by name.

    ``feeds`` must hold every input, parameter and optimizer-state tensor. ``remat`` (``none``,
    ``selective``, ``full``, ``full:N``): each block it recomputes runs under ``jax.checkpoint`` with that
    policy, so its differentiation recomputes what the policy drops; the result then lacks the tensors
    internal to those blocks. ``attention``: ``standard`` (the ops as they are) or ``flash`` (each attention
    core of :func:`flash_cores` checkpointed: its backward pass recomputes the scores); the result then lacks
    the cores' scores."""
    missing = [t.name for t in graph.fed if t.name not in feeds]
    if missing:
        raise KeyError(f"missing feeds for {missing}")
    parse_remat(remat, ValueError)
    env = {k: (constrain(k, v) if constrain else v) for k, v in feeds.items()}
    flash = check_attention(attention, LayoutError, auto=False) == "flash"
    interpreter = _Interpreter(graph, env, constrain, flash_cores(graph) if flash else None)
    return interpreter.run() if remat == "none" else interpreter.run_blocks(remat)


def batch_reduction(graph: Graph, batch_dim: str = "batch") -> str:
    """``"mean"`` or ``"sum"``: how ``graph``'s loss reduces over ``batch_dim`` (what combining the losses of
    micro-batches or data shards needs); GraphError when the loss is neither."""
    op = graph.producer(graph.loss) if graph.loss else None
    src = graph.tensors[op.inputs[0]] if op is not None and op.inputs else None
    if not isinstance(op, O.Reduce) or op.fn not in ("mean", "sum") or src is None or batch_dim not in src.dim_names:
        raise GraphError(f"splitting the batch needs a loss that is a mean or sum over {batch_dim!r}; "
                      f"{graph.loss!r} of {graph.name!r} is not")
    return op.fn


def forward_fn(graph: Graph) -> Callable[[Mapping[str, jax.Array], Mapping[str, jax.Array]], jax.Array]:
    """``f(params, inputs) -> loss``: the forward graph as a function to differentiate in reverse mode
    (``jax.grad``, ``jax.vjp``): its softmax, layer norms, activations and cross-entropy have custom VJPs
    (what their backward passes keep), so forward mode (``jax.jvp``, ``jax.jacfwd``) does not apply."""
    if graph.loss is None:
        raise ValueError(f"graph {graph.name!r} has no loss")

    def f(params: Mapping[str, jax.Array], inputs: Mapping[str, jax.Array]) -> jax.Array:
        return run_graph(graph, {**params, **inputs})[graph.loss]

    return f


def init_params(graph: Graph, seed: int = 0) -> Arrays:
    """Deterministic parameters (scaled normal, fan-in from the first dim) and
    zero optimizer state, from ``seed``; the same seed gives the same values
    on any device count. Master weights (``meta["training"]["master_weights"]``)
    start as their parameter's values, in their own dtype."""
    out: Arrays = {}
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray] = {}
    for t in graph.tensors.values():
        if t.role == "parameter" and graph.producer(t.name) is None:
            fan_in = t.dims[0].size if len(t.dims) > 1 else 1
            values[t.name] = rng.standard_normal([d.size for d in t.dims], dtype=np.float32) / np.sqrt(fan_in)
            out[t.name] = jnp.asarray(values[t.name], dtype=jax_dtype(t))
    masters = graph.meta.get("training", {}).get("master_weights") or {}
    for p, master in masters.items():
        out[master] = jnp.asarray(values[p], dtype=jax_dtype(graph.tensors[master]))
    for t in graph.tensors.values():
        if t.role == "optimizer_state" and graph.producer(t.name) is None and t.name not in out:
            out[t.name] = jnp.zeros([d.size for d in t.dims], jax_dtype(t))
    return out


def random_inputs(graph: Graph, seed: int = 0) -> Arrays:
    """Deterministic data inputs: normal floats; int ids in range of the dim
    they index (the ``dim`` of the Gather/CrossEntropy op reading them); a constant tensor's own values
    (:mod:`layoutsearch.ir.constants`)."""
    rng = np.random.default_rng(seed + 1)
    bound: dict[str, int] = {}
    for op in graph.ops:
        if isinstance(op, (O.Gather, O.CrossEntropy, O.CrossEntropyGrad)):
            bound[op.inputs[1]] = graph.dims[op.dim]
        elif isinstance(op, O.ScatterAdd):
            bound[op.inputs[0]] = graph.dims[op.dim]
    out: Arrays = {}
    constants = constant_values(graph.tensors, graph.meta)
    for t in graph.inputs:
        shape = [d.size for d in t.dims]
        if t.name in constants:
            out[t.name] = jnp.asarray(constants[t.name], dtype=jax_dtype(t))
        elif t.is_float:
            out[t.name] = jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=jax_dtype(t))
        else:
            out[t.name] = jnp.asarray(rng.integers(0, bound.get(t.name, 2), size=shape), dtype=jnp.int32)
    return out


def user_arrays(graph: Graph, tree: Any, arg: int, what: str) -> dict[str, np.ndarray]:
    """The values of ``graph``'s tensors in ``tree``, argument ``arg`` of the function the graph was imported
    from (its pytree paths name the tensors, :func:`~layoutsearch.ir.names.leaf_tensors`: a leaf itself, a
    scanned stack's slices, a static slice), as float32 numpy arrays (ids as int32). ``what`` names the
    argument in errors. Raises LayoutError for a tensor whose shape is not the array's."""
    names = graph.meta.get("arguments") or []
    default = names[arg] if arg < len(names) else f"arg{arg}"
    out: dict[str, np.ndarray] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key = pytree_key(path) or default
        value = np.asarray(leaf)
        for name, index in leaf_tensors(graph.tensors, key):
            t = graph.tensors[name]
            part = value[index] if index else value
            want = tuple(d.size for d in t.dims)
            if tuple(s for s in part.shape if s != 1) != tuple(s for s in want if s != 1):
                raise LayoutError(f"{what}: array {key!r} of shape {list(value.shape)} does not hold tensor "
                                  f"{name!r} of shape {list(want)} (dims {list(t.dim_names)})")
            out[name] = part.reshape(want).astype(np.float32 if t.is_float else np.int32)
    return out
