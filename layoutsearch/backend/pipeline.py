"""Pipelined training steps of an IR graph: stages over a ``stage`` mesh axis, GPipe or 1F1B, in one jit.

The graph's repeated blocks ``layer.0 .. layer.{L-1}`` (ops tagged
``block="layer.i"``, tensors named ``layer.i/<name>``) must be structurally
identical: the same ops and tensors after the prefix, one activation entering
and one leaving each block with the same dims, and parameters of their own.
Stage ``s`` of ``K`` holds a contiguous run of ``layers_per_stage[s]`` layers
(any partition the search picks; default ``L/K`` each).

Unequal stages (e.g. 3 + 5 layers on 2 stages). One SPMD program gives every
device the same local shapes, so the layer parameters are stacked
``[K, S, ...]`` with ``S = max(layers_per_stage)`` slots per stage, sharded
over ``stage`` on axis 0; a shorter stage's extra slots are padding, and the
stage function scans its slots with a ``lax.cond`` on a constant mask
``[K, S]`` indexed by the stage index: a padding slot passes its input through
without computing. Chosen over the alternatives: identity layers under a
multiplicative mask would compute (and, with remat, recompute) the padding, so
every stage would run ``S`` layers of FLOPs; a ``lax.switch`` over per-stage
functions still needs uniform parameter shapes (the same padding) and compiles
K stage bodies; grouping layers only works for partitions with a common
divisor. What the padding costs, against the pipeline cost model (which prices
each stage's own layers): executed FLOPs and the loop time are exact (a stage
computes its own layers; the loop runs at the pace of the largest stage, which
has ``S`` layers, as the cost model's slowest stage); collectives are exact for
the largest stage (the permutes do not depend on the partition; the
layer-gradient all-reduce over the data axis is ``S`` layers on every device,
what the cost model prices for the largest stage; a smaller stage all-reduces
``S - n_s`` padded layers of zeros more than priced); memory of a smaller stage
holds ``S - n_s`` layers of parameters, gradients and optimizer state beyond
what the cost model prices for it (the largest stage is exact). XLA's
``cost_analysis`` counts both branches of a ``cond`` and loop bodies once, so
it cannot show the skipped padding.

Everything else runs outside the layers, inside the same ``shard_map`` body:
the *pre* ops (before the first block: embedding) on every stage on its local
batch; the *post* ops (after the last block: head and loss) on every stage on
the local batch after the loop (GPipe; their result counts only on the last
stage) or on the last stage per micro-batch inside the loop (1F1B). Their
parameters are replicated over ``stage``. The batch dim (``batch_dim``) is
split over the optional data axis; the local batch ``B/D`` is cut into ``M``
micro-batches of ``B/(D·M)`` examples.

GPipe (``schedule="gpipe"``; forward written, ``jax.grad`` derives the
reversed backward loop): ``lax.scan`` over ``T = M + K - 1`` steps; at step
``t`` stage ``s`` runs its layers on micro-batch ``t - s`` (stage 0 reads it
from the input, the others from their left neighbour; bubble steps compute on
zeros and are discarded) and ``ppermute`` s its output to stage ``s + 1``.
The last stage's outputs of steps ``K-1 .. T-1`` are the M micro-batches in
order. The backward loop keeps what the forward saved at every one of the
``T`` steps: all M micro-batches are in flight.

1F1B (``schedule="1f1b"``, PipeDream-flush; loss and gradients written out,
``jax.vjp`` per stage and micro-batch): ``2T`` ticks, as a ``lax.scan`` over
``T`` steps of two ticks. Stage ``s`` runs the forward of micro-batch ``i``
at tick ``s + 2i`` and its backward at tick ``2K - 1 - s + 2i`` (idle
otherwise): in steady state it alternates one forward and one backward, and
micro-batch ``i`` is in flight on stage ``s`` for ``2(K - s) - 1`` ticks, so
at most ``K - s`` micro-batches are, as the cost model's ``min(M, K - s)``.
At each tick the neighbours ``(k, k+1)`` with ``k`` of the tick's parity are
the pairs that exchange (the one that ran a forward sends its activation
right, the other its input gradient left): one ``ppermute`` per tick, a swap
between the pairs, static per parity. A forward stashes the residuals of the
stage's VJP in slot ``i mod K`` of a ``K``-slot buffer (under the remat policy:
the stage input alone with ``full``, also the projections with ``selective``,
every activation with ``none``; the parameters are not stashed: JAX forwards
them into the residuals as the very arrays passed in, and they are put back);
the backward rebuilds the VJP from the slot and adds the parameter gradients to
float32 accumulators. The last stage runs the post ops and their gradient
right after its forward of a micro-batch (their output gradient is its next
tick's backward input); stage 0's input gradients are gathered per
micro-batch and run through the pre ops' VJP after the loop. The loss of the
local batch is the mean (or sum, as the loss reduces the batch) of the
micro-batches' losses, equal to GPipe's up to float32 rounding.

Remat (both schedules): ``remat="full"`` (or True) wraps the stage function
in ``jax.checkpoint`` (only stage inputs are saved per micro-batch; the layers
are recomputed in the backward), ``"selective"`` also keeps the projections'
outputs, ``"none"`` keeps everything.

Gradients: parameters are cast to "varying" over the data axis (the stacked
ones) or over ``stage`` and data (the outer ones) at the top of the body,
outside the loop, so the gradient all-reduces (``psum``: derived by
``jax.grad`` for GPipe, written for 1F1B) run once on the gradients
accumulated over all micro-batches rather than once per loop iteration.
Compiled-program collectives per device (``b`` = bytes of one micro-batch
activation per device, ``P_s`` / ``P_o`` = local bytes of a stage's stacked
slots / the outer parameters): GPipe ``2·(M+K-1)`` collective-permutes of
``b`` over ``stage`` (forward and backward loops); 1F1B the same for K > 2
(an even-tick and an odd-tick swap, ``M+K-1`` each; ``M+K-1`` for K = 2,
whose odd ticks have no pair): per device, what the cost model charges a
middle stage (an end stage: half); one all-reduce of ``P_s`` over the data
axis; one of ``P_o`` + 4 (the loss) over ``stage`` and data (see
``tests/test_pipeline_exec.py`` for the exact forms).

Memory as XLA:CPU compiles it (gpt, 4 layers, d_model 32, batch 16, seq 8,
float32; ``memory_analysis().temp_size_in_bytes`` per device, GPipe -> 1F1B;
arguments and outputs are the same): K=2, M=8, remat none 1.80 MB -> 1.07 MB;
K=4, M=8, remat none 1.21 MB -> 0.80 MB; K=4 x data 2, M=4 (M = K: no saving
expected), remat none 0.73 MB -> 0.77 MB; K=2, M=8, remat full 0.41 MB -> 0.44
MB. With full remat a micro-batch in flight is one stage input (2 KB here),
so the in-flight saving (14 KB) is smaller than what the 1F1B loop carries
besides (the stage-0 input gradients of all M micro-batches, float32
accumulators, and the copies XLA:CPU makes of the carry around the
``lax.switch``); the cost model's 1F1B saving is the in-flight term alone.

Other mesh axes: ``shard_map`` is manual over ``stage`` and data only; a
``layout`` (rules such as ``"heads:model,d_ff:model"``, or a Layout) splits
dims over the remaining axes, applied to every tensor by
``with_sharding_constraint`` (XLA's partitioner inserts the tensor-parallel
collectives, inside the loops; with 1F1B, inside the forward and backward
branches of the tick). The layout may not use ``stage`` or data nor split the
batch; layer tensors take the layout of ``layer.0``'s. ``interleaved:V`` is
priced by the cost model but not executed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from layoutsearch.backend.program import Arrays, Constrain, batch_reduction, jax_dtype, run_graph, selective_saved
from layoutsearch.costmodel.memory import REMAT_POLICIES
from layoutsearch.errors import GraphError, LayoutError
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import BLOCK_PREFIX, block_index, block_name, scope_prefix, scoped
from layoutsearch.ir.tensor import Tensor
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

IN = "__in__"
SCHEDULES = ("gpipe", "1f1b")
"""The schedules the executor runs (the cost model also prices ``interleaved:V``)."""
"""Name of the activation entering a block, in the template layer graph."""


@dataclass(frozen=True)
class PipelineParts:
    """A forward graph cut for pipelining (batch dims already resized).

    ``pre`` computes ``entry`` (the activation entering ``layer.0``) from the
    inputs on a local batch; ``layer`` is one block with template names (its
    input is :data:`IN`, its output ``layer_out``) on a micro-batch; ``post``
    computes the loss from ``exit`` (the activation leaving the last block).
    ``layer_params`` are the template parameter names, ``outer_params`` the
    parameters of ``pre`` and ``post``; ``layer_names`` maps template names to
    those of ``layer.0``.
    """

    pre: Graph
    layer: Graph
    post: Graph
    entry: str
    exit: str
    layer_out: str
    layers: int
    layer_params: tuple[str, ...]
    outer_params: tuple[str, ...]
    layer_names: dict[str, str]


def _subgraph(graph: Graph, name: str, ops: list[O.Op], rename: Mapping[str, str], batch_dim: str, batch: int,
              loss: str | None = None) -> Graph:
    """The graph of ``ops`` (tensors renamed, ``batch_dim`` resized to ``batch``); tensors read but not
    produced by ``ops`` become fed inputs (parameters stay parameters)."""
    produced = {op.output for op in ops}
    used = dict.fromkeys(t for op in ops for t in (*op.inputs, op.output))
    tensors = []
    for t in (graph.tensors[n] for n in used):
        dims = tuple(Dim(d.name, batch) if d.name == batch_dim else d for d in t.dims)
        role = t.role if t.name in produced or t.role == "parameter" else "input"
        role = "loss" if t.name == loss else ("activation" if role == "loss" else role)
        tensors.append(Tensor(rename.get(t.name, t.name), dims, t.dtype, role))
    new_ops = [dataclasses.replace(op, name=rename.get(op.name, op.name), output=rename.get(op.output, op.output),
                                   inputs=tuple(rename.get(t, t) for t in op.inputs), block=None) for op in ops]
    return Graph(name, tensors, new_ops, loss=rename.get(loss, loss) if loss else None)


def _check_batch_local(graph: Graph, ops: list[O.Op], batch_dim: str, allowed: str | None, where: str) -> None:
    """Every op reading a batch-carrying tensor keeps the batch dim (examples stay independent)."""
    for op in ops:
        if op.output != allowed and any(batch_dim in graph.tensors[t].dim_names for t in op.inputs) \
                and batch_dim not in graph.tensors[op.output].dim_names:
            raise GraphError(f"{where}: op {op.name!r} mixes examples (drops dim {batch_dim!r}); "
                             "pipelining splits the batch into micro-batches and needs examples independent")


def split_graph(graph: Graph, stages: int, microbatches: int, data: int = 1, batch_dim: str = "batch",
                block_prefix: str = BLOCK_PREFIX) -> PipelineParts:
    """Cut ``graph`` into pre / one template layer / post; GraphError says what does not fit."""
    if graph.loss is None:
        raise GraphError(f"graph {graph.name!r} has no loss to pipeline")
    B = graph.dim(batch_dim).size
    if B % (data * microbatches):
        raise GraphError(f"batch {B} is not divisible by data {data} x microbatches {microbatches}")
    blocks: dict[int, list[O.Op]] = {}
    for op in graph.ops:
        if (i := block_index(op.block, block_prefix)) is not None:
            blocks.setdefault(i, []).append(op)
    L = len(blocks)
    if L == 0 or sorted(blocks) != list(range(L)):
        raise GraphError(f"graph {graph.name!r} needs blocks {block_name(0, block_prefix)} .. "
                         f"{block_name('N-1', block_prefix)}, found {sorted(blocks)}")
    in_block = {op.name for ops in blocks.values() for op in ops}
    templates, entries, exits, canon = [], [], [], []
    for i in range(L):
        block = block_name(i, block_prefix)
        ops, pre = blocks[i], scope_prefix(block)
        produced = {op.output for op in ops}
        external = list(dict.fromkeys(t for op in ops for t in op.inputs if t not in produced))
        acts = [t for t in external if graph.tensors[t].role != "parameter"]
        foreign = [t for t in external if graph.tensors[t].role == "parameter" and not t.startswith(pre)]
        names = {op.name for op in ops}
        outs = [t for t in produced if t == graph.loss or any(c.name not in names for c in graph.consumers[t])]
        if len(acts) != 1 or len(outs) != 1 or foreign:
            raise GraphError(f"block {block} must read one activation and its own parameters and produce "
                             f"one activation; it reads {acts + foreign} and produces {outs}")
        if i and acts[0] != exits[-1]:
            raise GraphError(f"block {block} reads {acts[0]!r}, not the output of the previous block")
        entries.append(acts[0])
        exits.append(outs[0])
        rename = {n: n.removeprefix(pre) for n in [*produced, *external, *(op.name for op in ops)]}
        rename[acts[0]] = IN
        g = _subgraph(graph, f"{graph.name}/layer", ops, rename, batch_dim, B // (data * microbatches))
        templates.append((g, {v: k for k, v in rename.items()}))
        canon.append(([dataclasses.replace(op, block=None) for op in g.ops], g.tensors, rename[outs[0]]))
    for i in range(1, L):
        if canon[i] != canon[0]:
            raise GraphError(f"block {block_name(i, block_prefix)} differs from {block_name(0, block_prefix)} "
                             "(ops, shapes or names); "
                             "pipelining needs identical layers")
    layer, layer_names = templates[0]
    act_in, act_out = layer.tensors[IN], layer.tensors[canon[0][2]]
    if act_in.dims != act_out.dims or act_in.dtype != act_out.dtype or batch_dim not in act_in.dim_names:
        raise GraphError(f"the activation entering a block {act_in.dims} and leaving it {act_out.dims} must have "
                         f"the same dims, including {batch_dim!r}")
    _check_batch_local(graph, [op for ops in blocks.values() for op in ops], batch_dim, None, "layers")
    downstream = set()
    for op in graph.ops:
        if op.name in in_block or any(t in downstream or t == exits[-1] for t in op.inputs):
            downstream.add(op.output)
    pre_ops = [op for op in graph.ops if op.name not in in_block and op.output not in downstream]
    post_ops = [op for op in graph.ops if op.name not in in_block and op.output in downstream]
    if data > 1:  # pre and post run on a data shard of the batch
        _check_batch_local(graph, pre_ops + post_ops, batch_dim, graph.loss, "ops outside the layers")
    local = B // data
    pre_g = _subgraph(graph, f"{graph.name}/pre", pre_ops, {}, batch_dim, local)
    post_g = _subgraph(graph, f"{graph.name}/post", post_ops, {}, batch_dim, local, loss=graph.loss)
    outer = tuple(dict.fromkeys(t.name for g in (pre_g, post_g) for t in g.parameters))
    return PipelineParts(pre_g, layer, post_g, entries[0], exits[-1], canon[0][2], L,
                         tuple(t.name for t in layer.parameters), outer, layer_names)


class Pipeline:
    """A GPipe training step for ``graph`` on a mesh ``{stage: K, data: D, ...}`` (data optional;
    other axes are used by ``layout``).

    ``step(stacked, outer, inputs) -> (loss, (d_stacked, d_outer))`` is the jitted
    core on laid-out arrays (see :meth:`shardings`); :meth:`loss_and_grads` takes
    and returns the graph's own parameter names.
    """

    def __init__(self, graph: Graph, mesh_shape: Mapping[str, int], *, microbatches: int, stages: int | None = None,
                 remat: bool | str = True, batch_dim: str = "batch", layout: Layout | str | Mapping[str, Any] | None = None,
                 stage_axis: str = "stage", data_axis: str = "data", block_prefix: str = BLOCK_PREFIX,
                 layers_per_stage: Sequence[int] | None = None, devices: list[jax.Device] | None = None,
                 schedule: str = "gpipe") -> None:
        if stage_axis not in mesh_shape:
            raise LayoutError(f"pipeline mesh needs a {stage_axis!r} axis; got {dict(mesh_shape)}")
        if stages is not None and stages != mesh_shape[stage_axis]:
            raise LayoutError(f"stages={stages} must equal the size of mesh axis {stage_axis!r} "
                              f"({mesh_shape[stage_axis]})")
        if microbatches < 1:
            raise LayoutError(f"microbatches must be a positive integer, got {microbatches!r}")
        if schedule not in SCHEDULES:
            raise LayoutError(f"the pipeline executor runs the schedules {', '.join(SCHEDULES)}, not {schedule!r}")
        self.schedule = schedule
        self.remat = ("full" if remat else "none") if isinstance(remat, bool) else remat
        if self.remat not in REMAT_POLICIES:
            raise LayoutError(f"unknown remat policy {remat!r} (known: {', '.join(REMAT_POLICIES)})")
        self.graph, self.batch_dim = graph, batch_dim
        self.stage_axis, self.data_axis = stage_axis, data_axis
        self.K, self.D, self.M = mesh_shape[stage_axis], mesh_shape.get(data_axis, 1), microbatches
        self.parts = split_graph(graph, self.K, microbatches, self.D, batch_dim, block_prefix)
        self.counts = _stage_counts(self.parts.layers, self.K, layers_per_stage)
        self.slots = max(self.counts)
        self.mask = np.arange(self.slots)[None, :] < np.array(self.counts)[:, None]  # [K, slots]: a real layer
        self.manual = (stage_axis, data_axis) if data_axis in mesh_shape else (stage_axis,)
        self.layout = self._check_layout(layout, mesh_shape)
        self.loss_scale = self._data_scale()
        self.block_prefix = block_prefix
        if schedule == "1f1b":  # the post ops run per micro-batch, on the last stage, inside the loop
            self.reduction = batch_reduction(graph, batch_dim)
            post = self.parts.post
            _check_batch_local(graph, [graph.op(op.name) for op in post.ops], batch_dim, graph.loss, "post ops")
            foreign = [t.name for t in post.fed if t.name != self.parts.exit and t.role == "input"
                       and graph.producer(t.name) is not None]
            if foreign:
                raise GraphError(f"the 1F1B executor runs the ops after the last block per micro-batch; they may "
                                 f"read the last block's output, inputs and parameters, not {foreign}")
            self.post_micro = post.with_sizes({batch_dim: post.dims[batch_dim] // microbatches})
        devs = list(devices if devices is not None else jax.devices())
        n = int(np.prod(list(mesh_shape.values())))
        if len(devs) < n:
            raise LayoutError(f"mesh {dict(mesh_shape)} needs {n} devices, JAX has {len(devs)}")
        names = tuple(mesh_shape)
        self.mesh = jax.sharding.Mesh(np.array(devs[:n], dtype=object).reshape(list(mesh_shape.values())), names,
                                      axis_types=(AxisType.Auto,) * len(names))
        self.step = jax.jit(self.sharded_loss_and_grads)

    # -- layouts
    def _check_layout(self, layout: Layout | str | Mapping[str, Any] | None, mesh_shape: Mapping[str, int]) -> Layout:
        lay = layout if isinstance(layout, Layout) else Layout.from_rules(Mesh.of(dict(mesh_shape)), layout or {})
        if lay.mesh.shape != dict(mesh_shape):
            raise LayoutError(f"layout mesh {lay.mesh} differs from the pipeline mesh {dict(mesh_shape)}")
        lay.check(self.graph)
        for t in self.graph.tensors.values():
            for d, axes in lay.dim_layout(t).items():
                if set(axes) & set(self.manual) or d == self.batch_dim:
                    raise LayoutError(f"layout splits {d!r} of {t.name!r} over {'+'.join(axes)}: the pipeline "
                                      f"places {self.batch_dim!r} on {self.data_axis!r} and layers on "
                                      f"{self.stage_axis!r}; a layout may only use the other mesh axes")
        return lay

    def _spec(self, name: str) -> tuple[Any, ...]:
        """The layout's PartitionSpec entries (other mesh axes only) of the graph tensor ``name``."""
        return self.layout.spec(self.graph.tensors[name])

    def specs(self, manual_only: bool = False) -> tuple[dict[str, P], dict[str, P], dict[str, P]]:
        """PartitionSpecs of (stacked layer parameters, outer parameters, inputs); ``manual_only``: the
        stage and data entries alone (shard_map's in_specs)."""
        p, sp = self.parts, (lambda n: (None,) * len(self._spec(n))) if manual_only else self._spec
        data = self.data_axis if self.D > 1 else None
        return ({k: P(self.stage_axis, None, *sp(p.layer_names[k])) for k in p.layer_params},
                {k: P(*sp(k)) for k in p.outer_params},
                {t.name: P(*[data if d == self.batch_dim else e for d, e in zip(t.dim_names, sp(t.name), strict=True)])
                 for t in self.graph.inputs})

    def shardings(self) -> tuple[dict[str, NamedSharding], ...]:
        return tuple({k: NamedSharding(self.mesh, s) for k, s in d.items()} for d in self.specs())

    def _slot_layers(self) -> list[list[int]]:
        """Per stage, the layer in each of its slots (padding slots repeat the stage's first layer; they are
        skipped when run and their gradients dropped)."""
        first = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        return [[int(first[s]) + (j if j < n else 0) for j in range(self.slots)] for s, n in enumerate(self.counts)]

    def _layer_param(self, i: int, k: str) -> str:
        """The graph's name of template parameter ``k`` in layer ``i``."""
        return scoped(block_name(i, self.block_prefix), k)

    def stack(self, params: Mapping[str, jax.Array]) -> tuple[Arrays, Arrays]:
        """The graph's parameters as (stacked ``[K, slots, ...]`` layer parameters: stage ``s`` holds its
        ``layers_per_stage[s]`` layers in order, then padding; outer parameters)."""
        slots = self._slot_layers()
        stacked = {k: jnp.stack([jnp.stack([params[self._layer_param(i, k)] for i in row]) for row in slots])
                   for k in self.parts.layer_params}
        return stacked, {k: params[k] for k in self.parts.outer_params}

    def unstack(self, stacked: Mapping[str, jax.Array], outer: Mapping[str, jax.Array]) -> Arrays:
        """Inverse of :meth:`stack` (padding slots dropped)."""
        out = dict(outer)
        for k, v in stacked.items():
            for s, row in enumerate(self._slot_layers()):
                out.update({self._layer_param(i, k): v[s, j] for j, i in enumerate(row[:self.counts[s]])})
        return out

    def place(self, params: Mapping[str, jax.Array], inputs: Mapping[str, jax.Array]) -> tuple[Arrays, Arrays, Arrays]:
        """Stacked, outer parameters and inputs put on the mesh in their layouts."""
        s_sh, o_sh, i_sh = self.shardings()
        stacked, outer = self.stack(params)
        put = lambda d, sh: {k: jax.device_put(v, sh[k]) for k, v in d.items()}
        return put(stacked, s_sh), put(outer, o_sh), put({k: inputs[k] for k in i_sh}, i_sh)

    def loss_and_grads(self, params: Mapping[str, jax.Array], inputs: Mapping[str, jax.Array],
                       compiled: Any = None) -> tuple[jax.Array, Arrays]:
        """Loss and gradients by the graph's own parameter names (``compiled``: a program from :meth:`compile`)."""
        loss, (ds, do) = (compiled or self.step)(*self.place(params, inputs))
        return loss, self.unstack(ds, do)

    def compile(self, params: Mapping[str, Any], inputs: Mapping[str, Any],
                compiler_options: Mapping[str, Any] | None = None) -> Any:
        """The compiled XLA program of :attr:`step` (for ``hlo.summarize(compiled, pipeline.mesh)``)."""
        return self.step.lower(*self.place(params, inputs)).compile(dict(compiler_options or {}))

    # -- the pipelined loss
    def sharded_loss(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> jax.Array:
        """The pipelined loss of laid-out (stacked, outer) parameters and inputs (see :meth:`shardings`)."""
        fn = jax.shard_map(self._body, mesh=self.mesh, in_specs=self.specs(manual_only=True), out_specs=P(),
                           axis_names=set(self.manual), check_vma=True)
        return fn(stacked, outer, inputs)

    def sharded_loss_and_grads(self, stacked: Arrays, outer: Arrays, inputs: Arrays
                               ) -> tuple[jax.Array, tuple[Arrays, Arrays]]:
        """Loss and gradients of laid-out parameters (the gradients laid out as the parameters) under the
        schedule: GPipe by ``jax.value_and_grad`` of :meth:`sharded_loss`, 1F1B with the backward written out."""
        if self.schedule == "gpipe":
            return jax.value_and_grad(self.sharded_loss, argnums=(0, 1))(stacked, outer, inputs)
        s_spec, o_spec, _ = self.specs(manual_only=True)
        fn = jax.shard_map(self._body_1f1b, mesh=self.mesh, in_specs=self.specs(manual_only=True),
                           out_specs=(P(), s_spec, o_spec), axis_names=set(self.manual), check_vma=True)
        loss, d_stacked, d_outer = fn(stacked, outer, inputs)
        cast = lambda g, like: {k: v.astype(like[k].dtype) for k, v in g.items()}
        return loss.astype(jax_dtype(self.graph.tensors[self.graph.loss])), (cast(d_stacked, stacked),
                                                                              cast(d_outer, outer))

    def _split(self, x: jax.Array, dims: tuple[str, ...]) -> jax.Array:
        """``[..., B_local, ...] -> [M, ..., B_local/M, ...]``."""
        a = dims.index(self.batch_dim)
        x = x.reshape(*x.shape[:a], self.M, x.shape[a] // self.M, *x.shape[a + 1:])
        return jnp.moveaxis(x, a, 0)

    def _merge(self, y: jax.Array, dims: tuple[str, ...]) -> jax.Array:
        a = dims.index(self.batch_dim)
        y = jnp.moveaxis(y, 0, a)
        return y.reshape(*y.shape[:a], y.shape[a] * y.shape[a + 1], *y.shape[a + 2:])

    def _prepare(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> _Prepared:
        """What both schedules share at the top of the ``shard_map`` body: parameters cast to varying (outside
        the loops, so that the gradient psums run once) and to the forward dtypes, the pre ops run on the local
        batch, and the stage function under the remat policy."""
        p, st = self.parts, self.stage_axis
        everywhere = self.manual
        auto = jax.sharding.get_abstract_mesh()

        def constrain(names: Mapping[str, str]) -> Callable[[str, jax.Array], jax.Array] | None:
            """Apply the layout (other mesh axes) to every tensor the interpreter makes."""
            if not self.layout.rules and not self.layout.tensors:
                return None
            return lambda n, x: lax.with_sharding_constraint(x, NamedSharding(auto, P(*self._spec(names.get(n, n)))))

        # Cast to varying here, outside the loops: the transposes (gradient psums) then run once.
        stacked = {k: v[0] for k, v in stacked.items()}
        stacked, outer, inputs = _vary(stacked, everywhere), _vary(outer, everywhere), _vary(inputs, everywhere)
        # Parameters in another dtype (float32 master weights) are cast here, after the casts to varying: the
        # gradient psums then run in the parameters' dtype (XLA:CPU cannot compile bfloat16 ones here).
        stacked = {k: v.astype(jax_dtype(p.layer.tensors[k])) for k, v in stacked.items()}
        outer = {k: v.astype(jax_dtype(self.graph.tensors[k])) for k, v in outer.items()}
        stage = lax.axis_index(st)

        layer_constrain = constrain(p.layer_names)
        if self.remat == "selective":  # tag the projections the checkpoint policy keeps
            saved = selective_saved(p.layer)

            def layer_constrain(n: str, x: jax.Array, inner: Constrain | None = layer_constrain) -> jax.Array:
                x = inner(n, x) if inner else x
                return checkpoint_name(x, n) if n in saved else x

        def layer(x: jax.Array, params: Arrays) -> tuple[jax.Array, None]:
            return run_graph(p.layer, {**params, IN: x}, layer_constrain)[p.layer_out], None

        if self.mask.all():
            def stage_fn(params: Arrays, x: jax.Array) -> jax.Array:
                return lax.scan(layer, x, params)[0]
        else:  # unequal stages: padding slots pass their input through
            real = jnp.asarray(self.mask)[stage]

            def stage_fn(params: Arrays, x: jax.Array) -> jax.Array:
                def slot(x: jax.Array, item: tuple[Arrays, jax.Array]) -> tuple[jax.Array, None]:
                    ps, on = item
                    return lax.cond(on, lambda x: layer(x, ps)[0], lambda x: x, x), None
                return lax.scan(slot, x, (params, real))[0]

        return _Prepared(stacked, outer, inputs, stage, constrain, self._remat(stage_fn))

    def _body(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> jax.Array:
        """GPipe: the forward loop; ``jax.grad`` of the ``shard_map`` derives the backward loop."""
        p, K, st = self.parts, self.K, self.stage_axis
        everywhere = self.manual
        c = self._prepare(stacked, outer, inputs)
        stacked, outer, inputs, stage = c.stacked, c.outer, c.inputs, c.stage
        env = run_graph(p.pre, {**{k: outer[k] for k in outer if k in p.pre.tensors},
                                **{k: v for k, v in inputs.items() if k in p.pre.tensors}}, c.constrain({}))
        env = {**inputs, **outer, **env}
        dims = p.layer.tensors[IN].dim_names
        xs = self._split(env[p.entry], dims)
        xs = jnp.concatenate([xs, jnp.zeros((K - 1, *xs.shape[1:]), xs.dtype)])
        run_stage = c.run_stage
        perm = [(i, i + 1) for i in range(K - 1)]

        def tick(carry: jax.Array, x_t: jax.Array) -> tuple[jax.Array, jax.Array]:
            y = run_stage(stacked, jnp.where(stage == 0, x_t, carry))
            return (lax.ppermute(y, st, perm) if K > 1 else y), y

        carry = _vary(jnp.zeros(xs.shape[1:], xs.dtype), everywhere)
        _, ys = lax.scan(tick, carry, xs)
        env[p.exit] = self._merge(ys[K - 1:], dims)
        loss = run_graph(p.post, {t.name: env[t.name] for t in p.post.fed}, c.constrain({}))[p.post.loss]
        return lax.psum(jnp.where(stage == K - 1, loss * self.loss_scale, jnp.zeros_like(loss)), everywhere)

    def _body_1f1b(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> tuple[jax.Array, Arrays, Arrays]:
        """1F1B (PipeDream-flush): loss and gradients, the backward written out (see the module docstring)."""
        p, K, M, st = self.parts, self.K, self.M, self.stage_axis
        everywhere = self.manual
        c = self._prepare(stacked, outer, inputs)
        stacked, outer, inputs, stage, run_stage = c.stacked, c.outer, c.inputs, c.stage, c.run_stage
        pre_params = [k for k in outer if k in p.pre.tensors]
        pre_inputs = {k: v for k, v in inputs.items() if k in p.pre.tensors}

        def pre_fn(o: Arrays) -> jax.Array:
            return {**inputs, **run_graph(p.pre, {**o, **pre_inputs}, c.constrain({}))}[p.entry]  # or an input

        entry, pre_vjp = jax.vjp(pre_fn, {k: outer[k] for k in pre_params})
        dims = p.layer.tensors[IN].dim_names
        xs = self._split(entry, dims)                            # [M, micro-batch activation]
        post_params = [t.name for t in self.post_micro.parameters]
        post_feeds = {}  # the post ops' fed tensors but the exit activation, per micro-batch
        for t in self.post_micro.fed:
            if t.name != p.exit and t.role != "parameter":
                v = inputs[t.name]
                post_feeds[t.name] = (self._split(v, t.dim_names) if self.batch_dim in t.dim_names
                                      else jnp.broadcast_to(v, (M, *v.shape)))
        weight = self.loss_scale * (1.0 / M if self.reduction == "mean" else 1.0)

        def post_loss(o: Arrays, y: jax.Array, i: jax.Array) -> jax.Array:
            feeds = {**o, p.exit: y, **{k: v[i] for k, v in post_feeds.items()}}
            loss = run_graph(self.post_micro, feeds, c.constrain({}))[p.post.loss]
            return loss.astype(jnp.float32) * weight

        # What the backward of a stage needs from its forward: the residuals of its VJP (under the remat policy:
        # the stage input alone for ``full``), less the parameters (the same arrays every micro-batch).
        pattern = _ResidualPattern()
        zero_x = jnp.zeros_like(xs[0])
        stash = [_vary(jnp.zeros((K, *r.shape), r.dtype), everywhere)
                 for r in pattern.split(stacked, jax.vjp(run_stage, stacked, zero_x)[1])]
        f32 = lambda tree: jax.tree.map(lambda v: _vary(jnp.zeros(v.shape, jnp.float32), everywhere), tree)
        state = _State(stash=stash, grads=f32(stacked), post_grads=f32({k: outer[k] for k in post_params}),
                       loss=_vary(jnp.zeros((), jnp.float32), everywhere),
                       pending=_vary(jnp.zeros_like(zero_x), everywhere),
                       d_xs=_vary(jnp.zeros_like(xs), everywhere), recv=_vary(jnp.zeros_like(zero_x), everywhere))

        def forward(s: _State, i: jax.Array) -> tuple[_State, jax.Array]:
            x = jnp.where(stage == 0, xs[i], s.recv)
            y, vjp = jax.vjp(run_stage, stacked, x)
            res = pattern.split(stacked, vjp)
            stash = [buf.at[i % K].set(_vary(r, everywhere)) for buf, r in zip(s.stash, res, strict=True)]

            def last(s: _State) -> tuple[jax.Array, Arrays, jax.Array]:
                loss, (dpost, dy) = jax.value_and_grad(post_loss, argnums=(0, 1))(
                    {k: outer[k] for k in post_params}, y, i)
                return s.loss + loss, jax.tree.map(lambda a, g: a + g.astype(a.dtype), s.post_grads, dpost), dy

            loss, post_grads, pending = lax.cond(stage == K - 1, last, lambda s: (s.loss, s.post_grads, s.pending), s)
            return dataclasses.replace(s, stash=stash, loss=loss, post_grads=post_grads, pending=pending), y

        def backward(s: _State, i: jax.Array) -> tuple[_State, jax.Array]:
            dy = jnp.where(stage == K - 1, s.pending, s.recv)
            vjp = pattern.join(stacked, [buf[i % K] for buf in s.stash])
            dparams, dx = vjp(dy)
            grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), s.grads, dparams)
            d_xs = s.d_xs.at[i].set(jnp.where(stage == 0, dx, jnp.zeros_like(dx)))
            return dataclasses.replace(s, grads=grads, d_xs=d_xs), dx

        def idle(s: _State, i: jax.Array) -> tuple[_State, jax.Array]:
            return s, jnp.zeros_like(s.recv)

        def tick(s: _State, t: jax.Array, perm: list[tuple[int, int]]) -> _State:
            # stage k runs the forward of micro-batch i at tick k + 2i and its backward at tick 2K - 1 - k + 2i
            odd = (t - stage) % 2
            i = jnp.where(odd == 0, (t - stage) // 2, (t - (2 * K - 1 - stage)) // 2)
            on = (i >= 0) & (i < M)
            s, out = lax.switch(jnp.where(on, 1 + odd, 0), [idle, forward, backward], s, jnp.clip(i, 0, M - 1))
            recv = lax.ppermute(out, st, perm) if perm else jnp.zeros_like(out)
            return dataclasses.replace(s, recv=recv)

        # one loop step = two ticks; at each tick the neighbours (k, k + 1) with k of the tick's parity swap
        # what they computed (an activation forward, a gradient backward): one collective-permute per tick
        perms = [[(k + d, k + 1 - d) for k in range(par, K - 1, 2) for d in (0, 1)] for par in (0, 1)]

        def step(s: _State, j: jax.Array) -> tuple[_State, None]:
            return tick(tick(s, 2 * j, perms[0]), 2 * j + 1, perms[1]), None

        s, _ = lax.scan(step, state, jnp.arange(M + K - 1))
        (d_pre,) = pre_vjp(self._merge(s.d_xs, dims))
        d_outer = {k: jnp.zeros(v.shape, jnp.float32) for k, v in outer.items()}
        for src in (d_pre, s.post_grads):
            d_outer.update({k: d_outer[k] + v.astype(jnp.float32) for k, v in src.items()})
        loss = jnp.where(stage == K - 1, s.loss, jnp.zeros_like(s.loss))
        loss, d_outer = lax.psum((loss, d_outer), everywhere)
        others = tuple(a for a in everywhere if a != st)  # the data axis: the layers' gradients sum over it
        d_stacked = lax.psum(s.grads, others) if others else s.grads
        return loss, {k: v[None] for k, v in d_stacked.items()}, d_outer

    def _remat(self, stage_fn: Callable[[Arrays, jax.Array], jax.Array]) -> Callable[[Arrays, jax.Array], jax.Array]:
        """The stage function under the remat policy: ``full`` saves only the stage's input per micro-batch,
        ``selective`` also the projections' outputs (:func:`~.program.selective_saved`)."""
        if self.remat == "none":
            return stage_fn
        if self.remat == "full":
            return jax.checkpoint(stage_fn)
        names = sorted(selective_saved(self.parts.layer))
        return jax.checkpoint(stage_fn, policy=jax.checkpoint_policies.save_only_these_names(*names))

    def _data_scale(self) -> float:
        """What the per-data-shard losses are scaled by before summing: 1/D for a mean, 1 for a sum."""
        if self.D == 1:
            return 1.0
        return 1.0 / self.D if batch_reduction(self.graph, self.batch_dim) == "mean" else 1.0


@dataclass(frozen=True)
class _Prepared:
    """The top of a schedule's ``shard_map`` body (:meth:`Pipeline._prepare`)."""

    stacked: Arrays
    outer: Arrays
    inputs: Arrays
    stage: jax.Array
    constrain: Callable[[Mapping[str, str]], Callable[[str, jax.Array], jax.Array] | None]
    run_stage: Callable[[Arrays, jax.Array], jax.Array]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class _State:
    """The 1F1B loop's carry on one device: ``stash`` (per residual of a stage's VJP, ``K`` slots: micro-batch
    ``i`` in slot ``i % K``), the float32 gradient accumulators of the stage's layers and of the post ops'
    parameters, the loss, the last stage's ``pending`` output gradient (from its post ops, for its next tick),
    ``d_xs`` (the gradients of the micro-batches entering stage 0) and ``recv`` (what the neighbour sent)."""

    stash: list[jax.Array]
    grads: Arrays
    post_grads: Arrays
    loss: jax.Array
    pending: jax.Array
    d_xs: jax.Array
    recv: jax.Array


class _ResidualPattern:
    """The residuals of a stage's VJP (``jax.vjp`` returns its backward as a pytree whose leaves are the
    residuals) split into what is stashed per micro-batch and the parameters, which JAX forwards as the very
    arrays passed in: they are not stashed (the same every micro-batch) but put back by :meth:`join`."""

    def __init__(self) -> None:
        self.treedef: Any = None
        self.kinds: list[int | None] = []  # per leaf: the index of the parameter it is, or None (stashed)
        self.avals: list[tuple[tuple[int, ...], Any]] = []

    def split(self, params: Arrays, vjp: Any) -> list[jax.Array]:
        leaves, treedef = jax.tree.flatten(vjp)
        plist = jax.tree.leaves(params)
        kinds = [next((n for n, q in enumerate(plist) if leaf is q), None) for leaf in leaves]
        stashed = [leaf for leaf, k in zip(leaves, kinds, strict=True) if k is None]
        avals = [(tuple(x.shape), x.dtype) for x in stashed]
        if self.treedef is None:
            self.treedef, self.kinds, self.avals = treedef, kinds, avals
        elif kinds != self.kinds or avals != self.avals:  # the same function traced twice: cannot happen
            raise RuntimeError("the stage's VJP residuals differ between two traces")
        return stashed

    def join(self, params: Arrays, stashed: Sequence[jax.Array]) -> Callable[[jax.Array], tuple[Arrays, jax.Array]]:
        plist, rest = jax.tree.leaves(params), iter(stashed)
        return jax.tree.unflatten(self.treedef, [plist[k] if k is not None else next(rest) for k in self.kinds])


def _stage_counts(layers: int, stages: int, given: Sequence[int] | None) -> list[int]:
    """Layers per stage: ``given`` (a contiguous partition: K positive counts summing to the layers), or
    equal stages."""
    if given is None:
        if layers % stages:
            raise GraphError(f"{layers} layers do not split into {stages} equal stages; choose stages dividing "
                             f"{layers} or give layers_per_stage")
        return [layers // stages] * stages
    counts = [int(n) for n in given]
    if len(counts) != stages or min(counts) < 1 or sum(counts) != layers:
        raise GraphError(f"layers_per_stage {list(given)} must give each of the {stages} stages at least one layer "
                         f"and sum to the {layers} layers")
    return counts


def _vary(tree: Any, axes: tuple[str, ...]) -> Any:
    """Cast every array of ``tree`` to varying over those of ``axes`` it is not yet varying over."""
    def cast(x: jax.Array) -> jax.Array:
        missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
        return lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)


def pipelined_loss_and_grads(graph: Graph, mesh_shape: Mapping[str, int], *, microbatches: int,
                             stages: int | None = None, remat: bool = True, batch_dim: str = "batch",
                             **kwargs: Any) -> tuple[Callable[..., tuple[jax.Array, Arrays]], Pipeline]:
    """``(fn(params, inputs) -> (loss, grads), pipeline)``: the GPipe step with ``mesh_shape["stage"]``
    stages and ``microbatches`` micro-batches; parameters and gradients use the graph's own names."""
    pipe = Pipeline(graph, mesh_shape, microbatches=microbatches, stages=stages, remat=remat, batch_dim=batch_dim,
                    **kwargs)
    return pipe.loss_and_grads, pipe


def compile_pipeline(graph: Graph, mesh_shape: Mapping[str, int], params: Mapping[str, Any],
                     inputs: Mapping[str, Any], *, microbatches: int, compiler_options: Mapping[str, Any] | None = None,
                     **kwargs: Any) -> tuple[Any, jax.sharding.Mesh]:
    """The compiled program of the pipelined step and its JAX mesh (for ``hlo.summarize``)."""
    pipe = Pipeline(graph, mesh_shape, microbatches=microbatches, **kwargs)
    return pipe.compile(params, inputs, compiler_options), pipe.mesh
