"""Benchmark: what the bounds of README "Limits" cost, and how bad input is refused (issue 33).

    .venv/bin/python bench/bench_limits.py                                  # every row
    .venv/bin/python bench/bench_limits.py --out bench/RESULTS_limits.txt   # the run quoted in the README

Each row runs ``layoutsearch ARGS`` in a fresh process (``layoutsearch.cli:run``, this checkout first on
``sys.path``, output to pipes) and records its exit status, wall seconds, peak resident memory (the child's
``ru_maxrss`` from ``os.wait4``) and the number of lines it wrote to stderr.

Two tables:

* **largest accepted**: inputs at (or near) a documented bound that the tool accepts: how long they take and
  how much memory they need (the figures README "Limits" quotes);
* **time limits and Ctrl-C**: a search that takes longer than 20 s, with ``--time-limit`` 5 and 20 (it must
  answer within T + 10% + 1 s of start-up, baselines included) and interrupted at moments from 0.01 s to 8 s
  after it starts (exit 130, one line "layoutsearch: interrupted" last, no traceback);
* **refused**: the bad-input rows of issue 33, each of which must exit 2 with one line on stderr, within 2 s
  of work after start-up (the interpreter's, and JAX's import for the commands that run on devices: `run`,
  `calibrate`), in under 1 GiB. A row that does not is marked ``FAIL``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpuinfo import cpu_name  # bench/cpuinfo.py: run as `python bench/<script>.py`

ROOT = Path(__file__).resolve().parents[1]
SHIM = "import sys\nsys.argv[0] = 'layoutsearch'\nfrom layoutsearch.cli import run\nrun()\n"
GiB = 2**30


def measure(argv: list[str], timeout: float, interrupt: float | None = None) -> dict:
    """One fresh ``layoutsearch ARGV``: status, wall seconds, peak RSS bytes, stderr lines (and the last), whether
    stderr has a traceback; ``interrupt``: SIGINT (Ctrl-C) that many seconds after the start."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", SHIM, *argv], cwd=ROOT, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if interrupt is not None and time.perf_counter() - start >= interrupt:
                proc.send_signal(signal.SIGINT)
                interrupt = None
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                status = None
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
        proc.returncode = 0  # reaped by os.wait4 (for its rusage): Popen must not wait for it again
        err.seek(0)
        lines = err.read().splitlines()
    return {"code": os.waitstatus_to_exitcode(status) if status is not None else "timeout",
            "wall_s": wall, "rss": usage.ru_maxrss * 1024, "stderr_lines": len(lines),
            "last": lines[-1] if lines else "", "traceback": any(ln.startswith("Traceback") for ln in lines)}


def inputs(tmp: Path) -> dict[str, Path]:
    """The files the rows read: a saved plan (and tampered copies), a placement instance, a long chain."""
    plan = tmp / "plan.json"
    subprocess.run([sys.executable, "-c", SHIM, "search", "mtf-ffn", "--mesh", "data:2", "--hardware", "cpu-sim",
                    "--out", str(plan)], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    doc = json.loads(plan.read_text())
    files = {"plan": plan}

    def tampered(name: str, change) -> None:
        d = json.loads(json.dumps(doc))
        change(d)
        files[name] = tmp / f"{name}.json"
        files[name].write_text(json.dumps(d))

    tampered("plan_huge_dim", lambda d: d["model"]["dims"].__setitem__("batch", 2**40))
    tampered("plan_step_str", lambda d: d["plan"].__setitem__("step_s", "fast"))
    tampered("plan_mesh_moved", lambda d: d["plan"]["layout"].__setitem__("mesh", "data:4"))
    tampered("plan_optimal_str", lambda d: d["plan"].__setitem__("optimal", "yes"))
    instance = {"maxSizePerFPGA": 1000, "maxFPGAs": 2, "maxCPUs": 1,
                "nodes": [{"id": 1, "name": "a", "supportedOnFpga": True, "cpuLatency": 5, "fpgaLatency": 1},
                          {"id": 2, "name": "b", "supportedOnFpga": False, "cpuLatency": 2},
                          {"id": 3, "name": "c", "supportedOnFpga": True, "cpuLatency": 5, "fpgaLatency": 1}],
                "edges": [{"sourceId": 1, "destId": 2, "cost": 1}, {"sourceId": 2, "destId": 3, "cost": 1}]}
    files["instance"] = tmp / "instance.json"
    files["instance"].write_text(json.dumps(instance))
    bad = json.loads(json.dumps(instance))
    bad["edges"][0]["sourceId"] = [1]
    files["instance_list_id"] = tmp / "instance_list_id.json"
    files["instance_list_id"].write_text(json.dumps(bad))
    bad = json.loads(json.dumps(instance))
    bad["nodes"][1]["supportedOnFpga"] = "false"
    files["instance_string_flag"] = tmp / "instance_string_flag.json"
    files["instance_string_flag"].write_text(json.dumps(bad))
    for n in (1024, 4096):
        files[f"chain{n}"] = tmp / f"chain{n}.json"
        files[f"chain{n}"].write_text(json.dumps({
            "format": "layoutsearch.costdag", "version": 1, "name": f"chain{n}",
            "nodes": [{"name": f"n{i}", "compute_s": 1.0 + (i % 7), "memory_bytes": 1000} for i in range(n)],
            "edges": [{"src": f"n{i}", "dst": f"n{i + 1}", "transfer_s": 0.01, "bytes": 100} for i in range(n - 1)]}))
    return files


def rows(f: dict[str, Path]) -> tuple[list, list]:
    """(largest accepted, refused): (label, argv, timeout seconds)."""
    accepted = [
        ("graph gpt --set layers=10000 (the layer bound)", ["graph", "gpt", "--set", "layers=10000"], 300),
        ("graph gpt --set layers=2000", ["graph", "gpt", "--set", "layers=2000"], 120),
        ("partition chain1024 --stages 256", ["partition", str(f["chain1024"]), "--stages", "256"], 300),
        ("partition chain4096 --stages 64", ["partition", str(f["chain4096"]), "--stages", "64"], 300),
        ("partition chain1024 --stages 8 gpipe --microbatches 65536 (the bound)",
         ["partition", str(f["chain1024"]), "--stages", "8", "--objective", "gpipe", "--microbatches", "65536"], 300),
        ("partition instance --stages 4096 --at-most (stage bound)",
         ["partition", str(f["instance"]), "--stages", "4096", "--at-most"], 120),
        ("run mtf-ffn --mesh data:512 --steps 1 (512 simulated devices)",
         ["run", "mtf-ffn", "--mesh", "data:512", "--steps", "1"], 600),
        ("search gpt --mesh data:1048576 (the device bound, 2**20)",
         ["search", "gpt", "--mesh", "data:1048576", "--top", "1"], 600),
    ]
    refused = [
        ("run PLAN whose model has a dim of 2**40", ["run", str(f["plan_huge_dim"]), "--steps", "2"]),
        ("run PLAN whose step time is a string", ["run", str(f["plan_step_str"]), "--steps", "2"]),
        ("export PLAN moved from data:2 to data:4", ["export", str(f["plan_mesh_moved"]), "--format", "specs"]),
        ("export PLAN with optimal: \"yes\"", ["export", str(f["plan_optimal_str"]), "--format", "specs"]),
        ("run PLAN --seed -1", ["run", str(f["plan"]), "--seed", "-1"]),
        ("run PLAN --steps 10**12", ["run", str(f["plan"]), "--steps", "1000000000000"]),
        ("partition INSTANCE with a list as sourceId", ["partition", str(f["instance_list_id"])]),
        ("partition INSTANCE with supportedOnFpga \"false\"", ["partition", str(f["instance_string_flag"])]),
        ("partition --stages 10**9", ["partition", str(f["instance"]), "--stages", "1000000000"]),
        ("partition --stages 10**9 --at-most", ["partition", str(f["instance"]), "--stages", "1000000000", "--at-most"]),
        ("partition --stages 10**9 --objective gpipe",
         ["partition", str(f["instance"]), "--stages", "1000000000", "--objective", "gpipe"]),
        ("partition --microbatches 10**9",
         ["partition", str(f["chain1024"]), "--stages", "2", "--objective", "gpipe", "--microbatches", "1000000000"]),
        ("run mtf-ffn --mesh data:1000000", ["run", "mtf-ffn", "--mesh", "data:1000000"]),
        ("calibrate --mesh data:1000000 --quick", ["calibrate", "--mesh", "data:1000000", "--quick", "--out", "/tmp/never-written.json"]),
        ("graph gpt --set layers=20000", ["graph", "gpt", "--set", "layers=20000"]),
        ("run nope.json --steps 2", ["run", "nope.json", "--steps", "2"]),
        ("search gpt --mesh data:2,model:4 --space ops --solver enumerate",
         ["search", "gpt", "--mesh", "data:2,model:4", "--space", "ops", "--solver", "enumerate"]),
        ("search gpt --top 0", ["search", "gpt", "--mesh", "data:2", "--top", "0"]),
    ]
    return accepted, [(label, argv, 60) for label, argv in refused]


TIMED = ["search", "gpt", "--set", "preset=gpt3-175b", "--mesh", "data:16,fsdp:8,model:8", "--hardware", "tpu-v4"]
"""The search of the time-limit and Ctrl-C rows: GPT-3 175B on 1024 TPU v4 chips, which takes longer than
20 s unbounded."""
TIME_LIMITS = (5, 20)
INTERRUPTS = (0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.5, 4.0, 8.0)
"""When the Ctrl-C rows interrupt the search (seconds after the process starts): while the interpreter and the
modules start, while the model is built, during each phase of the search."""


def timed_rows(floor: float) -> list[str]:
    """The ``--time-limit`` rows (exit 0 within T + 10% + the start-up floor + 1 s) and the Ctrl-C rows (exit
    130, the last stderr line "layoutsearch: interrupted", no traceback). A Ctrl-C while the interpreter itself
    starts (``python -c pass``: site packages, before any code of the program runs) meets Python's own handler:
    those rows are marked ``pre`` and not counted."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.perf_counter() - start
    out = [f"# the interpreter's own start-up (`python -c pass`): {interpreter:.3f} s"]
    print(out[0], flush=True)
    for t in TIME_LIMITS:
        m = measure([*TIMED, "--time-limit", str(t)], 10 * t + 60)
        allowed = t * 1.1 + 1 + floor
        ok = m["code"] == 0 and m["wall_s"] <= allowed and not m["traceback"]
        out.append(f"{'ok  ' if ok else 'FAIL'}{'search gpt3-175b 1024 tpu-v4 --time-limit ' + str(t):<66} exit "
                   f"{m['code']!s:>7}  {m['wall_s']:7.2f} s  {m['rss'] / 2**20:7.0f} MiB  (allowed {allowed:.2f} s)")
        print(out[-1], flush=True)
    for at in INTERRUPTS:
        m = measure(TIMED, 120, interrupt=at)
        ok = m["code"] == 130 and m["last"] == "layoutsearch: interrupted" and not m["traceback"]
        verdict = "ok  " if ok else "pre " if at < interpreter else "FAIL"
        out.append(f"{verdict}{f'search gpt3-175b, Ctrl-C at {at:.2f} s':<66} exit "
                   f"{m['code']!s:>7}  {m['wall_s']:7.2f} s  {m['rss'] / 2**20:7.0f} MiB  {m['stderr_lines']:3d}  "
                   f"{m['last'][:110]}")
        print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the tables to this file")
    ap.add_argument("--only", choices=["accepted", "refused", "timed"], help="one table only")
    args = ap.parse_args()
    floor = measure(["--version"], 60)["wall_s"]  # the interpreter and the CLI's own start-up
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], check=True, capture_output=True)
    jax_floor = time.perf_counter() - start  # what `run` and `calibrate` need before they can ask for devices
    lines = [f"# command: .venv/bin/python bench/bench_limits.py   ({datetime.date.today()}, {cpu_name()}, "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
             f"{os.getloadavg()[0]:.2f} at start)",
             f"# start-up floor (`layoutsearch --version`): {floor:.2f} s; importing JAX and starting its CPU "
             f"backend: {jax_floor:.2f} s more"]
    print(*lines, sep="\n", flush=True)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        accepted, refused = rows(inputs(Path(tmp)))
        tables = {"accepted": ("largest accepted", accepted), "refused": ("refused", refused)}
        for kind, (title, table) in tables.items():
            if args.only not in (None, kind):
                continue
            lines.append(f"\n## {title}: exit, wall s, peak RSS, stderr lines, the last stderr line")
            print(lines[-1], flush=True)
            for label, argv, timeout in table:
                m = measure(argv, timeout)
                verdict = ""
                if kind == "refused":
                    allowed = floor + 2 + (jax_floor if argv[0] in ("run", "calibrate") else 0)
                    ok = m["code"] == 2 and m["stderr_lines"] == 1 and m["wall_s"] <= allowed and m["rss"] < GiB
                    verdict = "ok  " if ok else "FAIL"
                    failures += not ok
                lines.append(f"{verdict}{label:<66} exit {m['code']!s:>7}  {m['wall_s']:7.2f} s  "
                             f"{m['rss'] / 2**20:7.0f} MiB  {m['stderr_lines']:3d}  {m['last'][:110]}")
                print(lines[-1], flush=True)
    if args.only in (None, "timed"):
        lines.append("\n## time limits and Ctrl-C: exit, wall s, peak RSS (stderr lines, the last stderr line)")
        print(lines[-1], flush=True)
        timed = timed_rows(floor)
        lines += timed
        failures += sum(r.startswith("FAIL") for r in timed)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
