"""``layoutsearch run PLAN.json|MODEL``: training steps of a plan on the devices present, measured against the
cost model's prediction."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from layoutsearch.cli.common import (
    Result,
    add_hardware_args,
    command,
    hardware_of,
    load_graph,
    mesh_of,
    seconds_arg,
    table,
)
from layoutsearch.cli.search import SearchProgress
from layoutsearch.errors import LayoutSearchError
from layoutsearch.units import format_bytes, format_seconds

MAX_STEPS = 10**6
"""The most training steps of one run (every step's loss and time is kept and printed)."""
MAX_TIME_S = 3600.0
"""The predicted run time (steps x predicted step time) above which a run is refused unless --max-time allows it."""


def add(sub: Any) -> None:
    p = command(sub, "run", run, "run training steps of a plan (a file from `search --out`, or the plan searched "
                "for MODEL) on the devices present, with loss, step time and tokens/s against the prediction",
                render=render)
    p.add_argument("target", metavar="PLAN.json|MODEL",
                   help="a plan file (`layoutsearch search ... --out PLAN.json`), or a zoo model / JSON graph file "
                        "to search first (needs --mesh)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a zoo model's size (MODEL only)")
    p.add_argument("--mesh", metavar="AXES", help="device mesh for MODEL; for a plan, if given, it must be the plan's")
    add_hardware_args(p)
    p.add_argument("--steps", type=int, default=10, metavar="N",
                   help=f"training steps (default 10, at most {MAX_STEPS:,})")
    p.add_argument("--max-time", type=seconds_arg, default=MAX_TIME_S, metavar="S",
                   help="refuse a run whose predicted time (steps x the predicted step time) exceeds S seconds "
                        f"(default {MAX_TIME_S:g}: an hour)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the parameters and batches (default 0; from 0 to 2**32 - 1)")
    p.add_argument("--params", metavar="FILE.npz",
                   help="initial parameters (numpy .npz, arrays named as the graph's parameters, e.g. an imported "
                        "model's pytree paths) instead of drawn ones")
    p.add_argument("--batch", metavar="FILE.npz",
                   help="the batch every step trains on (numpy .npz, arrays named as the graph's inputs) instead of "
                        "drawn ones")
    p.add_argument("--coordinator", metavar="HOST:PORT", help="multi-process run: process 0's address")
    p.add_argument("--num-processes", type=int, metavar="N", help="multi-process run: the number of processes")
    p.add_argument("--process-id", type=int, metavar="I", help="multi-process run: this process's index")
    p.add_argument("--local-devices", type=int, metavar="N",
                   help="multi-process run on CPU: simulated devices per process")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="multi-process run: seconds to wait for the other processes (default 60)")


def _plan_file(target: str) -> bool:
    """Whether ``target`` is a plan file (a JSON document with the plan format marker)."""
    from layoutsearch.solvers.plan import PLAN_FORMAT

    path = Path(target)
    if not path.is_file():
        return False
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return target.endswith(".json")  # let the plan reader say what is wrong
    return isinstance(doc, dict) and doc.get("format") == PLAN_FORMAT


def _distributed(args: argparse.Namespace) -> None:
    given = [args.coordinator is not None, args.num_processes is not None, args.process_id is not None]
    if any(given) and not all(given):
        raise LayoutSearchError("a multi-process run needs --coordinator, --num-processes and --process-id")
    if all(given):
        from layoutsearch.distributed import initialize

        initialize(args.coordinator, args.num_processes, args.process_id, local_devices=args.local_devices,
                   timeout_s=args.timeout)


def _plan(args: argparse.Namespace) -> Any:
    from layoutsearch.solvers.plan import Plan

    if _plan_file(args.target):
        if args.overrides:
            raise LayoutSearchError(f"{args.target} is a plan: its model's sizes are fixed (drop --set)")
        plan = Plan.load(args.target)
        if args.mesh is not None and mesh_of(args).shape != plan.layout.mesh.shape:
            raise LayoutSearchError(f"{args.target} is a plan for mesh {plan.layout.mesh}, not {args.mesh}")
        if args.hardware is not None or args.hw_overrides:
            raise LayoutSearchError(f"{args.target} is a plan priced on {plan.hardware.name}: drop --hardware/--hw")
        return plan
    from layoutsearch.zoo import MODELS

    path = Path(args.target)
    if args.target not in MODELS and not path.exists():
        raise LayoutSearchError(f"{args.target!r}: no such file" if path.suffix or len(path.parts) > 1 else
                                f"unknown model {args.target!r}: not a zoo model ({', '.join(MODELS)}) nor a file")
    if args.mesh is None:
        raise LayoutSearchError(f"running model {args.target!r} needs --mesh (or give a plan file)")
    return None


def run(args: argparse.Namespace) -> Result:
    """Search (MODEL) or load (PLAN.json) the plan, compile it on the devices present, run ``--steps``."""
    if not 1 <= args.steps <= MAX_STEPS:
        raise LayoutSearchError(f"--steps must be an integer from 1 to {MAX_STEPS:,}, got {args.steps:,}")
    if not 0 <= args.seed < 2**32:
        raise LayoutSearchError(f"--seed must be an integer from 0 to 2**32 - 1, got {args.seed:,}")
    plan = _plan(args)  # (the plan file and the mesh are checked before JAX is imported: a refusal is quick)
    mesh = plan.layout.mesh if plan is not None else mesh_of(args)
    from layoutsearch.backend.train import train
    from layoutsearch.devices import jax_devices, present_hardware
    from layoutsearch.mesh import PRESETS, hardware
    from layoutsearch.solvers.search import price_plan, search

    _distributed(args)
    devices = jax_devices(mesh.size)
    here = present_hardware(devices)
    if plan is None:
        hw = hardware_of(args) or hardware(here or "cpu-sim")
        graph = load_graph(argparse.Namespace(model=args.target, overrides=args.overrides))
        progress = SearchProgress()
        try:
            plan = search(graph, mesh, hardware=hw, baselines=False, progress=progress)
        finally:
            progress.close()
    _check_host_memory(plan, devices)
    program = plan.compile(devices)
    c = plan.chosen
    predicted_here = None
    # a hardware profile (calibrate's, or any not a preset) describes the devices it was written for: the plan's
    # own prediction is the reference; a preset other than these devices' is priced again as theirs
    profiled = plan.hardware.name not in PRESETS
    if here is not None and here != plan.hardware.name and not profiled and c.rules is not None:  # (per-op: none)
        predicted_here = price_plan(plan.model, c.layout, here, remat=c.remat, microbatches=c.microbatches,
                                    stage_axis=c.stage_axis, schedule=c.schedule, memory_limit=None,
                                    optimizer=plan.optimizer, precision=plan.precision, attention=program.attention,
                                    overlap=plan.overlap)
    predicted_s = args.steps * (predicted_here.step_s if predicted_here is not None else plan.step_s)
    if predicted_s > args.max_time:
        raise LayoutSearchError(f"{args.steps:,} steps are predicted to take {format_seconds(predicted_s)}, more "
                                f"than --max-time {format_seconds(args.max_time)}: run fewer steps or raise --max-time")
    params = _arrays(args.params, "--params") if args.params else None
    batch = _arrays(args.batch, "--batch") if args.batch else None
    with _StepBar(args.steps) as bar:
        measured = train(program, args.steps, seed=args.seed, on_step=bar.advance, params=params, batch=batch)
    import jax

    step = measured.median_step_s
    reference = predicted_here.step_s if predicted_here is not None else \
        plan.step_s if here == plan.hardware.name or profiled else None
    return {
        "model": plan.model.name, "mesh": str(mesh), "devices": mesh.size, "processes": jax.process_count(),
        "platform": devices[0].platform, "device_kind": devices[0].device_kind, "hardware_here": here,
        "layout": c.rules_text(), "remat": c.remat, "microbatches": c.microbatches, "stage_axis": c.stage_axis,
        "schedule": c.schedule, "executed_schedule": program.pipeline.schedule if program.pipeline is not None else None,
        "precision": plan.precision, **measured.to_dict(),
        "tokens_per_s": measured.tokens_per_step / step,
        "predicted": {"hardware": plan.hardware.name, "step_s": plan.step_s},
        "attention": program.attention,
        "predicted_here": ({"hardware": here, "step_s": predicted_here.step_s,
                            "memory_bytes": predicted_here.memory_bytes} if predicted_here is not None else None),
        "measured_over_predicted": step / reference if reference else None,
    }


def _check_host_memory(plan: Any, devices: list[Any]) -> None:
    """LayoutSearchError before allocating when the run cannot fit the host's memory: the parameters, optimizer
    state and batch are drawn whole on the host (float32, then copied: 8 bytes an element), and simulated CPU
    devices hold their per-device peak in it too."""
    import os

    fed = sum(t.num_elements for t in plan.graph.tensors.values() if plan.graph.producer(t.name) is None)
    need = 8 * fed + (plan.memory_bytes * len(devices) if devices[0].platform == "cpu" else 0)
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have:
        raise LayoutSearchError(f"running {plan.model.name!r} needs about {format_bytes(need)} of host memory (its "
                                f"parameters, optimizer state and batch drawn on the host), more than the "
                                f"{format_bytes(have)} this machine has")


def _arrays(path: str, flag: str) -> dict[str, Any]:
    """The arrays of a numpy ``.npz`` file (read as data: no pickled objects)."""
    import zipfile

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise LayoutSearchError(f"{flag}: no file {path!r}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise LayoutSearchError(f"{flag}: {path!r} is not a numpy .npz file of arrays ({e})") from None


class _StepBar:
    """A rich progress bar of the training steps on stderr when it is a terminal (stdout stays for the result)."""

    def __init__(self, steps: int) -> None:
        self.progress = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True), transient=True)
            self.task = self.progress.add_task("compiling", total=steps)

    def __enter__(self) -> _StepBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def advance(self, record: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=f"loss {record.loss:.4f}, "
                                                                   f"{format_seconds(record.seconds)}/step")


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    rows = [[s["step"], f"{s['loss']:.4f}", format_seconds(s["seconds"]), f"{s['tokens_per_s']:,.0f}"]
            for s in result["steps"]]
    sched = (f", pipeline over {result['stage_axis']} ({result['microbatches']} micro-batches, priced "
             f"{result['schedule']}, executed {result['executed_schedule']})" if result["stage_axis"] else
             f", {result['microbatches']} micro-batches" if result["microbatches"] > 1 else "")
    out = [f"{result['model']} on {result['mesh']} ({result['devices']} {result['device_kind']} devices, "
           f"{result['processes']} process{'es' if result['processes'] > 1 else ''}): layout "
           f"{result['layout'] or 'replicated'}, remat {result['remat']}{sched}, {result['precision']} precision, "
           f"{result['attention']} attention",
           table(["step", "loss", "time", "tokens/s"], rows,
                 title="training steps")]
    p, here = result["predicted"], result["predicted_here"]
    line = f"measured step {format_seconds(result['median_step_s'])} (median after the first), " \
           f"{result['tokens_per_s']:,.0f} tokens/s; predicted {format_seconds(p['step_s'])} on {p['hardware']}"
    if here is not None:
        line += f", {format_seconds(here['step_s'])} on {here['hardware']} (these devices)"
    if result["measured_over_predicted"] is not None:
        line += f": measured/predicted {result['measured_over_predicted']:.2f}"
    out.append(line)
    out.append(f"loss {result['steps'][0]['loss']:.4f} -> {result['steps'][-1]['loss']:.4f}")
    return out
