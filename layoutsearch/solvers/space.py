"""The strategy space shared by every solver: graph + mesh -> :class:`~.problem.Problem`.

Three granularities of the same model (``space=``):

``"rules"``
    Mesh-TensorFlow global rules: one map dim name -> mesh axes for the whole
    graph (Shazeer et al. 2018, "Mesh-TensorFlow: Deep Learning for
    Supercomputers", NeurIPS). A candidate gives each mesh axis a *primary*
    dim (or none; several axes may split one dim) and optionally a
    *fallback* dim that takes some or all of the axes whose primary dim is
    no parameter's when an op or tensor lacks that primary dim (Flax rule
    precedence). The fallback is how ZeRO/FSDP appears as rules:
    ``batch:data, d_model:data`` splits activations by batch and parameters,
    gradients and optimizer state by ``d_model``; over some of the batch axes
    only (``batch:data+fsdp, d_model:fsdp``) it is hybrid sharding (FSDP
    inside a slice or node, data parallelism across: PyTorch's HSDP,
    MaxText's multi-slice default). One node; its strategies are the
    candidates.
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

import copy
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from layoutsearch.costmodel.collectives import collective_time
from layoutsearch.costmodel.compute import compute_seconds
from layoutsearch.costmodel.fusion import fusion_plan, resolve_attention
from layoutsearch.costmodel.memory import remat_plan, simulate
from layoutsearch.costmodel.ops import OpCost, OpRules, dedupe_shared
from layoutsearch.costmodel.overlap import classify, collective_classes
from layoutsearch.costmodel.step import signature_ids
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import SEP, scope_prefix
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.problem import Problem

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

    ``primary[r, a]``: the *choice* of mesh axis ``a`` (NONE: splits
    nothing); choice ``c`` splits the dims ``choices[c]``: one dim, or a
    *group* of dims no op or tensor has two of (``heads``, ``d_ff`` and
    ``vocab`` on one ``model`` axis, as Megatron does). Then, in order, the
    fallbacks (slots ``s`` = 0, 1): ``fallback[r, s]`` is a dim taking the
    axes ``fallback_axes[r, s]`` wherever none of them is used yet (NONE: no
    fallback). Slot 0 is a parameter dim on axes that split activations
    (FSDP/ZeRO), slot 1 an activation dim on the axes of a parameter choice
    (sequence parallelism: ``seq`` over the tensor-parallel axis between its
    matmuls, Korthikanti et al. 2022; MaxText's ``activation_embed``)."""

    choices: tuple[tuple[int, ...], ...]
    primary: np.ndarray
    fallback: np.ndarray
    fallback_axes: np.ndarray

    def __len__(self) -> int:
        return len(self.primary)

    def project(self, mask: np.ndarray) -> np.ndarray:
        """The axis maps the rules give a tensor or op whose dims are ``mask`` (Flax precedence)."""
        table = np.array([next((d for d in c if mask[d]), NONE) for c in self.choices] + [NONE], dtype=np.int32)
        proj = table[self.primary]
        for s in range(self.fallback.shape[1]):
            fb, fa = self.fallback[:, s], self.fallback_axes[:, s]
            has = (fb >= 0) & mask[fb]
            already = (proj == fb[:, None]).any(axis=1)
            used = ((proj >= 0) & fa).any(axis=1)
            apply = has & ~already & ~used
            proj = np.where(apply[:, None] & fa, fb[:, None], proj)
        return proj.astype(np.int32)

    def take(self, idx: Sequence[int] | np.ndarray) -> RuleSets:
        idx = np.asarray(idx, dtype=np.int64)
        return RuleSets(self.choices, self.primary[idx], self.fallback[idx], self.fallback_axes[idx])

    def _codes(self, primary: np.ndarray, fallback: np.ndarray, fallback_axes: np.ndarray) -> np.ndarray:
        return np.concatenate([primary, fallback, fallback_axes.reshape(len(primary), -1).astype(np.int32)], axis=1)

    def concat(self, other: RuleSets) -> RuleSets:
        """Both candidate lists, duplicates (of ``other``) dropped; ``other``'s choices are mapped to ours."""
        choices = list(self.choices)
        remap = []
        for c in other.choices:
            if c not in choices:
                choices.append(c)
            remap.append(choices.index(c))
        remap.append(NONE)
        prim = np.array(remap, dtype=np.int32)[other.primary]
        P = np.concatenate([self.primary, prim])
        F = np.concatenate([self.fallback, other.fallback])
        FA = np.concatenate([self.fallback_axes, other.fallback_axes])
        _, first = np.unique(self._codes(P, F, FA), axis=0, return_index=True)
        keep = np.sort(first)
        return RuleSets(tuple(choices), P[keep], F[keep], FA[keep])

    def index(self, other: RuleSets, r: int = 0) -> int | None:
        """The index of candidate ``r`` of ``other`` among ours, if present."""
        choices = list(self.choices)
        remap = [choices.index(c) if c in choices else -2 for c in other.choices] + [NONE]
        code = self._codes(np.array(remap, dtype=np.int32)[other.primary[r:r + 1]], other.fallback[r:r + 1],
                           other.fallback_axes[r:r + 1])[0]
        ours = self._codes(self.primary, self.fallback, self.fallback_axes)
        hit = np.nonzero((ours == code).all(axis=1))[0]
        return int(hit[0]) if len(hit) else None


def model_groups(graph: Graph, limit: int = 4) -> list[tuple[str, ...]]:
    """Groups of parameter dims no op or tensor has two of (maximal, at least two dims, largest first): each
    can share one mesh axis, as ``heads``, ``d_ff`` and ``vocab`` share Megatron's model axis."""
    pdims = sorted({d for t in graph.parameters for d in t.dim_names}, key=list(graph.dims).index)
    together: set[frozenset[str]] = set()
    spaces = [op.iteration_dims(graph.tensors) for op in graph.ops] + [t.dim_names for t in graph.tensors.values()]
    for dims in {tuple(sorted(set(s) & set(pdims))) for s in spaces}:
        for a, b in itertools.combinations(dims, 2):
            together.add(frozenset((a, b)))
    apart = [(a, b) for a, b in itertools.combinations(pdims, 2) if frozenset((a, b)) not in together]
    g = nx.Graph()
    g.add_nodes_from(pdims)
    g.add_edges_from(apart)
    order = {d: i for i, d in enumerate(pdims)}
    cliques = [tuple(sorted(c, key=order.__getitem__)) for c in nx.find_cliques(g) if len(c) >= 2]
    weight = {d: sum(t.nbytes for t in graph.parameters if d in t.dim_names) for d in pdims}
    cliques.sort(key=lambda c: (-len(c), -sum(weight[d] for d in c), c))
    return cliques[:limit]


def rule_sets(graph: Graph, mesh: Mesh, fallbacks: bool = True, groups: bool = True) -> RuleSets:
    """Every candidate of the global-rules space (see the module docstring): each mesh axis splits one dim, a
    group of dims (:func:`model_groups`) or nothing, divisibly; plus, when some axes split no parameter dim,
    a fallback parameter dim taking them (ZeRO/FSDP)."""
    dims = list(graph.dims)
    sizes = [graph.dims[d] for d in dims]
    axes = [s for _, s in mesh.axes]
    choices: list[tuple[int, ...]] = [(d,) for d in range(len(dims))]
    if groups:
        choices += [tuple(dims.index(d) for d in grp) for grp in model_groups(graph)]
    pdims = sorted({dims.index(d) for t in graph.parameters for d in t.dim_names})
    rows: list[tuple[int, ...]] = []
    split = [1] * len(dims)

    def rec(a: int, cur: list[int]) -> None:
        if a == len(axes):
            rows.append(tuple(cur))
            return
        cur.append(NONE)
        rec(a + 1, cur)
        cur.pop()
        if axes[a] == 1:
            return
        for c, members in enumerate(choices):
            if all(sizes[d] % (split[d] * axes[a]) == 0 for d in members):
                for d in members:
                    split[d] *= axes[a]
                cur.append(c)
                rec(a + 1, cur)
                cur.pop()
                for d in members:
                    split[d] //= axes[a]

    rec(0, [])
    prim = np.array(rows, dtype=np.int32).reshape(len(rows), len(axes))
    A = len(axes)
    P: list[np.ndarray] = []
    F: list[tuple[int, int]] = []
    FA: list[np.ndarray] = []
    big = np.array([s > 1 for s in axes])
    param_choice = np.array([any(d in pdims for d in c) for c in choices] + [False])
    spaces = {tuple(sorted(dims.index(d) for d in t.dim_names)) for t in graph.tensors.values()}
    for row in prim:
        used = {d for c in row if c >= 0 for d in choices[c]}
        slot0: list[tuple[int, np.ndarray]] = [(NONE, np.zeros(A, bool))]
        free = np.nonzero(big & ~param_choice[row])[0] if fallbacks else []
        for r in range(1, len(free) + 1):
            for subset in itertools.combinations(free, r):  # all free axes (ZeRO-3), or some (hybrid FSDP)
                mask = np.zeros(A, bool)
                mask[list(subset)] = True
                group = int(np.prod([axes[a] for a in subset]))
                slot0 += [(f, mask) for f in pdims if f not in used and sizes[f] % group == 0]
        slot1: list[tuple[int, np.ndarray]] = [(NONE, np.zeros(A, bool))]
        model = big & param_choice[row]
        if fallbacks and model.any():  # sequence parallelism: dims of the tensors the model axes leave unsplit
            group = int(np.prod([s for s, m in zip(axes, model, strict=True) if m]))
            owned = {d for c in row[model] for d in choices[c]}
            left = {d for sp in spaces if owned.isdisjoint(sp) for d in sp}
            slot1 += [(d, model) for d in sorted(left - used) if sizes[d] % group == 0]
        for (f0, m0), (f1, m1) in itertools.product(slot0, slot1):
            P.append(row)
            F.append((f0, f1))
            FA.append(np.stack([m0, m1]))
    n = len(P)
    return RuleSets(tuple(choices), np.array(P, np.int32).reshape(n, A), np.array(F, np.int32).reshape(n, 2),
                    np.array(FA, bool).reshape(n, 2, A))


def rules_of(sets: RuleSets, r: int, dims: Sequence[str], mesh: Mesh) -> tuple[tuple[str, Axes], ...]:
    """Rule set ``r`` as ordered (dim, axes) rules: primaries (graph dim order), then the fallbacks."""
    row = sets.primary[r]
    split: dict[int, list[str]] = {}
    for a, c in zip(mesh.names, row, strict=True):
        if c >= 0:
            for d in sets.choices[c]:
                split.setdefault(d, []).append(a)
    out = [(dims[d], tuple(split[d])) for d in sorted(split)]
    for f, fa in zip(sets.fallback[r], sets.fallback_axes[r], strict=True):
        if f >= 0:
            out.append((dims[int(f)], tuple(a for a, m in zip(mesh.names, fa, strict=True) if m)))
    return tuple(out)


def rule_set(choices: Sequence[Iterable[str] | str | None], dims: Sequence[str], mesh: Mesh,
             fallback: str | None = None, fallback_axes: Iterable[str] = (), activation_fallback: str | None = None,
             activation_axes: Iterable[str] = ()) -> RuleSets:
    """A one-candidate :class:`RuleSets`: ``choices[a]`` is what mesh axis ``a`` splits (a dim name, several
    dim names no tensor has two of, or None); the fallbacks of slots 0 and 1 (see :class:`RuleSets`)."""
    chosen: list[tuple[int, ...]] = []
    row = []
    for c in choices:
        if c is None:
            row.append(NONE)
            continue
        members = (c,) if isinstance(c, str) else tuple(c)
        key = tuple(dims.index(d) for d in members)
        if key not in chosen:
            chosen.append(key)
        row.append(chosen.index(key))
    fa = [[a in set(axes) for a in mesh.names] for axes in (fallback_axes, activation_axes)]
    fb = [dims.index(d) if d is not None else NONE for d in (fallback, activation_fallback)]
    return RuleSets(tuple(chosen), np.array([row], np.int32).reshape(1, len(mesh.names)),
                    np.array([fb], np.int32), np.array([fa], bool))


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
    prefix = scope_prefix(block)
    if name.startswith(prefix):
        return name[len(prefix):]
    return name.replace(SEP + prefix, SEP, 1)


def block_families(graph: Graph, tie: bool = True) -> dict[str, str]:
    """Block name -> the first block of its family (blocks with the same ops, names equal after stripping
    the block prefix, same shapes); each block is its own family when ``tie`` is False."""
    sigs: dict[str, list] = defaultdict(list)
    inside: dict[str, set[str]] = defaultdict(set)
    for op in graph.ops:
        if op.block is not None:
            inside[op.block].add(op.output)
    sig = signature_ids(graph)
    for op in graph.ops:
        if op.block is not None:
            ins = tuple(_strip(i, op.block) if i in inside[op.block] or _strip(i, op.block) != i else "<in>"
                        for i in op.inputs)
            sigs[op.block].append((_strip(op.name, op.block), ins, sig[op.name]))
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

@dataclass(frozen=True)
class _OpView:
    """What :func:`~layoutsearch.costmodel.overlap.classify` reads of an op."""

    matmul: bool
    output: str


class Pricer:
    """Seconds of op costs and collectives on one mesh and hardware (cached)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, attention: str = "auto") -> None:
        self.graph, self.mesh, self.hw = graph, mesh, hw
        self.rules = OpRules(graph, mesh, hw.reduce_scatter, hw.float32_collectives, hw.regather_weights)
        self.fusion = fusion_plan(graph, hw.fusion, resolve_attention(attention, hw))
        """HBM traffic per op and on-chip tensors (:mod:`layoutsearch.costmodel.fusion`)."""
        self.flash_recomputed = frozenset(n for core in self.fusion.flash for n in core.recompute)
        """Forward ops a flash-attention backward pass runs again."""
        self._coll: dict[tuple, float] = {}
        self.cache: dict[tuple, Any] = {}
        """Prices of op and reshard variants, shared by the spaces built with this pricer."""
        self.counted = "all"
        """Which collectives the prices count: ``all``, or ``critical`` (those the step always waits for: a
        lower bound of the overlapped step, see :meth:`bound`)."""
        self.classes = collective_classes(graph)
        self.optimizer = True
        """Whether the optimizer's ops are priced (False: a space built with this pricer prices one micro-batch's
        forward and backward passes, see :meth:`bound`)."""

    def bound(self, optimizer: bool = True) -> Pricer:
        """A copy (sharing this pricer's caches) whose prices count only critical collectives: a space built
        with it has, per strategy, a lower bound of the step that :mod:`~layoutsearch.costmodel.overlap`
        schedules (compute runs on one stream, and a critical collective holds it for at least its time).
        ``optimizer=False`` leaves the optimizer's ops out: a lower bound of one micro-batch's share of a
        gradient-accumulation step, which runs the optimizer once for all micro-batches."""
        other = copy.copy(self)
        other.counted = "critical"
        other.optimizer = optimizer
        return other

    def counts(self, c: Any, op_name: str | None = None, matmul: bool = False) -> bool:
        """Whether this pricer counts collective ``c`` (of op ``op_name``, a matmul or not)."""
        if self.counted == "all":
            return True
        if not self.hw.async_collectives:
            return True
        view = _OpView(matmul, self.graph.op(op_name).output) if op_name is not None else None
        return classify(c, self.classes, view, self.hw.collective_matmul) == "critical"

    def collective(self, kind: str, nbytes: int, axes: Axes) -> float:
        key = (kind, nbytes, axes)
        if key not in self._coll:
            self._coll[key] = collective_time(kind, nbytes, axes, self.mesh, self.hw).seconds
        return self._coll[key]

    def compute(self, c: OpCost, op: O.Op | None = None) -> float:
        """Roofline time of an op (:func:`~layoutsearch.costmodel.compute.compute_seconds`); ``c`` may be
        priced for another op of the same shapes: ``op`` gives the HBM traffic of the fusion plan."""
        return compute_seconds(self.fusion.cost(op, c) if op is not None else c, self.hw)[0]

    def comm(self, c: OpCost) -> float:
        return sum(self.collective(x.kind, x.bytes, x.axes) for x in c.comms if self.counts(x, c.op, c.matmul))

    def seconds(self, c: OpCost, op: O.Op | None = None) -> float:
        return self.compute(c, op) + self.comm(c)


def evaluate(graph: Graph, mesh: Mesh, hw: Hardware, iteration: dict[str, DimLayout],
             storage: dict[str, DimLayout], remat: str = "none") -> tuple[float, float, int]:
    """(compute s, communication s, peak memory bytes) of training graph ``graph`` computed op by op with
    ``iteration`` and every tensor stored as ``storage``, by the cost model's own rules (collectives shared
    by several ops counted once; recomputed ops priced again; memory by its live-set simulation): what a
    space's objective and memory rows must reproduce."""
    p = Pricer(graph, mesh, hw)
    t = graph.tensors
    each = [p.rules.cost(op, iteration.get(op.name, {}), [storage[i] for i in op.inputs], storage[op.output])
            for op in graph.ops]
    costs = [p.fusion.cost(op, c) for op, c in zip(graph.ops, dedupe_shared(each), strict=True)]
    plan = remat_plan(graph, remat)
    index = {op.name: i for i, op in enumerate(graph.ops)}
    costs += [costs[index[name]] for name in (*plan.recomputed, *p.flash_recomputed)]
    layout = Layout(mesh, (), tuple((n, tuple(storage[n].items())) for n in t if storage[n]))
    mem = simulate(graph, layout, plan, each, on_chip=p.fusion.on_chip,
                   combined_gradient_all_reduce=getattr(hw, "combined_gradient_all_reduce", False))
    return sum(p.compute(c) for c in costs), sum(p.comm(c) for c in costs), mem.peak_bytes
