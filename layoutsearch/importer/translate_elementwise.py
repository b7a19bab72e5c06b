"""Translation of elementwise primitives: arithmetic, comparisons, activations, selects and conversions, as
elementwise ops broadcasting by dim name (scalar constants folded into ``scale``/``shift`` or a ``fill``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from layoutsearch.importer.trace import Const, Lit, Node, Operand, Var
from layoutsearch.importer.translate_base import FLOAT_DTYPES, TranslatorBase, Val
from layoutsearch.ir import ops as O

UNARY_PRIMITIVES = {"neg": "neg", "exp": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid",
                    "sqrt": "sqrt", "rsqrt": "rsqrt", "square": "square", "erf": "erf",
                    "sin": "sin", "cos": "cos",
                    "stop_gradient": "stop_gradient"}
COMPARE_PRIMITIVES = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
EXACT_INTEGER_FNS = frozenset({"add", "sub", "mul", "neg", "maximum", "relu", "shift", "scale", "where", "identity"})
"""Elementwise functions whose float32 result is the integer result for integer operands below 2**24 (positions
counted from a mask, ``ids + offset``): integer arrays take part in them as floats, read back as ids where a
gather or cross-entropy takes them."""

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint32")

ALIAS_PRIMITIVES = {"copy", "copy_p", "sharding_constraint", "optimization_barrier", "convert_element_type",
                    "reduce_precision", "name"}
"""Primitives translated without a rule of their own: unary functions and comparisons (primitive ->
elementwise function), and aliases (the value itself, or a float conversion; ``name`` is
``jax.ad_checkpoint.checkpoint_name``, which tags a value for a remat policy: MaxText's layers tag their
inputs and projections)."""


class ElementwiseRules(TranslatorBase):
    """The rules for elementwise primitives."""

    def elementwise(self, fn: str, operands: Sequence[Operand], out: Var, **params: float) -> Val:
        """Elementwise ``fn``; a literal operand becomes a ``fill`` tensor of its partner's dims."""
        vals: list[Val | None] = [None if isinstance(o, Lit) else self.val(o) for o in operands]
        if out.dtype not in FLOAT_DTYPES and out.dtype != "bool" and fn not in EXACT_INTEGER_FNS:
            raise self.unsupported(f"{fn} of {out.dtype} values (integer arithmetic is done in float32, exact "
                                   f"below 2**24, for {', '.join(sorted(EXACT_INTEGER_FNS))})")
        vals = [self.as_float(v) if v is not None and self.dtype(v) not in FLOAT_DTYPES else v for v in vals]
        if all(v is None for v in vals):
            raise self.unsupported("every operand is a constant")
        rank = len(out.shape)
        labels: list[int | None] = [None] * rank
        for v in vals:
            if v is not None and len(v.labels) == rank:
                labels = [a if a is not None else b for a, b in zip(labels, v.labels, strict=True)]
        labels = self.distinct(labels)
        ins: list[str] = []
        partner = next(v for v in vals if v is not None)
        for o, v in zip(operands, vals, strict=True):
            if v is None:
                assert isinstance(o, Lit)
                if not math.isfinite(o.value):
                    raise self.unsupported(f"a constant {o.value} in {fn}")
                ins.append(self.emit(O.Elementwise, "fill", [partner.tensor], partner.labels, self.dtype(partner),
                                     fn="fill", params=(("value", o.value),)).tensor)
            elif len(v.labels) != rank:  # a scalar operand
                ins.append(v.tensor)
            else:
                ins.append(self.conform(v, labels).tensor)
        dtype = out.dtype if out.dtype in FLOAT_DTYPES else self.dtype(partner)  # bools and counts: floats
        return self.emit(O.Elementwise, fn, ins, labels, dtype, fn=fn, params=tuple(params.items()))

    def _alias(self, node: Node) -> None:
        """A value itself (copies, sharding constraints), or converted: between floats, an integer to a float,
        a boolean (a 0/1 float here) to an integer count. An integer tensor made a float is not an id again."""
        src = node.ins[0]
        v = self.val(src)
        if node.prim == "convert_element_type":
            new = node.outs[0].dtype
            old = self.dtype(v)
            if new in FLOAT_DTYPES and old in FLOAT_DTYPES and new != old:
                v = self.emit(O.Elementwise, "convert", [self.dense(v).tensor], v.labels, new, fn="identity")
            elif new in FLOAT_DTYPES and old not in FLOAT_DTYPES:
                v = self.as_float(v, new)
            elif new not in FLOAT_DTYPES and old in FLOAT_DTYPES and node.ins[0].dtype not in ("bool", *INT_DTYPES):
                raise self.unsupported(f"a conversion from {node.ins[0].dtype} to {new}")
        for o in node.outs:
            self.vals[o] = v

    def _binary(self, node: Node) -> Val:
        return self.elementwise(node.prim, node.ins, node.outs[0])

    def _literal_arith(self, node: Node) -> Val | None:
        """``x op c`` with a scalar constant ``c`` as one elementwise op (``scale``, ``shift``)."""
        a, b = node.ins
        out = node.outs[0]
        lit, x = (a, b) if isinstance(a, Lit) else (b, a)
        if not isinstance(lit, Lit) or isinstance(x, Lit):
            return None
        c, first = lit.value, lit is a
        if node.prim == "div" and out.dtype not in FLOAT_DTYPES:
            raise self.unsupported(f"an integer division of {out.dtype} values (integer arithmetic is done in "
                                   f"float32, exact below 2**24, for {', '.join(sorted(EXACT_INTEGER_FNS))})")
        if node.prim == "mul" or (node.prim == "div" and not first):
            factor = c if node.prim == "mul" else 1.0 / c
            v = self.val(x)
            if v.tensor in self.negated:  # -x * c: x * -c, as XLA's simplifier folds it
                x, factor = self.negated[v.tensor], -factor
            return self.val(x) if factor == 1 else self.elementwise("scale", [x], out, factor=factor)
        if node.prim in ("add", "sub") and not (node.prim == "sub" and first):
            offset = c if node.prim == "add" else -c
            return self.val(x) if offset == 0 else self.elementwise("shift", [x], out, offset=offset)
        if node.prim == "sub":  # c - x
            neg = self.elementwise("neg", [x], out)
            return self._wrap_elementwise("shift", neg, out, offset=c)
        if node.prim == "div":  # c / x
            inv = self.elementwise("pow", [x], out, exponent=-1.0)
            return inv if c == 1 else self._wrap_elementwise("scale", inv, out, factor=c)
        return None

    def _wrap_elementwise(self, fn: str, v: Val, out: Var, **params: float) -> Val:
        return self.emit(O.Elementwise, fn, [v.tensor], v.labels, self.dtype(v), fn=fn, params=tuple(params.items()))

    def _add(self, node: Node) -> Val:
        return self._literal_arith(node) or self._binary(node)

    _sub = _mul = _div = _add

    def _max(self, node: Node) -> Val:
        a, b = node.ins
        lit, x = (a, b) if isinstance(a, Lit) else (b, a)
        if isinstance(lit, Lit) and not isinstance(x, Lit):
            if lit.value == -math.inf:
                return self.val(x)
            if lit.value == 0:
                return self.elementwise("relu", [x], node.outs[0])
            shifted = self.elementwise("shift", [x], node.outs[0], offset=-lit.value)
            r = self._wrap_elementwise("relu", shifted, node.outs[0])
            return self._wrap_elementwise("shift", r, node.outs[0], offset=lit.value)
        return self.elementwise("maximum", node.ins, node.outs[0])

    def _integer_pow(self, node: Node) -> Val:
        y = node.params["y"]
        if y == 1:
            return self.val(node.ins[0])
        if y == 2:
            return self.elementwise("square", node.ins, node.outs[0])
        return self.elementwise("pow", node.ins, node.outs[0], exponent=float(y))

    def _pow(self, node: Node) -> Val:
        if not isinstance(node.ins[1], Lit):
            raise self.unsupported("a power with a tensor exponent")
        return self.elementwise("pow", node.ins[:1], node.outs[0], exponent=node.ins[1].value)

    def _select_n(self, node: Node) -> Val:
        if len(node.ins) != 3:
            raise self.unsupported("select_n with more than two cases")
        pred, on_false, on_true = node.ins
        if isinstance(pred, Const):
            pred = pred.uniform() or pred
        if isinstance(pred, Lit):  # a constant choice (jnp.var's guard of an empty reduction): that case itself
            chosen = on_true if pred.value else on_false
            if isinstance(chosen, Lit):
                raise self.unsupported("a select of constants only")
            return self.val(chosen)
        return self.elementwise("where", [pred, on_true, on_false], node.outs[0])

    def _gelu(self, node: Node) -> Val:
        return self.elementwise("gelu", node.ins, node.outs[0])

    def _silu(self, node: Node) -> Val:
        return self.elementwise("silu", node.ins, node.outs[0])

    def _erfc(self, node: Node) -> Val:  # 1 - erf(x): the exact GELU of BERT, Linen's gelu(approximate=False)
        e = self.elementwise("erf", node.ins, node.outs[0])
        return self._wrap_elementwise("shift", self._wrap_elementwise("neg", e, node.outs[0]), node.outs[0], offset=1.0)

    def _log1p(self, node: Node) -> Val:
        return self._wrap_elementwise("log", self.elementwise("shift", node.ins, node.outs[0], offset=1.0), node.outs[0])

    def _expm1(self, node: Node) -> Val:
        return self._wrap_elementwise("shift", self.elementwise("exp", node.ins, node.outs[0]), node.outs[0], offset=-1.0)

    def _and(self, node: Node) -> Val:  # of booleans (0/1 floats here): a product; or: a maximum; not: 1 - x
        return self._logical(node, "mul")

    def _or(self, node: Node) -> Val:
        return self._logical(node, "maximum")

    def _not(self, node: Node) -> Val:
        if node.outs[0].dtype != "bool":
            raise self.unsupported("a bitwise not of integers")
        neg = self.elementwise("neg", node.ins, node.outs[0])
        return self._wrap_elementwise("shift", neg, node.outs[0], offset=1.0)

    def _logical(self, node: Node, fn: str) -> Val:
        if node.outs[0].dtype != "bool":
            raise self.unsupported(f"a bitwise {node.prim} of integers")
        if any(isinstance(o, Lit) for o in node.ins):  # x and True, x or False: x; x and False: no value
            raise self.unsupported(f"a logical {node.prim} with a constant")
        return self.elementwise(fn, node.ins, node.outs[0])

    def _neg(self, node: Node) -> Val:
        out = self.elementwise("neg", node.ins, node.outs[0])
        if isinstance(node.ins[0], Var):
            self.negated[out.tensor] = node.ins[0]
        return out
