"""``layoutsearch partition``: a cost DAG split into pipeline stages, against the equal split."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command, table
from layoutsearch.units import format_bytes, format_seconds, parse_bytes


def add(sub: Any) -> None:
    from layoutsearch.solvers.partition import OBJECTIVES, SOLVERS

    p = command(sub, "partition", run, "split a cost DAG (JSON file, see docs/costdag.md) into pipeline "
                "stages: per-stage load and memory, and for gpipe the bubble and the schedule", render=render)
    p.add_argument("file", metavar="FILE", help="cost DAG JSON file (format: docs/costdag.md)")
    p.add_argument("--stages", type=int, required=True, metavar="K", help="number of pipeline stages")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                   help="throughput: minimize the largest stage load (compute + transfers); gpipe: minimize "
                        "(M + K - 1) x the slowest stage time (default throughput)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="micro-batches per step: the GPipe schedule length and the activations in flight (default 1)")
    p.add_argument("--memory-limit", metavar="BYTES", help="per-stage memory limit, e.g. 16GiB or 2e10")
    p.add_argument("--non-contiguous", action="store_true",
                   help="let a stage hold any set of nodes (throughput only; solved by an ILP)")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="dp (exact, contiguous), ilp-pulp, ilp-ortools, brute (tiny DAGs); default auto")
    p.add_argument("--time-limit", type=float, metavar="S", help="stop an ILP after S seconds with its best partition")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.costdag import load_costdag
    from layoutsearch.gantt import render_gantt
    from layoutsearch.solvers.partition import against_equal_split, partition

    dag = load_costdag(args.file)
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    part = partition(dag, args.stages, objective=args.objective, microbatches=args.microbatches, memory_limit=limit,
                     contiguous=not args.non_contiguous, solver=args.solver, time_limit=args.time_limit)
    result: Result = {"dag": dag.name, "file": args.file, "nodes": len(dag.nodes), "edges": len(dag.edges),
                      "num_stages": args.stages, "memory_limit": limit, "contiguous": not args.non_contiguous}
    result.update(part.to_dict())
    if args.objective == "gpipe" or not args.non_contiguous:
        result["baseline"] = against_equal_split(dag, part)
    if args.objective == "gpipe":
        result["gantt"] = render_gantt(args.stages, args.microbatches, times=list(part.loads))
    return result


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    kind = result["objective_kind"]
    what = (f"step time {format_seconds(result['objective'])} over {result['microbatches']} micro-batches" if kind == "gpipe"
            else f"largest stage load {format_seconds(result['objective'])} per micro-batch")
    status = "optimal" if result["optimal"] else (f"not proven optimal, gap {result['gap']:.1%}"
                                                   if result["gap"] is not None else "not proven optimal")
    out: list[Any] = [(f"cost DAG {result['dag']}: {result['nodes']} nodes, {result['edges']} edges -> "
                       f"{result['num_stages']} {'contiguous' if result['contiguous'] else 'non-contiguous'} stages; "
                       f"{kind}: {what} ({status}, {result['method']})")]
    rows = []
    for k, s in enumerate(result["stages"]):
        names = s["nodes"]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
        rows.append([k, len(names), span, format_seconds(s["load"]), format_bytes(s["memory"])])
    load_col = "time per micro-batch" if kind == "gpipe" else "load"
    out.append(table(["stage", "nodes", "first .. last", load_col, "memory"], rows))
    if result.get("memory_limit") is not None:
        out.append(f"memory limit {format_bytes(result['memory_limit'])} per stage")
    if "baseline" in result:
        b = result["baseline"]
        ratio = b["optimal_over_baseline"]
        out.append(f"baseline ({b['method']}): {format_seconds(b['objective'])}"
                   + (f"; this partition is {1 / ratio:.2f}x faster" if ratio else ""))
    if kind == "gpipe":
        out.append(f"bubble fraction {result['bubble_fraction']:.1%}")
        out.append(result["gantt"])
    return out
