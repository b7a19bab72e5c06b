"""``layoutsearch graph``: a model's graph summarized, or written as a JSON graph file."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, add_model_args, command, load_graph, table
from layoutsearch.errors import LayoutSearchError
from layoutsearch.units import format_bytes


def add(sub: Any) -> None:
    p = command(sub, "graph", run, "summarize a model's graph, or write it as a JSON graph file", render=render)
    add_model_args(p)
    p.add_argument("--out", metavar="FILE", help="write the graph as a JSON graph file instead of summarizing it")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.ir import save_graph

    graph = load_graph(args)
    if not args.out:
        return graph.summary()
    try:
        save_graph(graph, args.out)
    except OSError as e:
        raise LayoutSearchError(f"cannot write graph file {args.out!r}: {e.strerror}") from None
    return {"model": graph.name, "written": args.out, "tensors": len(graph.tensors), "ops": len(graph.ops)}


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    if "written" in result:
        return [(f"wrote graph {result['model']!r} ({result['tensors']} tensors, {result['ops']} ops) "
                 f"to {result['written']}")]
    return [
        (f"model {result['model']}: {result['tensors']} tensors, {result['ops']} ops, "
         f"{result['parameter_count']:,} parameters ({format_bytes(result['parameter_bytes'])}), loss {result['loss']}"),
        table(["dim", "size"], result["dims"].items(), title="dims"),
        table(["op kind", "count"], result["ops_by_kind"].items(), title="ops"),
        table(["input", "shape", "dtype"], ([t["name"], t["shape"], t["dtype"]] for t in result["inputs"]),
              title="inputs"),
        table(["parameter", "shape", "dtype", "elements", "bytes"], _folded(result["parameters"]),
              title="parameters (of repeated blocks: each block's)"),
    ]


def _folded(parameters: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per parameter, those of repeated blocks folded into one (``layer.*/wi``, each block's figures,
    the count beside the name): the table stays short for any number of layers."""
    from layoutsearch.ir.names import fold_block_numbers

    rows: dict[tuple[str, str, str], list[Any]] = {}
    for p in parameters:
        key = (fold_block_numbers(p["name"]), str(p["shape"]), p["dtype"])
        if key in rows:
            rows[key][-1] += 1
        else:
            rows[key] = [key[0], p["shape"], p["dtype"], p["elements"], p["bytes"], 1]
    return [[name if n == 1 else f"{name} (x{n})", *rest] for name, *rest, n in rows.values()]
