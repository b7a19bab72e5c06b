"""The command line: ``layoutsearch <command> ...`` (the root ``cli.py`` runs :func:`main`).

Each command computes one JSON-ready dict; ``--json`` prints that dict, the default prints what the
command's renderer makes of the same dict (rich tables on a terminal, plain text in a pipe). Nothing is
printed before the dict is complete, so a failing command leaves stdout empty. User errors
(:class:`~layoutsearch.errors.LayoutSearchError`) print one line and exit 2; other errors print one line
and exit 1; ``--debug`` adds the traceback (:func:`.common.execute`).

A command ``foo`` is a module ``layoutsearch/cli/foo.py`` with three functions, named in :data:`COMMANDS` with its
one-line help (the module is imported only when the command runs)::

    def add(sub):                           # its arguments
        p = command(sub, "foo", run, "one-line help", render=render)
        add_model_args(p)
        add_mesh_arg(p)

    def run(args) -> Result:                # the result; the single source of both outputs
        graph, mesh = load_graph(args), mesh_of(args)
        return {"model": graph.name, "devices": mesh.size}

    def render(result, args) -> list:       # optional: strings, rich tables, ...
        return [f"{result['model']} on {result['devices']} devices"]

Without a renderer the dict is shown as a key/value table. The shared argument helpers and their readers
(``MODEL``/``--set``, ``--mesh``, ``--layout``, ``--hardware``/``--hw``, ``--optimizer``/``--precision``,
``--overlap``) are in :mod:`.common`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import argparse
    from types import ModuleType

COMMANDS: dict[str, str] = {
    "models": "list the model zoo with each model's parameters and defaults",
    "costdag": "write a model's pipeline cost DAG (blocks priced by the cost model on one micro-batch under a layout "
               "inside a stage) for `layoutsearch partition`",
    "graph": "summarize a model's graph, or write it as a JSON graph file",
    "layout": "check a layout against a model; show every tensor's PartitionSpec and per-device shape, and export it "
              "for JAX/Flax/MaxText",
    "hardware": "list hardware presets, or show one preset's figures",
    "cost": "predict the time, communication, FLOPs and memory per device of one training step under a layout, "
            "broken down by op and by cause",
    "table1": "Table 1 of the Mesh-TensorFlow paper for mtf-ffn: formulas, predicted and compiled communication, "
              "FLOPs and memory of four layouts, side by side",
    "validate": "predicted against compiled collectives, FLOPs and memory per device for one layout (and measured "
                "step time on a GPU/TPU)",
    "partition": "split a cost DAG (JSON file, see docs/costdag.md) into pipeline stages: per-stage load and memory, "
                 "and for gpipe the bubble and the schedule",
    "search": "find the layout minimizing the predicted step time under a memory limit, proven optimal, with "
              "runner-ups and baselines (data-parallel, FSDP, Megatron, Mesh-TF 2-D)",
    "run": "run training steps of a plan (a file from `search --out`, or the plan searched for MODEL) on the devices "
           "present, with loss, step time and tokens/s against the prediction",
    "export": "a plan as configuration for Flax (Linen rules, NNX), MaxText (override YAML), PartitionSpecs per tensor "
              "(JSON) or a Python snippet",
    "import": "a JAX/Flax loss function of your code as a graph file (traced, dims named from the spec file; see "
              "docs/import.md)",
    "calibrate": "measure matmul rates, HBM bandwidth and each mesh axis's collective latency and bandwidth on the "
                 "JAX devices present; write them as a hardware profile (use it with --hardware FILE)",
}
"""Every subcommand and its one-line help, in the order ``--help`` lists them (the help is also the one the
command's module gives to ``command(...)``: tests/test_cli.py checks they agree). A command's module is
imported only when that command runs (or :func:`build_parser` is asked for every command), so that start-up
costs what the command needs and no more."""


def command_module(name: str) -> ModuleType:
    """The module of command ``name`` (``layoutsearch/cli/NAME.py``; ``import_`` for ``import``)."""
    import importlib

    return importlib.import_module(f"layoutsearch.cli.{name}_" if name == "import" else f"layoutsearch.cli.{name}")


def build_parser(command: str | None = None, every: bool = True) -> argparse.ArgumentParser:
    """The argument parser of every command; with ``every=False``, the arguments of ``command`` only (the other
    commands are listed with their help, enough for ``--help`` and for argparse's "invalid choice")."""
    import argparse

    from layoutsearch.cli.common import PROG, common_flags

    class Version(argparse.Action):  # argparse's "version" action, the version looked up only when asked for
        def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
            super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS,
                             help="show program's version number and exit")

        def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
            from importlib.metadata import PackageNotFoundError, version

            try:
                ver = version("layoutsearch")
            except PackageNotFoundError:
                ver = "unknown"
            print(f"{PROG} {ver}")
            parser.exit()

    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common_flags(False)],
        description="Find, prove and run the optimal sharding layout of a neural network on a device mesh.")
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help in COMMANDS.items():
        if every or name == command:
            command_module(name).add(sub)
        else:
            sub.add_parser(name, help=help, description=help)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The command named in ``argv``: its first word that is not a flag (the options before a command take no
    values: ``--json``, ``--debug``, ``--help``, ``--version``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 internal error, 2 usage or input error, 130
    interrupted)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        from layoutsearch.cli.common import execute

        parser = build_parser(_command_in(argv), every=False)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse: usage errors exit 2, --help and --version exit 0
            return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    except KeyboardInterrupt:  # while the command's modules import
        return interrupted()
    return execute(args)


def interrupted() -> int:
    """Ctrl-C: one line on stderr, and status 130 (as :func:`.common.execute` says it during a command)."""
    print("layoutsearch: interrupted", file=sys.stderr)
    return 130


def _on_ctrl_c(signum: int, frame: Any) -> None:
    """The program's SIGINT handler: KeyboardInterrupt, as Python's own, so that a command cleans up on its way
    out (temporary files, solver processes); but in the middle of an import, which has nothing to clean up and
    where an exception can escape as another error (numpy's extension prints the traceback and raises
    ImportError), one line and exit 130 at once."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            interrupted()
            _exit_130()
        frame = frame.f_back
    raise KeyboardInterrupt


def _exit_130() -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _interrupt_again(unraisable: Any) -> None:
    """``sys.unraisablehook`` of the program: a Ctrl-C that landed where Python ignores exceptions (a garbage
    collector callback, as JAX installs one, or a destructor; "Exception ignored in ...") is delivered again to
    the main thread instead of being lost; anything else goes to the default hook."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        import _thread

        _thread.start_new_thread(_interrupt_main_soon, ())  # raised here, in the hook, it would be ignored again
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_main_soon() -> None:
    import _thread
    import time

    time.sleep(0.01)  # the main thread has left the hook
    _thread.interrupt_main()


def run() -> NoReturn:
    """The ``layoutsearch`` program: :func:`main`, then exit with its status. Ctrl-C at any moment, also while
    modules import, prints one line and exits 130 (:func:`_on_ctrl_c`, :func:`_interrupt_again`); once the
    command is over it is ignored. After Ctrl-C the interpreter's finalization is skipped: a native solver
    interrupted mid-presolve may still be running in a worker thread
    (:func:`layoutsearch.solvers.milp._interruptible`), and tearing the interpreter down under it aborts the
    process; files and child processes were already cleaned up on the way out.

    Python's cyclic garbage collector is off for the program, as for a search
    (:func:`layoutsearch.solvers.search.search`): one command runs and the process ends, and each collection
    walks every object alive (a large model's graph and plans: about a second per walk after a search, which
    ``--time-limit`` would have to leave time for); the heap is frozen before the interpreter's finalization,
    whose own collection then has nothing to walk."""
    import gc
    import signal

    gc.disable()
    signal.signal(signal.SIGINT, _on_ctrl_c)
    sys.unraisablehook = _interrupt_again
    try:
        code = main()
    except KeyboardInterrupt:  # between the handlers of main and execute
        code = interrupted()
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is over: a Ctrl-C on the way out changes nothing
    if code == 130:
        _exit_130()
    sys.exit(code)


if __name__ == "__main__":
    run()
