"""Byte counts and durations: parsing what users type, printing what people read."""

from __future__ import annotations

import math
import re

from layoutsearch.errors import LayoutSearchError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


MAX_BYTES = 2**62
"""The largest byte count :func:`parse_bytes` returns (4 EiB): any memory figure fits an ``int64``."""


def parse_bytes(text: str | float) -> int:
    """A byte count from ``16GiB``, ``1.5 GB``, ``512MiB``, ``2e9`` or a number (rounded down to bytes), at
    most :data:`MAX_BYTES`."""
    shown = repr(text) if not isinstance(text, int) or abs(text) < 10**40 else "(a very large integer)"
    shown = shown if len(shown) <= 80 else shown[:60] + "..."
    if isinstance(text, int | float) and not isinstance(text, bool):
        try:
            value, unit = float(text), ""
        except OverflowError:
            value, unit = math.inf, ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text) \
            if isinstance(text, str) else None
        if not m or m.group(2).lower() not in _UNITS:
            raise LayoutSearchError(f"bad byte size {shown}: expected a number with an optional unit "
                                    f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 16GiB")
        value, unit = float(m.group(1)), m.group(2).lower()
    if math.isnan(value) or value < 0 or (isinstance(text, int) and text < 0):
        raise LayoutSearchError(f"bad byte size {shown}: must be a finite number >= 0")
    n = text if isinstance(text, int) and not isinstance(text, bool) else value * _UNITS[unit]
    if not n <= MAX_BYTES:  # infinity included
        raise LayoutSearchError(f"bad byte size {shown}: must be at most 2**62 bytes (4 EiB)")
    return int(n)


_BINARY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def format_bytes(n: float, unit: str | None = None) -> str:
    """``512 B``, ``1.50 KiB``, ``16.00 GiB``; with ``unit`` (``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB``), in
    that unit with 3 significant digits (``0.000123 GiB``, ``74.5 GiB``)."""
    if unit is not None:
        return f"{n / _BINARY[unit]:.3g} {unit}"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_exact_bytes(n: float) -> str:
    """``17179869184 B (16.00 GiB)``: exact bytes, then a readable size (``512 B`` below a KiB)."""
    return f"{int(n)} B" if abs(n) < 1024 else f"{int(n)} B ({format_bytes(n)})"


def format_seconds(t: float) -> str:
    """``1.234 s``, ``56.7 ms``, ``8 us``, ``120 ns`` (4 significant digits)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns" if t else "0 s"
