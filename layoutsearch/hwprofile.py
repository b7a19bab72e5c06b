"""Hardware profile files: a :class:`~layoutsearch.mesh.Hardware` as JSON, with the measurements behind it.

A profile is what ``layoutsearch calibrate`` writes, and what ``--hardware FILE`` (or
``layoutsearch.mesh.hardware("FILE.json")``) reads::

    {
      "format": "layoutsearch-hardware-profile",
      "version": 1,
      "hardware": {                       # every field of Hardware (those with defaults may be left out)
        "name": "calibrated-h100", "peak_flops": 9.89e14, "hbm_bytes": 8e10, "hbm_bandwidth": 3.35e12,
        "fast_link": {"bandwidth": 3.1e11, "latency": 8.2e-6, "efficiency": 1.0},
        "slow_link": {"bandwidth": 5e10, "latency": 1e-5, "efficiency": 0.9},
        "devices_per_node": 8, "matmul_efficiency": 0.71, "matmul_tile": [128, 128, 64],
        "axis_links": {"data": "slow"}, ...
      },
      "calibrated": {"date": ..., "jax_version": ..., "platform": ..., "device_kind": ..., ...},
      "measurements": {"matmul": ..., "hbm": ..., "collectives": ...}
    }

Loading is generic over the fields of ``Hardware`` (and of ``Link``): a field
without a default is required, one with a default may be absent. Every figure is
checked (a number, finite, positive -- latencies and fields whose default is 0 may
be 0 --, efficiencies at most 1, integers integral, booleans ``true``/``false``);
any problem raises one :class:`~layoutsearch.errors.HardwareError` naming the
file and the offending field. The file is parsed as JSON only: nothing is
evaluated or unpickled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from typing import Any

from layoutsearch.errors import HardwareError
from layoutsearch.ir.strictjson import check_tree, loads, read_text, write_text
from layoutsearch.mesh import FIGURE_RANGE, Hardware, Link

FORMAT = "layoutsearch-hardware-profile"
VERSION = 1
_TOP = ("format", "version", "hardware", "calibrated", "measurements")
_LINK_KINDS = ("fast", "slow")


def is_profile_path(name: str) -> bool:
    """Whether ``name`` designates a profile file rather than a preset: it ends in ``.json`` or is a file."""
    return isinstance(name, str) and (name.strip().lower().endswith(".json") or os.path.isfile(name))


# -- Hardware <-> JSON ----------------------------------------------------------------------------------------------

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def hardware_to_json(hw: Hardware) -> dict[str, Any]:
    """``hw`` as a JSON-ready dict (links as objects, ``matmul_tile`` a list, ``axis_links`` an object)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(hw):
        v = getattr(hw, f.name)
        if isinstance(v, Link):
            out[f.name] = {lf.name: getattr(v, lf.name) for lf in dataclasses.fields(v)}
        elif f.name == "axis_links":
            out[f.name] = dict(v)
        elif isinstance(v, tuple):
            out[f.name] = list(v)
        else:
            out[f.name] = v
    return out


class _Reader:
    """Converts and checks the fields of one profile, raising errors that name ``path`` and the field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, msg: str) -> HardwareError:
        return HardwareError(f"hardware profile {self.path}: {msg}")

    def dataclass(self, cls: type, doc: Any, where: str) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise self.fail(f"{where} must be a JSON object, got {_kind(doc)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in doc if k not in fields]
        if unknown:
            raise self.fail(f"unknown field {where}.{_name(unknown[0])} (known: {', '.join(fields)})")
        hints = _hints(cls)
        out: dict[str, Any] = {}
        for name, f in fields.items():
            key = f"{where}.{name}"
            if name not in doc:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise self.fail(f"{key} is missing (a required figure)")
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            out[name] = self.value(key, name, hints[name], doc[name], default)
        return out

    def value(self, key: str, name: str, typ: Any, v: Any, default: Any) -> Any:
        if dataclasses.is_dataclass(typ):
            return typ(**self.dataclass(typ, v, key))
        if typ is str:
            if not isinstance(v, str):
                raise self.fail(f"{key} must be a string, got {_kind(v)} {_repr(v)}")
            if not v.isprintable():
                raise self.fail(f"{key} must be a string of printable characters, got {_repr(v)}")
            return v
        if typ is bool:
            if not isinstance(v, bool):
                raise self.fail(f"{key} must be true or false, got {_kind(v)} {_repr(v)}")
            return v
        if typ is int:
            return self.number(key, name, v, default, integer=True)
        if typ is float:
            return self.number(key, name, v, default, integer=False)
        if name == "axis_links":
            if not isinstance(v, dict):
                raise self.fail(f"{key} must be an object mapping mesh axes to \"fast\" or \"slow\", got {_kind(v)}")
            for axis, kind in v.items():
                if kind not in _LINK_KINDS:
                    raise self.fail(f"{key}.{_name(axis)} must be \"fast\" or \"slow\", got {_repr(kind)}")
            return tuple(v.items())
        origin, args = typing.get_origin(typ), typing.get_args(typ)
        if origin is tuple and args and Ellipsis not in args:  # a fixed-size tuple, e.g. matmul_tile
            if not isinstance(v, list) or len(v) != len(args):
                raise self.fail(f"{key} must be a list of {len(args)} numbers, got {_repr(v)}")
            return tuple(self.value(f"{key}[{i}]", name, a, x, None) for i, (a, x) in enumerate(zip(args, v)))
        if origin is tuple:
            if not isinstance(v, list):
                raise self.fail(f"{key} must be a list, got {_kind(v)}")
            return tuple(tuple(x) if isinstance(x, list) else x for x in v)
        return v  # a field of a type this reader does not know: passed as is

    def number(self, key: str, name: str, v: Any, default: Any, integer: bool) -> float | int:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(f"{key} must be a number, got {_kind(v)} {_repr(v)}")
        if isinstance(v, int) and abs(v) > 10**40:
            raise self.fail(f"{key}: an integer of {v.bit_length()} bits is out of range")
        if not math.isfinite(v):
            raise self.fail(f"{key} = {v!r} must be a finite number")
        lo, hi = FIGURE_RANGE
        if abs(v) > hi:
            raise self.fail(f"{key} = {v!r} is out of range: at most {hi:g}")
        if integer:
            if v != int(v):
                raise self.fail(f"{key} = {v!r} must be an integer")
            v = int(v)
        else:
            v = float(v)
        if name.endswith("latency") or default == 0:
            if v < 0:
                raise self.fail(f"{key} = {v!r} must be >= 0")
        elif v <= 0:
            raise self.fail(f"{key} = {v!r} must be positive")
        if 0 < v < lo:
            raise self.fail(f"{key} = {v!r} is out of range: a figure is 0 or at least {lo:g}")
        if name.endswith("efficiency") and v > 1:
            raise self.fail(f"{key} = {v!r}: an efficiency is at most 1")
        return v


def _name(key: Any) -> str:
    """A field name as messages write it: as is when it is an identifier, quoted otherwise (one line)."""
    return key if isinstance(key, str) and key.isidentifier() else repr(key)


def _repr(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def hardware_from_json(doc: Any, path: str = "<profile>") -> Hardware:
    """The Hardware of a profile's ``"hardware"`` object (checked; HardwareError naming ``path`` and the field)."""
    r = _Reader(path)
    kwargs = r.dataclass(Hardware, doc, "hardware")
    try:
        return Hardware(**kwargs)
    except HardwareError as e:
        raise r.fail(str(e)) from None


# -- files ----------------------------------------------------------------------------------------------------------

def read_profile(path: str | os.PathLike[str]) -> tuple[Hardware, dict[str, Any]]:
    """The Hardware of profile ``path`` and the whole document (with its measurements and metadata)."""
    p = os.fspath(path)
    r = _Reader(p)
    if not os.path.exists(p):
        raise r.fail("no such file")
    if not os.path.isfile(p):
        raise r.fail("not a file")
    source = f"hardware profile {p}"
    doc = loads(read_text(p, "hardware profile", HardwareError, source), source, HardwareError)
    check_tree(doc, source, HardwareError)
    if not isinstance(doc, dict):
        raise r.fail(f"must be a JSON object with a \"hardware\" object, got {_kind(doc)}")
    unknown = [k for k in doc if k not in _TOP]
    if unknown:
        raise r.fail(f"unknown field {_name(unknown[0])} (known: {', '.join(_TOP)})")
    if "format" in doc and doc["format"] != FORMAT:
        raise r.fail(f"format is {doc['format']!r}, expected {FORMAT!r}")
    if "version" in doc and doc["version"] != VERSION:
        raise r.fail(f"version {doc['version']!r} is not supported (this layoutsearch reads version {VERSION})")
    if "hardware" not in doc:
        raise r.fail("the \"hardware\" object is missing")
    for key in ("calibrated", "measurements"):
        if key in doc and not isinstance(doc[key], dict):
            raise r.fail(f"{key} must be a JSON object, got {_kind(doc[key])}")
    return hardware_from_json(doc["hardware"], p), doc


def load_profile(path: str | os.PathLike[str]) -> Hardware:
    """The Hardware of profile ``path`` (HardwareError naming the file and the offender if it is invalid)."""
    return read_profile(path)[0]


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats replaced by None (JSON has no NaN or infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def profile_document(hw: Hardware, measurements: dict[str, Any] | None = None,
                     meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a profile."""
    return {"format": FORMAT, "version": VERSION, "hardware": hardware_to_json(hw),
            "calibrated": _finite(dict(meta or {})), "measurements": _finite(dict(measurements or {}))}


def save_profile(hw: Hardware, path: str | os.PathLike[str], measurements: dict[str, Any] | None = None,
                 meta: dict[str, Any] | None = None) -> None:
    """Write ``hw`` with its ``measurements`` and ``meta`` (the ``"calibrated"`` object) to profile ``path``."""
    p = os.fspath(path)
    text = json.dumps(profile_document(hw, measurements, meta), indent=2, allow_nan=False) + "\n"
    try:
        write_text(p, text)  # whole or not at all
    except OSError as e:
        raise HardwareError(f"cannot write hardware profile {p}: {e.strerror or e}") from None


__all__ = ["FORMAT", "VERSION", "hardware_from_json", "hardware_to_json", "is_profile_path", "load_profile",
           "profile_document", "read_profile", "save_profile"]
