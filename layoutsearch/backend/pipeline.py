"""Pipelined training steps of an IR graph: stages over a ``stage`` mesh axis, GPipe, 1F1B or interleaved 1F1B.

The graph is cut into pre ops, one template layer and post ops, and its layers are placed on stages, by
:mod:`~layoutsearch.backend.stages` (which says what the blocks must be and what ``layers_per_stage``
gives); this module runs the result.

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
it cannot show the skipped padding. Interleaved: the parameters are stacked
``[K, V S, ...]`` with ``S`` the largest chunk's layers, device ``k``'s chunk
``c`` in slots ``c S .. c S + S - 1`` (mask ``[K, V S]``). The ticks are
synchronous, so with unequal chunks a tick lasts as long as the largest chunk
that runs in it: the loop takes ``2(M V + K - 1)`` ticks of (up to) the largest
chunk, where the cost model prices ``M + (K - 1)/V`` steps of the slowest
device's chunks together (equal for equal chunks).

Everything else runs outside the layers, inside the same ``shard_map`` body:
the *pre* ops (before the first block: embedding) on every stage on its local
batch; the *post* ops (after the last block: head and loss) on every stage on
the local batch after the loop (GPipe; their result counts only on the last
stage) or on the last stage per micro-batch inside the loop (1F1B, interleaved). Their
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

1F1B (``schedule="1f1b"``, PipeDream-flush) and interleaved 1F1B
(``schedule="interleaved:V"``, Megatron-LM, Narayanan et al. 2021 section
2.2.1): loss and gradients written out, ``jax.vjp`` per chunk and
micro-batch, by a static tick table (:mod:`~layoutsearch.backend.tick_tables`
says which op each device runs at each tick; :mod:`~layoutsearch.backend.one_f_one_b`
runs it in one ``lax.scan``). 1F1B: ``2T`` ticks (``T = M + K - 1``), as ``T``
loop steps of two ticks; stage ``s`` runs the forward of micro-batch ``i`` at
tick ``s + 2i`` and its backward at tick ``2K - 1 - s + 2i``, so it holds at
most ``K - s`` micro-batches, the cost model's ``min(M, K - s)``; after each
tick the neighbours ``(k, k+1)`` with ``k`` of the tick's parity swap what
they computed (one ``ppermute`` per tick). Interleaved: each device runs its
forwards and backwards in Megatron-LM's order (warm-up forwards, steady 1F1B,
cool-down backwards; ``M`` a multiple of ``K``), each as soon as its input
has arrived: ``2(M V + K - 1)`` ticks of one chunk each, the ``(K - 1)/V``
bubble per micro-batch loop that the cost model prices, with at most ``V K +
K - 1`` chunks stashed on device 0 (``K + (K - 1)/V`` micro-batches' worth,
schedule.py's ``in_flight(0)`` when ``M > K``; fewer on later devices); after
each tick a ring shift each way (one swap for ``K = 2``), so activations also
pass from device ``K - 1`` to device 0 between chunks. A forward stashes the
residuals of the chunk's VJP in a stash slot (under the remat policy: the
chunk input alone with ``full``, also the projections with ``selective``,
every activation with ``none``; not the parameters, which are put back); the
backward rebuilds the VJP from the slot and adds the parameter gradients to
float32 accumulators. The last virtual stage runs the post ops and their
gradient right after its forward of a micro-batch; the input gradients of
virtual stage 0 are gathered per micro-batch and run through the pre ops' VJP
after the loop. The loss of the local batch is the mean (or sum, as the loss
reduces the batch) of the micro-batches' losses, equal to GPipe's up to
float32 rounding. The interleaved program's loss alone (:meth:`Pipeline.sharded_loss`)
runs the forwards as a circular pipeline (:func:`~.tick_tables.circular_forward`).

Remat (every schedule): ``remat="full"`` (or True) wraps the stage function
in ``jax.checkpoint`` (only stage inputs are saved per micro-batch; the layers
are recomputed in the backward), ``"selective"`` also keeps the projections'
outputs, ``"none"`` keeps everything.

Gradients: parameters are cast to "varying" over the data axis (the stacked
ones) or over ``stage`` and data (the outer ones) at the top of the body,
outside the loop, so the gradient all-reduces (``psum``: derived by
``jax.grad`` for GPipe, written for 1F1B) run once on the gradients
accumulated over all micro-batches rather than once per loop iteration.
Compiled-program collectives per device (``b`` = bytes of one micro-batch
activation per device, ``P_s`` / ``P_o`` = local bytes of a device's stacked
slots / the outer parameters): GPipe ``2·(M+K-1)`` collective-permutes of
``b`` over ``stage`` (forward and backward loops); 1F1B the same for K > 2
(an even-tick and an odd-tick swap, ``M+K-1`` each; ``M+K-1`` for K = 2,
whose odd ticks have no pair): per device, what the cost model charges a
middle stage (an end stage: half); interleaved ``2(M V + K - 1)`` of ``b``
(K = 2) or twice that (K > 2: the two ring shifts, zeros where a device has
nothing for a neighbour), what the cost model charges every device; one
all-reduce of ``P_s`` over the data axis; one of ``P_o`` + 4 (the loss) over
``stage`` and data (see ``tests/test_pipeline_exec.py`` and
``tests/test_pipeline_interleaved.py`` for the exact forms).

Memory as XLA:CPU compiles it (gpt, d_model 32, batch 16, seq 8, float32;
``memory_analysis().temp_size_in_bytes`` per device, GPipe -> 1F1B ->
interleaved:2; arguments and outputs are the same): 4 layers, K=2, M=8, remat
none 1.80 MB -> 1.07 MB -> 1.12 MB; the same with remat full 0.41 MB -> 0.44 MB
-> 0.35 MB; 8 layers, K=4, M=8, remat none 2.13 MB -> 1.70 MB -> 2.07 MB; 8
layers, K=4 x data 2, M=4 (M = K: no 1F1B saving expected), remat none 1.48 MB
-> 1.67 MB -> 1.57 MB. The cost model's activations of stage 0: 1F1B ``K``
micro-batches, interleaved ``K + (K-1)/V`` (x1.25 for K=2, x1.375 for K=4 at
V=2). With full remat a micro-batch in flight is one stage input (2 KB here),
so the in-flight saving (14 KB) is smaller than what the 1F1B loop carries
besides (the stage-0 input gradients of all M micro-batches, float32
accumulators, the inboxes, and the copies XLA:CPU makes of the carry around
the ``lax.switch``); the cost model's 1F1B saving is the in-flight term alone.

Other mesh axes: ``shard_map`` is manual over ``stage`` and data only; a
``layout`` (rules such as ``"heads:model,d_ff:model"``, or a Layout) splits
dims over the remaining axes, applied to every tensor by
``with_sharding_constraint`` (XLA's partitioner inserts the tensor-parallel
collectives, inside the loops; with 1F1B, inside the forward and backward
branches of the tick). The layout may not use ``stage`` or data nor split the
batch; layer tensors take the layout of ``layer.0``'s.
"""

from __future__ import annotations

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

from layoutsearch.backend import tick_tables
from layoutsearch.backend.one_f_one_b import TickedStep, vary
from layoutsearch.backend.program import Arrays, Constrain, batch_reduction, jax_dtype, run_graph, selective_saved
from layoutsearch.backend.sharding import BF16_SHARD_MAP_ON_CPU, merge_compiler_options
from layoutsearch.backend.stages import IN, check_batch_local, slot_layers, slot_mask, split_graph, stage_counts
from layoutsearch.costmodel.fusion import check_attention
from layoutsearch.costmodel.schedule import Schedule
from layoutsearch.errors import CostModelError, GraphError, LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import BLOCK_PREFIX, block_name, scoped
from layoutsearch.ir.remat import parse_remat
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

SCHEDULES = ("gpipe", "1f1b", "interleaved:V", "maxtext")
"""The schedules the executor runs (those the cost model prices; ``maxtext`` runs as ``gpipe``: the same
numbers, the embedding and head placed otherwise than MaxText places them)."""


class Pipeline:
    """A pipelined training step for ``graph`` on a mesh ``{stage: K, data: D, ...}`` (data optional;
    other axes are used by ``layout``), run by ``schedule``: ``gpipe`` (default), ``1f1b`` or
    ``interleaved:V`` (``layers_per_stage`` then counts the ``K V`` chunks in virtual-stage order);
    ``attention``: ``standard`` or ``flash`` (see :func:`~layoutsearch.backend.program.run_graph`).

    ``step(stacked, outer, inputs) -> (loss, (d_stacked, d_outer))`` is the jitted
    core on laid-out arrays (see :meth:`shardings`); :meth:`loss_and_grads` takes
    and returns the graph's own parameter names.
    """

    def __init__(self, graph: Graph, mesh_shape: Mapping[str, int], *, microbatches: int, stages: int | None = None,
                 remat: bool | str = True, batch_dim: str = "batch", layout: Layout | str | Mapping[str, Any] | None = None,
                 stage_axis: str = "stage", data_axis: str = "data", block_prefix: str = BLOCK_PREFIX,
                 layers_per_stage: Sequence[int] | None = None, devices: list[jax.Device] | None = None,
                 schedule: str = "gpipe", attention: str = "standard", param_dtypes: Sequence[str] | None = None
                 ) -> None:
        if stage_axis not in mesh_shape:
            raise LayoutError(f"pipeline mesh needs a {stage_axis!r} axis; got {dict(mesh_shape)}")
        if stages is not None and stages != mesh_shape[stage_axis]:
            raise LayoutError(f"stages={stages} must equal the size of mesh axis {stage_axis!r} "
                              f"({mesh_shape[stage_axis]})")
        if microbatches < 1:
            raise LayoutError(f"microbatches must be a positive integer, got {microbatches!r}")
        try:
            sched = Schedule.parse(schedule)
        except CostModelError:
            raise LayoutError(f"the pipeline executor runs the schedules {', '.join(SCHEDULES)}, not {schedule!r}") \
                from None
        self.schedule = "gpipe" if sched.kind == "maxtext" else str(sched)  # (MaxText's: GPipe, same numbers)
        self.V = sched.virtual if sched.kind == "interleaved" else 1
        """Chunks per device (``V`` of ``interleaved:V``; 1 otherwise)."""
        self.remat = ("full" if remat else "none") if isinstance(remat, bool) else remat
        self.attention = check_attention(attention, LayoutError, auto=False)
        if parse_remat(self.remat, LayoutError).blocks is not None:
            raise LayoutError(f"remat {remat}: the pipeline executor remats every layer of a stage alike (none, "
                              "selective or full); the first blocks alone run unpipelined or with gradient "
                              "accumulation")
        self.graph, self.batch_dim = graph, batch_dim
        self.stage_axis, self.data_axis = stage_axis, data_axis
        self.K, self.D, self.M = mesh_shape[stage_axis], mesh_shape.get(data_axis, 1), microbatches
        if self.V > 1 and microbatches % self.K:
            raise LayoutError(f"the interleaved schedule needs the micro-batches to be a multiple of the stages "
                              f"(Megatron-LM's constraint): {microbatches} micro-batches, {self.K} stages")
        self.parts = split_graph(graph, self.K, microbatches, self.D, batch_dim, block_prefix)
        self.act_dims = self.parts.layer.tensors[IN].dim_names
        self.counts = stage_counts(self.parts.layers, self.K, layers_per_stage, self.V)
        """Layers per virtual stage (chunk ``c`` of device ``k`` is virtual stage ``c K + k``)."""
        self.slots = max(self.counts)
        """Layer slots per chunk (the largest chunk's layers)."""
        self.mask = slot_mask(self.counts, self.K, self.V)
        """``[K, V slots]``: whether device ``k``'s slot ``c slots + j`` holds a layer (of its chunk ``c``)."""
        self.manual = (stage_axis, data_axis) if data_axis in mesh_shape else (stage_axis,)
        self.layout = self._check_layout(layout, mesh_shape)
        self.loss_scale = self._data_scale()
        self.block_prefix = block_prefix
        self.ticks: tick_tables.TickPlan | None = None
        if self.schedule != "gpipe":  # the post ops run per micro-batch, on the last stage, inside the loop
            self.ticks = (tick_tables.one_f_one_b(self.K, microbatches) if self.V == 1
                          else tick_tables.interleaved(self.K, self.V, microbatches))
            self.reduction = batch_reduction(graph, batch_dim)
            post = self.parts.post
            check_batch_local(graph, [graph.op(op.name) for op in post.ops], batch_dim, graph.loss, "post ops")
            foreign = [t.name for t in post.fed if t.name != self.parts.exit and t.role == "input"
                       and graph.producer(t.name) is not None]
            if foreign:
                raise GraphError(f"the 1F1B executors run the ops after the last block per micro-batch; they may "
                                 f"read the last block's output, inputs and parameters, not {foreign}")
            self.post_micro = post.with_sizes({batch_dim: post.dims[batch_dim] // microbatches})
        devs = list(devices if devices is not None else jax.devices())
        n = int(np.prod(list(mesh_shape.values())))
        if len(devs) < n:
            raise LayoutError(f"mesh {dict(mesh_shape)} needs {n} devices, JAX has {len(devs)}")
        names = tuple(mesh_shape)
        self.mesh = jax.sharding.Mesh(np.array(devs[:n], dtype=object).reshape(list(mesh_shape.values())), names,
                                      axis_types=(AxisType.Auto,) * len(names))
        bf16 = "bfloat16" in (param_dtypes if param_dtypes is not None else [t.dtype for t in graph.parameters])
        self.compiler_options = dict(BF16_SHARD_MAP_ON_CPU) if bf16 and devs[0].platform == "cpu" else {}
        """XLA options its step compiles with (:data:`~layoutsearch.backend.sharding.BF16_SHARD_MAP_ON_CPU`)."""
        self.step = jax.jit(self.sharded_loss_and_grads, compiler_options=self.compiler_options or None)

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

    def _layer_param(self, i: int, k: str) -> str:
        """The graph's name of template parameter ``k`` in layer ``i``."""
        return scoped(block_name(i, self.block_prefix), k)

    def stack(self, params: Mapping[str, jax.Array]) -> tuple[Arrays, Arrays]:
        """The graph's parameters as (stacked ``[K, V slots, ...]`` layer parameters: device ``k`` holds, per
        chunk ``c``, the ``layers_per_stage[c K + k]`` layers of virtual stage ``c K + k`` in order, then padding;
        outer parameters)."""
        slots = slot_layers(self.counts, self.K, self.V)
        stacked = {k: jnp.stack([jnp.stack([params[self._layer_param(i, k)] for i in row]) for row in slots])
                   for k in self.parts.layer_params}
        return stacked, {k: params[k] for k in self.parts.outer_params}

    def unstack(self, stacked: Mapping[str, jax.Array], outer: Mapping[str, jax.Array]) -> Arrays:
        """Inverse of :meth:`stack` (padding slots dropped)."""
        out = dict(outer)
        for k, v in stacked.items():
            for s, row in enumerate(slot_layers(self.counts, self.K, self.V)):
                out.update({self._layer_param(i, k): v[s, j] for j, i in enumerate(row) if self.mask[s, j]})
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
        options = merge_compiler_options(self.compiler_options, compiler_options)
        return self.step.lower(*self.place(params, inputs)).compile(options or None)

    # -- the pipelined loss
    def sharded_loss(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> jax.Array:
        """The pipelined loss of laid-out (stacked, outer) parameters and inputs (see :meth:`shardings`)."""
        fn = jax.shard_map(self._body, mesh=self.mesh, in_specs=self.specs(manual_only=True), out_specs=P(),
                           axis_names=set(self.manual), check_vma=True)
        return fn(stacked, outer, inputs)

    def sharded_loss_and_grads(self, stacked: Arrays, outer: Arrays, inputs: Arrays
                               ) -> tuple[jax.Array, tuple[Arrays, Arrays]]:
        """Loss and gradients of laid-out parameters (the gradients laid out as the parameters) under the
        schedule: GPipe by ``jax.value_and_grad`` of :meth:`sharded_loss`, 1F1B and interleaved 1F1B with the
        backward written out."""
        if self.schedule == "gpipe":
            return jax.value_and_grad(self.sharded_loss, argnums=(0, 1))(stacked, outer, inputs)
        s_spec, o_spec, _ = self.specs(manual_only=True)
        fn = jax.shard_map(self._body_ticked, mesh=self.mesh, in_specs=self.specs(manual_only=True),
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
        """What every schedule shares at the top of the ``shard_map`` body: parameters cast to varying (outside
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
        stacked, outer, inputs = vary(stacked, everywhere), vary(outer, everywhere), vary(inputs, everywhere)
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
            return run_graph(p.layer, {**params, IN: x}, layer_constrain, attention=self.attention)[p.layer_out], None

        def stage_fn(params: Arrays, x: jax.Array, real: jax.Array | None) -> jax.Array:
            """One stage or chunk: its slots in order; a padding slot (``real`` False) passes its input through."""
            if real is None:
                return lax.scan(layer, x, params)[0]

            def slot(x: jax.Array, item: tuple[Arrays, jax.Array]) -> tuple[jax.Array, None]:
                ps, on = item
                return lax.cond(on, lambda x: layer(x, ps)[0], lambda x: x, x), None
            return lax.scan(slot, x, (params, real))[0]

        real = None if self.mask.all() else jnp.asarray(self.mask)[stage]  # [V slots] of this device
        return _Prepared(stacked, outer, inputs, stage, constrain, self._remat(stage_fn), real)

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
        if self.V > 1:
            ys = self._circular(c, xs)
        else:
            xs = jnp.concatenate([xs, jnp.zeros((K - 1, *xs.shape[1:]), xs.dtype)])
            run_stage, perm = c.run_stage, [(i, i + 1) for i in range(K - 1)]

            def tick(carry: jax.Array, x_t: jax.Array) -> tuple[jax.Array, jax.Array]:
                y = run_stage(stacked, jnp.where(stage == 0, x_t, carry), c.real)
                return (lax.ppermute(y, st, perm) if K > 1 else y), y

            carry = vary(jnp.zeros(xs.shape[1:], xs.dtype), everywhere)
            ys = lax.scan(tick, carry, xs)[1][K - 1:]
        env[p.exit] = self._merge(ys, dims)
        loss = run_graph(p.post, {t.name: env[t.name] for t in p.post.fed}, c.constrain({}))[p.post.loss]
        return lax.psum(jnp.where(stage == K - 1, loss * self.loss_scale, jnp.zeros_like(loss)), everywhere)

    def _circular(self, c: _Prepared, xs: jax.Array) -> jax.Array:
        """The forwards of the interleaved schedule alone (:func:`~.tick_tables.circular_forward`): device ``k``
        runs its ``f``-th chunk forward at tick ``k + f`` and shifts its output right around the ring; returns
        what leaves the last virtual stage, ``[M, ...]`` in micro-batch order (on device ``K - 1``)."""
        K, V, S = self.K, self.V, self.slots
        plan = tick_tables.circular_forward(K, V, self.M)
        params = {k: v.reshape(V, S, *v.shape[1:]) for k, v in c.stacked.items()}
        real = None if c.real is None else c.real.reshape(V, S)
        col = [tick_tables.FIELDS.index(f) for f in ("micro", "chunk", "x_slot")]
        perm = plan.channels[0][0]

        def tick(carry: jax.Array, row: jax.Array) -> tuple[jax.Array, jax.Array]:
            i, ch, x_slot = (row[c.stage, n] for n in col)
            x = jnp.where(x_slot < 0, xs[i], carry)
            y = c.run_stage(jax.tree.map(lambda v: v[ch], params), x, None if real is None else real[ch])
            return (y if perm is None else lax.ppermute(y, self.stage_axis, list(perm))), y

        carry = vary(jnp.zeros(xs.shape[1:], xs.dtype), self.manual)
        ys = lax.scan(tick, carry, jnp.asarray(plan.table))[1]
        exits = {op[1]: t for t, row in enumerate(plan.ops) if (op := row[K - 1]) and op[2] == V - 1}
        return ys[np.array([exits[i] for i in range(self.M)])]

    def _body_ticked(self, stacked: Arrays, outer: Arrays, inputs: Arrays) -> tuple[jax.Array, Arrays, Arrays]:
        """1F1B or interleaved 1F1B: loss and gradients, the backward written out, by the schedule's tick table
        (:class:`~layoutsearch.backend.one_f_one_b.TickedStep`)."""
        return TickedStep(self, self._prepare(stacked, outer, inputs), self.ticks).run()

    def _remat(self, stage_fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
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
    run_stage: Callable[[Arrays, jax.Array, jax.Array | None], jax.Array]
    """``run_stage(params, x, real)``: a stage's (or chunk's) slots on ``x`` under the remat policy; ``real``:
    which slots hold a layer (None: all)."""
    real: jax.Array | None
    """This device's slot mask ``[V slots]`` (None when every slot holds a layer)."""


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
