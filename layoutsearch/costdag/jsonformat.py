"""The JSON format of cost DAGs (``docs/costdag.md``, versions 1 and 2): writing a :class:`CostDAG` as a
document, reading one back field by field, and the files (:func:`load_costdag` also reads the instances of
Tarnawski et al. 2020, through :mod:`layoutsearch.costdag.tarnawski`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layoutsearch.costdag.limits import MAX_BYTES, check_bytes, check_time
from layoutsearch.costdag.model import CostDAG, DeviceKind, Edge, Node
from layoutsearch.costdag.tarnawski import read_tarnawski
from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.strictjson import check_tree, dumps, loads, read_text, write_text
from layoutsearch.ir.tensor import is_label

FORMAT = "layoutsearch.costdag"
VERSION = 2
VERSIONS = (1, 2)
FORMATS = ("auto", "layoutsearch", "tarnawski")


def _is_graph_format(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` says it is a model graph file (the graph IR is imported only for a foreign format)."""
    from layoutsearch.ir.serialize import FORMAT as GRAPH_FORMAT

    return bool(doc.get("format") == GRAPH_FORMAT)


def costdag_to_dict(dag: CostDAG) -> dict[str, Any]:
    """The JSON document of ``docs/costdag.md`` for ``dag`` (optional fields only when set; version 1 unless a
    version-2 feature is used): what :meth:`CostDAG.to_dict` returns."""
    nodes = []
    for n in dag.nodes:
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
    for e in dag.edges:
        d = {"src": e.src, "dst": e.dst, "transfer_s": e.transfer_s}
        if e.bytes:
            d["bytes"] = e.bytes
        if e.tensor is not None:
            d["tensor"] = e.tensor
        edges.append(d)
    doc: dict[str, Any] = {"format": FORMAT, "version": 2 if dag.is_placement else 1, "name": dag.name}
    if dag.time_unit != "s":
        doc["time_unit"] = dag.time_unit
    if dag.devices:
        doc["devices"] = [{"name": k.name, "count": k.count, "memory_bytes": k.memory_bytes, "host": k.host}
                          for k in dag.devices]
    doc |= {"nodes": nodes, "edges": edges}
    if dag.meta:
        doc["meta"] = dict(dag.meta)
    return doc


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


def save_costdag(dag: CostDAG, path: str | Path) -> None:
    """Write ``dag`` as a JSON file of ``docs/costdag.md``."""
    try:
        write_text(path, dumps(dag.to_dict(), indent=1) + "\n")
    except OSError as e:
        raise CostDAGError(f"cannot write cost DAG file {str(path)!r}: {e.strerror}") from None


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
    if {"ops", "tensors"} <= set(doc) or doc.get("format", FORMAT) not in (FORMAT, None) and _is_graph_format(doc):
        raise fail("this is a model graph file, not a cost DAG: make its cost DAG with `layoutsearch costdag "
                   "GRAPH.json --mesh AXES --out DAG.json` (see docs/costdag.md), then partition that")
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
                check_time(d[k], f"{where}.{k}")
        for k in ("memory_bytes", "param_bytes", "activation_bytes", "bytes"):
            if d.get(k) is not None:
                check_bytes(d[k], f"{where}.{k}")
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

