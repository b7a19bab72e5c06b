"""An abstract cost DAG: what a pipeline partitioner needs to know about a model, and nothing else.

A :class:`CostDAG` has nodes (operators or layers) with a compute time and a memory footprint, and edges
(tensors flowing between them) with a transfer time. It can come from a named-dim graph under a layout or
from a profiler elsewhere; the partitioner (:mod:`layoutsearch.solvers.partition`) does not care which.
The JSON format is documented in ``docs/costdag.md``; files are data, parsed with :mod:`json` and checked
field by field, never evaluated.

Conventions (the partitioner's objectives rely on them):

* ``compute_s``: forward + backward time of the node for one micro-batch, in seconds.
* ``memory_bytes``: bytes the node keeps on its stage independently of micro-batching (parameters,
  gradients, optimizer state, workspace); ``param_bytes``: the parameter part of it (informational);
  ``activation_bytes``: bytes stashed per micro-batch in flight, so a stage holding ``M`` micro-batches
  needs ``sum(memory_bytes) + M * sum(activation_bytes)``.
* An edge carries a tensor from ``src`` to ``dst``; ``transfer_s`` is the time to move it between two
  stages for one micro-batch (activation forward plus gradient backward). Edges from one ``src`` carry
  the *same* tensor (the node's output) unless they name different ``tensor`` labels; the edges of one
  tensor must agree on ``transfer_s`` and ``bytes``. A tensor is sent once per stage boundary, however
  many consumers it has on the other side.

Version 2 (device placement, Tarnawski et al. 2020) adds, all optional: **device kinds** (``devices``:
accelerators with a memory limit, CPU cores without, each with a count), a node's time **per device
kind** (``times``; a node runs only on the kinds it lists: eligibility), **co-location groups**
(``group``: nodes of one group share a device), **backward marks** (``backward``: training graphs) and the
``time_unit`` of the numbers. :func:`read_tarnawski` reads the paper's own instance files.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx

from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.strictjson import check_tree, dumps, loads, read_text
from layoutsearch.ir.tensor import is_label

FORMAT = "layoutsearch.costdag"
VERSION = 2
VERSIONS = (1, 2)


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
    def successors(self) -> dict[str, tuple[str, ...]]:
        """Node name -> its distinct successors."""
        succs: dict[str, dict[str, None]] = {n: {} for n in self.names}
        for e in self.edges:
            succs[e.src][e.dst] = None
        return {n: tuple(s) for n, s in succs.items()}

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
        version-2 feature is used)."""
        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {"name": n.name}
            if n.times is None:
                d["compute_s"] = n.compute_s
            else:
                d["times"] = dict(n.times)
            d["memory_bytes"] = n.memory_bytes
            for f in ("param_bytes", "activation_bytes", "backward"):
                if getattr(n, f):
                    d[f] = getattr(n, f)
            for f in ("layer", "group"):
                if getattr(n, f) is not None:
                    d[f] = getattr(n, f)
            nodes.append(d)
        edges = []
        for e in self.edges:
            d = {"src": e.src, "dst": e.dst, "transfer_s": e.transfer_s}
            if e.bytes:
                d["bytes"] = e.bytes
            if e.tensor is not None:
                d["tensor"] = e.tensor
            edges.append(d)
        doc: dict[str, Any] = {"format": FORMAT, "version": 2 if self.is_placement else 1, "name": self.name}
        if self.time_unit != "s":
            doc["time_unit"] = self.time_unit
        if self.devices:
            doc["devices"] = [{"name": k.name, "count": k.count, "memory_bytes": k.memory_bytes, "host": k.host}
                              for k in self.devices]
        doc |= {"nodes": nodes, "edges": edges}
        if self.meta:
            doc["meta"] = dict(self.meta)
        return doc

    def save(self, path: str | Path) -> None:
        """Write the DAG as a JSON file (:func:`save_costdag`)."""
        save_costdag(self, path)


def load_costdag(path: str | Path, fmt: str = "auto") -> CostDAG:
    """Read a cost DAG JSON file: this project's format (``docs/costdag.md``, versions 1 and 2) or the device
    placement instances of Tarnawski et al. 2020 (``fmt="tarnawski"``; ``"auto"`` detects them by their
    ``maxFPGAs`` field). UTF-8, at most 64 MiB; duplicate keys, ``NaN``, ``Infinity`` and numbers out of range
    are refused."""
    if fmt not in FORMATS:
        raise CostDAGError(f"unknown cost DAG format {fmt!r}; choose one of {', '.join(FORMATS)}")
    text = read_text(path, "cost DAG file", CostDAGError)
    doc = loads(text, str(path), CostDAGError)
    if fmt == "tarnawski" or (fmt == "auto" and isinstance(doc, dict) and "maxFPGAs" in doc):
        return read_tarnawski(doc, str(path))
    return costdag_from_dict(doc, str(path))


FORMATS = ("auto", "layoutsearch", "tarnawski")


def save_costdag(dag: CostDAG, path: str | Path) -> None:
    """Write ``dag`` as a JSON file of ``docs/costdag.md``."""
    try:
        Path(path).write_text(dumps(dag.to_dict(), indent=1) + "\n")
    except OSError as e:
        raise CostDAGError(f"cannot write cost DAG file {str(path)!r}: {e.strerror}") from None


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
        _check_time(e.transfer_s, f"{what}: transfer_s")
        _check_bytes(e.bytes, f"{what}: bytes")
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
        _check_total(sum(getattr(n, f) for n in dag.nodes), f"{where}: the nodes' {f}")
    _check_total(sum(e.bytes for e in dag.edges), f"{where}: the edges' bytes")
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
            _check_bytes(k.memory_bytes, f"{where}: device kind {k.name!r}: memory_bytes")
        if not isinstance(k.host, bool):
            raise CostDAGError(f"{where}: device kind {k.name!r}: host must be true or false")
    return names


def _validate_node(n: Node, where: str, kinds: set[str]) -> None:
    if n.times is None:
        _check_time(n.compute_s, f"{where}: compute_s")
    else:
        if not isinstance(n.times, Mapping) or not n.times:
            raise CostDAGError(f"{where}: times must be a non-empty object device kind -> seconds")
        if n.compute_s:
            raise CostDAGError(f"{where}: give compute_s or times, not both")
        for kind, t in n.times.items():
            if kinds and kind not in kinds:
                raise CostDAGError(f"{where}: times names unknown device kind {short_repr(kind)} "
                                   f"(known: {', '.join(sorted(kinds))})")
            _check_time(t, f"{where}: times[{kind!r}]")
    for f in ("memory_bytes", "param_bytes", "activation_bytes"):
        _check_bytes(getattr(n, f), f"{where}: {f}")
    if n.layer is not None and (not isinstance(n.layer, int) or isinstance(n.layer, bool) or abs(n.layer) > MAX_BYTES):
        raise CostDAGError(f"{where}: layer must be an integer, got {short_repr(n.layer)}")
    if n.group is not None and not is_label(n.group):
        raise CostDAGError(f"{where}: group must be a non-empty string, got {short_repr(n.group)}")
    if not isinstance(n.backward, bool):
        raise CostDAGError(f"{where}: backward must be true or false, got {short_repr(n.backward)}")


MAX_BYTES = 2**62
"""The largest byte count of a cost DAG: each figure, and the sum of each byte field over the DAG (so the
memory of any set of nodes is an exact ``int64``)."""

MAX_SECONDS = 1e12
"""The largest time of a node or an edge (about 30,000 years; every sum of them stays finite)."""

MAX_DEVICES = 4096
"""The largest number of devices of one kind."""


def _check_time(v: Any, what: str) -> None:
    ok = not isinstance(v, bool) and isinstance(v, int | float)
    try:
        ok = ok and math.isfinite(v) and v >= 0
    except OverflowError:  # an int beyond the float range
        ok = False
    if not ok:
        raise CostDAGError(f"{what} must be a finite number of seconds >= 0, got {short_repr(v)}")
    if v > MAX_SECONDS:
        raise CostDAGError(f"{what} must be at most {MAX_SECONDS:g} seconds, got {short_repr(v)}")


def _check_bytes(v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CostDAGError(f"{what} must be an integer number of bytes >= 0, got {short_repr(v)}")
    if v > MAX_BYTES:
        raise CostDAGError(f"{what} must be at most 2**62 ({MAX_BYTES:,}) bytes, got {short_repr(v)}")


def _check_total(total: int, what: str) -> None:
    if total > MAX_BYTES:
        raise CostDAGError(f"{what} add up to {total:,} bytes, more than 2**62 ({MAX_BYTES:,})")


def _topological_order(dag: CostDAG) -> tuple[str, ...]:
    graph = nx.DiGraph()
    graph.add_nodes_from(dag.names)
    graph.add_edges_from((e.src, e.dst) for e in dag.edges)
    return tuple(nx.lexicographical_topological_sort(graph, key=dag.index.__getitem__))


# -- JSON reading ---------------------------------------------------------------------------------------------------

_NODE_FIELDS = {"name", "compute_s", "memory_bytes", "param_bytes", "activation_bytes", "layer", "times", "group",
                "backward"}
_EDGE_FIELDS = {"src", "dst", "transfer_s", "bytes", "tensor"}
_TOP_FIELDS = {"format", "version", "name", "nodes", "edges", "meta", "devices", "time_unit"}
_DEVICE_FIELDS = {"name", "count", "memory_bytes", "host"}
_V2_NODE_FIELDS = {"times", "group", "backward"}


def costdag_from_dict(doc: Any, source: str = "cost DAG") -> CostDAG:
    """A cost DAG from a parsed JSON document of this project's format (versions 1 and 2; ``source`` names
    it in errors): what :func:`load_costdag` reads from a file."""

    def fail(msg: str) -> CostDAGError:
        return CostDAGError(f"{source}: {msg}")

    check_tree(doc, source, CostDAGError)
    if not isinstance(doc, dict):
        raise fail(f"expected a JSON object with 'nodes' and 'edges', got {type(doc).__name__}")
    unknown = set(doc) - _TOP_FIELDS
    if unknown:
        raise fail(f"unknown field(s) {sorted(unknown)}; allowed: {sorted(_TOP_FIELDS)}")
    if doc.get("format", FORMAT) != FORMAT:
        raise fail(f"format is {short_repr(doc['format'])}, expected {FORMAT!r}")
    version = doc.get("version", VERSION)
    if isinstance(version, bool) or version not in VERSIONS:
        raise fail(f"version {short_repr(doc['version'])} is not supported (this reader knows versions 1 and 2)")
    name = doc.get("name", "dag")
    if not isinstance(name, str) or not name.isprintable():
        raise fail(f"'name' must be a string of printable characters, got {short_repr(name)}")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise fail(f"'meta' must be an object, got {type(meta).__name__}")
    raw_nodes, raw_edges = doc.get("nodes"), doc.get("edges", [])
    if not isinstance(raw_nodes, list):
        raise fail("'nodes' must be a list of node objects")
    if not isinstance(raw_edges, list):
        raise fail("'edges' must be a list of edge objects")
    if version == 1:
        used = sorted({"devices", "time_unit"} & set(doc)) + sorted(
            {f for d in raw_nodes if isinstance(d, dict) for f in d} & _V2_NODE_FIELDS)
        if used:
            raise fail(f"field(s) {used} need version 2")
    raw_devices = doc.get("devices", [])
    if not isinstance(raw_devices, list):
        raise fail("'devices' must be a list of device kind objects")
    devices = [_read(DeviceKind, d, _DEVICE_FIELDS, {"name", "count"}, f"devices[{i}]", fail)
               for i, d in enumerate(raw_devices)]
    nodes = [_read(Node, d, _NODE_FIELDS, {"name"}, f"nodes[{i}]", fail) for i, d in enumerate(raw_nodes)]
    for i, (d, n) in enumerate(zip(raw_nodes, nodes, strict=True)):
        if ("compute_s" in d) == ("times" in d):
            raise fail(f"nodes[{i}] ({n.name!r}): " + ("missing field(s) ['compute_s'] (or 'times')" if "times" not in d
                                                      else "give compute_s or times, not both"))
    edges = [_read(Edge, d, _EDGE_FIELDS, {"src", "dst", "transfer_s"}, f"edges[{i}]", fail)
             for i, d in enumerate(raw_edges)]
    try:
        return CostDAG(tuple(nodes), tuple(edges), name=name, meta=meta, devices=tuple(devices),
                       time_unit=doc.get("time_unit", "s"))
    except CostDAGError as e:
        raise fail(str(e)) from None


def _read(cls: type, d: Any, allowed: set[str], required: set[str], where: str, fail: Any) -> Any:
    if not isinstance(d, dict):
        raise fail(f"{where} must be an object, got {type(d).__name__}")
    unknown = set(d) - allowed
    if unknown:
        raise fail(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    missing = required - set(d)
    if missing:
        raise fail(f"{where}: missing field(s) {sorted(missing)}")
    d = dict(d)
    for k in ("memory_bytes", "param_bytes", "activation_bytes", "bytes", "count"):
        # JSON writers may print integral byte counts as 1e9 or 1024.0: accept those as integers.
        if isinstance(d.get(k), float) and d[k].is_integer():
            d[k] = int(d[k])
    for k in ("name", "src", "dst"):
        if k in d and not is_label(d[k]):
            raise fail(f"{where}.{k}: expected a non-empty string of printable characters, got {short_repr(d[k])}")
    try:
        for k in ("compute_s", "transfer_s"):
            if k in d:
                _check_time(d[k], f"{where}.{k}")
        for k in ("memory_bytes", "param_bytes", "activation_bytes", "bytes"):
            if d.get(k) is not None:
                _check_bytes(d[k], f"{where}.{k}")
    except CostDAGError as e:
        raise fail(str(e)) from None
    if d.get("tensor") is not None and not is_label(d["tensor"]):
        raise fail(f"{where}.tensor: expected a non-empty string or null, got {short_repr(d['tensor'])}")
    if d.get("layer") is not None and (isinstance(d["layer"], bool) or not isinstance(d["layer"], int)
                                       or abs(d["layer"]) > MAX_BYTES):
        raise fail(f"{where}.layer: expected an integer or null, got {short_repr(d['layer'])}")
    if "times" in d and not isinstance(d["times"], dict):
        raise fail(f"{where}.times: expected an object device kind -> seconds, got {short_repr(d['times'])}")
    return cls(**d)


# -- the instances of Tarnawski et al. 2020 -------------------------------------------------------------------------

_TARNAWSKI_TOP = {"maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"}
_TARNAWSKI_NODE = {"id", "name", "supportedOnFpga", "cpuLatency", "fpgaLatency", "isBackwardNode", "colorClass",
                   "size", "layerId"}
ACCELERATOR, CPU = "accelerator", "cpu"


def read_tarnawski(doc: Any, source: str = "placement instance") -> CostDAG:
    """A device-placement instance of Tarnawski et al. 2020 (msr-fiddle/dnn-partitioning) as a cost DAG.

    ``maxFPGAs`` accelerators with ``maxSizePerFPGA`` bytes each and ``maxCPUs`` host CPU cores; per node
    ``fpgaLatency`` (only when ``supportedOnFpga``) and ``cpuLatency`` as per-kind times, ``size`` as its
    memory, ``colorClass`` as its co-location group, ``isBackwardNode`` as the backward mark; per edge
    ``cost`` as the transfer time of the source's output (one tensor per source) and ``size`` as its bytes.
    Node names are the operators' names when unique, else ``name#id``; ``meta["node_ids"]`` maps names to
    the file's ids (expert splits name ids). Times are in the instances' own unit.
    """
    def fail(msg: str) -> CostDAGError:
        return CostDAGError(f"{source}: {msg}")

    check_tree(doc, source, CostDAGError)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not isinstance(doc.get("edges"), list):
        raise fail("expected a Tarnawski et al. instance: an object with maxFPGAs, maxCPUs, maxSizePerFPGA, nodes, edges")
    missing = _TARNAWSKI_TOP - set(doc)
    if missing:
        raise fail(f"missing field(s) {sorted(missing)}")
    count = {k: doc[k] for k in ("maxFPGAs", "maxCPUs")}
    for k, v in count.items():
        if isinstance(v, float) and v.is_integer():
            count[k] = int(v)
        if isinstance(count[k], bool) or not isinstance(count[k], int) or not 0 <= count[k] <= MAX_DEVICES:
            raise fail(f"{k} must be an integer from 0 to {MAX_DEVICES}, got {short_repr(v)}")
    memory = _tarnawski_bytes(doc["maxSizePerFPGA"], "maxSizePerFPGA", fail)
    raw = doc["nodes"]
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise fail(f"nodes[{i}] must be an object, got {type(d).__name__}")
        unknown = set(d) - _TARNAWSKI_NODE
        if unknown or "id" not in d:
            raise fail(f"nodes[{i}]: " + (f"unknown field(s) {sorted(unknown)}" if unknown else "missing field 'id'"))
        if isinstance(d["id"], bool) or not isinstance(d["id"], int):
            raise fail(f"nodes[{i}].id must be an integer, got {short_repr(d['id'])}")
    labels = [str(d.get("name", d["id"])) for d in raw]
    unique = len(set(labels)) == len(labels)
    names = {d["id"]: (label if unique else f"{label}#{d['id']}") for d, label in zip(raw, labels, strict=True)}
    if len(names) != len(raw):
        raise fail("duplicate node id")
    nodes = []
    for i, d in enumerate(raw):
        times = {}
        if d.get("supportedOnFpga", True):
            times[ACCELERATOR] = d.get("fpgaLatency")
        times[CPU] = d.get("cpuLatency")
        for k, t in times.items():
            if t is None:
                raise fail(f"nodes[{i}] ({names[d['id']]!r}): missing {'fpgaLatency' if k == ACCELERATOR else 'cpuLatency'}")
        group = d.get("colorClass")
        layer = d.get("layerId")
        nodes.append(Node(names[d["id"]], memory_bytes=_tarnawski_bytes(d.get("size", 0), f"nodes[{i}].size", fail),
                          times=times, group=None if group is None else str(group),
                          backward=bool(d.get("isBackwardNode", False)),
                          layer=layer if isinstance(layer, int) and not isinstance(layer, bool) else None))
    ends, sizes = [], {}
    for i, e in enumerate(doc["edges"]):
        if not isinstance(e, dict) or "sourceId" not in e or "destId" not in e:
            raise fail(f"edges[{i}] must be an object with sourceId, destId and cost")
        for k in ("sourceId", "destId"):
            if isinstance(e[k], bool) or e[k] not in names:
                raise fail(f"edges[{i}].{k}: unknown node id {short_repr(e[k])}")
        src = names[e["sourceId"]]
        ends.append((src, names[e["destId"]], e.get("cost", 0.0)))
        sizes[src] = max(sizes.get(src, 0), _tarnawski_bytes(e.get("size", 0), f"edges[{i}].size", fail))
    # One tensor per source (the paper's cost is per node output); its size, informational, is the largest
    # the file gives for it.
    edges = [Edge(src, dst, cost, bytes=sizes[src]) for src, dst, cost in ends]
    devices = (DeviceKind(ACCELERATOR, count["maxFPGAs"], memory), DeviceKind(CPU, count["maxCPUs"], None, host=True))
    name = Path(source).stem if source.endswith(".json") else "placement"
    try:
        return CostDAG(tuple(nodes), tuple(edges), name=name, devices=devices, time_unit="unit",
                       meta={"source": "Tarnawski et al. 2020 instance", "node_ids": {v: k for k, v in names.items()}})
    except CostDAGError as e:
        raise fail(str(e)) from None


def _tarnawski_bytes(v: Any, what: str, fail: Any) -> int:
    """A byte count of an instance; fractional sizes (some edges carry 0.125 bytes) are rounded up."""
    if isinstance(v, float) and math.isfinite(v) and v >= 0:
        v = math.ceil(v)
    try:
        _check_bytes(v, what)
    except CostDAGError as e:
        raise fail(str(e)) from None
    return v
