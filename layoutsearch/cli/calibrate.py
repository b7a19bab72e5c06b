"""``layoutsearch calibrate``: this machine's devices measured and written as a hardware profile."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from layoutsearch.cli.common import PROG, Result, command, mesh_of, table
from layoutsearch.errors import LayoutSearchError
from layoutsearch.units import format_bytes, format_seconds


def add(sub: Any) -> None:
    p = command(sub, "calibrate", run, "measure matmul rates, HBM bandwidth and each mesh axis's "
                "collective latency and bandwidth on the JAX devices present; write them as a hardware profile "
                "(use it with --hardware FILE)", render=render)
    p.add_argument("--out", required=True, metavar="FILE", help="hardware profile JSON file to write")
    p.add_argument("--mesh", metavar="AXES", help="mesh whose axes are measured, e.g. data:2,model:4 (default: "
                   "every device on one axis data:N; 8 simulated CPU devices when there is no accelerator)")
    p.add_argument("--base", metavar="PRESET", help="preset whose vendor peaks, HBM size, tiles and unmeasured "
                   "links the measurements complete (default: the preset of the device kind, if known)")
    p.add_argument("--quick", action="store_true", help="fewer and smaller sizes (seconds)")


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.calibrate import calibrate, write_profile
    from layoutsearch.hwprofile import hardware_to_json

    mesh = mesh_of(args) if args.mesh else None
    out = args.out
    parent = os.path.dirname(os.path.abspath(out))
    why = ("it is a directory" if os.path.isdir(out) else f"directory {parent} does not exist"
           if not os.path.isdir(parent) else "permission denied"
           if not os.access(out if os.path.exists(out) else parent, os.W_OK) else None)
    if why:
        raise LayoutSearchError(f"cannot write hardware profile {out!r}: {why}")
    tty = sys.stderr.isatty()

    def progress(what: str) -> None:
        if tty:
            print(f"{PROG} calibrate: {what}" + " " * 20, end="\r", file=sys.stderr, flush=True)

    hw, measurements = calibrate(mesh, base=args.base, quick=args.quick, progress=progress)
    if tty:
        print(" " * 80, end="\r", file=sys.stderr)
    write_profile(hw, measurements, out)
    return {"out": out, "hardware": hardware_to_json(hw), "calibrated": measurements["meta"],
            "measurements": {k: v for k, v in measurements.items() if k != "meta"}}


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    def rate(x: float) -> str:
        return f"{x / 1e12:.3g} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.3g} GFLOP/s"

    meta, m, hw = result["calibrated"], result["measurements"], result["hardware"]
    out: list[Any] = [f"{hw['name']}: {meta['device_kind']} x {meta['device_count']} ({meta['platform']}), mesh "
                      f"{meta['mesh']}, JAX {meta['jax_version']}{', quick' if meta['quick'] else ''}"]
    if meta.get("note"):
        out.append(f"NOTE: {meta['note']}")
    rows = [[r["dtype"], f"{r['m']}x{r['n']}x{r['k']}", format_seconds(r["seconds"]), rate(r["flops_per_s"]),
             f"{r['efficiency']:.3g}", f"{r['model_efficiency']:.3g}", format_seconds(r["predicted_seconds"])]
            for r in m["matmul"]["rows"]]
    out.append(f"matmuls on one device; peaks: {m['matmul']['peaks']}")
    out.append(table(["dtype", "m x n x k", "measured", "achieved", "of peak", "model efficiency",
                      "model time"], rows))
    h = m["hbm"]
    out.append(f"HBM: {format_bytes(h['bytes_moved'])} read + written in {format_seconds(h['seconds'])}: "
               f"{h['bandwidth'] / 1e9:.3g} GB/s, efficiency {h['efficiency']:.3g} ({h['note']})")
    rows = []
    for axis, a in m["collectives"]["axes"].items():
        for kind in ("all-reduce", "all-gather"):
            f = a[kind]
            samples = ", ".join(f"{format_bytes(s['bytes'])} {format_seconds(s['seconds'])}" for s in f["samples"])
            rows.append([axis, a["size"], a.get("link", "-"), kind, f"{f['alpha'] * 1e6:.3g}",
                         f"{f['bandwidth'] / 1e9:.3g}", samples])
    if rows:
        out.append(table(["axis", "size", "link", "collective", "alpha (us)", "bw (GB/s)", "payload measured"],
                         rows, "collectives per mesh axis (alpha-beta ring fit; the link takes the all-reduce fit)"))
    else:
        out.append("collectives: no mesh axis of size >= 2, links kept from the preset")
    figures = [["peak_flops", rate(hw["peak_flops"])], ["peak_flops_fp32", rate(hw["peak_flops_fp32"])],
               ["matmul_efficiency", f"{hw['matmul_efficiency']:.3g}"],
               ["hbm_bandwidth", f"{hw['hbm_bandwidth'] / 1e9:.4g} GB/s"],
               ["memory_efficiency", f"{hw['memory_efficiency']:.3g}"]]
    for kind in ("fast", "slow"):
        link, note = hw[f"{kind}_link"], m["collectives"]["links"][kind]
        origin = f"measured on axis {note['from_axis']}" if note["measured"] else "kept from the preset"
        figures.append([f"{kind}_link", f"{link['bandwidth'] / 1e9:.4g} GB/s, latency "
                                        f"{format_seconds(link['latency'])}, efficiency {link['efficiency']:g} "
                                        f"({origin})"])
    out.append(table(["figure", "value"], figures, "the profile's figures"))
    out.append(f"wrote {result['out']}: use it with --hardware {result['out']}")
    return out
