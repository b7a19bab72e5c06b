"""Translate a flattened JAX program (:mod:`layoutsearch.importer.trace`) into an IR graph.

Each value gets one label per axis (:mod:`layoutsearch.importer.labels`); each primitive becomes at most
a few IR ops over named dims:

* ``dot_general`` -> einsum (contracted and batch axes paired by name); ``transpose``, unit reshapes,
  ``squeeze``/``expand_dims``, ``copy``, sharding constraints -> no op (dims are named, not ordered);
* elementwise primitives -> elementwise ops, broadcasting by name: a ``broadcast_in_dim`` is not
  materialized unless a non-elementwise op reads it; scalar constants fold into ``scale``/``shift``
  (or a ``fill`` tensor); ``max(x, 0)`` is ``relu``;
* ``reduce_sum``/``reduce_max`` -> reduce; ``reshape`` splitting or merging dims -> reshape (split parts
  named from ``splits``, else ``name_0``, ``name_1``; merges ``a_b``);
* ``gather`` of whole rows (``table[ids]``, ``jnp.take``) -> gather; static full ``slice`` -> no op;
* the composites of :mod:`layoutsearch.importer.patterns` -> softmax, layer_norm, gelu, cross_entropy,
  mean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.importer.labels import Labels
from layoutsearch.importer.pending import DimRef, PendingGraph, PendingTensor
from layoutsearch.importer.trace import Lit, Node, Operand, Var
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph

BLOCK_PATTERN = re.compile(r"^(layer|layers|block|blocks|h)[._]?\d+$", re.IGNORECASE)
"""Scope names (``jax.named_scope``, Flax module names) that mark a repeated block: ``layer.3``,
``layers_0``, ``Block_2``, ``h.11``."""

_FLOAT = {"float32", "bfloat16", "float16"}
_UNARY = {"neg": "neg", "exp": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid", "sqrt": "sqrt",
          "rsqrt": "rsqrt", "square": "square", "erf": "erf", "stop_gradient": "stop_gradient"}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_ALIASES = {"copy", "copy_p", "sharding_constraint", "optimization_barrier", "convert_element_type",
            "reduce_precision"}


@dataclass(eq=False)
class Val:
    """What a program value is in the graph: an IR tensor and a label per axis (None: a size-1 axis the
    tensor does not have). Labels absent from the tensor are broadcast axes (virtual)."""

    tensor: str
    labels: tuple[int | None, ...]


class Translator:
    """Builds the IR graph of a flattened program, node by node."""

    def __init__(self, splits: Mapping[str, Sequence[str]] | None = None) -> None:
        self.labels = Labels()
        self.vals: dict[Var, Val] = {}
        self.keep: list[Val] = []  # every Val stays alive: their ids are label holders
        self.pending = PendingGraph(self.labels)
        self.tensors = self.pending.tensors
        self.splits = {k: tuple(v) for k, v in (splits or {}).items()}
        self.broadcasts: dict[tuple[str, tuple[int | None, ...]], Val] = {}
        self.views: dict[str, Val] = {}  # parts of function arguments read as tensors of their own
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
                labels.append(self.labels.named(given, size))
            else:
                labels.append(None if size == 1 else self.labels.placeholder(size, f"{_stem(name)}_{i}"))
        if len({self.labels.find(a) for a in labels if a is not None}) < sum(a is not None for a in labels):
            raise GraphError(f"{name}: a dim name appears twice in {list(dims or ())}")
        self.tensors[name] = PendingTensor(tuple(a for a in labels if a is not None), _dtype(var, name), role)
        self.vals[var] = self._val(name, labels)

    def val(self, v: Operand) -> Val:
        if isinstance(v, Lit):
            raise self.unsupported("a scalar constant in this position")
        return self.vals[v]

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

    # -- translation
    def run(self, nodes: Sequence[Node], block_of: Callable[[Node], str | None]) -> None:
        for node in nodes:
            self.node, self.block = node, block_of(node)
            rule = getattr(self, "_" + node.prim, None)
            if rule is None:
                if node.prim in _UNARY:
                    self.vals[node.outs[0]] = self.elementwise(_UNARY[node.prim], node.ins, node.outs[0])
                    continue
                if node.prim in _COMPARE:
                    self.vals[node.outs[0]] = self.elementwise(_COMPARE[node.prim], node.ins, node.outs[0])
                    continue
                if node.prim in _ALIASES:
                    self._alias(node)
                    continue
                raise self.unsupported("the importer has no rule for it")
            out = rule(node)
            if out is not None:
                self.vals[node.outs[0]] = out

    def elementwise(self, fn: str, operands: Sequence[Operand], out: Var, **params: float) -> Val:
        """Elementwise ``fn``; a literal operand becomes a ``fill`` tensor of its partner's dims."""
        vals: list[Val | None] = [None if isinstance(o, Lit) else self.val(o) for o in operands]
        if out.dtype not in _FLOAT and out.dtype != "bool":
            raise self.unsupported(f"arithmetic on {out.dtype} values (integer arrays may only be ids)")
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
                ins.append(self.emit(O.Elementwise, "fill", [partner.tensor], partner.labels, self.dtype(partner),
                                     fn="fill", params=(("value", o.value),)).tensor)
            elif len(v.labels) != rank:  # a scalar operand
                ins.append(v.tensor)
            else:
                ins.append(self.conform(v, labels).tensor)
        dtype = out.dtype if out.dtype in _FLOAT else self.dtype(partner)
        return self.emit(O.Elementwise, fn, ins, labels, dtype, fn=fn, params=tuple(params.items()))

    def _alias(self, node: Node) -> None:
        src = node.ins[0]
        v = self.val(src)
        if node.prim == "convert_element_type":
            new = node.outs[0].dtype
            old = self.dtype(v)
            if new in _FLOAT and old in _FLOAT and new != old:
                v = self.emit(O.Elementwise, "convert", [self.dense(v).tensor], v.labels, new, fn="identity")
            elif (new in _FLOAT) != (old in _FLOAT) and not (new in _FLOAT and node.ins[0].dtype == "bool"):
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
        if node.prim == "mul" or (node.prim == "div" and not first):
            factor = c if node.prim == "mul" else 1.0 / c
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
        return self.elementwise("where", [pred, on_true, on_false], node.outs[0])

    def _gelu(self, node: Node) -> Val:
        return self.elementwise("gelu", node.ins, node.outs[0])

    def _silu(self, node: Node) -> Val:
        return self.elementwise("silu", node.ins, node.outs[0])

    # -- shape ops
    def _transpose(self, node: Node) -> Val:
        v = self.val(node.ins[0])
        labels = [v.labels[p] for p in node.params["permutation"]]
        t = self.tensors[v.tensor]
        if t.role == "activation" and len(t.labels) == sum(a is not None for a in labels):
            t.labels = tuple(a for a in labels if a is not None)  # store it in the order it is read
        return self._val(v.tensor, labels)

    def _broadcast_in_dim(self, node: Node) -> Val:
        src, out = node.ins[0], node.outs[0]
        if isinstance(src, Lit):
            raise self.unsupported("a constant array (broadcast of a scalar): pass it as an argument")
        v = self.val(src)
        labels: list[int | None] = [None] * len(out.shape)
        for i, d in enumerate(node.params["broadcast_dimensions"]):
            if src.shape[i] == out.shape[d]:
                labels[d] = v.labels[i]
        for d, size in enumerate(out.shape):
            if labels[d] is None and size != 1:
                labels[d] = self.labels.placeholder(size, f"dim{size}")
        return self._val(v.tensor, labels)

    def _reshape(self, node: Node) -> Val:
        src, out = node.ins[0], node.outs[0]
        v = self.dense(self.val(src))
        ins = [(a, s) for a, s in zip(v.labels, src.shape, strict=True) if s != 1 or a is not None]
        outs = [i for i, s in enumerate(out.shape) if s != 1]
        labels: list[int | None] = [None] * len(out.shape)
        groups: list[tuple[tuple[DimRef, ...], tuple[DimRef, ...]]] = []
        i = j = 0
        while i < len(ins) or j < len(outs):
            gi, gj = [ins[i]] if i < len(ins) else [], [outs[j]] if j < len(outs) else []
            if not gi or not gj:
                if all(s == 1 for _, s in gi):  # a named size-1 dim dropped
                    i += len(gi)
                    j += len(gj)
                    continue
                raise self.unsupported("a reshape the importer cannot group")
            pi, pj = gi[0][1], out.shape[gj[0]]
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj and i < len(ins):
                    gi.append(ins[i])
                    pi *= ins[i][1]
                    i += 1
                elif pj < pi and j < len(outs):
                    gj.append(outs[j])
                    pj *= out.shape[outs[j]]
                    j += 1
                else:
                    raise self.unsupported("a reshape the importer cannot group")
            if len(gi) == 1 and len(gj) == 1:
                labels[gj[0]] = gi[0][0]
            elif len(gj) == 1:
                labels[gj[0]] = self._merged([a for a, _ in gi if a is not None], out.shape[gj[0]])
                groups.append((tuple(DimRef(a) for a, _ in gi if a is not None), (DimRef(labels[gj[0]]),)))
            elif len(gi) == 1 and gi[0][0] is not None:
                parts = self._split(gi[0][0], [out.shape[k] for k in gj])
                for k, a in zip(gj, parts, strict=True):
                    labels[k] = a
                groups.append(((DimRef(gi[0][0]),), tuple(DimRef(a) for a in parts)))
            else:
                raise self.unsupported("a reshape that regroups several dims into several others")
        if not groups:
            return self._val(v.tensor, labels)
        return self.emit(O.Reshape, "reshape", [v.tensor], labels, self.dtype(v), groups=tuple(groups))

    def _merged(self, parts: list[int], size: int) -> int:
        name = "_".join(self.labels.base(a) for a in parts)
        if all(self.labels.name(a) for a in parts):
            return self.labels.named(name, size)
        return self.labels.placeholder(size, name)

    def _split(self, a: int, sizes: list[int]) -> list[int]:
        base = self.labels.base(a)
        names = self.splits.get(base, tuple(f"{base}_{k}" for k in range(len(sizes))))
        if len(names) != len(sizes):
            raise self.unsupported(f"splits[{base!r}] names {len(names)} dims, the reshape makes {len(sizes)}")
        return [self.labels.named(n, s) for n, s in zip(names, sizes, strict=True)]

    def _squeeze(self, node: Node) -> Val:
        v = self.val(node.ins[0])
        dims = set(node.params["dimensions"])
        return self._val(v.tensor, [a for i, a in enumerate(v.labels) if i not in dims])

    def _expand_dims(self, node: Node) -> Val:
        return self._reshape(node)

    def _slice(self, node: Node) -> Val:
        starts = tuple(int(x) for x in node.params["start_indices"])
        if any(st not in (None, 1) for st in node.params.get("strides") or ()):
            raise self.unsupported("a strided slice")
        return self._static_slice(node, starts)

    def _dynamic_slice(self, node: Node) -> Val:
        if not all(isinstance(i, Lit) for i in node.ins[1:]):
            raise self.unsupported("a dynamic slice at a computed index")
        return self._static_slice(node, tuple(int(i.value) for i in node.ins[1:]))  # type: ignore[union-attr]

    def _static_slice(self, node: Node, starts: tuple[int, ...]) -> Val:
        """A static slice: the value itself when whole; of a function argument, a source tensor of its own
        (``pos_embed[0:16, 0:512]``: the rows a model reads of a longer table), whose cut axes take the
        name of the axes they meet (placeholders named after the argument's dim)."""
        src, out = node.ins[0], node.outs[0]
        v = self.val(src)
        if tuple(src.shape) == tuple(out.shape):
            return v
        t = self.tensors[v.tensor]
        if t.role == "activation":
            raise self.unsupported("a partial slice of a computed value (only slices of function arguments "
                                   "or whole arrays import)")
        bounds = ", ".join(f"{a}:{a + n}" for a, n in zip(starts, out.shape, strict=True))
        labels = [a if a is None or src.shape[i] == out.shape[i] else
                  self.labels.placeholder(out.shape[i], self.labels.base(a)) if out.shape[i] != 1 else None
                  for i, a in enumerate(v.labels)]
        return self._source_view(f"{v.tensor}[{bounds}]", labels, t)

    def _index(self, node: Node) -> Val:
        """Iteration ``i`` of a scan reads slice ``i`` of a stacked input: a source tensor of its own."""
        v = self.val(node.ins[0])
        t = self.tensors[v.tensor]
        if t.role == "activation" or v.labels[0] is None and node.ins[0].shape[0] != 1:
            raise self.unsupported("a scan over a computed array (only function arguments can be scanned)")
        return self._source_view(f"{v.tensor}[{node.params['index']}]", v.labels[1:], t)

    def _source_view(self, name: str, labels: Sequence[int | None], of: PendingTensor) -> Val:
        """The source tensor ``name`` (a part of source ``of``), made on first use."""
        if name not in self.views:
            self.tensors[name] = PendingTensor(tuple(a for a in labels if a is not None), of.dtype, of.role)
            self.views[name] = self._val(name, labels)
        return self.views[name]

    def _stack(self, node: Node) -> Val:
        raise self.unsupported("a scan's stacked outputs (the importer keeps only the carry)")

    # -- reductions and contractions
    def _reduce(self, node: Node, fn: str) -> Val:
        v = self.dense(self.val(node.ins[0]))
        axes = set(node.params["axes"])
        kept = [a for i, a in enumerate(v.labels) if i not in axes]
        out = self.emit(O.Reduce, fn, [v.tensor], kept, self.dtype(v), fn=fn)
        return self._val(out.tensor, _fit_units(kept, node.outs[0].shape, self.labels.size))

    def _reduce_sum(self, node: Node) -> Val:
        return self._reduce(node, "sum")

    def _reduce_max(self, node: Node) -> Val:
        return self._reduce(node, "max")

    def _reduce_mean(self, node: Node) -> Val:
        return self._reduce(node, "mean")

    def _dot_general(self, node: Node) -> Val:
        lhs, rhs = (self.dense(self.val(x)) for x in node.ins)
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        ll, rl = list(lhs.labels), list(rhs.labels)
        for i, j in zip((*lc, *lb), (*rc, *rb), strict=True):
            if ll[i] is None or rl[j] is None or self.labels.same(ll[i], rl[j]):
                continue
            if not self._holds(rl, ll[i]):
                rl[j] = ll[i]  # rename the rhs axis after the lhs one
            elif not self._holds(ll, rl[j]):
                ll[i] = rl[j]  # the rhs has that name elsewhere: rename the lhs axis instead
            else:
                ll[i] = rl[j] = self.labels.fresh(ll[i], {self.labels.find(a) for a in (*ll, *rl) if a is not None})
        lhs = self.relabel(lhs, ll) if ll != list(lhs.labels) else lhs
        paired = set(rc) | set(rb)
        lhs_roots = {self.labels.find(a) for a in ll if a is not None}
        for j, a in enumerate(rl):
            if j not in paired and a is not None and self.labels.find(a) in lhs_roots:
                rl[j] = self.labels.fresh(a, lhs_roots | {self.labels.find(b) for b in rl if b is not None})
        if len({self.labels.find(a) for a in rl if a is not None}) < sum(a is not None for a in rl):
            raise self.unsupported("a contraction whose axes the importer cannot name apart")
        rhs = self.relabel(rhs, rl) if rl != list(rhs.labels) else rhs
        free_l = [a for i, a in enumerate(ll) if i not in lc and i not in lb]
        free_r = [a for j, a in enumerate(rl) if j not in rc and j not in rb]
        labels = [ll[i] for i in lb] + free_l + free_r
        dtype = node.outs[0].dtype
        return self.emit(O.Einsum, "einsum", [lhs.tensor, rhs.tensor], labels,
                         dtype if dtype in _FLOAT else self.dtype(lhs))

    # -- composites (patterns)
    def _softmax(self, node: Node) -> Val:
        v = self.dense(self.val(node.ins[0]))
        return self.emit(O.Softmax, "softmax", [v.tensor], v.labels, self.dtype(v),
                         dim=DimRef(self._axis_label(v, node.params["axis"])))

    def _layer_norm(self, node: Node) -> Val:
        v = self.dense(self.val(node.ins[0]))
        out = self.emit(O.LayerNorm, "layer_norm", [v.tensor], v.labels, self.dtype(v),
                        dim=DimRef(self._axis_label(v, node.params["axis"])), eps=node.params["eps"],
                        center=node.params["center"])
        return self._val(out.tensor, _fit_units(list(v.labels), node.outs[0].shape, self.labels.size))

    def _cross_entropy(self, node: Node) -> Val:
        logits = self.dense(self.val(node.ins[0]))
        axis = node.params["axis"]
        dim = self._axis_label(logits, axis)
        rest = [a for i, a in enumerate(logits.labels) if i != axis]
        ids = self.conform(self.val(node.ins[1]), rest)
        out = self.emit(O.CrossEntropy, "cross_entropy", [logits.tensor, ids.tensor], rest, self.dtype(logits),
                        dim=DimRef(dim))
        return self._val(out.tensor, _fit_units(rest, node.outs[0].shape, self.labels.size))

    def _gather(self, node: Node) -> Val:
        table_v, ids_v = node.ins
        dn, sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
        table = self.dense(self.val(table_v))
        if (len(dn.start_index_map) != 1 or tuple(dn.collapsed_slice_dims) != tuple(dn.start_index_map)
                or getattr(dn, "operand_batching_dims", ()) or ids_v.shape[-1:] != (1,)):
            raise self.unsupported("a gather other than whole rows of a table (table[ids])")
        axis = dn.start_index_map[0]
        if any(s != (1 if k == axis else table_v.shape[k]) for k, s in enumerate(sizes)):
            raise self.unsupported("a gather of partial rows")
        ids = self.val(ids_v)
        id_labels = list(ids.labels[:-1])
        rows = [a for k, a in enumerate(table.labels) if k != axis]
        out_shape = node.outs[0].shape
        labels: list[int | None] = [None] * len(out_shape)
        offset = list(dn.offset_dims)
        batch = [d for d in range(len(out_shape)) if d not in offset]
        for d, a in zip(offset, rows, strict=True):
            labels[d] = a
        for d, a in zip(batch, id_labels, strict=True):
            labels[d] = a
        labels = self.distinct(labels)
        ids = self.conform(self._val(ids.tensor, id_labels), [labels[d] for d in batch])
        return self.emit(O.Gather, "gather", [table.tensor, ids.tensor], labels, self.dtype(table),
                         dim=DimRef(self._axis_label(table, axis)))

    def _holds(self, labels: Sequence[int | None], a: int) -> bool:
        r = self.labels.find(a)
        return any(b is not None and self.labels.find(b) == r for b in labels)

    def _axis_label(self, v: Val, axis: int) -> int:
        a = v.labels[axis]
        if a is None:
            raise self.unsupported("an op over a size-1 axis")
        return a

    # -- the graph
    def graph(self, name: str, loss: Var, meta: Mapping[str, Any]) -> Graph:
        """The IR graph of everything translated, with ``loss`` (a scalar) as its loss."""
        lv = self.vals[loss]
        if lv.labels or self.tensors[lv.tensor].role != "activation":
            raise GraphError("the function must return a scalar loss computed from its arguments "
                             f"(got a value of shape {list(loss.shape)})")
        return self.pending.build(name, lv.tensor, meta)


def _fit_units(labels: Sequence[int | None], shape: Sequence[int], size: Callable[[int], int]) -> list[int | None]:
    """``labels`` (the non-unit axes of a result, in order) placed on ``shape``, whose other axes are 1."""
    out: list[int | None] = []
    it = [a for a in labels if a is not None]
    k = 0
    for s in shape:
        if k < len(it) and size(it[k]) == s:
            out.append(it[k])
            k += 1
        elif s == 1:
            out.append(None)
        else:
            raise GraphError(f"internal: cannot place dims of sizes {[size(a) for a in it]} on shape {list(shape)}")
    return out


def _stem(name: str) -> str:
    stem = re.sub(r"\W+", "_", name.rsplit("/", 1)[-1]).strip("_") or "x"
    return stem if stem[0].isalpha() else f"x_{stem}"


def _dtype(var: Var, name: str) -> str:
    if var.dtype in _FLOAT or var.dtype == "int32":
        return var.dtype
    if var.dtype in ("int64", "int16", "int8", "uint32"):
        return "int32"
    raise GraphError(f"{name}: arrays of dtype {var.dtype} cannot be imported (floats or integer ids)")


def block_of(node: Node) -> str | None:
    """The repeated block a node belongs to: its scan iteration, else the first scope matching
    :data:`BLOCK_PATTERN`."""
    if node.block:
        return node.block
    for part in node.scope.split("/"):
        part = part.strip("[]")
        if BLOCK_PATTERN.match(part):
            return part
    return None
