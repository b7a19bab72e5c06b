"""Random layouts of every zoo model: predicted collective bytes and FLOPs against the compiled program.

    .venv/bin/python bench/bench_xla_property.py --n 300 --seed 0          # ~1 s per layout on 2 cores
    .venv/bin/python bench/bench_xla_property.py --n 40 --models gpt,moe --json out.json

Draws ``--n`` layouts with ``--seed`` (:func:`layoutsearch.validate.draw_layouts`: the models of
``PROPERTY_MODELS`` in turn, meshes of 1-3 axes on 8 simulated CPU devices, random rules over the model's dims,
SGD or Adam, float32), compiles each training step with XLA:CPU and compares, row by row,
:func:`layoutsearch.validate.validate`'s predicted and compiled collective payload bytes per (kind, mesh axes)
(within ``BYTES_RTOL``) and FLOPs per device of the program without fusion (within ``FLOPS_RTOL``). Prints every
disagreement with the layout that produced it (and a ``layoutsearch validate`` command to see it), its class
(:func:`layoutsearch.validate.classify`), then the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="layouts to draw (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", default="free", choices=("free", "uniform"),
                    help="free: any rules (default); uniform: each mesh axis in one rule, no resharding")
    ap.add_argument("--models", help="comma-separated PROPERTY_MODELS names (default: all)")
    ap.add_argument("--json", metavar="FILE", help="also write every disagreement as JSON")
    ap.add_argument("--all", action="store_true", help="print every layout, not only those that disagree")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from layoutsearch.validate import check_layout, classify, draw_layouts

    drawn = draw_layouts(args.n, args.seed, args.models.split(",") if args.models else None, args.kind)
    t0 = time.perf_counter()
    agree, records, classes, by_model = 0, [], Counter(), Counter()
    for i, d in enumerate(drawn):
        _, bad = check_layout(d)
        if not bad:
            agree += 1
            if args.all:
                print(f"[{i}] agrees: {d}")
            continue
        by_model[d.model] += 1
        cls = classify(d, bad)
        classes[cls] += 1
        print(f"[{i}] {d}\n    class: {cls}\n    {d.command()}")
        for x in bad:
            print(f"    {x.what}: predicted {x.predicted:.0f}, compiled {x.compiled:.0f}")
        for w in bad[0].xla_warnings[:2]:
            print(f"    XLA: {w}")
        records.append({"index": i, "model": d.model, "mesh": d.mesh, "rules": d.rules, "optimizer": d.optimizer,
                        "class": cls, "rows": [{"what": x.what, "predicted": x.predicted, "compiled": x.compiled}
                                               for x in bad], "xla_warnings": list(bad[0].xla_warnings)})
        sys.stdout.flush()
    dt = time.perf_counter() - t0
    print(f"\n{len(drawn)} {args.kind} layouts (seed {args.seed}): {agree} agree, {len(drawn) - agree} disagree ({dt:.0f} s)")
    for cls, k in classes.most_common():
        print(f"  {k:4d}  {cls}")
    if by_model:
        print("  by model: " + ", ".join(f"{m} {k}" for m, k in by_model.most_common()))
    if args.json:
        Path(args.json).write_text(json.dumps({"n": len(drawn), "seed": args.seed, "agree": agree,
                                               "disagreements": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
