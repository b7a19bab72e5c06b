"""Recognize the IR's composite ops in a flattened JAX program.

JAX writes ``jax.nn.softmax``, a layer norm, ``jax.nn.gelu`` or a mean as several primitives. The IR
has one op for each (with its own gradient, FLOPs and memory rules, as the cost model prices them), so
the importer rewrites these sub-graphs into single nodes before naming dims:

* ``mean``: ``reduce_sum`` over axes A then a division by the number of elements of A;
* ``softmax``: ``exp(x - stop_gradient(max_a x)) / sum_a exp(...)`` (``jax.nn.softmax``);
* ``layer_norm``: ``(x - mean_a x) * rsqrt(mean_a (x - mean_a x)**2 + eps)``; RMSNorm without the mean;
* ``gelu``: the tanh approximation ``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))``;
* ``cross_entropy``: ``-sum_a log_softmax(x) * one_hot(labels)`` (``jax.nn.log_softmax``, ``jax.nn.one_hot``), and
  ``logsumexp(x) - take_along_axis(x, labels)`` (``optax.softmax_cross_entropy_with_integer_labels``), and
  ``-take_along_axis(log_softmax(x), labels)``, and ``-sum_a one_hot(labels) * (x - logsumexp_a(x))`` (MaxText's
  ``max_utils.cross_entropy_with_logits``, T5X's);
* ``alias`` of ``v``: ``v + 0 * w``, a term scaled by a literal zero (MaxText's z-loss at its default
  ``z_loss_multiplier: 0.0``), the same value for finite ``w``;
* ``gather``: index vectors joined from parts, constant parts for axes taken whole dropped;
* ``alias``: JAX's normalization of negative indices, ``where(i < 0, i + n, i)``, for ids in range.

A rewrite applies only when the intermediate values are used nowhere else, so it never changes what
the program computes. Composite calls left unmatched are replaced by their bodies.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from layoutsearch.importer.trace import Const, Lit, Node, Operand, Var

_TRANSPARENT = {"broadcast_in_dim", "stop_gradient", "reshape", "transpose"}
"""Primitives that only add, drop or move size-1 axes (on the paths the patterns walk) or stop gradients."""

_GELU_C1, _GELU_C2 = math.sqrt(2 / math.pi), 0.044715

Match = tuple[Node | list[Node], list[Node]]
"""What a pattern returns: the new node (or nodes, the last writing the final node's outputs) and the
nodes they replace."""


class _Rewriter:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.alive = {id(n) for n in nodes}
        self._final_reads: Counter[Var] = Counter()
        self.refresh()

    def refresh(self) -> None:
        self.producer: dict[Var, Node] = {o: n for n in self.nodes for o in n.outs}
        self.uses: Counter[Var] = Counter(v for n in self.nodes for v in n.ins if isinstance(v, Var))

    def node(self, v: Operand, prim: str | None = None) -> Node | None:
        n = self.producer.get(v) if isinstance(v, Var) else None
        return n if n is not None and (prim is None or n.prim == prim) else None

    def private(self, outs: set[Var], *internal: Node) -> bool:
        """Whether every output of ``internal`` is read only by nodes of the set (or by the final node)."""
        readers: Counter[Var] = Counter(v for n in internal for v in n.ins if isinstance(v, Var))
        for n in internal:
            for o in n.outs:
                if o not in outs and self.uses[o] != readers[o] + self._final_reads.get(o, 0):
                    return False
        return True

    def replace(self, final: Node, new: list[Node], dropped: list[Node]) -> None:
        gone = {id(n) for n in dropped}
        out: list[Node] = []
        for n in self.nodes:
            if n is final:
                out.extend(new)
            elif id(n) not in gone:
                out.append(n)
        self.nodes = out
        self.alive = {id(n) for n in out}
        self.refresh()

    def feeding(self, nodes: list[Node]) -> list[Node]:
        """``nodes`` and the nodes computing only for them: every producer all of whose outputs only ``nodes``
        (and the producers added) read, transitively; what a rewrite that drops ``nodes`` leaves unread."""
        group, ids = list(nodes), {id(n) for n in nodes}
        changed = True
        while changed:
            changed = False
            reads: Counter[Var] = Counter(v for n in group for v in n.ins if isinstance(v, Var))
            for v in list(reads):
                n = self.producer.get(v)
                if n is not None and id(n) not in ids and all(self.uses[o] == reads[o] for o in n.outs):
                    group.append(n)
                    ids.add(id(n))
                    changed = True
        return group

    def chain(self, end: Operand, stop: Callable[[Node], bool]) -> list[Node]:
        """The nodes from ``end`` back through transparent ones to the first node ``stop`` accepts
        (included), or [] when the walk ends elsewhere."""
        seen: list[Node] = []
        v = end
        while True:
            n = self.node(v)
            if n is None:
                return []
            seen.append(n)
            if stop(n):
                return seen
            if n.prim in _TRANSPARENT and _unit_only(n):
                v = n.ins[0]
            elif n.prim == "max" and any(isinstance(a, Lit) and a.value == -math.inf for a in n.ins):
                v = next(a for a in n.ins if not isinstance(a, Lit))
            else:
                return []

    def origin(self, v: Operand) -> Operand:
        """``v`` with transparent nodes (unit axes added, dropped or moved) and aliases walked back."""
        while (n := self.node(v)) is not None and (n.prim == "alias" or n.prim in _TRANSPARENT and _unit_only(n)):
            v = n.ins[0]
        return v

    def match(self, final: Node, found: Callable[[Node], Match | None]) -> bool:
        self._final_reads = Counter(v for v in final.ins if isinstance(v, Var))
        got = found(final)
        if got is None:
            return False
        new, internal = got
        if not self.private(set(final.outs), *internal):
            return False
        self.replace(final, new if isinstance(new, list) else [new], internal)
        return True


def _unit_only(n: Node) -> bool:
    """Whether a broadcast/reshape/transpose ``n`` only adds, drops or moves size-1 axes."""
    if n.prim == "stop_gradient":
        return True
    src, dst = n.ins[0], n.outs[0]
    if not isinstance(src, Var):
        return False
    if n.prim == "transpose":
        moved = [p for p in n.params["permutation"] if src.shape[p] != 1]
        return moved == sorted(moved)
    return [s for s in src.shape if s != 1] == [s for s in dst.shape if s != 1]


def _rank_among_nonunit(shape: tuple[int, ...], axis: int) -> int:
    """The position of ``axis`` among the axes of ``shape`` larger than 1."""
    return sum(1 for s in shape[:axis] if s != 1)


def _lit(v: Operand, want: float, rel: float = 1e-6) -> bool:
    return isinstance(v, Lit) and math.isclose(v.value, want, rel_tol=rel)


def _other(n: Node, v: Operand) -> Operand | None:
    """The operand of binary ``n`` that is not ``v`` (None unless ``v`` is one of two operands)."""
    if len(n.ins) != 2:
        return None
    a, b = n.ins
    return b if a is v else a if b is v else None


def _new(prim: str, final: Node, ins: list[Operand], **params: object) -> Node:
    return Node(prim, ins, final.outs, dict(params), final.where, final.scope, final.block)


# -- the patterns: each takes the final node and returns (the new node, the nodes it replaces)

def _mean(rw: _Rewriter, final: Node) -> Match | None:
    if final.prim != "div" or not isinstance(final.ins[1], Lit):
        return None
    path = rw.chain(final.ins[0], lambda n: n.prim == "reduce_sum")
    if not path:
        return None
    red = path[-1]
    x = red.ins[0]
    assert isinstance(x, Var)
    count = math.prod(x.shape[a] for a in red.params["axes"])
    if not _lit(final.ins[1], count):
        return None
    return _new("reduce_mean", final, [x], axes=tuple(red.params["axes"])), path


def _softmax(rw: _Rewriter, final: Node) -> Match | None:
    if final.prim != "div":
        return None
    e = rw.node(final.ins[0], "exp")
    if e is None:
        return None
    sums = rw.chain(final.ins[1], lambda n: n.prim == "reduce_sum" and n.ins[0] is final.ins[0])
    d = rw.node(e.ins[0], "sub")
    if not sums or d is None:
        return None
    x = d.ins[0]
    base = rw.origin(x)
    maxes = rw.chain(d.ins[1], lambda n: n.prim == "reduce_max" and rw.origin(n.ins[0]) is base)
    if not maxes or len(sums[-1].params["axes"]) != 1 or len(maxes[-1].params["axes"]) != 1:
        return None
    axis, max_axis, max_in = sums[-1].params["axes"][0], maxes[-1].params["axes"][0], maxes[-1].ins[0]
    assert isinstance(x, Var) and isinstance(max_in, Var)
    if _rank_among_nonunit(x.shape, axis) != _rank_among_nonunit(max_in.shape, max_axis):
        return None
    return _new("softmax", final, [x], axis=axis), [e, d, *sums, *maxes]


def _mean_of(rw: _Rewriter, v: Operand) -> tuple[Operand, int, list[Node]] | None:
    """(x, axis, nodes) when ``v`` is a single-axis mean of ``x`` (behind unit broadcasts)."""
    path = rw.chain(v, lambda n: n.prim == "reduce_mean")
    if not path or len(path[-1].params["axes"]) != 1:
        return None
    return path[-1].ins[0], path[-1].params["axes"][0], path


def _variance(rw: _Rewriter, v: Operand) -> tuple[Operand, int, bool, list[Node]] | None:
    """(squared value, axis, one_pass, nodes) when ``v`` is a variance-like statistic: ``mean(sq**2)``
    (two-pass, ``sq`` centered or, for RMSNorm, the input), or Flax's one-pass ``max(0, mean(x**2) -
    mean(x)**2)`` (``sq`` is then ``x``)."""
    hops = rw.chain(v, lambda n: n.prim == "max" and any(_lit(a, 0.0) for a in n.ins))
    if hops:
        relu = hops[-1]
        diff = rw.node(next((a for a in relu.ins if not isinstance(a, Lit)), None), "sub")
        if diff is None:
            return None
        ex2, sq_mean = _mean_of(rw, diff.ins[0]), rw.node(diff.ins[1], "square")
        if ex2 is None or sq_mean is None:
            return None
        sq, mean = rw.node(ex2[0], "square"), _mean_of(rw, sq_mean.ins[0])
        if sq is None or mean is None or mean[0] is not sq.ins[0] or mean[1] != ex2[1]:
            return None
        return sq.ins[0], ex2[1], True, [*hops, diff, *ex2[2], sq_mean, sq]
    var = _mean_of(rw, v)
    if var is None:
        return None
    sq = rw.node(var[0], "square")
    return (sq.ins[0], var[1], False, [*var[2], sq]) if sq is not None else None


def _layer_norm(rw: _Rewriter, final: Node) -> Match | None:
    """``centered * rsqrt(var + eps)`` (times a scale, as Flax folds it into the rsqrt)."""
    if final.prim != "mul":
        return None
    for centered, factor in (final.ins, final.ins[::-1]):
        scale, scaled = None, rw.node(factor, "mul")
        path = rw.chain(factor, lambda n: n.prim == "rsqrt")
        if not path and scaled is not None:
            for r, s in (scaled.ins, scaled.ins[::-1]):
                path = rw.chain(r, lambda n: n.prim == "rsqrt")
                if path:
                    scale, path = s, [scaled, *path]
                    break
        if not path:
            continue
        shift = rw.node(path[-1].ins[0], "add")
        if shift is None or not any(isinstance(a, Lit) for a in shift.ins):
            continue
        eps = next(a.value for a in shift.ins if isinstance(a, Lit))
        var = _variance(rw, next(a for a in shift.ins if not isinstance(a, Lit)))
        if var is None:
            continue
        sq_in, axis, one_pass, var_nodes = var
        internal = [*path, shift, *var_nodes]
        sub = rw.node(centered, "sub")
        mean = _mean_of(rw, sub.ins[1]) if sub is not None else None
        if sub is not None and mean is not None and mean[0] is sub.ins[0] and mean[1] == axis and (
                sq_in is (sub.ins[0] if one_pass else centered)):
            x, center, internal = sub.ins[0], True, [*internal, sub, *mean[2]]
        elif sq_in is centered and not one_pass:
            x, center = centered, False
        else:
            continue
        if scale is None:
            return _new("layer_norm", final, [x], axis=axis, eps=eps, center=center), internal
        assert isinstance(x, Var)
        normed = Var(x.shape, x.dtype)
        ln = Node("layer_norm", [x], [normed], {"axis": axis, "eps": eps, "center": center}, final.where,
                  final.scope, final.block)
        return [ln, _new("mul", final, [normed, scale])], internal
    return None


def _gelu(rw: _Rewriter, final: Node) -> Match | None:
    if final.prim != "mul":
        return None
    for x, half in (final.ins, final.ins[::-1]):
        h = rw.node(half, "mul")
        if h is None or not any(_lit(a, 0.5) for a in h.ins):
            continue
        one = rw.node(next((a for a in h.ins if not isinstance(a, Lit)), None), "add")
        if one is None or not any(_lit(a, 1.0) for a in one.ins):
            continue
        t = rw.node(next((a for a in one.ins if not isinstance(a, Lit)), None), "tanh")
        c1 = rw.node(t.ins[0], "mul") if t is not None else None
        if c1 is None or not any(_lit(a, _GELU_C1, 1e-5) for a in c1.ins):
            continue
        inner = rw.node(next((a for a in c1.ins if not isinstance(a, Lit)), None), "add")
        cube_term = _other(inner, x) if inner is not None else None
        c2 = rw.node(cube_term, "mul") if cube_term is not None else None
        if c2 is None or not any(_lit(a, _GELU_C2, 1e-4) for a in c2.ins):
            continue
        cube = rw.node(next((a for a in c2.ins if not isinstance(a, Lit)), None), "integer_pow")
        if cube is None or cube.params.get("y") != 3 or cube.ins[0] is not x:
            continue
        return _new("gelu", final, [x]), [h, one, t, c1, inner, c2, cube]
    return None


def _cross_entropy(rw: _Rewriter, final: Node) -> Match | None:
    """``-sum_a log_softmax(x) * one_hot(labels)``: the cross-entropy."""
    red = rw.node(final.ins[0], "reduce_sum") if final.prim == "neg" else None
    got = _minus_cross_entropy(rw, red) if red is not None else None
    if got is None:
        return None
    (ce, _), internal = got
    return _new("cross_entropy", final, ce.ins, **ce.params), [red, *internal]


def _minus_cross_entropy(rw: _Rewriter, final: Node) -> Match | None:
    """``sum_a log_softmax(x) * one_hot(labels)`` without the minus (a mean or a mask around it stay
    elementwise ops): the cross-entropy, negated."""
    if final.prim != "reduce_sum" or len(final.params["axes"]) != 1:
        return None
    prod = rw.node(final.ins[0], "mul")
    if prod is None:
        return None
    for lsm_v, hot_v in (prod.ins, prod.ins[::-1]):
        lsm, hot = rw.node(lsm_v, "log_softmax"), rw.node(hot_v, "_one_hot")
        if lsm is None or hot is None:
            continue
        axis = final.params["axes"][0]
        lsm_axes = [n.params["axes"] for n in lsm.body or [] if n.prim == "reduce_max"]
        if lsm_axes != [(axis,)] or lsm.outs[0].shape[axis] != hot.outs[0].shape[axis]:
            continue
        x = lsm.ins[0]
        assert isinstance(x, Var)
        ce = Var(final.outs[0].shape, x.dtype)
        return [Node("cross_entropy", [x, hot.ins[0]], [ce], {"axis": axis}, final.where, final.scope, final.block),
                _new("neg", final, [ce])], [prod, lsm, hot]
    return None


def _logsumexp_cross_entropy(rw: _Rewriter, final: Node) -> Match | None:
    """``-sum_a one_hot(labels) * (x - logsumexp_a(x, keepdims=True))``: the cross-entropy as MaxText's
    ``max_utils.cross_entropy_with_logits`` (T5X's) writes it, ``jax.scipy.special.logsumexp`` being
    ``log(|sum_a exp(x - m)|) + m`` with ``m`` the stop-gradient row maximum (left unread)."""
    red = rw.node(final.ins[0], "reduce_sum") if final.prim == "neg" else None
    if red is None or len(red.params["axes"]) != 1:
        return None
    axis = red.params["axes"][0]
    prod = rw.node(red.ins[0], "mul")
    if prod is None:
        return None
    for hot_v, lsm_v in (prod.ins, prod.ins[::-1]):
        hot, lsm = rw.node(hot_v, "_one_hot"), rw.node(lsm_v, "sub")
        if hot is None or lsm is None or not isinstance(lsm.ins[0], Var):
            continue
        x = lsm.ins[0]
        lse_path = rw.chain(lsm.ins[1], lambda n: n.prim == "add")
        add = lse_path[-1] if lse_path else None
        if add is None or hot.outs[0].shape != x.shape:
            continue
        for log_v, m in (add.ins, add.ins[::-1]):
            log = rw.node(log_v, "log")
            if log is None:
                continue
            inner = rw.node(log.ins[0], "abs")
            sum_path = rw.chain(inner.ins[0] if inner is not None else log.ins[0], lambda n: n.prim == "reduce_sum")
            total = sum_path[-1] if sum_path else None
            if total is None or tuple(total.params["axes"]) != (axis,):
                continue
            exp = rw.node(total.ins[0], "exp")
            shifted = rw.node(exp.ins[0], "sub") if exp is not None else None
            if shifted is None or shifted.ins[0] is not x or shifted.ins[1] is not m:
                continue
            internal = [red, prod, hot, lsm, *lse_path, log, *([inner] if inner else []), *sum_path, exp, shifted]
            return _new("cross_entropy", final, [x, hot.ins[0]], axis=axis), internal
    return None


def _plus_zero_product(rw: _Rewriter, final: Node) -> Match | None:
    """``v + 0 * w`` (a literal zero): ``v`` (MaxText's z-loss term at ``z_loss_multiplier: 0.0``); ``w`` and
    what computes only it are dropped."""
    if final.prim != "add" or len(final.ins) != 2:
        return None
    for v, term in (final.ins, final.ins[::-1]):
        prod = rw.node(term, "mul")
        if prod is None or not any(isinstance(a, Lit) and a.value == 0.0 for a in prod.ins):
            continue
        if not isinstance(v, Var) or v.shape != final.outs[0].shape:
            continue
        return _new("alias", final, [v]), rw.feeding([prod])
    return None


def _integer_label_cross_entropy(rw: _Rewriter, final: Node) -> Match | None:
    """``logsumexp_a(x) - take_along_axis(x, labels[..., None], a)[..., 0]``: the cross-entropy as
    ``optax.softmax_cross_entropy_with_integer_labels`` writes it (a batched gather of each row's label, then
    a gather of its one column)."""
    if final.prim != "sub":
        return None
    lse, picked = final.ins
    take = rw.node(picked, "gather")
    if take is None:
        return None
    along = rw.node(take.ins[0], "gather") if isinstance(take.ins[1], Const) else None
    if along is None:
        along, take = take, None
    x, idx = along.ins
    dn = along.params["dimension_numbers"]
    if not isinstance(x, Var) or not isinstance(idx, Var) or len(dn.start_index_map) != 1:
        return None
    axis = dn.start_index_map[0]
    if tuple(sorted((*dn.operand_batching_dims, axis))) != tuple(range(len(x.shape))):
        return None
    labels = rw.origin(idx)
    if not isinstance(labels, Var) or tuple(labels.shape) != tuple(n for k, n in enumerate(x.shape) if k != axis):
        return None
    add = rw.node(lse, "add")
    log = next((n for n in (rw.node(a, "log") for a in add.ins) if n is not None), None) if add is not None else None
    if log is None:
        return None
    inner = rw.node(log.ins[0], "abs")
    red = rw.node(inner.ins[0] if inner is not None else log.ins[0], "reduce_sum")
    exp = rw.node(red.ins[0], "exp") if red is not None and tuple(red.params["axes"]) == (axis,) else None
    sub = rw.node(exp.ins[0], "sub") if exp is not None else None
    if sub is None or sub.ins[0] is not x:
        return None
    internal = [n for n in (along, take, add, log, inner, red, exp, sub) if n is not None]
    return _new("cross_entropy", final, [x, labels], axis=axis), internal


def _index_normalization(rw: _Rewriter, final: Node) -> Match | None:
    """``select_n(i < 0, i, i + n)``: JAX's wrap of negative indices (ids are in range: the identity)."""
    if final.prim != "select_n" or len(final.ins) != 3:
        return None
    pred, i, wrapped = final.ins
    lt, add = rw.node(pred, "lt"), rw.node(wrapped, "add")
    if lt is None or add is None or lt.ins[0] is not i or not _lit(lt.ins[1], 0.0) or i not in add.ins:
        return None
    return _new("alias", final, [i]), [lt, add]


def _picked_log_softmax(rw: _Rewriter, final: Node) -> Match | None:
    """``take_along_axis(log_softmax(x), labels[..., None], a)``: minus the cross-entropy (the Equinox and
    Haiku examples' loss)."""
    if final.prim != "gather":
        return None
    x_v, idx = final.ins
    lsm = rw.node(x_v, "log_softmax")
    dn = final.params["dimension_numbers"]
    if lsm is None or not isinstance(idx, Var) or len(dn.start_index_map) != 1:
        return None
    axis = dn.start_index_map[0]
    x = lsm.ins[0]
    lsm_axes = [n.params["axes"] for n in lsm.body or [] if n.prim == "reduce_max"]
    if not isinstance(x, Var) or lsm_axes != [(axis,)] or tuple(sorted((*dn.operand_batching_dims, axis))) != tuple(
            range(len(x.shape))):
        return None
    labels = rw.origin(idx)
    rest = tuple(n for k, n in enumerate(x.shape) if k != axis)
    if not isinstance(labels, Var) or tuple(labels.shape) != rest:
        return None
    ce, neg = Var(rest, x.dtype), Var(rest, x.dtype)
    at = (final.where, final.scope, final.block)
    return [Node("cross_entropy", [x, labels], [ce], {"axis": axis}, *at), Node("neg", [ce], [neg], {}, *at),
            _new("reshape", final, [neg], new_sizes=final.outs[0].shape, dimensions=None)], [lsm]


def _gather_index_parts(rw: _Rewriter, final: Node) -> Match | None:
    """A gather whose index vectors are joined from parts, some of them constant indices of axes the gather
    takes whole (``weight[x]`` of a vmapped ``eqx.nn.Embedding``: ``[x, 0]`` picking whole rows): the same
    gather by the other parts alone (a start index along an axis taken whole is clamped to 0)."""
    if final.prim != "gather":
        return None
    table, ids = final.ins
    cat = rw.node(ids, "concatenate")
    if cat is None or cat.params["dimension"] != len(ids.shape) - 1:
        return None
    dn, sizes = final.params["dimension_numbers"], final.params["slice_sizes"]
    keep, at = [], 0
    for part in cat.ins:
        width = part.shape[-1]
        axes = dn.start_index_map[at:at + width]
        if not (isinstance(part, Const) and all(sizes[a] == table.shape[a] for a in axes)):
            keep.append((part, axes))
        at += width
    if len(keep) != 1 or len(keep) == len(cat.ins):
        return None
    part, axes = keep[0]
    params = dict(final.params, dimension_numbers=dn._replace(start_index_map=tuple(axes)))
    return Node("gather", [table, part], final.outs, params, final.where, final.scope, final.block), [cat]


PATTERNS = (_index_normalization, _plus_zero_product, _mean, _softmax, _layer_norm, _gelu, _cross_entropy,
            _minus_cross_entropy, _logsumexp_cross_entropy, _integer_label_cross_entropy, _picked_log_softmax,
            _gather_index_parts)


def rewrite(nodes: list[Node]) -> list[Node]:
    """``nodes`` with every pattern of :data:`PATTERNS` replaced by its composite node, and the
    composite calls no pattern used replaced by their bodies."""
    rw = _Rewriter(nodes)
    for pattern in PATTERNS:
        changed = True
        while changed:
            changed = False
            for n in list(rw.nodes):
                if id(n) in rw.alive and rw.match(n, lambda f, p=pattern: p(rw, f)):
                    changed = True
    out: list[Node] = []
    for n in rw.nodes:
        out.extend(rewrite(n.body) if n.body is not None else [n])
    return out
