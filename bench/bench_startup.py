"""Benchmark: the start-up of each command, as a user runs it (a fresh process per run).

    .venv/bin/python bench/bench_startup.py                        # 5 runs per command
    .venv/bin/python bench/bench_startup.py --repeat 5 --out bench/RESULTS_startup.txt   # the run quoted

Each command runs as ``layoutsearch ARGS`` would (``layoutsearch.cli:run`` in a new interpreter, the
checkout this script is in first on ``sys.path``, output to a pipe). Per command: the wall time of the
process (median and fastest of the runs), the seconds spent importing modules (``python -X importtime``,
the top-level imports summed, one run), and which of JAX, PuLP, OR-tools, SciPy, networkx, numpy and rich
it imported (and whether the cost model and the layout search). Bytecode is cached under a temporary
``PYTHONPYCACHEPREFIX`` by one untimed run of each command first, as an installed package has it (so the
figures do not depend on PYTHONDONTWRITEBYTECODE or on a source tree's stale caches). ``python -c pass`` is the floor: the interpreter alone.

The partition rows: a 32-node chain written here (layoutsearch's cost DAG format, 4 stages) and, when
/work/shared/placement is present, Tarnawski et al.'s 32-node bert24_inference instance (6 accelerators).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpuinfo import cpu_name  # bench/cpuinfo.py: run as `python bench/<script>.py`

ROOT = Path(__file__).resolve().parents[1]
PLACEMENT = Path("/work/shared/placement/throughput-inputs/LayerGraphs/bert24_inference.json")
HEAVY = ("jax", "pulp", "ortools", "scipy", "networkx", "numpy", "rich", "layoutsearch.costmodel",
         "layoutsearch.solvers.search")
SHIM = ("import atexit, sys\n"
        f"atexit.register(lambda: sys.stderr.write('\\nSTARTUP-MODULES ' + ' '.join(m for m in {HEAVY!r} "
        "if m in sys.modules) + '\\n'))\n"
        "sys.argv[0] = 'layoutsearch'\n"
        "from layoutsearch.cli import run\n"
        "run()\n")


def commands(tmp: Path) -> list[tuple[str, list[str]]]:
    chain = tmp / "chain32.json"
    chain.write_text(json.dumps({
        "format": "layoutsearch.costdag", "version": 1, "name": "chain32",
        "nodes": [{"name": f"n{i}", "compute_s": 1.0 + (i % 3), "memory_bytes": 1000} for i in range(32)],
        "edges": [{"src": f"n{i}", "dst": f"n{i + 1}", "transfer_s": 0.01, "bytes": 100} for i in range(31)]}))
    rows = [("--help", ["--help"]), ("models", ["models"]), ("hardware", ["hardware"]),
            ("hardware h100", ["hardware", "h100"]), ("hardware h100 --json", ["hardware", "h100", "--json"]),
            ("graph mtf-ffn", ["graph", "mtf-ffn"]),
            ("partition chain32.json --stages 4", ["partition", str(chain), "--stages", "4"])]
    if PLACEMENT.is_file():
        rows.append(("partition bert24_inference.json", ["partition", str(PLACEMENT)]))
    rows += [("cost mtf-ffn --mesh data:2,model:4", ["cost", "mtf-ffn", "--mesh", "data:2,model:4"]),
             ("search mtf-ffn --mesh data:2,model:4", ["search", "mtf-ffn", "--mesh", "data:2,model:4"]),
             ("run mtf-ffn --mesh data:2 --steps 1", ["run", "mtf-ffn", "--mesh", "data:2", "--steps", "1"])]
    return rows


def once(argv: list[str], env: dict[str, str], importtime: bool = False) -> tuple[float, int, str]:
    """(wall seconds, exit status, stderr) of one fresh process."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", SHIM, *argv]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - start, proc.returncode, proc.stderr


def import_seconds(stderr: str) -> float:
    """The top-level imports' cumulative times summed (``-X importtime``: nested imports are indented)."""
    total = 0
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit() and not name.startswith("  "):
                total += int(cumulative)
    return total / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per command (default 5)")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        floor = []
        for _ in range(opts.repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
            floor.append(time.perf_counter() - start)
        now = datetime.datetime.now(datetime.timezone.utc)
        lines = [f"# bench/bench_startup.py --repeat {opts.repeat}, {now:%Y-%m-%d %H:%M} UTC, "
                 f"{cpu_name()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
                 f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start",
                 f"# python -c pass: {statistics.median(floor):.3f} s (median), {min(floor):.3f} s (fastest)", "",
                 f"{'command':<40} {'wall median':>11} {'fastest':>8} {'imports':>8}  exit  imported"]
        print("\n".join(lines), flush=True)
        for label, argv in commands(tmp):
            once(argv, env)  # untimed: caches the bytecode
            walls, codes = [], set()
            for _ in range(opts.repeat):
                wall, code, _ = once(argv, env)
                walls.append(wall)
                codes.add(code)
            _, _, err = once(argv, env, importtime=True)
            mods = next((line.split()[1:] for line in err.splitlines() if line.startswith("STARTUP-MODULES")), ["?"])
            row = (f"{label:<40} {statistics.median(walls):>9.3f} s {min(walls):>6.3f} s {import_seconds(err):>6.3f} s"
                   f"  {','.join(map(str, sorted(codes))):>4}  {' '.join(mods) or '-'}")
            print(row, flush=True)
            lines.append(row)
    if opts.out:
        opts.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
