"""Per-op FLOP counts, as XLA's cost analysis counts the backend's lowering.

:func:`op_flops` counts one op at given dim sizes (global, or local under a computation layout);
:func:`is_matmul` tells a matmul from vector work; :func:`constant_tensors` lists the tensors XLA folds to
constants; :func:`matmul_dims` shapes an einsum as a batched matmul. The layout rules that use them are in
:mod:`layoutsearch.costmodel.ops`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor

ELEMENTWISE_FLOPS: dict[str, float] = {
    "identity": 0, "fill": 0, "neg": 1, "scale": 1, "square": 1, "relu": 1, "gelu": 8, "silu": 4, "tanh": 0,
    "sigmoid": 3, "exp": 0, "log": 0, "sqrt": 0, "rsqrt": 0, "add": 1, "sub": 1, "mul": 1, "div": 1, "eq": 2,
    "square_grad": 2, "relu_grad": 2, "gelu_grad": 20, "silu_grad": 9, "tanh_grad": 4, "sigmoid_grad": 6,
    "exp_grad": 1, "log_grad": 1, "sqrt_grad": 2, "rsqrt_grad": 3, "div_rhs_grad": 4,
    "sgd": 2, "adam_m": 3, "adam_v": 4, "adam_update": 5, "dropout_mask": 35,
    "shift": 1, "erf": 0, "erf_grad": 4, "stop_gradient": 0, "maximum": 1, "maximum_grad": 5,
    "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2, "where": 1, "where_grad_true": 1, "where_grad_false": 1,
    "sin": 0, "cos": 0, "sin_grad": 1, "cos_grad": 2,
    "pow": 0, "pow_grad": 0,  # per exponent: integer_pow_flops
}
"""FLOPs per output element of each elementwise function, as XLA's cost
analysis counts the backend's lowering (:mod:`layoutsearch.backend.program`):
one per arithmetic HLO instruction (add, multiply, compare, select, convert,
...); transcendentals (exp, log, tanh, logistic, sqrt, rsqrt, power) are
counted apart by XLA and not here; constant sub-expressions are folded (e.g.
Adam's bias corrections). ``gelu`` is the tanh approximation. ``dropout_mask``:
34 for ``jax.random.bernoulli`` (threefry bits, their conversion to a uniform
float, the comparison; XLA:CPU's lowering of threefry is a rolled loop whose
body the cost analysis counts once, where the loop runs 5 times) and 1 for
the select of the scaled value; XLA also counts 7 FLOPs per op that do not
scale with its size (the loop counter and key schedule), which the table
leaves out. JAX lowers threefry unrolled for GPUs and TPUs: 121 FLOPs per
element there (as XLA counts it)."""

WHERE_FNS = ("where", "where_grad_true", "where_grad_false")
"""Selects by a 0/1 condition: one compare per element of the condition (a mask ``[batch, seq]`` broadcast over
``d_model`` is compared at ``[batch, seq]``, and a gradient's select shares its forward's compare) and one
select per output element."""

FORWARD_SHARED_FLOPS: dict[str, float] = {"gelu_grad": 7, "silu_grad": 3, "sigmoid_grad": 3}
"""FLOPs per element of ``fn_grad(x, dy)`` that XLA shares (CSE) with the forward
``fn(x)`` when the graph computes it too (the derivative re-evaluates part of
the function, e.g. gelu's ``tanh`` argument)."""


def integer_pow_flops(op: O.Elementwise) -> float:
    """FLOPs per element of ``pow``/``pow_grad`` with an integer exponent ``n``: JAX's ``integer_pow``
    multiplies by repeated squaring (``floor(log2 |n|) + popcount(|n|) - 1`` products, one more division
    when ``n < 0``); the gradient ``n * x ** (n - 1) * dy`` two products more. Other exponents lower to
    ``pow``, a transcendental XLA counts apart (0 here, like ``exp``)."""
    if op.fn not in ("pow", "pow_grad"):
        return 0
    n = op.param["exponent"] - (1 if op.fn == "pow_grad" else 0)
    extra = 2 if op.fn == "pow_grad" else 0
    if not float(n).is_integer():
        return extra
    m = abs(int(n))
    products = 0 if m <= 1 else m.bit_length() - 1 + bin(m).count("1") - 1
    return products + (1 if n < 0 else 0) + extra


def op_flops(graph: Graph, op: O.Op, sizes: dict[str, int] | None = None, *, split: frozenset[str] = frozenset(),
             constant: frozenset[str] = frozenset(), forward_shared: bool = False) -> float:
    """FLOPs of ``op`` (multiply-add = 2) as XLA's cost analysis counts the
    backend's lowering, with the dims sized ``sizes`` (default: the graph's,
    i.e. the global op; per device: the local sizes under a computation layout).

    ``split``: dims of the op split over mesh axes; ``constant``: tensors XLA
    folds to constants (their ops cost nothing); ``forward_shared``: the graph
    also computes the forward function of a ``*_grad`` elementwise op on the
    same input (see :data:`FORWARD_SHARED_FLOPS`). Per op, with ``N`` the
    elements of the iteration space and ``R = N / size(dim)`` its rows:

    * einsum: ``2 N`` per product (one input: ``N - out`` if it reduces);
    * elementwise: :data:`ELEMENTWISE_FLOPS` per output element, plus one per
      element of each operand of another dtype (its convert); selects: :data:`WHERE_FNS`;
    * reduce: sum/max ``N - out``, mean ``N``;
    * softmax ``4N - R`` (max, subtract, sum, one divide per row, multiply);
      softmax_grad ``4N - R``; layer_norm ``5N + R``; layer_norm_grad ``7N``
      (the normalized input is shared with the forward); RMSNorm (layer_norm
      with ``center`` False) ``3N + R``, its gradient ``5N``; cross_entropy
      ``8N - R`` (one-hot compare and convert, log-softmax, select, sum,
      negate); cross_entropy_grad ``2N`` (log-softmax and one-hot shared with
      the forward), ``5N - R`` when ``dim`` is split (the log-softmax is
      recomputed);
    * gather: 3 per id (wrapping negative ids: compare, add, select); with
      ``dim`` split, 8 per id (the local range: offset, compare, clamp, ...)
      plus one select per output element (rows of other devices are zeros);
      scatter-add: one add per update element (plus the id offset per id when
      ``dim`` is split);
    * reshape: 0.

    All-reduces add one FLOP per element reduced; :class:`~layoutsearch.costmodel.ops.OpRules` adds them.
    """
    t = graph.tensors
    sz = sizes if sizes is not None else graph.dims
    count = lambda name: math.prod(sz[d] for d in t[name].dim_names)
    space = math.prod(sz[d] for d in op.iteration_dims(t))
    if op.output in constant:
        return 0.0
    if isinstance(op, O.Einsum):
        if len(op.inputs) == 1:
            return float(space - count(op.output) if op.reduced_dims(t) else 0)
        return 2.0 * (len(op.inputs) - 1) * space
    if isinstance(op, O.Elementwise):
        per = ELEMENTWISE_FLOPS[op.fn] + integer_pow_flops(op)
        if op.fn == "square_grad" and op.inputs[1] in constant:
            per = 1  # 2 * x * c: the constant factors fold
        elif (op.fn, op.param.get("lr", op.param.get("factor"))) in (("sgd", 1.0), ("scale", 1.0)):
            per -= 1  # multiplying by 1 folds away
        if forward_shared:
            per -= FORWARD_SHARED_FLOPS.get(op.fn, 0)
        if op.fn in WHERE_FNS:  # the condition compared at its own size (a mask broadcast after), once per mask
            return float(count(op.output)) + (0.0 if forward_shared else float(count(op.inputs[0])))
        # an operand of another dtype than the result is converted first (one FLOP per element, as XLA counts
        # a convert); fill and dropout_mask read only their operand's shape
        out_dtype = t[op.output].dtype
        converts = 0 if op.fn == "fill" or O.is_dropout_mask(op) else sum(
            count(i) for i in op.inputs if t[i].dtype != out_dtype)
        return per * float(count(op.output)) + converts
    if isinstance(op, O.Reduce):
        n_in = count(op.inputs[0])
        return float(n_in if op.fn == "mean" else n_in - count(op.output))
    if isinstance(op, (O.Softmax, O.SoftmaxGrad, O.LayerNorm, O.LayerNormGrad, O.CrossEntropy,
                       O.CrossEntropyGrad)):
        n, rows = space, space // sz[op.dim]
        if isinstance(op, (O.Softmax, O.SoftmaxGrad)):
            return float(4 * n - rows)
        if isinstance(op, O.LayerNorm):
            return float((5 if op.center else 3) * n + rows)
        if isinstance(op, O.LayerNormGrad):
            return float((7 if op.center else 5) * n)
        if isinstance(op, O.CrossEntropy):
            return float(8 * n - rows)
        return float(5 * n - rows if op.dim in split else 2 * n)
    if isinstance(op, O.Gather):
        ids = count(op.inputs[1])
        return float(8 * ids + count(op.output) if op.dim in split else 3 * ids)
    if isinstance(op, O.ScatterAdd):
        return float(count(op.inputs[1]) + (count(op.inputs[0]) if op.dim in split else 0))
    return 0.0  # reshape, slice, pad, concat: data movement only


SMALL_CONTRACTION = 8
"""An einsum contracting at most this many elements per output element (a 2 x 2 rotation, a gate) is vector
work, not a matmul: compilers lower it as multiplies and adds fused with its neighbours (XLA's dot strength
reduction; a fused rotary-embedding kernel), not as a tensor-core / MXU matmul."""


def is_matmul(op: O.Op, tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``op`` runs as a matmul: an einsum of two or more operands contracting more than
    :data:`SMALL_CONTRACTION` elements (global sizes)."""
    if not isinstance(op, O.Einsum) or len(op.inputs) < 2:
        return False
    sizes = {d.name: d.size for x in op.inputs for d in tensors[x].dims}
    return math.prod(sizes[d] for d in op.reduced_dims(tensors)) > SMALL_CONTRACTION


def constant_tensors(graph: Graph) -> frozenset[str]:
    """Tensors XLA computes at compile time: ``fill`` outputs and elementwise
    ops or reshapes of constants only (e.g. the loss seed and its scaling)."""
    const: set[str] = set()
    for op in graph.ops:
        if isinstance(op, O.Elementwise) and op.fn == "fill" or (
                isinstance(op, (O.Elementwise, O.Reshape, O.Slice, O.Pad, O.Concat)) and all(i in const for i in op.inputs)):
            const.add(op.output)
    return frozenset(const)


def matmul_dims(op: O.Einsum, t: Mapping[str, Tensor], sizes: Mapping[str, int]) -> tuple[int, int, int, int] | None:
    """A two-operand einsum as a batched matmul ``(batch, m, n, k)`` at the local sizes: batch dims are in
    both operands and the output, m (n) in the first (second) operand and the output, k contracted."""
    if len(op.inputs) != 2:
        return None
    a, b = (set(t[i].dim_names) for i in op.inputs)
    out = set(t[op.output].dim_names)
    size = lambda dims: math.prod(sizes[d] for d in dims)  # noqa: E731
    return (size(a & b & out), size((a - b) & out), size((b - a) & out), size((a & b) - out))
