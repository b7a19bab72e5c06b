"""The device-placement comparison of Tarnawski et al. 2020 on every instance as shipped.

    .venv/bin/python bench/bench_placement.py [--dir /work/shared/placement] [--time-limit 60] [--out bench/RESULTS_placement.md]

Per instance (throughput inputs: the throughput objective; latency inputs: latency; inference and training,
layer and operator graphs): the contiguous optimum (the DP for throughput; the CP-SAT ILP within the time
limit for latency, started from the local-search heuristic and shown beside it), the non-contiguous ILP (throughput; CP-SAT started
from the contiguous optimum, within the time limit), each with its proof status or gap and time, and the
baselines (one device, equal split, PipeDream-style planner, local search, the human expert where there is
one) as the ratio optimum / baseline (below 1: the optimum is better). Writes a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layoutsearch.costdag import load_costdag  # noqa: E402
from layoutsearch.errors import LayoutSearchError  # noqa: E402
from layoutsearch.solvers.partition import baselines, partition  # noqa: E402

SHORT = {"one accelerator": "one", "equal split": "equal", "PipeDream-style planner": "pipedream",
         "human expert": "expert"}


def status(part) -> str:
    return "proven" if part.optimal else (f"gap {part.gap:.1%}" if part.gap is not None else "not proven")


def run(path: Path, root: Path, limit: float) -> list[str]:
    """One table row per objective setting of the instance."""
    dag = load_costdag(path)
    objective = "latency" if path.parts[-3] == "latency-inputs" else "throughput"
    cells = [f"{path.parent.name.removesuffix('Graphs').lower()}/{path.stem}", objective,
             f"{len(dag.nodes)}", f"{dag.devices[0].count}+{dag.devices[1].count}"]
    t = time.perf_counter()
    solver = "auto" if objective == "throughput" else "ilp-ortools"
    best = partition(dag, objective=objective, solver=solver, time_limit=limit)
    bound = best.info.get("lower_bound")
    cells += [f"{best.objective:.4f}", status(best), "—" if best.optimal or bound is None else f"{bound:.4f}",
              f"{time.perf_counter() - t:.1f}"]
    if objective == "latency":
        t = time.perf_counter()
        heur = partition(dag, objective=objective, solver="local", time_limit=min(limit, 10.0))
        cells.append(f"{heur.objective:.4f} ({time.perf_counter() - t:.1f} s)")
    else:
        t = time.perf_counter()
        try:
            nc = partition(dag, objective=objective, contiguous=False, solver="ilp-ortools", time_limit=limit)
            cells.append(f"{nc.objective:.4f}, {status(nc)} ({time.perf_counter() - t:.0f} s)")
        except LayoutSearchError as e:
            cells.append(f"— ({str(e)[:40]})")
    rows = baselines.placement_baselines(dag, objective, 1, time_limit=min(limit, 10.0))
    expert = root / "human-experts" / f"{path.stem}_expert.json"
    if objective == "throughput" and path.parent.name == "LayerGraphs" and expert.exists():
        rows.append(baselines.expert_split(dag, baselines.read_expert(expert, dag), objective, 1))
    ratios = {}
    for b in rows:
        name = "local" if b.method.startswith("local") else SHORT.get(b.method, b.method)
        ratios[name] = f"{best.objective / b.objective:.3f}" if b.objective else "—"
    cells += [ratios.get(k, "—") for k in ("one", "equal", "pipedream", "local", "expert")]
    return cells


HEADER = ["instance", "objective", "nodes", "acc+cpu", "contiguous optimum", "status", "lower bound", "time s",
          "latency heuristic / non-contiguous ILP", "/one", "/equal", "/pipedream", "/local", "/expert"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/work/shared/placement", type=Path)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per ILP solve (default 60)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS_placement.md"))
    args = ap.parse_args()
    files = sorted(args.dir.glob("throughput-inputs/*/*.json")) + sorted(args.dir.glob("latency-inputs/*/*.json"))
    lines = [f"# Device placement: Tarnawski et al. 2020 instances as shipped ({datetime.date.today()})", "",
             f"Command: `.venv/bin/python bench/bench_placement.py --time-limit {args.time_limit:g}` "
             "(one process, this machine: 2 cores shared with other jobs).", "",
             "Times in the instances' own unit. `contiguous optimum`: the DP (throughput) or, for latency, the "
             "CP-SAT ILP within the time limit started from the local-search heuristic (the better of the two is "
             "returned; `gap`: against `lower bound`, the best of the solver's bound, the longest path of the "
             "nodes' fastest times, the relaxation without communication and the path bound). Next column: for latency the "
             "local search heuristic's value and time alone, for throughput the non-contiguous CP-SAT ILP started "
             "from the contiguous optimum improved by local search, with its gap against the relaxation without "
             "communication or the solver's bound. `/x`: optimum / baseline x (one device, equal split, "
             "PipeDream-style planner, local search, human expert; priced as they are: one device may exceed "
             "its memory).", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for path in files:
        try:
            cells = run(path, args.dir, args.time_limit)
        except LayoutSearchError as e:
            cells = [path.stem, "error: " + str(e)[:80]] + [""] * (len(HEADER) - 2)
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
