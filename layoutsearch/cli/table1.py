"""``layoutsearch table1``: Table 1 of the Mesh-TensorFlow paper for mtf-ffn, formulas beside predicted and
compiled communication, FLOPs and memory."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command, mesh_of, table
from layoutsearch.errors import LayoutSearchError


def add(sub: Any) -> None:
    from layoutsearch.table1 import DEFAULT_MESH, DEFAULT_SIZES

    p = command(sub, "table1", run, "Table 1 of the Mesh-TensorFlow paper for mtf-ffn: formulas, predicted "
                "and compiled communication, FLOPs and memory of four layouts, side by side", render=render)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="sizes: " + ", ".join(f"{k}={v}" for k, v in DEFAULT_SIZES.items()) + " (the defaults)")
    p.add_argument("--mesh", default=DEFAULT_MESH, metavar="AXES",
                   help=f"2-D mesh rows:R,cols:C (default {DEFAULT_MESH}); batch goes on rows, hidden on cols")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="skip the compiled program (formulas and predictions only; no JAX)")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.table1 import DEFAULT_SIZES, table1
    from layoutsearch.zoo import parse_overrides

    sizes = parse_overrides(args.overrides)
    unknown = [k for k in sizes if k not in DEFAULT_SIZES]
    if unknown:
        raise LayoutSearchError(f"table1 has no size {', '.join(map(repr, unknown))} (sizes: {', '.join(DEFAULT_SIZES)})")
    return table1(**sizes, mesh=mesh_of(args), compiled=args.compile)


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    sz = result["sizes"]
    out: list[Any] = [(f"Mesh-TensorFlow Table 1: {result['model']} b={sz['batch']} io={sz['io']} h={sz['hidden']}, "
                       f"{result['dtype']}, {result['optimizer']}, mesh {result['mesh']} (r={result['r']}, "
                       f"c={result['c']}, n={result['n']}); bytes: collective payload per device per step")]
    compiled = all("compiled" in r for r in result["rows"])
    cols = ["layout", "rules", "comm formula", "formula B", "predicted B"]
    cols += ["compiled B", "match"] if compiled else []
    cols += ["matmul FLOPs formula", "formula", "predicted FLOPs"]
    cols += ["compiled FLOPs"] if compiled else []
    cols += ["predicted memory B"]
    cols += ["compiled memory B"] if compiled else []
    rows = []
    for r in result["rows"]:
        p = r["predicted"]
        row = [r["layout"], r["rules"] or "-", r["comm_formula"], r["comm_formula_bytes"], p["comm_bytes"]]
        if compiled:
            row += [r["compiled"]["comm_bytes"], "yes" if r["comm_match"] else "NO"]
        row += [r["flops_formula"], r["matmul_flops_formula"], int(p["flops"])]
        if compiled:
            row += [int(r["compiled"]["flops"])]
        row += [p["memory_bytes"]]
        if compiled:
            row += [r["compiled"]["memory_bytes"]]
        rows.append(row)
    out.append(table(cols, rows))
    detail = []
    for r in result["rows"]:
        for side in ("predicted", "compiled"):
            for c in r.get(side, {}).get("collectives", []):
                detail.append([r["layout"], side, c["kind"], "+".join(c["axes"] or ["?"]), c["bytes"]])
    if detail:
        out.append(table(["layout", "source", "collective", "axes", "bytes"], detail, title="collectives"))
    return out
