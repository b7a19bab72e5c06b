"""``layoutsearch hardware``: the hardware presets, or one preset's figures and the link of each mesh axis."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, add_mesh_arg, command, hardware_of, mesh_of, table
from layoutsearch.errors import LayoutSearchError
from layoutsearch.figure_sources import ASSUMPTION, figure_sources
from layoutsearch.mesh import PRESETS


def add(sub: Any) -> None:
    p = command(sub, "hardware", run, "list hardware presets, or show one preset's figures", render=render)
    p.add_argument("name", nargs="?", metavar="PRESET", help="show this preset's (or hardware profile JSON file's) "
                   "figures (with --hw overrides)")
    p.add_argument("--hw", dest="hw_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a figure, e.g. --hw peak_flops=300e12 (repeatable)")
    add_mesh_arg(p, required=False)


def run(args: argparse.Namespace) -> Result:
    if args.name is None:
        if args.hw_overrides or args.mesh:
            raise LayoutSearchError("--hw and --mesh need a preset: layoutsearch hardware PRESET ...")
        return {"presets": {name: hw.to_dict() for name, hw in PRESETS.items()}}
    args.hardware = args.name
    hw = hardware_of(args)
    assert hw is not None
    result: Result = {"hardware": hw.to_dict(), "sources": figure_sources(hw)}
    if args.mesh:
        mesh = mesh_of(args)
        result["mesh"] = str(mesh)
        result["axis_links"] = hw.link_kinds(mesh)
    return result


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    if "presets" in result:
        rows = [[n, h["peak_flops"] / 1e12, h["hbm_bytes"] / 1e9, h["hbm_bandwidth"] / 1e9,
                 h["fast_link"]["bandwidth"] / 1e9, h["slow_link"]["bandwidth"] / 1e9, h["devices_per_node"]]
                for n, h in result["presets"].items()]
        return [table(["preset", "peak TFLOP/s", "HBM GB", "HBM GB/s", "fast link GB/s", "slow link GB/s",
                       "devices per node"], rows)]
    h, sources = result["hardware"], result["sources"]
    rows = []
    for k, v in h.items():
        if isinstance(v, dict):
            rows += [[f"{k}.{sub}", sv, sources.get(f"{k}_{sub}", "")] for sub, sv in v.items()]
        elif k not in ("name", "source"):
            rows.append([k, v, sources.get(k, "")])
    out: list[Any] = [f"{h['name']}: {h['source']}", table(["figure", "value", "source"], rows)]
    assumed = [k for k, v in sources.items() if v == ASSUMPTION]
    if assumed:
        out.append(f"assumed (no public figure; `layoutsearch calibrate` measures them): {', '.join(assumed)}")
    if "axis_links" in result:
        out.append(f"mesh {result['mesh']}: " + ", ".join(f"{a} uses the {k} link"
                                                        for a, k in result["axis_links"].items()))
    return out
