"""Which communication hides behind compute: a two-resource schedule of one step.

A GPU or TPU runs collectives on their own streams (NCCL communicators, XLA's
asynchronous collectives) beside the compute stream; XLA on CPU runs them in
line (``Hardware.async_collectives`` False: nothing overlaps). What can
overlap depends on the collective, not on a tuned constant:

* **weight gathers** (all-gather or all-to-all of a parameter: FSDP/ZeRO-3)
  do not depend on the step's data: they are *prefetched* one block ahead
  (issued when the block before the one that needs them starts, as PyTorch
  FSDP's forward/backward prefetch and XLA's latency-hiding scheduler do; a
  block's backward pass includes the forward ops that remat or flash
  attention run again inside it);
  compute waits only if the gather is not done when its op starts;
* **gradient reductions** (all-reduce or reduce-scatter of a parameter
  gradient: data parallelism, FSDP) are *deferred*: issued when the gradient is
  produced, they run while the rest of the backward pass computes (DDP's
  gradient buckets, Li et al. 2020, VLDB); only the optimizer waits for them;
* **decomposed** (``Hardware.collective_matmul``, XLA on TPU): an all-gather
  of a matmul's activation operand or a reduce-scatter of its result
  (tensor/sequence parallelism) is split into ring steps interleaved with
  partial matmuls (Wang et al. 2023, "Overlap communication with dependent
  computation via decomposition in large deep learning models", ASPLOS): the
  op takes ``max(compute, communication)``;
* everything else is **critical**: tensor-parallel all-reduces of activations,
  activation reshards, normalization statistics, pipeline transfers — the next
  op needs the result, so compute waits for it (Megatron-LM runs them in line).

The schedule (:func:`schedule`): ops run one at a time on the compute stream
in the step's order, each holding it for its compute and its kernel launch
(``launch_s``, GPU); each group of mesh axes (a communicator) is one FIFO
stream. An op starts when the compute stream is free and its prefetched
weights have arrived; its critical collectives run after its compute and
block; its gradient reductions are queued on their stream and only the
optimizer (or the end of the step) waits for them. ``step_s`` is when the
last op ends; ``exposed`` communication is ``step_s - compute_s - launch_s``, the
rest of the communication is ``hidden``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from layoutsearch.ir.graph import Graph
from layoutsearch.ir.training import parameter_gradients

CLASSES = ("critical", "decomposed", "weight", "gradient")
"""How a collective overlaps (see the module docstring)."""


class _Collective(Protocol):
    kind: str
    axes: tuple[str, ...]
    seconds: float
    tensor: str


class _Op(Protocol):
    phase: str
    block: str | None
    compute_s: float
    launch_s: float
    collectives: tuple[Any, ...]
    matmul: bool
    output: str


@dataclass(frozen=True)
class Overlap:
    """The result of :func:`schedule`: step time, and communication exposed
    (on the critical path) and hidden, in total and by class (:data:`CLASSES`);
    ``launch_s``: the compute stream's kernel launches."""

    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    by_class: dict[str, dict[str, float]] = field(default_factory=dict)
    launch_s: float = 0.0

    @property
    def hidden_s(self) -> float:
        return self.comm_s - self.exposed_s

    def to_dict(self) -> dict[str, Any]:
        return {"exposed_s": self.exposed_s, "hidden_s": self.hidden_s,
                "by_class": {k: dict(v) for k, v in self.by_class.items()}}


def collective_classes(g: Graph) -> dict[str, str]:
    """Tensor name -> class for the tensors whose collectives are not critical: parameters
    (``weight``: gathers are prefetched) and parameter gradients (``gradient``: reductions deferred); derived
    once per graph object, a fresh dict each call."""
    from layoutsearch.costmodel.step import graph_cached

    def compute() -> dict[str, str]:
        out = {p.name: "weight" for p in g.parameters}
        out.update({t: "gradient" for t in parameter_gradients(g)})
        return out

    return dict(graph_cached(g, "collective classes", compute))


def classify(c: _Collective, classes: dict[str, str], op: _Op | None = None,
             collective_matmul: bool = False) -> str:
    """The class of one collective of ``op`` (see the module docstring)."""
    cls = classes.get(c.tensor)
    if cls == "weight" and c.kind in ("all-gather", "all-to-all", "collective-permute"):
        return "weight"
    if cls == "gradient" and c.kind in ("all-reduce", "reduce-scatter"):
        return "gradient"
    if collective_matmul and op is not None and op.matmul and (
            (c.kind == "all-gather" and c.tensor != op.output) or (c.kind == "reduce-scatter" and c.tensor == op.output)):
        return "decomposed"
    return "critical"


def collective_class(c: _Collective, classes: dict[str, str], op: _Op | None, async_collectives: bool,
                     collective_matmul: bool = False) -> str:
    """How collective ``c`` of ``op`` runs on a backend: its class (:func:`classify`) where collectives run
    asynchronously, else ``critical`` (in line, as XLA on CPU runs them)."""
    return classify(c, classes, op, collective_matmul) if async_collectives else "critical"


def once_per_step(c: _Collective, classes: dict[str, str]) -> bool:
    """Whether a collective runs once per step with gradient accumulation (a gradient all-reduce, after the
    last micro-batch), not once per micro-batch."""
    return c.kind == "all-reduce" and classify(c, classes) == "gradient"


_PASS = {"recompute": "backward"}
"""A block's recomputation runs within its backward pass (before and between its backward ops)."""


def _prefetch_points(ops: Sequence[_Op]) -> list[int]:
    """For each op, the index of the op at which its weight gathers are issued: the first op of the
    previous segment (a run of ops of one block and pass, recomputation counting as backward), i.e. one
    block ahead."""
    points: list[int] = []
    previous = current = 0  # the first ops of the previous segment and of the current one
    segment = None
    for i, op in enumerate(ops):
        key = (op.block, _PASS.get(op.phase, op.phase))
        if key != segment:
            if segment is not None:
                previous, current = current, i
            segment = key
        points.append(previous)
    return points


def schedule(ops: Sequence[_Op], classes: dict[str, str], async_collectives: bool = True,
             collective_matmul: bool = False) -> Overlap:
    """Simulate the step (see the module docstring); ``ops`` in schedule order, each with its
    ``compute_s``, ``launch_s``, ``matmul``, ``output`` and ``collectives`` (``kind``, ``axes``, ``seconds``,
    ``tensor``)."""
    compute = sum(op.compute_s for op in ops)
    launch = sum(op.launch_s for op in ops)
    comm = sum(c.seconds for op in ops for c in op.collectives)
    by_class = {k: {"seconds": 0.0, "exposed_s": 0.0} for k in CLASSES}
    kinds = [[collective_class(c, classes, op, async_collectives, collective_matmul) for c in op.collectives]
             if op.collectives else () for op in ops]
    issue: dict[int, list[tuple[int, _Collective]]] = defaultdict(list)
    points: list[int] | None = None
    for i, (op, ks) in enumerate(zip(ops, kinds, strict=True)):
        for c, k in zip(op.collectives, ks, strict=True):
            by_class[k]["seconds"] += c.seconds
            if k == "weight":
                points = points or _prefetch_points(ops)
                issue[points[i]].append((i, c))
    free: dict[tuple[str, ...], float] = defaultdict(float)
    ready: dict[int, float] = {}
    t = deferred = 0.0
    weight = decomposed = critical = gradient = 0.0  # exposed seconds per class
    waited_for_gradients = False
    for i, (op, ks) in enumerate(zip(ops, kinds, strict=True)):
        for target, c in issue.get(i, ()):
            start = max(t, free[c.axes])
            free[c.axes] = start + c.seconds
            ready[target] = max(ready.get(target, 0.0), start + c.seconds)
        if not waited_for_gradients and op.phase == "optimizer":
            gradient += max(0.0, deferred - t)
            t = max(t, deferred)
            waited_for_gradients = True
        r = ready.get(i, 0.0)
        if r > t:
            weight += r - t
            t = r
        busy = op.compute_s + op.launch_s
        end = t + busy
        if ks:
            for c, k in zip(op.collectives, ks, strict=True):
                if k == "decomposed":  # in ring steps beside the matmul's partial products
                    start = max(t, free[c.axes])
                    free[c.axes] = start + c.seconds
                    end = max(end, start + c.seconds)
        decomposed += max(0.0, end - t - busy)
        t = end
        if ks:
            for c, k in zip(op.collectives, ks, strict=True):
                if k in ("weight", "decomposed"):
                    continue  # issued at its prefetch point, or run beside the matmul
                start = max(t, free[c.axes])
                end = start + c.seconds
                free[c.axes] = end
                if k == "critical":
                    critical += end - t
                    t = end
                elif k == "gradient":
                    deferred = max(deferred, end)
    if not waited_for_gradients and deferred > t:
        gradient += deferred - t
        t = deferred
    for k, exposed in (("critical", critical), ("decomposed", decomposed), ("weight", weight),
                       ("gradient", gradient)):
        by_class[k]["exposed_s"] = exposed if abs(exposed) >= 1e-12 else 0.0  # (rounding residue of max chains)
    return Overlap(t, compute, comm, max(0.0, t - compute - launch), by_class, launch)


__all__ = ["CLASSES", "Overlap", "classify", "collective_class", "collective_classes", "once_per_step",
           "schedule"]
