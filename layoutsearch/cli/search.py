"""``layoutsearch search``: the plan minimizing the predicted step time under a memory limit, proven optimal,
with runner-ups, the best plan of each decision and the baselines."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from layoutsearch.cli.common import (
    PROG,
    Result,
    add_hardware_args,
    add_mesh_arg,
    add_model_args,
    add_training_args,
    command,
    hardware_of,
    load_graph,
    maxtext_run_of,
    maxtext_summary,
    mesh_of,
    overlap_arg,
    remat_arg,
    seconds_arg,
    spec_text,
    table,
)
from layoutsearch.cli.cost import render_microbatched
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.names import fold_block_numbers, is_derived
from layoutsearch.ir.precision import DEFAULT_PRECISION
from layoutsearch.layout import format_rules
from layoutsearch.mesh import hardware
from layoutsearch.units import format_bytes, format_seconds


def add(sub: Any) -> None:
    from layoutsearch.solvers.dispatch import SOLVERS
    from layoutsearch.solvers.space import SPACES

    p = command(sub, "search", run, "find the layout minimizing the predicted step time under a memory "
                "limit, proven optimal, with runner-ups and baselines (data-parallel, FSDP, Megatron, Mesh-TF 2-D)",
                render=render)
    add_model_args(p, maxtext=True)
    add_mesh_arg(p, required=False)
    add_hardware_args(p, default="cpu-sim")
    p.add_argument("--memory-limit", default="auto", metavar="BYTES|auto|none",
                   help="per-device memory limit, e.g. 16GiB; auto (default): the device's usable memory (HBM less "
                        "the runtime's reserve, see `layoutsearch hardware PRESET`); none: no limit")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="enumerate, ilp-pulp, ilp-ortools or dp; auto: enumeration for one decision, the DP for "
                        "chains of layers, CBC (ilp-pulp) otherwise (default auto)")
    p.add_argument("--space", choices=SPACES, default="rules",
                   help="rules: one Mesh-TF rule set for the graph; layers: one per repeated block; ops: per-op "
                        "layouts and parameter storage (default rules)")
    p.add_argument("--top", type=int, default=3, metavar="N", help="the best plan and N-1 runner-ups (default 3)")
    p.add_argument("--time-limit", type=seconds_arg, metavar="S",
                   help="answer within about S seconds of the command's start (building the model, the search's "
                        "spaces, solvers and runner-ups, the baselines) with the best plan found, labelled not "
                        "proven optimal; the output says what was cut short")
    add_training_args(p)
    p.add_argument("--attention", choices=("auto", "standard", "flash"), default="auto",
                   help="attention kernel, held fixed: auto (flash on GPU/TPU presets), standard or flash")
    p.add_argument("--overlap", type=overlap_arg, default="auto", metavar="auto|F",
                   help="communication overlap of the cost model (default auto)")
    p.add_argument("--remat", type=remat_arg, default="auto", metavar="auto|POLICY",
                   help="activation rematerialization: auto (default: none, selective, full and, in the rules "
                        "space, full:N for a quarter, half and three quarters of the blocks, searched with the "
                        "layout), or one policy (none, selective, full, full:N)")
    p.add_argument("--pipeline", default="off", metavar="auto|off|K",
                   help="pipeline stages over one mesh axis: off (default), auto (stage axis, K, micro-batches and remat "
                        "searched with the layout; chosen when faster), or K (an axis of size K must carry stages)")
    p.add_argument("--microbatches", default="auto", metavar="N|auto",
                   help="micro-batches per step: gradient accumulation, or a pipeline's micro-batches (default auto: "
                        "searched; accumulation is tried when the memory limit binds)")
    p.add_argument("--schedule", metavar="S",
                   help="schedule of a pipelined plan (with --pipeline): gpipe, 1f1b (default), interleaved:V or "
                        "maxtext (MaxText's pipeline: equal stages, embeddings and head outside them; the default "
                        "with --target maxtext)")
    p.add_argument("--target", choices=("maxtext",),
                   help="only plans this framework runs and its config expresses: maxtext (MaxText's logical axis "
                        "rules for its decoder blocks, remat none/selective/full; `export --format maxtext` "
                        "writes them)")
    p.add_argument("--out", metavar="PLAN.json",
                   help="save the plan (model, hardware, settings, layout, costs) for `layoutsearch run` and "
                        "`layoutsearch export`, or ls.Plan.load")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw step time vs devices per strategy (and a pipelined plan's schedule) as PNG "
                        "(needs matplotlib: pip install 'layoutsearch[plot]')")


def _left(time_limit: float | None, started: float) -> float | None:
    """What is left of ``--time-limit`` for the search (the command began at ``started``): the model is built
    within it too; at least a millisecond (the search then answers at its first plan)."""
    return None if time_limit is None else max(time_limit - (time.perf_counter() - started), 1e-3)


def run(args: argparse.Namespace) -> Result:
    """The plan's JSON, with ``layout.rules_text`` (the ``--layout`` string; None for per-op layouts) and
    ``next`` (the command that costs the plan)."""
    from layoutsearch.solvers.search import InfeasibleError, search

    started = time.perf_counter()
    mt = maxtext_run_of(args)
    hw = hardware_of(args) or hardware("cpu-sim")
    if mt is not None:
        graph, mesh = mt.graph, mt.layout.mesh
        if args.target not in (None, "maxtext"):
            raise LayoutSearchError("--maxtext searches plans for MaxText (--target maxtext)")
        args.target = "maxtext"
    else:
        graph, mesh = load_graph(args), mesh_of(args)
    pipeline = _pipeline_arg(args.pipeline)
    if mt is not None and mt.stage_axis is not None and pipeline == "off":
        pipeline = "auto"  # (the run is pipelined: pipelines are among the plans to beat it)
    if args.schedule is not None and pipeline == "off":
        raise LayoutSearchError(f"--schedule {args.schedule} applies to pipelined plans: add --pipeline auto (or K)")
    microbatches = "auto" if args.microbatches == "auto" else _positive_int(args.microbatches, "--microbatches")
    for axis, size in mesh.axes:
        if size > 1 and not any(n % size == 0 for n in graph.dims.values()):
            print(f"{PROG}: note: mesh axis {axis!r} ({size}) divides no dim of {graph.name!r}: no layout rule can "
                  "split over it", file=sys.stderr)
    progress = SearchProgress()
    try:
        plan = search(graph, mesh, args.memory_limit, args.solver, hardware=hw, space=args.space,
                      optimizer=args.optimizer, precision=args.precision, attention=args.attention,
                      overlap=args.overlap, remat=args.remat, microbatches=microbatches, pipeline=pipeline,
                      schedule=args.schedule, top=args.top, time_limit=_left(args.time_limit, started), progress=progress,
                      target=args.target)
    except InfeasibleError as e:
        if not e.options:
            raise
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in e.options.items())
        raise InfeasibleError(f"{e} (on the command line: {flags})", e.min_memory, e.options) from e
    finally:
        progress.close()
    if args.out:
        try:
            plan.save(args.out)
        except OSError as e:
            raise LayoutSearchError(f"cannot write plan file {args.out!r}: {e}") from None
    if args.plot:
        from layoutsearch.plots import plot_plan

        plot_plan(plan, args.plot)
    result = plan.to_dict()
    result["out"], result["plot"], result["target"] = args.out, args.plot, args.target
    if mt is not None:
        result["maxtext"] = _maxtext_result(mt, plan, hw, args)
    if plan.report is not None and not (plan.chosen.pipelined or plan.chosen.microbatches > 1):
        from layoutsearch.costmodel.explain import explain

        result["explain"] = explain(plan.report, plan.model)
    if plan.chosen.pipelined:
        result["cost"]["gantt"] = plan.chosen.report.gantt()
    rules = result["layout"]["rules"]
    result["layout"]["rules_text"] = (format_rules(rules) or "replicated") if rules is not None else None
    result["model_meta"] = {k: v for k, v in plan.model.meta.items() if isinstance(v, (int, float, str))}
    result["next"] = shlex.join(_next_command(args, result))
    return result


def _maxtext_result(mt: Any, plan: Any, hw: Any, args: argparse.Namespace) -> Result:
    """The user's MaxText run priced as it is, and the override that turns it into the plan."""
    from layoutsearch.export import export
    from layoutsearch.solvers.search import price_plan

    now = price_plan(mt.graph, mt.layout, hw, remat=mt.remat, microbatches=mt.microbatches,
                     stage_axis=mt.stage_axis, schedule=mt.schedule, memory_limit=args.memory_limit, optimizer=args.optimizer, precision=args.precision,
                     attention=args.attention, overlap=args.overlap)
    c = plan.chosen
    override = export(c.layout, plan.model, "maxtext", remat=c.remat, microbatches=c.microbatches,
                      stage_axis=c.stage_axis, schedule=c.schedule)
    return {**maxtext_summary(mt), "current": {"step_s": now.step_s, "memory_bytes": now.memory_bytes,
                                               "fits": now.within(plan.memory_limit)},
            "speedup": now.step_s / c.step_s, "override": override}


def _next_command(args: argparse.Namespace, result: Result) -> list[str]:
    """``layoutsearch cost`` of the chosen plan; for a plan no rule string expresses, the search of the rules
    space (whose plan ``cost`` takes)."""
    words = [PROG, "cost" if result["layout"]["rules_text"] is not None else "search"]
    if args.model is not None:
        words += [args.model, *(w for o in args.overrides for w in ("--set", o))]
    else:  # a MaxText run: its model as the zoo's gpt with its sizes
        from layoutsearch.zoo.gpt import DEFAULTS, OPTIONS

        meta = result["model_meta"]
        words += ["gpt", *(w for k in (*DEFAULTS, *OPTIONS) if k in meta and meta[k] is not None and k != "dtype"
                           for w in ("--set", f"{k}={meta[k]}"))]
    words += ["--mesh", result["mesh"], "--hardware", args.hardware]
    words += [w for o in args.hw_overrides for w in ("--hw", o)]
    for flag, value, default in (("--optimizer", args.optimizer, "adam"),
                                 ("--precision", args.precision, DEFAULT_PRECISION),
                                 ("--attention", args.attention, "auto")):
        if value != default:
            words += [flag, value]
    if result["layout"]["rules_text"] is None:
        for flag, value, default in (("--memory-limit", args.memory_limit, "auto"), ("--remat", args.remat, "auto"),
                                     ("--microbatches", args.microbatches, "auto"),
                                     ("--pipeline", args.pipeline, "off"), ("--schedule", args.schedule, None),
                                     ("--overlap", str(args.overlap), "auto")):
            if value != default:
                words += [flag, value]
        return words + ["--space", "rules"]
    words += ["--layout", result["layout"]["rules_text"], "--remat", result["remat"]]
    if result["stage_axis"]:
        words += ["--stage-axis", result["stage_axis"], "--microbatches", str(result["microbatches"]),
                  "--schedule", result["schedule"]]
    elif result["microbatches"] > 1:
        words += ["--microbatches", str(result["microbatches"])]
    elif args.overlap != "auto":
        words += ["--overlap", str(args.overlap)]
    return words


class SearchProgress:
    """What a search is doing, on stderr once it has run for a second (stdout stays for the result): a rich
    spinner with the elapsed time and the current phase on a terminal, one line per report elsewhere."""

    def __init__(self) -> None:
        import time

        self.clock = time.perf_counter
        self.start = self.clock()
        self.status: Any = None

    def __call__(self, what: str) -> None:
        elapsed = self.clock() - self.start
        if elapsed < 1.0:
            return
        if not sys.stderr.isatty():
            print(f"{PROG} search: {elapsed:6.1f} s  {what}", file=sys.stderr, flush=True)
            return
        if self.status is None:
            from rich.console import Console

            self.status = Console(stderr=True).status("")
            self.status.start()
        self.status.update(f"search {elapsed:6.1f} s  {what}")

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()


def _pipeline_arg(text: str) -> str | int:
    """``off``, ``auto``, or a number of stages ``K`` >= 2."""
    if text in ("off", "auto"):
        return text
    k = _positive_int(text, "--pipeline")
    if k < 2:
        raise LayoutSearchError(f"--pipeline takes off, auto or a number of stages >= 2, got {text!r}")
    return k


def _positive_int(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise LayoutSearchError(f"{flag} takes a positive integer or 'auto', got {text!r}")
    return int(text)


def _plan_rows(result: Result) -> list[list[Any]]:
    """The chosen plan, runner-ups and baselines as table rows; baselines with the same layout and decisions
    share one row naming them all."""
    def decided(r: Result) -> str:
        what = [f"remat {r['remat']}"]
        if r.get("stage_axis"):
            what.append(f"pipeline over {r['stage_axis']} ({r['schedule']}, {r['microbatches']} micro-batches)")
        elif r.get("microbatches", 1) > 1:
            what.append(f"{r['microbatches']} micro-batches")
        return ", ".join(what)

    def rules(r: Result) -> str:
        return (format_rules(r["rules"]) or "replicated") if r["rules"] is not None else "(per-op)"

    chosen = {**result, "rules": result["layout"]["rules"]}
    rows = []
    for label, r in [("chosen", chosen)] + [(f"runner-up {r['name']}", r) for r in result["runner_ups"]]:
        text = rules(r) if r is not chosen or r["rules"] is not None else "(per-op: PartitionSpecs above)"
        rows.append([label, text, decided(r), format_seconds(r["step_s"]), format_seconds(r["compute_s"]),
                     format_seconds(r["comm_s"]), format_bytes(r["memory_bytes"]), "yes" if r["fits"] else "NO",
                     f"{result['step_s'] / r['step_s']:.2f}" if r["step_s"] else "-"])
    same: dict[tuple[str, str], list[Result]] = {}
    for b in result["baselines"]:
        if b["applies"]:
            same.setdefault((rules(b), decided(b)), []).append(b)
        else:
            rows.append([b["name"], f"n/a: {b['why']}", "-", "-", "-", "-", "-", "-", "-"])
    for (text, what), group in same.items():
        b = group[0]
        rows.append([" = ".join(x["name"] for x in group), text, what, format_seconds(b["step_s"]),
                     format_seconds(b["compute_s"]), format_seconds(b["comm_s"]), format_bytes(b["memory_bytes"]),
                     "yes" if b["fits"] else "NO", f"{b['ratio']:.2f}" if b["ratio"] is not None else "-"])
    return rows


def _limit_text(result: Result, args: argparse.Namespace) -> str:
    """The memory limit as given, with its size: ``80GB (74.51 GiB)``."""
    limit = result["memory_limit"]
    if limit is None:
        return "none"
    if args.memory_limit.strip().lower() == "auto":
        return f"{format_bytes(limit)} (auto: the device's usable memory)"
    return f"{args.memory_limit} ({format_bytes(limit)})"


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    status = "proven optimal" if result["optimal"] else (
        f"not proven optimal (gap {result['gap']:.2%})" if result["gap"] is not None else "not proven optimal")
    out: list[Any] = [
        (f"{result['model']} on mesh {result['mesh']} ({result['devices']} devices, {result['hardware']}), "
         f"{result['space']} space: {status} by {result['solver']} in {result['search_s']:.2f} s"),
        (f"peak memory {format_bytes(result['memory_bytes'])} per device against a limit of "
         f"{_limit_text(result, args)}; step {format_seconds(result['step_s'])}"),
        *(f"time limit: {what}" for what in result.get("cut_short", ())),
    ]
    lay = result["layout"]
    if lay["rules_text"] is not None:
        inside = f" inside a pipeline stage over {result['stage_axis']}" if result["stage_axis"] else ""
        out.append(f"layout{inside} (for --layout): {lay['rules_text']}")
    else:
        out.append(f"layout: the {result['space']} space lays out ops differently, which one --layout rule string "
                   "cannot express: the per-tensor PartitionSpecs below are the plan (--json: layout.tensors, "
                   "and layout.iteration per op)")
    if lay["rules"]:
        out.append(table(["dim", "mesh axes"], [[d, "+".join(a) or "-"] for d, a in lay["rules"]],
                         "layout rules" + (" (inside a pipeline stage)" if result["stage_axis"] else "")))
    folded: dict[tuple[str, str], int] = {}
    for name, spec in lay["tensors"].items():
        key = (fold_block_numbers(name), spec_text(spec))
        folded[key] = folded.get(key, 0) + 1
    rows = [[n, spec, count] for (n, spec), count in folded.items()
            if not is_derived(n)]
    out.append(table(["tensor", "PartitionSpec", "count"], rows,
                     "per-tensor PartitionSpecs (inputs, parameters, activations; layers folded; --json: all)"))
    if result["decisions"]:
        drows = [[d["kind"], d["option"], "chosen" if d["chosen"] else "",
                  format_seconds(d["step_s"]) if d["fits"] else
                  f">= {format_seconds(d['at_least_s'])}" if d.get("at_least_s") else "-",
                  format_bytes(d["memory_bytes"]) if d["memory_bytes"] is not None else "-",
                  f"{d['step_s'] / result['step_s']:.2f}" if d["fits"] and result["step_s"] else
                  (d["why"] or "does not fit")] for d in result["decisions"]]
        out.append(table(["decision", "option", "", "best step", "memory", "vs chosen"], drows,
                         "decisions: the best plan with each option (memory: its peak, or the smallest peak when "
                         "nothing fits)"))
    out.append(table(["plan", "rules", "decisions", "step", "compute", "comm", "memory", "fits", "chosen/plan"],
                     _plan_rows(result),
                     "chosen plan, runner-ups and baselines on the same mesh (time and memory per device)"))
    if result["microbatches"] > 1 or result["stage_axis"]:
        out += render_microbatched(result["cost"])
    p = result["problem"]
    if p:
        out.append(f"search: {p.get('candidates', p.get('nodes'))} candidates or decisions, {p['variables']} "
                   f"variables, {p['memory_rows']} memory rows")
    if p and p.get("pruning"):
        out.append(table(["rules search", "candidates", "fit with less recomputation", "over the memory bound",
                          "priced", "priced with overlap"],
                         [[name, f"{r['candidates']:,}", f"{r.get('dominated', 0):,}",
                           "-" if r["memory_bound"] is None else f"{r['memory_bound']:,}", f"{r['priced']:,}",
                           f"{r['refined']:,}"] for name, r in p["pruning"].items()],
                         "how each rules search pruned its space (the rest cannot beat the plan: roofline bound)"))
    if result.get("explain"):
        out += ["what the plan costs, in words:", *(f"  - {line}" for line in result["explain"])]
    for what, path in (("plan saved to", result.get("out")), ("plot saved to", result.get("plot"))):
        if path:
            out.append(f"{what} {path}")
    why = "" if lay["rules_text"] is not None else "  # the best plan of one rule string, which `cost` takes"
    out.append(f"next: {result['next']}{why}")
    mt = result.get("maxtext")
    if mt:
        from layoutsearch.cli.cost import maxtext_lines

        now = mt["current"]
        out += ["", *maxtext_lines(mt),
                (f"your MaxText run as it is: step {format_seconds(now['step_s'])}, peak "
                 f"{format_bytes(now['memory_bytes'])} per device ({'fits' if now['fits'] else 'DOES NOT FIT'}); the "
                 f"plan above: {mt['speedup']:.2f}x faster"),
                "# the MaxText override to apply (config file with base_config: base.yml, or key=value each):",
                mt["override"].rstrip("\n")]
    return out
