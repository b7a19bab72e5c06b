"""The command line: ``layoutsearch <command> ...`` (the root ``cli.py`` runs :func:`main`).

Each command computes one JSON-ready dict; ``--json`` prints that dict, the
default prints what the command's renderer makes of the same dict (rich
tables on a terminal, plain text in a pipe). Nothing is printed before the
dict is complete, so a failing command leaves stdout empty. User errors
(:class:`~layoutsearch.errors.LayoutSearchError`) print one line and exit 2;
other errors print one line and exit 1; ``--debug`` adds the traceback.

Adding a command ``foo`` takes three small functions and one registration::

    def _add_foo(sub):                      # arguments
        p = _command(sub, "foo", _cmd_foo, "one-line help", render=_render_foo)
        _add_model_args(p)
        _add_mesh_arg(p)

    def _cmd_foo(args) -> dict:             # the result; the single source of both outputs
        graph, mesh = _load_graph(args), _mesh(args)
        return {"model": graph.name, "devices": mesh.size}

    def _render_foo(result, args) -> list:  # optional: strings, rich tables, ...
        return [f"{result['model']} on {result['devices']} devices"]

and append ``_add_foo`` to :data:`COMMANDS`. Without a renderer the dict is
shown as a key/value table. Shared argument helpers: :func:`_add_model_args`
(``MODEL``, ``--set``), :func:`_add_mesh_arg`, :func:`_add_layout_arg`,
:func:`_add_hardware_args` (``--hardware``, ``--hw``); and their readers
:func:`_load_graph`, :func:`_mesh`, :func:`_layout`, :func:`_hardware`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from layoutsearch.errors import HardwareError, LayoutSearchError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import PRESETS, Hardware, Mesh, hardware
from layoutsearch.units import format_bytes, format_seconds, parse_bytes

PROG = "layoutsearch"

Result = dict[str, Any]
"""What a command returns: JSON-ready, printed as is by ``--json``."""

Renderer = Callable[[Result, argparse.Namespace], Iterable[Any]]
"""Turns a command's result into things to print: strings (printed verbatim) or rich renderables."""


# -- shared arguments -----------------------------------------------------------------------------------------------

def _add_model_args(p: argparse.ArgumentParser) -> None:
    """``MODEL`` (zoo name or JSON graph file) and repeatable ``--set KEY=VALUE``."""
    p.add_argument("model", metavar="MODEL", help="zoo model name (see `layoutsearch models`) or a JSON graph file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model size, e.g. --set batch=32 --set layers=4 (repeatable)")


def _add_mesh_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--mesh", required=required, metavar="AXES",
                   help="device mesh, named axes major first, e.g. data:2,model:4")


def _add_layout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", default=None, metavar="RULES",
                   help="layout rules dim:axis, e.g. batch:data,d_ff:model; several axes batch:data+fsdp; "
                        "'' or 'replicated' for none (default: the conventional layout for the mesh's axis names: "
                        "data/fsdp axes split batch, fsdp also d_model, model/tensor axes heads, d_ff, vocab and "
                        "seq (sequence parallelism), seq/context axes seq, expert axes experts)")


def _add_hardware_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--hardware", default=default, metavar="PRESET",
                   help=f"hardware preset ({', '.join(PRESETS)}) or a hardware profile JSON file written by "
                        "`layoutsearch calibrate`" + (f"; default {default}" if default else ""))
    p.add_argument("--hw", dest="hw_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware figure, e.g. --hw peak_flops=300e12 --hw fast_link.bandwidth=100e9 "
                        "--hw axis_links.data=slow (repeatable)")


def _add_training_args(p: argparse.ArgumentParser) -> None:
    """``--optimizer`` and ``--precision``: how the training step is run."""
    from layoutsearch.ir.precision import DEFAULT_PRECISION, PRECISIONS
    from layoutsearch.ir.training import OPTIMIZERS

    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer of the step (default adam)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=DEFAULT_PRECISION,
                   help="mixed: bf16 parameters, activations, gradients and collectives with fp32 master weights "
                        "and optimizer state (Megatron, MaxText); bf16: everything bf16; fp32: everything fp32 "
                        f"(default {DEFAULT_PRECISION})")


def _split_kv(item: str, what: str, example: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise LayoutSearchError(f"malformed {what} {item!r}: expected KEY=VALUE, e.g. {example}")
    return key, value


def _add_case_args(p: argparse.ArgumentParser) -> None:
    """MODEL with --set, --mesh, --layout and --hardware (default cpu-sim) with --hw: one model under one layout."""
    _add_model_args(p)
    _add_mesh_arg(p)
    _add_layout_arg(p)
    _add_hardware_args(p, default="cpu-sim")


def _load_graph(args: argparse.Namespace) -> Graph:
    """The graph named by ``MODEL`` with the ``--set`` overrides."""
    from layoutsearch import zoo
    from layoutsearch.zoo import parse_overrides

    return zoo.load(args.model, parse_overrides(args.overrides) or None)


def _mesh(args: argparse.Namespace) -> Mesh:
    return Mesh.parse(args.mesh)


def _layout(args: argparse.Namespace, graph: Graph) -> Layout:
    """The ``--layout`` rules on the ``--mesh`` (default: the conventional rules for the mesh's axis names,
    :func:`~layoutsearch.layout.conventional_rules`), checked against ``graph``."""
    from layoutsearch.layout import conventional_rules

    mesh = _mesh(args)
    rules = args.layout
    if rules is None:
        rules = conventional_rules(graph, mesh, getattr(args, "stage_axis", None))
    elif rules.strip() in ("replicated", "-"):
        rules = ""
    return Layout.from_rules(mesh, rules).check(graph)


def _number(value: str) -> Any:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def _hardware(args: argparse.Namespace) -> Hardware | None:
    """The ``--hardware`` preset with the ``--hw`` overrides (None if no preset and no override)."""
    if args.hardware is None and not args.hw_overrides:
        return None
    if args.hardware is None:
        raise HardwareError("--hw overrides need a preset to apply to: add --hardware NAME")
    changes: dict[str, Any] = {}
    links: dict[str, str] = {}
    for item in args.hw_overrides:
        key, value = _split_kv(item, "hardware override", "peak_flops=300e12")
        if key.startswith("axis_links."):
            links[key.split(".", 1)[1]] = value
        else:
            changes[key.replace(".", "_")] = value if key == "name" else _number(value)
    if links:
        changes["axis_links"] = links
    hw = hardware(args.hardware)
    try:
        return hw.replace(**changes) if changes else hw
    except (TypeError, ValueError) as e:
        raise HardwareError(f"bad hardware override among {', '.join(args.hw_overrides)}: {e}") from None


# -- output helpers -------------------------------------------------------------------------------------------------

def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> Any:
    """A rich table whose cells are plain text (no markup: names may contain brackets)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    numeric = set()
    rows = [list(r) for r in rows]
    for i, _ in enumerate(columns):
        if rows and all(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in rows):
            numeric.add(i)
    t = Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, col in enumerate(t.columns):
        if i in numeric:
            col.justify = "right"
    for r in rows:
        t.add_row(*(Text(_cell(c)) for c in r))
    return t


def _cell(value: Any) -> str:
    if value == {}:
        return "scalar"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_cell(v) if not isinstance(v, str) else v for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return str(value)


def _render_generic(result: Result, args: argparse.Namespace) -> list[Any]:
    return [_table(["key", "value"], ([k, json.dumps(v) if isinstance(v, dict | list) else v]
                                      for k, v in result.items()))]


def _spec_text(spec: Sequence[Any]) -> str:
    """A PartitionSpec as text: ``P('data', None)``, ``P(('data', 'fsdp'), 'model')``."""
    parts = ("None" if s is None else repr(s) if isinstance(s, str) else repr(tuple(s)) for s in spec)
    return "P(" + ", ".join(parts) + ")"


# -- models ---------------------------------------------------------------------------------------------------------

def _add_models(sub: Any) -> None:
    _command(sub, "models", _cmd_models, "list the model zoo with each model's parameters and defaults",
             render=_render_models)


def _cmd_models(args: argparse.Namespace) -> Result:
    from layoutsearch.zoo import list_models

    return {"models": [{"name": m.name, "description": m.description, "params": dict(m.params)}
                       for m in list_models()]}


def _render_models(result: Result, args: argparse.Namespace) -> list[Any]:
    from layoutsearch.zoo import STR_PARAMS

    def value(k: str, v: Any) -> Any:  # None: no preset, or a size derived from the others
        return v if v is not None else "none" if k in STR_PARAMS else "auto"

    rows = [[m["name"], m["description"], " ".join(f"{k}={value(k, v)}" for k, v in m["params"].items())]
            for m in result["models"]]
    return [_table(["model", "description", "parameters (defaults; change with --set KEY=VALUE)"], rows)]


# -- graph ----------------------------------------------------------------------------------------------------------

def _add_graph(sub: Any) -> None:
    p = _command(sub, "graph", _cmd_graph, "summarize a model's graph, or write it as a JSON graph file",
                 render=_render_graph)
    _add_model_args(p)
    p.add_argument("--out", metavar="FILE", help="write the graph as a JSON graph file instead of summarizing it")


def _cmd_graph(args: argparse.Namespace) -> Result:
    from layoutsearch.ir import save_graph

    graph = _load_graph(args)
    if args.out:
        try:
            save_graph(graph, args.out)
        except OSError as e:
            raise LayoutSearchError(f"cannot write graph file {args.out!r}: {e.strerror}") from None
        return {"model": graph.name, "written": args.out, "tensors": len(graph.tensors), "ops": len(graph.ops)}
    ops: dict[str, int] = {}
    for op in graph.ops:
        ops[op.kind] = ops.get(op.kind, 0) + 1
    params = [{"name": t.name, "shape": {d.name: d.size for d in t.dims}, "dtype": t.dtype,
               "elements": t.num_elements, "bytes": t.nbytes} for t in graph.parameters]
    return {
        "model": graph.name, "dims": dict(graph.dims), "tensors": len(graph.tensors), "ops": len(graph.ops),
        "ops_by_kind": ops, "inputs": [{"name": t.name, "shape": {d.name: d.size for d in t.dims}, "dtype": t.dtype}
                                       for t in graph.inputs],
        "loss": graph.loss, "parameters": params,
        "parameter_count": sum(p["elements"] for p in params), "parameter_bytes": sum(p["bytes"] for p in params),
        "meta": graph.meta,
    }


def _render_graph(result: Result, args: argparse.Namespace) -> list[Any]:
    if "written" in result:
        return [(f"wrote graph {result['model']!r} ({result['tensors']} tensors, {result['ops']} ops) "
                 f"to {result['written']}")]
    return [
        (f"model {result['model']}: {result['tensors']} tensors, {result['ops']} ops, "
         f"{result['parameter_count']:,} parameters ({format_bytes(result['parameter_bytes'])}), loss {result['loss']}"),
        _table(["dim", "size"], result["dims"].items(), title="dims"),
        _table(["op kind", "count"], result["ops_by_kind"].items(), title="ops"),
        _table(["input", "shape", "dtype"], ([t["name"], t["shape"], t["dtype"]] for t in result["inputs"]),
               title="inputs"),
        _table(["parameter", "shape", "dtype", "elements", "bytes"],
               ([p["name"], p["shape"], p["dtype"], p["elements"], p["bytes"]] for p in result["parameters"]),
               title="parameters"),
    ]


# -- layout ---------------------------------------------------------------------------------------------------------

_EXPORTS = ("python", "flax", "maxtext")


def _add_layout(sub: Any) -> None:
    p = _command(sub, "layout", _cmd_layout, "check a layout against a model; show every tensor's PartitionSpec "
                 "and per-device shape, and export it for JAX/Flax/MaxText", render=_render_layout)
    _add_model_args(p)
    _add_mesh_arg(p)
    _add_layout_arg(p)
    _add_hardware_args(p)
    p.add_argument("--export", choices=_EXPORTS,
                   help="print only this export: python (PartitionSpecs), flax (logical_axis_rules), "
                        "maxtext (config YAML)")


def _cmd_layout(args: argparse.Namespace) -> Result:
    from layoutsearch import export

    graph = _load_graph(args)
    layout = _layout(args, graph)
    hw = _hardware(args)
    mesh = layout.mesh
    tensors = []
    by_role: dict[str, int] = {}
    for t in graph.tensors.values():
        spec = layout.spec(t)
        local = layout.local_bytes(t)
        by_role[t.role] = by_role.get(t.role, 0) + local
        tensors.append({"name": t.name, "role": t.role, "dtype": t.dtype, "shape": {d.name: d.size for d in t.dims},
                        "spec": [list(s) if isinstance(s, tuple) else s for s in spec],
                        "local_shape": list(layout.local_shape(t)), "local_bytes": local,
                        "replication": layout.replication(t)})
    result: Result = {
        "model": graph.name, "mesh": str(mesh), "devices": mesh.size, "layout": layout.describe(),
        "rules": [[d, list(a)] for d, a in layout.rules], "tensors": tensors,
        "local_bytes_by_role": by_role,
        "export": {
            "flax_logical_axis_rules": [[d, list(a) if isinstance(a, tuple) else a]
                                        for d, a in export.flax_logical_axis_rules(layout)],
            "maxtext": export.maxtext_overrides(layout),
            "python": export.python_snippet(layout, graph),
        },
    }
    if hw is not None:
        links = hw.links_for(mesh)
        result["hardware"] = {
            "name": hw.name, "hbm_bytes": hw.hbm_bytes,
            "axis_links": {a: {"kind": "fast" if link == hw.fast_link else "slow", "bandwidth": link.bandwidth,
                               "latency": link.latency} for a, link in links.items()},
        }
    return result


def _maxtext_yaml(cfg: Result) -> str:
    # JSON flow values are valid YAML, so each key is one line of YAML.
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in cfg.items())


def _render_layout(result: Result, args: argparse.Namespace) -> list[Any]:
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
    out.append(_table(["tensor", "role", "shape", "PartitionSpec", "per-device shape", "per-device bytes"],
                      ([t["name"], t["role"], t["shape"], _spec_text(t["spec"]), t["local_shape"], t["local_bytes"]]
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


# -- hardware -------------------------------------------------------------------------------------------------------

def _add_hardware(sub: Any) -> None:
    p = _command(sub, "hardware", _cmd_hardware, "list hardware presets, or show one preset's figures",
                 render=_render_hardware)
    p.add_argument("name", nargs="?", metavar="PRESET", help="show this preset's (or hardware profile JSON file's) "
                   "figures (with --hw overrides)")
    p.add_argument("--hw", dest="hw_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a figure, e.g. --hw peak_flops=300e12 (repeatable)")
    _add_mesh_arg(p, required=False)


def _cmd_hardware(args: argparse.Namespace) -> Result:
    if args.name is None:
        if args.hw_overrides or args.mesh:
            raise LayoutSearchError("--hw and --mesh need a preset: layoutsearch hardware PRESET ...")
        return {"presets": {name: hw.to_dict() for name, hw in PRESETS.items()}}
    args.hardware = args.name
    hw = _hardware(args)
    assert hw is not None
    result: Result = {"hardware": hw.to_dict()}
    if args.mesh:
        mesh = _mesh(args)
        result["mesh"] = str(mesh)
        result["axis_links"] = {a: "fast" if link == hw.fast_link else "slow" for a, link in hw.links_for(mesh).items()}
    return result


def _render_hardware(result: Result, args: argparse.Namespace) -> list[Any]:
    if "presets" in result:
        rows = [[n, h["peak_flops"] / 1e12, h["hbm_bytes"] / 1e9, h["hbm_bandwidth"] / 1e9,
                 h["fast_link"]["bandwidth"] / 1e9, h["slow_link"]["bandwidth"] / 1e9, h["devices_per_node"]]
                for n, h in result["presets"].items()]
        return [_table(["preset", "peak TFLOP/s", "HBM GB", "HBM GB/s", "fast link GB/s", "slow link GB/s",
                        "devices per node"], rows)]
    h = result["hardware"]
    rows = []
    for k, v in h.items():
        if isinstance(v, dict):
            rows += [[f"{k}.{sub}", sv] for sub, sv in v.items()]
        else:
            rows.append([k, v])
    out: list[Any] = [_table(["figure", "value"], rows)]
    if "axis_links" in result:
        out.append(f"mesh {result['mesh']}: " + ", ".join(f"{a} uses the {k} link"
                                                        for a, k in result["axis_links"].items()))
    return out


# -- cost -----------------------------------------------------------------------------------------------------------

def _add_cost(sub: Any) -> None:
    from layoutsearch.costmodel.memory import REMAT_POLICIES

    p = _command(sub, "cost", _cmd_cost, "predict the time, communication, FLOPs and memory per device of one "
                 "training step under a layout, broken down by op and by cause", render=_render_cost)
    _add_case_args(p)
    _add_training_args(p)
    p.add_argument("--remat", choices=REMAT_POLICIES, default="none",
                   help="activation rematerialization: none, selective (recompute all but projections' outputs) "
                        "or full (keep only block boundaries); default none")
    p.add_argument("--overlap", type=_overlap_arg, default="auto", metavar="auto|F",
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
    p.add_argument("--schedule", default="1f1b", metavar="S",
                   help="pipeline schedule: gpipe, 1f1b (default) or interleaved:V (V virtual stages per device)")


def _overlap_arg(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number in [0, 1], got {text!r}")
    return value


def _cmd_cost(args: argparse.Namespace) -> Result:
    from layoutsearch.costmodel.pipeline import Schedule, estimate_pipeline
    from layoutsearch.costmodel.report import estimate

    graph = _load_graph(args)
    layout = _layout(args, graph)
    hw = _hardware(args) or hardware("cpu-sim")
    if args.top < 0:
        raise LayoutSearchError(f"--top must be at least 0, got {args.top}")
    if args.microbatches < 1:
        raise LayoutSearchError(f"--microbatches must be a positive integer, got {args.microbatches}")
    schedule = Schedule.parse(args.schedule)
    if args.stage_axis is not None:
        layout.mesh.axis_size(args.stage_axis)  # a clear error for an axis the mesh lacks
    if args.stage_axis is None and args.microbatches == 1:
        return estimate(graph, layout, hw, optimizer=args.optimizer, precision=args.precision, remat=args.remat,
                        attention=args.attention, overlap=args.overlap).to_dict()
    if args.overlap != "auto":
        raise LayoutSearchError("--overlap takes only 'auto' with --microbatches or --stage-axis (the schedule "
                                "decides what overlaps)")
    rep = estimate_pipeline(graph, layout, hw, stage_axis=args.stage_axis, microbatches=args.microbatches,
                            schedule=schedule, remat=args.remat, optimizer=args.optimizer, precision=args.precision,
                            attention=args.attention)
    return {**rep.to_dict(), "gantt": rep.gantt() if args.stage_axis is not None else None}


def _render_cost(result: Result, args: argparse.Namespace) -> list[Any]:
    from layoutsearch.costmodel.report import render_report

    if "stage_costs" in result:
        return _render_microbatched(result)
    return render_report(result, top=args.top)


def _render_microbatched(r: Result) -> list[Any]:
    """A micro-batched step (pipeline or gradient accumulation) as text."""
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
            ["bubble", f"{r['bubble_fraction']:.1%}", "idle fraction of the loop with equal stages"],
            ["peak memory", format_bytes(r["memory_bytes"]), f"{fits} in {format_bytes(r['usable_bytes'])} usable of {format_bytes(r['hbm_bytes'])} HBM "
             "(the largest stage)"],
            ["micro-batch compute", format_seconds(mb["compute_s"]),
             f"all stages together; communication {format_seconds(mb['comm_s'])}, of which "
             f"{format_seconds(mb['comm_exposed_s'])} exposed (the unpipelined micro-batch step)"]]
    out: list[Any] = [head, _table(["total", "value", "breakdown"], rows, "step (per device)")]
    srows = []
    for k, s in enumerate(r["stage_costs"]):
        m = s["memory"]
        srows.append([k, " + ".join(f"{c[0]}..{c[-1]}" for c in s["chunks"]), format_seconds(s["microbatch_s"]),
                      format_seconds(s["transfer_s"]), format_seconds(s["once_s"]), f"{s['in_flight']:g}",
                      format_bytes(s["memory_bytes"]),
                      ", ".join(f"{key} {format_bytes(v)}" for key, v in m.items() if v)])
    out.append(_table(["stage", "units", "per micro-batch", "transfers", "once per step", "in flight", "memory",
                       "memory breakdown"], srows, "stages (time and memory per device)"))
    if r.get("gantt"):
        out.append(r["gantt"])
    return out


# -- table1 ---------------------------------------------------------------------------------------------------------

def _add_table1(sub: Any) -> None:
    from layoutsearch.table1 import DEFAULT_MESH, DEFAULT_SIZES

    p = _command(sub, "table1", _cmd_table1, "Table 1 of the Mesh-TensorFlow paper for mtf-ffn: formulas, predicted "
                 "and compiled communication, FLOPs and memory of four layouts, side by side", render=_render_table1)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="sizes: " + ", ".join(f"{k}={v}" for k, v in DEFAULT_SIZES.items()) + " (the defaults)")
    p.add_argument("--mesh", default=DEFAULT_MESH, metavar="AXES",
                   help=f"2-D mesh rows:R,cols:C (default {DEFAULT_MESH}); batch goes on rows, hidden on cols")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="skip the compiled program (formulas and predictions only; no JAX)")


def _cmd_table1(args: argparse.Namespace) -> Result:
    from layoutsearch.table1 import DEFAULT_SIZES, table1
    from layoutsearch.zoo import parse_overrides

    sizes = parse_overrides(args.overrides)
    unknown = [k for k in sizes if k not in DEFAULT_SIZES]
    if unknown:
        raise LayoutSearchError(f"table1 has no size {', '.join(map(repr, unknown))} (sizes: {', '.join(DEFAULT_SIZES)})")
    return table1(**sizes, mesh=_mesh(args), compiled=args.compile)


def _render_table1(result: Result, args: argparse.Namespace) -> list[Any]:
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
    out.append(_table(cols, rows))
    detail = []
    for r in result["rows"]:
        for side in ("predicted", "compiled"):
            for c in r.get(side, {}).get("collectives", []):
                detail.append([r["layout"], side, c["kind"], "+".join(c["axes"] or ["?"]), c["bytes"]])
    if detail:
        out.append(_table(["layout", "source", "collective", "axes", "bytes"], detail, title="collectives"))
    return out


# -- partition ------------------------------------------------------------------------------------------------------

def _add_partition(sub: Any) -> None:
    from layoutsearch.solvers.partition import OBJECTIVES, SOLVERS

    p = _command(sub, "partition", _cmd_partition, "split a cost DAG (JSON file, see docs/costdag.md) into pipeline "
                 "stages: per-stage load and memory, and for gpipe the bubble and the schedule", render=_render_partition)
    p.add_argument("file", metavar="FILE", help="cost DAG JSON file (format: docs/costdag.md)")
    p.add_argument("--stages", type=int, required=True, metavar="K", help="number of pipeline stages")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                   help="throughput: minimize the largest stage load (compute + transfers); gpipe: minimize "
                        "(M + K - 1) x the slowest stage time (default throughput)")
    p.add_argument("--microbatches", type=int, default=1, metavar="M",
                   help="micro-batches per step: the GPipe schedule length and the activations in flight (default 1)")
    p.add_argument("--memory-limit", metavar="BYTES", help="per-stage memory limit, e.g. 16GiB or 2e10")
    p.add_argument("--non-contiguous", action="store_true",
                   help="let a stage hold any set of nodes (throughput only; solved by an ILP)")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="dp (exact, contiguous), ilp-pulp, ilp-ortools, brute (tiny DAGs); default auto")
    p.add_argument("--time-limit", type=float, metavar="S", help="stop an ILP after S seconds with its best partition")


def _cmd_partition(args: argparse.Namespace) -> Result:
    from layoutsearch.costdag import load_costdag
    from layoutsearch.gantt import render_gantt
    from layoutsearch.solvers.partition import equal_split, partition

    dag = load_costdag(args.file)
    limit = parse_bytes(args.memory_limit) if args.memory_limit is not None else None
    part = partition(dag, args.stages, objective=args.objective, microbatches=args.microbatches, memory_limit=limit,
                     contiguous=not args.non_contiguous, solver=args.solver, time_limit=args.time_limit)
    result: Result = {"dag": dag.name, "file": args.file, "nodes": len(dag.nodes), "edges": len(dag.edges),
                      "num_stages": args.stages, "memory_limit": limit, "contiguous": not args.non_contiguous}
    result.update(part.to_dict())
    if args.objective == "gpipe" or not args.non_contiguous:
        base = equal_split(dag, args.stages, objective=args.objective, microbatches=args.microbatches)
        result["baseline"] = {"method": base.method, "objective": base.objective, "max_memory": max(base.memory),
                              "optimal_over_baseline": part.objective / base.objective if base.objective else None}
    if args.objective == "gpipe":
        result["gantt"] = render_gantt(args.stages, args.microbatches, times=list(part.loads))
    return result


def _render_partition(result: Result, args: argparse.Namespace) -> list[Any]:
    kind = result["objective_kind"]
    what = (f"step time {format_seconds(result['objective'])} over {result['microbatches']} micro-batches" if kind == "gpipe"
            else f"largest stage load {format_seconds(result['objective'])} per micro-batch")
    status = "optimal" if result["optimal"] else (f"not proven optimal, gap {result['gap']:.1%}"
                                                   if result["gap"] is not None else "not proven optimal")
    out: list[Any] = [(f"cost DAG {result['dag']}: {result['nodes']} nodes, {result['edges']} edges -> "
                       f"{result['num_stages']} {'contiguous' if result['contiguous'] else 'non-contiguous'} stages; "
                       f"{kind}: {what} ({status}, {result['method']})")]
    rows = []
    for k, s in enumerate(result["stages"]):
        names = s["nodes"]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
        rows.append([k, len(names), span, format_seconds(s["load"]), format_bytes(s["memory"])])
    load_col = "time per micro-batch" if kind == "gpipe" else "load"
    out.append(_table(["stage", "nodes", "first .. last", load_col, "memory"], rows))
    if result.get("memory_limit") is not None:
        out.append(f"memory limit {format_bytes(result['memory_limit'])} per stage")
    if "baseline" in result:
        b = result["baseline"]
        ratio = b["optimal_over_baseline"]
        out.append(f"baseline ({b['method']}): {format_seconds(b['objective'])}"
                   + (f"; this partition is {1 / ratio:.2f}x faster" if ratio else ""))
    if kind == "gpipe":
        out.append(f"bubble fraction {result['bubble_fraction']:.1%}")
        out.append(result["gantt"])
    return out


# -- search ---------------------------------------------------------------------------------------------------------

def _add_search(sub: Any) -> None:
    from layoutsearch.costmodel.memory import REMAT_POLICIES
    from layoutsearch.solvers.search import SOLVERS
    from layoutsearch.solvers.space import SPACES

    p = _command(sub, "search", _cmd_search, "find the layout minimizing the predicted step time under a memory "
                 "limit, proven optimal, with runner-ups and baselines (data-parallel, FSDP, Megatron, Mesh-TF 2-D)",
                 render=_render_search)
    _add_model_args(p)
    _add_mesh_arg(p)
    _add_hardware_args(p, default="cpu-sim")
    p.add_argument("--memory-limit", default="auto", metavar="BYTES|auto|none",
                   help="per-device memory limit, e.g. 16GiB; auto (default): the device's usable memory (HBM less "
                        "the runtime's reserve, see `layoutsearch hardware PRESET`); none: no limit")
    p.add_argument("--solver", choices=SOLVERS, default="auto",
                   help="enumerate, ilp-pulp, ilp-ortools or dp; auto: enumeration for one decision, the DP for "
                        "chains of layers, CP-SAT otherwise (default auto)")
    p.add_argument("--space", choices=SPACES, default="rules",
                   help="rules: one Mesh-TF rule set for the graph; layers: one per repeated block; ops: per-op "
                        "layouts and parameter storage (default rules)")
    p.add_argument("--top", type=int, default=3, metavar="N", help="the best plan and N-1 runner-ups (default 3)")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="stop an ILP after S seconds with its best plan, labelled not proven optimal")
    _add_training_args(p)
    p.add_argument("--attention", choices=("auto", "standard", "flash"), default="auto",
                   help="attention kernel, held fixed: auto (flash on GPU/TPU presets), standard or flash")
    p.add_argument("--overlap", type=_overlap_arg, default="auto", metavar="auto|F",
                   help="communication overlap of the cost model (default auto)")
    p.add_argument("--remat", choices=("auto", *REMAT_POLICIES), default="auto",
                   help="activation rematerialization: auto (default: none, selective and full searched with the "
                        "layout), or one policy")
    p.add_argument("--pipeline", default="off", metavar="auto|off|K",
                   help="pipeline stages over one mesh axis: off (default), auto (stage axis, K, micro-batches and remat "
                        "searched with the layout; chosen when faster), or K (an axis of size K must carry stages)")
    p.add_argument("--microbatches", default="auto", metavar="N|auto",
                   help="micro-batches per step: gradient accumulation, or a pipeline's micro-batches (default auto: "
                        "searched; accumulation is tried when the memory limit binds)")
    p.add_argument("--schedule", default="1f1b", metavar="S",
                   help="schedule of a pipelined plan: gpipe, 1f1b (default) or interleaved:V")


def _progress() -> Callable[[str], None]:
    """Progress lines on stderr, once a search has run for a second (stdout stays for the result)."""
    import time

    start = time.perf_counter()
    tty = sys.stderr.isatty()

    def show(what: str) -> None:
        elapsed = time.perf_counter() - start
        if elapsed >= 1.0:
            end = "\r" if tty else "\n"
            print(f"{PROG} search: {elapsed:6.1f} s  {what}" + (" " * 10 if tty else ""), end=end, file=sys.stderr,
                  flush=True)

    return show


def _cmd_search(args: argparse.Namespace) -> Result:
    from layoutsearch.solvers.search import search

    graph = _load_graph(args)
    hw = _hardware(args) or hardware("cpu-sim")
    mesh = _mesh(args)
    pipeline = _pipeline_arg(args.pipeline)
    microbatches = "auto" if args.microbatches == "auto" else _positive_int(args.microbatches, "--microbatches")
    plan = search(graph, mesh, args.memory_limit, args.solver, hardware=hw, space=args.space,
                  optimizer=args.optimizer, precision=args.precision, attention=args.attention, overlap=args.overlap,
                  remat=args.remat, microbatches=microbatches, pipeline=pipeline, schedule=args.schedule,
                  top=args.top, time_limit=args.time_limit, progress=_progress())
    result = plan.to_dict()
    rep = plan.chosen.report
    if plan.chosen.pipelined:
        result["cost"]["gantt"] = rep.gantt()
    if sys.stderr.isatty():
        print(" " * 100, end="\r", file=sys.stderr)
    return result


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
    """The chosen plan, runner-ups and baselines as table rows."""
    def decided(r: Result) -> str:
        what = [f"remat {r['remat']}"]
        if r.get("stage_axis"):
            what.append(f"pipeline over {r['stage_axis']} ({r['schedule']}, {r['microbatches']} micro-batches)")
        elif r.get("microbatches", 1) > 1:
            what.append(f"{r['microbatches']} micro-batches")
        return ", ".join(what)

    def rules(r: Result) -> str:
        return ",".join(f"{d}:{'+'.join(a)}" for d, a in r["rules"]) if r["rules"] is not None else "(per-op)"

    chosen = {**result, "rules": result["layout"]["rules"]}
    rows = []
    for label, r in [("chosen", chosen)] + [(f"runner-up {r['name']}", r) for r in result["runner_ups"]]:
        rows.append([label, rules(r), decided(r), format_seconds(r["step_s"]),
                     format_seconds(r["compute_s"]), format_seconds(r["comm_s"]),
                     format_bytes(r["memory_bytes"]), "yes" if r["fits"] else "NO",
                     f"{result['step_s'] / r['step_s']:.2f}" if r["step_s"] else "-"])
    for b in result["baselines"]:
        if not b["applies"]:
            rows.append([b["name"], f"n/a: {b['why']}", "-", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([b["name"], rules(b), decided(b), format_seconds(b["step_s"]), format_seconds(b["compute_s"]),
                     format_seconds(b["comm_s"]), format_bytes(b["memory_bytes"]), "yes" if b["fits"] else "NO",
                     f"{b['ratio']:.2f}" if b["ratio"] is not None else "-"])
    return rows


def _render_search(result: Result, args: argparse.Namespace) -> list[Any]:
    import re

    status = "proven optimal" if result["optimal"] else (
        f"not proven optimal (gap {result['gap']:.2%})" if result["gap"] is not None else "not proven optimal")
    limit = result["memory_limit"]
    out: list[Any] = [
        (f"{result['model']} on mesh {result['mesh']} ({result['devices']} devices, {result['hardware']}), "
         f"{result['space']} space: {status} by {result['solver']} in {result['search_s']:.2f} s"),
        (f"peak memory {format_bytes(result['memory_bytes'])} per device against a limit of "
         f"{format_bytes(limit) if limit is not None else 'none'}; step {format_seconds(result['step_s'])}"),
    ]
    lay = result["layout"]
    if lay["rules"]:
        out.append(_table(["dim", "mesh axes"], [[d, "+".join(a) or "-"] for d, a in lay["rules"]],
                          "layout rules" + (" (inside a pipeline stage)" if result["stage_axis"] else "")))
    elif lay["rules"] is not None:
        out.append("layout rules: none (every tensor replicated)")
    else:
        out.append("layout: per-op computation layouts (see --json: layout.iteration) and per-tensor storage below")
    folded: dict[tuple[str, str], int] = {}
    for name, spec in lay["tensors"].items():
        key = (re.sub(r"(?<=[A-Za-z_])\.\d+(?=/)", ".*", name), _spec_text(spec))
        folded[key] = folded.get(key, 0) + 1
    rows = [[n, spec, count] for (n, spec), count in folded.items()
            if not n.startswith(("grad/", "new/", "adam_"))]
    out.append(_table(["tensor", "PartitionSpec", "count"], rows,
                      "per-tensor PartitionSpecs (inputs, parameters, activations; layers folded; --json: all)"))
    if result["decisions"]:
        drows = [[d["kind"], d["option"], "chosen" if d["chosen"] else "",
                  format_seconds(d["step_s"]) if d["fits"] else "-",
                  format_bytes(d["memory_bytes"]) if d["memory_bytes"] is not None else "-",
                  f"{d['step_s'] / result['step_s']:.2f}" if d["fits"] and result["step_s"] else
                  (d["why"] or "does not fit")] for d in result["decisions"]]
        out.append(_table(["decision", "option", "", "best step", "memory", "vs chosen"], drows,
                          "decisions: the best plan with each option (memory: its peak, or the smallest peak when "
                          "nothing fits)"))
    out.append(_table(["plan", "rules", "decisions", "step", "compute", "comm", "memory", "fits", "chosen/plan"],
                      _plan_rows(result),
                      "chosen plan, runner-ups and baselines on the same mesh (time and memory per device)"))
    if result["microbatches"] > 1 or result["stage_axis"]:
        out += _render_microbatched(result["cost"])
    p = result["problem"]
    if p:
        out.append(f"search: {p.get('candidates', p.get('nodes'))} candidates or decisions, {p['variables']} "
                   f"variables, {p['memory_rows']} memory rows")
    return out


# -- calibrate ------------------------------------------------------------------------------------------------------

def _add_calibrate(sub: Any) -> None:
    p = _command(sub, "calibrate", _cmd_calibrate, "measure matmul rates, HBM bandwidth and each mesh axis's "
                 "collective latency and bandwidth on the JAX devices present; write them as a hardware profile "
                 "(use it with --hardware FILE)", render=_render_calibrate)
    p.add_argument("--out", required=True, metavar="FILE", help="hardware profile JSON file to write")
    p.add_argument("--mesh", metavar="AXES", help="mesh whose axes are measured, e.g. data:2,model:4 (default: "
                   "every device on one axis data:N; 8 simulated CPU devices when there is no accelerator)")
    p.add_argument("--base", metavar="PRESET", help="preset whose vendor peaks, HBM size, tiles and unmeasured "
                   "links the measurements complete (default: the preset of the device kind, if known)")
    p.add_argument("--quick", action="store_true", help="fewer and smaller sizes (seconds)")


def _cmd_calibrate(args: argparse.Namespace) -> Result:
    from layoutsearch.calibrate import calibrate, write_profile
    from layoutsearch.hwprofile import hardware_to_json

    mesh = _mesh(args) if args.mesh else None
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


def _render_calibrate(result: Result, args: argparse.Namespace) -> list[Any]:
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
    out.append(_table(["dtype", "m x n x k", "measured", "achieved", "of peak", "model efficiency",
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
        out.append(_table(["axis", "size", "link", "collective", "alpha (us)", "bw (GB/s)", "payload measured"],
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
    out.append(_table(["figure", "value"], figures, "the profile's figures"))
    out.append(f"wrote {result['out']}: use it with --hardware {result['out']}")
    return out


# -- registry and entry point ---------------------------------------------------------------------------------------

def _add_costdag(sub: Any) -> None:
    from layoutsearch.costmodel.memory import REMAT_POLICIES

    p = _command(sub, "costdag", _cmd_costdag, "write a model's pipeline cost DAG (blocks priced by the cost model "
                 "on one micro-batch under a layout inside a stage) for `layoutsearch partition`")
    _add_case_args(p)
    _add_training_args(p)
    p.add_argument("--microbatches", type=int, default=1, metavar="M", help="micro-batches per step (default 1)")
    p.add_argument("--remat", choices=REMAT_POLICIES, default="none",
                   help="activation rematerialization inside each block: none (default), selective or full")
    p.add_argument("--out", required=True, metavar="FILE", help="cost DAG JSON file to write")


def _cmd_costdag(args: argparse.Namespace) -> Result:
    from layoutsearch.costmodel.pipeline import pipeline_costdag

    graph = _load_graph(args)
    layout = _layout(args, graph)
    hw = _hardware(args) or hardware("cpu-sim")
    dag, _, _ = pipeline_costdag(graph, layout, "stage", hw, microbatches=args.microbatches, remat=args.remat,
                                 optimizer=args.optimizer, precision=args.precision)
    dag.save(args.out)
    return {"model": graph.name, "out": args.out, "nodes": [n.name for n in dag.nodes],
            "compute_s": sum(n.compute_s for n in dag.nodes), "microbatches": args.microbatches,
            "remat": args.remat}


def _add_validate(sub: Any) -> None:
    p = _command(sub, "validate", _cmd_validate, "predicted against compiled collectives, FLOPs and memory per "
                 "device for one layout (and measured step time on a GPU/TPU)", render=_render_validate)
    _add_case_args(p)
    _add_training_args(p)


def _cmd_validate(args: argparse.Namespace) -> Result:
    from layoutsearch.validate import jax_devices, validate

    graph = _load_graph(args)
    layout = _layout(args, graph)
    jax_devices(layout.mesh.size)  # before JAX starts: simulated CPU devices if needed
    return validate(graph, layout, _hardware(args) or hardware("cpu-sim"), optimizer=args.optimizer,
                    precision=args.precision)


def _render_validate(result: Result, args: argparse.Namespace) -> list[Any]:
    head = (f"{result['model']} on {result['mesh']} ({result['platform']}), layout "
            f"{result['layout'] or 'replicated'}: predicted step {format_seconds(result['predicted_step_s'])} on "
            f"{result['hardware']}")
    if "measured_step_s" in result:
        head += f", measured {format_seconds(result['measured_step_s'])}"
    rows = [[r["what"], r["predicted"], r["compiled"], "-" if r["ratio"] is None else f"{r['ratio']:.4f}"]
            for r in result["rows"]]
    return [head, _table(["quantity", "predicted", "compiled", "predicted/compiled"], rows)]


def _command(sub: Any, name: str, run: Callable[[argparse.Namespace], Result], help: str,
             render: Renderer | None = None) -> argparse.ArgumentParser:
    """Register subcommand ``name``: ``run(args)`` computes the result, ``render`` shows it (default: a table)."""
    p = sub.add_parser(name, help=help, description=help, parents=[_common_flags(argparse.SUPPRESS)])
    p.set_defaults(run=run, render=render or _render_generic)
    return p


COMMANDS: tuple[Callable[[Any], None], ...] = (_add_models, _add_costdag, _add_graph, _add_layout, _add_hardware, _add_cost,
                                               _add_table1, _add_validate, _add_partition, _add_search, _add_calibrate)
"""Every subcommand, by its ``_add_<name>`` function, in the order ``--help`` lists them."""


def _common_flags(default: Any) -> argparse.ArgumentParser:
    # Accepted before and after the subcommand; the subcommand's copies default to SUPPRESS so that they do not
    # overwrite a flag given before the subcommand.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", default=default, help="print the result as JSON on stdout")
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks of errors")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("layoutsearch")
    except PackageNotFoundError:
        ver = "unknown"
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[_common_flags(False)],
        description="Find, prove and run the optimal sharding layout of a neural network on a device mesh.")
    parser.add_argument("--version", action="version", version=f"{PROG} {ver}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def _emit(result: Result, args: argparse.Namespace) -> None:
    """Print ``result``: JSON, rich output on a terminal, or plain text (no control codes, no wrapping, no
    trailing blanks) elsewhere."""
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.text import Text

    tty = sys.stdout.isatty()
    buf = io.StringIO()
    console = Console(file=sys.stdout if tty else buf, width=None if tty else 100_000, force_terminal=tty or None,
                      highlight=False, emoji=False, markup=False)
    for item in args.render(result, args):
        if isinstance(item, str):
            console.print(Text(item), soft_wrap=True)
        else:
            console.print(item)
    if not tty:
        sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 internal error, 2 usage or input error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help and --version exit 0
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        result = args.run(args)
        _emit(result, args)
        return 0
    except LayoutSearchError as e:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error; keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 -- the last resort: one line instead of a traceback
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(e).__name__}: {_one_line(str(e))} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
