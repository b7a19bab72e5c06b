"""A plan as a running program: parameters and optimizer state placed by the layout, a jitted training step.

:class:`Program` runs the forward graph (in the plan's precision policy) under the plan's layout,
differentiates it with ``jax.value_and_grad`` and applies an optax optimizer, all in one jitted step
whose state (parameters, optimizer state, step count) keeps the layout's shardings between steps::

    program = plan.compile()                    # or Program(graph, layout, remat="full", ...)
    state = program.init(seed=0)
    for i in range(20):
        state, metrics = program.train_step(state, program.random_batch(seed=i))

The step executes the plan's decisions: the remat policy (each block under ``jax.checkpoint``:
:func:`~layoutsearch.backend.program.run_graph`), gradient accumulation over ``microbatches``
micro-batches (a ``lax.scan``; micro-batch ``i`` holds examples ``i, i + M, ...`` so a batch split over
data axes needs no communication) and pipelines (:class:`~layoutsearch.backend.pipeline.Pipeline`: the
plan's partition of the layers into stages, equal or not, run by the plan's schedule, ``gpipe``, ``1f1b`` or
``interleaved:V``, whose partition is the chunks' in virtual-stage order).

Precision: with a policy that keeps master weights (``mixed``), the state holds float32 parameters and
the forward pass casts them to the policy's parameter dtype (bfloat16); the optimizer updates the
float32 values, as Megatron-LM and MaxText train. The optimizer defaults to the plan's (Adam or SGD with
its hyper-parameters, via optax, whose step count is in the state so bias correction advances); any
``optax.GradientTransformation`` (learning-rate schedules included) may be given instead.

Placement uses ``jax.make_array_from_callback`` from host values, so the same code runs under JAX's
multi-process runtime (``jax.distributed.initialize``): every process computes the same values and
places its own shards.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from layoutsearch.backend.pipeline import Pipeline
from layoutsearch.backend.program import (
    Arrays,
    batch_reduction,
    init_params,
    jax_dtype,
    random_inputs,
    run_graph,
    unflashed_cores,
    user_arrays,
)
from layoutsearch.backend.sharding import jax_mesh
from layoutsearch.costmodel.fusion import check_attention
from layoutsearch.devices import jax_devices
from layoutsearch.errors import LayoutError
from layoutsearch.ir.constants import constant_values
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision, with_precision
from layoutsearch.ir.remat import check_remat
from layoutsearch.ir.training import Optimizer
from layoutsearch.layout import Layout


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """What a training step carries: the ``step`` count (int32), the ``params`` (float32 master values
    under a policy with master weights; for a pipelined program, stacked per stage: use
    :meth:`Program.params` for the graph's names) and the optimizer's state."""

    step: jax.Array
    params: Any
    opt_state: Any


def make_optimizer(spec: Optimizer | str | optax.GradientTransformation) -> optax.GradientTransformation:
    """An optax optimizer: ``spec`` itself, or the IR optimizer's (``adam``: ``optax.adam(lr, b1, b2, eps)``,
    the same update as the IR's ``adam_update``; ``sgd``: ``optax.sgd(lr)``)."""
    if isinstance(spec, optax.GradientTransformation):
        return spec
    opt = Optimizer.of(spec)
    return optax.adam(opt.lr, opt.b1, opt.b2, opt.eps) if opt.kind == "adam" else optax.sgd(opt.lr)


class Program:
    """The training step of ``graph`` under ``layout`` (see the module docstring).

    ``remat``: ``none``, ``selective``, ``full`` or ``full:N`` (unpipelined); ``microbatches``: gradient
    accumulation (without ``stage_axis``) or pipeline micro-batches (with it); ``layers_per_stage``: the pipeline's partition
    (default equal; with ``interleaved:V``, the ``K V`` chunks' layers in virtual-stage order, as
    :meth:`~layoutsearch.costmodel.pipeline.PipelineReport.layers_per_stage` gives them); ``schedule``: the
    pipeline's, ``gpipe`` (default), ``1f1b`` or ``interleaved:V``; ``precision``: the
    policy; ``optimizer``: see :func:`make_optimizer`; ``devices``: the devices of the mesh (default
    :func:`~layoutsearch.devices.jax_devices`: the accelerators when there are enough, else simulated CPU
    devices); ``batch_dim``: the dim split into micro-batches; ``attention``: ``standard`` (the scores kept
    for the backward pass), ``flash`` (each attention core's backward pass recomputes its scores: a
    flash-attention kernel's memory and FLOPs, see :func:`~layoutsearch.backend.program.flash_cores`) or
    ``auto`` (flash on accelerators, standard on CPU: as the cost model's ``auto`` prices the presets);
    cores flash cannot run (:func:`~layoutsearch.backend.program.unflashed_cores`) run as standard, with a
    warning.

    The backward pass keeps what the IR's derived backward ops read, as the cost model counts: softmax its
    output; layer norm, the unary activations and cross-entropy their inputs (not JAX's own intermediates).
    """

    def __init__(self, graph: Graph, layout: Layout, *, remat: str = "none", microbatches: int = 1,
                 stage_axis: str | None = None, layers_per_stage: Sequence[int] | None = None,
                 schedule: str | None = None, precision: Precision | str = DEFAULT_PRECISION,
                 optimizer: Optimizer | str | optax.GradientTransformation = "adam",
                 devices: Sequence[jax.Device] | None = None, batch_dim: str = "batch",
                 attention: str = "auto") -> None:
        if graph.loss is None:
            raise LayoutError(f"graph {graph.name!r} has no loss to train")
        if any(op.phase != "forward" for op in graph.ops):
            raise LayoutError(f"graph {graph.name!r} is a training graph: compile its forward graph")
        layout.check(graph)
        self.policy = Precision.of(precision)
        self.graph, self.layout, self.remat, self.M = graph, layout, check_remat(remat, LayoutError), int(microbatches)
        self.stage_axis, self.batch_dim = stage_axis, batch_dim
        self.schedule = schedule or "gpipe"
        self.forward = with_precision(graph, self.policy)
        self.tx = make_optimizer(optimizer)
        self.mesh = jax_mesh(layout.mesh, devices if devices is not None else jax_devices(layout.mesh.size))
        if check_attention(attention, LayoutError) == "auto":
            attention = "standard" if next(iter(self.mesh.devices.flat)).platform == "cpu" else "flash"
        self.attention = attention
        if attention == "flash" and (standard := unflashed_cores(graph, self.remat)):
            warnings.warn(f"{len(standard)} attention core(s) run as standard attention, their scores kept for the "
                          f"backward pass (read outside the core, or split across remat blocks): "
                          f"{', '.join(standard[:3])}{', ...' if len(standard) > 3 else ''}; the cost model prices "
                          "them as flash attention", stacklevel=2)
        if not any(d.process_index == jax.process_index() for d in self.mesh.devices.flat):  # multi-process
            raise LayoutError(f"mesh {layout.mesh} has no device of process {jax.process_index()} of "
                              f"{jax.process_count()}: in a multi-process job the mesh must span the devices of "
                              f"every process ({jax.device_count()} in all)")
        self.param_names = [t.name for t in graph.parameters]
        self._store = {p: jnp.dtype(self.policy.master) if self.policy.master else jax_dtype(self.forward.tensors[p])
                       for p in self.param_names}
        if self.M < 1 or graph.dims.get(batch_dim, 1) % self.M:
            raise LayoutError(f"{microbatches!r} micro-batches do not divide {batch_dim}="
                              f"{graph.dims.get(batch_dim)}")
        self.pipeline: Pipeline | None = None
        if stage_axis is not None:
            self.pipeline = self._pipeline(layers_per_stage)
        elif self.M > 1:
            self.reduction = batch_reduction(graph, batch_dim)
            self.micro = self.forward.with_sizes({batch_dim: graph.dims[batch_dim] // self.M})
            layout.check(self.micro)
        self._param_sh, self._input_sh = self._placements()
        self._opt_sh = self._opt_shardings()
        rep = NamedSharding(self.mesh, P())
        self._state_sh = TrainState(rep, self._param_sh, self._opt_sh)
        options = (self.pipeline.compiler_options if self.pipeline is not None else None) or None
        self._step = jax.jit(self._train_step, in_shardings=(self._state_sh, self._input_sh),
                             out_shardings=(self._state_sh, rep), donate_argnums=(0,), compiler_options=options)
        self._loss = jax.jit(self._loss_fn, in_shardings=(self._param_sh, self._input_sh), out_shardings=rep,
                             compiler_options=options)

    # -- construction
    def _pipeline(self, layers_per_stage: Sequence[int] | None) -> Pipeline:
        """The pipeline executor for the plan (its partition and schedule): the batch on at most one data axis,
        the other rules on the remaining axes."""
        mesh, st = self.layout.mesh, self.stage_axis
        batch_axes = self.layout.rules_layout((self.batch_dim,)).get(self.batch_dim, ())
        if st in batch_axes or len(batch_axes) > 1:
            raise LayoutError(f"the pipeline executor splits {self.batch_dim!r} over one data axis; this layout "
                              f"splits it over {'+'.join(batch_axes)}")
        data = batch_axes[0] if batch_axes else None
        inner = tuple((d, a) for d, a in self.layout.rules if d != self.batch_dim and st not in a)
        if data is not None and any(data in a for _, a in inner):
            raise LayoutError(f"the pipeline executor uses axis {data!r} for the batch only; this layout also "
                              f"splits {', '.join(d for d, a in inner if data in a)} over it")
        shape = dict(mesh.shape)
        return Pipeline(self.forward, shape, microbatches=self.M, remat=self.remat, batch_dim=self.batch_dim,
                        layout=Layout(mesh, inner), stage_axis=st, data_axis=data or "",  # "": no data axis
                        layers_per_stage=layers_per_stage, devices=list(self.mesh.devices.flat),
                        schedule=self.schedule, attention=self.attention,
                        param_dtypes=[jnp.dtype(d).name for d in self._store.values()])

    def _placements(self) -> tuple[Any, dict[str, NamedSharding]]:
        if self.pipeline is not None:
            stacked, outer, inputs = self.pipeline.shardings()
            return {"stacked": stacked, "outer": outer}, inputs
        sh = {t.name: NamedSharding(self.mesh, self.layout.partition_spec(t)) for t in self.graph.tensors.values()}
        return {p: sh[p] for p in self.param_names}, {t.name: sh[t.name] for t in self.graph.inputs}

    def _abstract_params(self) -> Any:
        def leaf(sh: NamedSharding, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)
        if self.pipeline is None:
            return {p: leaf(self._param_sh[p], self._shape(p), self._store[p]) for p in self.param_names}
        pipe, K = self.pipeline, self.pipeline.K
        names = pipe.parts.layer_names
        return {"stacked": {k: leaf(self._param_sh["stacked"][k], (K, pipe.slots, *self._shape(names[k])),
                                    self._store[names[k]]) for k in pipe.parts.layer_params},
                "outer": {k: leaf(self._param_sh["outer"][k], self._shape(k), self._store[k])
                          for k in pipe.parts.outer_params}}

    def _shape(self, name: str) -> tuple[int, ...]:
        return tuple(d.size for d in self.graph.tensors[name].dims)

    def _opt_shardings(self) -> Any:
        """The optimizer state's shardings: a leaf shaped like the parameter whose name is on its path (optax
        keeps moments as trees like the parameters') takes that parameter's sharding; others (counts) are
        replicated."""
        params = self._abstract_params()
        flat = {tuple(_key(k) for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
        rep = NamedSharding(self.mesh, P())

        def pick(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
            keys = tuple(_key(k) for k in path)
            for n in range(len(keys)):
                p = flat.get(keys[n:])
                if p is not None and p.shape == leaf.shape:
                    return p.sharding
            return rep
        return jax.tree_util.tree_map_with_path(pick, jax.eval_shape(self.tx.init, params))

    # -- the step
    def _cast(self, params: Mapping[str, jax.Array], graph: Graph) -> Arrays:
        return {k: v.astype(jax_dtype(graph.tensors[k])) for k, v in params.items()}

    def _constrain(self, name: str, x: jax.Array) -> jax.Array:
        t = self.graph.tensors[name]
        return lax.with_sharding_constraint(x, NamedSharding(self.mesh, self.layout.partition_spec(t)))

    def _graph_loss(self, graph: Graph, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        env = run_graph(graph, {**self._cast(params, graph), **batch}, self._constrain, remat=self.remat,
                        attention=self.attention)
        return env[graph.loss]

    def _loss_fn(self, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        if self.pipeline is not None:  # it casts the parameters to the forward graph's dtypes itself
            return self.pipeline.sharded_loss(params["stacked"], params["outer"], batch)
        if self.M == 1:
            return self._graph_loss(self.forward, params, batch)
        return self._accumulated(params, batch)[0]

    def _micro_batches(self, batch: Mapping[str, jax.Array]) -> Arrays:
        """Each input as ``[M, ...]``: micro-batch ``i`` holds examples ``i, i + M, ...``."""
        out = {}
        for k, x in batch.items():
            dims = self.graph.tensors[k].dim_names
            if self.batch_dim not in dims:
                out[k] = jnp.broadcast_to(x, (self.M, *x.shape))
                continue
            a = dims.index(self.batch_dim)
            x = x.reshape(*x.shape[:a], x.shape[a] // self.M, self.M, *x.shape[a + 1:])
            out[k] = jnp.moveaxis(x, a + 1, 0)
        return out

    def _accumulated(self, params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, Any]:
        """Loss and gradients summed over the micro-batches in a ``lax.scan`` (float32 accumulators), then
        averaged for a mean loss."""
        grad = jax.value_and_grad(lambda p, b: self._graph_loss(self.micro, p, b))

        def body(carry: tuple[jax.Array, Any], mb: Arrays) -> tuple[tuple[jax.Array, Any], None]:
            loss, grads = grad(params, mb)
            acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), carry[1], grads)
            return (carry[0] + loss.astype(jnp.float32), acc), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        (loss, grads), _ = lax.scan(body, (jnp.zeros((), jnp.float32), zeros), self._micro_batches(batch))
        scale = 1.0 / self.M if self.reduction == "mean" else 1.0
        return loss * scale, jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, params)

    def _loss_and_grads(self, params: Any, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, Any]:
        if self.pipeline is None and self.M > 1:
            return self._accumulated(params, batch)
        if self.pipeline is not None:  # the schedule's own loss and gradients (1F1B writes its backward out)
            loss, (d_stacked, d_outer) = self.pipeline.sharded_loss_and_grads(params["stacked"], params["outer"],
                                                                              batch)
            return loss, {"stacked": d_stacked, "outer": d_outer}
        return jax.value_and_grad(self._loss_fn)(params, batch)

    def _train_step(self, state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict[str, Any]]:
        loss, grads = self._loss_and_grads(state.params, batch)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(state.step + 1, params, opt_state), {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    # -- public
    @property
    def shardings(self) -> dict[str, P]:
        """The PartitionSpec of every tensor of the forward graph (parameters and inputs as placed; in a
        pipelined program a layer parameter also lies on the stage axis, stacked)."""
        return {t.name: self.layout.partition_spec(t) for t in self.graph.tensors.values()}

    def init(self, seed: int = 0, params: Any = None) -> TrainState:
        """Parameters and a fresh optimizer state, placed with their shardings. ``params``: the initial values,
        the user's own (the parameter argument of the function the graph was imported from, a pytree such as a
        Flax ``params`` dict or an ``nnx.State``; or a mapping of the graph's parameter names to arrays); without
        it, values drawn from ``seed`` (:func:`~layoutsearch.backend.program.init_params`: the same values for a
        seed on any mesh)."""
        if params is None:
            values = {k: np.asarray(v, np.float32) for k, v in init_params(self.graph, seed).items()
                      if k in self._store}
        else:
            values = self._given_params(params)
        if self.pipeline is not None:
            stacked, outer = self.pipeline.stack(values)
            values = {"stacked": {k: np.asarray(v) for k, v in stacked.items()}, "outer": outer}
        abstract = self._abstract_params()
        params = jax.tree.map(lambda a, v: _place(np.asarray(v, a.dtype), a.sharding), abstract, values)
        opt_state = jax.jit(self.tx.init, out_shardings=self._opt_sh)(params)
        return TrainState(_place(np.zeros((), np.int32), self._state_sh.step), params, opt_state)

    def _given_params(self, params: Any) -> dict[str, np.ndarray]:
        """The parameters' values in ``params`` (see :meth:`init`); LayoutError naming those missing."""
        if isinstance(params, Mapping) and params and all(isinstance(k, str) and k in self._store for k in params):
            values = {k: np.asarray(v, np.float32) for k, v in params.items()}
        else:
            argnums = self.graph.meta.get("params_argnums") or [0]
            trees = params if len(argnums) > 1 else (params,)
            if len(trees) != len(argnums):
                raise LayoutError(f"params: the graph's parameters come from {len(argnums)} arguments "
                                  f"({argnums}): give a tuple of {len(argnums)} pytrees")
            values = {}
            for k, tree in zip(argnums, trees, strict=True):
                values.update(user_arrays(self.graph, tree, k, "params"))
            values = {k: v for k, v in values.items() if k in self._store}
        missing = [p for p in self.param_names if p not in values]
        if missing:
            raise LayoutError(f"params has no value for {len(missing)} parameter(s) of the graph: "
                              f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")
        for k, v in values.items():
            if v.shape != self._shape(k):
                raise LayoutError(f"params: {k!r} has shape {list(v.shape)}, the graph's is {list(self._shape(k))}")
        return values

    def batch(self, *args: Any, arrays: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
        """The graph's inputs from the user's own arrays, placed with their shardings: ``args`` are the
        arguments of the function the graph was imported from other than its parameters, in order; or
        ``arrays`` maps the graph's input names to arrays (``run --batch FILE.npz``). The constant tensors
        the importer folded come with the graph."""
        values: dict[str, Any] = dict(constant_values(self.graph.tensors, self.graph.meta))
        if arrays is not None:
            unknown = [k for k in arrays if k not in self._input_sh]
            if unknown or args:
                raise LayoutError(f"batch: {', '.join(map(repr, unknown[:5]))} name no input of the graph (inputs: "
                                  f"{', '.join(self._input_sh)})" if unknown else "batch: give args or arrays, not both")
            values.update(arrays)
        else:
            argnums = set(self.graph.meta.get("params_argnums") or [0])
            names = self.graph.meta.get("arguments") or []
            rest = [k for k in range(len(names)) if k not in argnums]
            if len(args) != len(rest):
                raise LayoutError(f"batch takes the function's {len(rest)} non-parameter argument(s) "
                                  f"({', '.join(names[k] for k in rest) or 'none'}), got {len(args)}")
            for k, tree in zip(rest, args, strict=True):
                values.update(user_arrays(self.graph, tree, k, names[k]))
        missing = [k for k in self._input_sh if k not in values]
        if missing:
            raise LayoutError(f"batch has no value for input(s) {', '.join(missing)}")
        return {k: _place(np.asarray(values[k], jax_dtype(self.graph.tensors[k])), sh)
                for k, sh in self._input_sh.items()}

    def random_batch(self, seed: int = 0) -> dict[str, jax.Array]:
        """Inputs of the right shapes, dtypes and shardings (token ids in range), deterministic in ``seed``."""
        values = random_inputs(self.graph, seed)
        return {k: _place(np.asarray(values[k]), sh) for k, sh in self._input_sh.items()}

    def train_step(self, state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict[str, Any]]:
        """One step: ``(new state, {"loss", "grad_norm"})``. ``state`` is donated (invalid afterwards)."""
        return self._step(state, dict(batch))

    def params(self, state: TrainState) -> Arrays:
        """The parameters of ``state`` by the graph's names (a pipelined program's unstacked)."""
        if self.pipeline is None:
            return dict(state.params)
        return self.pipeline.unstack(state.params["stacked"], state.params["outer"])

    def loss(self, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        """The loss of ``params`` (``state.params``) on ``batch``, without a step."""
        return self._loss(params, dict(batch))

    def _lowered(self) -> Any:
        abstract = self._abstract_params()
        state = TrainState(jax.ShapeDtypeStruct((), jnp.int32, sharding=self._state_sh.step), abstract,
                           jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                                        jax.eval_shape(self.tx.init, abstract), self._opt_sh))
        batch = {k: jax.ShapeDtypeStruct(self._shape(k), jax_dtype(self.graph.tensors[k]), sharding=sh)
                 for k, sh in self._input_sh.items()}
        return self._step.lower(state, batch)

    def lowered_text(self) -> str:
        """The training step as lowered StableHLO text (before XLA's partitioner)."""
        return self._lowered().as_text()

    def compiled_text(self) -> str:
        """The training step as compiled, partitioned HLO text (collectives visible)."""
        return self._lowered().compile().as_text()

    def memory_analysis(self) -> dict[str, int]:
        """XLA's memory figures of the compiled step per device: arguments, outputs, temporaries, aliased."""
        m = self._lowered().compile().memory_analysis()
        return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}


def _key(k: Any) -> Any:
    return getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))


def _place(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """``value`` (the same on every process) placed with ``sharding``, each process writing its own shards."""
    return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])




@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One measured training step: its ``loss``, wall-clock ``seconds`` (the first step's include
    compilation: see :attr:`TrainRun.compile_s`) and tokens per second."""

    step: int
    loss: float
    seconds: float
    tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """What :func:`train` measured: per-step records (after the first, compiled, step), ``compile_s`` (the
    first step, compilation included) and the median step time."""

    records: tuple[StepRecord, ...]
    compile_s: float
    tokens_per_step: int

    @property
    def median_step_s(self) -> float:
        times = sorted(r.seconds for r in self.records[1:]) or [self.records[0].seconds]
        return times[len(times) // 2]

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [dataclasses.asdict(r) for r in self.records], "compile_s": self.compile_s,
                "median_step_s": self.median_step_s, "tokens_per_step": self.tokens_per_step}


def tokens_per_step(graph: Graph) -> int:
    """Tokens a step trains on: ``batch x seq`` when the graph has both dims, else the batch (examples)."""
    return graph.dims.get("batch", 1) * graph.dims.get("seq", 1)


def train(program: Program, steps: int, *, seed: int = 0, on_step: Callable[[StepRecord], None] | None = None,
          params: Any = None, batch: Mapping[str, Any] | None = None) -> TrainRun:
    """Run ``steps`` training steps from ``program.init(seed, params)`` on batches ``random_batch(seed + i)``
    (or on ``batch``, the graph's inputs by name, every step), timing each (``block_until_ready``);
    ``on_step`` sees each record as it is measured."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise LayoutError(f"steps must be a positive integer, got {steps!r}")
    tokens = tokens_per_step(program.graph)
    state = program.init(seed, params=params)
    fixed = program.batch(arrays=batch) if batch is not None else None
    records = []
    for i in range(steps):
        batch = fixed if fixed is not None else program.random_batch(seed + i)
        t0 = time.perf_counter()
        state, metrics = program.train_step(state, batch)
        loss = float(jax.block_until_ready(metrics["loss"]))
        dt = time.perf_counter() - t0
        records.append(StepRecord(i + 1, loss, dt, tokens / dt))
        if on_step is not None:
            on_step(records[-1])
    return TrainRun(tuple(records), records[0].seconds, tokens)


__all__ = ["Program", "StepRecord", "TrainRun", "TrainState", "make_optimizer", "tokens_per_step", "train"]
