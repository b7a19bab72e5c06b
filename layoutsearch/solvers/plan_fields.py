"""The field-by-field checks of a plan file's ``plan`` object: every figure a number in its range, every flag
a boolean, every name a string, each entry of the lists (runner-ups, baselines, decisions) an object of those.
Figures of the chosen plan are priced again on load (:meth:`.plan.Plan.from_json`); these checks make sure what
is kept verbatim (the proof, the runner-ups, the baselines, the decisions) is what a search could have written."""

from __future__ import annotations

import math
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.dims import short_repr


class PlanFields:
    """Reads the fields of the objects of a plan file; ``LayoutSearchError`` naming ``source`` and the field's
    path (``plan.runner_ups[0].step_s``) for a missing field or a value of the wrong type or range."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, msg: str) -> LayoutSearchError:
        return LayoutSearchError(f"{self.source}: {where}: {msg}")

    def get(self, d: Any, key: str, where: str) -> Any:
        if not isinstance(d, dict):
            raise self.fail(where, f"expected an object, got {short_repr(d)}")
        if key not in d:
            raise self.fail(f"{where}.{key}", "missing")
        return d[key]

    def number(self, d: Any, key: str, where: str, optional: bool = False, upper: float | None = None) -> Any:
        """A finite number >= 0 (at most ``upper``); None allowed when ``optional``."""
        v = self.get(d, key, where)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v >= 0):
            raise self.fail(f"{where}.{key}", f"expected a finite number >= 0{' or null' if optional else ''}, "
                                              f"got {short_repr(v)}")
        if upper is not None and v > upper:
            raise self.fail(f"{where}.{key}", f"expected at most {upper:g}, got {short_repr(v)}")
        return v

    def integer(self, d: Any, key: str, where: str, lower: int = 0, optional: bool = False) -> Any:
        """An integer >= ``lower`` (an integral float is read as one); None allowed when ``optional``."""
        v = self.get(d, key, where)
        if v is None and optional:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < lower or v >= 2**63:
            raise self.fail(f"{where}.{key}", f"expected an integer from {lower} to 2**63 - 1, got {short_repr(v)}")
        return v

    def flag(self, d: Any, key: str, where: str) -> bool:
        v = self.get(d, key, where)
        if not isinstance(v, bool):
            raise self.fail(f"{where}.{key}", f"expected true or false, got {short_repr(v)}")
        return v

    def text(self, d: Any, key: str, where: str, optional: bool = False) -> Any:
        v = self.get(d, key, where)
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key}", f"expected a string{' or null' if optional else ''}, got {short_repr(v)}")
        return v

    def items(self, d: Any, key: str, where: str, kind: type = dict) -> list[Any]:
        """A list whose entries are all ``kind``."""
        v = self.get(d, key, where)
        if not isinstance(v, list):
            raise self.fail(f"{where}.{key}", f"expected a list, got {short_repr(v)}")
        for i, x in enumerate(v):
            if not isinstance(x, kind):
                raise self.fail(f"{where}.{key}[{i}]", f"expected {'an object' if kind is dict else 'a string'}, "
                                                       f"got {short_repr(x)}")
        return v

    def summary(self, d: Any, where: str) -> None:
        """A costed plan's summary (the chosen plan, a runner-up, a baseline that applies)."""
        self.text(d, "name", where)
        rules = self.get(d, "rules", where)
        if rules is not None and not (isinstance(rules, list) and all(
                isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], list)
                and all(isinstance(a, str) for a in r[1]) for r in rules)):
            raise self.fail(f"{where}.rules", f"expected a list of [dim, [axes]] or null, got {short_repr(rules)}")
        for key in ("step_s", "compute_s", "comm_s"):
            self.number(d, key, where)
        self.integer(d, "memory_bytes", where)
        self.flag(d, "fits", where)
        self.text(d, "remat", where)
        self.integer(d, "microbatches", where, lower=1)
        self.text(d, "stage_axis", where, optional=True)
        self.text(d, "schedule", where, optional=True)

    def check(self, d: Any, where: str = "plan") -> None:
        """Every field of a plan object (:meth:`.plan.Plan.to_dict`) but the layout and the cost report."""
        self.summary({**d, "name": "", "rules": None} if isinstance(d, dict) else d, where)  # (rules: in the layout)
        for key in ("model", "mesh", "hardware", "space", "solver"):
            self.text(d, key, where)
        self.integer(d, "devices", where, lower=1)
        self.flag(d, "optimal", where)
        self.number(d, "gap", where, optional=True, upper=1.0)
        self.number(d, "memory_limit", where, optional=True)
        if "search_s" in d:
            self.number(d, "search_s", where)
        for i, r in enumerate(self.items(d, "runner_ups", where)):
            self.summary(r, f"{where}.runner_ups[{i}]")
        for i, b in enumerate(self.items(d, "baselines", where)):
            w = f"{where}.baselines[{i}]"
            if self.flag(b, "applies", w):
                self.summary(b, w)
            else:
                self.text(b, "name", w)
                self.text(b, "why", w)
        for i, x in enumerate(self.items(d, "decisions", where)):
            w = f"{where}.decisions[{i}]"
            self.text(x, "kind", w)
            self.text(x, "option", w)
            self.number(x, "step_s", w, optional=True)
            self.number(x, "memory_bytes", w, optional=True)
            self.flag(x, "fits", w)
            self.text(x, "why", w)
            self.flag(x, "chosen", w)
            self.number(x, "at_least_s", w, optional=True)
        if not isinstance(self.get(d, "problem", where), dict):
            raise self.fail(f"{where}.problem", f"expected an object, got {short_repr(d['problem'])}")
        self.items(d, "cut_short", where, kind=str)
