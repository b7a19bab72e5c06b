"""Translation of reductions, contractions and the composites of :mod:`layoutsearch.importer.patterns`:
``reduce_*`` -> reduce, ``dot_general`` -> einsum (paired axes named alike), softmax, layer norm and
cross-entropy -> their IR ops over a named dim."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from layoutsearch.errors import DimNameWarning, GraphError
from layoutsearch.importer.pending import DimRef
from layoutsearch.importer.trace import Const, Node
from layoutsearch.importer.translate_base import FLOAT_DTYPES, TranslatorBase, Val
from layoutsearch.ir import ops as O


class ReductionRules(TranslatorBase):
    """The rules for reductions, contractions and composites."""

    # -- reductions and contractions
    def _reduce(self, node: Node, fn: str) -> Val:
        v = self.dense(self.val(node.ins[0]))
        if self.dtype(v) not in FLOAT_DTYPES:  # a count of an integer mask: summed as floats
            v = self.as_float(v)
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

    def _cumsum(self, node: Node) -> Val:
        """``jnp.cumsum`` along an axis (positions counted from a mask, ``cumsum(mask) * mask + pad``): a product
        with a constant triangular 0/1 matrix (an einsum; an integer operand, a mask or ids, summed as floats
        and read back as ids where a gather takes them)."""
        x = self.dense(self.val(node.ins[0]))
        if self.dtype(x) not in FLOAT_DTYPES:
            x = self.as_float(x)
        axis = node.params["axis"]
        a = self._axis_label(x, axis)
        n = self.labels.size(a)
        lower = np.tril(np.ones((n, n), np.float32))  # out[i] = sum_{j <= i} x[j]
        assert self.node is not None
        tri = self.constant(Const(lower.T if node.params.get("reverse") else lower, self.node.where))
        out = self.labels.placeholder(n, self.labels.base(a))
        tri = self.relabel(tri, [out, a])
        labels = [out if i == axis else b for i, b in enumerate(x.labels)]
        return self.emit(O.Einsum, "cumsum", [x.tensor, tri.tensor], labels, self.dtype(x))

    def _dot_general(self, node: Node) -> Val:
        lhs, rhs = (self.dense(self.val(x)) for x in node.ins)
        lhs, rhs = (v if self.dtype(v) in FLOAT_DTYPES else self.as_float(v) for v in (lhs, rhs))
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        ll, rl = list(lhs.labels), list(rhs.labels)
        for i, j in zip((*lc, *lb), (*rc, *rb), strict=True):
            if ll[i] is None or rl[j] is None or self.labels.same(ll[i], rl[j]):
                continue
            self._warn_if_typo(ll[i], rl[j])
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
                         dtype if dtype in FLOAT_DTYPES else self.dtype(lhs))

    def _warn_if_typo(self, a: int, b: int) -> None:
        """Warn when a contraction pairs two axes the user named differently (``d_model`` with ``d_modle``): the
        importer renames one to the other, which a typo makes silently."""
        na, nb = self.labels.name(a), self.labels.name(b)
        if na in self.given and nb in self.given and na != nb:
            assert self.node is not None
            warnings.warn(f"{self.node.where}: a contraction pairs dim {na!r} of {self.given[na]} with dim {nb!r} "
                          f"of {self.given[nb]} (both of size {self.labels.size(a)}): the same dim under two names? "
                          "(the importer renames one to the other)", DimNameWarning, stacklevel=2)

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
        ids = self.conform(self.as_ids(self.val(node.ins[1])), rest)
        out = self.emit(O.CrossEntropy, "cross_entropy", [logits.tensor, ids.tensor], rest, self.dtype(logits),
                        dim=DimRef(dim))
        return self._val(out.tensor, _fit_units(rest, node.outs[0].shape, self.labels.size))

    def _holds(self, labels: Sequence[int | None], a: int) -> bool:
        r = self.labels.find(a)
        return any(b is not None and self.labels.find(b) == r for b in labels)

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
