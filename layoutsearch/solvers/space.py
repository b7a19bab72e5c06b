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
    candidates (:func:`~.rulesets.rule_sets`).
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

Costs come from the cost model through a :class:`~.pricer.Pricer`
(:class:`~layoutsearch.costmodel.ops.OpRules` and
:func:`~layoutsearch.costmodel.collectives.collective_time`): an op's
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
op (or per block; :func:`~.blocks.block_families`), whose costs count
every repeat, so a 96-layer model is one layer's variables. Strategies provably absent from an optimum are pruned by
:func:`~.problem.prune`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.axismaps import to_dim_layout
from layoutsearch.solvers.problem import Problem
from layoutsearch.solvers.rulesets import RuleSets, rules_of

SPACES = ("rules", "layers", "ops")
"""The granularities of the strategy space (see the module docstring)."""


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

