"""Compiling a graph's strategy space (:mod:`.space`) into a :class:`~.problem.Problem`.

Every op of the training graph contributes cost *items* over the nodes whose
strategies it depends on, every tensor and transient buffer a memory item:

* an op whose inputs, output and computation are decided by at most two nodes
  is priced whole (:meth:`OpRules.cost` with all its layouts, e.g. a gather
  whose table may be used as stored);
* otherwise its compute (the iteration layout alone), its finishing
  communication (statistics, partial sums and the reshard to the stored
  output: iteration x output storage) and each input's reshard (input
  storage x iteration) are separate items; every item is nonnegative;
* the operands of einsums are resharded once per distinct (stored, wanted)
  layout pair over all einsums reading the tensor (XLA computes a shared
  reshard once), which is one item over the tensor's owner and every einsum
  reading it: a factor over more than two nodes when those are distinct;
* memory: each stored tensor over its lifetime (the cost model's live-set
  rules), each op's transient buffers at the op, and each shared resharded
  copy from its first to its last reader;
* with remat, the recomputed ops are priced a second time and the
  recomputation's buffers count at its point, as the cost model does; on
  hardware that combines the gradient all-reduces (XLA on CPU), a parameter
  gradient's unreduced partial lives until the end of the backward pass.

Items of tied (repeated) ops merge, counting their instances; items over the
same nodes are summed into one factor whose keys are the distinct
combinations of the items' keys.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from layoutsearch.costmodel.memory import lifetimes, remat_plan, transient_buffers
from layoutsearch.costmodel.ops import OpCost, local_bytes
from layoutsearch.costmodel.step import op_signature
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import DimLayout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.clock import Deadline
from layoutsearch.solvers.problem import Factor, MemItem, MemRow, Problem
from layoutsearch.solvers.space import (
    NONE,
    SPACES,
    Node,
    Pricer,
    RuleSets,
    Space,
    _strip,
    axis_maps,
    block_families,
    project,
    rule_sets,
    to_dim_layout,
)

Roles = list[tuple[int, np.ndarray]]
"""An item's dependence: (node, the axis map each of its strategies gives the item) per role."""


def _with_variants(I: np.ndarray, out_mask: np.ndarray, dim_sizes: np.ndarray, axis_sizes: np.ndarray,
                   out_dims: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(iteration, output) pairs: each iteration map with its computed output map, and that map plus more
    axes (any nonempty set of the axes it leaves unused) on one unsplit output dim."""
    P = project(I, out_mask)
    its, outs = [I], [P]
    big = [a for a, s in enumerate(axis_sizes) if s > 1]
    extra_i, extra_o = [], []
    for k in range(len(I)):
        row = P[k]
        free = [a for a in big if row[a] == NONE]
        for f in out_dims:
            if (row == f).any():
                continue
            for r in range(1, len(free) + 1):
                for sub in itertools.combinations(free, r):
                    if dim_sizes[f] % int(np.prod(axis_sizes[list(sub)])):
                        continue
                    new = row.copy()
                    new[list(sub)] = f
                    extra_i.append(I[k])
                    extra_o.append(new)
    if extra_i:
        its.append(np.array(extra_i, np.int32))
        outs.append(np.array(extra_o, np.int32))
    return np.concatenate(its), np.concatenate(outs)


def _unique_pairs(*arrays: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct row of the concatenated arrays (kept in order)."""
    cat = np.concatenate([a.reshape(len(a), -1) for a in arrays], axis=1)
    _, first = np.unique(cat, axis=0, return_index=True)
    return np.sort(first)


def _unique(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows, index of each row's distinct row); rows of small integers (>= -1)."""
    rows = rows.reshape(len(rows), -1)
    if rows.shape[1] == 0 or len(rows) == 0:
        return rows[:1], np.zeros(len(rows), dtype=np.int64)
    base = int(rows.max()) + 2
    if base ** rows.shape[1] < 2**62:
        code = np.zeros(len(rows), dtype=np.int64)
        for col in rows.T:
            code = code * base + (col.astype(np.int64) + 1)
        _, first, inv = np.unique(code, return_index=True, return_inverse=True)
        return rows[first], inv.reshape(-1)
    uniq, inv = np.unique(rows, axis=0, return_inverse=True)
    return uniq, inv.reshape(-1)


class _Builder:
    """Compiles a graph into a :class:`Space` (see :func:`build_space`)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, kind: str, tie: bool, rules: RuleSets | None,
                 include: RuleSets | None, variants: bool, pricer: Pricer | None, remat: str = "none",
                 deadline: Deadline | None = None) -> None:
        if kind not in SPACES:
            raise LayoutSearchError(f"unknown search space {kind!r} (known: {', '.join(SPACES)})")
        self.g, self.mesh, self.hw, self.kind = graph, mesh, hw, kind
        self.dims = list(graph.dims)
        self.dim_sizes = np.array([graph.dims[d] for d in self.dims], dtype=np.int64)
        self.axis_sizes = np.array([s for _, s in mesh.axes], dtype=np.int64)
        self.p = pricer or Pricer(graph, mesh, hw)
        self.tie, self.variants = tie, variants
        self.deadline = deadline or Deadline()
        if remat != "none" and kind == "ops":
            raise LayoutSearchError(f"remat {remat!r} is supported in the rules and layers spaces, not in 'ops'")
        self._fcache: dict[tuple, Any] = self.p.cache
        self.plan = remat_plan(graph, remat)
        self.life = lifetimes(graph, self.plan)
        self.recomputed = frozenset(self.plan.recomputed)
        self.deferred = frozenset(self.life.deferrable) if getattr(hw, "combined_gradient_all_reduce", False) \
            else frozenset()
        self.rules = rules if rules is not None else (rule_sets(graph, mesh) if kind != "ops" else None)
        self.include = include
        self.nodes: list[Node] = []
        self.op_node: dict[str, int] = {}
        self.owner: dict[str, int] = {}
        self._keys: dict[tuple, np.ndarray] = {}
        self._mask_cache: dict[tuple[str, ...], np.ndarray] = {}

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, once per pricer (what depends on the graph alone is shared by every space built with
        one pricer)."""
        if key not in self._fcache:
            self._fcache[key] = make()
        return self._fcache[key]

    def families(self, tie: bool) -> dict[str, str]:
        return self.cached(("families", tie), lambda: block_families(self.g, tie))

    def mask(self, names: Iterable[str]) -> np.ndarray:
        """Boolean mask over dim indices (one spare False entry, so NONE indexes False)."""
        key = tuple(names)
        if key not in self._mask_cache:
            m = np.zeros(len(self.dims) + 1, bool)
            for d in key:
                m[self.dims.index(d)] = True
            self._mask_cache[key] = m
        return self._mask_cache[key]

    def dl(self, amap: np.ndarray) -> DimLayout:
        return to_dim_layout(amap, self.dims, self.mesh)

    # -- nodes
    def tensor_blocks(self) -> dict[str, str | None]:
        return self.cached(("tensor_blocks",), self._tensor_blocks)

    def _tensor_blocks(self) -> dict[str, str | None]:
        g = self.g
        out: dict[str, str | None] = {}
        for name in g.tensors:
            prod = g.producer(name)
            if prod is not None:
                out[name] = prod.block
            else:
                blocks = {op.block for op in g.consumers[name]}
                out[name] = blocks.pop() if len(blocks) == 1 else None
        return out

    def make_nodes(self) -> None:
        g = self.g
        if self.kind == "rules":
            self.nodes.append(Node("rules", "rules", 1, rules=self.rules))
            self.op_node = {op.name: 0 for op in g.ops}
            self.owner = {t: 0 for t in g.tensors}
            return
        fam = self.families(self.tie)
        tblock = self.tensor_blocks()
        index: dict[Any, int] = {}

        def node(key: Any, make: Any) -> int:
            if key not in index:
                index[key] = len(self.nodes)
                self.nodes.append(make())
            else:
                self.nodes[index[key]].count += 1
            return index[key]

        def cls(name: str, block: str | None) -> tuple:
            return (fam[block], _strip(name, block)) if block is not None else (None, name)

        if self.kind == "layers":
            blocks = sorted({b for b in fam}, key=lambda b: [op.block for op in g.ops].index(b))
            seen: set[str] = set()
            for b in [None, *blocks]:
                f = fam.get(b) if b is not None else None
                key = f if b is not None else "<outside>"
                if key in seen:
                    self.nodes[index[key]].count += 1
                    continue
                seen.add(key)
                index[key] = len(self.nodes)
                self.nodes.append(Node(f if f is not None else "outside", "rules", 1, rules=self.rules))
            for op in g.ops:
                self.op_node[op.name] = index[fam[op.block] if op.block is not None else "<outside>"]
            for t in g.tensors:
                b = tblock[t]
                self.owner[t] = index[fam[b] if b is not None else "<outside>"]
            return
        for op in g.ops:
            key = ("op", *cls(op.name, op.block))
            self.op_node[op.name] = node(key, lambda op=op, key=key: Node(_name(key), "op", 1, op=op))
        for t in g.fed:
            key = ("src", *cls(t.name, tblock[t.name]))
            self.owner[t.name] = node(key, lambda t=t, key=key: Node(_name(key), "source", 1, tensor=t))
        for t in g.tensors.values():
            if t.name in self.owner:
                continue
            self.owner[t.name] = self.owner[t.updates] if t.updates else self.op_node[g.producer(t.name).name]
        for n in self.nodes:
            self._strategies(n)

    def _strategies(self, n: Node) -> None:
        g, inc = self.g, self.include
        if n.kind == "source":
            dims = [self.dims.index(d) for d in n.tensor.dim_names]
            S = axis_maps(dims, self.dim_sizes, self.axis_sizes)
            if inc is not None:
                S = np.concatenate([S, inc.project(self.mask(n.tensor.dim_names))])
            n.storage = S[_unique_pairs(S)]
            return
        op = n.op
        t = g.tensors
        op_dims = op.iteration_dims(t)
        out = t[op.output]
        out_mask = self.mask(out.dim_names)
        owns = self.owner_is_self(op)
        if isinstance(op, O.Reshape):
            O_ = axis_maps([self.dims.index(d) for d in out.dim_names], self.dim_sizes, self.axis_sizes)
            I = np.full_like(O_, NONE)
        else:
            I = axis_maps([self.dims.index(d) for d in op_dims], self.dim_sizes, self.axis_sizes)
            if owns and self.variants and isinstance(op, (O.Einsum, O.Reduce, O.ScatterAdd)):
                I, O_ = _with_variants(I, out_mask, self.dim_sizes, self.axis_sizes,
                                       [self.dims.index(d) for d in out.dim_names])
            else:
                O_ = project(I, out_mask)
        if inc is not None:
            Ii = inc.project(self.mask(op_dims))
            if isinstance(op, O.Reshape):
                Ii = np.full_like(Ii, NONE)
            I = np.concatenate([I, Ii])
            O_ = np.concatenate([O_, inc.project(out_mask) if owns else project(Ii, out_mask)])
        if not owns:
            O_ = project(I, out_mask)
        keep = _unique_pairs(I, O_)
        n.iteration, n.output = I[keep], O_[keep]

    def owner_is_self(self, op: O.Op) -> bool:
        return self.g.tensors[op.output].updates is None

    # -- keys: the axis maps a node's strategies give one op (iteration) or one tensor (storage)
    def iter_keys(self, n: int, op: O.Op) -> np.ndarray:
        node = self.nodes[n]
        if node.rules is None:
            return node.iteration
        dims = op.iteration_dims(self.g.tensors)
        key = ("it", n, dims, isinstance(op, O.Reshape))
        if key not in self._keys:
            k = node.rules.project(self.mask(dims))
            self._keys[key] = np.full_like(k, NONE) if isinstance(op, O.Reshape) else k
        return self._keys[key]

    def store_keys(self, n: int, t: Tensor) -> np.ndarray:
        node = self.nodes[n]
        if node.rules is None:
            return node.storage if node.kind == "source" else node.output
        key = ("st", n, t.dim_names)
        if key not in self._keys:
            self._keys[key] = node.rules.project(self.mask(t.dim_names))
        return self._keys[key]

    # -- pricing
    def sig(self, op: O.Op) -> tuple:
        """What an op's cost depends on besides layouts (its kind, attributes, shapes)."""
        key = ("sig", op.name)
        if key not in self._fcache:
            roles = tuple(self.p.classes.get(x) for x in (*op.inputs, op.output))  # which collectives overlap
            self._fcache[key] = (op_signature(op, self.g), self.p.fusion.signature(op), roles)
        return self._fcache[key]

    def f_op(self, op: O.Op, it: np.ndarray, out: np.ndarray) -> OpCost:
        """``op`` computed as ``it`` with its inputs already laid out for it, its output stored as ``out``."""
        key = ("op", self.sig(op), it.tobytes(), out.tobytes())
        if key not in self._fcache:
            t = self.g.tensors
            I = self.dl(it)
            wants = [{d: I[d] for d in t[x].dim_names if d in I} for x in op.inputs]
            self._fcache[key] = self.p.rules.cost(op, I, wants, self.dl(out))
        return self._fcache[key]

    def f_whole(self, op: O.Op, it: np.ndarray, ins: Sequence[np.ndarray], out: np.ndarray) -> OpCost:
        key = ("whole", self.sig(op), it.tobytes(), tuple(x.tobytes() for x in ins), out.tobytes())
        if key not in self._fcache:
            I = {} if isinstance(op, O.Reshape) else self.dl(it)
            self._fcache[key] = self.p.rules.cost(op, I, [self.dl(x) for x in ins], self.dl(out))
        return self._fcache[key]

    def f_reshard(self, t: Tensor, src: np.ndarray, dst: np.ndarray) -> tuple[float, int]:
        """(seconds, transient bytes: the payload of the last gather or all-to-all) of resharding ``t``."""
        key = ("rs", self.p.counted, self.p.classes.get(t.name), t.dims, t.dtype, src.tobytes(), dst.tobytes())
        if key not in self._fcache:
            comms = self.p.rules.reshard(t, self.dl(src), self.dl(dst), "")
            payload = [c.bytes for c in comms if c.kind in ("all-gather", "all-to-all")]
            self._fcache[key] = (sum(self.p.collective(c.kind, c.bytes, c.axes) for c in comms
                                     if self.p.counts(dataclasses.replace(c, tensor=t.name))),
                                 payload[-1] if payload else 0)
        return self._fcache[key]

    def transient(self, op: O.Op, cost: OpCost, out: np.ndarray) -> tuple[int, dict[Any, int]]:
        """The cost model's transient buffers of ``op`` (``cost`` may come from the cache, priced for another
        op of the same shapes: its collectives are relabelled with ``op``'s tensors first)."""
        if cost.op != op.name:
            src = self.g.op(cost.op)
            names = dict(zip((*src.inputs, src.output), (*op.inputs, op.output), strict=True))
            cost = dataclasses.replace(cost, comms=tuple(dataclasses.replace(c, tensor=names.get(c.tensor, c.tensor))
                                                         for c in cost.comms))
        stored = 0 if op.output in self.p.fusion.on_chip else self.stored(self.g.tensors[op.output], out)
        return transient_buffers(op, cost, stored, op.output in self.deferred)

    def deferred_item(self, t: Tensor, part: int) -> tuple:
        """A parameter gradient whose all-reduce the backend defers to the end of the backward pass (one
        combined all-reduce, ``Hardware.combined_gradient_all_reduce``): part 0 from its producer to the last
        backward op holds the unreduced partial (else the stored gradient), part 1 at the last backward op the
        partial and its reduced copy, part 2 after it the stored gradient."""
        op = self.g.producer(t.name)
        n, o = self.op_node[op.name], self.owner[t.name]

        def fn(a: list[np.ndarray]) -> float:
            stored = self.stored(t, a[1])
            if part == 2:
                return float(stored)
            cost = self.f_op(op, a[0], a[1])
            src = self.g.op(cost.op)
            name = src.output if cost.op != op.name else t.name
            payload = max((c.bytes for c in cost.comms if c.tensor == name and c.kind == "all-reduce"), default=0)
            if not payload:
                return float(stored)
            return float(payload * (2 if part == 1 else 1))

        return ("deferred", [(n, self.iter_keys(n, op)), (o, self.store_keys(o, t))], fn)

    def stored(self, t: Tensor, amap: np.ndarray) -> int:
        """Bytes of ``t`` stored as ``amap`` as the memory model counts them (new values: in the old buffer)."""
        if t.updates is not None:
            return 0
        key = ("bytes", t.dims, t.dtype, amap.tobytes())
        if key not in self._fcache:
            self._fcache[key] = local_bytes(t, self.dl(amap), self.mesh)
        return self._fcache[key]

    # -- items
    def evaluate(self, roles: Roles, fn: Callable[[list[np.ndarray]], float]) -> tuple:
        """An item's values: ('unary', node, value per strategy) or ('factor', nodes, key index per strategy
        of each node, table over the nodes' distinct keys)."""
        nodes = sorted({n for n, _ in roles})
        where = [(nodes.index(n), rows.shape[1]) for n, rows in roles]
        uniq, inv = [], []
        for n in nodes:
            u, i = _unique(np.concatenate([rows for m, rows in roles if m == n], axis=1))
            uniq.append(u)
            inv.append(i)

        def call(picked: Sequence[np.ndarray]) -> float:
            offset = [0] * len(nodes)
            args = []
            for j, width in where:
                args.append(picked[j][offset[j]:offset[j] + width])
                offset[j] += width
            return fn(args)

        if len(nodes) == 1:
            vals = np.array([call([row]) for row in uniq[0]], dtype=float)
            return ("unary", nodes[0], vals[inv[0]])
        table = np.empty([len(u) for u in uniq])
        for idx in itertools.product(*(range(len(u)) for u in uniq)):
            table[idx] = call([u[i] for u, i in zip(uniq, idx, strict=True)])
        return ("factor", tuple(nodes), inv, table)

    def op_items(self, op: O.Op, n: int, o: int) -> tuple[list[tuple[str, Roles, Callable]], list[tuple]]:
        """Cost items and memory items (at the op) of one op: (kind, roles, fn)."""
        t = self.g.tensors
        out = t[op.output]
        om = self.mask(out.dim_names)
        owners = [self.owner[x] for x in op.inputs]
        cost: list[tuple[str, Roles, Callable]] = []
        mem: list[tuple[str, Roles, Callable]] = []
        nodes = len({n, o, *owners})
        if not isinstance(op, O.Einsum) and (nodes == 1 or nodes == 2 and isinstance(op, (O.Gather, O.ScatterAdd))):
            ins = [(u, self.store_keys(u, t[x])) for u, x in zip(owners, op.inputs, strict=True)]
            roles: Roles = [(n, self.iter_keys(n, op)), (o, self.store_keys(o, out)), *ins]

            def whole(a: list[np.ndarray]) -> OpCost:
                return self.f_whole(op, a[0], a[2:], a[1])

            cost.append(("whole", roles, lambda a: self.p.seconds(whole(a), op)))
            mem.append(("whole", roles, lambda a: float(self.transient(op, whole(a), a[1])[0])))
            return cost, mem
        I = self.iter_keys(n, op)
        # partial sums: a reduce-scatter leaves the output more split, so even the compute (the HBM bytes of
        # the output) depends on the stored output; otherwise compute depends on the iteration layout only
        partial = isinstance(op, (O.Einsum, O.Reduce, O.ScatterAdd, O.Gather))
        if not partial:
            cost.append(("compute", [(n, I)], lambda a: self.p.compute(self.f_op(op, a[0], project(a[0], om)), op)))
        special = len(self.dims) + 1
        coarse = I if partial else np.where(om[I], I, np.where(I >= 0, special, NONE)).astype(np.int32)
        reps = {c.tobytes(): I[k] for k, c in enumerate(coarse)}

        def finish(a: list[np.ndarray]) -> tuple[float, float]:
            """Communication (statistics, partial sums, reshard to the stored output; with partial sums also
            the compute) and its buffers."""
            full = self.f_op(op, reps[a[0].tobytes()], a[1])
            seconds = self.p.seconds(full, op) if partial else self.p.comm(full)
            return seconds, float(self.transient(op, full, a[1])[0])

        froles: Roles = [(n, coarse), (o, self.store_keys(o, out))]
        cost.append(("finish", froles, lambda a: finish(a)[0]))
        mem.append(("finish", froles, lambda a: finish(a)[1]))
        if isinstance(op, O.Einsum):
            return cost, mem
        for i, (u, x) in enumerate(zip(owners, op.inputs, strict=True)):
            xt = t[x]
            roles = [(u, self.store_keys(u, xt)), (n, project(I, self.mask(xt.dim_names)))]
            cost.append((f"in{i}", roles, lambda a, xt=xt: self.f_reshard(xt, a[0], a[1])[0]))
            if x not in op.inputs[:i]:
                mem.append((f"in{i}", roles, lambda a, xt=xt: float(self.f_reshard(xt, a[0], a[1])[1])))
        return cost, mem

    def reader_items(self, x: Tensor, op: O.Op) -> tuple[tuple, tuple]:
        """The reshard of operand ``x`` for einsum ``op`` alone: (cost item, memory item at the op)."""
        u, n = self.owner[x.name], self.op_node[op.name]
        roles: Roles = [(u, self.store_keys(u, x)), (n, project(self.iter_keys(n, op), self.mask(x.dim_names)))]
        return (("reader", roles, lambda a: self.f_reshard(x, a[0], a[1])[0]),
                ("reader", roles, lambda a: float(self.f_reshard(x, a[0], a[1])[1])))

    def shared_items(self, x: Tensor, slots: list[tuple[int, int, O.Op]]) -> tuple[Roles, Callable, list]:
        """The shared reshard of einsum operand ``x``: roles, time fn, and per segment of the schedule between
        its readers (:func:`_segments`) a memory fn: the copies live there (a copy lives from its first
        reader to its last)."""
        u = self.owner[x.name]
        xm = self.mask(x.dim_names)
        roles: Roles = [(u, self.store_keys(u, x))]
        roles += [(self.op_node[op.name], project(self.iter_keys(self.op_node[op.name], op), xm))
                  for _, _, op in slots]
        rank = _ranks([k for k, _, _ in slots])

        runs = [1 + (op.name in self.recomputed) + (op.name in self.p.flash_recomputed) for _, _, op in slots]

        def seconds(a: list[np.ndarray]) -> float:
            """Each distinct reshard once, and again each time its first reader is recomputed (remat, or a
            flash-attention backward pass)."""
            first: dict[bytes, tuple[np.ndarray, int]] = {}
            for w, n in zip(a[1:], runs, strict=True):
                first.setdefault(w.tobytes(), (w, n))
            return sum(self.f_reshard(x, a[0], w)[0] * n for w, n in first.values())

        def mem_fn(seg: tuple[int, int]) -> Callable:
            def fn(a: list[np.ndarray]) -> float:
                ranks: dict[bytes, list[int]] = {}
                ws = {}
                for w, r in zip(a[1:], rank, strict=True):
                    ranks.setdefault(w.tobytes(), []).append(r)
                    ws[w.tobytes()] = w
                return float(sum(self.f_reshard(x, a[0], ws[key])[1] for key, rs in ranks.items()
                                 if min(rs) <= seg[0] and max(rs) >= seg[1]))
            return fn

        return roles, seconds, [(seg, mem_fn(seg)) for seg in _segments(max(rank) + 1)]

    def recompute_item(self, at: O.Op, ops: list[O.Op], n: int) -> tuple:
        """The transient buffers of the recomputation run before op ``at``: the cost model keeps the larger of
        ``at``'s own buffers and each recomputed op's (own and shared); this item is the excess over ``at``'s."""
        g = self.g
        t = g.tensors
        every = [at, *ops]
        roles: Roles = []
        for op in every:
            o = self.owner[op.output]
            roles += [(self.op_node[op.name], self.iter_keys(self.op_node[op.name], op)),
                      (o, self.store_keys(o, t[op.output]))]
            roles += [(self.owner[x], self.store_keys(self.owner[x], t[x])) for x in op.inputs]

        def fn(a: list[np.ndarray]) -> float:
            k = 0
            vals = []
            for op in every:
                it, out = a[k], a[k + 1]
                ins = a[k + 2:k + 2 + len(op.inputs)]
                k += 2 + len(op.inputs)
                own, shared = self.transient(op, self.f_whole(op, it, ins, out), out)
                vals.append(own if op is at else own + sum(shared.values()))
            return float(max(0, max(vals[1:]) - vals[0]))

        return ("recompute", roles, fn)

    def point_classes(self) -> list[Any]:
        """Per op of the schedule: its class (equal for the instances of one op of tied blocks)."""
        def make() -> list[Any]:
            fam = self.families(True)
            return [(fam[op.block], _strip(op.name, op.block)) if op.block is not None else op.name
                    for op in self.g.ops]

        return self.cached(("point_classes",), make)

    def build(self) -> Space:
        self.make_nodes()
        g = self.g
        N = len(g.ops)
        cost_items: dict[tuple, list] = {}
        mem_items: dict[tuple, list] = {}

        def add(store: dict, key: tuple, make: Callable, span: tuple[int, int] | None) -> None:
            if key not in store:
                store[key] = [make, 0, []]
            store[key][1] += 1
            if span is not None:
                store[key][2].append(span)

        kinds: dict[tuple, tuple[list[str], list[str]]] = {}  # per op class: the kinds of its items
        for k, op in enumerate(g.ops):
            if k % 256 == 0:
                self.deadline.check()
            n, o = self.op_node[op.name], self.owner[op.output]
            base = (self.sig(op), n, o, tuple(self.owner[x] for x in op.inputs))
            made: dict[str, Any] = {}

            def items(op: O.Op = op, n: int = n, o: int = o, made: dict = made) -> tuple:
                if "v" not in made:
                    made["v"] = self.op_items(op, n, o)
                return made["v"]

            if base not in kinds:  # ops of one class (tied layers) share their items: built once
                kinds[base] = ([kind for kind, _, _ in items()[0]], [kind for kind, _, _ in items()[1]])
            for j, kind in enumerate(kinds[base][0]):
                for _ in range(1 + (op.name in self.recomputed) + (op.name in self.p.flash_recomputed)):
                    add(cost_items, ("op", base, kind), lambda j=j, items=items: items()[0][j], None)
            for j, kind in enumerate(kinds[base][1]):
                add(mem_items, ("op", base, kind), lambda j=j, items=items: items()[1][j], (k, k))
        # the einsums sharing one reshard of an operand: all of them, or those of one phase where the backend
        # gathers weights again for the backward pass (Hardware.regather_weights)
        readers: dict[tuple[str, str], list[tuple[int, int, O.Op]]] = defaultdict(list)
        for k, op in enumerate(g.ops):
            if isinstance(op, O.Einsum):
                for i, x in enumerate(op.inputs):
                    readers[(x, op.phase if self.hw.regather_weights else "")].append((k, i, op))
        for (x, _), slots in readers.items():
            t = g.tensors[x]
            nodes = {self.owner[x], *(self.op_node[op.name] for _, _, op in slots)}
            if len(nodes) > 2:  # readers in several nodes: priced per reader (see the module docstring)
                for k, i, op in slots:
                    key = ("reader", t.dim_names, t.dtype, self.owner[x], self.op_node[op.name], self.sig(op), i)
                    rd = self.reader_items(t, op)
                    add(cost_items, key, lambda rd=rd: rd[0], None)
                    if x not in op.inputs[:i]:
                        add(mem_items, key, lambda rd=rd: rd[1], (k, k))
                continue
            positions = [k for k, _, _ in slots]
            key = ("shared", t.dim_names, t.dtype, self.owner[x],
                   tuple((self.op_node[op.name], self.sig(op), i, op.name in self.recomputed,
                          op.name in self.p.flash_recomputed) for _, i, op in slots),
                   tuple(_ranks(positions)))
            made: dict[str, Any] = {}

            def sh(t: Tensor = t, slots: list = slots, made: dict = made) -> tuple:
                if "v" not in made:
                    made["v"] = self.shared_items(t, slots)
                return made["v"]

            distinct = sorted(set(positions))
            add(cost_items, key, lambda sh=sh: ("shared", sh()[0], sh()[1]), None)
            for j, (lo, hi) in enumerate(_segments(len(distinct))):
                # segment (lo, hi) in reader ranks: at reader lo when lo == hi, else strictly between two readers
                span = (distinct[lo], distinct[lo]) if lo == hi else (distinct[lo] + 1, distinct[hi] - 1)
                if span[0] <= span[1]:
                    add(mem_items, (*key, j), lambda j=j, sh=sh: ("shared", sh()[0], sh()[2][j][1]), span)
        for block, p in self.plan.points.items():
            ops = [g.op(name) for name in self.plan.recomputed if g.op(name).block == block]
            if ops:
                n = self.op_node[g.ops[p].name]
                nodes = tuple(sorted({self.op_node[op.name] for op in ops} | {self.owner[x] for op in ops
                                                                               for x in (*op.inputs, op.output)}))
                key = ("recompute", self.sig(g.ops[p]), tuple(self.sig(op) for op in ops), n, nodes)
                add(mem_items, key, lambda ops=ops, p=p, n=n: self.recompute_item(g.ops[p], ops, n), (p, p))
        life = self.life
        deferred_rows = {row: name for name, row in life.deferrable.items() if name in self.deferred}
        for row, (ti, start, end) in enumerate(zip(life.tensor, life.start, life.end, strict=True)):
            t = life.tensors[int(ti)]
            o = self.owner[t.name]
            if row in deferred_rows:
                op = g.producer(t.name)
                last = life.last_backward
                for part, span in enumerate(((int(start), last - 1), (last, last), (last + 1, int(end)))):
                    if span[0] <= span[1]:
                        add(mem_items, ("deferred", part, t.dim_names, t.dtype, o, self.op_node[op.name],
                                        self.sig(op)), lambda t=t, part=part: self.deferred_item(t, part), span)
                continue
            if t.name in self.p.fusion.on_chip:
                continue  # never in HBM
            add(mem_items, ("store", t.dim_names, t.dtype, o),
                lambda t=t, o=o: ("store", [(o, self.store_keys(o, t))], lambda a, t=t: float(self.stored(t, a[0]))),
                (int(start), int(end)))
        return self.assemble(cost_items, mem_items, N)

    def assemble(self, cost_items: dict, mem_items: dict, n_points: int) -> Space:
        unary = [np.zeros(n.size) for n in self.nodes]
        groups: dict[tuple[int, ...], list] = defaultdict(list)
        for k, (make, count, _) in enumerate(cost_items.values()):
            if k % 64 == 0:
                self.deadline.check()
            _, roles, fn = make()
            item = self.evaluate(roles, fn)
            if item[0] == "unary":
                unary[item[1]] += count * item[2]
            else:
                groups[item[1]].append((item[2], item[3] * count, None))
        mems: list[MemItem | None] = []
        spans: list[list[tuple[int, int]]] = []
        for k, (make, _, sp) in enumerate(mem_items.values()):
            if k % 64 == 0:
                self.deadline.check()
            _, roles, fn = make()
            item = self.evaluate(roles, fn)
            if not np.any(item[-1]):
                continue
            spans.append(sp)
            if item[0] == "unary":
                mems.append(MemItem(item[1], None, item[2]))
            else:
                mems.append(None)
                groups[item[1]].append((item[2], item[3], len(mems) - 1))
        factors: list[Factor] = []
        for nodes, items in sorted(groups.items()):
            comp = [_unique(np.stack([it[0][j] for it in items], axis=1)) for j in range(len(nodes))]
            cost = np.zeros([len(c) for c, _ in comp])
            on_factor = []
            for k, (_, table, mem) in enumerate(items):
                sub = table[np.ix_(*(c[:, k] for c, _ in comp))]
                if mem is None:
                    cost += sub
                else:
                    on_factor.append((mem, sub))
            if not on_factor and not cost.any():
                continue
            for mem, sub in on_factor:
                mems[mem] = MemItem(None, len(factors), sub)
            factors.append(Factor(nodes, tuple(inv.astype(np.int64) for _, inv in comp), cost))
        rows = _memory_rows(spans, n_points, [op.name for op in self.g.ops], self.point_classes())
        problem = Problem([n.name for n in self.nodes], unary, factors, mems, rows)
        return Space(self.g, self.mesh, self.hw, self.kind, self.nodes, self.op_node, self.owner, problem, self.dims)


def _memory_rows(spans: list[list[tuple[int, int]]], n_points: int, points: list[str],
                 classes: list[Any]) -> list[MemRow]:
    """The memory rows: per schedule point, the live instances of each item; only the rows that can be the
    peak are kept.

    Exact reductions: identical rows once; of the points of one tied op (``classes``: equal for the
    instances of one op in repeated blocks, in schedule order), in each run of instances whose rows grow by
    the same vector from one to the next, only the first and the last (memory there is affine in the
    instance number, so its maximum is at an end); rows another row dominates (counts no smaller
    everywhere) dropped."""
    if not spans or n_points == 0:
        return []
    diff = np.zeros((n_points + 1, len(spans)), dtype=np.int32)
    for c, sp in enumerate(spans):
        a = np.array(sp, dtype=np.int64).reshape(-1, 2)
        np.add.at(diff[:, c], a[:, 0], 1)
        np.add.at(diff[:, c], a[:, 1] + 1, -1)
    counts = np.cumsum(diff[:-1], axis=0, dtype=np.int32)
    by_class: dict[Any, list[int]] = defaultdict(list)
    for p, c in enumerate(classes):
        by_class[c].append(p)
    candidates: list[int] = []
    for ps in by_class.values():
        if len(ps) <= 2:
            candidates += ps
            continue
        steps = np.diff(counts[ps], axis=0)
        start = 0  # runs of equal steps: affine, so only their ends can be the peak
        for k in range(1, len(steps) + 1):
            if k == len(steps) or not np.array_equal(steps[k], steps[start]):
                candidates += [ps[start], ps[k]]
                start = k
    seen: dict[bytes, int] = {}
    for p in sorted(candidates):
        seen.setdefault(counts[p].tobytes(), p)
    cand = np.array(sorted(seen.values()), dtype=np.int64)
    order = cand[np.argsort(-counts[cand].sum(axis=1, dtype=np.int64), kind="stable")]
    kept: list[int] = []
    for p in order:
        row = counts[p]
        if kept and (counts[kept] >= row).all(axis=1).any():
            continue
        kept.append(int(p))
    out = []
    for p in sorted(kept):
        row = counts[p]
        out.append(MemRow(0.0, tuple((int(c), int(row[c])) for c in np.nonzero(row)[0]), points[p]))
    return out


def build_space(graph: Graph, mesh: Mesh, hw: Hardware, kind: str = "ops", tie: bool = True,
                rules: RuleSets | None = None, include: RuleSets | None = None, variants: bool = True,
                pricer: Pricer | None = None, remat: str = "none", deadline: Deadline | None = None) -> Space:
    """Compile training graph ``graph`` on ``mesh`` into the search space ``kind`` (see :mod:`.space`).

    ``rules``: the candidate rule sets of the ``rules``/``layers`` spaces (default :func:`rule_sets`);
    ``include``: rule sets whose projections every op and tensor of the ``ops`` space may also take (so that
    space contains those plans); ``variants``: whether ops may store their output more split than they
    compute it; ``tie``: whether repeated blocks share their nodes; ``remat``: the cost model's
    rematerialization policy (recomputed ops priced twice, the lifetimes and buffers it implies; rules and
    layers spaces); ``deadline``: :class:`~.clock.TimeUp` when it passes while the space is built.
    """
    return _Builder(graph, mesh, hw, kind, tie, rules, include, variants, pricer, remat, deadline).build()


def _name(key: tuple) -> str:
    _, fam, name = key
    return f"{fam}~{name}" if fam is not None else name


def _ranks(positions: Sequence[int]) -> list[int]:
    """Each position's rank among the distinct positions."""
    distinct = sorted(set(positions))
    return [distinct.index(p) for p in positions]


def _segments(m: int) -> list[tuple[int, int]]:
    """The pieces of the schedule between ``m`` readers, in reader ranks: (j, j) at reader j, (j, j + 1)
    strictly between readers j and j + 1. A copy read by ranks ``rs`` lives on piece (lo, hi) when
    ``min(rs) <= lo`` and ``max(rs) >= hi``."""
    out: list[tuple[int, int]] = []
    for j in range(m):
        out.append((j, j))
        if j + 1 < m:
            out.append((j, j + 1))
    return out
