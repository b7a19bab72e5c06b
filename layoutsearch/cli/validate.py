"""``layoutsearch validate``: predicted against compiled collectives, FLOPs and memory per device for one
layout (and the measured step time on a GPU or TPU)."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, add_case_args, command, hardware_of, layout_of, load_graph, table
from layoutsearch.mesh import hardware
from layoutsearch.units import format_seconds


def add(sub: Any) -> None:
    p = command(sub, "validate", run, "predicted against compiled collectives, FLOPs and memory per "
                "device for one layout (and measured step time on a GPU/TPU)", render=render)
    add_case_args(p)


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.devices import jax_devices
    from layoutsearch.validate import validate

    graph = load_graph(args)
    layout = layout_of(args, graph)
    jax_devices(layout.mesh.size)  # before JAX starts: simulated CPU devices if needed
    return validate(graph, layout, hardware_of(args) or hardware("cpu-sim"), optimizer=args.optimizer,
                    precision=args.precision)


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    head = (f"{result['model']} on {result['mesh']} ({result['platform']}), layout "
            f"{result['layout'] or 'replicated'}: predicted step {format_seconds(result['predicted_step_s'])} on "
            f"{result['hardware']}")
    if "measured_step_s" in result:
        head += f", measured {format_seconds(result['measured_step_s'])}"
    rows = [[r["what"], r["predicted"], r["compiled"], "-" if r["ratio"] is None else f"{r['ratio']:.4f}"]
            for r in result["rows"]]
    notes = [f"{r['what']}: {r['note']}" for r in result["rows"] if r.get("note")]
    return [head, table(["quantity", "predicted", "compiled", "predicted/compiled"], rows), *notes]
