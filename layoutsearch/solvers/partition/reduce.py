"""Exact reductions of a placement problem before it is solved: fewer, larger units.

* **Co-location groups** become single units: every placement that honours them is a placement of the
  contracted problem with the same loads (a tensor inside a group never crosses a device boundary).
* **Cycles of the order graph** (contiguous placements only): nodes on a cycle of order edges share a
  device in every contiguous placement, so each strongly connected component becomes one unit.
* **Trivial units** (when at most, not exactly, ``K`` devices must be used): a unit with no time on any
  kind, eligible everywhere, no memory (or memory that can never bind: the whole DAG fits every device),
  and a single neighbour joins that neighbour. Moving it there
  removes its transfers and adds nothing, so no load, memory, device-graph edge or latency grows, and
  contiguity is kept; some optimum has it there. (Tarnawski et al.'s operator graphs hold hundreds of such
  nodes: weights, biases, reshapes.)

:func:`reduce` returns the contracted :class:`~.instance.Instance` with each unit's members; a solution
of it expands to the original nodes unit by unit.
"""

from __future__ import annotations

import math

import networkx as nx

from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition.instance import Instance
from layoutsearch.units import format_exact_bytes


class _Union:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[max(ra, rb)] = min(ra, rb)
        return True


def reduce(inst: Instance, *, contiguous: bool, at_most: bool, microbatches: int) -> Instance:
    """The contracted problem (see the module docstring); raises PartitionError when a group or a node can
    run on no device (eligibility, or memory beyond every device it may use)."""
    uf = _Union(inst.n)
    groups: dict[str, list[int]] = {}
    for v, m in enumerate(inst.members):
        label = inst.dag.nodes[m[0]].group
        if label is not None:
            groups.setdefault(label, []).append(v)
    for members in groups.values():
        for v in members[1:]:
            uf.union(members[0], v)
    _check_units(inst, uf, groups, microbatches, "")
    if contiguous:
        quotient = nx.DiGraph()
        quotient.add_nodes_from({uf.find(v) for v in range(inst.n)})
        quotient.add_edges_from((uf.find(u), uf.find(v)) for v in range(inst.n) for u in inst.preds[v]
                                if uf.find(u) != uf.find(v))
        for component in nx.strongly_connected_components(quotient):
            first, *rest = sorted(component)
            for u in rest:
                uf.union(first, u)
        _check_units(inst, uf, groups, microbatches, " (contiguous stages put these co-location groups, which "
                     "depend on each other both ways, on one device)")
    reduced = _contract(inst, uf)
    if at_most:
        while True:
            merged = _trivial(reduced)
            if merged is None:
                break
            reduced = _contract(reduced, merged)
    return reduced


def _check_units(inst: Instance, uf: _Union, groups: dict[str, list[int]], mb: int, why: str) -> None:
    units: dict[int, list[int]] = {}
    for v in range(inst.n):
        units.setdefault(uf.find(v), []).append(v)
    label = {v: g for g, members in groups.items() for v in members}
    for members in units.values():
        usable = [k for k, kind in enumerate(inst.kinds)
                  if kind.count > 0 and all(math.isfinite(inst.time[k][v]) for v in members)]
        names = [inst.names[v] for v in members]
        what = (f"node {names[0]!r}" if len(members) == 1 else
                f"co-location group {label[members[0]]!r} ({len(members)} nodes)" if not why else
                f"the nodes {names[:4]}{' ...' if len(names) > 4 else ''}")
        if not usable:
            runs = {inst.names[v]: [kind.name for k, kind in enumerate(inst.kinds) if kind.count > 0
                                    and math.isfinite(inst.time[k][v])] for v in members}
            if len(members) == 1:
                raise PartitionError(f"{what} can run on no device: it may run on "
                                     f"{', '.join(runs[names[0]]) or 'no kind'} with devices")
            detail = "; ".join(f"{n!r} on {', '.join(k) or 'nothing'}" for n, k in list(runs.items())[:4])
            raise PartitionError(f"{what} spans nodes that cannot share a device{why}: {detail}")
        need = sum(inst.fixed[v] + mb * inst.act[v] for v in members)
        limits = [inst.kinds[k].limit for k in usable]
        if all(lim is not None and need > lim for lim in limits):
            most = max(lim for lim in limits if lim is not None)
            raise PartitionError(f"{what} needs {format_exact_bytes(need)} of memory{why}, more than any device it "
                                 f"can run on holds ({format_exact_bytes(most)})")


def _contract(inst: Instance, uf: _Union) -> Instance:
    roots = sorted({uf.find(v) for v in range(inst.n)})
    quotient = nx.DiGraph()
    quotient.add_nodes_from(roots)
    quotient.add_edges_from((uf.find(u), uf.find(v)) for v in range(inst.n) for u in inst.preds[v]
                            if uf.find(u) != uf.find(v))
    # non-contiguous problems may merge groups that depend on each other both ways: any order then
    order = list(nx.lexicographical_topological_sort(quotient)) if nx.is_directed_acyclic_graph(quotient) else roots
    idx = {r: i for i, r in enumerate(order)}
    unit = [idx[uf.find(v)] for v in range(inst.n)]
    members: list[list[int]] = [[] for _ in order]
    for v in range(inst.n):
        members[unit[v]].append(v)
    time = [[math.fsum(t[v] for v in ms) for ms in members] for t in inst.time]
    fixed = [sum(inst.fixed[v] for v in ms) for ms in members]
    act = [sum(inst.act[v] for v in ms) for ms in members]
    tensors = []
    for src, cons, c in inst.tensors:
        s = unit[src]
        receivers = tuple(dict.fromkeys(unit[w] for w in cons if unit[w] != s))
        if receivers:
            tensors.append((s, receivers, c))
    preds = [tuple(idx[p] for p in quotient.predecessors(r)) for r in order]
    names = [inst.names[ms[0]] for ms in members]
    return Instance(names, [tuple(x for v in ms for x in inst.members[v]) for ms in members], time, fixed, act,
                    tensors, preds, inst.kinds, inst.dag)


def _trivial(inst: Instance) -> _Union | None:
    """A union of every trivial unit with its single neighbour (None when there is none)."""
    neighbours: list[set[int]] = [set() for _ in range(inst.n)]
    for src, cons, _ in inst.tensors:
        for w in cons:
            neighbours[src].add(w)
            neighbours[w].add(src)
    for v in range(inst.n):
        for u in inst.preds[v]:
            neighbours[u].add(v)
            neighbours[v].add(u)
    uf = _Union(inst.n)
    changed = False
    total = sum(inst.fixed)
    memory_free = not any(inst.act) and all(k.limit is None or total <= k.limit for k in inst.kinds)
    for v in range(inst.n):
        if (len(neighbours[v]) == 1 and (memory_free or (not inst.fixed[v] and not inst.act[v]))
                and all(t[v] == 0.0 for t in inst.time)):
            (w,) = neighbours[v]
            # both trivial and each other's only neighbour: merge once
            changed |= uf.union(v, w)
    return uf if changed else None


def expand(full: Instance, reduced: Instance, sigma: list[int]) -> list[int]:
    """An assignment of the units of ``reduced`` (a reduction of ``full``) as one of ``full``'s units."""
    unit_of = {x: u for u, members in enumerate(reduced.members) for x in members}
    return [sigma[unit_of[full.members[v][0]]] for v in range(full.n)]
