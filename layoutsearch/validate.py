"""Predicted against compiled (and, on an accelerator, measured) for one model and layout.

:func:`compiled_costs` reads what XLA compiles for a layout's training step:
collective payloads by kind and mesh axes and FLOPs per device from the
program compiled without fusion (XLA's fusion recomputes cheap producers in
every consumer, trading FLOPs for memory traffic; partitioning and
collectives are the same), memory per device (arguments + outputs +
temporaries - aliased) from the default program with the updated parameters
and optimizer state donated, as a training loop runs it.

:func:`validate` puts the cost model's predictions beside them. The collective
and memory predictions are made for the backend that compiled the program
(on CPU: all-reduce + slice instead of reduce-scatter, one combined gradient
all-reduce: see :class:`~layoutsearch.mesh.Hardware`); times for the
hardware asked for. On a GPU or TPU it also times the step (median of
``steps`` runs after one warm-up); on CPU it does not (simulated devices share
the host's cores: their wall time says nothing about the layout).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any

from layoutsearch.costmodel.report import estimate
from layoutsearch.costmodel.step import training_step
from layoutsearch.devices import jax_devices
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.layout import Layout
from layoutsearch.mesh import BACKEND_BEHAVIOUR, Hardware
from layoutsearch.mesh import hardware as _hardware


def compiled_costs(graph: Graph, layout: Layout) -> dict[str, Any]:
    """Collectives (by kind and axes), FLOPs and memory per device of the compiled training step."""
    from layoutsearch.backend.hlo import summarize
    from layoutsearch.backend.program import jax_dtype
    from layoutsearch.backend.sharding import UNFUSED, compile_step, feed_names

    jax_devices(layout.mesh.size)
    import jax

    feeds = {k: jax.ShapeDtypeStruct(tuple(d.size for d in graph.tensors[k].dims), jax_dtype(graph.tensors[k]))
             for k in feed_names(graph)}
    program, mesh = compile_step(graph, layout, feeds, compiler_options=UNFUSED)
    s = summarize(program, mesh)
    by: dict[tuple[str, tuple[str, ...] | None], int] = defaultdict(int)
    for (kind, axes), nbytes in s.bytes_by().items():
        by[(kind, tuple(axes) if axes is not None else None)] += nbytes
    fused, mesh = compile_step(graph, layout, feeds, donate=True)
    memory = summarize(fused, mesh).memory
    return {"collectives": [{"kind": k, "axes": list(a) if a is not None else None, "bytes": b}
                            for (k, a), b in sorted(by.items(), key=str)],
            "comm_bytes": sum(by.values()), "flops": s.flops, "memory_bytes": memory.get("total_bytes"),
            "platform": next(iter(mesh.devices.flat)).platform}


def _backend_hardware(hw: Hardware, platform: str) -> Hardware:
    """``hw`` with the compiler behaviour of the backend that compiled the program."""
    if platform == "cpu":
        cpu = _hardware("cpu-sim")
        return hw.replace(**{k: getattr(cpu, k) for k in BACKEND_BEHAVIOUR})
    return hw


def _measure(graph: Graph, layout: Layout, steps: int) -> float:
    import jax

    from layoutsearch.backend.program import init_params, random_inputs
    from layoutsearch.backend.sharding import feed_names, sharded_step

    step, sh = sharded_step(graph, layout)
    feeds = {**init_params(graph), **random_inputs(graph)}
    fed = {k: jax.device_put(feeds[k], sh[k]) for k in feed_names(graph)}
    jax.block_until_ready(step(fed))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(step(fed))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def validate(graph: Graph, layout: Layout, hardware: Hardware | str = "cpu-sim", *, optimizer: str = "adam",
             precision: Precision | str = DEFAULT_PRECISION, steps: int = 10) -> dict[str, Any]:
    """Predicted vs compiled collectives, FLOPs and memory per device (and measured
    vs predicted step time on an accelerator) for ``graph``'s training step under ``layout``
    with the ``precision`` policy."""
    g = training_step(graph, optimizer, precision)
    layout.check(g)
    hw = _hardware(hardware)
    compiled = compiled_costs(g, layout)
    platform = compiled["platform"]
    rep = estimate(g, layout, _backend_hardware(hw, platform))
    pred: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for c in rep.collectives:
        pred[(c.kind, c.axes)] += c.bytes
    comp = {(c["kind"], tuple(c["axes"]) if c["axes"] is not None else None): c["bytes"]
            for c in compiled["collectives"]}
    rows = [{"what": f"{kind} over {'+'.join(axes) if axes else '?'} (bytes)", "predicted": pred.get((kind, axes), 0),
             "compiled": comp.get((kind, axes), 0)} for kind, axes in sorted(set(pred) | set(comp), key=str)]
    rows.append({"what": "FLOPs per device", "predicted": rep.flops_per_device, "compiled": compiled["flops"]})
    rows.append({"what": "memory per device (bytes)", "predicted": rep.memory_bytes,
                 "compiled": compiled["memory_bytes"]})
    for r in rows:
        p, c = r["predicted"], r["compiled"]
        r["ratio"] = (p / c) if c else (1.0 if not p else None)
    timed = estimate(g, layout, hw)
    out: dict[str, Any] = {"model": graph.name, "mesh": str(layout.mesh), "layout": layout.describe(),
                           "precision": timed.precision, "hardware": hw.name, "platform": platform, "rows": rows, "predicted_step_s": timed.step_s}
    if platform != "cpu":
        out["measured_step_s"] = _measure(g, layout, steps)
    return out
