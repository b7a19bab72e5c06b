"""``layoutsearch costdag``: a model's pipeline cost DAG, written for ``layoutsearch partition``."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, add_case_args, case_of, command


def add(sub: Any) -> None:
    p = command(sub, "costdag", run, "write a model's pipeline cost DAG (blocks priced by the cost model "
                "on one micro-batch under a layout inside a stage) for `layoutsearch partition`")
    add_case_args(p)
    p.add_argument("--microbatches", type=int, default=1, metavar="M", help="micro-batches per step (default 1)")
    p.add_argument("--remat", choices=("none", "selective", "full"), default="none",
                   help="activation rematerialization inside each block: none (default), selective or full")
    p.add_argument("--out", required=True, metavar="FILE", help="cost DAG JSON file to write")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.costmodel.pipeline import pipeline_costdag

    graph, layout, hw = case_of(args)
    dag, _, _ = pipeline_costdag(graph, layout, "stage", hw, microbatches=args.microbatches, remat=args.remat,
                                 optimizer=args.optimizer, precision=args.precision)
    dag.save(args.out)
    return {"model": graph.name, "out": args.out, "nodes": [n.name for n in dag.nodes],
            "compute_s": sum(n.compute_s for n in dag.nodes), "microbatches": args.microbatches,
            "remat": args.remat}
