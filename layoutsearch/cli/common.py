"""What the commands share: argument helpers and their readers, registration, output (JSON, tables, plain
text) and error handling with exit codes."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from layoutsearch.errors import HardwareError, LayoutSearchError
from layoutsearch.mesh import PRESETS, Hardware, Mesh, hardware

if TYPE_CHECKING:  # the IR and layouts are imported where a command reads a model (start-up: cli/__init__.py)
    from layoutsearch.ir.graph import Graph
    from layoutsearch.layout import Layout

PROG = "layoutsearch"

Result = dict[str, Any]
"""What a command returns: JSON-ready, printed as is by ``--json``."""

Renderer = Callable[[Result, argparse.Namespace], Iterable[Any]]
"""Turns a command's result into things to print: strings (printed verbatim) or rich renderables."""


# -- registration ---------------------------------------------------------------------------------------------------

def command(sub: Any, name: str, run: Callable[[argparse.Namespace], Result], help: str,
            render: Renderer | None = None) -> argparse.ArgumentParser:
    """Register subcommand ``name``: ``run(args)`` computes the result, ``render`` shows it (default: a table)."""
    p = sub.add_parser(name, help=help, description=help, parents=[common_flags(argparse.SUPPRESS)])
    p.set_defaults(run=run, render=render or render_generic)
    return p


def common_flags(default: Any) -> argparse.ArgumentParser:
    """``--json`` and ``--debug``, accepted before and after the subcommand (the subcommand's copies default to
    SUPPRESS so that they do not overwrite a flag given before it)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", default=default, help="print the result as JSON on stdout")
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks of errors")
    return p


# -- shared arguments -----------------------------------------------------------------------------------------------

def add_model_args(p: argparse.ArgumentParser, maxtext: bool = False) -> None:
    """``MODEL`` (zoo name or JSON graph file) and repeatable ``--set KEY=VALUE``; with ``maxtext``, MODEL is
    optional and ``--maxtext CONFIG.yml [KEY=VALUE ...]`` with ``--devices N`` may give the model instead
    (read back by :func:`maxtext_run_of`)."""
    p.add_argument("model", metavar="MODEL", nargs="?" if maxtext else None,
                   help="zoo model name (see `layoutsearch models`) or a JSON graph file"
                        + (" (or --maxtext CONFIG.yml)" if maxtext else ""))
    if maxtext:
        p.add_argument("--maxtext", nargs="+", metavar="CONFIG.yml [KEY=VALUE",
                       help="a MaxText run instead of MODEL: its config file and command-line overrides, read with "
                            "MaxText's own loader when a Python with MaxText is found ($LAYOUTSEARCH_MAXTEXT_PYTHON), "
                            "else layoutsearch's reader; the model, mesh, layout, remat and accumulation come from it")
        p.add_argument("--devices", type=int, metavar="N",
                       help="with --maxtext: the devices the run uses (needed when a parallelism key is -1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model size, e.g. --set batch=32 --set layers=4 (repeatable)")


def add_mesh_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--mesh", required=required, metavar="AXES",
                   help="device mesh, named axes major first, e.g. data:2,model:4")


def add_layout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", default=None, metavar="RULES",
                   help="layout rules dim:axis, e.g. batch:data,d_ff:model; several axes batch:data+fsdp; "
                        "'' or 'replicated' for none (default: the conventional layout for the mesh's axis names: "
                        "data/fsdp axes split batch, fsdp also d_model, model/tensor axes heads, d_ff, vocab and "
                        "seq (sequence parallelism), seq/context axes seq, expert axes experts)")


def add_hardware_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--hardware", default=default, metavar="PRESET",
                   help=f"hardware preset ({', '.join(PRESETS)}) or a hardware profile JSON file written by "
                        "`layoutsearch calibrate`" + (f"; default {default}" if default else ""))
    p.add_argument("--hw", dest="hw_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware figure, e.g. --hw peak_flops=300e12 --hw fast_link.bandwidth=100e9 "
                        "--hw axis_links.data=slow (repeatable)")


def add_training_args(p: argparse.ArgumentParser) -> None:
    """``--optimizer`` and ``--precision``: how the training step is run."""
    from layoutsearch.ir.precision import DEFAULT_PRECISION, PRECISIONS
    from layoutsearch.ir.training import OPTIMIZERS

    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="optimizer of the step (default adam)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=DEFAULT_PRECISION,
                   help="mixed: bf16 parameters, activations, gradients and collectives with fp32 master weights "
                        "and optimizer state (Megatron, MaxText); bf16: everything bf16; fp32: everything fp32 "
                        f"(default {DEFAULT_PRECISION})")


def add_case_args(p: argparse.ArgumentParser, maxtext: bool = False) -> None:
    """MODEL with --set, --mesh, --layout, --hardware (default cpu-sim) with --hw, --optimizer and --precision:
    one training step of a model under one layout (read back by :func:`case_of`); ``maxtext``: or a MaxText run
    (:func:`add_model_args`)."""
    add_model_args(p, maxtext)
    add_mesh_arg(p, required=not maxtext)
    add_layout_arg(p)
    add_hardware_args(p, default="cpu-sim")
    add_training_args(p)


def remat_arg(text: str) -> str:
    """``--remat``: a policy of :mod:`layoutsearch.ir.remat` (``auto`` too, where a command searches it)."""
    from layoutsearch.ir.remat import check_remat

    if text == "auto":
        return text
    try:
        return check_remat(text)
    except LayoutSearchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def overlap_arg(text: str) -> str | float:
    """``--overlap``: ``auto`` or a fraction in [0, 1]."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number in [0, 1], got {text!r}")
    return value


def seconds_arg(text: str) -> float:
    """``--time-limit``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def load_graph(args: argparse.Namespace) -> Graph:
    """The graph named by ``MODEL`` with the ``--set`` overrides."""
    from layoutsearch import zoo
    from layoutsearch.zoo import parse_overrides

    return zoo.load(args.model, parse_overrides(args.overrides) or None)


def mesh_of(args: argparse.Namespace) -> Mesh:
    """The ``--mesh``."""
    return Mesh.parse(args.mesh)


def layout_of(args: argparse.Namespace, graph: Graph) -> Layout:
    """The ``--layout`` rules on the ``--mesh`` (default: the conventional rules for the mesh's axis names,
    :func:`~layoutsearch.layout.conventional_rules`), checked against ``graph``."""
    from layoutsearch.layout import Layout, conventional_rules

    mesh = mesh_of(args)
    rules = args.layout
    if rules is None:
        notes: list[str] = []
        rules = conventional_rules(graph, mesh, getattr(args, "stage_axis", None), notes)
        for line in notes:
            print(f"layoutsearch: note: {line}", file=sys.stderr)
    elif rules.strip() in ("replicated", "-"):
        rules = ""
    return Layout.from_rules(mesh, rules).check(graph)


def maxtext_run_of(args: argparse.Namespace) -> Any:
    """The :class:`~layoutsearch.maxtext.config_in.MaxTextRun` of ``--maxtext``, or None; LayoutSearchError for
    MODEL and --maxtext both or neither, or --maxtext beside the options it replaces."""
    given = getattr(args, "maxtext", None)
    if given is None:
        if args.model is None:
            raise LayoutSearchError("give a MODEL (a zoo name or a graph file) or --maxtext CONFIG.yml")
        if getattr(args, "mesh", "") is None:
            raise LayoutSearchError("--mesh is required with a MODEL")
        if getattr(args, "devices", None) is not None:
            raise LayoutSearchError("--devices applies to --maxtext runs (a MODEL's devices are its --mesh)")
        return None
    clash = [flag for flag, value in (("MODEL", args.model), ("--set", args.overrides), ("--mesh", args.mesh),
                                      ("--layout", getattr(args, "layout", None))) if value]
    if clash:
        raise LayoutSearchError(f"--maxtext gives the model, mesh and layout: drop {', '.join(clash)}")
    from layoutsearch.maxtext.config_in import read_maxtext_run

    if args.devices is not None and args.devices < 1:
        raise LayoutSearchError(f"--devices must be a positive integer, got {args.devices}")
    return read_maxtext_run(given[0], given[1:], devices=args.devices)


def maxtext_summary(run: Any) -> dict[str, Any]:
    """JSON-ready: how a MaxText run was read (reader, notes, mesh, layout, remat, accumulation)."""
    return {"reader": run.reader, "notes": run.notes, "mesh": str(run.layout.mesh), "layout": run.layout.describe(),
            "per_tensor_entries": len(run.layout.tensors), "remat": run.remat, "microbatches": run.microbatches,
            "stage_axis": run.stage_axis, "schedule": run.schedule,
            "model_name": run.config.get("model_name"), "batch": run.graph.dims.get("batch"),
            "seq": run.graph.dims.get("seq")}


def case_of(args: argparse.Namespace) -> tuple[Graph, Layout, Hardware]:
    """The graph, layout and hardware (default cpu-sim) of the options :func:`add_case_args` adds."""
    graph = load_graph(args)
    layout = layout_of(args, graph)
    return graph, layout, hardware_of(args) or hardware("cpu-sim")


def hardware_of(args: argparse.Namespace) -> Hardware | None:
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


def _split_kv(item: str, what: str, example: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise LayoutSearchError(f"malformed {what} {item!r}: expected KEY=VALUE, e.g. {example}")
    return key, value


def _number(value: str) -> Any:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


# -- output ---------------------------------------------------------------------------------------------------------

def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> Any:
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


def render_generic(result: Result, args: argparse.Namespace) -> list[Any]:
    """A result without a renderer of its own: a key/value table."""
    return [table(["key", "value"], ([k, json.dumps(v) if isinstance(v, dict | list) else v]
                                     for k, v in result.items()))]


def spec_text(spec: Sequence[Any]) -> str:
    """A PartitionSpec as text: ``P('data', None)``, ``P(('data', 'fsdp'), 'model')``."""
    parts = ("None" if s is None else repr(s) if isinstance(s, str) else repr(tuple(s)) for s in spec)
    return "P(" + ", ".join(parts) + ")"


def emit(result: Result, args: argparse.Namespace) -> None:
    """Print ``result``: JSON, rich output on a terminal, or plain text (no control codes, no wrapping, no
    trailing blanks) elsewhere."""
    if args.json:
        from layoutsearch.ir import strictjson

        sys.stdout.write(strictjson.dumps(result) + "\n")
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


# -- running a command ----------------------------------------------------------------------------------------------

def execute(args: argparse.Namespace) -> int:
    """Run the parsed command and print its result; the exit status: 0 ok, 1 internal error, 2 input error
    (one line on stderr; ``--debug`` adds the traceback), 130 interrupted."""
    try:
        emit(args.run(args), args)
        return 0
    except LayoutSearchError as e:
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(str(e))}{_flag_hint(e)}", file=sys.stderr)
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


def _flag_hint(e: LayoutSearchError) -> str:
    """The command-line flag that fixes ``e``, where the library says which setting does (library messages name
    settings, not flags)."""
    figure = getattr(e, "hardware_figure", None)
    if figure:
        return f" (--hw {figure})"
    setting = getattr(e, "setting", None)
    return f" (--{setting.replace('_', '-')})" if setting else ""


def _one_line(msg: str) -> str:
    return " ".join(msg.split())
