"""Prediction truth measured three ways and reported together: published runs, XLA's programs, devices.

    .venv/bin/python bench/bench_truth.py --out bench/RESULTS_truth.txt   # about 4 minutes on 2 cores
    .venv/bin/python bench/bench_truth.py --n 300                         # a larger sample of layouts

1. **Published runs** (``layoutsearch.published``, the table of ``bench_published.py``): per source the signed
   mean error over the rows without a known deviation (a source predicted too fast on average has a negative
   one: the goal is none beyond 5% either way), the mean absolute and the worst error; whether every run fits.
2. **XLA agreement** (``bench_xla_property.py``, a fresh process on 8 simulated CPU devices): ``--n`` uniform
   layouts (nothing resharded: each must agree) and ``--n`` free ones, predicted collective bytes and FLOPs
   against the program XLA:CPU compiles, the disagreements by class.
3. **Devices**: on a GPU or TPU, ``bench_device.py``'s configurations measured now (predicted against
   measured step time); without one, the step times recorded in ``bench/device_steps.json`` (measured on an
   accelerator on the date given, by that day's executor) against today's prediction of the same
   configuration on the same preset, labelled as such.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

RECORDED = ROOT / "bench" / "device_steps.json"


def published() -> list[str]:
    """Section 1: the summary lines of ``bench_published.py``."""
    from bench_published import summary

    from layoutsearch.published import RUNS, predict

    return summary([predict(r) for r in RUNS])


def xla_agreement(n: int, seed: int) -> list[str]:
    """Section 2: ``n`` uniform and ``n`` free layouts through ``bench_xla_property.py``, one process each."""
    out = []
    for kind in ("uniform", "free"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "property.json"
            proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_xla_property.py"), "--n", str(n),
                                   "--seed", str(seed), "--kind", kind, "--json", str(path)],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                out.append(f"{kind} layouts: bench_xla_property.py failed: {proc.stderr.strip()[-300:]}")
                continue
            d = json.loads(path.read_text())
        classes: dict[str, int] = {}
        for r in d["disagreements"]:
            classes[r["class"]] = classes.get(r["class"], 0) + 1
        line = f"{kind} layouts (seed {seed}): {d['n']} drawn, {d['agree']} agree, {d['n'] - d['agree']} disagree"
        out.append(line + "".join(f"\n    {k:4d}  {c}" for c, k in sorted(classes.items(), key=lambda x: -x[1])))
    return out


def accelerator() -> str | None:
    """The JAX backend of this machine when it is not the CPU (a fresh process: the XLA section pins the CPU)."""
    proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                          capture_output=True, text=True)
    backend = proc.stdout.strip()
    return backend if proc.returncode == 0 and backend not in ("", "cpu") else None


def devices_now(out: Path) -> list[str]:
    """Section 3 on an accelerator: ``bench_device.py`` run now, its rows."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_device.py"), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode or not (out / "device.json").exists():
        return [f"bench_device.py failed: {proc.stderr.strip()[-300:]}"]
    d = json.loads((out / "device.json").read_text())
    m = d["meta"]
    return [f"measured now on {m['device_kind']} x{m['devices']}, preset {m['hardware']}:"] + [
        _row(r["config"], r["measured_step_s"], r["predicted_step_s"]) for r in d["rows"] if "measured_step_s" in r]


def devices_recorded() -> list[str]:
    """Section 3 without an accelerator: the recorded measurements against today's predictions."""
    from bench_device import CONFIGS

    from layoutsearch.mesh import hardware

    rec = json.loads(RECORDED.read_text())
    configs = {c.name: c for c in CONFIGS}
    out = [f"no accelerator here: the step times measured on {rec['device']} on {rec['date']} (code {rec['code']}, "
           f"`{rec['command']}`) against today's prediction for preset {rec['preset']}:"]
    hw = hardware(rec["preset"])
    ratios = []
    for r in rec["rows"]:
        cfg = configs[r["config"]]
        graph = cfg.graph(False)
        plan = cfg.price(graph, cfg.layout(rec["devices"]), hw)
        ratios.append(r["measured_step_s"] / plan.step_s)
        out.append(_row(r["config"], r["measured_step_s"], plan.step_s, r["predicted_step_s"]))
    out.append(f"measured / predicted today: {min(ratios):.2f}-{max(ratios):.2f}, mean {sum(ratios) / len(ratios):.2f}")
    return out


def _row(config: str, measured: float, predicted: float, then: float | None = None) -> str:
    was = f"   (predicted {then * 1e3:7.1f} ms on that day)" if then is not None else ""
    return (f"  {config:24} measured {measured * 1e3:7.1f} ms, predicted {predicted * 1e3:7.1f} ms, "
            f"measured / predicted {measured / predicted:.2f}{was}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="layouts of each kind for the XLA agreement (default 40)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", metavar="FILE", help="also write the report to this file")
    args = ap.parse_args()
    lines = [f"# python bench/bench_truth.py --n {args.n} --seed {args.seed}   ({datetime.date.today()}, {platform.machine()}, "
             f"Python {platform.python_version()})", "", "## 1. published runs (bench/bench_published.py: the rows in bench/RESULTS_published.txt)", *published(),
             "", "## 2. XLA:CPU agreement (bench/bench_xla_property.py)", *xla_agreement(args.n, args.seed), "",
             "## 3. devices (bench/bench_device.py)"]
    backend = accelerator()
    if backend:
        with tempfile.TemporaryDirectory() as tmp:
            lines += devices_now(Path(tmp))
    else:
        lines += devices_recorded()
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
