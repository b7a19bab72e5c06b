"""The elementwise functions of the IR: each one's arity and attributes, and the derivative of each unary one.

:class:`~layoutsearch.ir.ops.Elementwise` ops name a function of :data:`ELEMENTWISE_FNS`; the training graph
(:mod:`layoutsearch.ir.training`) differentiates a unary one with :data:`UNARY_GRAD`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElementwiseFn:
    """An elementwise function: its arity and the attributes it takes."""

    name: str
    arity: int
    attrs: tuple[str, ...] = ()


def _fns(*specs: tuple[str, int, tuple[str, ...]]) -> dict[str, ElementwiseFn]:
    return {n: ElementwiseFn(n, a, at) for n, a, at in specs}


ELEMENTWISE_FNS: dict[str, ElementwiseFn] = _fns(
    # unary
    ("identity", 1, ()), ("neg", 1, ()), ("scale", 1, ("factor",)), ("square", 1, ()),
    ("relu", 1, ()), ("gelu", 1, ()), ("silu", 1, ()), ("tanh", 1, ()), ("sigmoid", 1, ()),
    ("exp", 1, ()), ("log", 1, ()), ("sqrt", 1, ()), ("rsqrt", 1, ()),
    # binary
    ("add", 2, ()), ("sub", 2, ()), ("mul", 2, ()), ("div", 2, ()), ("eq", 2, ()),
    # from imported JAX programs (layoutsearch.importer): x + offset, x ** exponent, erf, sin and cos (rotary
    # tables of position ids given as inputs, as MaxText's RotaryEmbedding computes them), stop_gradient
    # (identity; no gradient flows), max(a, b), comparisons (1.0 where true, else 0.0), where(c, a, b) = a
    # where c != 0, else b
    ("shift", 1, ("offset",)), ("pow", 1, ("exponent",)), ("erf", 1, ()), ("stop_gradient", 1, ()),
    ("maximum", 2, ()), ("ne", 2, ()), ("lt", 2, ()), ("le", 2, ()), ("gt", 2, ()), ("ge", 2, ()),
    ("where", 3, ()), ("sin", 1, ()), ("cos", 1, ()),
    # their gradients: pow_grad(x, dy) = exponent * x ** (exponent - 1) * dy; maximum_grad(x, other, dy) =
    # dy where x > other, dy / 2 where equal, else 0; where_grad_true(c, dy) = dy where c != 0, else 0;
    # where_grad_false(c, dy) the other way round
    ("pow_grad", 2, ("exponent",)), ("erf_grad", 2, ()), ("maximum_grad", 3, ()), ("where_grad_true", 2, ()),
    ("where_grad_false", 2, ()), ("sin_grad", 2, ()), ("cos_grad", 2, ()),
    # constant: fill(x) = value everywhere (x gives only dims and ordering; no gradient flows)
    ("fill", 1, ("value",)),
    # random: dropout_mask(x) = 1 with probability 1 - rate, else 0, drawn per element from the integer ``seed``
    # (x gives only dims and ordering; no gradient flows; the output may be a byte mask, uint8); dropout is
    # scale(mul(x, dropout_mask(x)), 1 / (1 - rate))
    ("dropout_mask", 1, ("rate", "seed")),
    # gradients of unary functions: fn_grad(x, dy) = fn'(x) * dy
    ("square_grad", 2, ()), ("relu_grad", 2, ()), ("gelu_grad", 2, ()), ("silu_grad", 2, ()),
    ("tanh_grad", 2, ()), ("sigmoid_grad", 2, ()), ("exp_grad", 2, ()), ("log_grad", 2, ()),
    ("sqrt_grad", 2, ()), ("rsqrt_grad", 2, ()),
    # gradient of a / b with respect to b: div_rhs_grad(a, b, dy) = -dy * a / b**2
    ("div_rhs_grad", 3, ()),
    # optimizers
    ("sgd", 2, ("lr",)),                     # sgd(p, g) = p - lr * g
    ("adam_m", 2, ("b1",)),                  # adam_m(m, g) = b1 * m + (1 - b1) * g
    ("adam_v", 2, ("b2",)),                  # adam_v(v, g) = b2 * v + (1 - b2) * g**2
    # adam_update(p, m_new, v_new) = p - lr * mhat / (sqrt(vhat) + eps),
    # mhat = m_new / (1 - b1**step), vhat = v_new / (1 - b2**step)
    ("adam_update", 3, ("lr", "b1", "b2", "eps", "step")),
)
"""Every elementwise function the IR knows, by name."""

UNARY_GRAD: dict[str, str] = {
    f: f"{f}_grad" for f in ("square", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt",
                             "erf", "sin", "cos")
}
"""Unary function -> the binary function ``grad(x, dy)`` of its derivative."""

__all__ = ["ELEMENTWISE_FNS", "UNARY_GRAD", "ElementwiseFn"]
