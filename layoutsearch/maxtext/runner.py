"""Run MaxText's own code (the script :mod:`layoutsearch.maxtext.probe`) under the Python that has MaxText.

MaxText needs Python 3.12+ and a set of packages layoutsearch does not; it may live in another interpreter.
:func:`maxtext_python` finds it: ``$LAYOUTSEARCH_MAXTEXT_PYTHON`` when set, else this interpreter when it can
import ``maxtext``, else none (the callers then use the checked-in tables of :mod:`.version`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutError

PROBE = Path(__file__).resolve().with_name("probe.py")
ENV_PYTHON = "LAYOUTSEARCH_MAXTEXT_PYTHON"


def maxtext_python() -> str | None:
    """The interpreter that runs MaxText: ``$LAYOUTSEARCH_MAXTEXT_PYTHON``, else this one if it imports
    ``maxtext``, else None."""
    given = os.environ.get(ENV_PYTHON)
    if given:
        return given
    if importlib.util.find_spec("maxtext") is not None:
        return sys.executable
    return None


def _run(request: dict[str, Any], python: str | None, timeout: float) -> list[dict[str, Any]]:
    python = python or maxtext_python()
    if python is None:
        raise LayoutError(f"MaxText is not importable here: install it (Python 3.12+: pip install maxtext) or set "
                          f"{ENV_PYTHON} to a Python that has it")
    try:
        done = subprocess.run([python, str(PROBE)], input=json.dumps(request), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        raise LayoutError(f"MaxText's Python {python!r} does not exist") from None
    except subprocess.TimeoutExpired:
        raise LayoutError(f"MaxText's code did not answer within {timeout:g} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise LayoutError(f"running MaxText ({python}) failed: {tail[0]}")
    return [json.loads(line) for line in lines]


def probe(argvs: Sequence[Sequence[str]], devices: int, *, python: str | None = None,
          timeout: float = 900.0) -> list[dict[str, Any]]:
    """Run MaxText's config loader, mesh builder and abstract model on each ``argv`` (``[CONFIG.yml,
    "key=value", ...]``) on ``devices`` simulated CPU devices; one result per argv (see
    :mod:`layoutsearch.maxtext.probe` for its fields; ``error`` where MaxText refused the config)."""
    return _run({"devices": int(devices), "cases": [{"argv": [str(a) for a in argv]} for argv in argvs]},
                python, timeout)


def read_files(*, python: str | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """MaxText's ``base.yml`` and model files as data (``maxtext_version``, ``base``, ``models``)."""
    return _run({"devices": 1, "files": True}, python, timeout)[0]


def base_config(python: str | None = None) -> str:
    """The path of MaxText's ``configs/base.yml`` under ``python`` (the first argument of every MaxText run)."""
    python = python or maxtext_python()
    if python is None:
        raise LayoutError(f"MaxText is not importable here (set {ENV_PYTHON})")
    code = ("import importlib.util, os; s = importlib.util.find_spec('maxtext'); "
            "print(os.path.join(s.submodule_search_locations[0], 'configs', 'base.yml'))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LayoutError(f"MaxText's Python {python!r} cannot import maxtext")
    return done.stdout.strip().splitlines()[-1]
