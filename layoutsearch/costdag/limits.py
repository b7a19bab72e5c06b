"""The numeric limits of a cost DAG, and the checks of single figures (times, byte counts, their sums) against
them: shared by the data model's validation and by both file readers."""

from __future__ import annotations

import math
from typing import Any

from layoutsearch.errors import CostDAGError
from layoutsearch.ir.dims import short_repr

MAX_BYTES = 2**62
"""The largest byte count of a cost DAG: each figure, and the sum of each byte field over the DAG (so the
memory of any set of nodes is an exact ``int64``)."""

MAX_SECONDS = 1e12
"""The largest time of a node or an edge (about 30,000 years; every sum of them stays finite)."""

MAX_DEVICES = 4096
"""The largest number of devices of one kind."""


def check_time(v: Any, what: str) -> None:
    ok = not isinstance(v, bool) and isinstance(v, int | float)
    try:
        ok = ok and math.isfinite(v) and v >= 0
    except OverflowError:  # an int beyond the float range
        ok = False
    if not ok:
        raise CostDAGError(f"{what} must be a finite number of seconds >= 0, got {short_repr(v)}")
    if v > MAX_SECONDS:
        raise CostDAGError(f"{what} must be at most {MAX_SECONDS:g} seconds, got {short_repr(v)}")


def check_bytes(v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CostDAGError(f"{what} must be an integer number of bytes >= 0, got {short_repr(v)}")
    if v > MAX_BYTES:
        raise CostDAGError(f"{what} must be at most 2**62 ({MAX_BYTES:,}) bytes, got {short_repr(v)}")


def check_total(total: int, what: str) -> None:
    if total > MAX_BYTES:
        raise CostDAGError(f"{what} add up to {total:,} bytes, more than 2**62 ({MAX_BYTES:,})")

