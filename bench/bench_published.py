"""Predicted against published step times of large training runs (``layoutsearch.published``).

    .venv/bin/python bench/bench_published.py            # the table (about 30 s)
    .venv/bin/python bench/bench_published.py --json out.json

Prints one row per published run: published and predicted step time, the error, the predicted MFU
(model FLOPs, recomputation excluded, over the devices' bf16 peak) and the predicted peak memory against
the device's HBM; then the mean and largest absolute error, over all rows and over the rows not listed as
known deviations in ``tests/test_published_runs.py``, and per source (the rows without a known deviation) the
signed mean error: a source predicted too fast on average has a negative one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from layoutsearch.published import RUNS, predict  # noqa: E402


def table(rows: list[dict]) -> list[str]:
    """One line per published run (its prediction ``rows``, from :func:`layoutsearch.published.predict`)."""
    from test_published_runs import _known

    out = [f"{'run':<20} {'published s':>11} {'predicted s':>11} {'error':>7} {'MFU':>6} {'memory / usable':>20}  known"]
    for p in rows:
        known = _known(p["run"])
        mem = f"{p['memory_bytes'] / 2**30:.1f} / {p['usable_bytes'] / 2**30:.1f} GiB"
        out.append(f"{p['run']:<20} {p['published_step_s']:>11.2f} {p['predicted_step_s']:>11.2f} {p['error']:>+7.1%} "
                   f"{p['mfu']:>6.1%} {mem:>20}  {known[2] if known else ''}")
    return out


def summary(rows: list[dict]) -> list[str]:
    """The mean and largest absolute errors, over all ``rows`` and over those without a known deviation, and per
    source (rows without a known deviation) its signed mean error: a source predicted too fast has a negative
    one."""
    from test_published_runs import KNOWN_DEVIATIONS, _known

    errors = [abs(p["error"]) for p in rows]
    modelled = [abs(p["error"]) for p in rows if _known(p["run"]) is None]
    out = [f"all {len(errors)} rows: mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}; "
           f"{len(modelled)} rows without a known deviation ({len(KNOWN_DEVIATIONS)} listed): mean "
           f"{sum(modelled) / len(modelled):.1%}, max {max(modelled):.1%}; every run fits: "
           f"{all(p['fits'] for p in rows)}"]
    for source in dict.fromkeys(p["source"] for p in rows):
        mine = [p["error"] for p in rows if p["source"] == source and _known(p["run"]) is None]
        if mine:
            out.append(f"  {source}: {len(mine)} rows, signed mean {sum(mine) / len(mine):+.1%}, mean |error| "
                       f"{sum(map(abs, mine)) / len(mine):.1%}, worst {max(mine, key=abs):+.1%}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = [predict(r) for r in RUNS]
    totals = summary(rows)
    totals[0] += f" ({time.perf_counter() - t0:.1f} s)"
    print("\n".join(table(rows) + totals))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
