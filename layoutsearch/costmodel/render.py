"""The human rendering of a cost report: :func:`render_report` turns the JSON form of a
:class:`~layoutsearch.costmodel.costreport.CostReport` into strings and rich tables."""

from __future__ import annotations

from typing import Any

from layoutsearch.units import format_bytes, format_seconds

MEMORY_MEANING = {
    "parameters": "the weights the step computes with (their slices under the layout), all step",
    "optimizer_state": "what the optimizer keeps: master weights (mixed precision) and Adam's m and v, all step",
    "inputs": "the batch (token ids, labels), all step",
    "gradients": "parameter gradients produced so far, kept for the optimizer",
    "activations": "forward outputs kept for the backward pass (all of them, or block inputs with remat)",
    "activation_gradients": "gradients of activations, from their producer to their last use",
    "transient": "buffers of the collectives running at the peak op (gathered weights, partial sums)",
}
"""What each memory category holds (the rows of the memory table)."""


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def launches(kernels: int, latency: float) -> str:
    """What the kernel-launch line of a report says: ``kernels`` kernels of ``latency`` seconds each."""
    if latency > 0:
        return f"{kernels} kernels x {format_seconds(latency)}: the compute stream idle between kernels (GPU launches)"
    return f"{kernels} kernels, none launched from the host (the device sequences the compiled program)"


def _table(columns: list[str], rows: list[list[Any]], title: str, right: set[int]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in right:
        t.columns[i].justify = "right"
    for r in rows:
        t.add_row(*(Text(str(c)) for c in r))
    return t


def render_report(d: dict[str, Any], top: int = 15) -> list[Any]:
    """Human rendering of :meth:`CostReport.to_dict` (strings and rich tables): totals,
    time by cause, memory at the peak, collectives grouped by kind and axes with
    their causes, and the ``top`` ops by time."""
    hw = d["hardware"]
    mem = d["memory"]
    out: list[Any] = [
        (f"{d['model']} on mesh {d['mesh']} ({d['devices']} devices, {hw['name']}), layout "
         f"{d['layout'] or '(replicated)'}; optimizer {d['optimizer']}, precision {d['precision']}, "
         f"attention {d['attention']}, remat {d['remat']}, overlap {d['overlap']}"),
    ]
    phases = d["phases"]
    if d["overlap"] == "auto":
        how = (f"compute + kernel launches + exposed communication ({format_seconds(d['comm_exposed_s'])} exposed, "
               f"{format_seconds(d['comm_hidden_s'])} hidden behind compute)")
        if d["overlap_by_class"]:
            how += "; " + ", ".join(f"{k} collectives {format_seconds(v['seconds'])} ({format_seconds(v['exposed_s'])} "
                                    "exposed)" for k, v in d["overlap_by_class"].items() if v["seconds"])
    else:
        how = "compute + kernel launches + communication" + (f" - {d['overlap']:g} x overlap" if d["overlap"] else "")
    rows = [["step", format_seconds(d["step_s"]), how],
            ["compute", format_seconds(d["compute_s"]), ", ".join(f"{k} {format_seconds(v)}" for k, v in d["compute_by_bound_s"].items())],
            ["communication", format_seconds(d["comm_s"]), ", ".join(f"{k} {format_bytes(v)}" for k, v in d["bytes_by_kind"].items())
             or "none"],
            ["kernel launches", format_seconds(d["kernel_launch_s"]), launches(d["kernels"], hw["kernel_latency"])]]
    rows += [[f"  {p}", format_seconds(v["compute_s"] + v["launch_s"] + v["comm_s"]),
              f"compute {format_seconds(v['compute_s'])}, launches {format_seconds(v['launch_s'])}, "
              f"comm {format_seconds(v['comm_s'])}, {_si(v['flops'], 'FLOP')}"]
             for p, v in phases.items()]
    rows += [["FLOPs per device", _si(d["flops_per_device"], "FLOP"),
              f"model FLOPs {_si(d['model_flops'], 'FLOP')} (global, forward + backward)"],
             ["MFU", f"{100 * d['mfu']:.1f}%",
              f"peak {_si(hw['peak_flops'], 'FLOP/s')}, matmul efficiency {hw['matmul_efficiency']:g}"],
             ["peak memory", format_bytes(d["memory_bytes"]),
              (f"{'fits' if d['fits'] else 'DOES NOT FIT'} in {format_bytes(hw['usable_bytes'])} usable of "
               f"{format_bytes(hw['hbm_bytes'])} HBM; "
               f"at op {mem['peak_op']} ({mem['peak_phase']})")]]
    rows += [["bytes sent", format_bytes(sum(d["bytes_per_axis"].values())),
              ", ".join(f"{a}: {format_bytes(b)}" for a, b in d["bytes_per_axis"].items())]]
    out.append(_table(["total", "value", "breakdown"], rows, "step (per device)", {1}))
    out.append(_table(["memory at peak", "bytes", "what"],
                      [[k, format_bytes(v), MEMORY_MEANING.get(k, "")] for k, v in mem["breakdown"].items() if v],
                      f"memory per device at the peak (op {mem['peak_op']}, {mem['peak_phase']}; precision "
                      f"{d['precision']})", {1}))
    out.append(f"remat {mem['remat']}: {mem['recomputed_ops']} forward ops recomputed in the backward pass")
    rows = []
    for g in d["comm_groups"]:
        rows.append([g["kind"], "+".join(g["axes"]), g["count"], format_bytes(g["bytes"]), format_seconds(g["seconds"]), ""])
        for c in g["causes"][:5]:
            rows.append(["", "", c["count"], format_bytes(c["bytes"]), format_seconds(c["seconds"]), f"{c['phase']}: {c['cause']}"])
        if len(g["causes"]) > 5:
            rows.append(["", "", "", "", "", f"... {len(g['causes']) - 5} more causes"])
    if rows:
        out.append(_table(["collective", "axes", "count", "bytes", "time", "cause"], rows,
                          "collectives by kind and axes (bytes per device per step)", {2, 3, 4}))
    if "ops" in d:
        ranked = sorted(d["ops"], key=lambda o: -(o["compute_s"] + o["comm_s"]))[:top]
        rows = [[o["op"], o["kind"], o["phase"], format_seconds(o["compute_s"] + o["comm_s"]), format_seconds(o["compute_s"]),
                 o["bound"], format_seconds(o["comm_s"]), _si(o["flops"], "FLOP")] for o in ranked]
        out.append(_table(["op", "kind", "phase", "time", "compute", "bound", "comm", "FLOPs"], rows,
                          f"top {len(rows)} ops by time", {3, 4, 6, 7}))
    return out


__all__ = ["MEMORY_MEANING", "launches", "render_report"]
