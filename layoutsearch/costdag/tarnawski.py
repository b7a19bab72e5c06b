"""The reader of the device-placement instances of Tarnawski et al. 2020 (msr-fiddle/dnn-partitioning): their
JSON files as version-2 cost DAGs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from layoutsearch.costdag.limits import MAX_DEVICES, check_bytes
from layoutsearch.costdag.model import CostDAG, DeviceKind, Edge, Node
from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr
from layoutsearch.ir.strictjson import check_tree

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
        if not _is_id(d["id"]):
            raise fail(f"nodes[{i}].id must be an integer from 0 to 2**63 - 1, got {short_repr(d['id'])}")
        for k in ("supportedOnFpga", "isBackwardNode"):
            if k in d and not (isinstance(d[k], bool) or d[k] in (0, 1) and type(d[k]) is int):
                raise fail(f"nodes[{i}].{k} must be true or false (or 1 or 0), got {short_repr(d[k])}")
        if "name" in d and not isinstance(d["name"], str):
            raise fail(f"nodes[{i}].name must be a string, got {short_repr(d['name'])}")
        if d.get("layerId") is not None and not _is_id(d["layerId"]):
            raise fail(f"nodes[{i}].layerId must be an integer >= 0, got {short_repr(d['layerId'])}")
        if d.get("colorClass") is not None and not (_is_id(d["colorClass"]) or isinstance(d["colorClass"], str)):
            raise fail(f"nodes[{i}].colorClass must be an integer or a string, got {short_repr(d['colorClass'])}")
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
                          layer=layer))
    ends, sizes = [], {}
    for i, e in enumerate(doc["edges"]):
        if not isinstance(e, dict) or "sourceId" not in e or "destId" not in e:
            raise fail(f"edges[{i}] must be an object with sourceId, destId and cost")
        for k in ("sourceId", "destId"):
            if not _is_id(e[k]):
                raise fail(f"edges[{i}].{k} must be a node id (an integer), got {short_repr(e[k])}")
            if e[k] not in names:
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


def _is_id(v: Any) -> bool:
    """Whether ``v`` is an instance's id: an integer (not a boolean) in the int64 range, >= 0."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _tarnawski_bytes(v: Any, what: str, fail: Any) -> int:
    """A byte count of an instance; fractional sizes (some edges carry 0.125 bytes) are rounded up."""
    if isinstance(v, float) and math.isfinite(v) and v >= 0:
        v = math.ceil(v)
    try:
        check_bytes(v, what)
    except CostDAGError as e:
        raise fail(str(e)) from None
    return v
