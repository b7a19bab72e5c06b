"""Benchmark: ``estimate`` time against the number of ops, 1k to 250k, blocks tagged or not.

    .venv/bin/python bench/bench_scaling.py            # 1k ... 250k ops (~35 min on 2 cores, ~4 GB at 250k ops)
    .venv/bin/python bench/bench_scaling.py --quick    # 1k ... 32k ops (~3 min)
    .venv/bin/python bench/bench_scaling.py --max-ops 8000 --out /tmp/scaling.txt
    .venv/bin/python bench/bench_scaling.py --search   # search instead of estimate, 1k ... 8k ops (~40 min)

Models (``ops``: ops of the forward graph given to ``estimate``; ``step ops``:
ops of its training step, forward + backward + Adam, which is what is priced):

* ``gpt``: the zoo GPT at small widths (d_model 64, 4 heads, seq 16, batch 8,
  vocab 128) with as many layers as give the number of ops, each layer in its
  block ``layer.<i>`` (what the zoo builds);
* ``gpt-untagged``: the same graph with every op's block tag removed
  (``dataclasses.replace(op, block=None)``): no repeats to share, every op
  priced on its own, no remat;
* ``chain-untagged``: a chain of identical untagged layers ``x -> tanh(x · w1)
  · w2`` (one pair of parameters per layer, no block tags).

Per row: ``cold``, the first ``estimate(graph, layout, "h100")`` of a new
graph object (the training-graph derivation, the layout-independent analyses
— repeats, fusion plan, lifetimes — and the pricing; layout
``batch:data,d_ff:model,heads:model`` on ``data:2,model:4``, flash attention,
overlap schedule); ``warm``, a second ``estimate`` of the same graph with
another layout object (``batch:data,d_model:model``; what a solver pays per
priced layout), each as wall-clock and CPU (process) seconds, and the warm CPU
time per step op. ``x2`` is the cold CPU time over the row with half the ops
(2.0: linear); ``full gc`` the part of the cold CPU time spent in CPython's
full (generation 2) garbage collections, which traverse the whole heap and
grow faster than the heap; ``x2-gc`` the ratio without them. Wall times vary
with other jobs on the machine (CPU times less).

``--search`` times ``search(graph, "data:2,model:4", hardware="h100")`` (the default search: rules space,
memory limit, remat auto, accumulation when the limit binds) on a new graph object instead, CPU seconds,
with ``x2`` as above, ``refined`` (rule sets priced by the full cost model, overlap included, summed over
the remat policies searched: how many depends on how close the candidates' costs come, not on the size)
and the CPU time per refined plan and step op (constant: linear). Results go to
``bench/RESULTS_scaling_search.txt``.

Writes a results file (default ``bench/RESULTS_scaling.txt``) with the date,
the machine and the command; any text after a line ``# notes`` in an existing
results file is kept (hand-written notes, e.g. the numbers before a fix).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import platform
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Self

ROOT = Path(__file__).resolve().parents[1]
try:  # the installed package (or one on PYTHONPATH), else this checkout's
    import layoutsearch  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT))

import layoutsearch as ls
from layoutsearch import zoo
from layoutsearch.costmodel import step
from layoutsearch.ir import GraphBuilder
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh
from cpuinfo import cpu_name  # bench/cpuinfo.py: run as `python bench/<script>.py`

SIZES = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 250_000)
QUICK_MAX = 32_000
SEARCH_MAX = 8_000
MESH = "data:2,model:4"
GPT_OPS_PER_LAYER, GPT_OTHER_OPS = 26, 8  # ops of the small zoo GPT: 26 per layer + 8
CHAIN_OPS_PER_LAYER = 3


def untagged(g: Graph) -> Graph:
    """``g`` with every op's block tag removed."""
    return Graph(g.name, g.tensors.values(), [dataclasses.replace(op, block=None) for op in g.ops], loss=g.loss,
                 meta=g.meta)


def gpt(ops: int, tagged: bool = True) -> Graph:
    """The small zoo GPT with about ``ops`` forward ops."""
    layers = max(1, round((ops - GPT_OTHER_OPS) / GPT_OPS_PER_LAYER))
    g = zoo.gpt(layers=layers, d_model=64, heads=4, seq=16, batch=8, vocab=128)
    return g if tagged else untagged(g)


def chain(ops: int) -> Graph:
    """A chain of identical untagged layers ``tanh(x · w1) · w2`` with about ``ops`` forward ops."""
    b = GraphBuilder("chain")
    batch, d, e = b.dim("batch", 8), b.dim("d_model", 64), b.dim("d_ff", 64)
    h = b.input("x", [batch, d])
    for i in range(max(1, (ops - 2) // CHAIN_OPS_PER_LAYER)):
        u = b.unary("tanh", b.einsum([h, b.parameter(f"w{i}a", [d, e])], [batch, e]))
        h = b.einsum([u, b.parameter(f"w{i}b", [e, d])], [batch, d])
    return b.build(b.reduce(b.square(h), [], fn="mean"))


MODELS = {
    "gpt": (lambda n: gpt(n, True), ("batch:data,d_ff:model,heads:model", "batch:data,d_model:model")),
    "gpt-untagged": (lambda n: gpt(n, False), ("batch:data,d_ff:model,heads:model", "batch:data,d_model:model")),
    "chain-untagged": (chain, ("batch:data,d_ff:model", "batch:data,d_model:model")),
}


class _FullGC:
    """CPU seconds spent in CPython's full (generation 2) garbage collections while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start

    def __enter__(self) -> Self:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def measure(model: str, ops: int) -> dict[str, float]:
    make, (first, second) = MODELS[model]
    mesh = Mesh.parse(MESH)
    g = make(ops)
    gc.collect()
    with _FullGC() as full_gc:
        t0, c0 = time.perf_counter(), time.process_time()
        r = ls.estimate(g, Layout.from_rules(mesh, first), "h100")
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    ls.estimate(g, Layout.from_rules(mesh, second), "h100")
    warm, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
    step_ops = len(step.training_step(g).ops)
    out = {"ops": len(g.ops), "step_ops": step_ops, "cold": cold, "cold_cpu": cold_cpu, "cold_gc": full_gc.seconds,
           "warm": warm, "warm_cpu": warm_cpu, "step_s": r.step_s}
    del g, r
    gc.collect()
    return out


def measure_search(model: str, ops: int) -> dict[str, float]:
    g = MODELS[model][0](ops)
    gc.collect()
    c0 = time.process_time()
    plan = ls.search(g, MESH, hardware="h100", baselines=False)
    cpu = time.process_time() - c0
    refined = sum(p.get("refined", 0) for p in plan.problem.get("pruning", {}).values())
    out = {"ops": len(g.ops), "step_ops": len(step.training_step(g).ops), "cpu": cpu, "refined": refined}
    del g, plan
    gc.collect()
    return out


def table_rows(header: str, models: list[str], sizes: list[int],
               row: Callable[[str, dict[str, float], dict[str, float] | None], str],
               measure_one: Callable[[str, int], dict[str, float]]) -> list[str]:
    """The header and a row per model and size (``row(model, result, previous size's result)``), each
    printed as it is measured."""
    lines = [header]
    print(header, flush=True)
    for m in models:
        prev: dict[str, float] | None = None
        for n in sizes:
            r = measure_one(m, n)
            lines.append(row(m, r, prev))
            print(lines[-1], flush=True)
            prev = r
    return lines


def search_rows(models: list[str], sizes: list[int]) -> list[str]:
    def row(m: str, r: dict[str, float], prev: dict[str, float] | None) -> str:
        ratio = f"{r['cpu'] / prev['cpu']:5.2f}" if prev is not None else "    -"
        return (f"{m:<15} {r['ops']:>8,} {r['step_ops']:>10,} {r['cpu']:>8.2f} {ratio} {r['refined']:>8} "
                f"{1e6 * r['cpu'] / (max(1, r['refined']) * r['step_ops']):>27.2f}")

    return table_rows(f"{'model':<15} {'ops':>8} {'step ops':>10} {'cpu (s)':>8} {'x2':>5} {'refined':>8} "
                      f"{'cpu us/(refined x step op)':>27}", models, sizes, row, measure_search)


def write_results(path: Path, lines: list[str]) -> None:
    """``lines`` to ``path``, keeping any text after a ``# notes`` line of the file there."""
    notes = ""
    if path.exists():
        old = path.read_text()
        i = old.find("\n# notes")
        if i >= 0:
            notes = old[i:]
    path.write_text("\n".join(lines) + "\n" + notes)
    print(f"wrote {path}")


def machine() -> str:
    cpu = cpu_name()
    return f"{platform.machine()}, {os.cpu_count()} CPUs (nproc), {cpu}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes up to {QUICK_MAX:,} ops")
    ap.add_argument("--search", action="store_true", help=f"time search instead of estimate (up to {SEARCH_MAX:,} "
                    "ops unless --max-ops)")
    ap.add_argument("--max-ops", type=int, default=None, help="largest size (default 250,000; --quick 32,000)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--out", default=None, help="results file (default bench/RESULTS_scaling.txt, with --search "
                    "bench/RESULTS_scaling_search.txt)")
    args = ap.parse_args(argv)
    top = args.max_ops or (QUICK_MAX if args.quick else SEARCH_MAX if args.search else SIZES[-1])
    out = Path(args.out or ROOT / "bench" / ("RESULTS_scaling_search.txt" if args.search else "RESULTS_scaling.txt"))
    sizes = [n for n in SIZES if n <= top]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    command = "python bench/bench_scaling.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    head = [f"# {command}, {datetime.date.today().isoformat()}", f"machine: {machine()}"]
    if args.search:
        head += [(f"search(graph, {MESH!r}, hardware='h100') on a new graph object, CPU seconds; x2: over the row "
                  "above's; refined: rule sets priced with overlap (all remat policies)"), ""]
        print("\n".join(head), flush=True)
        write_results(out, head + search_rows(models, sizes))
    else:
        head += [(f"estimate(graph, layout, 'h100') on {MESH}; cold: first call on a new graph object "
                  "(training-graph derivation included), warm: second call, another layout"),
                 ("full gc: CPU seconds of the cold call in CPython's full garbage collections; x2: cold cpu over "
                  "the row above's; x2-gc: the same without the full collections"), ""]
        print("\n".join(head), flush=True)
        write_results(out, head + estimate_rows(models, sizes))
    return 0


def estimate_rows(models: list[str], sizes: list[int]) -> list[str]:
    def row(m: str, r: dict[str, float], prev: dict[str, float] | None) -> str:
        ratio, ratio_gc = "    -", "    -"
        if prev is not None:
            ratio = f"{r['cold_cpu'] / prev['cold_cpu']:5.2f}"
            ratio_gc = f"{(r['cold_cpu'] - r['cold_gc']) / (prev['cold_cpu'] - prev['cold_gc']):5.2f}"
        return (f"{m:<15} {r['ops']:>8,} {r['step_ops']:>10,} {r['cold']:>9.2f} {r['cold_cpu']:>8.2f} "
                f"{r['cold_gc']:>8.2f} {ratio} {ratio_gc} {r['warm']:>9.2f} {r['warm_cpu']:>8.2f} "
                f"{1e6 * r['warm_cpu'] / r['step_ops']:>15.1f}")

    return table_rows(f"{'model':<15} {'ops':>8} {'step ops':>10} {'cold (s)':>9} {'cpu (s)':>8} {'full gc':>8} "
                      f"{'x2':>5} {'x2-gc':>5} {'warm (s)':>9} {'cpu (s)':>8} {'cpu us/step op':>15}", models, sizes,
                      row, measure)


if __name__ == "__main__":
    raise SystemExit(main())
