"""JSON (de)serialization of graphs. Graph files are data: parsed with
``json``, checked field by field, never evaluated or unpickled."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layoutsearch.errors import GraphError, GraphFormatError
from layoutsearch.ir.constants import constant_values
from layoutsearch.ir.dims import Dim, short_repr
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.ops import OP_KINDS, Op, number
from layoutsearch.ir.strictjson import check_tree, json_path, loads, read_text, write_text
from layoutsearch.ir.tensor import Tensor, is_label

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
    return json.dumps(graph_to_dict(graph), indent=indent, allow_nan=False)


def save_graph(graph: Graph, path: str | Path) -> None:
    write_text(path, graph_to_json(graph) + "\n")


_TOP_FIELDS = ("format", "version", "name", "dims", "tensors", "ops", "loss", "meta")
_TENSOR_FIELDS = ("name", "dims", "dtype", "role", "updates")
_NAME_FIELDS = frozenset({"name", "output"})
"""Op fields naming a tensor or the op (non-empty strings of printable characters)."""


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

    def label(self, obj: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
        """A string field naming a tensor, an op or a block: non-empty, printable."""
        v = self.get(obj, key, str, where, default)
        if isinstance(v, str) and not is_label(v):
            raise self.fail(f"{where}.{key}", f"expected a non-empty string of printable characters, got {short_repr(v)}")
        return v

    def known_fields(self, obj: dict[str, Any], known: tuple[str, ...], where: str) -> None:
        unknown = [k for k in obj if k not in known]
        if unknown:
            raise self.fail(where, f"unknown field {unknown[0]!r} (known: {', '.join(known)})")

    def op_field(self, cls: type[Op], key: str, v: Any, where: str) -> None:
        """Check the type of field ``key`` of an op of class ``cls`` (fields it lacks are left to its
        constructor, which names them)."""
        typ = _op_field_types(cls).get(key)
        at = f"{where}.{key}"
        if typ is None or typ == "bool":  # unknown fields: the constructor's error; bools: the op's check
            return
        if typ == "str":
            if not isinstance(v, str):
                raise self.fail(at, f"expected str, got {type(v).__name__}")
            if key in _NAME_FIELDS and not is_label(v):
                raise self.fail(at, f"expected a non-empty string of printable characters, got {short_repr(v)}")
        elif typ == "str | None":
            if v is not None and not is_label(v):
                raise self.fail(at, f"expected a name (a non-empty string of printable characters) or null, "
                                    f"got {short_repr(v)}")
        elif typ == "tuple[str, ...]":
            if not isinstance(v, list | tuple) or not all(is_label(x) for x in v):
                raise self.fail(at, f"expected a list of {'tensor' if key == 'inputs' else 'dim'} names, got {short_repr(v)}")
        elif typ == "float":
            number(v, lambda msg: self.fail(at, msg))
        elif typ == "tuple[tuple[str, float], ...]":
            if isinstance(v, dict):
                for k, x in v.items():
                    number(x, lambda msg, k=k: self.fail(at + (f".{k}" if k.isidentifier() else f"[{k!r}]"), msg))
            elif isinstance(v, list | tuple):
                for i, kv in enumerate(v):
                    if not (isinstance(kv, list | tuple) and len(kv) == 2 and isinstance(kv[0], str)):
                        raise self.fail(f"{at}[{i}]", f"expected a pair [name, number], got {short_repr(kv)}")
                    number(kv[1], lambda msg, i=i: self.fail(f"{at}[{i}][1]", msg))
            else:
                raise self.fail(at, f"expected an object of numbers (or a list of [name, number] pairs), "
                                    f"got {type(v).__name__}")
        elif typ == "tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]":
            if not isinstance(v, list | tuple):
                raise self.fail(at, f"expected a list of [input dims, output dims] pairs, got {type(v).__name__}")
            for i, g in enumerate(v):
                if not (isinstance(g, list | tuple) and len(g) == 2 and all(
                        isinstance(side, list | tuple) and all(isinstance(n, str) for n in side) for side in g)):
                    raise self.fail(f"{at}[{i}]", "expected a pair [input dims, output dims] of dim-name lists, "
                                                  f"got {short_repr(g)}")


@functools.cache
def _op_field_types(cls: type[Op]) -> dict[str, str]:
    """Field name -> its annotation (a string: the module uses postponed annotations)."""
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _tupleize(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tupleize(x) for x in v)
    return v


def _graph_path(keys: Sequence[str | int]) -> str:
    """JSON paths as the reader's messages write them: ``tensors[0].dims``, ``graph.dims.batch``."""
    if keys and keys[0] not in ("tensors", "ops"):
        return json_path(["graph", *keys])
    return json_path(keys)


def graph_from_dict(doc: Any, source: str = "<graph>") -> Graph:
    """Build and validate a graph from a dict produced by :func:`graph_to_dict` (see
    ``docs/graph-format.md``, "Validation rules"); every problem raises one :class:`GraphError` naming
    ``source`` and the offending field."""
    r = _Reader(source)
    check_tree(doc, source, GraphFormatError, _graph_path)
    if not isinstance(doc, dict):
        raise r.fail("top level", f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format", FORMAT) != FORMAT:
        raise r.fail("format", f"expected {FORMAT!r}, got {short_repr(doc.get('format'))}")
    version = doc.get("version", VERSION)
    if version != VERSION or isinstance(version, bool):
        raise r.fail("version", f"unsupported version {short_repr(version)} (this release reads {VERSION})")
    r.known_fields(doc, _TOP_FIELDS, "top level")
    name = r.get(doc, "name", str, "graph")
    if not name.isprintable():
        raise r.fail("graph.name", f"expected a string of printable characters, got {short_repr(name)}")
    dims_doc = r.get(doc, "dims", dict, "graph")
    tensors_doc = r.get(doc, "tensors", list, "graph")
    ops_doc = r.get(doc, "ops", list, "graph")
    loss = r.get(doc, "loss", (str, type(None)), "graph", None)
    meta = r.get(doc, "meta", dict, "graph", {})
    dims: dict[str, Dim] = {}
    try:
        for k, v in dims_doc.items():
            dims[k] = Dim(k, v)
        tensors = []
        for i, td in enumerate(tensors_doc):
            where = f"tensors[{i}]"
            if not isinstance(td, dict):
                raise r.fail(where, f"expected an object, got {type(td).__name__}")
            r.known_fields(td, _TENSOR_FIELDS, where)
            tname = r.label(td, "name", where)
            shape = []
            for dn in r.get(td, "dims", list, where):
                if not isinstance(dn, str):
                    raise r.fail(f"{where}.dims", f"expected a list of dim names, got {short_repr(dn)} in it")
                if dn not in dims:
                    raise r.fail(f"{where}.dims", f"unknown dim {dn!r} (declared: {', '.join(dims) or 'none'})")
                shape.append(dims[dn])
            tensors.append(Tensor(tname, tuple(shape), r.get(td, "dtype", str, where, "float32"),
                                  r.get(td, "role", str, where, "activation"),
                                  r.label(td, "updates", where, None) if td.get("updates") is not None else None))
        ops: list[Op] = []
        for i, od in enumerate(ops_doc):
            where = f"ops[{i}]"
            if not isinstance(od, dict):
                raise r.fail(where, f"expected an object, got {type(od).__name__}")
            kind = r.get(od, "kind", str, where)
            cls = OP_KINDS.get(kind)
            if cls is None:
                raise r.fail(f"{where}.kind", f"unknown op kind {short_repr(kind)} (known: {', '.join(OP_KINDS)})")
            for k, v in od.items():
                if k != "kind":
                    r.op_field(cls, k, v, where)
            fields = {k: _tupleize(v) for k, v in od.items() if k != "kind"}
            try:
                ops.append(cls(**fields))
            except TypeError as e:
                raise r.fail(where, f"bad fields for {kind} op: {e}") from None
        g = Graph(name, tensors, ops, loss=loss, meta=meta)
        g.check_size()
        try:
            constant_values(g.tensors, g.meta)
        except GraphFormatError as e:
            raise GraphFormatError(f"{source}: {e}") from None
        return g
    except GraphFormatError:
        raise
    except GraphError as e:
        raise GraphError(f"{source}: {e}") from None


def graph_from_json(text: str | bytes, source: str = "<graph>") -> Graph:
    """Read a graph from JSON text (or UTF-8 bytes); see :func:`graph_from_dict`. Duplicate keys, ``NaN``,
    ``Infinity``, numbers out of range and nesting deeper than 64 levels are refused."""
    return graph_from_dict(loads(text, source, GraphFormatError), source)


def load_graph(path: str | Path) -> Graph:
    """Read a graph file (JSON, UTF-8, at most 64 MiB). Errors name the file and the offending field."""
    p = Path(path)
    return graph_from_json(read_text(p, "graph file", GraphFormatError), str(p))
