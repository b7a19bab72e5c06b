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
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.strictjson import check_tree, loads, read_text
from layoutsearch.ir.tensor import is_label

FORMAT = "layoutsearch.costdag"
VERSION = 1


@dataclass(frozen=True)
class Node:
    """One operator (or layer): its per-micro-batch forward+backward time and its memory."""

    name: str
    compute_s: float
    memory_bytes: int = 0
    param_bytes: int = 0
    activation_bytes: int = 0
    layer: int | None = None
    """Optional layer index, used by :func:`~layoutsearch.solvers.partition.equal_split` (equal layers)."""


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "meta", dict(self.meta))
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
        """The topological order that keeps file order wherever the edges allow (Kahn's algorithm, smallest
        file position first); the canonical order of the partitioner."""
        order = _kahn(self)
        assert order is not None  # validated on construction
        return order

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

    # -- totals ---------------------------------------------------------------------------------------------------

    @property
    def total_compute_s(self) -> float:
        return math.fsum(n.compute_s for n in self.nodes)

    @property
    def total_memory_bytes(self) -> int:
        return sum(n.memory_bytes for n in self.nodes)

    # -- JSON -----------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``docs/costdag.md`` (optional fields only when set)."""
        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {"name": n.name, "compute_s": n.compute_s, "memory_bytes": n.memory_bytes}
            if n.param_bytes:
                d["param_bytes"] = n.param_bytes
            if n.activation_bytes:
                d["activation_bytes"] = n.activation_bytes
            if n.layer is not None:
                d["layer"] = n.layer
            nodes.append(d)
        edges = []
        for e in self.edges:
            d = {"src": e.src, "dst": e.dst, "transfer_s": e.transfer_s}
            if e.bytes:
                d["bytes"] = e.bytes
            if e.tensor is not None:
                d["tensor"] = e.tensor
            edges.append(d)
        doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "name": self.name, "nodes": nodes,
                               "edges": edges}
        if self.meta:
            doc["meta"] = dict(self.meta)
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "cost DAG") -> CostDAG:
        """Read a JSON document (as parsed by :func:`json.loads`); every field is checked."""
        return _from_dict(doc, source)

    def save(self, path: str | Path) -> None:
        save_costdag(self, path)


def load_costdag(path: str | Path) -> CostDAG:
    """Read a cost DAG JSON file (format: ``docs/costdag.md``; UTF-8, at most 64 MiB; duplicate keys, ``NaN``,
    ``Infinity`` and numbers out of range are refused)."""
    text = read_text(path, "cost DAG file", CostDAGError)
    return _from_dict(loads(text, str(path), CostDAGError), str(path))


def save_costdag(dag: CostDAG, path: str | Path) -> None:
    try:
        Path(path).write_text(json.dumps(dag.to_dict(), indent=1) + "\n")
    except OSError as e:
        raise CostDAGError(f"cannot write cost DAG file {str(path)!r}: {e.strerror}") from None


# -- validation -----------------------------------------------------------------------------------------------------

def _validate(dag: CostDAG) -> None:
    if not isinstance(dag.name, str):
        raise CostDAGError(f"a cost DAG's name must be a string, got {short_repr(dag.name)}")
    where = f"cost DAG {dag.name!r}"
    if not dag.nodes:
        raise CostDAGError(f"{where} has no nodes")
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
        _check_time(n.compute_s, f"{where}: node {n.name!r}: compute_s")
        for f in ("memory_bytes", "param_bytes", "activation_bytes"):
            _check_bytes(getattr(n, f), f"{where}: node {n.name!r}: {f}")
        if n.layer is not None and (not isinstance(n.layer, int) or isinstance(n.layer, bool)
                                    or abs(n.layer) > MAX_BYTES):
            raise CostDAGError(f"{where}: node {n.name!r}: layer must be an integer, got {short_repr(n.layer)}")
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
    if _kahn(dag) is None:
        raise CostDAGError(f"{where} has a cycle: {' -> '.join(_find_cycle(dag))}")


MAX_BYTES = 2**62
"""The largest byte count of a cost DAG: each figure, and the sum of each byte field over the DAG (so the
memory of any set of nodes is an exact ``int64``)."""

MAX_SECONDS = 1e12
"""The largest time of a node or an edge (about 30,000 years; every sum of them stays finite)."""


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


def _kahn(dag: CostDAG) -> tuple[str, ...] | None:
    pos = {n.name: i for i, n in enumerate(dag.nodes)}
    indeg = dict.fromkeys(pos, 0)
    succs: dict[str, set[str]] = {n: set() for n in pos}
    for e in dag.edges:
        if e.dst not in succs[e.src]:
            succs[e.src].add(e.dst)
            indeg[e.dst] += 1
    heap = [pos[n] for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        n = dag.nodes[heapq.heappop(heap)].name
        order.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, pos[s])
    return tuple(order) if len(order) == len(pos) else None


def _find_cycle(dag: CostDAG) -> list[str]:
    succs: dict[str, list[str]] = {n.name: [] for n in dag.nodes}
    for e in dag.edges:
        succs[e.src].append(e.dst)
    color: dict[str, int] = {}
    for root, out in succs.items():
        if root in color:
            continue
        path, stack = [root], [iter(out)]
        color[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                stack.pop()
            elif color.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in color:
                color[nxt] = 1
                path.append(nxt)
                stack.append(iter(succs[nxt]))
    raise AssertionError("no cycle")


# -- JSON reading ---------------------------------------------------------------------------------------------------

_NODE_FIELDS = {"name", "compute_s", "memory_bytes", "param_bytes", "activation_bytes", "layer"}
_EDGE_FIELDS = {"src", "dst", "transfer_s", "bytes", "tensor"}
_TOP_FIELDS = {"format", "version", "name", "nodes", "edges", "meta"}


def _from_dict(doc: Any, source: str) -> CostDAG:
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
    if doc.get("version", VERSION) != VERSION or isinstance(doc.get("version"), bool):
        raise fail(f"version {short_repr(doc['version'])} is not supported (this reader knows version {VERSION})")
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
    nodes = [_read(Node, d, _NODE_FIELDS, {"name", "compute_s"}, f"nodes[{i}]", fail)
             for i, d in enumerate(raw_nodes)]
    edges = [_read(Edge, d, _EDGE_FIELDS, {"src", "dst", "transfer_s"}, f"edges[{i}]", fail)
             for i, d in enumerate(raw_edges)]
    try:
        return CostDAG(tuple(nodes), tuple(edges), name=name, meta=meta)
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
    for k in ("memory_bytes", "param_bytes", "activation_bytes", "bytes"):
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
            if k in d:
                _check_bytes(d[k], f"{where}.{k}")
    except CostDAGError as e:
        raise fail(str(e)) from None
    if d.get("tensor") is not None and not is_label(d["tensor"]):
        raise fail(f"{where}.tensor: expected a non-empty string or null, got {short_repr(d['tensor'])}")
    if d.get("layer") is not None and (isinstance(d["layer"], bool) or not isinstance(d["layer"], int)
                                       or abs(d["layer"]) > MAX_BYTES):
        raise fail(f"{where}.layer: expected an integer or null, got {short_repr(d['layer'])}")
    return cls(**d)
