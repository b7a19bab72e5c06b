"""The cost DAG data model: :class:`DeviceKind`, :class:`Node`, :class:`Edge`, :class:`Tensor` and the
:class:`CostDAG` that holds them, validated on construction (the conventions are in :mod:`layoutsearch.costdag`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from layoutsearch.costdag.limits import MAX_BYTES, MAX_DEVICES, check_bytes, check_time, check_total
from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.tensor import is_label


@dataclass(frozen=True)
class DeviceKind:
    """``count`` devices of one kind: ``memory_bytes`` each (None: unlimited); ``host`` devices (CPU cores)
    work in the host's DRAM, through which the other devices exchange tensors, so they pay no transfer
    time (Tarnawski et al. 2020, Section 3)."""

    name: str
    count: int
    memory_bytes: int | None = None
    host: bool = False


@dataclass(frozen=True)
class Node:
    """One operator (or layer): its per-micro-batch forward+backward time and its memory."""

    name: str
    compute_s: float = 0.0
    memory_bytes: int = 0
    param_bytes: int = 0
    activation_bytes: int = 0
    layer: int | None = None
    """Optional layer index, used by :func:`~layoutsearch.solvers.partition.equal_split` (equal layers)."""
    times: Mapping[str, float] | None = None
    """Time per device kind; the node runs only on the kinds listed (None: ``compute_s`` on every kind)."""
    group: str | None = None
    """Co-location group: every node of a group goes to the same device."""
    backward: bool = False
    """A backward-pass node of a training graph."""

    def time_on(self, kind: str) -> float | None:
        """The node's time on a device of ``kind``, None when it cannot run there."""
        if self.times is None:
            return self.compute_s
        return self.times.get(kind)


@dataclass(frozen=True)
class Edge:
    """A tensor flowing from ``src`` to ``dst``; ``tensor`` distinguishes several outputs of one node."""

    src: str
    dst: str
    transfer_s: float = 0.0
    bytes: int = 0
    tensor: str | None = None


@dataclass(frozen=True)
class Tensor:
    """A value that crosses stage boundaries as a whole: one output of ``src`` and all its consumers."""

    src: str
    label: str | None
    consumers: tuple[str, ...]
    transfer_s: float
    bytes: int


@dataclass(frozen=True)
class CostDAG:
    """A validated DAG of :class:`Node` and :class:`Edge` (checked on construction)."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    name: str = "dag"
    meta: Mapping[str, Any] = field(default_factory=dict)
    devices: tuple[DeviceKind, ...] = ()
    """Device kinds of a placement problem (empty: a pipeline of identical stages, given by the caller)."""
    time_unit: str = "s"
    """The unit of every time in the DAG (``"s"``; any other label, e.g. ``"ms"`` or ``"unit"``, is printed as is)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "meta", dict(self.meta))
        object.__setattr__(self, "devices", tuple(self.devices))
        _validate(self)

    # -- structure ------------------------------------------------------------------------------------------------

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Node names in file order."""
        return tuple(n.name for n in self.nodes)

    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> position in :attr:`nodes`."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    def node(self, name: str) -> Node:
        try:
            return self.nodes[self.index[name]]
        except KeyError:
            raise CostDAGError(f"cost DAG {self.name!r} has no node {name!r}") from None

    @cached_property
    def predecessors(self) -> dict[str, tuple[str, ...]]:
        """Node name -> its distinct predecessors (sources of its in-edges)."""
        preds: dict[str, dict[str, None]] = {n: {} for n in self.names}
        for e in self.edges:
            preds[e.dst][e.src] = None
        return {n: tuple(p) for n, p in preds.items()}

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """The topological order that keeps file order wherever the edges allow (smallest file position first);
        the canonical order of the partitioner."""
        return _topological_order(self)

    @cached_property
    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors carried by the edges: one per (src, tensor label), consumers in edge order."""
        groups: dict[tuple[str, str | None], list[Edge]] = {}
        for e in self.edges:
            groups.setdefault((e.src, e.tensor), []).append(e)
        return tuple(Tensor(src, label, tuple(dict.fromkeys(e.dst for e in es)), es[0].transfer_s, es[0].bytes)
                     for (src, label), es in groups.items())

    def is_down_closed(self, names: Iterable[str]) -> bool:
        """Whether the set holds every predecessor of each of its nodes (an *ideal* of the DAG)."""
        s = set(names)
        return all(p in s for n in s for p in self.predecessors[n])

    def is_contiguous(self, names: Iterable[str]) -> bool:
        """Whether the set is convex: no path leaves it and comes back. Equivalently (Tarnawski et al. 2020,
        Fact 4.1) the set is ``I \\ J`` for down-closed sets ``J ⊆ I``: take ``I`` = the set plus its
        ancestors and ``J = I`` minus the set."""
        s = set(names)
        closure: set[str] = set()
        stack = list(s)
        while stack:
            for p in self.predecessors[stack.pop()]:
                if p not in closure:
                    closure.add(p)
                    stack.append(p)
        return self.is_down_closed(closure - s)

    # -- JSON -----------------------------------------------------------------------------------------------------

    @property
    def is_placement(self) -> bool:
        """Whether the DAG uses a version-2 feature (device kinds, per-kind times, groups, backward marks)."""
        return bool(self.devices) or self.time_unit != "s" or any(
            n.times is not None or n.group is not None or n.backward for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``docs/costdag.md`` (optional fields only when set; version 1 unless a
        version-2 feature is used): :func:`~layoutsearch.costdag.jsonformat.costdag_to_dict`."""
        from layoutsearch.costdag.jsonformat import costdag_to_dict

        return costdag_to_dict(self)

    def save(self, path: str | Path) -> None:
        """Write the DAG as a JSON file (:func:`~layoutsearch.costdag.jsonformat.save_costdag`)."""
        from layoutsearch.costdag.jsonformat import save_costdag

        save_costdag(self, path)


# -- validation -----------------------------------------------------------------------------------------------------

def _validate(dag: CostDAG) -> None:
    if not isinstance(dag.name, str):
        raise CostDAGError(f"a cost DAG's name must be a string, got {short_repr(dag.name)}")
    where = f"cost DAG {dag.name!r}"
    if not dag.nodes:
        raise CostDAGError(f"{where} has no nodes")
    if not is_label(dag.time_unit):
        raise CostDAGError(f"{where}: time_unit must be a non-empty string, got {short_repr(dag.time_unit)}")
    kinds = _validate_devices(dag.devices, where)
    seen: set[str] = set()
    for n in dag.nodes:
        if not isinstance(n, Node):
            raise CostDAGError(f"{where}: nodes must be Node objects, got {type(n).__name__}")
        if not is_label(n.name):
            raise CostDAGError(f"{where}: node names must be non-empty strings of printable characters, got "
                               f"{short_repr(n.name)}")
        if n.name in seen:
            raise CostDAGError(f"{where}: duplicate node name {n.name!r}")
        seen.add(n.name)
        _validate_node(n, f"{where}: node {n.name!r}", kinds)
    keys: set[tuple[str, str, str | None]] = set()
    tensors: dict[tuple[str, str | None], Edge] = {}
    for e in dag.edges:
        if not isinstance(e, Edge):
            raise CostDAGError(f"{where}: edges must be Edge objects, got {type(e).__name__}")
        for end in (e.src, e.dst):
            if not isinstance(end, str):
                raise CostDAGError(f"{where}: an edge's src and dst must be node names (strings), got "
                                   f"{short_repr(end)}")
        what = f"{where}: edge {e.src!r} -> {e.dst!r}"
        for end in (e.src, e.dst):
            if end not in seen:
                raise CostDAGError(f"{what}: unknown node {end!r} (declare it in 'nodes')")
        if e.src == e.dst:
            raise CostDAGError(f"{what}: an edge from a node to itself")
        check_time(e.transfer_s, f"{what}: transfer_s")
        check_bytes(e.bytes, f"{what}: bytes")
        if e.tensor is not None and not is_label(e.tensor):
            raise CostDAGError(f"{what}: tensor must be a non-empty string, got {short_repr(e.tensor)}")
        if (e.src, e.dst, e.tensor) in keys:
            raise CostDAGError(f"{what}: duplicate edge" + (f" for tensor {e.tensor!r}" if e.tensor else ""))
        keys.add((e.src, e.dst, e.tensor))
        first = tensors.setdefault((e.src, e.tensor), e)
        if (first.transfer_s, first.bytes) != (e.transfer_s, e.bytes):
            label = f"tensor {e.tensor!r} of {e.src!r}" if e.tensor else f"the output of {e.src!r}"
            raise CostDAGError(
                f"{what}: {label} has transfer_s={e.transfer_s}, bytes={e.bytes} but its edge to {first.dst!r} "
                f"has transfer_s={first.transfer_s}, bytes={first.bytes}; edges of one tensor must agree "
                "(give different outputs different 'tensor' labels)")
    for f in ("memory_bytes", "param_bytes", "activation_bytes"):
        check_total(sum(getattr(n, f) for n in dag.nodes), f"{where}: the nodes' {f}")
    check_total(sum(e.bytes for e in dag.edges), f"{where}: the edges' bytes")
    import networkx as nx  # (imported where a DAG is checked: a command pricing none starts without it)

    graph = nx.DiGraph()
    graph.add_edges_from((e.src, e.dst) for e in dag.edges)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = [u for u, _ in nx.find_cycle(graph)]
        raise CostDAGError(f"{where} has a cycle: {' -> '.join(cycle + cycle[:1])}")


def _validate_devices(devices: tuple[DeviceKind, ...], where: str) -> set[str]:
    names: set[str] = set()
    for k in devices:
        if not isinstance(k, DeviceKind):
            raise CostDAGError(f"{where}: devices must be DeviceKind objects, got {type(k).__name__}")
        if not is_label(k.name) or k.name in names:
            raise CostDAGError(f"{where}: device kind names must be distinct non-empty strings, got {short_repr(k.name)}")
        names.add(k.name)
        if isinstance(k.count, bool) or not isinstance(k.count, int) or not 0 <= k.count <= MAX_DEVICES:
            raise CostDAGError(f"{where}: device kind {k.name!r}: count must be an integer from 0 to {MAX_DEVICES}, "
                               f"got {short_repr(k.count)}")
        if k.memory_bytes is not None:
            check_bytes(k.memory_bytes, f"{where}: device kind {k.name!r}: memory_bytes")
        if not isinstance(k.host, bool):
            raise CostDAGError(f"{where}: device kind {k.name!r}: host must be true or false")
    return names


def _validate_node(n: Node, where: str, kinds: set[str]) -> None:
    if n.times is None:
        check_time(n.compute_s, f"{where}: compute_s")
    else:
        if not isinstance(n.times, Mapping) or not n.times:
            raise CostDAGError(f"{where}: times must be a non-empty object device kind -> seconds")
        if n.compute_s:
            raise CostDAGError(f"{where}: give compute_s or times, not both")
        for kind, t in n.times.items():
            if kinds and kind not in kinds:
                raise CostDAGError(f"{where}: times names unknown device kind {short_repr(kind)} "
                                   f"(known: {', '.join(sorted(kinds))})")
            check_time(t, f"{where}: times[{kind!r}]")
    for f in ("memory_bytes", "param_bytes", "activation_bytes"):
        check_bytes(getattr(n, f), f"{where}: {f}")
    if n.layer is not None and (not isinstance(n.layer, int) or isinstance(n.layer, bool) or abs(n.layer) > MAX_BYTES):
        raise CostDAGError(f"{where}: layer must be an integer, got {short_repr(n.layer)}")
    if n.group is not None and not is_label(n.group):
        raise CostDAGError(f"{where}: group must be a non-empty string, got {short_repr(n.group)}")
    if not isinstance(n.backward, bool):
        raise CostDAGError(f"{where}: backward must be true or false, got {short_repr(n.backward)}")


def _topological_order(dag: CostDAG) -> tuple[str, ...]:
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(dag.names)
    graph.add_edges_from((e.src, e.dst) for e in dag.edges)
    return tuple(nx.lexicographical_topological_sort(graph, key=dag.index.__getitem__))

