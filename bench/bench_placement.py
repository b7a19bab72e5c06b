"""The device-placement comparison of Tarnawski et al. 2020 on every instance as shipped.

    .venv/bin/python bench/bench_placement.py [--dir /work/shared/placement] [--time-limit 60] [--out bench/RESULTS_placement.md]
        [--only schedule]

Per instance (throughput inputs: the throughput objective; latency inputs: latency; inference and training,
layer and operator graphs): the contiguous optimum (the DP for throughput; the CP-SAT ILP within the time
limit for latency, started from the local-search heuristic and shown beside it), the non-contiguous ILP (throughput; CP-SAT started
from the contiguous optimum, within the time limit), each with its proof status or gap and time, and the
baselines (one device, equal split, PipeDream-style planner, local search, the human expert where there is
one) as the ratio optimum / baseline (below 1: the optimum is better). Writes a Markdown table, then a second
one: the non-contiguous latency (a node-level schedule) of the layer-graph latency instances, by the
scheduling ILP within the time limit and by the list scheduler alone (``--only schedule``: that table alone,
spliced into ``--out``).
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


SCHEDULE_HEADER = ["instance", "nodes", "acc+cpu", "non-contiguous latency", "status", "lower bound", "time s",
                   "list scheduling (time)", "contiguous latency (table above)", "/contiguous"]
SCHEDULE_TITLE = "## Non-contiguous latency (node-level schedules)"


def run_schedule(path: Path, limit: float, contiguous: dict[str, float]) -> list[str]:
    """One row of the non-contiguous latency table: the scheduling ILP (CP-SAT, started from the list
    scheduler, within ``limit`` seconds all told) and the list scheduler alone."""
    dag = load_costdag(path)
    name = f"{path.parent.name.removesuffix('Graphs').lower()}/{path.stem}"
    cells = [name, f"{len(dag.nodes)}", f"{dag.devices[0].count}+{dag.devices[1].count}"]
    t = time.perf_counter()
    best = partition(dag, objective="latency", contiguous=False, solver="ilp-ortools", time_limit=limit)
    bound = best.info.get("lower_bound")
    cells += [f"{best.objective:.4f}", status(best), "—" if best.optimal or bound is None else f"{bound:.4f}",
              f"{time.perf_counter() - t:.1f}"]
    t = time.perf_counter()
    heur = partition(dag, objective="latency", contiguous=False, solver="local", time_limit=min(limit, 30.0))
    cells.append(f"{heur.objective:.4f} ({time.perf_counter() - t:.1f} s)")
    base = contiguous.get(name)
    cells += [f"{base:.4f}" if base else "—", f"{best.objective / base:.3f}" if base else "—"]
    return cells


def schedule_section(root: Path, limit: float, contiguous: dict[str, float]) -> list[str]:
    """The non-contiguous latency table (layer graphs: the operator graphs' disjunctive ILPs are too large)."""
    lines = [SCHEDULE_TITLE, "",
             f"Command: `.venv/bin/python bench/bench_placement.py --time-limit {limit:g} --only schedule` (this "
             f"machine, {datetime.date.today()}). A device may hold several pieces of the graph; the latency is "
             "the makespan of a node-level schedule (P|prec,c_ij|Cmax: a device runs one node at a time, a node "
             "starts when its predecessors have finished plus, across devices, the edge's transfer paid by each "
             "non-host end), which for a contiguous placement is at most its contiguous latency. "
             "`non-contiguous latency`: the scheduling ILP (CP-SAT), started from and capped by the list "
             "scheduler (HEFT-style, also from the contiguous latency heuristic's placement, then local search), "
             "within the time limit all told; `gap` against `lower bound` (the longest path of fastest times, "
             "the relaxation without communication, a path cut into runs with their transfers and memory, "
             "the solver's bound). `list scheduling`: the heuristic alone (`solver=\"local\"`). `/contiguous`: "
             "this latency / the contiguous latency optimum of the table above.", "",
             "| " + " | ".join(SCHEDULE_HEADER) + " |", "|" + "---|" * len(SCHEDULE_HEADER)]
    for path in sorted(root.glob("latency-inputs/LayerGraphs/*.json")):
        try:
            cells = run_schedule(path, limit, contiguous)
        except LayoutSearchError as e:
            cells = [path.stem, "error: " + str(e)[:80]] + [""] * (len(SCHEDULE_HEADER) - 2)
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def contiguous_latencies(text: str) -> dict[str, float]:
    """The contiguous latency optima of a results table: instance -> value."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(HEADER) and cells[1] == "latency":
            try:
                out[cells[0]] = float(cells[4])
            except ValueError:
                pass
    return out


def splice(text: str, section: list[str]) -> str:
    """``text`` with its non-contiguous latency section replaced by (or followed by) ``section``."""
    head = text.split("\n" + SCHEDULE_TITLE)[0].rstrip("\n")
    return head + "\n\n" + "\n".join(section) + "\n"


HEADER = ["instance", "objective", "nodes", "acc+cpu", "contiguous optimum", "status", "lower bound", "time s",
          "latency heuristic / non-contiguous ILP", "/one", "/equal", "/pipedream", "/local", "/expert"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/work/shared/placement", type=Path)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per ILP solve (default 60)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS_placement.md"))
    ap.add_argument("--only", choices=["schedule"], help="schedule: only the non-contiguous latency table, "
                    "spliced into --out (its contiguous latencies read from there)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.only == "schedule":
        text = out.read_text() if out.exists() else ""
        out.write_text(splice(text, schedule_section(args.dir, args.time_limit, contiguous_latencies(text))))
        return
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
        out.write_text("\n".join(lines) + "\n")
    text = out.read_text()
    out.write_text(splice(text, schedule_section(args.dir, args.time_limit, contiguous_latencies(text))))


if __name__ == "__main__":
    main()
