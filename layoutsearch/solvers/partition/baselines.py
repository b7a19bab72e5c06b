"""Baselines a placement is compared with: equal split, one device, a human expert's split, a
PipeDream-style planner, local search.

Each is priced by the same definition as the optimum (:func:`~.instance.evaluate`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from layoutsearch.costdag import CostDAG
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.dp import DP, chain_assignment, lower_bound
from layoutsearch.solvers.partition.ideals import MAX_IDEALS, Ideals, TooManyIdeals
from layoutsearch.solvers.partition.instance import (
    STAGE,
    Instance,
    Kind,
    Partition,
    check_objective,
    compile_dag,
    evaluate,
    kinds_of,
    make_partition,
)
from layoutsearch.solvers.partition.local import LOCAL_TIME_LIMIT, local_search
from layoutsearch.solvers.partition.reduce import expand, reduce


def equal_split(dag: CostDAG, stages: int, *, objective: str = "throughput", microbatches: int = 1,
                by: str = "auto") -> Partition:
    """Equal numbers of layers per stage (``by="layers"``; nodes carry a ``layer``) or of nodes in
    topological order (``by="nodes"``); ``"auto"`` uses layers when every node has one and there are at
    least ``stages`` layers. Earlier stages take the remainder. One kind of identical stages."""
    check_objective(objective, microbatches)
    inst = compile_dag(dag, [Kind(STAGE, stages, None, False)])
    layers = [dag.node(name).layer for name in inst.names]
    if by == "auto":
        layered = all(layer is not None for layer in layers) and len(set(layers)) >= stages
        by = "layers" if layered else "nodes"
    if by == "layers":
        if any(layer is None for layer in layers):
            raise PartitionError("equal split by layers needs a 'layer' on every node")
        units = sorted(set(layers))  # type: ignore[type-var]
        key = [units.index(layer) for layer in layers]
    elif by == "nodes":
        units, key = list(range(inst.n)), list(range(inst.n))
    else:
        raise PartitionError(f"unknown split unit {by!r}; choose layers, nodes or auto")
    if stages < 1 or stages > len(units):
        raise PartitionError(f"cannot split {len(units)} {by} into {stages} non-empty stages")
    base, extra = divmod(len(units), stages)
    bounds = np.cumsum([base + (s < extra) for s in range(stages)])
    sigma = [int(np.searchsorted(bounds, u, side="right")) for u in key]
    return make_partition(inst, sigma, objective, microbatches, f"equal {by}", False, None, {})


def against_equal_split(dag: CostDAG, part: Partition) -> dict[str, Any]:
    """``part`` against :func:`equal_split` into as many stages under the same objective: the split's method,
    objective and largest stage memory, and ``optimal_over_baseline`` (``part``'s objective / the split's;
    None when the split's is 0)."""
    base = equal_split(dag, part.num_stages, objective=part.kind, microbatches=part.microbatches)
    return {"method": base.method, "objective": base.objective, "max_memory": max(base.memory),
            "optimal_over_baseline": part.objective / base.objective if base.objective else None}


def one_device(dag: CostDAG, objective: str, mb: int, stages: int | None = None,
               memory_limit: int | None = None) -> Partition | None:
    """Everything on the first device of the first kind that can run every node (None: no such kind),
    memory limit or not."""
    inst = compile_dag(dag, kinds_of(dag, stages, memory_limit))
    for k, kind in enumerate(inst.kinds):
        if kind.count and all(math.isfinite(t) for t in inst.time[k]):
            d = inst.device_kind.index(k)
            return make_partition(inst, [d] * inst.n, objective, mb, f"one {kind.name}", False, None, {}, check=False)
    return None


def read_expert(path: str | Path, dag: CostDAG) -> dict[str, tuple[str, int]]:
    """A human expert's split (Tarnawski et al.'s ``human-experts/*.json``: ``fpgas`` and ``cpus``, each a
    list of ``{"nodes": [ids]}``) as node name -> (device kind, index)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PartitionError(f"cannot read expert split {str(path)!r}: {e}") from None
    ids = dag.meta.get("node_ids") or {}
    by_id = {str(i): name for name, i in ids.items()}
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k, []), list) for k in ("fpgas", "cpus")):
        raise PartitionError(f"expert split {str(path)!r}: expected an object with 'fpgas' and 'cpus' lists")
    kinds = {"fpgas": dag.devices[0].name if dag.devices else STAGE,
             "cpus": dag.devices[1].name if len(dag.devices) > 1 else "cpu"}
    out: dict[str, tuple[str, int]] = {}
    for field, kind in kinds.items():
        for i, dev in enumerate(doc.get(field, [])):
            nodes = dev.get("nodes") if isinstance(dev, dict) else None
            if not isinstance(nodes, list):
                raise PartitionError(f"expert split {str(path)!r}: {field}[{i}] needs a 'nodes' list")
            for node in nodes:
                name = by_id.get(str(node), node if isinstance(node, str) else None)
                if name not in dag.index:
                    raise PartitionError(f"expert split {str(path)!r}: {field}[{i}] names unknown node {node!r}")
                if name in out:
                    raise PartitionError(f"expert split {str(path)!r}: node {node!r} is placed twice")
                out[name] = (kind, i)
    return out


def expert_split(dag: CostDAG, split: dict[str, tuple[str, int]], objective: str, mb: int,
                 stages: int | None = None, memory_limit: int | None = None) -> Partition:
    """Price an expert's split. Nodes it leaves out go with a neighbour it placed (the expert files omit some
    zero-time nodes); a split with more devices of a kind than there are, or placing a node where it cannot run,
    is refused."""
    inst = compile_dag(dag, kinds_of(dag, stages, memory_limit))
    offset = {k.name: sum(x.count for x in inst.kinds[:i]) for i, k in enumerate(inst.kinds)}
    count = {k.name: k.count for k in inst.kinds}
    place: dict[str, int] = {}
    for name, (kind, i) in split.items():
        if kind not in count or i >= count[kind]:
            raise PartitionError(f"the expert split uses {kind} {i}, but there are {count.get(kind, 0)} {kind} devices")
        place[name] = offset[kind] + i
    neighbours: dict[str, list[str]] = {n: [] for n in dag.names}
    for e in dag.edges:
        neighbours[e.src].append(e.dst)
        neighbours[e.dst].append(e.src)
    missing = [n for n in dag.names if n not in place]
    while missing:
        rest = []
        for n in missing:
            near = [place[m] for m in neighbours[n] if m in place]
            if near:
                place[n] = min(near)
            else:
                rest.append(n)
        if len(rest) == len(missing):
            raise PartitionError(f"the expert split leaves {len(rest)} node(s) without a placed neighbour, e.g. "
                                 f"{rest[0]!r}")
        missing = rest
    sigma = [place[inst.names[v]] for v in range(inst.n)]
    for v, d in enumerate(sigma):
        if math.isinf(inst.time[inst.device_kind[d]][v]):
            raise PartitionError(f"the expert split is infeasible: it places node {inst.names[v]!r} on "
                                 f"{inst.device_label(d)}, where it cannot run")
    return make_partition(inst, sigma, objective, mb, "human expert", False, None, {}, check=False)


def placement_baselines(dag: CostDAG, objective: str, mb: int, stages: int | None = None,
                        memory_limit: int | None = None, time_limit: float = LOCAL_TIME_LIMIT) -> list[Partition]:
    """The baselines of a DAG with device kinds, priced under ``objective``: one device (:func:`one_device`),
    equal split (equal node counts of the topological order on the first kind's devices, memory limit or
    not), PipeDream-style planner (the best split of the topological order into intervals for throughput,
    PipeDream's planner on a layer chain; needs the DP's down-closed sets) and local search (from the equal
    split when it is feasible, else from the PipeDream-style split; :mod:`.local`)."""
    check_objective(objective, mb)
    kinds = kinds_of(dag, stages, memory_limit)
    full = compile_dag(dag, kinds)
    out = [b for b in (one_device(dag, objective, mb, stages, memory_limit),) if b is not None]
    count = kinds[0].count
    if count >= 1 and all(math.isfinite(t) for t in full.time[0]):
        base, extra = divmod(full.n, count)
        bounds = np.cumsum([base + (s < extra) for s in range(count)])
        sigma = [int(np.searchsorted(bounds, v, side="right")) for v in range(full.n)]
        out.append(make_partition(full, sigma, objective, mb, "equal split", False, None, {}, check=False))
    try:
        inst = reduce(full, contiguous=True, at_most=True, microbatches=mb)
    except PartitionError:
        return out
    starts = []
    if len(out) > 1 and _fits(full, out[-1], mb):
        starts.append(("equal split", _reduced(full, inst, out[-1])))
    sigma_r = interval_split(inst, mb)
    if sigma_r is not None:
        out.append(make_partition(full, expand(full, inst, sigma_r), objective, mb, "PipeDream-style planner",
                                  False, None, {}))
        starts.append(("PipeDream-style planner", sigma_r))
    if starts and objective != "gpipe":
        name, start = starts[0]
        sigma_r = local_search(inst, start, objective, mb, True, time_limit)
        out.append(make_partition(full, expand(full, inst, sigma_r), objective, mb, f"local search (from {name})",
                                  False, None, {}))
    return out


def interval_split(inst: Instance, mb: int) -> list[int] | None:
    """The PipeDream-style split (unit -> device): the best split of the unit order into intervals for
    throughput (at most as many devices as there are); None when the DP's down-closed sets are too many or
    nothing fits."""
    try:
        ideals = Ideals(inst, MAX_IDEALS)
    except TooManyIdeals:
        return None
    prefixes = np.array([ideals.index[(1 << i) - 1] for i in range(inst.n + 1)])
    got = DP(inst, ideals, "throughput", mb, True, subset=prefixes).solve(lower_bound(inst))
    return None if got is None else chain_assignment(inst, ideals, got[1])


def _fits(full: Instance, part: Partition, mb: int) -> bool:
    """Whether a baseline honours memory limits, eligibility and co-location groups."""
    sigma = _sigma(full, part)
    _, mem = evaluate(full, sigma, "throughput", mb)
    groups: dict[str, int] = {}
    for v, d in enumerate(sigma):
        group = full.dag.node(full.names[v]).group
        if group is not None and groups.setdefault(group, d) != d:
            return False
    return all((full.kinds[full.device_kind[d]].limit is None or m <= full.kinds[full.device_kind[d]].limit)
               for d, m in enumerate(mem)) and all(math.isfinite(full.time[full.device_kind[d]][v])
                                                   for v, d in enumerate(sigma))


def _sigma(full: Instance, part: Partition) -> list[int]:
    labels = {full.device_label(d): d for d in range(full.num_devices)}
    device = {name: labels[label] for label, stage in zip(part.devices, part.stages, strict=True) for name in stage}
    return [device[name] for name in full.names]


def _reduced(full: Instance, inst: Instance, part: Partition) -> list[int]:
    sigma = _sigma(full, part)
    position = {members[0]: v for v, members in enumerate(full.members)}
    return [sigma[position[members[0]]] for members in inst.members]
