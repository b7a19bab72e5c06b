"""Benchmark of the pipeline-stage partitioner (``layoutsearch.solvers.partition``).

Two questions, one table each:

1. Does the exact contiguous DP stay practical on operator DAGs of hundreds to a few thousand nodes?
   Transformer-like DAGs (per layer: layer norm, ``width`` parallel branches of ``branch`` nodes, merge,
   projection, residual add, MLP, residual add; the residual skips make the DAG more than a chain), time
   against node count and the number of down-closed sets (ideals), for K up to 16.
2. For non-uniform layers, how much does the optimal partition beat an equal-layer split?

Run ``python bench/bench_partition.py`` (``--quick`` for a smaller sweep, ``--write`` to rewrite
``bench/RESULTS_partition.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

from layoutsearch.costdag import CostDAG, Edge, Node
from layoutsearch.solvers.partition import count_ideals, equal_split, partition
from cpuinfo import cpu_name  # bench/cpuinfo.py: run as `python bench/<script>.py`

RESULTS = Path(__file__).with_name("RESULTS_partition.md")
MiB = 2**20


def transformer_dag(layers: int, width: int = 3, branch: int = 2, scales: list[float] | None = None,
                    seed: int = 0, name: str | None = None) -> CostDAG:
    """A transformer-like operator DAG: embed, ``layers`` blocks, head. Per block: ln1 -> ``width``
    parallel chains of ``branch`` ops -> merge -> proj -> add(+residual) -> ln2 -> ff1 -> act -> ff2 ->
    add(+residual). ``scales[i]`` multiplies block ``i``'s compute, memory and activations. Times in ms."""
    rng = random.Random(seed)
    scales = scales or [1.0] * layers
    nodes: list[Node] = []
    edges: list[Edge] = []
    ms = 1e-3

    def node(name: str, compute: float, params: int, act: int, layer: int) -> str:
        jitter = 1 + 0.1 * (rng.random() - 0.5)
        nodes.append(Node(name, compute * ms * jitter, memory_bytes=4 * params, param_bytes=params,
                          activation_bytes=act, layer=layer))
        return name

    def edge(a: str, b: str, size: float) -> None:
        edges.append(Edge(a, b, transfer_s=0.25 * size * ms, bytes=int(size * MiB)))

    x = node("embed", 2.0, 50 * MiB, 4 * MiB, 0)  # equal splits count embed and head in the first and last block
    for i in range(layers):
        s, p = scales[i], f"l{i}."
        ln1 = node(p + "ln1", 0.1 * s, 0, int(s * MiB), i)
        edge(x, ln1, s)
        ends = []
        for b in range(width):
            prev = ln1
            for j in range(branch):
                cur = node(f"{p}br{b}.{j}", 2.0 * s / (width * branch), int(4 * s * MiB / width), int(s * MiB), i)
                edge(prev, cur, s if j == 0 else s / width)
                prev = cur
            ends.append(prev)
        merge = node(p + "merge", 0.2 * s, 0, int(s * MiB), i)
        for e in ends:
            edge(e, merge, s / width)
        proj = node(p + "proj", 1.0 * s, int(4 * s * MiB), int(s * MiB), i)
        edge(merge, proj, s)
        add1 = node(p + "add1", 0.05 * s, 0, int(s * MiB), i)
        edge(proj, add1, s)
        edge(x, add1, s)
        ln2 = node(p + "ln2", 0.1 * s, 0, int(s * MiB), i)
        edge(add1, ln2, s)
        ff1 = node(p + "ff1", 4.0 * s, int(16 * s * MiB), int(4 * s * MiB), i)
        edge(ln2, ff1, s)
        act = node(p + "act", 0.3 * s, 0, int(4 * s * MiB), i)
        edge(ff1, act, 4 * s)
        ff2 = node(p + "ff2", 4.0 * s, int(16 * s * MiB), int(s * MiB), i)
        edge(act, ff2, 4 * s)
        add2 = node(p + "add2", 0.05 * s, 0, int(s * MiB), i)
        edge(ff2, add2, s)
        edge(add1, add2, s)
        x = add2
    head = node("head", 6.0, 50 * MiB, 16 * MiB, layers - 1)
    edge(x, head, 1.0)
    loss = node("loss", 0.5, 0, MiB, layers - 1)
    edge(head, loss, 16.0)
    return CostDAG(tuple(nodes), tuple(edges), name=name or f"transformer-L{layers}-w{width}")


def two_tower_dag(layers: int, seed: int = 0) -> CostDAG:
    """Two independent towers (say vision and text, the first twice as heavy) of ``layers`` blocks each,
    listed interleaved as a tracer running them side by side would list them, then fusion and head.
    Times in ms; an activation crosses a stage boundary inside a tower in 1 ms."""
    rng = random.Random(seed)
    ms = 1e-3
    nodes, edges = [], []
    for i in range(layers):
        for tower, heavy in (("a", 2.0), ("b", 1.0)):
            for j, part in enumerate(("attn", "mlp")):
                name = f"{tower}{i}.{part}"
                nodes.append(Node(name, heavy * (1 + j) * ms * (1 + 0.1 * rng.random()), layer=i))
                prev = f"{tower}{i}.attn" if j else (f"{tower}{i - 1}.mlp" if i else None)
                if prev:
                    edges.append(Edge(prev, name, 1.0 * ms))
    nodes += [Node("fusion", 1.0 * ms, layer=layers - 1), Node("head", 2.0 * ms, layer=layers - 1)]
    edges += [Edge(f"a{layers - 1}.mlp", "fusion", 0.25 * ms), Edge(f"b{layers - 1}.mlp", "fusion", 0.25 * ms),
              Edge("fusion", "head", 0.25 * ms)]
    return CostDAG(tuple(nodes), tuple(edges), name=f"two-towers-L{layers}")


def towers(layers: int, stage_counts: list[int]) -> list[dict]:
    dag = two_tower_dag(layers)
    rows = []
    for k in stage_counts:
        t0 = time.perf_counter()
        opt = partition(dag, k, solver="dp")
        rows.append({"nodes": len(dag.nodes), "ideals": opt.info["ideals"], "K": k,
                     "equal_ms": equal_split(dag, k).objective * 1e3, "interval_ms": opt.info["interval_split"] * 1e3,
                     "optimal_ms": opt.objective * 1e3, "dp_s": time.perf_counter() - t0})
        print(_fmt_row(rows[-1], TOWER_COLS), flush=True)
    return rows


TOWER_COLS = [("nodes", "{}"), ("ideals", "{}"), ("K", "{}"), ("equal_ms", "{:.2f}"), ("interval_ms", "{:.2f}"),
              ("optimal_ms", "{:.2f}"), ("dp_s", "{:.2f}")]


def layers_for(nodes: int, width: int, branch: int) -> int:
    return max(1, round((nodes - 3) / (9 + width * branch)))


def scaling(sizes: list[int], widths: list[int], stage_counts: list[int], branch: int) -> list[dict]:
    rows = []
    for width in widths:
        for n in sizes:
            dag = transformer_dag(layers_for(n, width, branch), width, branch)
            t0 = time.perf_counter()
            m = count_ideals(dag, limit=2_000_000)
            t_ideals = time.perf_counter() - t0
            for k in stage_counts:
                t0 = time.perf_counter()
                part = partition(dag, k, solver="dp", max_ideals=2_000_000)
                t_dp = time.perf_counter() - t0
                rows.append({"nodes": len(dag.nodes), "edges": len(dag.edges), "width": width, "ideals": m,
                             "K": k, "pairs": part.info["pairs"], "rounds": part.info["rounds"],
                             "t_ideals": t_ideals, "t_dp": t_dp, "load_ms": part.objective * 1e3})
                print(_fmt_row(rows[-1], SCALING_COLS), flush=True)
    return rows


def non_uniform(layers: int, stage_counts: list[int], microbatches: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    patterns = {
        "uniform": [1.0] * layers,
        "every 4th layer 4x (MoE-like)": [4.0 if i % 4 == 3 else 1.0 for i in range(layers)],
        "every 3rd layer 3x": [3.0 if i % 3 == 2 else 1.0 for i in range(layers)],
        "growing 1x..4x": [1 + 3 * i / max(1, layers - 1) for i in range(layers)],
        "lognormal sigma=0.5": [float(np.exp(rng.gauss(0, 0.5))) for _ in range(layers)],
    }
    rows = []
    for label, scales in patterns.items():
        dag = transformer_dag(layers, 3, 2, scales, seed=seed)
        for k in stage_counts:
            for objective in ("throughput", "gpipe"):
                eq = equal_split(dag, k, objective=objective, microbatches=microbatches)
                opt = partition(dag, k, objective=objective, microbatches=microbatches, solver="dp")
                rows.append({"layers": label, "K": k, "objective": objective, "equal_ms": eq.objective * 1e3,
                             "interval_ms": opt.info["interval_split"] * 1e3, "optimal_ms": opt.objective * 1e3,
                             "ratio": opt.objective / eq.objective, "speedup": eq.objective / opt.objective})
                print(_fmt_row(rows[-1], NONUNIFORM_COLS), flush=True)
    return rows


SCALING_COLS = [("nodes", "{}"), ("edges", "{}"), ("width", "{}"), ("ideals", "{}"), ("K", "{}"),
                ("pairs", "{}"), ("rounds", "{}"), ("t_ideals", "{:.2f}"), ("t_dp", "{:.2f}"),
                ("load_ms", "{:.2f}")]
NONUNIFORM_COLS = [("layers", "{}"), ("K", "{}"), ("objective", "{}"), ("equal_ms", "{:.2f}"),
                   ("interval_ms", "{:.2f}"), ("optimal_ms", "{:.2f}"), ("ratio", "{:.3f}"), ("speedup", "{:.2f}x")]
ILP_COLS = [("nodes", "{}"), ("K", "{}"), ("stages", "{}"), ("method", "{}"), ("seconds", "{:.2f}"),
            ("load_ms", "{:.3f}"), ("optimal", "{}"), ("gap", "{}")]


WIDE_TEXT = """## Wide DAGs: where the DP stops being cheap

The same generator with 6 and 8 parallel branches per block: ideals grow like 3^width per block, and
ideal pairs with K. The ILP (or `max_ideals`, which makes `solver="auto"` switch to it) is the way out.

"""


def ilp_vs_dp(nodes: int, stage_counts: list[int], time_limit: float) -> list[dict]:
    """The same contiguous problem by the DP and both ILP backends; then non-contiguous stages (ILP)."""
    dag = transformer_dag(layers_for(nodes, 3, 2), 3, 2)
    rows = []
    for k in stage_counts:
        for contiguous, solvers in ((True, ("dp", "ilp-ortools", "ilp-pulp")), (False, ("ilp-ortools",))):
            for solver in solvers:
                t0 = time.perf_counter()
                part = partition(dag, k, solver=solver, contiguous=contiguous,
                                 time_limit=None if solver == "dp" else time_limit)
                rows.append({"nodes": len(dag.nodes), "K": k, "stages": "contiguous" if contiguous else "any",
                             "method": solver, "seconds": time.perf_counter() - t0, "load_ms": part.objective * 1e3,
                             "optimal": part.optimal, "gap": "-" if part.gap is None else f"{part.gap:.1%}"})
                print(_fmt_row(rows[-1], ILP_COLS), flush=True)
    return rows


def _fmt_row(row: dict, cols: list) -> str:
    return " | ".join(f.format(row[c]) for c, f in cols)


def _table(rows: list[dict], cols: list) -> str:
    head = "| " + " | ".join(c for c, _ in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    return "\n".join([head, sep] + ["| " + _fmt_row(r, cols) + " |" for r in rows])


def machine() -> str:
    cpu = cpu_name()
    return (f"{cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.system()} {platform.release()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller sweep (seconds)")
    ap.add_argument("--wide", action="store_true", help="add DAGs of width 6 and 8 (minutes)")
    ap.add_argument("--write", action="store_true", help=f"write the tables to {RESULTS.name}")
    args = ap.parse_args(argv)
    if args.quick:
        sizes, widths, ks = [100, 300], [2, 3], [4, 16]
    else:
        sizes, widths, ks = [100, 300, 1000, 2000, 3000], [2, 3, 4], [2, 4, 8, 16]
    print("== exact contiguous DP: time against nodes and ideals (times in s) ==")
    print(" | ".join(c for c, _ in SCALING_COLS))
    scale_rows = scaling(sizes, widths, ks, branch=2)
    wide_rows: list[dict] = []
    if args.wide:
        print("\n== wide DAGs ==")
        wide_rows = scaling([300, 1000], [6], [4, 16], branch=2) + scaling([300], [8], [4, 16], branch=2)
    print("\n== the same problem by the DP and the ILPs (times in s, load in ms) ==")
    print(" | ".join(c for c, _ in ILP_COLS))
    ilp_rows = ilp_vs_dp(100, [4] if args.quick else [4, 8], time_limit=60.0)
    print("\n== two towers listed interleaved: DP over ideals vs intervals of the topological order (ms) ==")
    print(" | ".join(c for c, _ in TOWER_COLS))
    tower_rows = towers(8 if args.quick else 24, [2, 4, 8])
    print("\n== non-uniform layers: optimal (DP) vs equal-layer split, 32 layers, M=8 (times in ms) ==")
    print(" | ".join(c for c, _ in NONUNIFORM_COLS))
    nu_rows = non_uniform(8 if args.quick else 32, [2, 4, 8], microbatches=8, seed=0)
    if args.write:
        RESULTS.write_text(_report(scale_rows, wide_rows, ilp_rows, tower_rows, nu_rows, args))
        print(f"\nwrote {RESULTS}")
    return 0


def _summary(scale_rows: list[dict], wide_rows: list[dict], nu_rows: list[dict]) -> str:
    big = max(scale_rows, key=lambda r: (r["nodes"], r["ideals"], r["K"]))
    slow = max(scale_rows, key=lambda r: r["t_dp"])
    lines = ["## Summary", "",
             (f"* Exact contiguous DP on transformer-like DAGs of width {min(r['width'] for r in scale_rows)}-"
             f"{max(r['width'] for r in scale_rows)} up to {big['nodes']} nodes and K up to "
             f"{max(r['K'] for r in scale_rows)}: slowest run {slow['t_dp']:.2f} s ({slow['nodes']} nodes, "
             f"{slow['ideals']} ideals, K={slow['K']}); time follows the number of priced ideal pairs."),
             ]
    if wide_rows:
        w = max(wide_rows, key=lambda r: r["t_dp"])
        lines.append(f"* Wider DAGs cost more: width {w['width']}, {w['nodes']} nodes, {w['ideals']} ideals, K={w['K']}: "
                     f"{w['t_dp']:.0f} s.")
    for objective in ("throughput", "gpipe"):
        rows = [r for r in nu_rows if r["objective"] == objective]
        best = max(rows, key=lambda r: r["speedup"])
        lines.append(f"* Non-uniform layers, {objective}: the optimal partition is {min(r['speedup'] for r in rows):.2f}x"
                     f"-{best['speedup']:.2f}x faster than the equal-layer split (best: {best['layers']}, K={best['K']}).")
    return "\n".join(lines)


def _report(scale_rows: list[dict], wide_rows: list[dict], ilp_rows: list[dict], tower_rows: list[dict],
            nu_rows: list[dict], args: argparse.Namespace) -> str:
    flags = "".join(f" --{f}" for f in ("quick", "wide") if getattr(args, f))
    return f"""# Pipeline partitioner benchmark

Command: `python bench/bench_partition.py{flags} --write`
Machine: {machine()}

{_summary(scale_rows, wide_rows, nu_rows)}

## Exact contiguous DP: time against node count and number of down-closed sets

Transformer-like operator DAGs (`transformer_dag` in `bench/bench_partition.py`): per layer, layer norm,
`width` parallel branches of 2 ops, merge, projection, residual add, MLP (3 ops), residual add; plus
embedding, head and loss. `ideals`: down-closed sets (including the empty set and the whole DAG);
`pairs`: ideal pairs J ⊊ I priced by the DP (inside the compute window, within the memory limit);
`rounds`: DP passes (the first finds an upper bound unless it is already optimal); `t_ideals`:
seconds to enumerate the ideals alone; `t_dp`: seconds of `partition(dag, K, solver="dp")` end to end
(enumeration included); `load_ms`: the optimal largest stage load (throughput objective).

{_table(scale_rows, SCALING_COLS)}

{WIDE_TEXT if wide_rows else ""}{_table(wide_rows, SCALING_COLS) if wide_rows else ""}

## The same problem by the DP and the ILPs

A transformer-like DAG of about 100 nodes (width 3). `contiguous`: the DP and both ILP backends
(OR-tools CP-SAT, PuLP/CBC; 60 s time limit) on the same problem; `any`: non-contiguous stages (a device
may hold several pieces; throughput objective), which the DP does not cover.

{_table(ilp_rows, ILP_COLS)}

## Contiguous is more than intervals of one topological order

Two independent towers (one twice as heavy as the other) listed interleaved, as a tracer running them
side by side would list them, then fusion and head (`two_tower_dag`). `interval_ms`: the best split into
intervals of that topological order; `optimal_ms`: the DP over down-closed sets, which may give each
stage a piece of each tower; `equal_ms`: equal numbers of layers per stage. Throughput objective.

{_table(tower_rows, TOWER_COLS)}

## Non-uniform layers: optimal partition vs equal-layer split

32 blocks of width 3 (the embedding counts in the first block, head and loss in the last), block compute
scaled per layer; `equal_ms`: `equal_split` (equal numbers of blocks per stage); `interval_ms`: the best
split into intervals of one topological order; `optimal_ms`: the DP optimum over contiguous stages;
`ratio` = optimal / equal (lower is better), `speedup` = equal / optimal. Throughput: largest stage load
per micro-batch; gpipe: the step time `(M + K - 1) * max stage time` for M = 8 micro-batches.

{_table(nu_rows, NONUNIFORM_COLS)}
"""


if __name__ == "__main__":
    sys.exit(main())
