"""Where a training step's time and memory go on the devices present, beside the cost model's prices.

    python bench/profile_device.py --out DIR                      # the configurations of bench_device.py
    python bench/profile_device.py --out DIR --only "gpt-0.7b none"

For each configuration of :mod:`bench_device` (the same model, layout and decisions, compiled by the executor),
the script traces a few training steps with the JAX profiler and reads XLA's dump of the compiled step:

* **time**: every kernel of the step (on CPU: every thunk) is traced back to the HLO instruction that launched
  it (the trace's ``hlo_op``) and from there to the IR ops whose ``jax.named_scope`` its fused instructions
  carry; kernels are summed by phase (forward; backward: instructions of JAX's transpose; optimizer: no IR
  scope; xla: no JAX op name, inserted by XLA, such as layout copies) and class (matmul: a dot, a cuBLAS call
  or a fusion holding a dot; other), beside the cost model's
  compute seconds by phase and class, and the step's wall time beside the kernels' busy time (launch gaps);
* **memory**: the buffers live at the peak of XLA's buffer assignment (the dump's ``live-range`` file),
  largest first, with the IR ops that produce them, beside the cost model's peak and its breakdown.

The step runs without CUDA command buffers (``--xla_gpu_enable_command_buffer=``), so that each kernel is traced
on its own; its step time is printed beside ``bench_device.py``'s. Results go to ``DIR/profile.json`` and
``DIR/profile.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SCOPE = re.compile(r"\[([^\[\]]+)\]")
"""An IR op's ``jax.named_scope`` in an HLO instruction's ``op_name``
(:func:`layoutsearch.backend.program.scope_name`)."""

GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
"""Custom-call targets that run a matmul (cuBLAS). A fusion runs one where its computation holds a ``dot``
(XLA:GPU's Triton gemm fusions do; its Triton softmax fusions do not)."""


def instruction_table(hlo_text: str) -> dict[str, dict[str, Any]]:
    """Every instruction of a compiled HLO module -> its IR ops (the scopes of its own and its called
    computations' instructions), phase (``forward``, ``backward`` or ``optimizer``) and whether it runs a
    matmul."""
    from layoutsearch.backend.hlo import _parse_module

    comps, _ = _parse_module(hlo_text)
    own: dict[str, tuple[list[str], bool, bool, bool]] = {}  # computation -> (scopes, transposed, matmul, named)

    def summary(comp: str, seen: frozenset[str] = frozenset()) -> tuple[list[str], bool, bool, bool]:
        if comp in own:
            return own[comp]
        scopes, back, mm, named = [], False, False, False
        for ins in comps.get(comp, []):
            s, b, m, n = _instruction(ins, lambda c: summary(c, seen | {comp}) if c not in seen else
                                      ([], False, False, False))
            scopes += s
            back, mm, named = back or b, mm or m, named or n
        own[comp] = (list(dict.fromkeys(scopes)), back, mm, named)
        return own[comp]

    table: dict[str, dict[str, Any]] = {}
    for comp, instrs in comps.items():
        for ins in instrs:
            scopes, back, mm, named = _instruction(ins, summary)
            phase = ("argument" if ins.opcode == "parameter" else "backward" if back else "forward" if scopes
                     else "optimizer" if named else "xla")
            table[ins.name] = {"ops": list(dict.fromkeys(scopes)), "phase": phase, "matmul": mm,
                               "opcode": ins.opcode, "shape": ins.shape[:80]}
    return table


def _instruction(ins: Any, called: Any) -> tuple[list[str], bool, bool, bool]:
    """(IR scopes, under JAX's transpose, runs a matmul, has a JAX op name) of ``ins`` and its callees."""
    name = re.search(r'op_name="([^"]*)"', ins.attrs.get("metadata", ""))
    op_name = name.group(1) if name else ""
    scopes = [s.strip("\\'") for s in SCOPE.findall(op_name)[-1:]]  # a parameter's tree path: ['name']
    back = "transpose(" in op_name
    mm = ins.opcode in ("dot", "convolution") or (
        ins.opcode == "custom-call" and ins.attrs.get("custom_call_target", "").strip('"') in GEMM_TARGETS)
    named = bool(op_name)
    for callee in re.findall(r"%?([\w.\-]+)", ins.attrs.get("calls", "")):
        s, b, m, n = called(callee)
        scopes, back, mm, named = scopes + s, back or b, mm or m, named or n
    return scopes, back, mm, named


def kernel_events(trace_dir: Path) -> list[dict[str, Any]]:
    """The traced kernels (device events carrying ``hlo_op``; on CPU, the host's thunks) of the newest trace."""
    files = sorted(trace_dir.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    data = json.load(gzip.open(files[-1]))
    events = data["traceEvents"] if isinstance(data, dict) else data
    procs = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    timed = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    device = [e for e in timed if "device:" in procs.get(e["pid"], "").lower()]
    return device or timed


def time_table(events: list[dict[str, Any]], table: dict[str, dict[str, Any]], steps: int,
               module: str = "train_step") -> dict[str, Any]:
    """Kernel seconds per step by phase and class, the kernels and IR ops that took longest, and every IR op some
    kernel was traced back to."""
    by_class: dict[str, float] = defaultdict(float)
    by_kernel: dict[tuple[str, str], float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    unknown, count = 0.0, 0
    for e in events:
        if module not in e["args"].get("hlo_module", module):
            continue
        count += 1
        s = e["dur"] * 1e-6 / steps
        info = table.get(e["args"]["hlo_op"])
        if info is None:
            unknown += s
            continue
        by_class[f"{info['phase']} {'matmul' if info['matmul'] else 'other'}"] += s
        by_kernel[(e["args"]["hlo_op"], e["name"][:60])] += s
        for op in info["ops"] or ["(no IR op)"]:
            by_op[op] += s / max(len(info["ops"]), 1)
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:25]
    return {"kernel_s": sum(by_class.values()) + unknown, "unattributed_s": unknown, "kernels": count / steps,
            "by_class": dict(by_class),
            "top_kernels": [{"hlo_op": k[0], "kernel": k[1], "seconds": v, **table[k[0]]} for k, v in top],
            "top_ops": sorted(by_op.items(), key=lambda kv: -kv[1])[:25], "ops_traced": sorted(by_op)}


def peak_buffers(live_range: str, table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The buffers live at the peak of XLA's buffer assignment (a ``*-live-range.txt`` dump), largest first."""
    at = live_range.find("(peak):")
    if at < 0:
        return {"error": "no '(peak):' section in the live-range dump"}
    rows = []
    for line in live_range[at:].splitlines()[1:]:
        m = re.match(r"\s+([\w.\-]+)(\{[^}]*\}): (\d+) bytes", line)
        if not m:
            break
        info = table.get(m.group(1), {})
        index = m.group(2) if m.group(2) != "{}" else ""  # a tuple's element: the shape is the whole tuple's
        rows.append({"buffer": m.group(1) + index, "bytes": int(m.group(3)), "ops": info.get("ops", []),
                     "phase": info.get("phase"), "shape": info.get("shape", ""), "opcode": info.get("opcode")})
    rows.sort(key=lambda r: -r["bytes"])
    return {"peak_bytes": sum(r["bytes"] for r in rows), "buffers": len(rows), "top": rows[:30]}


def predicted_by_class(report: Any) -> dict[str, float]:
    """The cost model's compute seconds per device by phase and class (recomputation counts as forward)."""
    out: dict[str, float] = defaultdict(float)
    for op in report.ops:
        phase = "forward" if op.phase == "recompute" else op.phase
        out[f"{phase} {'matmul' if op.matmul else 'other'}"] += op.compute_s
    return dict(out)


def profile(cfg: Any, devices: list[Any], hw: Any, steps: int, smoke: bool, dump: Path) -> dict[str, Any]:
    """One configuration: its step traced and its compiled peak read, beside the cost model's figures."""
    import jax

    from layoutsearch.backend.train import train

    graph = cfg.graph(smoke)
    layout = cfg.layout(len(devices))
    plan = cfg.price(graph, layout, hw)
    before = set(dump.rglob("*"))
    program = cfg.program(graph, layout, devices)
    warm = train(program, 2)
    texts = [p for p in set(dump.rglob("*after_optimizations.txt")) - before if "train_step" in p.name]
    hlo = max(texts, key=lambda p: p.stat().st_size)
    table = instruction_table(hlo.read_text())
    live = Path(str(hlo).replace(".txt", "-live-range.txt"))
    trace = Path(tempfile.mkdtemp(prefix="trace", dir=dump))
    t0 = time.perf_counter()
    with jax.profiler.trace(str(trace), create_perfetto_trace=True):
        run = train(program, steps, seed=1)
    wall = time.perf_counter() - t0
    report = plan.report
    return {"config": cfg.name, "mesh": str(layout.mesh), "layout": cfg.rules, "predicted_step_s": plan.step_s,
            "predicted_compute": predicted_by_class(report), "predicted_memory": report.memory.to_dict(),
            "measured_step_s": run.median_step_s, "warm_step_s": warm.records[-1].seconds, "traced_wall_s": wall,
            "time": time_table(kernel_events(trace), table, steps),
            "memory": peak_buffers(live.read_text(), table) if live.exists() else {"error": f"no {live.name}"}}


def _markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    out = [f"## {meta['date']}: {meta['device_kind']} ({meta['platform']}), preset `{meta['hardware']}`, "
           f"JAX {meta['jax']}: where the step goes", ""]
    for r in rows:
        out.append(f"### {r['config']}")
        if "error" in r:
            out += [r["error"], ""]
            continue
        t = r["time"]
        out += ["", f"step: predicted {ms(r['predicted_step_s'])} ms, measured {ms(r['measured_step_s'])} ms "
                f"(median of the traced steps, no command buffers); {t['kernels']:.0f} kernels busy "
                f"{ms(t['kernel_s'])} ms per step ({ms(t['unattributed_s'])} ms not traced back to an instruction)",
                "",
                "| phase, class | predicted ms | measured (kernels) ms |", "|---|---:|---:|"]
        for k in sorted(set(r["predicted_compute"]) | set(t["by_class"])):
            out.append(f"| {k} | {ms(r['predicted_compute'].get(k, 0.0))} | {ms(t['by_class'].get(k, 0.0))} |")
        out += ["", "| kernel (HLO instruction) | ms per step | phase | matmul | IR ops |", "|---|---:|---|---|---|"]
        for k in t["top_kernels"][:15]:
            out.append(f"| `{k['kernel']}` ({k['hlo_op']}) | {ms(k['seconds'])} | {k['phase']} | {k['matmul']} | "
                       f"{', '.join(k['ops'][:4])} |")
        m = r["memory"]
        pm = r["predicted_memory"]
        out += ["", f"memory: predicted peak {gib(pm['peak_bytes'])} GiB at `{pm['peak_op']}` ({pm['peak_phase']}; "
                + ", ".join(f"{k} {gib(v)}" for k, v in pm["breakdown"].items() if v) + ")"]
        if "error" in m:
            out.append(f"compiled peak: {m['error']}")
        else:
            out += [f"compiled peak {gib(m['peak_bytes'])} GiB in {m['buffers']} buffers; the largest:", "",
                    "| buffer | GiB | shape | phase | IR ops |", "|---|---:|---|---|---|"]
            for b in m["top"][:20]:
                out.append(f"| {b['buffer']} | {gib(b['bytes'])} | `{b['shape']}` | {b['phase']} | "
                           f"{', '.join(b['ops'][:3])} |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="DIR", default=".", help="where profile.json and profile.md go (default .)")
    ap.add_argument("--steps", type=int, default=3, help="traced training steps per configuration (default 3)")
    ap.add_argument("--only", metavar="TEXT", action="append",
                    help="only the configurations whose name contains TEXT (repeatable: any of them)")
    ap.add_argument("--smoke", action="store_true", help="tiny models (CPU): the script end to end")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="start no configuration after this many seconds (default 300)")
    args = ap.parse_args(argv)
    scratch = tempfile.TemporaryDirectory(prefix="xla_dump")  # removed at exit: XLA dumps every fusion's code
    dump = Path(scratch.name)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
                               " --xla_dump_hlo_module_re=.*train_step.* --xla_gpu_enable_command_buffer=").strip()
    from bench_device import devices_present, failure, selected

    from layoutsearch.mesh import hardware

    start = time.perf_counter()
    devices, preset, meta = devices_present()
    configs = selected(ap, args.only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for cfg in configs:
        if time.perf_counter() - start > args.budget_s:
            break
        try:
            rows.append(profile(cfg, devices, hardware(preset), args.steps, args.smoke, dump))
        except Exception as e:  # noqa: BLE001 - a failed configuration is a result to record
            rows.append({"config": cfg.name, **failure(e)})
        (out / "profile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        (out / "profile.md").write_text(_markdown(meta, rows))
        print(_markdown(meta, rows[-1:]), flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
