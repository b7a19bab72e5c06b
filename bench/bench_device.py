"""Predicted against measured step time and memory on the devices present (a GPU or TPU; CPU: a smoke run).

    python bench/bench_device.py --out DIR            # on the accelerator: about 5 minutes on one H100
    python bench/bench_device.py --smoke --out DIR    # tiny models on CPU: the script end to end

Each configuration (a model size, a layout over the devices present, a remat policy, gradient
accumulation, a precision policy) is compiled by the executor (``layoutsearch.backend.train.Program``,
the program ``layoutsearch run`` runs), timed over ``--steps`` training steps (the median after the first,
which compiles), and put beside the cost model's prediction for the hardware preset of these devices:
step time, MFU (model FLOPs over the bf16 peak) and peak memory per device against XLA's memory analysis
of the compiled step (arguments + outputs + temporaries - aliased).

Each configuration runs and is priced with one attention kind: ``standard`` (the seq x kv_seq scores kept
for the backward pass) or ``flash`` (the executor checkpoints each attention core: the backward pass
recomputes the scores, a flash kernel's memory and FLOPs, but the scores still pass through HBM, so its
time lies between the two prices; the standard price is printed beside it). Configurations predicted not
to fit the device are skipped, and no configuration starts once ``--budget-s`` seconds have passed. After
each configuration the results so far are written to ``DIR/device.json`` and ``DIR/device.md`` (a table to paste into
``bench/RESULTS_device.md`` with the date and the device), so a run stopped at its time limit keeps what it
measured. ``layoutsearch.validate.validate`` (the ``validate`` command) runs once too, on the smallest
configuration: compiled against predicted collectives, FLOPs and memory, and its own step timing.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT_1B = {"d_model": 2048, "heads": 16, "layers": 12, "seq": 2048, "batch": 4, "vocab": 50304}
"""A GPT of 0.7B parameters (12 layers of GPT-3 XL's width): large enough for the matmuls of one device to run
near their peak rate, small enough for every configuration to fit 80 GB without remat."""

LLAMA_1B = {"d_model": 2048, "heads": 16, "kv_heads": 4, "d_ff": 5632, "layers": 12, "seq": 2048, "batch": 4,
            "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": 0,
            "tie_embeddings": 0}
"""Llama-style blocks (grouped-query attention, SwiGLU, RMSNorm, rotary positions) at the same width."""

GPT_SMALL = {"d_model": 1024, "heads": 16, "layers": 12, "seq": 2048, "batch": 8, "vocab": 50304}
"""A GPT of GPT-3 Medium's width: smaller matmuls, where the efficiency curve matters more."""

SMOKE = {"d_model": 64, "heads": 4, "layers": 2, "seq": 32, "batch": 8, "vocab": 128}
"""``--smoke``: every configuration at this size (CPU, seconds)."""


@dataclass(frozen=True)
class Config:
    """One measured configuration: zoo model ``gpt`` with ``sizes``, global ``rules`` on the mesh of the
    devices present (``{n}``: their number), and the step's decisions."""

    name: str
    sizes: dict[str, Any]
    remat: str = "none"
    microbatches: int = 1
    precision: str = "mixed"
    rules: str = "batch:data"
    mesh: str = "data:{n}"
    attention: str = "standard"

    def graph(self, smoke: bool) -> Any:
        """The model: ``sizes``, or with ``smoke`` the :data:`SMOKE` sizes with the same architecture options."""
        from layoutsearch import zoo

        sizes = dict(self.sizes)
        if smoke:
            sizes.update(SMOKE)
            sizes.update({k: v for k, v in (("kv_heads", 2), ("d_ff", 4 * SMOKE["d_model"])) if k in self.sizes})
        return zoo.build("gpt", **sizes)

    def layout(self, n: int) -> Any:
        """The layout on ``n`` devices."""
        from layoutsearch.layout import Layout

        return Layout.from_rules(self.mesh.format(n=n), self.rules)

    def price(self, graph: Any, layout: Any, hw: Any, attention: str | None = None) -> Any:
        """The cost model's plan of this configuration (with ``attention``, default its own), no memory limit."""
        from layoutsearch.solvers.search import price_plan

        return price_plan(graph, layout, hw, remat=self.remat, microbatches=self.microbatches, memory_limit=None,
                          precision=self.precision, attention=attention or self.attention)

    def program(self, graph: Any, layout: Any, devices: list[Any]) -> Any:
        """The executor's program of this configuration (what ``layoutsearch run`` runs)."""
        from layoutsearch.backend.train import Program

        return Program(graph, layout, remat=self.remat, microbatches=self.microbatches, precision=self.precision,
                       devices=devices, attention=self.attention)


CONFIGS: tuple[Config, ...] = (
    Config("gpt-0.7b none", GPT_1B),
    Config("gpt-0.7b selective", GPT_1B, remat="selective"),
    Config("gpt-0.7b full", GPT_1B, remat="full"),
    Config("gpt-0.7b flash", GPT_1B, attention="flash"),
    Config("gpt-0.7b accumulate 2", GPT_1B, microbatches=2),
    Config("gpt-0.7b bf16", GPT_1B, precision="bf16"),
    Config("gpt-0.7b fp32 full", GPT_1B, remat="full", precision="fp32"),
    Config("llama-0.7b none", LLAMA_1B),
    Config("gpt-0.3b none", GPT_SMALL),
)
"""The configurations, in the order they run (the first ones matter most if the budget runs out)."""


def measure(cfg: Config, devices: list[Any], hw: Any, steps: int, smoke: bool) -> dict[str, Any]:
    """One configuration: predicted (with its attention, and with standard attention) and measured."""
    from layoutsearch.backend.train import train

    graph = cfg.graph(smoke)
    layout = cfg.layout(len(devices))
    row: dict[str, Any] = {"config": cfg.name, "sizes": dict(graph.dims), "mesh": str(layout.mesh), "layout": cfg.rules,
                           "remat": cfg.remat, "microbatches": cfg.microbatches, "precision": cfg.precision,
                           "attention": cfg.attention}
    priced = {attention: cfg.price(graph, layout, hw, attention) for attention in dict.fromkeys((cfg.attention,
                                                                                                "standard"))}
    plan = priced[cfg.attention]  # priced as it runs
    row.update({"predicted_step_s": plan.step_s, "predicted_standard_step_s": priced["standard"].step_s,
                "predicted_memory_bytes": plan.memory_bytes, "model_flops": plan.report.model_flops,
                "predicted_mfu": plan.report.model_flops / (len(devices) * hw.peak_flops * plan.step_s)})
    if plan.memory_bytes > hw.usable_bytes:
        row["skipped"] = f"predicted {plan.memory_bytes / 2**30:.1f} GiB > usable {hw.usable_bytes / 2**30:.1f} GiB"
        return row
    t0 = time.perf_counter()
    program = cfg.program(graph, layout, devices)
    mem = program.memory_analysis()
    row["compile_s"] = time.perf_counter() - t0
    row["compiled_memory_bytes"] = mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]
    row["compiled_memory"] = mem
    run = train(program, steps)
    row.update({"measured_step_s": run.median_step_s, "first_step_s": run.compile_s,
                "loss_first": run.records[0].loss, "loss_last": run.records[-1].loss})
    row["measured_over_predicted"] = run.median_step_s / plan.step_s
    row["memory_predicted_over_compiled"] = plan.memory_bytes / row["compiled_memory_bytes"]
    row["measured_mfu"] = plan.report.model_flops / (len(devices) * hw.peak_flops * run.median_step_s)
    return row


def validate_once(cfg: Config, devices: list[Any], hw: Any, steps: int, smoke: bool) -> dict[str, Any]:
    """``layoutsearch validate`` on ``cfg``: compiled against predicted, and on an accelerator measured."""
    from layoutsearch.validate import validate

    return validate(cfg.graph(smoke), cfg.layout(len(devices)), hw, precision=cfg.precision, steps=steps)


def devices_present() -> tuple[list[Any], str, dict[str, Any]]:
    """The accelerators present (else one CPU device), their hardware preset (``cpu-sim`` for CPU) and the
    run's facts (date, device, JAX and Python versions)."""
    import jax

    from layoutsearch.devices import jax_devices, present_hardware

    n = len(jax.devices()) if jax.devices()[0].platform != "cpu" else 1
    devices = jax_devices(n)
    preset = present_hardware(devices) or "cpu-sim"
    return devices, preset, {"date": date.today().isoformat(), "platform": devices[0].platform,
                             "device_kind": devices[0].device_kind, "devices": n, "hardware": preset,
                             "jax": jax.__version__, "python": platform.python_version()}


def selected(ap: argparse.ArgumentParser, only: list[str] | None) -> list[Config]:
    """The configurations whose name contains any of ``only`` (all by default); a usage error if none."""
    configs = [c for c in CONFIGS if only is None or any(text in c.name for text in only)]
    if not configs:
        ap.error(f"no configuration matches --only {' / '.join(only or [])}")
    return configs


def failure(e: Exception) -> dict[str, str]:
    """A failed configuration's record: the error's first line and the traceback."""
    return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300], "traceback": traceback.format_exc()}


def _markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    out = [f"## {meta['date']}: {meta['device_kind']} x{meta['devices']} ({meta['platform']}), preset "
           f"`{meta['hardware']}`, JAX {meta['jax']}", "",
           f"`{meta['command']}`", "",
           "| config | mesh / layout | predicted s | measured s | measured / predicted | predicted MFU | "
           "measured MFU | standard-attention predicted s | memory predicted / compiled GiB | compile s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r or "skipped" in r:
            out.append(f"| {r['config']} | {r.get('mesh', '')} `{r.get('layout', '')}` | "
                       f"{r.get('predicted_step_s', float('nan')):.3f} | {r.get('skipped') or r['error']} "
                       "| | | | | | |")
            continue
        out.append(f"| {r['config']} | {r['mesh']} `{r['layout']}` | {r['predicted_step_s']:.3f} | "
                   f"{r['measured_step_s']:.3f} | {r['measured_over_predicted']:.2f} | {r['predicted_mfu']:.1%} | "
                   f"{r['measured_mfu']:.1%} | {r['predicted_standard_step_s']:.3f} | "
                   f"{r['predicted_memory_bytes'] / 2**30:.2f} / {r['compiled_memory_bytes'] / 2**30:.2f} | "
                   f"{r['compile_s']:.0f} |")
    v = meta.get("validate")
    if v is not None:
        out += ["", f"`validate` on {v.get('config')}: " + (v["error"] if "error" in v else
                f"predicted {v['predicted_step_s']:.4f} s, measured {v.get('measured_step_s', float('nan')):.4f} s; "
                + "; ".join(f"{r['what']}: predicted/compiled {r['ratio']:.3f}" if r["ratio"] is not None else
                            f"{r['what']}: predicted {r['predicted']}, compiled {r['compiled']}"
                            + (f" ({r['note']})" if r.get("note") else "") for r in v["rows"]))]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", metavar="DIR", default=".", help="where device.json and device.md go (default .)")
    ap.add_argument("--steps", type=int, default=8, help="training steps per configuration (default 8)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no configuration after this many seconds (default 420)")
    ap.add_argument("--only", metavar="TEXT", action="append",
                    help="only the configurations whose name contains TEXT (repeatable: any of them)")
    ap.add_argument("--smoke", action="store_true", help="tiny models (CPU): the script end to end, no figures")
    ap.add_argument("--no-validate", action="store_true", help="skip the validate run")
    args = ap.parse_args(argv)

    from layoutsearch.mesh import hardware

    start = time.perf_counter()
    devices, preset, meta = devices_present()
    hw = hardware(preset)
    meta["command"] = "python bench/bench_device.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = selected(ap, args.only)
    rows: list[dict[str, Any]] = []

    def write() -> None:
        (out / "device.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        (out / "device.md").write_text(_markdown(meta, rows))

    print(f"{meta['device_kind']} x{meta['devices']} ({meta['platform']}), preset {preset}, JAX {meta['jax']}",
          flush=True)
    for cfg in configs:
        if time.perf_counter() - start > args.budget_s:
            rows.append({"config": cfg.name, "error": f"not run: the {args.budget_s:.0f} s budget was spent"})
            continue
        try:
            row = measure(cfg, devices, hw, args.steps, args.smoke)
        except Exception as e:  # noqa: BLE001 - a failed configuration is a result to record, not the end
            row = {"config": cfg.name, **failure(e)}
        rows.append(row)
        write()
        print(json.dumps({k: v for k, v in row.items() if k not in ("traceback", "sizes", "compiled_memory")},
                         default=str), flush=True)
    if not args.no_validate and time.perf_counter() - start <= args.budget_s:
        small = min(configs, key=lambda c: c.sizes["d_model"] * c.sizes["layers"])
        try:
            meta["validate"] = {"config": small.name, **validate_once(small, devices, hw, args.steps, args.smoke)}
        except Exception as e:  # noqa: BLE001
            meta["validate"] = {"config": small.name, **failure(e)}
        write()
    print(_markdown(meta, rows), flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
