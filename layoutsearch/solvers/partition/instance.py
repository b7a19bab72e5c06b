"""The partitioning problem compiled to integer indices, and the one definition of its objectives.

Devices come in kinds (:class:`~layoutsearch.costdag.DeviceKind`): ``count`` devices each, an optional
memory limit, and ``host`` devices (CPU cores) that pay no transfer time. A pipeline of identical stages
is one kind. An assignment ``sigma`` maps every unit (a node, or after :func:`reduce` a contracted group
of nodes) to a device index; devices are numbered kind by kind.

Objectives (Tarnawski et al. 2020, Sections 3 and 5; Huang et al. 2019):

* ``throughput`` (max load): a device's load is the time of its nodes on its kind plus, unless it is a
  host, the transfer time of every tensor crossing its boundary, paid by the sending device and by each
  receiving device (accelerators exchange tensors through host DRAM: the sender writes, each receiver
  reads); the objective is the largest load, the time per sample in a pipeline.
* ``latency`` (no pipelining; contiguous placements): a device starts when every device it receives from
  has finished, then works for its load; the objective is the end-to-end time of one sample, the longest
  path through the device graph weighted by the loads.
* ``latency``, non-contiguous (a device may hold several disconnected pieces of the graph): the latency
  of a *schedule* at node level (P|prec,c_ij|Cmax): every node runs on its device for its time on that
  device's kind, a device runs one node at a time (a node of time 0 takes no device time), and a node
  starts once each predecessor ``u`` has finished plus, when ``u`` is on another device, the edge's
  transfer delay: the transfer time of every tensor ``u`` sends it, paid once by the sender and once by the
  receiver unless a host (accelerator to accelerator ``2c`` through host DRAM, accelerator to CPU core or
  back ``c``, between CPU cores 0: the charges of the loads above, as delays instead of device work).
  The latency is the makespan; a placement comes with each device's order of its nodes, and
  :func:`schedule_makespan` recomputes it from (assignment, order) alone. For a contiguous placement the
  schedule that runs each device's nodes in topological order finishes no later than the device-graph
  latency above (each device can receive everything first, compute, then send: every edge's delay fits in
  the loads), so the schedule latency is at most the contiguous one, and may be less (devices on parallel
  branches, transfers that overlap other work).
* ``gpipe`` (one kind of identical stages): ``(M + K - 1) * max_k t_k`` where ``t_k`` is stage ``k``'s
  compute plus its point-to-point transfers over the stage axis, a tensor skipping stages relayed by
  every stage in between.

Contiguity: the devices can be ordered so that every *order edge* goes forward. In a training graph the
backward pass visits the stages in reverse, and a backward node co-located with a forward node (by its
group: Tarnawski et al.'s ``colorClass``) goes where that forward node goes. So the order edges are
every edge except those between two such backward nodes, an edge between backward nodes (drawn in the
direction of the backward pass's data flow) reversed: contiguity is that of the forward pass, and the
backward nodes of no such group follow it. (Tarnawski et al.'s layer graphs tie every backward node;
their operator graphs leave a few, near the loss and the gradient accumulations, untied.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import networkx as nx

from layoutsearch.costdag import MAX_DEVICES, CostDAG, DeviceKind
from layoutsearch.errors import PartitionError
from layoutsearch.gantt import bubble_fraction
from layoutsearch.units import format_exact_bytes

OBJECTIVES = ("throughput", "latency", "gpipe")
STAGE = "stage"
"""The device kind of a pipeline of identical stages (a cost DAG without device kinds)."""


@dataclass(frozen=True)
class Partition:
    """Nodes on devices and what it costs.

    ``stages`` lists the node names of every *used* device in device order (pipeline order for contiguous
    placements), ``devices`` the device of each (``"accelerator 0"``, ``"cpu 0"``, ``"stage 2"``);
    ``loads`` are per-device loads (throughput, latency) or per-micro-batch stage times (GPipe);
    ``objective`` is the largest load, the latency, or the GPipe step time; ``gap`` is the relative gap to a
    proven lower bound (0 when optimal, None when unknown).
    """

    stages: tuple[tuple[str, ...], ...]
    loads: tuple[float, ...]
    memory: tuple[float, ...]
    objective: float
    method: str
    optimal: bool
    gap: float | None
    kind: str = "throughput"
    microbatches: int = 1
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)
    devices: tuple[str, ...] = ()

    @property
    def num_stages(self) -> int:
        """The number of devices used."""
        return len(self.stages)

    @property
    def assignment(self) -> dict[str, int]:
        """Node name -> stage index."""
        return {n: k for k, s in enumerate(self.stages) for n in s}

    @property
    def bubble_fraction(self) -> float:
        """GPipe's idle fraction ``(K - 1) / (M + K - 1)`` (with equal stage times)."""
        return bubble_fraction(self.num_stages, self.microbatches)

    def to_dict(self) -> dict[str, Any]:
        """The partition as JSON-ready data."""
        d: dict[str, Any] = {
            "objective_kind": self.kind, "objective": self.objective, "microbatches": self.microbatches,
            "method": self.method, "optimal": self.optimal, "gap": self.gap,
            "stages": [{"nodes": list(s), "load": ld, "memory": mem} | ({"device": dev} if dev else {})
                       for s, ld, mem, dev in zip(self.stages, self.loads, self.memory,
                                                  self.devices or ("",) * len(self.stages), strict=True)],
        }
        if self.kind == "gpipe":
            d["bubble_fraction"] = self.bubble_fraction
        if self.info:
            d["info"] = dict(self.info)
        return d


class StageCosts(NamedTuple):
    """What :func:`stage_loads` returns."""

    loads: tuple[float, ...]
    memory: tuple[int, ...]
    objective: float


@dataclass(frozen=True)
class Kind:
    """A device kind as the solvers see it."""

    name: str
    count: int
    limit: int | None
    host: bool


class Instance:
    """Units (nodes, or contracted groups of nodes) in a topological order of the order graph, their time on
    each kind (``inf``: not eligible), memory, tensors, order edges and dependency edges; the device kinds."""

    def __init__(self, names: Sequence[str], members: Sequence[tuple[int, ...]], time: Sequence[Sequence[float]],
                 fixed: Sequence[int], act: Sequence[int], tensors: Sequence[tuple[int, tuple[int, ...], float]],
                 order_preds: Sequence[tuple[int, ...]], kinds: Sequence[Kind], dag: CostDAG) -> None:
        self.names, self.members, self.dag = tuple(names), tuple(members), dag
        self.n = len(self.names)
        self.time = [list(t) for t in time]
        self.fixed, self.act = list(fixed), list(act)
        self.tensors = list(tensors)
        self.preds = [tuple(p) for p in order_preds]
        succs: list[list[int]] = [[] for _ in range(self.n)]
        for v, ps in enumerate(self.preds):
            for u in ps:
                succs[u].append(v)
        self.succs = [tuple(s) for s in succs]
        self.kinds = list(kinds)
        self.device_kind = [k for k, kind in enumerate(self.kinds) for _ in range(kind.count)]
        self.device_index = [i for kind in self.kinds for i in range(kind.count)]
        self.num_devices = len(self.device_kind)

    @property
    def comp(self) -> list[float]:
        """The units' time on the first kind (a pipeline's compute)."""
        return self.time[0]

    def memw(self, microbatches: int) -> list[int]:
        """Per-unit memory with ``microbatches`` micro-batches of activations in flight."""
        return [f + microbatches * a for f, a in zip(self.fixed, self.act, strict=True)]

    def key(self) -> list[float]:
        """Per-unit lower bound of its time on any kind it may run on."""
        return [min(t[v] for t in self.time) for v in range(self.n)]

    def device_label(self, d: int) -> str:
        """``"accelerator 2"``."""
        return f"{self.kinds[self.device_kind[d]].name} {self.device_index[d]}"


def compile_dag(dag: CostDAG, kinds: Sequence[Kind]) -> Instance:
    """Every node its own unit, in the canonical order (a topological order of the order graph that keeps
    file order wherever the edges allow; nodes on a cycle of order edges, which contiguous placements put
    on one device, follow each other in file order)."""
    pos = dag.index
    order_graph = nx.DiGraph()
    order_graph.add_nodes_from(dag.names)
    order_graph.add_edges_from(order_edges(dag))
    if not any(n.backward for n in dag.nodes):
        names = dag.topological_order
    elif nx.is_directed_acyclic_graph(order_graph):
        names = tuple(nx.lexicographical_topological_sort(order_graph, key=pos.__getitem__))
    else:
        cond = nx.condensation(order_graph)
        members = {c: sorted(cond.nodes[c]["members"], key=pos.__getitem__) for c in cond}
        names = tuple(name for c in nx.lexicographical_topological_sort(cond, key=lambda c: pos[members[c][0]])
                      for name in members[c])
    idx = {name: i for i, name in enumerate(names)}
    nodes = [dag.node(name) for name in names]
    time = [[_time(n.time_on(k.name)) for n in nodes] for k in kinds]
    tensors = [(idx[t.src], tuple(idx[c] for c in t.consumers), t.transfer_s) for t in dag.tensors]
    preds = [tuple(idx[p] for p in order_graph.predecessors(name)) for name in names]
    return Instance(names, [(dag.index[name],) for name in names], time, [n.memory_bytes for n in nodes],
                    [n.activation_bytes for n in nodes], tensors, preds, kinds, dag)


def _time(t: float | None) -> float:
    return math.inf if t is None else float(t)


def order_edges(dag: CostDAG) -> list[tuple[str, str]]:
    """The order edges: every edge but those between two backward nodes co-located with forward nodes;
    an edge between backward nodes reversed (see the module docstring)."""
    anchors = {n.group for n in dag.nodes if not n.backward and n.group is not None}
    tied = {n.name for n in dag.nodes if n.backward and n.group in anchors}
    backward = {n.name for n in dag.nodes if n.backward}
    return list(dict.fromkeys((e.dst, e.src) if e.src in backward and e.dst in backward else (e.src, e.dst)
                              for e in dag.edges if not (e.src in tied and e.dst in tied)))


# -- the objectives (one definition for every method) ----------------------------------------------------------------

def evaluate(inst: Instance, sigma: Sequence[int], objective: str, microbatches: int) -> tuple[list[float], list[int]]:
    """Per-device loads and memory of the assignment ``sigma`` (unit -> device)."""
    nd = inst.num_devices
    loads = [0.0] * nd
    mem = [0] * nd
    for v, d in enumerate(sigma):
        loads[d] += inst.time[inst.device_kind[d]][v]
        mem[d] += inst.fixed[v] + microbatches * inst.act[v]
    host = [inst.kinds[inst.device_kind[d]].host for d in range(nd)]
    for src, cons, c in inst.tensors:
        s = sigma[src]
        receivers = {sigma[w] for w in cons}
        receivers.discard(s)
        if not receivers:
            continue
        if objective == "gpipe":
            lo, hi = min(receivers), max(receivers)
            if lo < s:
                w = next(w for w in cons if sigma[w] == lo)
                raise PartitionError(
                    f"the gpipe objective needs stages in pipeline order, but edge {inst.names[src]!r} -> "
                    f"{inst.names[w]!r} goes from stage {s} back to stage {lo}")
            loads[s] += c
            for j in range(s + 1, hi):
                loads[j] += 2 * c
            loads[hi] += c
        else:
            if not host[s]:
                loads[s] += c
            for r in receivers:
                if not host[r]:
                    loads[r] += c
    return loads, mem


def value(inst: Instance, sigma: Sequence[int], loads: Sequence[float], objective: str, microbatches: int) -> float:
    """The objective of an assignment from its loads."""
    used = sorted(set(sigma))
    if objective == "gpipe":
        return (microbatches + len(used) - 1) * max(loads)
    if objective == "throughput":
        return max(loads)
    graph = nx.DiGraph()
    graph.add_nodes_from(used)
    graph.add_edges_from((sigma[src], sigma[w]) for src, cons, _ in inst.tensors for w in cons
                         if sigma[w] != sigma[src])
    if not nx.is_directed_acyclic_graph(graph):
        raise PartitionError("the latency objective needs contiguous stages: this placement's devices depend on "
                             "each other in a cycle")
    finish: dict[int, float] = {}
    for d in nx.topological_sort(graph):
        finish[d] = max((finish[p] for p in graph.predecessors(d)), default=0.0) + loads[d]
    return max(finish.values())


def edge_delays(inst: Instance) -> dict[tuple[int, int], float]:
    """Per dependency ``(u, w)``: the transfer time of the tensors ``u`` sends ``w`` (summed over tensors)."""
    out: dict[tuple[int, int], float] = {}
    for src, cons, c in inst.tensors:
        for w in dict.fromkeys(cons):
            if w != src:
                out[(src, w)] = out.get((src, w), 0.0) + c
    return out


def schedule_makespan(inst: Instance, sigma: Sequence[int], order: Sequence[Sequence[int]]
                      ) -> tuple[float, list[float]]:
    """The non-contiguous latency (module docstring) of the assignment ``sigma`` (unit -> device) with
    ``order[d]``, the units of device ``d`` in the order it runs them: every unit starts as early as its
    predecessors (finish plus the edge's delay when on another device) and, unless its time there is 0, its
    device (free after the previous unit of positive time in the order) allow. Returns the makespan and every
    unit's start; raises PartitionError when the orders contradict the dependencies or the assignment."""
    n, nd = inst.n, inst.num_devices
    if len(order) != nd or sorted(v for d in range(nd) for v in order[d]) != list(range(n)):
        raise PartitionError("a schedule must list every node once, on the devices there are")
    if any(sigma[v] != d for d in range(nd) for v in order[d]):
        raise PartitionError("a schedule lists a node on a device it is not assigned to")
    host = [inst.kinds[k].host for k in inst.device_kind]
    delays = edge_delays(inst)
    dur = [inst.time[inst.device_kind[sigma[v]]][v] for v in range(n)]
    queue = [[v for v in order[d] if dur[v] > 0] for d in range(nd)]
    head, free = [0] * nd, [0.0] * nd
    missing = [len(set(inst.preds[v])) for v in range(n)]
    ready, start, finish = [0.0] * n, [0.0] * n, [0.0] * n
    todo = [v for v in range(n) if not missing[v]]
    placed = [False] * n
    done = 0
    while todo:
        v = todo.pop()
        d = sigma[v]
        if placed[v]:
            continue
        if dur[v] > 0:
            if queue[d][head[d]] != v:
                continue  # not its turn: its device's earlier unit will bring it back
            start[v] = max(ready[v], free[d])
            free[d] = finish[v] = start[v] + dur[v]
            head[d] += 1
            if head[d] < len(queue[d]) and not missing[queue[d][head[d]]]:
                todo.append(queue[d][head[d]])
        else:
            start[v] = finish[v] = ready[v]
        placed[v] = True
        done += 1
        for w in inst.succs[v]:
            hop = 0.0
            if sigma[w] != d:
                c = delays.get((v, w), 0.0)
                hop = c * ((not host[d]) + (not host[sigma[w]]))
            ready[w] = max(ready[w], finish[v] + hop)
            missing[w] -= 1
            if not missing[w]:
                todo.append(w)
    if done < n:
        raise PartitionError("a schedule's device orders contradict the dependencies (a node waits for one its "
                             "device runs later)")
    return max(finish, default=0.0), start


def stage_loads(dag: CostDAG, assignment: Mapping[str, int] | Sequence[Sequence[str]],
                objective: str = "throughput", microbatches: int = 1) -> StageCosts:
    """Per-stage loads, memory and the objective value of an assignment of nodes to stages of a pipeline
    of identical stages (every node's ``compute_s``; device kinds of the DAG ignored).

    ``assignment`` maps every node to a stage index ``0..K-1`` (``K`` = the largest index + 1), or lists
    the stages' node names in stage order. This is the one definition of the objectives (see the module
    docstring) that every method's result is priced by.
    """
    check_objective(objective, microbatches)
    if not isinstance(assignment, Mapping):
        stages = [list(stage) for stage in assignment]
        assignment = {name: k for k, stage in enumerate(stages) for name in stage}
        if len(assignment) != sum(map(len, stages)):
            raise PartitionError("a node appears in two stages")
        if any(not stage for stage in stages):
            raise PartitionError("a stage is empty")
    missing = [n for n in dag.names if n not in assignment]
    unknown = [n for n in assignment if n not in dag.index]
    if unknown:
        raise PartitionError(f"assignment names unknown node(s) {unknown[:5]}")
    if missing:
        raise PartitionError(f"assignment leaves node(s) {missing[:5]} without a stage")
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in assignment.values()):
        raise PartitionError("stage indices must be integers >= 0")
    k = max(assignment.values()) + 1
    inst = compile_dag(dag, [Kind(STAGE, k, None, False)])
    sigma = [assignment[dag.names[m[0]]] for m in inst.members]
    loads, mem = evaluate(inst, sigma, objective, microbatches)
    return StageCosts(tuple(loads), tuple(mem), value(inst, sigma, loads, objective, microbatches))


MAX_MICROBATCHES = 65536
"""The most micro-batches of a step: far beyond any pipeline run (hundreds), and the schedule grid drawn for a
GPipe step is ``M + K - 1`` wide."""


def check_objective(objective: str, microbatches: int) -> None:
    """Raise PartitionError for an unknown objective or a bad micro-batch count."""
    if objective not in OBJECTIVES:
        raise PartitionError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or not 1 <= microbatches <= MAX_MICROBATCHES:
        raise PartitionError(f"microbatches must be an integer from 1 to {MAX_MICROBATCHES}, got {microbatches!r}")


def make_partition(inst: Instance, sigma: Sequence[int], objective: str, mb: int, method: str, optimal: bool,
                   gap: float | None, info: Mapping[str, Any], check: bool = True,
                   order: Sequence[Sequence[int]] | None = None) -> Partition:
    """Price ``sigma`` (every node its own unit: ``inst`` is the compiled DAG) and list its used devices in
    device order (several kinds: in the order of their first unit). ``check``: assert that the solver's
    placement honours memory limits and eligibility (baselines are priced as they are). ``order`` (latency
    only): each device's units in the order it runs them, a non-contiguous latency schedule: the objective is
    then its makespan (:func:`schedule_makespan`), the stages list their nodes in that order, the loads are
    the devices' busy times (their nodes' times; transfers are delays, not work) and ``info["start_times"]``
    the nodes' starts, stage by stage."""
    loads, mem = evaluate(inst, sigma, objective, mb)
    starts: list[float] = []
    if order is not None:
        if objective != "latency":
            raise ValueError("a schedule prices the latency objective only")
        total, starts = schedule_makespan(inst, sigma, order)
        loads = [math.fsum(inst.time[inst.device_kind[d]][v] for v in order[d]) for d in range(inst.num_devices)]
    for d, m in enumerate(mem if check else ()):
        limit = inst.kinds[inst.device_kind[d]].limit
        if limit is not None and m > limit:
            raise AssertionError(f"{method} returned a placement over the memory limit of {inst.device_label(d)}")
    for v, d in enumerate(sigma if check else ()):
        if math.isinf(inst.time[inst.device_kind[d]][v]):
            raise AssertionError(f"{method} placed {inst.names[v]!r} on {inst.device_label(d)}, where it cannot run")
    used = sorted(set(sigma), key=lambda d: (min(v for v, s in enumerate(sigma) if s == d), d))
    if objective == "gpipe" or len(inst.kinds) == 1:
        used = sorted(set(sigma))
    names = inst.dag.names
    runs = [list(order[d]) if order is not None else [v for v in range(inst.n) if sigma[v] == d] for d in used]
    stages = tuple(tuple(names[inst.members[v][0]] for v in run) for run in runs)
    if order is not None:
        info = dict(info) | {"start_times": [[starts[v] for v in run] for run in runs]}
    else:
        total = value(inst, sigma, loads, objective, mb)
    return Partition(stages, tuple(loads[d] for d in used), tuple(mem[d] for d in used),
                     total, method, optimal, gap, objective, mb, dict(info),
                     tuple(inst.device_label(d) for d in used) if inst.kinds[0].name != STAGE else ())


def memory_message(dag: CostDAG, k: int, mb: int, limit: int, best: int, exact: bool, culprit: str = "") -> str:
    """The error of an infeasible memory limit, naming the smallest achievable largest-stage memory."""
    why = f" (node {culprit!r} alone needs that much)" if culprit else ""
    what = "is" if exact else "is at least"
    per_mb = f" with {mb} micro-batches in flight" if mb > 1 else ""
    return (f"no partition of cost DAG {dag.name!r} into {k} stages fits the memory limit of "
            f"{format_exact_bytes(limit)}{per_mb}: the smallest achievable largest-stage memory {what} "
            f"{format_exact_bytes(best)}{why}; raise the limit, use more stages or fewer micro-batches")


def kinds_of(dag: CostDAG, stages: int | None, memory_limit: int | None) -> list[Kind]:
    """The device kinds: the DAG's (``stages`` and ``memory_limit`` override its first kind's count and
    limit), or ``stages`` identical stages (at most :data:`~layoutsearch.costdag.MAX_DEVICES`)."""
    if stages is not None and stages > MAX_DEVICES:
        raise PartitionError(f"at most {MAX_DEVICES} stages (devices of one kind), got {stages:,}")
    if dag.devices:
        first, rest = dag.devices[0], dag.devices[1:]
        first = DeviceKind(first.name, first.count if stages is None else stages,
                           first.memory_bytes if memory_limit is None else memory_limit, first.host)
        return [Kind(k.name, k.count, k.memory_bytes, k.host) for k in (first, *rest)]
    if stages is None:
        raise PartitionError(f"cost DAG {dag.name!r} names no devices: give the number of stages")
    return [Kind(STAGE, stages, memory_limit, False)]
