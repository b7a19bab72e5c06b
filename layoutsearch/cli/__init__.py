"""The command line: ``layoutsearch <command> ...`` (the root ``cli.py`` runs :func:`main`).

Each command computes one JSON-ready dict; ``--json`` prints that dict, the default prints what the
command's renderer makes of the same dict (rich tables on a terminal, plain text in a pipe). Nothing is
printed before the dict is complete, so a failing command leaves stdout empty. User errors
(:class:`~layoutsearch.errors.LayoutSearchError`) print one line and exit 2; other errors print one line
and exit 1; ``--debug`` adds the traceback (:func:`.common.execute`).

A command ``foo`` is a module ``layoutsearch/cli/foo.py`` with three functions, added to :data:`COMMANDS`::

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

import argparse
import os
import sys
from types import ModuleType
from typing import NoReturn

from layoutsearch.cli import (
    calibrate,
    cost,
    costdag,
    export,
    graph,
    hardware,
    import_,
    layout,
    models,
    partition,
    run,
    search,
    table1,
    validate,
)
from layoutsearch.cli.common import PROG, common_flags, execute

COMMANDS: tuple[ModuleType, ...] = (models, costdag, graph, layout, hardware, cost, table1, validate, partition,
                                    search, run, export, import_, calibrate)
"""Every subcommand's module, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("layoutsearch")
    except PackageNotFoundError:
        ver = "unknown"
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common_flags(False)],
        description="Find, prove and run the optimal sharding layout of a neural network on a device mesh.")
    parser.add_argument("--version", action="version", version=f"{PROG} {ver}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        cmd.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 internal error, 2 usage or input error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2, --help and --version exit 0
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    return execute(args)


def run() -> NoReturn:
    """The ``layoutsearch`` program: :func:`main`, then exit with its status. After Ctrl-C (status 130) the
    interpreter's finalization is skipped: a native solver interrupted mid-presolve may still be running in
    a worker thread (:func:`layoutsearch.solvers.milp._interruptible`), and tearing the interpreter down
    under it aborts the process; files and child processes were already cleaned up on the way out."""
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    run()
