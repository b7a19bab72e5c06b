"""``layoutsearch import MODULE:FUNCTION --dims SPEC.json --out GRAPH.json``: a JAX function as a graph file."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command
from layoutsearch.errors import LayoutSearchError


def add(sub: Any) -> None:
    p = command(sub, "import", run, "a JAX/Flax loss function of your code as a graph file (traced, dims named "
                "from the spec file; see docs/import.md)", render=render)
    p.add_argument("target", metavar="MODULE:FUNCTION",
                   help="the loss function: MODULE:FUNCTION, the module looked up in the current directory, then on "
                        "the Python path (e.g. mymodel:loss), or PATH.py:FUNCTION, a file (e.g. src/mymodel.py:loss)")
    p.add_argument("--dims", required=True, metavar="SPEC.json",
                   help='the example arguments: {"args": [{"dims": [...], "shape": [...]}, ...], "splits": {...}}')
    p.add_argument("--out", metavar="GRAPH.json", help="write the graph file (for cost, search, run ...)")
    p.add_argument("--name", help="the graph's name (default: the function's)")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.importer import from_spec_file
    from layoutsearch.ir.serialize import save_graph

    graph = from_spec_file(args.target, args.dims, name=args.name)
    if args.out:
        try:
            save_graph(graph, args.out)
        except OSError as e:
            raise LayoutSearchError(f"cannot write {args.out!r}: {e}") from None
    return {"target": args.target, "graph": graph.name, "out": args.out, "ops": len(graph.ops),
            "dims": dict(graph.dims), "parameters": [t.name for t in graph.parameters],
            "inputs": [t.name for t in graph.inputs]}


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    dims = ", ".join(f"{k}={v}" for k, v in result["dims"].items())
    lines = [f"imported {result['target']} as graph {result['graph']!r}: {result['ops']} ops, "
             f"{len(result['parameters'])} parameters, {len(result['inputs'])} inputs",
             f"dims: {dims}"]
    if result["out"]:
        lines.append(f"wrote {result['out']}")
    return lines
