"""The nodes of a search space: which ops and tensors each one decides, and the strategies it offers.

A space's variables (:class:`~.space.Node`) are, by kind of space: one node for
the whole graph (``rules``: a global rule set), one per family of tied blocks
plus one for the ops outside blocks (``layers``), or one per op and one per
fed tensor (``ops``; an op's output is decided with the op, a new value with
the tensor it replaces). :class:`SpaceNodes` makes them and gives the *keys*
of each: the axis map each strategy gives an op's iteration or a tensor's
storage, what the cost and memory items of :mod:`.build` depend on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import DimLayout
from layoutsearch.mesh import Mesh
from layoutsearch.solvers.axismaps import NONE, axis_maps, project, to_dim_layout
from layoutsearch.solvers.blocks import block_families, strip_block
from layoutsearch.solvers.rulesets import RuleSets
from layoutsearch.solvers.space import Node


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



class SpaceNodes:
    """The nodes of the space ``kind`` of ``graph`` on ``mesh`` (:meth:`make_nodes`) and their keys.

    ``tie``: repeated blocks share their nodes; ``rules``: the candidate rule sets of the rules and layers
    spaces; ``include``: rule sets every op and tensor of the ops space may also take; ``variants``: ops may
    store their output more split than they compute it; ``cache``: what depends on the graph alone, shared
    by every space built with one pricer."""

    def __init__(self, graph: Graph, mesh: Mesh, kind: str, tie: bool, rules: RuleSets | None,
                 include: RuleSets | None, variants: bool, cache: dict[tuple, Any]) -> None:
        self.g, self.mesh, self.kind = graph, mesh, kind
        self.dims = list(graph.dims)
        self.dim_sizes = np.array([graph.dims[d] for d in self.dims], dtype=np.int64)
        self.axis_sizes = np.array([s for _, s in mesh.axes], dtype=np.int64)
        self.tie, self.variants = tie, variants
        self.rules, self.include = rules, include
        self._fcache = cache
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
            return (fam[block], strip_block(name, block)) if block is not None else (None, name)

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

    def iteration_dims(self) -> dict[str, tuple[str, ...]]:
        """Per op, the dims it iterates over (:meth:`~layoutsearch.ir.ops.Op.iteration_dims`), once per pricer."""
        t = self.g.tensors
        return self.cached(("iteration dims",), lambda: {op.name: op.iteration_dims(t) for op in self.g.ops})

    # -- keys: the axis maps a node's strategies give one op (iteration) or one tensor (storage)
    def iter_keys(self, n: int, op: O.Op) -> np.ndarray:
        node = self.nodes[n]
        if node.rules is None:
            return node.iteration
        dims = self.iteration_dims()[op.name]
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


def _name(key: tuple) -> str:
    _, fam, name = key
    return f"{fam}~{name}" if fam is not None else name


__all__ = ["SpaceNodes"]
