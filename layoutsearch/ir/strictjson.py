"""Strict JSON: reading data files (graphs, cost DAGs, hardware profiles) and writing documents.

:func:`json.loads` alone accepts documents that later code cannot handle: duplicate keys (the last one
silently wins), ``NaN`` and ``Infinity`` (not JSON; written back, they make invalid JSON), integers of
millions of digits (Python refuses to convert them: ``ValueError``), floats beyond the float range (read
as infinity), brackets nested deeper than the interpreter's recursion limit (``RecursionError``) and, when
reading a file, bytes that are not UTF-8. Here each of those is one error of the caller's class naming
the file and, where the document parsed, the JSON path of the offender:

* :func:`read_text`: a file's text (at most :data:`MAX_FILE_BYTES`, UTF-8 with an optional BOM);
* :func:`loads`: the document, with duplicate keys, out-of-range numbers and ``NaN``/``Infinity`` marked;
* :func:`check_tree`: raises on the first marked value, on nesting deeper than :data:`MAX_DEPTH`, and on
  values that are not JSON (for documents built in Python);
* :func:`dumps`: what the tool writes (``--json`` output, plan and cost-DAG files) as strict JSON text, a
  non-finite number as ``null`` (as JavaScript's ``JSON.stringify`` writes it), so it always parses.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 64 * 2**20
"""The largest data file read (64 MiB; a 128-layer GPT's graph file is about 1.5 MB)."""

MAX_DEPTH = 64
"""The deepest nesting of JSON arrays and objects accepted (a graph file needs 6 levels)."""

MAX_INT_DIGITS = 40
"""Integers of more digits are out of range wherever they appear (every bound of the readers is far below)."""


class OutOfRange:
    """A JSON value the reader refuses: an integer of too many digits, a float beyond the float range, or
    ``NaN``/``Infinity``. ``what`` says what is wrong with it."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


class _Duplicates(dict):  # type: ignore[type-arg]
    """A JSON object that named a key twice (``duplicate``: the first such key)."""

    duplicate: str = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    seen: set[str] = set()
    out = _Duplicates(d)
    for k, _ in pairs:
        if k in seen:
            out.duplicate = k
            break
        seen.add(k)
    return out


def _int(text: str) -> int | OutOfRange:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return OutOfRange(f"an integer of {digits:,} digits is out of range")
    return int(text)


def _float(text: str) -> float | OutOfRange:
    v = float(text)
    if not math.isfinite(v):
        shown = text if len(text) <= 40 else text[:20] + f"... ({len(text):,} characters)"
        return OutOfRange(f"the number {shown} is beyond the range of a float")
    return v


def _constant(name: str) -> OutOfRange:
    return OutOfRange(f"{name} is not a JSON number (JSON has no NaN or infinity)")


def decode(data: bytes, source: str, error: type[Exception]) -> str:
    """UTF-8 text of ``data`` (a leading BOM dropped); ``error`` naming ``source`` and the byte offset of
    the first invalid byte otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{source}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                    f"({e.reason}); save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def read_text(path: str | Path, what: str, error: type[Exception], source: str | None = None) -> str:
    """The text of file ``path`` (a ``what``, e.g. ``"graph file"``): at most :data:`MAX_FILE_BYTES`,
    UTF-8. ``error("cannot read {what} 'PATH': REASON")`` when it cannot be read; other messages start
    with ``source`` (default: the path)."""
    p = Path(path)
    source = str(p) if source is None else source
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise error(f"cannot read {what} {str(p)!r}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise error(f"{source}: larger than {MAX_FILE_BYTES // 2**20} MiB, the largest {what} read")
    return decode(data, source, error)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, then renamed over it (an
    interrupted or failed write leaves the old file, or none)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def loads(text: str | bytes, source: str, error: type[Exception]) -> Any:
    """Parse JSON ``text``: duplicate keys, out-of-range numbers and ``NaN``/``Infinity`` are kept as markers
    for :func:`check_tree` to report with their path; invalid JSON, too deep a nesting or too long a text
    raise ``error`` naming ``source``."""
    if isinstance(text, bytes | bytearray):
        text = decode(bytes(text), source, error)
    if not isinstance(text, str):
        raise error(f"{source}: expected JSON text, got {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise error(f"{source}: longer than {MAX_FILE_BYTES // 2**20} MiB, the largest document read")
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_int=_int, parse_float=_float,
                          parse_constant=_constant)
    except json.JSONDecodeError as e:
        raise error(f"{source}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise error(f"{source}: not readable: arrays and objects nested deeper than {MAX_DEPTH} levels") from None


def json_path(keys: Sequence[str | int]) -> str:
    """``["tensors", 0, "dims"]`` -> ``tensors[0].dims``; ``[]`` -> ``top level``."""
    out = ""
    for k in keys:
        if isinstance(k, int):
            out += f"[{k}]"
        elif k.isidentifier():
            out += f".{k}" if out else k
        else:
            out += f"[{k!r}]"
    return out or "top level"


def check_tree(doc: Any, source: str, error: type[Exception],
               path: Callable[[Sequence[str | int]], str] = json_path) -> None:
    """Raise ``error("{source}: {path}: ...")`` at the first problem of document ``doc``, depth first: an
    object naming a key twice, nesting deeper than :data:`MAX_DEPTH`, an :class:`OutOfRange` value, and (for
    documents built in Python) a non-finite float, an integer of more than :data:`MAX_INT_DIGITS` digits, a
    key that is not a string or a value that JSON cannot hold."""
    if _clean(doc):
        return
    links: list[tuple[int, str | int]] = [(-1, "")]  # container -> (its parent's link, its key)

    def keys(link: int) -> list[str | int]:
        out: list[str | int] = []
        while link > 0:
            link, k = links[link]
            out.append(k)
        return out[::-1]

    def fail(link: int, key: str | int | None, msg: str) -> Exception:
        ks = keys(link) + ([key] if key is not None else [])
        where = path(ks) if len(ks) <= 8 else f"{path(ks[:4])}... ({len(ks)} levels down)"
        return error(f"{source}: {where}: {msg}")

    limit = 10**MAX_INT_DIGITS

    def scalar(v: Any, link: int, k: str | int | None) -> None:
        if isinstance(v, OutOfRange):
            raise fail(link, k, v.what)
        if isinstance(v, float):
            if not math.isfinite(v):
                raise fail(link, k, f"{v!r} is not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -limit < v < limit:
                raise fail(link, k, f"an integer of about {int(v.bit_length() * math.log10(2)) + 1:,} digits "
                                    "is out of range")
        elif not (v is None or isinstance(v, str | bool)):
            raise fail(link, k, f"a {type(v).__name__} is not a JSON value")

    if not isinstance(doc, dict | list | tuple):
        scalar(doc, 0, None)
        return
    stack: list[tuple[Any, int, int]] = [(doc, 0, 1)]
    isfinite = math.isfinite
    while stack:
        obj, link, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise fail(link, None, f"arrays and objects nested deeper than {MAX_DEPTH} levels")
        if isinstance(obj, dict):
            if isinstance(obj, _Duplicates):
                raise fail(link, None, f"duplicate key {obj.duplicate!r} (each key may appear once in an object)")
            for k in obj:
                if type(k) is not str:
                    raise fail(link, None, f"key {k!r} is not a string")
            items: Any = obj.items()
        else:
            items = enumerate(obj)
        children = []
        for k, v in items:  # the common cases inline: this walks every value of a file
            t = type(v)
            if t is str or t is bool or v is None:
                continue
            if t is dict or t is list or t is tuple or isinstance(v, dict | list | tuple):
                links.append((link, k))
                children.append((v, len(links) - 1, depth + 1))
            elif t is int and -limit < v < limit or t is float and isfinite(v):
                continue
            else:
                scalar(v, link, k)
        stack.extend(reversed(children))


def _clean(doc: Any) -> bool:
    """Whether :func:`check_tree` has nothing to report (a fast pass without paths: it walks every value of a
    file; the pass that names the offender runs only when this one finds something)."""
    limit = 10**MAX_INT_DIGITS
    isfinite = math.isfinite
    if not isinstance(doc, dict | list | tuple):
        return False
    stack = [(doc, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(obj, dict):
            if isinstance(obj, _Duplicates) or any(type(k) is not str for k in obj):
                return False
            values: Any = obj.values()
        else:
            values = obj
        for v in values:
            t = type(v)
            if t is str or t is bool or v is None:
                continue
            if t is dict or t is list or t is tuple:
                stack.append((v, depth + 1))
            elif not (t is int and -limit < v < limit or t is float and isfinite(v)):
                return False
    return True


def finite(obj: Any) -> Any:
    """``obj`` (nested dicts, lists, tuples of JSON values) with every non-finite float replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as strict JSON text (non-finite numbers as ``null``)."""
    return json.dumps(finite(obj), indent=indent, allow_nan=False)


__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_INT_DIGITS", "OutOfRange", "check_tree", "decode", "dumps", "finite",
           "json_path", "loads", "read_text"]
