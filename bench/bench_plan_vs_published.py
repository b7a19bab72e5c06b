"""The search against the published layouts (``layoutsearch.published``): on each published run's mesh,
hardware, batch and memory, the plan the search finds beside the layout the run used, both priced by the
same cost model.

    .venv/bin/python bench/bench_plan_vs_published.py              # every row (minutes)
    .venv/bin/python bench/bench_plan_vs_published.py --only 'maxtext-16b*' --json out.json

Per row: the published layout's predicted step, MFU and peak memory (``published.predict``), the searched
plan's (``published.search_published``: layout, remat and gradient accumulation searched; precision,
attention kernel and overlap held as the run's framework implements them; pipelined runs keep their stage
count, schedule and micro-batches), their ratio, and the search time. The search must never be slower and
must fit (``tests/test_published_runs.py`` checks the rows it runs).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from layoutsearch.mesh import hardware  # noqa: E402
from layoutsearch.published import RUNS, predict, search_published  # noqa: E402


def compare(run) -> dict:
    """One row: the published layout and the searched plan, priced alike."""
    pub = predict(run)
    t0 = time.perf_counter()
    plan = search_published(run)
    took = time.perf_counter() - t0
    hw = hardware(run.hardware)
    devices = plan.layout.mesh.size
    c = plan.chosen
    return {"run": run.name, "published_layout": run.layout, "published_step_s": pub["predicted_step_s"],
            "published_mfu": pub["mfu"], "published_memory_bytes": pub["memory_bytes"],
            "plan_layout": c.rules_text(), "plan_remat": c.remat, "plan_microbatches": c.microbatches,
            "plan_stage_axis": c.stage_axis, "plan_step_s": c.step_s,
            "plan_mfu": c.report.model_flops / (devices * hw.peak_flops * c.step_s), "plan_memory_bytes": c.memory_bytes,
            "plan_fits": c.fits, "usable_bytes": hw.usable_bytes, "ratio": c.step_s / pub["predicted_step_s"],
            "optimal": plan.optimal, "search_s": took}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="GLOB", help="rows whose name matches, e.g. 'megatron-*'")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    runs = [r for r in RUNS if args.only is None or fnmatch.fnmatch(r.name, args.only)]
    print(f"{'run':<18} {'published s':>11} {'MFU':>6} {'mem GiB':>7} | {'plan s':>8} {'MFU':>6} {'mem GiB':>7} "
          f"{'plan/pub':>8} {'search s':>8}  plan")
    rows = []
    for run in runs:
        r = compare(run)
        rows.append(r)
        what = f"{r['plan_layout'] or 'replicated'}; remat {r['plan_remat']}" + (
            f"; {r['plan_microbatches']} micro-batches" if r["plan_microbatches"] > 1 else "") + (
            f"; stages over {r['plan_stage_axis']}" if r["plan_stage_axis"] else "")
        print(f"{r['run']:<18} {r['published_step_s']:>11.2f} {r['published_mfu']:>6.1%} "
              f"{r['published_memory_bytes'] / 2**30:>7.1f} | {r['plan_step_s']:>8.2f} {r['plan_mfu']:>6.1%} "
              f"{r['plan_memory_bytes'] / 2**30:>7.1f} {r['ratio']:>8.3f} {r['search_s']:>8.1f}  {what}", flush=True)
    worst = max(r["ratio"] for r in rows)
    print(f"{len(rows)} rows: plan/published step at most {worst:.3f}, mean {sum(r['ratio'] for r in rows) / len(rows):.3f}; "
          f"every plan fits: {all(r['plan_fits'] for r in rows)}; search time max "
          f"{max(r['search_s'] for r in rows):.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
