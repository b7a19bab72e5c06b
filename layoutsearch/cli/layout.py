"""``layoutsearch layout``: a layout checked against a model, every tensor's PartitionSpec and per-device
shape, and the layout exported for JAX, Flax and MaxText."""

from __future__ import annotations

import argparse
import json
from typing import Any

from layoutsearch.cli.common import (
    Result,
    add_hardware_args,
    add_layout_arg,
    add_mesh_arg,
    add_model_args,
    command,
    hardware_of,
    layout_of,
    load_graph,
    spec_text,
    table,
)
from layoutsearch.units import format_bytes

EXPORTS = ("python", "flax", "maxtext")


def add(sub: Any) -> None:
    p = command(sub, "layout", run, "check a layout against a model; show every tensor's PartitionSpec "
                "and per-device shape, and export it for JAX/Flax/MaxText", render=render)
    add_model_args(p)
    add_mesh_arg(p)
    add_layout_arg(p)
    add_hardware_args(p)
    p.add_argument("--export", choices=EXPORTS,
                   help="print only this export: python (PartitionSpecs), flax (logical_axis_rules), "
                        "maxtext (config YAML)")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch import export

    graph = load_graph(args)
    layout = layout_of(args, graph)
    hw = hardware_of(args)
    mesh = layout.mesh
    result: Result = {
        "model": graph.name, "mesh": str(mesh), "devices": mesh.size, "layout": layout.describe(),
        "rules": [[d, list(a)] for d, a in layout.rules], "tensors": layout.tensor_table(graph),
        "local_bytes_by_role": layout.local_bytes_by_role(graph),
        "export": {
            "flax_logical_axis_rules": [[d, list(a) if isinstance(a, tuple) else a]
                                        for d, a in export.flax_logical_axis_rules(layout)],
            "maxtext": _maxtext(layout, graph, strict=args.export == "maxtext"),
            "python": export.python_snippet(layout, graph),
        },
    }
    if hw is not None:
        kinds = hw.link_kinds(mesh)
        result["hardware"] = {
            "name": hw.name, "hbm_bytes": hw.hbm_bytes,
            "axis_links": {a: {"kind": kinds[a], "bandwidth": link.bandwidth, "latency": link.latency}
                           for a, link in hw.links_for(mesh).items()},
        }
    return result


def _maxtext(layout: Any, graph: Any, strict: bool) -> Result:
    """MaxText's overrides, or ``{"error": why}`` when MaxText cannot express the layout (an axis name with no
    MaxText counterpart, a dim MaxText never splits) and they were not asked for alone (``strict``)."""
    from layoutsearch import export
    from layoutsearch.errors import LayoutError

    try:
        return export.maxtext_overrides(layout, graph=graph)
    except LayoutError as e:
        if strict:
            raise
        return {"error": str(e)}


def _maxtext_yaml(cfg: Result) -> str:
    if "error" in cfg:
        return f"# not expressible in MaxText: {cfg['error']}\n"
    # JSON flow values are valid YAML, so each key is one line of YAML.
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items())


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    ex = result["export"]
    rules = [(d, tuple(a) if isinstance(a, list) else a) for d, a in ex["flax_logical_axis_rules"]]
    flax = f"logical_axis_rules = {rules!r}"
    if args.export == "python":
        return [ex["python"].rstrip("\n")]
    if args.export == "flax":
        return [flax]
    if args.export == "maxtext":
        return [_maxtext_yaml(ex["maxtext"]).rstrip("\n")]
    out: list[Any] = [(f"model {result['model']} on mesh {result['mesh']} ({result['devices']} devices), "
                       f"layout {result['layout'] or '(replicated)'}: valid")]
    out.append(table(["tensor", "role", "shape", "PartitionSpec", "per-device shape", "per-device bytes"],
                     ([t["name"], t["role"], t["shape"], spec_text(t["spec"]), t["local_shape"], t["local_bytes"]]
                      for t in result["tensors"])))
    out.append("per device (sum of slices, not peak memory): " + ", ".join(
        f"{role} {format_bytes(n)}" for role, n in result["local_bytes_by_role"].items()))
    if "hardware" in result:
        hw = result["hardware"]
        out.append(f"hardware {hw['name']} (HBM {format_bytes(hw['hbm_bytes'])}); mesh axis links: " + ", ".join(
            f"{a} {link['kind']} ({link['bandwidth'] / 1e9:g} GB/s)" for a, link in hw["axis_links"].items()))
    out += ["", "# Flax (nn.logical_axis_rules; logical axis names = the graph's dim names)", flax,
            "", "# MaxText config overrides (YAML)", _maxtext_yaml(ex["maxtext"]).rstrip("\n"),
            "", ex["python"].rstrip("\n")]
    return out
