"""The strategy space shared by every solver: graph + mesh -> :class:`~.problem.Problem`.

Three granularities of the same model (``space=``):

``"rules"``
    Mesh-TensorFlow global rules: one map dim name -> mesh axes for the whole
    graph (Shazeer et al. 2018, "Mesh-TensorFlow: Deep Learning for
    Supercomputers", NeurIPS). A candidate gives each mesh axis a *primary*
    dim (or none; several axes may split one dim) and optionally a
    *fallback* dim that takes the axes whose primary dim is no parameter's
    when an op or tensor lacks that primary dim (Flax rule precedence). The
    fallback is how ZeRO/FSDP appears as rules: ``batch:data, d_model:data``
    splits activations by batch and parameters, gradients and optimizer
    state by ``d_model``. One node; its strategies are the candidates.
``"layers"``
    One rule set per repeated block (and one for everything outside blocks);
    tensors crossing blocks are resharded. Consecutive layers form a chain,
    solved by :mod:`.dp`.
``"ops"``
    Alpa/GSPMD style: every op picks its iteration layout (each mesh axis
    splits one of its dims or none, divisibly) and the layout its output is
    stored in (the computed layout, or more axes on an unsplit output dim:
    a reduce-scatter of partial sums or a free slice); every parameter,
    optimizer state and input picks a storage layout (so FSDP/ZeRO appear);
    edges pay resharding from the producer's stored layout to what the
    consumer computes with. The new value of a parameter or state is stored
    as the old one (one buffer).

Costs come from the cost model (:class:`~layoutsearch.costmodel.ops.OpRules`
and :func:`~layoutsearch.costmodel.collectives.collective_time`): an op's
compute time is its roofline time (FLOPs at the matmul efficiency, HBM bytes
at the memory efficiency), its communication the sum of its collectives; the
objective is their sum over the training step, as in the cost report.
Memory per device is the live per-device bytes at each op of the schedule
(the graph's topological order): fed tensors (parameters, optimizer state,
inputs) for the whole step, the new value of a parameter or state in the old
one's buffer, every other tensor from its producer to its last consumer, and
the copy of an input resharded for an op while that op runs.

Repeated layers are tied (``tie=True``): blocks with the same structure
(same ops, names equal after stripping the block prefix) share one node per
op (or per block), whose costs count every repeat, so a 96-layer model is one
layer's variables. Strategies provably absent from an optimum are pruned by
:func:`~.problem.prune`.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.ops import OpCost, OpRules, local_bytes, reshard
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.problem import Edge, MemItem, MemRow, Problem

SPACES = ("rules", "layers", "ops")
"""The granularities of the strategy space (see the module docstring)."""

NONE = -1
"""Axis-map entry of an axis that splits nothing."""


# -- axis maps -----------------------------------------------------------------------------------------------------
# A layout is stored as an "axis map": one entry per mesh axis (mesh order), the index of the dim it splits or
# NONE. Several axes may split one dim (major first = mesh order); an axis splits at most one dim.

def axis_maps(dims: Sequence[int], dim_sizes: Sequence[int], axis_sizes: Sequence[int]) -> np.ndarray:
    """Every divisible axis map over ``dims`` (axes of size 1 never split); shape ``[K, num_axes]``."""
    out: list[tuple[int, ...]] = []
    split = {d: 1 for d in dims}

    def rec(a: int, cur: list[int]) -> None:
        if a == len(axis_sizes):
            out.append(tuple(cur))
            return
        cur.append(NONE)
        rec(a + 1, cur)
        cur.pop()
        if axis_sizes[a] == 1:
            return
        for d in dims:
            if dim_sizes[d] % (split[d] * axis_sizes[a]) == 0:
                split[d] *= axis_sizes[a]
                cur.append(d)
                rec(a + 1, cur)
                cur.pop()
                split[d] //= axis_sizes[a]

    rec(0, [])
    return np.array(out, dtype=np.int32).reshape(len(out), len(axis_sizes))


def project(maps: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Axis maps restricted to the dims in boolean ``mask`` (indexed by dim; ``mask[-1]`` must be False)."""
    return np.where(mask[maps], maps, NONE)


@dataclass(frozen=True)
class RuleSets:
    """Candidates of the global-rules space, as arrays.

    ``primary[r, a]``: the dim axis ``a`` splits; ``fallback[r]``: the dim
    taking the axes ``fallback_axes[r]`` where no axis of them is used
    (NONE: no fallback)."""

    primary: np.ndarray
    fallback: np.ndarray
    fallback_axes: np.ndarray

    def __len__(self) -> int:
        return len(self.primary)

    def project(self, mask: np.ndarray) -> np.ndarray:
        """The axis maps the rules give a tensor or op whose dims are ``mask`` (Flax precedence)."""
        proj = project(self.primary, mask)
        fb = self.fallback
        has = (fb >= 0) & mask[fb]
        already = (proj == fb[:, None]).any(axis=1)
        used = ((proj >= 0) & self.fallback_axes).any(axis=1)
        apply = has & ~already & ~used
        return np.where(apply[:, None] & self.fallback_axes, fb[:, None], proj).astype(np.int32)

    def take(self, idx: Sequence[int] | np.ndarray) -> RuleSets:
        idx = np.asarray(idx, dtype=np.int64)
        return RuleSets(self.primary[idx], self.fallback[idx], self.fallback_axes[idx])

    def concat(self, other: RuleSets) -> RuleSets:
        return RuleSets(np.concatenate([self.primary, other.primary]), np.concatenate([self.fallback, other.fallback]),
                        np.concatenate([self.fallback_axes, other.fallback_axes]))


def rule_sets(graph: Graph, mesh: Mesh, fallbacks: bool = True) -> RuleSets:
    """Every candidate of the global-rules space (see the module docstring)."""
    dims = list(graph.dims)
    sizes = [graph.dims[d] for d in dims]
    axes = [s for _, s in mesh.axes]
    prim = axis_maps(range(len(dims)), sizes, axes)
    n = len(prim)
    P, F, FA = [prim], [np.full(n, NONE, np.int32)], [np.zeros((n, len(axes)), bool)]
    if fallbacks:
        pdims = sorted({dims.index(d) for t in graph.parameters for d in t.dim_names})
        big = np.array([s > 1 for s in axes])
        for r, row in enumerate(prim):
            free = big & ~np.isin(row, pdims)
            group = int(np.prod([s for s, f in zip(axes, free, strict=True) if f]))
            if not free.any():
                continue
            for f in pdims:
                if f not in row and sizes[f] % group == 0:
                    P.append(row[None])
                    F.append(np.array([f], np.int32))
                    FA.append(free[None])
    return RuleSets(np.concatenate(P), np.concatenate(F), np.concatenate(FA))


def rules_of(sets: RuleSets, r: int, dims: Sequence[str], mesh: Mesh) -> tuple[tuple[str, Axes], ...]:
    """Rule set ``r`` as ordered (dim, axes) rules: primaries (graph dim order), then the fallback."""
    row = sets.primary[r]
    out = [(dims[d], tuple(a for a, x in zip(mesh.names, row, strict=True) if x == d))
           for d in sorted(set(int(x) for x in row if x >= 0))]
    if sets.fallback[r] >= 0:
        out.append((dims[int(sets.fallback[r])],
                    tuple(a for a, m in zip(mesh.names, sets.fallback_axes[r], strict=True) if m)))
    return tuple(out)


def rule_set_of(rules: Iterable[tuple[str, Iterable[str]]], dims: Sequence[str], mesh: Mesh) -> RuleSets:
    """The one-candidate :class:`RuleSets` of simple rules (each axis in at most one primary rule, at most
    one fallback rule naming a dim without a primary rule); LayoutSearchError otherwise."""
    row = np.full(len(mesh.names), NONE, np.int32)
    fb, fa = NONE, np.zeros(len(mesh.names), bool)
    seen: set[str] = set()
    for d, axes in rules:
        axes = tuple(axes)
        if not axes:
            continue
        idx = [mesh.names.index(a) for a in axes]
        if d in seen or any(row[i] != NONE for i in idx):
            if fb != NONE or d in seen:
                raise LayoutSearchError(f"rules {list(rules)} are not in the search space (one fallback rule at most)")
            fb = dims.index(d)
            fa[idx] = True
            continue
        seen.add(d)
        row[idx] = dims.index(d)
    return RuleSets(row[None], np.array([fb], np.int32), fa[None])


def to_dim_layout(amap: Sequence[int], dims: Sequence[str], mesh: Mesh) -> DimLayout:
    """An axis map as a DimLayout (dim -> axes in mesh order)."""
    out: dict[str, tuple[str, ...]] = {}
    for a, d in zip(mesh.names, amap, strict=True):
        if d >= 0:
            out[dims[d]] = (*out.get(dims[d], ()), a)
    return out


# -- repeated blocks ------------------------------------------------------------------------------------------------

def _strip(name: str, block: str | None) -> str:
    if block is None:
        return name
    if name.startswith(block + "/"):
        return name[len(block) + 1:]
    return name.replace("/" + block + "/", "/", 1)


def _op_sig(graph: Graph, op: O.Op) -> tuple:
    t = graph.tensors
    return (op.kind, tuple(sorted(op.attrs().items(), key=lambda kv: kv[0])),
            tuple((t[i].dim_names, t[i].dtype) for i in op.inputs), (t[op.output].dim_names, t[op.output].dtype))


def block_families(graph: Graph, tie: bool = True) -> dict[str, str]:
    """Block name -> the first block of its family (blocks with the same ops, names equal after stripping
    the block prefix, same shapes); each block is its own family when ``tie`` is False."""
    sigs: dict[str, list] = defaultdict(list)
    for op in graph.ops:
        if op.block is not None:
            sigs[op.block].append((_strip(op.name, op.block), tuple(_strip(i, op.block) for i in op.inputs),
                                   _op_sig(graph, op)))
    fam: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for b, s in sigs.items():
        key = tuple(sorted(s, key=repr)) if tie else (b,)
        fam[b] = first.setdefault(key, b)
    return fam


# -- nodes ----------------------------------------------------------------------------------------------------------

@dataclass
class Node:
    """A decision of the space: its strategies as axis maps.

    ``kind``: ``"rules"`` (a rule set per strategy), ``"op"`` (``iteration``
    and ``output`` maps of one op class) or ``"source"`` (``storage`` map of
    one fed tensor class). ``count``: instances tied into it."""

    name: str
    kind: str
    count: int = 1
    rules: RuleSets | None = None
    iteration: np.ndarray | None = None
    output: np.ndarray | None = None
    storage: np.ndarray | None = None
    op: O.Op | None = None
    tensor: Tensor | None = None

    @property
    def size(self) -> int:
        if self.rules is not None:
            return len(self.rules)
        arr = self.iteration if self.iteration is not None else self.storage
        return len(arr)

    def take(self, idx: np.ndarray) -> Node:
        """This node with only strategies ``idx``."""
        f = lambda a: None if a is None else a[idx]
        return Node(self.name, self.kind, self.count, self.rules.take(idx) if self.rules is not None else None,
                    f(self.iteration), f(self.output), f(self.storage), self.op, self.tensor)


@dataclass
class Space:
    """A graph's strategy space on a mesh, compiled to a :class:`Problem`, and the way back
    (assignment -> per-op iteration layouts and per-tensor storage layouts)."""

    graph: Graph
    mesh: Mesh
    hardware: Hardware
    kind: str
    nodes: list[Node]
    op_node: dict[str, int]
    owner: dict[str, int]
    problem: Problem
    dims: list[str] = field(default_factory=list)

    def _mask(self, names: Iterable[str]) -> np.ndarray:
        m = np.zeros(len(self.dims) + 1, bool)
        for d in names:
            m[self.dims.index(d)] = True
        return m

    def iteration(self, assign: Sequence[int], op: O.Op) -> DimLayout:
        """The computation layout of ``op`` under ``assign``."""
        node = self.nodes[self.op_node[op.name]]
        s = assign[self.op_node[op.name]]
        if node.rules is not None:
            amap = node.rules.take([s]).project(self._mask(op.iteration_dims(self.graph.tensors)))[0]
        else:
            amap = node.iteration[s]
        return to_dim_layout(amap, self.dims, self.mesh)

    def storage(self, assign: Sequence[int], tensor: str) -> DimLayout:
        """The layout ``tensor`` is stored in under ``assign``."""
        n = self.owner[tensor]
        node, s, t = self.nodes[n], assign[n], self.graph.tensors[tensor]
        if node.rules is not None:
            amap = node.rules.take([s]).project(self._mask(t.dim_names))[0]
        elif node.kind == "source":
            amap = node.storage[s]
        else:
            amap = node.output[s]
        return to_dim_layout(amap, self.dims, self.mesh)

    def rules(self, assign: Sequence[int]) -> tuple[tuple[str, Axes], ...] | None:
        """The global rules of ``assign`` when one rule set describes every op and tensor, else None."""
        rs = [(n, assign[i]) for i, n in enumerate(self.nodes) if n.rules is not None]
        if len(rs) != len(self.nodes):
            return None
        cands = {rules_of(n.rules, s, self.dims, self.mesh) for n, s in rs}
        return next(iter(cands)) if len(cands) == 1 else None

    def layout(self, assign: Sequence[int]) -> Layout:
        """``assign`` as a Layout: its global rules, plus a per-tensor entry for every tensor they do not
        describe (all tensors when no rules describe the plan)."""
        rules = self.rules(assign) or ()
        lay = Layout(self.mesh, rules)
        entries = []
        for t in self.graph.tensors.values():
            want = self.storage(assign, t.name)
            if lay.dim_layout(t) != want:
                entries.append((t.name, tuple((d, want[d]) for d in t.dim_names if d in want)))
        return Layout(self.mesh, rules, tuple(entries))

    def op_layouts(self, assign: Sequence[int]) -> dict[str, DimLayout]:
        return {op.name: self.iteration(assign, op) for op in self.graph.ops}


# -- pricing --------------------------------------------------------------------------------------------------------

class Pricer:
    """Seconds of op costs and collectives on one mesh and hardware (cached)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware) -> None:
        self.graph, self.mesh, self.hw = graph, mesh, hw
        self.rules = OpRules(graph, mesh, hw.reduce_scatter)
        self._coll: dict[tuple, float] = {}

    def collective(self, kind: str, nbytes: int, axes: Axes) -> float:
        key = (kind, nbytes, axes)
        if key not in self._coll:
            self._coll[key] = collective_time(kind, nbytes, axes, self.mesh, self.hw).seconds
        return self._coll[key]

    def compute(self, c: OpCost) -> float:
        """Roofline time of an op: FLOPs at (matmul-efficient) peak vs HBM traffic at effective bandwidth."""
        hw = self.hw
        peak = hw.peak_flops * (hw.matmul_efficiency if c.matmul else 1.0)
        return max(c.flops / peak, c.hbm_bytes / (hw.hbm_bandwidth * hw.memory_efficiency))

    def comm(self, c: OpCost) -> float:
        return sum(self.collective(x.kind, x.bytes, x.axes) for x in c.comms)

    def seconds(self, c: OpCost) -> float:
        return self.compute(c) + self.comm(c)


def op_time(graph: Graph, mesh: Mesh, hw: Hardware, iteration: dict[str, DimLayout],
            storage: dict[str, DimLayout]) -> tuple[float, float]:
    """(compute s, communication s) of the whole step with explicit per-op and per-tensor layouts: the
    objective the space minimizes, evaluated directly (for checks)."""
    p = Pricer(graph, mesh, hw)
    comp = comm = 0.0
    for op in graph.ops:
        c = p.rules.cost(op, iteration.get(op.name, {}), [storage[i] for i in op.inputs], storage[op.output])
        comp += p.compute(c)
        comm += p.comm(c)
    return comp, comm


def _bytes(t: Tensor, amap: np.ndarray, dim_sizes: np.ndarray, axis_sizes: np.ndarray) -> int:
    n = t.nbytes
    for a, d in enumerate(amap):
        if d >= 0:
            n //= int(axis_sizes[a])
    return n


# -- building a space -------------------------------------------------------------------------------------------------

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
    """(distinct rows, index of each row's distinct row)."""
    uniq, inv = np.unique(rows.reshape(len(rows), -1), axis=0, return_inverse=True)
    return uniq, inv.reshape(-1)


class _Builder:
    """Compiles a graph into a :class:`Space` (see :func:`build_space`)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, kind: str, tie: bool, rules: RuleSets | None,
                 include: RuleSets | None, variants: bool, temporaries: bool, pricer: Pricer | None) -> None:
        if kind not in SPACES:
            raise LayoutSearchError(f"unknown search space {kind!r} (known: {', '.join(SPACES)})")
        self.g, self.mesh, self.hw, self.kind = graph, mesh, hw, kind
        self.dims = list(graph.dims)
        self.dim_sizes = np.array([graph.dims[d] for d in self.dims], dtype=np.int64)
        self.axis_sizes = np.array([s for _, s in mesh.axes], dtype=np.int64)
        self.p = pricer or Pricer(graph, mesh, hw)
        self.tie, self.variants, self.temporaries = tie, variants, temporaries
        self.rules = rules if rules is not None else (rule_sets(graph, mesh) if kind != "ops" else None)
        self.include = include
        self.nodes: list[Node] = []
        self.op_node: dict[str, int] = {}
        self.owner: dict[str, int] = {}
        self._keys: dict[tuple, np.ndarray] = {}
        self._fcache: dict[tuple, float] = {}

    def mask(self, names: Iterable[str]) -> np.ndarray:
        m = np.zeros(len(self.dims) + 1, bool)
        for d in names:
            m[self.dims.index(d)] = True
        return m

    def dl(self, amap: np.ndarray) -> DimLayout:
        return to_dim_layout(amap, self.dims, self.mesh)

    # -- nodes
    def tensor_blocks(self) -> dict[str, str | None]:
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
        fam = block_families(g, self.tie)
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

        if self.kind == "rules":
            self.nodes.append(Node("rules", "rules", 1, rules=self.rules))
            self.op_node = {op.name: 0 for op in g.ops}
            self.owner = {t: 0 for t in g.tensors}
            return
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
            if owns and self.variants:
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

    # -- item costs
    def f_op(self, op: O.Op, it: np.ndarray, out: np.ndarray) -> float:
        """Seconds of ``op`` computed as ``it`` with its inputs already laid out for it, output stored ``out``."""
        key = ("op", _op_sig(self.g, op), it.tobytes(), out.tobytes())
        if key not in self._fcache:
            t = self.g.tensors
            I = self.dl(it)
            wants = [{d: I[d] for d in t[x].dim_names if d in I} for x in op.inputs]
            self._fcache[key] = self.p.seconds(self.p.rules.cost(op, I, wants, self.dl(out)))
        return self._fcache[key]

    def f_reshape(self, op: O.Op, src: np.ndarray, out: np.ndarray) -> float:
        key = ("reshape", _op_sig(self.g, op), src.tobytes(), out.tobytes())
        if key not in self._fcache:
            self._fcache[key] = self.p.seconds(self.p.rules.cost(op, {}, [self.dl(src)], self.dl(out)))
        return self._fcache[key]

    def f_reshard(self, t: Tensor, src: np.ndarray, dst: np.ndarray) -> float:
        key = ("rs", t.dim_names, t.dtype, src.tobytes(), dst.tobytes())
        if key not in self._fcache:
            comms = reshard(t, self.dl(src), self.dl(dst), self.mesh, "")
            self._fcache[key] = sum(self.p.collective(c.kind, c.bytes, c.axes) for c in comms)
        return self._fcache[key]

    def b_local(self, t: Tensor, amap: np.ndarray) -> int:
        return local_bytes(t, self.dl(amap), self.mesh)

    # -- items
    def _pair(self, u: int, ku: np.ndarray, v: int, kv: np.ndarray, fn: Any) -> tuple:
        """An interaction between node ``u`` (keys ``ku`` per strategy) and ``v``: ('unary', node, values per
        strategy) when u == v, else ('pair', u, key index of u's strategies, v, ..., table over key pairs)."""
        Uu, iu = _unique(ku)
        Uv, iv = _unique(kv)
        if u == v:
            pairs, inv = np.unique(np.stack([iu, iv], axis=1), axis=0, return_inverse=True)
            vals = np.array([fn(Uu[a], Uv[b]) for a, b in pairs], dtype=float)
            return ("unary", u, vals[inv.reshape(-1)])
        table = np.array([[fn(a, b) for b in Uv] for a in Uu], dtype=float)
        if u > v:
            return ("pair", v, iv, u, iu, table.T)
        return ("pair", u, iu, v, iv, table)

    def _cost_item(self, key: tuple, op: O.Op, i: int | None) -> tuple:
        g, t = self.g, self.g.tensors
        kind = key[0]
        out = t[op.output]
        if kind == "reshape":
            _, _, u, o = key
            return self._pair(u, self.store_keys(u, t[op.inputs[0]]), o, self.store_keys(o, out),
                              lambda a, b: self.f_reshape(op, a, b))
        if kind == "compute":
            n = key[2]
            om = self.mask(out.dim_names)
            return self._pair(n, self.iter_keys(n, op), n, self.iter_keys(n, op),
                              lambda a, b: self.f_op(op, a, project(a, om)))
        if kind == "finish":
            _, _, n, o = key
            om = self.mask(out.dim_names)
            I = self.iter_keys(n, op)
            special = len(self.dims) + 1
            coarse = np.where(om[I], I, np.where(I >= 0, special, NONE)).astype(np.int32)
            reps = {c.tobytes(): I[k] for k, c in enumerate(coarse)}

            def fin(c: np.ndarray, ok: np.ndarray) -> float:
                rep = reps[c.tobytes()]
                P = project(rep, om)
                if (c == special).any():
                    return self.f_op(op, rep, ok) - self.f_op(op, rep, P)
                return self.f_reshard(out, P, ok)

            return self._pair(n, coarse, o, self.store_keys(o, out), fin)
        _, _, _, u, n = key
        x = t[op.inputs[i]]
        xm = self.mask(x.dim_names)
        return self._pair(u, self.store_keys(u, x), n, project(self.iter_keys(n, op), xm),
                          lambda a, b: self.f_reshard(x, a, b))

    def _mem_item(self, key: tuple, rep: Any, i: int | None) -> tuple:
        if key[0] == "store":
            o = key[-1]
            return self._pair(o, self.store_keys(o, rep), o, self.store_keys(o, rep),
                              lambda a, b: float(self.b_local(rep, a)))
        op = rep
        _, _, _, u, n = key
        x = self.g.tensors[op.inputs[i]]
        xm = self.mask(x.dim_names)
        return self._pair(u, self.store_keys(u, x), n, project(self.iter_keys(n, op), xm),
                          lambda a, b: 0.0 if np.array_equal(a, b) else float(self.b_local(x, b)))

    def build(self) -> Space:
        self.make_nodes()
        g = self.g
        N = len(g.ops)
        cost_items: dict[tuple, list] = {}
        mem_items: dict[tuple, list] = {}

        def add_cost(key: tuple, op: O.Op, i: int | None) -> None:
            cost_items.setdefault(key, [0, op, i])[0] += 1

        def add_mem(key: tuple, rep: Any, i: int | None, span: tuple[int, int]) -> None:
            mem_items.setdefault(key, [[], rep, i])[0].append(span)

        last: dict[str, int] = {}
        for k, op in enumerate(g.ops):
            for x in op.inputs:
                last[x] = k
        for k, op in enumerate(g.ops):
            n, sig, o = self.op_node[op.name], _op_sig(g, op), self.owner[op.output]
            if isinstance(op, O.Reshape):
                add_cost(("reshape", sig, self.owner[op.inputs[0]], o), op, None)
                continue
            add_cost(("compute", sig, n), op, None)
            add_cost(("finish", sig, n, o), op, None)
            for i, x in enumerate(op.inputs):
                u = self.owner[x]
                add_cost(("in", sig, i, u, n), op, i)
                if self.temporaries:
                    add_mem(("tmp", sig, i, u, n), op, i, (k, k))
        fed = {t.name for t in g.fed}
        pos = {op.output: k for k, op in enumerate(g.ops)}
        for t in g.tensors.values():
            if t.updates is not None:
                continue
            start, end = (0, N - 1) if t.name in fed else (pos[t.name], last.get(t.name, pos[t.name]))
            add_mem(("store", t.dim_names, t.dtype, self.owner[t.name]), t, None, (start, end))

        unary = [np.zeros(n.size) for n in self.nodes]
        pairs: dict[tuple[int, int], list] = defaultdict(list)
        for key, (count, op, i) in cost_items.items():
            item = self._cost_item(key, op, i)
            if item[0] == "unary":
                unary[item[1]] += count * item[2]
            else:
                pairs[(item[1], item[3])].append((item[2], item[4], item[5] * count, None))
        mem_list: list[tuple] = []
        spans: list[list[tuple[int, int]]] = []
        for key, (sp, rep, i) in mem_items.items():
            item = self._mem_item(key, rep, i)
            if not item[-1].any():
                continue
            spans.append(sp)
            if item[0] == "unary":
                mem_list.append(MemItem(item[1], None, item[2]))
            else:
                mem_list.append(None)
                pairs[(item[1], item[3])].append((item[2], item[4], item[5], len(mem_list) - 1))
        edges: list[Edge] = []
        for (u, v), items in sorted(pairs.items()):
            cu, ru = _unique(np.stack([it[0] for it in items], axis=1))
            cv, rv = _unique(np.stack([it[1] for it in items], axis=1))
            cost = np.zeros((len(cu), len(cv)))
            mems = []
            for k, (_, _, table, mem) in enumerate(items):
                sub = table[np.ix_(cu[:, k], cv[:, k])]
                if mem is None:
                    cost += sub
                else:
                    mems.append((mem, sub))
            if not mems and not cost.any():
                continue
            e = len(edges)
            edges.append(Edge(u, v, ru.astype(np.int64), rv.astype(np.int64), cost))
            for mem, sub in mems:
                mem_list[mem] = MemItem(None, e, sub)
        rows = _memory_rows(spans, N, [op.name for op in g.ops])
        names = [n.name for n in self.nodes]
        problem = Problem(names, unary, edges, mem_list, rows)
        return Space(g, self.mesh, self.hw, self.kind, self.nodes, self.op_node, self.owner, problem, self.dims)


def _memory_rows(spans: list[list[tuple[int, int]]], n_points: int, points: list[str]) -> list[MemRow]:
    """One row per schedule point counting the live instances of each item, without dominated rows."""
    if not spans or n_points == 0:
        return []
    diff = np.zeros((n_points + 1, len(spans)), dtype=np.int64)
    for c, sp in enumerate(spans):
        a = np.array(sp, dtype=np.int64)
        np.add.at(diff[:, c], a[:, 0], 1)
        np.add.at(diff[:, c], a[:, 1] + 1, -1)
    counts = np.cumsum(diff[:-1], axis=0)
    uniq, first = np.unique(counts, axis=0, return_index=True)
    order = np.argsort(-uniq.sum(axis=1), kind="stable")
    kept: list[int] = []
    for r in order:
        row = uniq[r]
        if kept and (uniq[kept] >= row).all(axis=1).any():
            continue
        kept.append(int(r))
    out = []
    for r in sorted(kept, key=lambda r: first[r]):
        row = uniq[r]
        out.append(MemRow(0.0, tuple((int(c), int(row[c])) for c in np.nonzero(row)[0]), points[int(first[r])]))
    return out


def build_space(graph: Graph, mesh: Mesh, hw: Hardware, kind: str = "ops", tie: bool = True,
                rules: RuleSets | None = None, include: RuleSets | None = None, variants: bool = True,
                temporaries: bool = True, pricer: Pricer | None = None) -> Space:
    """Compile ``graph`` (a training graph, or any graph) on ``mesh`` into the search space ``kind``.

    ``rules``: the candidate rule sets of the ``rules``/``layers`` spaces (default :func:`rule_sets`);
    ``include``: rule sets whose projections every op and tensor of the ``ops`` space may also take (so
    that space contains those plans); ``variants``: whether ops may store their output more split than
    they compute it; ``temporaries``: whether resharded input copies count in memory.
    """
    return _Builder(graph, mesh, hw, kind, tie, rules, include, variants, temporaries, pricer).build()


def _name(key: tuple) -> str:
    _, fam, name = key
    return f"{fam}~{name}" if fam is not None else name
