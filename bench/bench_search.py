"""Benchmark: search time against model size, devices and mesh axes, for every solver, in one run.

    .venv/bin/python bench/bench_search.py            # the full sweep
    .venv/bin/python bench/bench_search.py --quick    # a CI-sized sweep (the run quoted in README.md)
    .venv/bin/python bench/bench_search.py --json out.json
    .venv/bin/python bench/bench_search.py --cli      # the CLI's default searches, one fresh process each

``--cli`` times what a user runs: ``layoutsearch search ...`` with its defaults (three plans, the
baselines, the decisions; ``--json`` output), each in a fresh process (start-up, imports and the model's
graph included), beside the same with ``--top 1`` and with one process (``LAYOUTSEARCH_PROCESSES=1``: no
bound build split over the cores); the time limits (``--time-limit T``: the answer, baselines
included, within T + 10% plus 1 s of start-up); search time against devices at 3 axes and against layers,
drawn as bench/search_scaling.png. Results: bench/RESULTS_search_cli.txt.

Model: GPT with the GPT-3 175B widths (d_model 12288, 96 heads, seq 2048,
batch 1536, vocab 50304) and 2 ... 128 layers; training step with Adam, mixed
precision; hardware tpu-v4 (the mesh sizes are TPU pod slices) under its
usable memory (the default limit). Each search starts from the forward graph
(the training graph derivation is timed) and ends with the plan, its cost
report and the four baselines. Each row gives wall and CPU seconds (the
machine is shared: CPU seconds are the steadier figure), the space's size and
how it was pruned (candidates, ruled out by the live-set memory bound, priced,
priced again with overlap), summed over the remat policies.

Sweeps (layout x remat policy searched, no gradient accumulation), every solver
(enumerate, ilp-pulp, ilp-ortools, dp) on the rules space: layers 2 ... 128 on
the 1024-device 3-axis mesh; 8 ... 8192 devices with 2, 3 and 4 mesh axes for
the 96-layer model. Then (full run) the layers space and the ops space, and
the whole joint search (remat, gradient accumulation and pipelines searched)
on the two headline problems: GPT-3 175B on tpu-v4 ``data:16,fsdp:8,model:8``
and Megatron's 145.6B on 1536 A100s ``pipe:8,data:24,model:8``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layoutsearch import zoo
from layoutsearch.costmodel.step import training_step
from layoutsearch.solvers.search import InfeasibleError, search

SOLVERS = ("enumerate", "ilp-pulp", "ilp-ortools", "dp")
MESHES = {  # devices -> meshes with 2, 3 and 4 axes (TPU pod slices)
    8: ("data:2,model:4", "data:2,fsdp:2,model:2"),
    64: ("data:8,model:8", "data:4,fsdp:4,model:4", "data:2,fsdp:4,seq:2,model:4"),
    1024: ("data:128,model:8", "data:16,fsdp:8,model:8", "data:4,fsdp:4,seq:8,model:8"),
    8192: ("data:1024,model:8", "data:32,fsdp:32,model:8", "data:16,fsdp:8,seq:8,model:8"),
}
QUICK_MESHES = {8: MESHES[8][:1], 64: MESHES[64][2:], 8192: MESHES[8192][:1]}
QUICK_SOLVERS = ("enumerate", "ilp-pulp")  # the device sweep of --quick: the solvers differ little in the rules space
TARGET = "data:16,fsdp:8,model:8"
HEADLINE = [  # the joint search: (name, model, mesh, hardware, options)
    ("gpt3-175b, accumulation", {"preset": "gpt3-175b"}, TARGET, "tpu-v4", {"microbatches": "auto"}),
    ("gpt3-175b, pipelines", {"preset": "gpt3-175b"}, TARGET, "tpu-v4",
     {"microbatches": "auto", "pipeline": "auto"}),
    ("megatron-145.6b", {"preset": "megatron-145.6b", "batch": 2304}, "pipe:8,data:24,model:8", "a100",
     {"microbatches": "auto", "pipeline": "auto"}),
]


def run(model_kw: dict, mesh: str, space: str, solver: str, hw: str = "tpu-v4", **kw) -> dict:
    g = zoo.build("gpt", **model_kw)
    kw = {"microbatches": 1, **kw}
    t0, c0 = time.perf_counter(), time.process_time()
    tg = training_step(g)
    row = {"layers": g.meta["layers"], "mesh": mesh, "devices": 1, "axes": mesh.count(",") + 1, "space": space,
           "solver": solver, "ops": len(tg.ops)}
    for part in mesh.split(","):
        row["devices"] *= int(part.split(":")[1])
    try:
        plan = search(g, mesh, solver=solver, hardware=hw, space=space, top=1, **kw)
    except InfeasibleError as e:  # the search proved that nothing fits: a result too
        return {**row, "seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "infeasible": True,
                "min_memory": e.min_memory}
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    p = plan.problem
    pruning = p.get("pruning", {})
    total = {k: sum(v[k] or 0 for v in pruning.values()) for k in ("candidates", "memory_bound", "priced", "refined")} \
        if pruning else {}
    return {**row, "used": plan.solver, "candidates": p.get("candidates"), "priced": p.get("priced"),
            "pruning": pruning, "pruned_total": total,
            "variables": p["variables"], "unpruned_variables": p.get("unpruned", p)["variables"],
            "memory_rows": p["memory_rows"], "seconds": seconds, "cpu": cpu, "optimal": plan.optimal,
            "gap": plan.gap, "step_s": plan.step_s, "memory_bytes": plan.memory_bytes, "remat": plan.chosen.remat,
            "microbatches": plan.chosen.microbatches, "stage_axis": plan.chosen.stage_axis,
            "rules": plan.chosen.rules_text()}


def show(r: dict) -> None:
    head = (f"{r['space']:6} {r['solver']:11} layers {r['layers']:>3} mesh {r['mesh']:30} ({r['devices']:>4} dev, "
            f"{r['axes']} axes)  ops {r['ops']:>6}  {r['seconds']:7.2f} s ({r['cpu']:6.2f} s cpu)")
    if r.get("infeasible"):
        print(f"{head}  proven infeasible: the smallest peak is {r['min_memory'] / 2**30:.0f} GiB", flush=True)
        return
    status = "optimal" if r["optimal"] else f"gap {r['gap']}"
    t = r["pruned_total"]
    size = (f"space {t['candidates']} = {t['memory_bound']} over the memory bound + {t['priced']} priced "
            f"({t['refined']} with overlap) + the rest above the roofline bound" if t
            else f"vars {r['variables']} of {r['unpruned_variables']}")
    what = f"remat {r['remat']}" + (f", {r['microbatches']} micro-batches" if r["microbatches"] > 1 else "") + (
        f", stages over {r['stage_axis']}" if r["stage_axis"] else "")
    print(f"{head}  {status}  step {r['step_s']:.4g} s  {r['memory_bytes'] / 2**30:.1f} GiB  {what}  "
          f"{r['rules']}\n{'':8}{size}", flush=True)


def summary(results: list[dict]) -> None:
    """One line per configuration: CPU seconds per solver."""
    print("\n# summary: CPU seconds per solver (wall in brackets) for each configuration")
    configs: dict[tuple, dict[str, dict]] = {}
    for r in results:
        configs.setdefault((r["space"], r["layers"], r["mesh"]), {})[r["solver"]] = r
    solvers = list(dict.fromkeys(r["solver"] for r in results))
    print(f"{'space':6} {'layers':>6} {'mesh':30} {'devices':>7} {'axes':>4}  "
          + "  ".join(f"{s:>16}" for s in solvers) + "  plan")
    for (space, layers, mesh), by in configs.items():
        any_r = next(iter(by.values()))
        cells = [f"{by[s]['cpu']:6.1f} ({by[s]['seconds']:6.1f})" if s in by else f"{'-':>16}" for s in solvers]
        plan = ("infeasible" if any_r.get("infeasible") else
                f"{any_r['step_s']:.4g} s/step, {any_r['remat']}"
                + (f", {any_r['microbatches']} mb" if any_r["microbatches"] > 1 else ""))
        print(f"{space:6} {layers:>6} {mesh:30} {any_r['devices']:>7} {any_r['axes']:>4}  "
              + "  ".join(f"{c:>16}" for c in cells) + f"  {plan}")


def headline(results: list[dict], rows: list[tuple] = HEADLINE) -> None:
    """The joint searches (layout, remat, accumulation, pipelines where asked) at the default memory limit."""
    print("\n# the joint search (layout, remat, gradient accumulation; pipelines where asked), default memory limit")
    for name, model_kw, mesh, hw, kw in rows:
        r = run(model_kw, mesh, "rules", "auto", hw=hw, **kw)
        r["name"] = name
        show(r)
        results.append(r)

CLI_ROOT = Path(__file__).resolve().parents[1]
GPT3 = "gpt --set preset=gpt3-175b"
CLI_ROWS = [  # (what, arguments of `layoutsearch search`, target wall seconds on 2 cores)
    ("gpt3-175b 1024 v4, pipelines", f"{GPT3} --mesh data:16,fsdp:8,model:8 --hardware tpu-v4 --pipeline auto", 10),
    ("megatron-145.6b 1536 a100, pipelines",
     "gpt --set preset=megatron-145.6b --set batch=2304 --mesh pipe:8,data:24,model:8 --hardware a100 "
     "--pipeline auto", 10),
    ("llama3-70b 512 h100", "gpt --set preset=llama3-70b --mesh data:8,fsdp:8,model:8 --hardware h100", 10),
    ("gpt3-175b 8192 v5p, 4 axes", f"{GPT3} --set batch=2048 --mesh data:32,fsdp:16,model:8,seq:2 --hardware tpu-v5p",
     10),
    ("gpt3-175b 8192 v5p, 4 axes, pipelines",
     f"{GPT3} --set batch=2048 --mesh data:32,fsdp:16,model:8,seq:2 --hardware tpu-v5p --pipeline auto", 20),
]
DEVICE_ROWS = [(n, f"{GPT3} --set batch=2048 --mesh {mesh} --hardware tpu-v5p")
               for n, mesh in ((64, "data:4,fsdp:4,model:4"), (512, "data:8,fsdp:8,model:8"),
                               (4096, "data:64,fsdp:8,model:8"), (8192, "data:128,fsdp:8,model:8"))]
LAYER_ROWS = [(n, f"{GPT3} --set layers={n} --mesh data:16,fsdp:8,model:8 --hardware tpu-v4") for n in (12, 48, 96, 192)]
LIMIT_ROWS = [(t, f"{GPT3} --mesh data:16,fsdp:8,model:8 --hardware tpu-v4 --pipeline auto --time-limit {t}")
              for t in (5, 20)]


def cli_run(args: str, processes: int | None = None) -> dict:
    """``layoutsearch search ARGS --json`` in a fresh process: wall and CPU seconds (its forked helpers'
    included), and the plan it printed. ``processes``: ``LAYOUTSEARCH_PROCESSES`` (1: no bound build split over
    processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(CLI_ROOT)}
    if processes is not None:
        env["LAYOUTSEARCH_PROCESSES"] = str(processes)
    proc = subprocess.run([sys.executable, str(CLI_ROOT / "cli.py"), "search", *shlex.split(args), "--json"],
                          cwd=CLI_ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row = {"args": args, "wall": wall, "cpu": cpu, "rc": proc.returncode}
    if proc.returncode == 0:
        d = json.loads(proc.stdout)
        row.update(rules=d["layout"]["rules_text"], step_s=d["step_s"], optimal=d["optimal"],
                   cut_short=d.get("cut_short", []), decisions=d["remat"], microbatches=d["microbatches"],
                   stage_axis=d["stage_axis"], runner_ups=[r["rules"] for r in d["runner_ups"]],
                   baselines=sum(b["step_s"] is not None for b in d["baselines"]))
    else:
        row["error"] = proc.stderr.strip().splitlines()[-1:] or ["?"]
    return row


def cli_show(label: str, r: dict, target: float | None = None) -> None:
    verdict = "" if target is None else ("  <= target" if r["wall"] <= target else f"  OVER the {target:g} s target")
    if r["rc"]:
        print(f"{label:44} {r['wall']:6.1f} s wall {r['cpu']:6.1f} s cpu  exit {r['rc']}: {r['error'][0]}", flush=True)
        return
    plan = (f"{r['step_s']:.4g} s/step, remat {r['decisions']}" + (f", {r['microbatches']} mb" if r["microbatches"] > 1
            else "") + (f", stages over {r['stage_axis']}" if r["stage_axis"] else ""))
    print(f"{label:44} {r['wall']:6.1f} s wall {r['cpu']:6.1f} s cpu{verdict}  {'proven' if r['optimal'] else 'not proven'}"
          f"  {plan}  {r['rules']}", flush=True)


def cli_bench(plot: Path) -> list[dict]:
    """The CLI's default searches beside ``--top 1``, the time limits, and the scaling rows (drawn to ``plot``)."""
    load = os.getloadavg()[0]
    print(f"# the CLI's default searches, one fresh process each (load average {load:.2f} at start)", flush=True)
    out = []
    for what, args, target in CLI_ROWS:
        for top in ("", " --top 1"):
            r = cli_run(args + top)
            r["what"] = what + top
            cli_show(what + (top or " (defaults)"), r, target if not top else None)
            out.append(r)
        r = cli_run(args, processes=1)
        r["what"] = what + " one process"
        cli_show(what + " (one process)", r)
        out.append(r)
    print("\n# --time-limit T: the answer (baselines included) within T + 10% + 1 s of start-up", flush=True)
    for t, args in LIMIT_ROWS:
        r = cli_run(args)
        r["what"], r["limit"] = f"--time-limit {t}", t
        cli_show(f"--time-limit {t} (gpt3-175b 1024 v4, pipelines)", r, 1.1 * t + 1)
        out.append(r)
    scaling: dict[str, list[tuple[int, float]]] = {"devices": [], "layers": []}
    print("\n# against devices: gpt3-175b, batch 2048, tpu-v5p, 3 axes (defaults)", flush=True)
    for n, args in DEVICE_ROWS:
        r = cli_run(args)
        r["what"], r["devices"] = f"{n} devices", n
        cli_show(f"{n} devices", r)
        scaling["devices"].append((n, r["wall"]))
        out.append(r)
    print("\n# against layers: gpt3-175b widths on 1024 v4 (defaults)", flush=True)
    for n, args in LAYER_ROWS:
        r = cli_run(args)
        r["what"], r["layers"] = f"{n} layers", n
        cli_show(f"{n} layers", r)
        scaling["layers"].append((n, r["wall"]))
        out.append(r)
    _plot(scaling, plot)
    print(f"\n# drawn: {plot.relative_to(CLI_ROOT)}")
    return out


def _plot(scaling: dict[str, list[tuple[int, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (what, points) in zip(axes, scaling.items(), strict=True):
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, "o-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(what)
        ax.set_ylabel("wall seconds, `layoutsearch search` (defaults)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("gpt3-175b, tpu-v5p, 3 axes")
    axes[1].set_title("gpt3-175b widths, 1024 tpu-v4")
    fig.suptitle(f"search time, one fresh process each ({datetime.date.today()}, {os.cpu_count()} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a CI-sized sweep")
    ap.add_argument("--headline", action="store_true",
                    help="only the joint searches of the issue's two headline problems (and accumulation alone)")
    ap.add_argument("--cli", action="store_true", help="the CLI's default searches, one fresh process each")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    gpt3 = {"preset": "gpt3-175b"}
    results = []
    flag = " --quick" if args.quick else " --headline" if args.headline else " --cli" if args.cli else ""
    print(f"# bench/bench_search.py{flag}, {datetime.date.today()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}", flush=True)
    if args.cli:
        results = cli_bench(CLI_ROOT / "bench" / "search_scaling.png")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    if args.headline:
        headline(results)
        summary(results)
        return
    solvers = SOLVERS
    layers = (2, 8, 128) if args.quick else (2, 8, 24, 48, 96, 128)
    print("\n# model size (GPT-3 175B widths), 1024 devices, 3 axes, rules space")
    for n in layers:
        for solver in solvers:
            r = run({**gpt3, "layers": n}, TARGET, "rules", solver)
            show(r)
            results.append(r)
    print("\n# devices and mesh axes, GPT-3 175B (96 layers), rules space")
    for devices, meshes in (QUICK_MESHES if args.quick else MESHES).items():
        for mesh in meshes:
            if mesh == TARGET and 96 in layers:
                continue  # measured above
            for solver in QUICK_SOLVERS if args.quick else solvers:
                r = run(gpt3, mesh, "rules", solver)
                show(r)
                results.append(r)
    if not args.quick:
        print("\n# layers space (one rule set per repeated layer), GPT-3 175B, 1024 devices, 3 axes")
        for solver in ("ilp-pulp", "ilp-ortools"):  # dp: a chain only without remat factors
            r = run(gpt3, TARGET, "layers", solver)
            show(r)
            results.append(r)
        print("\n# ops space (per-op layouts, parameter storage), GPT 4 layers d_model 1024, 8 devices, 60 s limit")
        small = {"layers": 4, "d_model": 1024, "heads": 16, "seq": 1024, "batch": 16, "vocab": 32768}
        for solver in ("ilp-pulp", "ilp-ortools"):
            r = run(small, "data:2,model:4", "ops", solver, hw="h100", time_limit=60)
            show(r)
            results.append(r)
        print("\n# ops space at scale (issue item 6): GPT-3 175B, 96 tied layers, 64 devices, no memory limit (on 64 "
              "devices nothing fits 32 GiB: the rules space proves 174 GiB the smallest peak), 240 s limit")
        for solver in ("ilp-pulp", "ilp-ortools"):
            r = run(gpt3, "data:8,model:8", "ops", solver, memory_limit=None, time_limit=240)
            show(r)
            results.append(r)
    headline(results, HEADLINE[1:2] if args.quick else HEADLINE)
    summary(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
