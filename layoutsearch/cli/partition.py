"""``layoutsearch partition``: a cost DAG split into pipeline stages, against the equal split."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command, table
from layoutsearch.errors import PartitionError
from layoutsearch.units import format_bytes, parse_bytes
from layoutsearch.units import format_seconds as _format_seconds

_GANTT_CELLS = 10**6
"""The largest schedule chart drawn (stages x steps)."""


def add(sub: Any) -> None:
    from layoutsearch.costdag import FORMATS
    from layoutsearch.solvers.partition import OBJECTIVES, SOLVERS

    p = command(sub, "partition", run, "split a cost DAG (JSON file, see docs/costdag.md) into pipeline "
                "stages: per-stage load and memory, and for gpipe the bubble and the schedule", render=render)
    p.add_argument("file", metavar="FILE", help="cost DAG JSON file (docs/costdag.md) or a Tarnawski et al. "
                   "placement instance")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="file format: layoutsearch or tarnawski (default auto: detected)")
    p.add_argument("--stages", type=int, metavar="K", help="number of pipeline stages (for a DAG with device "
                   "kinds: of accelerators, overriding the file)")
    p.add_argument("--at-most", action="store_true",
                   help="use at most K stages (default for DAGs with device kinds; exactly K otherwise)")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                   help="throughput: minimize the largest load (compute + transfers); latency: one sample's "
                        "end-to-end time (no pipelining); gpipe: (M + K - 1) x the slowest stage time")
    p.add_argument("--expert", metavar="FILE", help="a human expert's split to compare with (Tarnawski et al. format)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="micro-batches per step: the GPipe schedule length and the activations in flight (default 1)")
    p.add_argument("--memory-limit", metavar="BYTES", help="per-stage memory limit, e.g. 16GiB or 2e10")
    p.add_argument("--non-contiguous", action="store_true",
                   help="let a stage hold any set of nodes (throughput and latency; for latency a node-level "
                        "schedule, each device's nodes listed in the order it runs them)")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="dp (exact, contiguous), ilp-pulp, ilp-ortools, brute (tiny DAGs); default auto")
    p.add_argument("--time-limit", type=float, metavar="S", help="stop an ILP after S seconds with its best partition")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.costdag import load_costdag
    from layoutsearch.gantt import render_gantt
    from layoutsearch.solvers.partition import against_equal_split, baselines, partition

    dag = load_costdag(args.file, args.format)
    if args.stages is None and not dag.devices:
        raise PartitionError("give --stages K: the cost DAG names no devices")
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    at_most = True if args.at_most else None
    part = partition(dag, args.stages, objective=args.objective, microbatches=args.microbatches, memory_limit=limit,
                     contiguous=not args.non_contiguous, solver=args.solver, time_limit=args.time_limit,
                     at_most=at_most)
    result: Result = {"dag": dag.name, "file": args.file, "nodes": len(dag.nodes), "edges": len(dag.edges),
                      "num_stages": part.num_stages, "memory_limit": limit, "contiguous": not args.non_contiguous,
                      "time_unit": dag.time_unit}
    result.update(part.to_dict())
    rows = []
    if not dag.devices and (args.objective == "gpipe" or not args.non_contiguous):
        result["baseline"] = against_equal_split(dag, part)
    if dag.devices:
        rows += baselines.placement_baselines(dag, args.objective, args.microbatches, args.stages, limit)
    if args.expert:
        split = baselines.read_expert(args.expert, dag)
        rows.append(baselines.expert_split(dag, split, args.objective, args.microbatches, args.stages, limit))
    if rows:
        result["baselines"] = [{"method": b.method, "objective": b.objective, "devices": b.num_stages,
                                "optimal_over_baseline": part.objective / b.objective if b.objective else None}
                               for b in rows]
    if args.objective == "gpipe":
        cells = part.num_stages * (args.microbatches + part.num_stages - 1)
        result["gantt"] = (render_gantt(part.num_stages, args.microbatches, times=list(part.loads))
                           if cells <= _GANTT_CELLS else f"(schedule chart not drawn: {cells:,} cells)")
    return result


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    unit = result.get("time_unit", "s")

    def format_seconds(t: float) -> str:  # the DAG's own unit when its times are not seconds
        return _format_seconds(t) if unit == "s" else f"{t:.6g} {unit}{'s' if unit == 'unit' else ''}"

    kind = result["objective_kind"]
    what = (f"step time {format_seconds(result['objective'])} over {result['microbatches']} micro-batches" if kind == "gpipe"
            else f"latency {format_seconds(result['objective'])} per sample" if kind == "latency"
            else f"largest stage load {format_seconds(result['objective'])} per micro-batch")
    status = "optimal" if result["optimal"] else (f"not proven optimal, gap {result['gap']:.1%}"
                                                   if result["gap"] is not None else "not proven optimal")
    out: list[Any] = [(f"cost DAG {result['dag']}: {result['nodes']} nodes, {result['edges']} edges -> "
                       f"{result['num_stages']} {'contiguous' if result['contiguous'] else 'non-contiguous'} "
                       f"{'devices' if 'device' in (result['stages'] or [{}])[0] else 'stages'}; "
                       f"{kind}: {what} ({status}, {result['method']})")]
    rows = []
    for k, s in enumerate(result["stages"]):
        names = s["nodes"]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
        rows.append([s.get("device", k), len(names), span, format_seconds(s["load"]), format_bytes(s["memory"])])
    load_col = "time per micro-batch" if kind == "gpipe" else "load"
    out.append(table(["device" if "device" in (result["stages"] or [{}])[0] else "stage", "nodes", "first .. last",
                      load_col, "memory"], rows))
    if result.get("memory_limit") is not None:
        out.append(f"memory limit {format_bytes(result['memory_limit'])} per stage")
    if "baseline" in result:
        b = result["baseline"]
        ratio = b["optimal_over_baseline"]
        out.append(f"baseline ({b['method']}): {format_seconds(b['objective'])}"
                   + (f"; this partition is {1 / ratio:.2f}x faster" if ratio else ""))
    for b in result.get("baselines", []):
        ratio = b["optimal_over_baseline"]
        out.append(f"baseline ({b['method']}, {b['devices']} devices): {format_seconds(b['objective'])}"
                   + (f"; optimum / baseline = {ratio:.3f}" if ratio is not None else ""))
    if kind == "gpipe":
        out.append(f"bubble fraction {result['bubble_fraction']:.1%}")
        out.append(result["gantt"])
    return out
