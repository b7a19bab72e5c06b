"""Memory per device over the schedule of one training step (live-set simulation).

Model
-----
The step runs the ops of the training graph (:func:`layoutsearch.ir.training_graph`)
one at a time in the graph's topological order: forward, backward (reverse
order of the forward), optimizer. Every tensor occupies its per-device slice,
``Layout.local_bytes`` (its *storage* layout), over an interval of that
schedule; the memory at an op is the sum of the slices live there plus the
op's transient buffers, and the peak is the largest such sum.

* **Fed tensors** (parameters, optimizer state, inputs) live the whole step.
* **New values** (``new/P``, ``new/adam_m/P``, ... — tensors that ``updates`` a
  fed one) are written into the old buffer (donated, as ``jax.jit(...,
  donate_argnums=...)`` and XLA's input/output aliasing do): they add nothing.
* **Produced tensors** live from their producer to their last consumer
  (inclusive: an op's inputs and output coexist). The loss, a step output,
  lives to the end. Forward products are ``activations``; backward products
  are ``gradients`` when they are a parameter's gradient or one of the
  contributions summed into it (``grad/P``, ``grad/<op>/<i>``, the sum chain),
  otherwise ``activation_gradients``. Parameter gradients are consumed by the
  optimizer, which runs after the whole backward pass, so they accumulate.
* **Transient buffers** of communication live during their op only: an input
  all-gathered or moved by an all-to-all (the resharded copy, i.e. the last
  collective's payload for that input), an output produced whole and then
  reduce-scattered or all-reduced and sliced (its payload less the stored
  slice), an output moved by an all-to-all. Normalization statistics are
  ignored (rows, not tensors). A resharded input that several ops share (the
  op rules' :attr:`Comm.shared`: XLA reshards it once, e.g. a gathered
  weight read by the forward matmul and by a backward one) lives from the
  first of those ops to the last.

Combined gradient all-reduce (per backend)
------------------------------------------
Where the backend defers the parameter-gradient all-reduces
(:attr:`Hardware.combined_gradient_all_reduce <layoutsearch.mesh.Hardware>`:
XLA on CPU, whose all-reduce combiner merges them into one tuple all-reduce
after the backward pass and runs it out of place), a parameter gradient that
is all-reduced by its producer and read only by the optimizer is not reduced
at its producer: its unreduced partial sum, the collective's whole payload
(for FSDP the full, unsliced gradient), lives from its producer to the last
backward op, where the combined all-reduce runs (charged to that op, like any
op's collective) and its reduced copies (as many bytes again) are live
together with every partial. The stored gradient (the reduced copy, or its
slice) lives from the first optimizer op to its last use. Partials and
reduced copies count as ``gradients``. Elsewhere (GPU/TPU presets) each
gradient is reduced at its producer, as above.

Rematerialization (activation recomputation)
--------------------------------------------
Ops are grouped by their ``block`` (a transformer layer: ``layer.3``); ops in
no block are never recomputed. A forward tensor of a block is on the block's
*boundary* when a forward op of another block (or of no block) reads it, or it
is the loss; boundary tensors are always kept. The other tensors of the block
are *internal*; a policy keeps some of them and drops the rest:

* ``none``: every tensor is kept until its last (backward) use.
* ``full`` (Chen et al. 2016, "Training deep nets with sublinear memory
  cost"; Megatron's full recomputation): no internal tensor is kept; only
  boundary tensors cross from the forward to the backward pass.
* ``selective`` (Korthikanti et al. 2022, "Reducing activation recomputation
  in large transformer models"): the outputs of matmuls with a parameter
  operand (the projections: q/k/v, attention output, feed-forward in/out) are
  kept; everything else internal — elementwise ops, softmax, layer norms and
  the matmuls between two activations (the attention core ``q·k`` and
  ``probs·v``, whose ``[batch, heads, seq, seq]`` outputs dominate activation
  memory at long sequences) — is recomputed.

A dropped tensor lives from its producer to its last *forward* use. The
dropped tensors the backward pass needs, and the dropped tensors those are
computed from (the recompute closure; a dropout mask is drawn again from its
seed, without its input), are recomputed at the block's first
backward op (its *recompute point*): there they all become live at once and
stay until their last backward use, so memory holds one block's recomputed
tensors at a time; the kept tensors the recomputation reads live until the
recompute point. The recomputed ops (:attr:`RematPlan.recomputed`) run again,
with their communication (a tensor-parallel forward all-reduce repeats): the
cost report adds their time and FLOPs. The recomputation's own transient
buffers are charged at the recompute point (the largest of them).

Assumptions: one op at a time, no fusion (XLA fuses elementwise chains, so
real activation memory can be lower); no gradient accumulation or
micro-batching; no memory fragmentation, workspace or framework overhead;
XLA may reorder the schedule (its ``peak_memory`` is a lower-is-better
scheduler's result). Checked against compiled programs in the tests.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from layoutsearch.costmodel.ops import OpCost
from layoutsearch.costmodel.step import graph_cached, resized_from, step_costs, training_step
from layoutsearch.errors import CostModelError
from layoutsearch.ir import ops as O
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.remat import REMAT_POLICIES, parse_remat, recomputed_blocks
from layoutsearch.ir.tensor import Tensor
from layoutsearch.ir.training import Optimizer, parameter_gradients
from layoutsearch.layout import Layout

CATEGORIES = ("parameters", "optimizer_state", "inputs", "gradients", "activations", "activation_gradients",
              "transient")
"""What per-device bytes are for, in the order reports list them."""

_CAT = {c: i for i, c in enumerate(CATEGORIES)}


# -- rematerialization ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RematPlan:
    """Which forward ops run again in the backward pass, and where.

    ``recomputed``: names of the recomputed forward ops, in schedule order;
    ``dropped``: the forward tensors not kept from the forward to the
    backward pass (recomputed if the backward pass needs them);
    ``points``: block -> schedule index of its first backward op, where its
    recomputation runs (blocks with something to recompute only)."""

    policy: str
    recomputed: tuple[str, ...] = ()
    dropped: frozenset[str] = field(default=frozenset())
    points: dict[str, int] = field(default_factory=dict, hash=False, compare=False)


def remat_plan(graph: Graph, policy: str = "none") -> RematPlan:
    """The recomputation ``policy`` (:mod:`layoutsearch.ir.remat`) implies for training graph ``graph``."""
    parse_remat(policy, CostModelError)

    def compute() -> RematPlan:  # (of one micro-batch: the whole batch's, the plan reading no size)
        origin = resized_from(graph)
        return remat_plan(origin[0], policy) if origin is not None else _remat_plan(graph, policy)
    return graph_cached(graph, ("remat", policy), compute)


def _remat_plan(graph: Graph, policy: str) -> RematPlan:
    remat = parse_remat(policy, CostModelError)
    if remat.kind == "none":
        return RematPlan(policy)
    producer = {op.output: op for op in graph.ops}
    consumers = graph.consumers
    fed = {t.name for t in graph.fed}
    params = {t.name for t in graph.parameters}
    recomputing = set(recomputed_blocks(graph, policy, CostModelError))

    def droppable(op: O.Op) -> bool:
        if op.phase != "forward" or op.block not in recomputing or op.output == graph.loss:
            return False
        for c in consumers[op.output]:
            if c.phase == "forward" and c.block != op.block:
                return False  # boundary
        # selective: a projection's output (a matmul with a parameter operand) is kept
        return not (remat.kind == "selective" and isinstance(op, O.Einsum) and any(i in params for i in op.inputs))

    dropped = {op.output for op in graph.ops if droppable(op)}
    needed = [t for t in dropped if any(c.phase != "forward" for c in consumers[t])]
    closure: set[str] = set()
    while needed:
        t = needed.pop()
        if t in closure:
            continue
        closure.add(t)
        if not O.is_dropout_mask(producer[t]):  # a dropout mask is drawn again from its seed alone
            needed.extend(i for i in producer[t].inputs if i in dropped and i not in fed)
    points: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        if op.phase == "backward" and op.block is not None and op.block not in points:
            points[op.block] = i
    recomputed = tuple(op.name for op in graph.ops if op.output in closure)
    used_blocks = {producer[t].block for t in closure}
    missing = [b for b in used_blocks if b not in points]
    if missing:  # pragma: no cover - a backward use implies a backward op of the block
        raise AssertionError(f"blocks {missing} need recomputation but have no backward op")
    return RematPlan(policy, recomputed, frozenset(dropped), {b: points[b] for b in sorted(used_blocks, key=str)})


# -- the live-set simulation ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryReport:
    """Per-device memory of a training step.

    ``peak_bytes``: the largest live total over the schedule, at op
    ``peak_op`` (phase ``peak_phase``); ``breakdown``: that total by category
    (:data:`CATEGORIES`; the values sum to ``peak_bytes``); ``resident``: the
    bytes held the whole step (parameters, optimizer state, inputs);
    ``timeline``: live bytes at each op of the schedule (op order of the
    training graph)."""

    peak_bytes: int
    peak_op: str | None
    peak_phase: str | None
    breakdown: dict[str, int]
    resident: dict[str, int]
    remat: str
    recomputed_ops: int
    timeline: tuple[int, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (without the timeline)."""
        return {"peak_bytes": self.peak_bytes, "peak_op": self.peak_op, "peak_phase": self.peak_phase,
                "breakdown": dict(self.breakdown), "resident": dict(self.resident), "remat": self.remat,
                "recomputed_ops": self.recomputed_ops}


def transient_buffers(op: O.Op, cost: OpCost, stored_out: int, deferred: bool = False) -> tuple[int, dict[Any, int]]:
    """Bytes of the buffers ``op``'s collectives need besides its stored inputs and
    output: those of this op alone, and the resharded inputs shared with other ops
    (by :attr:`Comm.shared` key; they live from the first op using them to the last).
    ``deferred``: the output's all-reduce runs later (combined gradient all-reduce)."""
    last_in: dict[str, tuple[Any, int]] = {}
    out = 0
    for c in cost.comms:
        if c.tensor == op.output:
            if deferred and c.kind == "all-reduce":
                continue
            if c.kind in ("all-to-all", "collective-permute"):
                out += c.bytes
            elif c.kind in ("reduce-scatter", "all-reduce"):
                out = max(out, c.bytes - stored_out)
        elif c.kind in ("all-gather", "all-to-all", "collective-permute"):
            shared = getattr(c, "shared", None)
            last_in[c.tensor] = (shared[:-1] if shared else None, c.bytes)
    own = out + sum(b for key, b in last_in.values() if key is None)
    return own, {key: b for key, b in last_in.values() if key is not None}


def memory_profile(graph: Graph, layout: Layout, remat: str | RematPlan = "none", *,
                   op_costs: Sequence[OpCost] | None = None, reduce_scatter: bool = True,
                   combined_gradient_all_reduce: bool = False, float32_collectives: bool = False, optimizer: Optimizer | str = "adam",
                   precision: Precision | str = DEFAULT_PRECISION) -> MemoryReport:
    """Peak per-device memory of the training step of ``graph`` under ``layout``.

    ``graph`` is a forward graph (its training graph is derived with
    ``optimizer`` and ``precision``) or a training graph. No fusion: the
    tensors of the graph all live in HBM (see :func:`simulate`). ``op_costs`` (one per op of the
    training graph, in its op order, each with all its collectives: the first
    of :func:`step_costs`) give the collectives whose transient buffers count;
    computed when omitted. ``reduce_scatter``, ``combined_gradient_all_reduce``,
    ``float32_collectives``: the backend's behaviour (see
    :class:`~layoutsearch.mesh.Hardware`; XLA on CPU: ``False``, ``True``, ``True``).
    """
    g = training_step(graph, optimizer, precision)
    layout.check(g)
    plan = remat if isinstance(remat, RematPlan) else remat_plan(g, remat)
    if op_costs is None:
        op_costs = step_costs(g, layout, reduce_scatter, float32_collectives=float32_collectives)[0]
    if len(op_costs) != len(g.ops):
        raise CostModelError(f"memory_profile got {len(op_costs)} op costs for {len(g.ops)} ops")
    return simulate(g, layout, plan, op_costs, combined_gradient_all_reduce=combined_gradient_all_reduce)


def local_bytes_fn(layout: Layout) -> Callable[[Tensor], int]:
    """A fast ``layout.local_bytes``: tensors laid out by the global rules share
    one computation per set of dim names."""
    sizes = layout.mesh.shape
    overridden = {name for name, _ in layout.tensors}
    splits: dict[tuple[Dim, ...], tuple[int, ...]] = {}

    def local_bytes(t: Tensor) -> int:
        if t.name in overridden:
            return layout.local_bytes(t)
        split = splits.get(t.dims)
        if split is None:
            names = tuple(d.name for d in t.dims)
            split = splits[t.dims] = tuple(math.prod(sizes[a] for a in axes)
                                           for axes in layout.rules_layout(names).values())
        n = t.nbytes
        for k in split:
            n //= k
        return n

    return local_bytes


@dataclass(frozen=True)
class Lifetimes:
    """Layout-independent part of the simulation: the intervals of the schedule
    during which each tensor (``tensors[tensor[k]]``) is live, in category ``cat[k]``."""

    tensors: tuple[Tensor, ...]
    tensor: np.ndarray
    cat: np.ndarray
    start: np.ndarray
    end: np.ndarray
    fed: tuple[int, ...]  # indices into ``tensors`` of the fed tensors
    deferrable: dict[str, int]  # parameter gradient read only by the optimizer -> its (only) row
    last_backward: int  # schedule index of the last backward op (-1: none)


def lifetimes(g: Graph, plan: RematPlan) -> Lifetimes:
    """Every tensor's live range in the schedule of training graph ``g`` under ``plan`` (cached per graph):
    what :func:`simulate` charges, and what the solvers' memory rows and bounds are built from."""
    def compute() -> Lifetimes:  # (of one micro-batch: the whole batch's ranges, its own tensors)
        origin = resized_from(g)
        if origin is None:
            return _lifetimes(g, plan)
        big = lifetimes(origin[0], plan)
        return dataclasses.replace(big, tensors=tuple(g.tensors[t.name] for t in big.tensors))
    return graph_cached(g, ("lifetimes", plan), compute)


def _lifetimes(g: Graph, plan: RematPlan) -> Lifetimes:
    n = len(g.ops)
    index = {op.name: i for i, op in enumerate(g.ops)}
    producer_index = {op.output: i for i, op in enumerate(g.ops)}
    phases = [op.phase for op in g.ops]
    consumers = g.consumers
    param_grads = parameter_gradients(g)
    block_of = {op.output: op.block for op in g.ops}
    recomputed = frozenset(plan.recomputed)
    recomputed_outputs = frozenset(g.op(name).output for name in plan.recomputed)
    tensors: list[Tensor] = []
    fed: list[int] = []
    rows: list[tuple[int, int, int, int]] = []  # (tensor, cat, start, end)
    for t in g.tensors.values():
        if t.updates is not None:
            continue  # written into the donated buffer of the tensor it updates
        k = len(tensors)
        tensors.append(t)
        if t.name not in producer_index:
            cat = {"parameter": "parameters", "optimizer_state": "optimizer_state"}.get(t.role, "inputs")
            fed.append(k)
            rows.append((k, _CAT[cat], 0, n - 1))
            continue
        start = producer_index[t.name]
        phase = phases[start]
        uses = [index[c.name] for c in consumers[t.name]]
        if t.name == g.loss:
            uses.append(n - 1)
        if phase == "forward":
            cat = "activations"
        elif t.name in param_grads:
            cat = "gradients"
        elif phase == "backward":
            cat = "activation_gradients"
        else:
            cat = "optimizer_state"
        c = _CAT[cat]
        if t.name in plan.dropped:
            fwd = [u for u in uses if phases[u] == "forward"]
            rows.append((k, c, start, max(fwd, default=start)))
            bwd = [u for u in uses if phases[u] != "forward"]
            point = plan.points.get(block_of[t.name] or "")
            if point is not None and (bwd or t.name in recomputed_outputs):
                rows.append((k, c, point, max(bwd, default=point)))
            continue
        end = max(uses, default=start)
        if recomputed:  # kept tensors read by a recomputation stay live until its point
            for op in consumers[t.name]:
                if op.phase == "forward" and op.name in recomputed and not O.is_dropout_mask(op):
                    end = max(end, plan.points[op.block])  # type: ignore[index]
        rows.append((k, c, start, end))
    arr = np.array(rows, dtype=np.int64).reshape(-1, 4)
    backward = [i for i, p in enumerate(phases) if p == "backward"]
    last_backward = backward[-1] if backward else -1
    row_of = {tensors[k].name: r for r, (k, *_) in enumerate(rows)}
    deferrable = {t: row_of[t] for t in sorted(param_grads)
                  if t in row_of and consumers[t] and all(c.phase == "optimizer" for c in consumers[t])
                  and producer_index.get(t, n) <= last_backward < rows[row_of[t]][3]}
    return Lifetimes(tuple(tensors), arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], tuple(fed), deferrable,
                      last_backward)


def simulate(g: Graph, layout: Layout, plan: RematPlan, op_costs: Sequence[OpCost], *,
             combined_gradient_all_reduce: bool = False, on_chip: frozenset[str] = frozenset()) -> MemoryReport:
    """The live-set simulation of training graph ``g`` (layout already checked),
    one op cost per op of ``g``; ``combined_gradient_all_reduce``: the backend
    defers the gradient all-reduces (see the module docstring); ``on_chip``:
    tensors that never reach HBM (fused, or flash-attention scores; see
    :mod:`layoutsearch.costmodel.fusion`) and take no memory.

    Byte counts are exact integers at any size: the curves are summed in numpy ``int64`` when a bound on
    every partial sum (:func:`_magnitude_bound`) is below ``2**63``, else in Python integers (numpy object
    arrays), so no count wraps around."""
    n = len(g.ops)
    if n == 0:
        raise CostModelError(f"graph {g.name!r} has no ops: nothing to simulate")
    life = lifetimes(g, plan)
    local_bytes = local_bytes_fn(layout)
    sizes = [0 if t.name in on_chip else int(local_bytes(t)) for t in life.tensors]
    local = {t.name: b for t, b in zip(life.tensors, sizes, strict=True)}
    dtype: Any = np.int64 if _magnitude_bound(sizes, life, op_costs) < 2**63 else object
    nbytes = np.array(sizes, dtype=dtype)
    # deltas[c, i]: bytes of category c becoming live at op i (negative: freed after op i-1)
    deltas = np.zeros((len(CATEGORIES), n + 1), dtype=dtype)
    b = nbytes[life.tensor]
    np.add.at(deltas, (life.cat, life.start), b)
    np.add.at(deltas, (life.cat, life.end + 1), -b)
    resident = {"parameters": 0, "optimizer_state": 0, "inputs": 0}
    for k in life.fed:
        t = life.tensors[k]
        resident[{"parameter": "parameters", "optimizer_state": "optimizer_state"}.get(t.role, "inputs")] += local[
            t.name]

    deferred: set[str] = set()
    if combined_gradient_all_reduce:
        gc, last = _CAT["gradients"], life.last_backward
        for t_name, row in life.deferrable.items():
            i = int(life.start[row])
            payload = max((int(c.bytes) for c in op_costs[i].comms if c.tensor == t_name and c.kind == "all-reduce"),
                          default=0)
            if not payload:
                continue
            deferred.add(t_name)
            stored = int(b[row])
            # the partial from its producer to the last backward op, the reduced copy there too;
            # the stored gradient from the first optimizer op on (instead of from its producer)
            deltas[gc, i] += payload - stored
            deltas[gc, last] += payload
            deltas[gc, last + 1] += stored - 2 * payload

    transient = np.zeros(n, dtype=dtype)
    shared: dict[Any, tuple[int, int, int]] = {}  # key -> (first op, last op, bytes)
    for i, (op, cost) in enumerate(zip(g.ops, op_costs, strict=True)):
        if cost.comms:
            own, buffers = transient_buffers(op, cost, local.get(op.output, 0), op.output in deferred)
            transient[i] = own
            for key, size in buffers.items():
                first = shared.get(key, (i, i, 0))[0]
                shared[key] = (first, i, size)
    t = _CAT["transient"]
    for first, last, size in shared.values():
        deltas[t, first] += size
        deltas[t, last + 1] -= size
    if plan.recomputed:
        index = {op.name: i for i, op in enumerate(g.ops)}
        for name in plan.recomputed:
            op = g.ops[index[name]]
            p = plan.points[op.block]  # type: ignore[index]
            own, buffers = transient_buffers(op, op_costs[index[name]], local.get(op.output, 0))
            transient[p] = max(transient[p], own + sum(buffers.values()))
    curves = np.cumsum(deltas[:, :n], axis=1)
    curves[t] += transient
    total = curves.sum(axis=0)
    peak = int(np.argmax(total))
    breakdown = {c: int(curves[_CAT[c], peak]) for c in CATEGORIES}
    return MemoryReport(int(total[peak]), g.ops[peak].name, g.ops[peak].phase, breakdown, resident, plan.policy,
                        len(plan.recomputed), tuple(int(x) for x in total.tolist()))


def _magnitude_bound(sizes: Sequence[int], life: Lifetimes, op_costs: Sequence[OpCost]) -> int:
    """An upper bound on the magnitude of every number :func:`simulate` forms (each entry of ``deltas``,
    every partial sum of a curve, every total): the sum of the magnitudes of all it adds. A tensor's row
    adds its bytes and subtracts them (``2 *``), a deferred gradient's stored bytes move twice more (``4 *``
    in all); a collective's payload is counted at most 8 times (the deferred all-reduce 4, a shared buffer
    2, the op's own transient 1, a recomputation's 1)."""
    rows = sum(sizes[k] for k in life.tensor.tolist())
    comms = sum(int(c.bytes) for cost in op_costs for c in cost.comms)
    return 4 * rows + 8 * comms


__all__ = ["CATEGORIES", "REMAT_POLICIES", "Lifetimes", "MemoryReport", "RematPlan", "lifetimes", "local_bytes_fn",
           "memory_profile", "remat_plan", "simulate", "transient_buffers"]
