"""``layoutsearch export PLAN.json --format flax|nnx|maxtext|specs|python``: a plan as configuration to paste."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.strictjson import write_text


def add(sub: Any) -> None:
    from layoutsearch.export import FORMATS

    p = command(sub, "export", run, "a plan as configuration for Flax (Linen rules, NNX), MaxText (override YAML), "
                "PartitionSpecs per tensor (JSON) or a Python snippet", render=render)
    p.add_argument("plan", metavar="PLAN.json", help="a plan file (`layoutsearch search ... --out PLAN.json`)")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--dim-name", dest="dim_names", action="append", default=[], metavar="DIM=NAME[+NAME]",
                   help="maxtext: the MaxText logical names of one of the model's dims (repeatable)")
    p.add_argument("--axis-map", action="append", default=[], metavar="AXIS=MAXTEXT_AXIS",
                   help="maxtext: the MaxText mesh axis of one of the plan's mesh axes (repeatable)")
    p.add_argument("--slices", type=int, default=1, metavar="N",
                   help="maxtext: slices (or hosts over DCN) the mesh spans (default 1)")
    p.add_argument("--maxtext-version", metavar="V",
                   help="maxtext: the MaxText version whose keys and logical names to write (default: the installed "
                        "MaxText's, else the newest with a table: " + _versions() + ")")
    p.add_argument("--out", metavar="FILE", help="also write the text to FILE")


def _versions() -> str:
    from layoutsearch.maxtext.version import SUPPORTED

    return ", ".join(SUPPORTED)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise LayoutSearchError(f"malformed {what} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.export import export
    from layoutsearch.solvers.plan import Plan

    plan = Plan.load(args.plan)
    c = plan.chosen

    dim_names = {k: v.split("+") if "+" in v else v for k, v in _pairs(args.dim_names, "--dim-name").items()}
    text = export(c.layout, plan.model, args.format, remat=c.remat, microbatches=c.microbatches,
                  stage_axis=c.stage_axis, schedule=c.schedule, dim_names=dim_names or None,
                  axis_map=_pairs(args.axis_map, "--axis-map") or None, slices=args.slices,
                  maxtext_version=args.maxtext_version)
    executed = _as_maxtext_runs(plan) if args.format == "maxtext" else None
    if executed is not None:
        text = executed["note"] + "\n" + text
    if args.out:
        try:
            write_text(args.out, text)
        except OSError as e:
            raise LayoutSearchError(f"cannot write {args.out!r}: {e}") from None
    return {"plan": args.plan, "format": args.format, "text": text, "out": args.out, "maxtext_execution": executed}


def _as_maxtext_runs(plan: Any) -> dict[str, Any] | None:
    """The plan re-priced as MaxText runs it, where that differs from how it was priced (a remat policy for
    the first layers only: MaxText has one policy for every layer, ``full``); None where it is the same."""
    from layoutsearch.ir.remat import parse_remat
    from layoutsearch.solvers.search import price_plan
    from layoutsearch.units import format_bytes, format_seconds

    c = plan.chosen
    if parse_remat(c.remat).blocks is None:
        return None
    run = price_plan(plan.model, c.layout, plan.hardware, remat="full", microbatches=c.microbatches,
                     stage_axis=c.stage_axis, schedule=c.schedule, memory_limit=plan.memory_limit,
                     optimizer=plan.optimizer, precision=plan.precision, attention=plan.attention,
                     overlap=plan.overlap)
    fits = run.within(plan.memory_limit)
    note = (f"# MaxText runs this plan with remat full (one policy for every layer; the plan: {c.remat}): predicted "
            f"step {format_seconds(run.step_s)} (the plan's {format_seconds(c.step_s)}), peak "
            f"{format_bytes(run.memory_bytes)} (the plan's {format_bytes(c.memory_bytes)})"
            + ("" if fits else ", over the memory limit"))
    return {"remat": "full", "step_s": run.step_s, "memory_bytes": run.memory_bytes, "fits": fits, "note": note}


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    return [result["text"].rstrip("\n")]
