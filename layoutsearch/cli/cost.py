"""``layoutsearch cost``: the predicted time, communication, FLOPs and memory per device of one training step
under a layout, or of a micro-batched step (gradient accumulation or a pipeline)."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import (
    Result,
    add_case_args,
    case_of,
    command,
    hardware_of,
    maxtext_run_of,
    maxtext_summary,
    overlap_arg,
    remat_arg,
    table,
)
from layoutsearch.errors import LayoutSearchError, PartitionError
from layoutsearch.figure_sources import assumed_share
from layoutsearch.units import format_bytes, format_seconds


def add(sub: Any) -> None:
    p = command(sub, "cost", run, "predict the time, communication, FLOPs and memory per device of one "
                "training step under a layout, broken down by op and by cause", render=render)
    add_case_args(p, maxtext=True)
    p.add_argument("--remat", type=remat_arg, default="none", metavar="POLICY",
                   help="activation rematerialization: none (default), selective (recompute all but projections' "
                        "outputs), full (keep only block boundaries) or full:N (the first N blocks full, the rest "
                        "none: Megatron's --recompute-num-layers N)")
    p.add_argument("--overlap", type=overlap_arg, default="auto", metavar="auto|F",
                   help="auto (default): weight gathers prefetched, gradient reductions behind the backward pass, the "
                        "rest on the critical path, from the step's schedule; or F, the fraction of the shorter of "
                        "compute and communication hidden behind the other")
    p.add_argument("--top", type=int, default=15, metavar="N", help="ops listed in the table of top ops (default 15)")
    p.add_argument("--attention", choices=("auto", "standard", "flash"), default="auto",
                   help="attention core: standard (scores in HBM), flash (a flash-attention kernel) or auto (flash "
                        "on GPU/TPU presets, standard on cpu-sim; default)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="micro-batches per step: pipeline micro-batches with --stage-axis, else gradient "
                        "accumulation (default 1)")
    p.add_argument("--stage-axis", metavar="AXIS",
                   help="pipeline stages over this mesh axis (the layout's rules apply inside each stage)")
    p.add_argument("--schedule", metavar="S",
                   help="pipeline schedule (with --stage-axis): gpipe, 1f1b (default) or interleaved:V (V virtual "
                        "stages per device)")


def run(args: argparse.Namespace) -> Result:
    """One step's cost: of MODEL under --layout, or of the MaxText run of ``--maxtext`` (its ``maxtext`` entry
    says how it was read)."""
    from layoutsearch.mesh import hardware

    mt = maxtext_run_of(args)
    if mt is not None:
        if args.remat != "none" or args.microbatches != 1 or args.stage_axis is not None:
            raise LayoutSearchError("with --maxtext the remat policy, micro-batches and stages come from the MaxText "
                                    "config: drop --remat, --microbatches and --stage-axis")
        graph, layout, hw = mt.graph, mt.layout, hardware_of(args) or hardware("cpu-sim")
        args.remat, args.microbatches, args.stage_axis = mt.remat, mt.microbatches, mt.stage_axis
        args.schedule = mt.schedule
    else:
        graph, layout, hw = case_of(args)
    result = _run(args, graph, layout, hw)
    if mt is not None:
        result["maxtext"] = maxtext_summary(mt)
    return result


def _run(args: argparse.Namespace, graph: Any, layout: Any, hw: Any) -> Result:
    from layoutsearch.costmodel.pipeline import Schedule
    from layoutsearch.costmodel.report import estimate
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    if args.top < 0:
        raise LayoutSearchError(f"--top must be at least 0, got {args.top}")
    if args.microbatches < 1:
        raise LayoutSearchError(f"--microbatches must be a positive integer, got {args.microbatches}")
    if args.schedule is not None and args.stage_axis is None:
        raise LayoutSearchError(f"--schedule {args.schedule} applies to pipelines: add --stage-axis AXIS "
                                "(without one, --microbatches is gradient accumulation, which has no schedule)")
    schedule = Schedule.parse(args.schedule or "1f1b")
    if args.stage_axis is not None:
        layout.mesh.axis_size(args.stage_axis)  # a clear error for an axis the mesh lacks
    if args.stage_axis is None and args.microbatches == 1:
        from layoutsearch.costmodel.explain import explain

        report = estimate(graph, layout, hw, optimizer=args.optimizer, precision=args.precision, remat=args.remat,
                          attention=args.attention, overlap=args.overlap)
        share, figures = assumed_share(report)
        return {**report.to_dict(), "explain": explain(report, graph),
                "assumed": {"share": share, "figures": figures}}
    if args.overlap not in ("auto", 0):
        raise LayoutSearchError("--overlap takes 'auto' or 0 with --microbatches or --stage-axis (the schedule "
                                f"decides what overlaps; 0: nothing does), got {args.overlap}")

    def priced(limit: float | None) -> Any:
        return estimate_pipeline(graph, layout, hw, stage_axis=args.stage_axis, microbatches=args.microbatches,
                                 schedule=schedule, remat=args.remat, optimizer=args.optimizer,
                                 precision=args.precision, attention=args.attention, overlap=args.overlap,
                                 memory_limit=limit)

    try:  # the stages: the split with the fastest slowest stage that fits the device, else regardless of memory
        rep = priced(hw.usable_bytes if args.stage_axis is not None else None)
    except PartitionError:
        rep = priced(None)
    return {**rep.to_dict(), "overlap": args.overlap, "gantt": rep.gantt() if args.stage_axis is not None else None}


ASSUMED_NOTE = 0.5
"""``cost`` notes the assumed figures when more than this share of the step's predicted time rests on them."""


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    from layoutsearch.costmodel.report import render_report

    head = maxtext_lines(result["maxtext"]) if result.get("maxtext") else []
    if "stage_costs" in result:
        return [*head, *render_microbatched(result)]
    note = []
    if result["assumed"]["share"] > ASSUMED_NOTE:
        note = [f"note: {result['assumed']['share']:.0%} of this step's predicted time rests on assumed figures "
                f"({', '.join(result['assumed']['figures'])}; `layoutsearch hardware {result['hardware']['name']}` shows "
                "each figure's source): `layoutsearch calibrate` measures them on your devices"]
    return [*head, *render_report(result, top=args.top), "in words:",
            *(f"  - {line}" for line in result["explain"]), *note]


def maxtext_lines(mt: Result) -> list[str]:
    """How a MaxText run was read, as text (``cost --maxtext``, ``search --maxtext``)."""
    lines = [f"MaxText run read by {mt['reader']}: mesh {mt['mesh']}, layout {mt['layout'] or 'replicated'}"
             + (f" (+ {mt['per_tensor_entries']} per-tensor entries)" if mt["per_tensor_entries"] else "")
             + f", remat {mt['remat']}, {mt['microbatches']} micro-batch(es), batch {mt['batch']} x seq {mt['seq']}"]
    lines += [f"  note: {n}" for n in mt["notes"]]
    return lines


def render_microbatched(r: Result) -> list[Any]:
    """A micro-batched step (pipeline or gradient accumulation) as text (also shown by ``search``)."""
    mb = r["microbatch"]
    if r["stage_axis"] is None:
        head = (f"{r['model']} on mesh {r['mesh']} ({r['hardware']}), layout {r['inner_layout'] or 'replicated'}: "
                f"{r['microbatches']} micro-batches of gradient accumulation")
    else:
        head = (f"{r['model']} on mesh {r['mesh']} ({r['hardware']}): {r['stages']} pipeline stages over "
                f"'{r['stage_axis']}', schedule {r['schedule']}, {r['microbatches']} micro-batches, layout inside "
                f"a stage {r['inner_layout'] or 'replicated'}")
    head += f"; precision {r['precision']}, attention {r['attention']}, remat {r['remat']}"
    fits = "fits" if r["fits"] else "DOES NOT FIT"
    once = max(s["once_s"] for s in r["stage_costs"])
    rows = [["step", format_seconds(r["step_s"]),
             f"micro-batch loop {format_seconds(r['pipeline_s'])} + once per step {format_seconds(once)}"
             + (f" + tied-weight all-reduce {format_seconds(r['tied_s'])}" if r["tied_s"] else "")],
            ["MFU", f"{r['mfu']:.1%}", "model FLOPs of every micro-batch over the mesh's peak for the step"],
            ["compute", format_seconds(r["compute_s"]),
             f"the busiest stage's over the step; communication {format_seconds(r['comm_s'])}, hidden or not"],
            ["bubble", f"{r['bubble_fraction']:.1%}", "idle fraction of the loop with equal stages"],
            ["peak memory", format_bytes(r["memory_bytes"]), f"{fits} in {format_bytes(r['usable_bytes'])} usable of "
             f"{format_bytes(r['hbm_bytes'])} HBM (the largest stage)"],
            ["micro-batch compute", format_seconds(mb["compute_s"]),
             f"all stages together; communication {format_seconds(mb['comm_s'])}, of which "
             f"{format_seconds(mb['comm_exposed_s'])} exposed (the unpipelined micro-batch step)"]]
    out: list[Any] = [head, table(["total", "value", "breakdown"], rows, "step (per device)")]
    srows = []
    for k, s in enumerate(r["stage_costs"]):
        m = s["memory"]
        srows.append([k, " + ".join(f"{c[0]}..{c[-1]}" for c in s["chunks"]), format_seconds(s["microbatch_s"]),
                      format_seconds(s["transfer_s"]), format_seconds(s["once_s"]), f"{s['in_flight']:g}",
                      format_bytes(s["memory_bytes"]),
                      ", ".join(f"{key} {format_bytes(v)}" for key, v in m.items() if v)])
    out.append(table(["stage", "units", "per micro-batch", "transfers", "once per step", "in flight", "memory",
                      "memory breakdown"], srows, "stages (time and memory per device)"))
    if r.get("gantt"):
        out.append(r["gantt"])
    return out
