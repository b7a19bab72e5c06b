"""JSON (de)serialization of graphs. Graph files are data: parsed with
``json``, checked field by field, never evaluated or unpickled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from layoutsearch.errors import GraphError, GraphFormatError
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.ops import OP_KINDS, Op
from layoutsearch.ir.tensor import Tensor

FORMAT = "layoutsearch.graph"
VERSION = 1


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """A JSON-ready dict of the graph (dims listed once, tensors refer to them by name)."""
    ops = []
    for op in graph.ops:
        d: dict[str, Any] = {"kind": op.kind, "name": op.name, "inputs": list(op.inputs), "output": op.output}
        for k, v in op.file_attrs().items():
            d[k] = _jsonable(v)
        if op.phase != "forward":
            d["phase"] = op.phase
        if op.block is not None:
            d["block"] = op.block
        ops.append(d)
    tensors = []
    for t in graph.tensors.values():
        td: dict[str, Any] = {"name": t.name, "dims": list(t.dim_names), "dtype": t.dtype, "role": t.role}
        if t.updates is not None:
            td["updates"] = t.updates
        tensors.append(td)
    return {"format": FORMAT, "version": VERSION, "name": graph.name, "dims": dict(graph.dims),
            "tensors": tensors, "ops": ops, "loss": graph.loss, "meta": graph.meta}


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    return v


def graph_to_json(graph: Graph, indent: int | None = 1) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def save_graph(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(graph_to_json(graph) + "\n")


class _Reader:
    """Checks one field at a time and reports errors with a JSON path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, msg: str) -> GraphFormatError:
        return GraphFormatError(f"{self.source}: {where}: {msg}")

    def get(self, obj: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
        if key not in obj:
            if default is not ...:
                return default
            raise self.fail(where, f"missing field {key!r}")
        v = obj[key]
        if not isinstance(v, typ) or (isinstance(v, bool) and bool not in _as_tuple(typ)):
            names = "/".join(t.__name__ for t in _as_tuple(typ))
            raise self.fail(f"{where}.{key}", f"expected {names}, got {type(v).__name__}")
        return v


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _tupleize(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tupleize(x) for x in v)
    return v


def graph_from_dict(doc: Any, source: str = "<graph>") -> Graph:
    """Build and validate a graph from a dict produced by :func:`graph_to_dict`."""
    r = _Reader(source)
    if not isinstance(doc, dict):
        raise r.fail("top level", f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format", FORMAT) != FORMAT:
        raise r.fail("format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("version", VERSION) != VERSION:
        raise r.fail("version", f"unsupported version {doc.get('version')!r} (this release reads {VERSION})")
    name = r.get(doc, "name", str, "graph")
    dims_doc = r.get(doc, "dims", dict, "graph")
    dims: dict[str, Dim] = {}
    try:
        for k, v in dims_doc.items():
            dims[k] = Dim(k, v)
        tensors = []
        for i, td in enumerate(r.get(doc, "tensors", list, "graph")):
            where = f"tensors[{i}]"
            if not isinstance(td, dict):
                raise r.fail(where, "expected an object")
            shape = []
            for dn in r.get(td, "dims", list, where):
                if dn not in dims:
                    raise r.fail(f"{where}.dims", f"unknown dim {dn!r} (declared: {', '.join(dims) or 'none'})")
                shape.append(dims[dn])
            tensors.append(Tensor(r.get(td, "name", str, where), tuple(shape), r.get(td, "dtype", str, where, "float32"),
                                  r.get(td, "role", str, where, "activation"), r.get(td, "updates", str, where, None)))
        ops: list[Op] = []
        for i, od in enumerate(r.get(doc, "ops", list, "graph")):
            where = f"ops[{i}]"
            if not isinstance(od, dict):
                raise r.fail(where, "expected an object")
            kind = r.get(od, "kind", str, where)
            cls = OP_KINDS.get(kind)
            if cls is None:
                raise r.fail(f"{where}.kind", f"unknown op kind {kind!r} (known: {', '.join(OP_KINDS)})")
            fields = {k: _tupleize(v) for k, v in od.items() if k != "kind"}
            try:
                ops.append(cls(**fields))
            except TypeError as e:
                raise r.fail(where, f"bad fields for {kind} op: {e}") from None
        loss = r.get(doc, "loss", (str, type(None)), "graph", None)
        meta = r.get(doc, "meta", dict, "graph", {})
        return Graph(name, tensors, ops, loss=loss, meta=meta)
    except GraphFormatError:
        raise
    except GraphError as e:
        raise GraphError(f"{source}: {e}") from None


def graph_from_json(text: str, source: str = "<graph>") -> Graph:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphFormatError(f"{source}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return graph_from_dict(doc, source)


def load_graph(path: str | Path) -> Graph:
    """Read a graph file (JSON). Errors name the file and the offending field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise GraphFormatError(f"cannot read graph file {str(p)!r}: {e.strerror}") from None
    return graph_from_json(text, str(p))
