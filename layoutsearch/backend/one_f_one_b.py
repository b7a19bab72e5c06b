"""1F1B and interleaved 1F1B in one jit: a schedule's tick table run by a ``lax.scan``, the backward written out.

:class:`TickedStep` runs inside the ``shard_map`` body of :class:`~layoutsearch.backend.pipeline.Pipeline`
(manual over the stage axis and the data axis) the :class:`~layoutsearch.backend.tick_tables.TickPlan` of the
pipeline's schedule: :func:`~.tick_tables.one_f_one_b` or :func:`~.tick_tables.interleaved` (see that module
for the schedules, their tick counts and the micro-batches they hold). It computes the loss and the gradients
of the local parameters; its parts, by concept:

* the *entry* (:meth:`TickedStep.entry`): the pre ops (embedding) on the local batch under ``jax.vjp``, their
  output cut into ``M`` micro-batches; their VJP runs once after the loop on the gradients that left virtual
  stage 0;
* the *post loss* (:meth:`TickedStep.post_loss`): the ops after the last block on one micro-batch, weighted so
  that the micro-batches' losses add up to the local batch's; the last virtual stage runs it and its gradient
  right after its forward of a micro-batch (the output gradient is put in the gradient inbox for its backward);
* the *chunk* (:meth:`TickedStep.chunk`): the layers of one chunk, a slice of the device's stacked parameters
  ``[V S, ...]`` (with ``V = 1`` the whole stage, no slicing), under the remat policy;
* the *ops* of a tick (:meth:`TickedStep.forward`, :meth:`TickedStep.backward`, idle), chosen per device by a
  ``lax.switch`` on the table: a forward stashes the residuals of the chunk's VJP (under the remat policy: the
  chunk's input alone with ``full``, also the projections with ``selective``, every activation with ``none``;
  not the parameters: JAX forwards them into the residuals as the very arrays passed in, and they are put back)
  in its stash slot; a backward rebuilds the VJP from the slot and adds the parameter gradients to float32
  accumulators (of the chunk);
* the *exchange* after a tick (:meth:`TickedStep.tick`): one ``ppermute`` per channel of the tick, sending the
  tick's output (an activation after a forward, an input gradient after a backward, zeros when idle); the
  receiver writes it to the inbox slot of the table (the trash slot when it is not for it);
* the *finish* (:meth:`TickedStep.finish`): the pre ops' VJP, and the gradient all-reduces, once: the outer
  parameters' and the loss over stage and data, the layers' over data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from layoutsearch.backend.program import Arrays, run_graph
from layoutsearch.backend.tick_tables import FIELDS, TickPlan

if TYPE_CHECKING:
    from layoutsearch.backend.pipeline import Pipeline, _Prepared


def vary(tree: Any, axes: tuple[str, ...]) -> Any:
    """Cast every array of ``tree`` to varying over those of ``axes`` it is not yet varying over."""
    def cast(x: jax.Array) -> jax.Array:
        missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
        return lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)


class _Op(NamedTuple):
    """A device's row of the tick table (:data:`~.tick_tables.FIELDS`), as traced scalars."""

    kind: jax.Array
    micro: jax.Array
    chunk: jax.Array
    x_slot: jax.Array
    stash: jax.Array
    g_slot: jax.Array
    dy_slot: jax.Array
    first: jax.Array
    last: jax.Array


assert _Op._fields == FIELDS


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class _State:
    """The loop's carry on one device: ``stash`` (per residual of a chunk's VJP, one buffer of the plan's stash
    slots), the float32 gradient accumulators of the device's layers and of the post ops' parameters, the
    loss, the activation and gradient inboxes (the plan's slots and a trash slot) and ``d_xs`` (the gradients
    of the micro-batches entering virtual stage 0)."""

    stash: list[jax.Array]
    grads: Arrays
    post_grads: Arrays
    loss: jax.Array
    act: jax.Array
    grad: jax.Array
    d_xs: jax.Array


class _ResidualPattern:
    """The residuals of a chunk's VJP (``jax.vjp`` returns its backward as a pytree whose leaves are the
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


class TickedStep:
    """Loss and gradients of one device's shard under a tick plan (see the module docstring); build it inside
    the ``shard_map`` body and call :meth:`run`."""

    def __init__(self, pipe: Pipeline, prepared: _Prepared, plan: TickPlan) -> None:
        self.pipe, self.c, self.plan = pipe, prepared, plan
        self.axes = pipe.manual
        self.V, S = plan.chunks, pipe.slots
        stacked = prepared.stacked  # local [V S, ...]
        self.params = stacked if self.V == 1 else {k: v.reshape(self.V, S, *v.shape[1:]) for k, v in stacked.items()}
        real = prepared.real
        self.real = real if real is None or self.V == 1 else real.reshape(self.V, S)
        self.pattern = _ResidualPattern()
        self.post_params = {t.name: prepared.outer[t.name] for t in pipe.post_micro.parameters}
        self.xs, self.pre_vjp = self.entry()
        self.post_loss = self._post_loss()

    # -- the parts
    def entry(self) -> tuple[jax.Array, Callable[[jax.Array], tuple[Arrays]]]:
        """The micro-batches entering virtual stage 0 ``[M, ...]`` and the VJP of the pre ops."""
        p, c = self.pipe.parts, self.c
        pre_inputs = {k: v for k, v in c.inputs.items() if k in p.pre.tensors}

        def pre_fn(o: Arrays) -> jax.Array:
            return {**c.inputs, **run_graph(p.pre, {**o, **pre_inputs}, c.constrain({}))}[p.entry]  # or an input

        entry, pre_vjp = jax.vjp(pre_fn, {k: v for k, v in c.outer.items() if k in p.pre.tensors})
        return self.pipe._split(entry, self.pipe.act_dims), pre_vjp

    def _post_loss(self) -> Callable[[Arrays, jax.Array, jax.Array], jax.Array]:
        """``post_loss(post_params, y, i)``: the loss of micro-batch ``i`` from the last block's output ``y``,
        weighted so that the micro-batches' losses sum to the local batch's (float32)."""
        pipe, c = self.pipe, self.c
        M, exit_, loss_name = pipe.M, pipe.parts.exit, pipe.parts.post.loss
        feeds = {}  # the post ops' fed tensors but the exit activation, per micro-batch
        for t in pipe.post_micro.fed:
            if t.name != exit_ and t.role != "parameter":
                v = c.inputs[t.name]
                feeds[t.name] = (pipe._split(v, t.dim_names) if pipe.batch_dim in t.dim_names
                                 else jnp.broadcast_to(v, (M, *v.shape)))
        weight = pipe.loss_scale * (1.0 / M if pipe.reduction == "mean" else 1.0)

        def post_loss(o: Arrays, y: jax.Array, i: jax.Array) -> jax.Array:
            env = {**o, exit_: y, **{k: v[i] for k, v in feeds.items()}}
            return run_graph(pipe.post_micro, env, c.constrain({}))[loss_name].astype(jnp.float32) * weight

        return post_loss

    def chunk(self, c: jax.Array | int) -> tuple[Arrays, jax.Array | None]:
        """The parameters of the device's chunk ``c`` and its padding mask (None: no padding)."""
        if self.V == 1:
            return self.params, self.real
        return jax.tree.map(lambda v: v[c], self.params), None if self.real is None else self.real[c]

    def chunk_vjp(self, c: jax.Array | int, x: jax.Array) -> tuple[jax.Array, Arrays, Any]:
        """Chunk ``c`` on ``x`` under ``jax.vjp``: its output, its parameters and its VJP."""
        params, real = self.chunk(c)
        y, vjp = jax.vjp(lambda p, x: self.c.run_stage(p, x, real), params, x)
        return y, params, vjp

    def initial_state(self) -> _State:
        zero_x = jnp.zeros_like(self.xs[0])
        _, params, probe = self.chunk_vjp(0, zero_x)
        zeros = lambda shape, dtype: vary(jnp.zeros(shape, dtype), self.axes)
        f32 = lambda tree: jax.tree.map(lambda v: zeros(v.shape, jnp.float32), tree)
        plan = self.plan
        return _State(stash=[zeros((plan.stash_slots, *r.shape), r.dtype) for r in self.pattern.split(params, probe)],
                      grads=f32(self.params), post_grads=f32(self.post_params), loss=zeros((), jnp.float32),
                      act=zeros((plan.act_slots + 1, *zero_x.shape), zero_x.dtype),
                      grad=zeros((plan.grad_slots + 1, *zero_x.shape), zero_x.dtype),
                      d_xs=zeros(self.xs.shape, self.xs.dtype))

    # -- the ops of a tick
    def forward(self, s: _State, op: _Op) -> tuple[_State, jax.Array]:
        x = jnp.where(op.x_slot < 0, self.xs[op.micro], s.act[jnp.maximum(op.x_slot, 0)])
        y, params, vjp = self.chunk_vjp(op.chunk, x)
        residuals = self.pattern.split(params, vjp)
        stash = [buf.at[op.stash].set(vary(r, self.axes)) for buf, r in zip(s.stash, residuals, strict=True)]

        def last(s: _State) -> tuple[jax.Array, Arrays, jax.Array]:  # the loss, and its gradient for the backward
            loss, (dpost, dy) = jax.value_and_grad(self.post_loss, argnums=(0, 1))(self.post_params, y, op.micro)
            post_grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), s.post_grads, dpost)
            return s.loss + loss, post_grads, s.grad.at[op.dy_slot].set(dy)

        loss, post_grads, grad = lax.cond(op.last == 1, last, lambda s: (s.loss, s.post_grads, s.grad), s)
        return dataclasses.replace(s, stash=stash, loss=loss, post_grads=post_grads, grad=grad), y

    def backward(self, s: _State, op: _Op) -> tuple[_State, jax.Array]:
        params, _ = self.chunk(op.chunk)
        vjp = self.pattern.join(params, [buf[op.stash] for buf in s.stash])
        dparams, dx = vjp(s.grad[op.g_slot])
        if self.V == 1:
            grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), s.grads, dparams)
        else:
            grads = jax.tree.map(lambda a, g: a.at[op.chunk].add(g.astype(a.dtype)), s.grads, dparams)
        d_xs = s.d_xs.at[op.micro].add(jnp.where(op.first == 1, dx, jnp.zeros_like(dx)))
        return dataclasses.replace(s, grads=grads, d_xs=d_xs), dx

    @staticmethod
    def idle(s: _State, op: _Op) -> tuple[_State, jax.Array]:
        return s, jnp.zeros_like(s.act[0])

    def tick(self, s: _State, row: jax.Array, recv: jax.Array, p: int) -> _State:
        """Tick ``p`` of a loop step: the device's op of the table ``row`` ``[K, fields]``, then the exchange over
        the tick's channels into the inbox slots of ``recv`` ``[K, channels, 2]``."""
        stage = self.c.stage
        op = _Op(*(row[stage, n] for n in range(len(FIELDS))))
        s, out = lax.switch(op.kind, [self.idle, self.forward, self.backward], s, op)
        act, grad = s.act, s.grad
        for n, (perm, (acts, grads)) in enumerate(zip(self.plan.channels[p], self.plan.carries[p], strict=True)):
            got = out if perm is None else lax.ppermute(out, self.pipe.stage_axis, list(perm))
            if acts:
                act = act.at[recv[stage, n, 0]].set(got)
            if grads:
                grad = grad.at[recv[stage, n, 1]].set(got)
        return dataclasses.replace(s, act=act, grad=grad)

    def loop(self, s: _State) -> _State:
        plan = self.plan
        P, K = plan.period, plan.stages
        table = jnp.asarray(plan.table.reshape(plan.steps, P, K, len(FIELDS)))
        recv = jnp.asarray(plan.recv.reshape(plan.steps, P, *plan.recv.shape[1:]))

        def step(s: _State, xs: tuple[jax.Array, jax.Array]) -> tuple[_State, None]:
            for p in range(P):
                s = self.tick(s, xs[0][p], xs[1][p], p)
            return s, None

        return lax.scan(step, s, (table, recv))[0]

    def finish(self, s: _State) -> tuple[jax.Array, Arrays, Arrays]:
        """The loss and the gradients (stacked ``[1, V S, ...]``, outer), all-reduced once."""
        pipe = self.pipe
        (d_pre,) = self.pre_vjp(pipe._merge(s.d_xs, pipe.act_dims))
        d_outer = {k: jnp.zeros(v.shape, jnp.float32) for k, v in self.c.outer.items()}
        for src in (d_pre, s.post_grads):
            d_outer.update({k: d_outer[k] + v.astype(jnp.float32) for k, v in src.items()})
        loss = jnp.where(self.c.stage == pipe.K - 1, s.loss, jnp.zeros_like(s.loss))
        loss, d_outer = lax.psum((loss, d_outer), self.axes)
        others = tuple(a for a in self.axes if a != pipe.stage_axis)  # the data axis: the layers' gradients
        d_stacked = lax.psum(s.grads, others) if others else s.grads
        if self.V > 1:
            d_stacked = {k: v.reshape(v.shape[0] * v.shape[1], *v.shape[2:]) for k, v in d_stacked.items()}
        return loss, {k: v[None] for k, v in d_stacked.items()}, d_outer

    def run(self) -> tuple[jax.Array, Arrays, Arrays]:
        return self.finish(self.loop(self.initial_state()))


__all__ = ["TickedStep", "vary"]
