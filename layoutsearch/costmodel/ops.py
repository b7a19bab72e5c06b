"""Per-op costs under a layout: FLOPs, HBM traffic and the collectives each op causes.

The rules are Mesh-TensorFlow's, for any op over named dims:

* an op runs over its *iteration space* (the dims of its inputs and output);
  its *computation layout* says which mesh axes split which of those dims.
  Work per device = the op's FLOPs at the local (split) dim sizes (an axis
  splitting none of the op's dims replicates the work);
* each input must arrive laid out as the computation layout restricted to its
  dims; a tensor stored otherwise is resharded first (all-gather for an axis
  to drop, all-to-all for an axis that moves to another dim, a free local
  slice for an axis to add);
* a reduced dim (contracted by an einsum, summed by a reduction) split over
  axes leaves partial sums: one all-reduce per such dim, or a reduce-scatter
  over the axes the output tensor keeps split (FSDP gradients), when the
  backend emits reduce-scatter (``Hardware.reduce_scatter``); a backend that
  runs collectives of bf16/fp16 tensors in float32 (XLA on CPU:
  ``Hardware.float32_collectives``) moves 4 bytes per element;
* normalizations over a split dim (softmax, layer norm, cross-entropy and
  their gradients) all-reduce their per-row statistics over the splitting axes;
* a slice, pad or concat (:func:`~layoutsearch.ir.ops.window_dims`) runs with the dims it moves data along
  unsplit: an input split along one is all-gathered first, the output sliced to its stored layout (free);
* a ``dropout_mask(x)`` draws its values from its seed and x's shape: it reads
  nothing (no HBM read of x, no reshard of x);
* the result, laid out as the computation layout restricted to the output's
  dims, is resharded if the output tensor is stored otherwise.

The backward pass and the optimizer are ops of the same IR (see
:mod:`layoutsearch.ir.training`), so data-parallel gradient all-reduces and
model-parallel activation all-reduces come out of the same rules: this is
Table 1 of the Mesh-TensorFlow paper, for any graph.

Calibrated against XLA (``tests/test_xla_agreement.py``: every zoo case, bytes
by collective kind and axes and FLOPs per device within 2% of the compiled
program), the rules model what XLA's partitioner does rather than the cheapest
conceivable choice:

* partial sums are finished one reduced dim at a time (``w`` contracted over
  ``batch`` on ``data`` and ``seq`` on ``seq``: an all-reduce over ``seq`` and
  one over ``data``, not one over both);
* without reduce-scatter (XLA:CPU), an einsum's partial sums over a dim split
  over several axes, of which the stored output keeps some split (hybrid FSDP:
  ``batch`` over data+fsdp, the gradient stored split over fsdp), are
  all-reduced over the kept axes, sliced, and the slice all-reduced over the
  others;
* a gather (scatter-add) either runs in the rules' computation layout or keeps
  the table as stored ("operand passthrough": the ids are gathered, the
  result resharded), or, for a scatter-add, keeps its updates as stored (the
  zero table it adds into is laid out to match, the result resharded), or,
  for a gather with split ids, is split like the ids (the table all-gathered),
  whichever moves fewer bytes (a table split over other dims than the
  gathered one, and not over it, always runs as stored: XLA tries that first); a gathered dim split over
  axes is masked locally and all-reduced (Megatron's vocab-parallel embedding);
* a collective names its group's axes in mesh order, without axes of size 1;
  one over a group of one device is no collective (:func:`on_mesh`);
* a reshard of an einsum operand that several ops need (a weight all-gathered
  for the forward and the backward matmul) is done once (:attr:`Comm.shared`,
  :meth:`OpRules.step_costs`) — on XLA:CPU; on GPU/TPU
  (``Hardware.regather_weights``) once per phase: FSDP releases a gathered
  weight after the forward pass and gathers it again for the backward pass (a reshape that only renames dims,
  ``seq`` -> ``kv_seq``, is the same array in the compiled program, and XLA gathers it once with its source;
  the op rules price the rename's reshard apart, as the search's spaces do: one more all-gather per layer
  under sequence parallelism, listed in ``tests/test_xla_agreement.py``);
* a compile-time constant (:func:`constant_tensors`: the loss seed's broadcast) is built in whatever layout an op
  needs: no collective;
* FLOPs are counted as XLA's cost analysis counts the backend's lowering
  (:func:`op_flops`): transcendentals apart, constants folded, shared
  sub-expressions of a forward op and its gradient counted once, one FLOP per
  element an all-reduce sums. XLA's instruction fusion recomputes cheap
  producers in each consumer on top of that (0-15% more on the zoo); the rules
  count each op once, like the program compiled without fusion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from layoutsearch.costmodel.comms import (
    Comm,
    fmt_layout,
    layout_key,
    local_bytes,
    on_mesh,
    partial_sums,
    reshard,
    restrict,
)
from layoutsearch.costmodel.flops import (
    ELEMENTWISE_FLOPS,
    FORWARD_SHARED_FLOPS,
    SMALL_CONTRACTION,
    constant_tensors,
    integer_pow_flops,
    is_matmul,
    matmul_dims,
    op_flops,
)
from layoutsearch.costmodel.reshape import reshape_layout, reshape_target
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import DimLayout, Layout
from layoutsearch.mesh import Mesh

__all__ = [
    "ELEMENTWISE_FLOPS", "FORWARD_SHARED_FLOPS", "NORM_ALL_REDUCES", "RMS_NORM_ALL_REDUCES", "SMALL_CONTRACTION",
    "Comm", "OpCost", "OpRules", "OpWork", "constant_tensors", "dedupe_shared", "integer_pow_flops",
    "is_matmul", "local_bytes", "norm_all_reduces", "on_mesh", "op_flops", "reshard", "restrict",
]

NORM_ALL_REDUCES = {"softmax": 2, "softmax_grad": 1, "layer_norm": 2, "layer_norm_grad": 4,
                    "cross_entropy": 3, "cross_entropy_grad": 2}
"""Per-row statistics all-reduced by a normalization whose dim is split (max and
sum for softmax; mean and variance for layer norm; ...), matching the backend."""

RMS_NORM_ALL_REDUCES = {"layer_norm": 1, "layer_norm_grad": 2}
"""The same for RMSNorm (a layer norm with ``center=False``): the mean square;
the gradient, the mean square and ``mean(dy * xhat)``."""


def norm_all_reduces(op: O.Op) -> int:
    """Per-row statistics ``op`` all-reduces when its normalized dim is split."""
    if isinstance(op, (O.LayerNorm, O.LayerNormGrad)) and not op.center:
        return RMS_NORM_ALL_REDUCES[op.kind]
    return NORM_ALL_REDUCES[op.kind]


@dataclass(frozen=True)
class OpWork:
    """One op execution's per-device work, what its cost (:class:`OpCost`) and its priced report
    (:class:`~layoutsearch.costmodel.costreport.OpReport`) share: the op's name, kind, phase and repeated block,
    its FLOPs, its bytes read and written in HBM and whether it runs as a matmul."""

    op: str
    kind: str
    phase: str
    block: str | None
    flops: float
    hbm_bytes: float
    matmul: bool


@dataclass(frozen=True)
class OpCost(OpWork):
    """Per-device work of one op under a layout.

    ``hbm_bytes``: bytes read and written in HBM (inputs as the op consumes them,
    its output as it produces it; a fusion model may lower it, see
    :mod:`layoutsearch.costmodel.fusion`); ``reads``: the bytes of each input,
    ``write``: of the output. ``dtype``: the dtype the op computes in (its first
    float input's); ``matmul_dims``: an einsum of two operands as a batched
    matmul ``(batch, m, n, k)`` at the local sizes (see
    :func:`layoutsearch.costmodel.compute.matmul_efficiency`)."""

    comms: tuple[Comm, ...]
    reads: tuple[int, ...] = ()
    write: int = 0
    dtype: str = "float32"
    matmul_dims: tuple[int, int, int, int] | None = None


def _facts(graph: Graph) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """What :class:`OpRules` needs of a graph whatever the mesh: its constant tensors, its matmuls, and the
    elementwise ops whose gradient shares a unary op's work (see :func:`op_flops`)."""
    matmuls = frozenset(op.name for op in graph.ops if is_matmul(op, graph.tensors))
    fwd = {(op.fn, op.inputs[0]) for op in graph.ops if isinstance(op, O.Elementwise) and len(op.inputs) == 1}
    masks = {op.inputs[0] for op in graph.ops if isinstance(op, O.Elementwise) and op.fn == "where"}
    forward_shared = frozenset(
        op.name for op in graph.ops if isinstance(op, O.Elementwise)
        and (any((f, op.inputs[0]) in fwd for f, g in O.UNARY_GRAD.items() if g == op.fn)
             or op.fn in ("where_grad_true", "where_grad_false") and op.inputs[0] in masks))
    return constant_tensors(graph), matmuls, forward_shared


class OpRules:
    """Evaluates op costs on one graph and mesh; layouts are given per call."""

    def __init__(self, graph: Graph, mesh: Mesh, reduce_scatter: bool = True,
                 float32_collectives: bool = False, regather_weights: bool = False) -> None:
        self.graph = graph
        self.mesh = mesh
        self.reduce_scatter = reduce_scatter
        self.float32_collectives = float32_collectives
        self.regather_weights = regather_weights
        from layoutsearch.costmodel.step import graph_cached  # (step.py prices with these rules)

        self.constant, self.matmuls, self.forward_shared = graph_cached(graph, "op_rules", lambda: _facts(graph))

    def promoted(self, comms: Sequence[Comm]) -> list[Comm]:
        """``comms`` as the backend runs them (:func:`on_mesh`; with ``float32_collectives``, a collective of
        a bf16/fp16 tensor moves 4 bytes per element: the backend converts around it)."""
        comms = on_mesh(comms, self.mesh)
        if not self.float32_collectives:
            return comms
        t = self.graph.tensors
        return [dataclasses.replace(c, bytes=c.bytes * 4 // t[c.tensor].itemsize)
                if t[c.tensor].is_float and t[c.tensor].itemsize < 4 else c for c in comms]

    def reshard(self, tensor: Tensor, src: DimLayout, dst: DimLayout, cause: str) -> list[Comm]:
        """:func:`reshard` as the backend runs it (see :meth:`promoted`)."""
        return self.promoted(reshard(tensor, src, dst, self.mesh, cause))

    def iteration_layout(self, op: O.Op, layout: Layout) -> DimLayout:
        """The computation layout the global rules give ``op``."""
        return layout.rules_layout(op.iteration_dims(self.graph.tensors))

    def cost(self, op: O.Op, iteration: DimLayout, inputs: Sequence[DimLayout], output: DimLayout) -> OpCost:
        """Cost of ``op`` run with computation layout ``iteration``, its inputs
        stored as ``inputs`` and its output to be stored as ``output``.

        A gather or scatter-add may run in another computation layout than
        ``iteration``: XLA's partitioner also considers keeping the table
        (operand) as it is stored ("operand passthrough": the ids are gathered,
        the result resharded), for a scatter-add its updates as stored, for a
        gather with split ids the ids' layout ("index passthrough": the table
        all-gathered, each device looking up its own ids), and takes the
        cheaper; so does this rule (fewer bytes moved; ties keep
        ``iteration``, then the table's layout), except that a table stored
        split over other dims than ``dim`` (and not over ``dim``) always runs as
        stored (XLA tries operand passthrough first)."""
        if isinstance(op, (O.Gather, O.ScatterAdd)):
            table = output if isinstance(op, O.ScatterAdd) else inputs[0]
            split = {d for d, axes in table.items() if self.mesh.group_size(axes) > 1}
            if split and op.dim not in split:
                # the table split only over dims the ids do not index: XLA's partitioner tries operand passthrough
                # first and takes it whatever the bytes
                return self._cost(op, self._passthrough(op, inputs, output), inputs, output)
            best = None
            candidates = [iteration, self._passthrough(op, inputs, output)]
            if isinstance(op, O.ScatterAdd):
                candidates.append(self._updates_passthrough(op, inputs))
            elif any(self.mesh.group_size(axes) > 1 for axes in inputs[1].values()):
                # "index passthrough": split like the ids, the table gathered whole
                candidates.append({d: axes for d, axes in inputs[1].items() if axes})
            for it in candidates:
                c = self._cost(op, it, inputs, output)
                if best is None or sum(x.bytes for x in c.comms) < sum(x.bytes for x in best.comms):
                    best = c
            assert best is not None
            return best
        if window := O.window_dims(op):  # a slice, pad or concat runs with the dims it moves along whole
            iteration = {d: axes for d, axes in iteration.items() if d not in window}
        return self._cost(op, iteration, inputs, output)

    def _passthrough(self, op: O.Op, inputs: Sequence[DimLayout], output: DimLayout) -> DimLayout:
        """The computation layout keeping a gather's table (a scatter-add's
        output table) as stored, plus the ids' splits on axes still free (of
        an ids dim split over several axes, the major ones up to the first
        axis the table uses: ``batch`` over data+fsdp with the table split
        over fsdp stays split over data)."""
        t = self.graph.tensors
        table, ids = (output, inputs[0]) if isinstance(op, O.ScatterAdd) else (inputs[0], inputs[1])
        it = dict(table)
        used = {a for axes in it.values() for a in axes}
        for d, axes in ids.items():
            free = axes[:next((i for i, a in enumerate(axes) if a in used), len(axes))]
            if free and d not in it:
                it[d] = free
                used.update(free)
        dims = op.iteration_dims(t)
        return {d: it[d] for d in dims if it.get(d)}

    def _updates_passthrough(self, op: O.Op, inputs: Sequence[DimLayout]) -> DimLayout:
        """The computation layout keeping a scatter-add's updates as stored (their ids dims and the table's
        other dims; the scattered dim unsplit). The table a scatter-add adds into starts as zeros, which XLA's
        partitioner lays out as the updates need: it scatters there and then moves the result to the table's
        layout (e.g. one all-to-all) rather than gathering the updates."""
        return {d: axes for d, axes in inputs[1].items() if axes and d != op.dim}

    def _cost(self, op: O.Op, iteration: DimLayout, inputs: Sequence[DimLayout], output: DimLayout) -> OpCost:
        g, mesh = self.graph, self.mesh
        t = g.tensors
        out = t[op.output]
        comms: list[Comm] = []
        if isinstance(op, O.Reshape):
            src = inputs[0]
            produced, need = reshape_layout(op, src, g, mesh)
            need = reshape_target(op, src, need, output, t[op.inputs[0]].dim_names)
            produced, need = reshape_layout(op, need, g, mesh)
            comms += reshard(t[op.inputs[0]], src, need, mesh, f"reshape {op.name} input")
            comms += reshard(out, produced, output, mesh, f"{op.output} stored differently")
            if op.output in self.constant:  # folded at compile time: a constant is laid out anyhow for free
                comms = []
            moved = local_bytes(out, produced, mesh)
            return OpCost(op.name, op.kind, op.phase, op.block, 0.0, 2.0 * moved, False,
                          tuple(self.promoted(comms)), (moved,), moved, out.dtype)
        space = op.iteration_dims(t)
        reads: list[int] = []
        for name, stored in zip(op.inputs, inputs, strict=True):
            if O.is_dropout_mask(op):  # the RNG takes only x's shape
                reads.append(0)
                continue
            want = restrict(iteration, t[name].dim_names)
            if name in self.constant:  # a compile-time constant (the loss seed's broadcast): built in any layout
                more = []
            else:
                more = reshard(t[name], stored, want, mesh, f"{op.name} needs {name} as {fmt_layout(want)}")
            if isinstance(op, O.Einsum):  # the same operand reshard feeding several dots: XLA does it once
                key = ("reshard", name, layout_key(stored), layout_key(want))
                if self.regather_weights:  # ... once per phase: not kept from the forward to the backward pass
                    key += (op.phase,)
                more = [dataclasses.replace(c, shared=key + (i,)) for i, c in enumerate(more)]
            comms += more
            reads.append(local_bytes(t[name], want, mesh))
        sizes = {d: g.dims[d] // mesh.group_size(iteration.get(d, ())) for d in space}
        flops = op_flops(g, op, sizes, split=frozenset(d for d in space if iteration.get(d)),
                         constant=self.constant, forward_shared=op.name in self.forward_shared)
        produced = restrict(iteration, out.dim_names)
        norm_dim = getattr(op, "dim", None)
        if op.kind in NORM_ALL_REDUCES and iteration.get(norm_dim):
            axes = iteration[norm_dim]
            rows = t[op.inputs[0]]
            row_bytes = local_bytes(rows, restrict(iteration, rows.dim_names), mesh) // (
                g.dims[norm_dim] // mesh.group_size(axes))
            for i in range(norm_all_reduces(op)):
                comms.append(Comm("all-reduce", axes, row_bytes, op.output,
                                  f"{op.kind} over {norm_dim} split over {'+'.join(axes)} (statistic {i + 1})"))
        if isinstance(op, (O.Einsum, O.Reduce, O.ScatterAdd, O.Gather)):
            reduced = [d for d in space if d not in out.dim_names and iteration.get(d)]
            what = "contracted" if isinstance(op, O.Einsum) else "reduced"
            cause = f"{op.name}: {what} {', '.join(reduced)} split over " \
                    f"{'+'.join(a for d in reduced for a in iteration[d])}"
            more, produced = partial_sums(out, produced, [(d, iteration[d]) for d in reduced], output, mesh,
                                           self.reduce_scatter, cause, kept_first=isinstance(op, O.Einsum))
            comms += more
        comms += reshard(out, produced, output, mesh, f"{op.output} stored as {fmt_layout(output)}")
        if op.output in self.constant:  # folded at compile time: a constant is laid out anyhow for free
            comms = []
        write = local_bytes(out, produced, mesh)
        comms = on_mesh(comms, mesh)
        # XLA counts one FLOP per element an all-reduce (or reduce-scatter) sums
        flops += sum(c.bytes // t[c.tensor].itemsize for c in comms if c.kind in ("all-reduce", "reduce-scatter"))
        comms = self.promoted(comms)
        dtype = next((t[i].dtype for i in op.inputs if t[i].is_float), out.dtype)
        matmul = op.name in self.matmuls
        mm = matmul_dims(op, t, sizes) if matmul else None
        return OpCost(op.name, op.kind, op.phase, op.block, flops, float(sum(reads) + write), matmul, tuple(comms),
                      tuple(reads), write, dtype, mm)

    def cost_under(self, op: O.Op, layout: Layout) -> OpCost:
        """Cost of ``op`` when ``layout`` lays out every tensor and computation."""
        t = self.graph.tensors
        return self.cost(op, self.iteration_layout(op, layout), [layout.dim_layout(t[i]) for i in op.inputs],
                         layout.dim_layout(t[op.output]))

    def step_costs(self, layout: Layout) -> list[OpCost]:
        """:meth:`cost_under` of every op of the graph, in order, with each
        shared collective (see :attr:`Comm.shared`) kept by its first op only:
        the sum over ops is then the step's communication."""
        return dedupe_shared([self.cost_under(op, layout)
                              for op in self.graph.ops])


def dedupe_shared(costs: Sequence[OpCost]) -> list[OpCost]:
    """``costs`` (one step, in op order) with every repeat of a shared collective dropped."""
    seen: set[tuple] = set()
    out = []
    for c in costs:
        keep = []
        for x in c.comms:
            if x.shared is not None:
                if x.shared in seen:
                    continue
                seen.add(x.shared)
            keep.append(x)
        out.append(c if len(keep) == len(c.comms) else dataclasses.replace(c, comms=tuple(keep)))
    return out
