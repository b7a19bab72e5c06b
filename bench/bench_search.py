"""Benchmark: search time against model size, mesh size and the decisions searched, for each solver, in one run.

    .venv/bin/python bench/bench_search.py            # the full run quoted in README.md / bench/README.md
    .venv/bin/python bench/bench_search.py --quick    # a smaller sweep
    .venv/bin/python bench/bench_search.py --json out.json

Model: GPT with the GPT-3 175B widths (d_model 12288, 96 heads, seq 2048,
batch 1536, vocab 50304) and 2 ... 96 layers; training step with Adam, mixed
precision; hardware tpu-v4 (the mesh sizes are TPU pod slices) under its
usable memory (the default limit). Each search starts from the forward graph
(the training graph derivation is timed) and ends with the plan, its cost
report and the four baselines.

Sweeps (layout x remat policy searched, no gradient accumulation): layers 2,
8, 24, 48, 96 on the 1024-device 3-axis mesh; meshes of 8, 64, 256 and 1024
devices with 2 and 3 axes for the 96-layer model; solvers ilp-pulp,
ilp-ortools and dp in the rules space and the layers space; the ops space on
a smaller model (it has one decision per op and parameter). Then the whole
joint search (remat, gradient accumulation and pipelines searched) on the
two headline problems: GPT-3 175B on tpu-v4 ``data:16,fsdp:8,model:8`` and
Megatron's 145.6B on 1536 A100s ``pipe:8,data:24,model:8``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layoutsearch import zoo
from layoutsearch.costmodel.step import training_step
from layoutsearch.solvers.search import InfeasibleError, search

SOLVERS = ("ilp-pulp", "ilp-ortools", "dp")
MESHES = {
    8: ("data:2,model:4", "data:2,fsdp:2,model:2"),
    64: ("data:8,model:8", "data:4,fsdp:4,model:4"),
    256: ("data:32,model:8", "data:8,fsdp:4,model:8"),
    1024: ("data:128,model:8", "data:16,fsdp:8,model:8"),
}
TARGET = "data:16,fsdp:8,model:8"


def run(model_kw: dict, mesh: str, space: str, solver: str, hw: str = "tpu-v4", **kw) -> dict:
    g = zoo.build("gpt", **model_kw)
    kw = {"microbatches": 1, **kw}
    t0 = time.perf_counter()
    tg = training_step(g)
    try:
        plan = search(g, mesh, solver=solver, hardware=hw, space=space, top=1, **kw)
    except InfeasibleError as e:  # the search proved that nothing fits: a result too
        return {"layers": g.meta["layers"], "mesh": mesh, "space": space, "solver": solver, "ops": len(tg.ops),
                "seconds": time.perf_counter() - t0, "infeasible": True, "min_memory": e.min_memory}
    seconds = time.perf_counter() - t0
    p = plan.problem
    return {"layers": g.meta["layers"], "mesh": mesh, "devices": plan.layout.mesh.size,
            "axes": len(plan.layout.mesh.axes), "space": space, "solver": solver, "used": plan.solver,
            "ops": len(tg.ops), "tensors": len(tg.tensors), "candidates": p.get("candidates"),
            "priced": p.get("priced"),
            "variables": p["variables"], "unpruned_variables": p.get("unpruned", p)["variables"],
            "memory_rows": p["memory_rows"], "seconds": seconds, "optimal": plan.optimal, "gap": plan.gap,
            "step_s": plan.step_s, "memory_bytes": plan.memory_bytes, "remat": plan.chosen.remat,
            "microbatches": plan.chosen.microbatches, "stage_axis": plan.chosen.stage_axis,
            "rules": plan.chosen.rules_text()}


def show(r: dict) -> None:
    if r.get("infeasible"):
        print(f"{r['space']:6} {r['solver']:11} layers {r['layers']:>3} mesh {r['mesh']:24} ops {r['ops']:>6}  "
              f"{r['seconds']:7.2f} s  proven infeasible: the smallest peak is {r['min_memory'] / 2**30:.0f} GiB",
              flush=True)
        return
    status = "optimal" if r["optimal"] else f"gap {r['gap']}"
    size = (f"rule sets {r['priced']:>4} priced of {r['candidates']:>5}" if r["space"] == "rules"
            else f"vars {r['variables']:>6} of {r['unpruned_variables']:>6}")
    what = f"remat {r['remat']}" + (f", {r['microbatches']} micro-batches" if r["microbatches"] > 1 else "") + (
        f", stages over {r['stage_axis']}" if r["stage_axis"] else "")
    print(f"{r['space']:6} {r['solver']:11} layers {r['layers']:>3} mesh {r['mesh']:24} ({r['devices']:>4} dev, "
          f"{r['axes']} axes)  ops {r['ops']:>6}  {size}  rows {r['memory_rows']:>4}  {r['seconds']:7.2f} s  "
          f"{status}  step {r['step_s']:.4g} s  {r['memory_bytes'] / 2**30:.1f} GiB  {what}  {r['rules']}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    gpt3 = {"preset": "gpt3-175b"}
    results = []
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    layers = (2, 8, 96) if args.quick else (2, 8, 24, 48, 96)
    print("\n# model size (GPT-3 175B widths), 1024 devices, 3 axes, rules space")
    for n in layers:
        for solver in SOLVERS:
            r = run({**gpt3, "layers": n}, TARGET, "rules", solver)
            show(r)
            results.append(r)
    print("\n# mesh size, GPT-3 175B (96 layers), rules space")
    for devices, meshes in MESHES.items():
        if args.quick and devices not in (8, 1024):
            continue
        for mesh in meshes:
            for solver in SOLVERS:
                r = run(gpt3, mesh, "rules", solver)
                show(r)
                results.append(r)
    print("\n# layers space (one rule set per repeated layer), GPT-3 175B, 1024 devices, 3 axes")
    for solver in ("ilp-ortools",) if args.quick else SOLVERS:  # dp: a chain only without remat factors
        r = run(gpt3, TARGET, "layers", solver)
        show(r)
        results.append(r)
    print("\n# ops space (per-op layouts, parameter storage), GPT 4 layers d_model 1024, 8 devices, 60 s limit")
    small = {"layers": 4, "d_model": 1024, "heads": 16, "seq": 1024, "batch": 16, "vocab": 32768}
    for solver in ("ilp-pulp",) if args.quick else ("ilp-pulp", "ilp-ortools"):
        r = run(small, "data:2,model:4", "ops", solver, hw="h100", time_limit=60)
        show(r)
        results.append(r)
    print("\n# the joint search (layout, remat, gradient accumulation; pipelines where asked), default memory limit")
    headline = [({"preset": "gpt3-175b"}, TARGET, "tpu-v4", {"microbatches": "auto"}),
                ({"preset": "gpt3-175b"}, TARGET, "tpu-v4", {"microbatches": "auto", "pipeline": "auto"}),
                ({"preset": "megatron-145.6b", "batch": 2304}, "pipe:8,data:24,model:8", "a100",
                 {"microbatches": "auto", "pipeline": "auto"})]
    for model_kw, mesh, hw, kw in headline[:2] if args.quick else headline:
        r = run(model_kw, mesh, "rules", "auto", hw=hw, **kw)
        show(r)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
