"""The MaxText test tier's interpreter: a Python 3.12+ venv holding ``maxtext==0.2.5`` (``--no-deps``) and
``requirements.txt``, made once and cached, with a wrapper that puts ``stubs.py`` on its path.

Cache: ``$LAYOUTSEARCH_MAXTEXT_VENV``, else ``~/.cache/layoutsearch/maxtext-0.2.5-<hash of requirements>``.
The interpreter: ``$LAYOUTSEARCH_MAXTEXT_BASE_PYTHON``, else the first Python >= 3.12 that runs among
``python3.12``, ``python3.13``, ``python3`` on PATH and pyenv's installed versions."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAXTEXT = "maxtext==0.2.5"


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def base_python() -> str | None:
    """A Python >= 3.12 that runs, or None."""
    given = os.environ.get("LAYOUTSEARCH_MAXTEXT_BASE_PYTHON")
    candidates = [given] if given else []
    candidates += [shutil.which(n) for n in ("python3.12", "python3.13", "python3")]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(root, "versions", "3.1[2-9]*", "bin", "python3")))
    for c in candidates:
        if c and (_version(c) or (0, 0)) >= (3, 12):
            return c
    return None


def venv_dir() -> Path:
    digest = hashlib.sha256((MAXTEXT + (HERE / "requirements.txt").read_text()).encode()).hexdigest()[:10]
    given = os.environ.get("LAYOUTSEARCH_MAXTEXT_VENV")
    return Path(given) if given else Path.home() / ".cache" / "layoutsearch" / f"maxtext-0.2.5-{digest}"


def maxtext_python() -> str:
    """The wrapper interpreter (the venv made on first use); RuntimeError with pip's last line if the install
    fails. The wrapper is written again on every call: it names this checkout's harness directory (the stubs,
    sitecustomize.py), and the cached venv is shared by every checkout of the machine."""
    venv = venv_dir()
    if (venv / ".complete").exists():
        return _wrapper(venv)
    base = base_python()
    if base is None:
        raise RuntimeError("no Python >= 3.12")
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    steps = [[base, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--no-deps", MAXTEXT],
             [str(python), "-m", "pip", "install", "-q", "-r", str(HERE / "requirements.txt")]]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for step in steps:
        for attempt in (1, 2):  # (one retry: a registry hiccup should not fail the tier)
            done = subprocess.run(step, capture_output=True, text=True, env=env, check=False)
            if done.returncode == 0:
                break
            if attempt == 2:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise RuntimeError(f"{' '.join(step[-3:])} failed: {tail}")
    (venv / ".complete").write_text("ok\n")
    return _wrapper(venv)


def _wrapper(venv: Path) -> str:
    """``bin/python-maxtext-harness`` of ``venv``: its Python with this checkout's harness first on the path
    (written to a temporary name and renamed, so a concurrent test run never executes half a script)."""
    wrapper = venv / "bin" / "python-maxtext-harness"
    text = f'#!/bin/sh\nPYTHONPATH="{HERE}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{venv / "bin" / "python"}" "$@"\n'
    if not wrapper.exists() or wrapper.read_text() != text:
        tmp = wrapper.with_name(f"{wrapper.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return str(wrapper)


if __name__ == "__main__":
    print(maxtext_python())
    sys.exit(0)
