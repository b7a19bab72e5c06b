"""Golden predictions of the cost model: every zoo model (default, small sizes) x meshes x layouts.

``tests/golden/costs.json`` holds, per case, the predicted step, compute and
communication seconds, peak memory and its breakdown, FLOPs per device, MFU,
bytes per collective kind and per mesh axis. ``tests/test_golden_costs.py``
recomputes them and fails on any change (relative tolerance 1e-9) with a
readable diff. After an intended change of the cost model, regenerate and
commit the file with the change::

    .venv/bin/python tests/regen_golden.py          # or: python -m tests.regen_golden

and review ``git diff tests/golden/costs.json``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOLDEN_PATH = ROOT / "tests" / "golden" / "costs.json"
REL_TOL = 1e-9

MESHES = ("data:8", "data:2,model:4", "data:4,model:2")
HARDWARE = "h100"

# model -> {layout name: rules}; a layout is used on every mesh that has all the axes it names.
LAYOUTS: dict[str, dict[str, str]] = {
    "mtf-ffn": {"data": "batch:data", "tensor": "hidden:model", "2d": "batch:data,hidden:model",
                "fsdp": "batch:data,io:data"},
    "mtf-transformer": {"data": "batch:data", "tensor": "d_ff:model,heads:model,vocab:model",
                        "2d": "batch:data,d_ff:model,heads:model,vocab:model", "fsdp": "batch:data,d_model:data"},
    "gpt": {"data": "batch:data", "tensor": "d_ff:model,heads:model,vocab:model",
            "2d": "batch:data,d_ff:model,heads:model,vocab:model", "fsdp": "batch:data,d_model:data"},
    "moe": {"data": "batch:data", "experts": "batch:data,experts:model", "experts-data": "experts:data,batch:data",
            "2d": "batch:data,d_ff:model", "fsdp": "batch:data,d_model:data"},
    "mlp": {"data": "batch:data", "tensor": "hidden:model,hidden2:model", "2d": "batch:data,hidden:model",
            "fsdp": "batch:data,features:data,hidden2:data"},
}

SIZES: dict[str, dict[str, int]] = {"moe": {"experts": 8}}
"""Sizes changed from the zoo defaults (so every layout divides on every mesh)."""

# extra variants on one mesh: remat policies, SGD, the cpu-sim preset (XLA:CPU's behaviour), precision policies,
# materialized attention scores and no overlap
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("remat-selective", {"remat": "selective"}),
    ("remat-full", {"remat": "full"}),
    ("sgd", {"optimizer": "sgd"}),
    ("cpu-sim", {"hardware": "cpu-sim"}),
    ("fp32", {"precision": "fp32"}),
    ("bf16", {"precision": "bf16"}),
    ("attention-standard", {"attention": "standard"}),
    ("no-overlap", {"overlap": 0.0}),
)


def _axes(rules: str) -> set[str]:
    return {a for part in rules.split(",") for a in part.split(":", 1)[1].split("+") if a and a != "-"}


def cases() -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """(case id, model, mesh, rules, estimate keywords) of every golden case."""
    from layoutsearch.mesh import Mesh

    out = []
    for model, layouts in LAYOUTS.items():
        for mesh in MESHES:
            names = set(Mesh.parse(mesh).names)
            for name, rules in layouts.items():
                if _axes(rules) <= names:
                    out.append((f"{model} {mesh} {name}", model, mesh, rules, {}))
        rules = next(r for n, r in layouts.items() if n == "2d")
        for variant, kw in VARIANTS:
            out.append((f"{model} data:2,model:4 2d {variant}", model, "data:2,model:4", rules, kw))
    return out


def predict(model: str, mesh: str, rules: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The golden fields of one case."""
    from layoutsearch import Layout, estimate, zoo

    kw = dict(kw)
    hw = kw.pop("hardware", HARDWARE)
    r = estimate(zoo.build(model, **SIZES.get(model, {})), Layout.from_rules(mesh, rules), hw, **kw)
    return {
        "step_s": r.step_s, "compute_s": r.compute_s, "comm_s": r.comm_s, "memory_bytes": r.memory_bytes,
        "memory_breakdown": r.memory.breakdown, "peak_op": r.memory.peak_op, "flops_per_device": r.flops_per_device,
        "model_flops": r.model_flops, "mfu": r.mfu, "bytes_by_kind": r.bytes_by_kind(),
        "bytes_per_axis": r.bytes_per_axis, "comm_exposed_s": r.comm_exposed_s,
    }


def compute_golden() -> dict[str, Any]:
    """Every case's predictions, keyed by case id."""
    return {"hardware": HARDWARE, "cases": {cid: {"model": m, "sizes": SIZES.get(m, {}), "mesh": mesh, "layout": rules, **kw,
                                                   "predicted": predict(m, mesh, rules, kw)}
                                             for cid, m, mesh, rules, kw in cases()}}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0) or a == b


def diff_golden(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Readable differences: missing or new cases, and per case each changed field, old -> new."""
    lines: list[str] = []
    oc, nc = old.get("cases", {}), new.get("cases", {})
    for cid in oc:
        if cid not in nc:
            lines.append(f"{cid}: case removed")
    for cid in nc:
        if cid not in oc:
            lines.append(f"{cid}: new case (not in the golden file)")
            continue
        a, b = _flatten(oc[cid]), _flatten(nc[cid])
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                lines.append(f"{cid}: {key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}")
            elif not _same(a[key], b[key]):
                rel = ""
                if isinstance(a[key], int | float) and isinstance(b[key], int | float) and a[key]:
                    rel = f" ({(b[key] - a[key]) / abs(a[key]):+.3%})"
                lines.append(f"{cid}: {key}: {a[key]!r} -> {b[key]!r}{rel}")
    return lines


def main() -> int:
    new = compute_golden()
    old = json.loads(GOLDEN_PATH.read_text()) if GOLDEN_PATH.exists() else {}
    changes = diff_golden(old, new)
    GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN_PATH.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(new['cases'])} cases to {GOLDEN_PATH.relative_to(ROOT)}; {len(changes)} changed fields")
    for line in changes[:200]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
