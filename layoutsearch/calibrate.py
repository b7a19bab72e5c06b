"""Measure the cost model's hardware figures on the JAX devices present (``layoutsearch calibrate``).

:func:`calibrate` times, on the devices JAX has:

* **matmuls**: jitted bf16 and float32 matmuls on one device over square sizes
  (powers of two) and a few skinny shapes; each time is the median of several
  runs after a warm-up (each run enqueues the op back to back and waits with
  ``block_until_ready``). ``peak_flops`` / ``peak_flops_fp32`` and
  ``matmul_efficiency`` follow: for a known accelerator (``Device.device_kind``
  mapped to a preset, or ``base=``) the vendor peaks are kept and
  ``matmul_efficiency = best achieved bf16 / peak`` (at most 1); for CPU or an
  unknown device the peaks are the best achieved rates and the efficiency 1.
* **HBM bandwidth**: a jitted elementwise op over a large buffer (bytes read +
  written / time). Known accelerator: vendor ``hbm_bandwidth`` with
  ``memory_efficiency = achieved / vendor``; otherwise the achieved figure with
  efficiency 1.
* **collectives**: for each mesh axis of size >= 2, all-reduce (``psum``) and
  all-gather (``all_gather(tiled=True)``) of several payloads over that axis in
  a ``jax.shard_map`` (every group of the other axes runs at once, as in a
  training step). The all-reduce times are fitted by least squares to the
  one-axis ring model of :mod:`layoutsearch.costmodel.collectives`,
  ``t = 2(n-1) * alpha + 2(n-1)/n * B / bw`` (alpha >= 0, bw > 0); the
  all-gather fit, ``(n-1) * alpha + (n-1)/n * B / bw`` with ``B`` the output
  bytes, is recorded beside it. Each axis is mapped to the fast or slow link
  as :meth:`Hardware.links_for` maps it; the link takes the axis's bandwidth
  (efficiency 1: the measured figure is already achieved) and latency; when
  several axes share a link kind the slowest axis's figures are used (all are
  recorded). A link kind no axis uses keeps the preset's figures.
* **kernels**: programs of ``n`` dependent steps ``x - mean(x)`` over 256
  floats on one device (a reduction and its consumer: XLA cannot fuse the
  chain into one kernel), for several ``n``, each program's kernels counted in
  its compiled HLO (:func:`kernel_count`); the least-squares slope of the time
  against the kernels is ``kernel_latency``: the time the compute stream spends
  per kernel beyond its work (launch and dispatch; the work, 1 KiB, is about a
  nanosecond at an accelerator's HBM rate), which the cost model adds for each
  kernel of a step.

The preset (the device kind's, ``base=``, or for CPU ``cpu-sim``) gives what is
not measured: HBM size, ``matmul_tile``, ``compute_units``, ``devices_per_node``
and the backend behaviour flags (on CPU always ``cpu-sim``'s, what XLA on CPU
compiles). Every row of the matmul table also carries the cost model's own
prediction on the calibrated figures (``model_efficiency``,
``predicted_seconds``), to show how well the shape model fits the device.

The measurements on simulated CPU devices are not performance figures (the
devices share the host's cores); they exercise the machinery only, and the
result says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from layoutsearch.errors import HardwareError, LayoutSearchError, MeshError
from layoutsearch.mesh import BACKEND_BEHAVIOUR, PRESETS, Hardware, Link, Mesh, hardware

SIMULATED_NOTE = ("measured on CPU devices, which share the host's cores when simulated: these figures are not "
                  "performance figures of any accelerator (use them to exercise the tools only)")

DEFAULT_CPU_DEVICES = 8
"""Simulated CPU devices asked for when no mesh is given and no accelerator is present."""

_DEVICE_KINDS: tuple[tuple[str, str], ...] = (
    # (lower-case substring of jax Device.device_kind, preset); more specific first
    ("h200", "h200"), ("h100", "h100"), ("a100", "a100"), ("v100", "v100"),
    ("tpu v5 lite", "tpu-v5e"), ("tpu v5e", "tpu-v5e"), ("tpu v5p", "tpu-v5p"), ("tpu v5", "tpu-v5p"),
    ("tpu v4", "tpu-v4"), ("tpu v3", "tpu-v3"), ("tpu v2", "tpu-v2"),
)

KiB, MiB = 2**10, 2**20


def preset_for_device_kind(kind: str) -> str | None:
    """The preset of a JAX ``device_kind`` (``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``), None if unknown."""
    k = kind.lower()
    return next((preset for sub, preset in _DEVICE_KINDS if sub in k), None)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to measure: matmul shapes ``(m, n, k)``, HBM buffer bytes, collective payloads and runs per timing."""

    matmuls: tuple[tuple[int, int, int], ...]
    hbm_bytes: int
    payloads: tuple[int, ...]
    kernels: tuple[int, ...]  # steps per program of the kernel-launch measurement
    reps: int
    run_s: float  # each timed run lasts about this long (the op is enqueued back to back)


def plan_for(platform: str, quick: bool) -> Plan:
    """The sizes measured on ``platform`` (small ones on CPU; ``quick``: fewer and smaller)."""
    if platform == "cpu":
        squares, big = ((64, 128, 256), 256) if quick else ((128, 256, 512, 1024), 1024)
        hbm, payloads = (32 * MiB, (4 * KiB, 64 * KiB, 1 * MiB)) if quick else (
            128 * MiB, (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB))
    else:
        squares, big = ((512, 2048, 4096), 4096) if quick else ((256, 512, 1024, 2048, 4096, 8192), 8192)
        hbm, payloads = (256 * MiB, tuple(2**e for e in (12, 16, 20, 24))) if quick else (
            1024 * MiB, tuple(2**e for e in range(12, 29, 2)))
    skinny = ((32, big, big), (big, 32, big), (big, big, 32))
    # (XLA's compile time grows faster than the steps: a few seconds at 64 steps on CPU)
    kernels = ((4, 8, 16, 32) if quick else (4, 8, 16, 32, 64)) if platform == "cpu" else (
        (8, 32, 64) if quick else (8, 16, 32, 64, 128))
    return Plan(tuple((s, s, s) for s in squares) + skinny, hbm, payloads, kernels, 3 if quick else 7,
                0.002 if quick else 0.02)


# -- timing ---------------------------------------------------------------------------------------------------------

def _time(fn: Callable[..., Any], args: Sequence[Any], plan: Plan) -> float:
    """Median seconds of one call of ``fn(*args)`` after a warm-up (compilation) call."""
    import jax

    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - t0, 1e-9)
    inner = max(1, min(100, int(plan.run_s / once)))
    times = []
    for _ in range(plan.reps):
        t0 = time.perf_counter()
        out = None
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return max(statistics.median(times), 1e-12)


def _measure_matmuls(device: Any, plan: Plan) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    mm = jax.jit(jnp.matmul)
    rng = np.random.default_rng(0)
    rows = []
    for dtype in ("bfloat16", "float32"):
        for m, n, k in plan.matmuls:
            a = jax.device_put(rng.standard_normal((m, k), dtype=np.float32).astype(jnp.dtype(dtype)), device)
            b = jax.device_put(rng.standard_normal((k, n), dtype=np.float32).astype(jnp.dtype(dtype)), device)
            s = _time(mm, (a, b), plan)
            rows.append({"dtype": dtype, "m": m, "n": n, "k": k, "seconds": s, "flops_per_s": 2 * m * n * k / s})
            del a, b
    return rows


def _measure_hbm(device: Any, plan: Plan) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.ones((plan.hbm_bytes // 4,), jnp.float32), device)
    s = _time(jax.jit(lambda v: v * 1.5 + 0.5), (x,), plan)
    moved = 2 * plan.hbm_bytes  # read + written
    return {"op": "y = 1.5 * x + 0.5 (float32)", "buffer_bytes": plan.hbm_bytes, "bytes_moved": moved,
            "seconds": s, "bandwidth": moved / s}


_NOT_KERNELS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})


def kernel_count(hlo: str) -> int:
    """The kernels a compiled XLA program (its optimized HLO text) runs: the instructions of its entry
    computation other than parameters, constants, tuples and bitcasts (no work of their own)."""
    entry = hlo[hlo.index("\nENTRY"):]
    ops = re.findall(r"^\s*(?:ROOT )?%\S+ = .*?[\]}] ([a-z][\w-]*)\(", entry, flags=re.M)
    return sum(op not in _NOT_KERNELS for op in ops)


def _measure_kernels(device: Any, plan: Plan) -> dict[str, Any]:
    """Seconds per kernel of programs of dependent tiny kernels (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def chain(n: int) -> Callable[[Any], Any]:
        def run(x: Any) -> Any:
            for _ in range(n):
                x = x - jnp.mean(x)  # a reduction and its consumer: XLA fuses no two steps into one kernel
            return x
        return jax.jit(run)

    x = jax.device_put(jnp.zeros((256,), jnp.float32), device)
    rows = []
    for n in plan.kernels:
        compiled = chain(n).lower(x).compile()
        rows.append({"steps": n, "kernels": kernel_count(compiled.as_text()), "seconds": _time(compiled, (x,), plan)})
    slope = float(np.polyfit([r["kernels"] for r in rows], [r["seconds"] for r in rows], 1)[0])
    return {"op": "x - mean(x) over 256 float32 (1 KiB), chained; kernels counted in the compiled program",
            "rows": rows, "kernel_latency": max(0.0, slope),
            "fit": "least-squares slope of seconds against kernels" + (" (negative: clamped at 0)" if slope < 0 else "")}


def _ring(kind: str, n: int, nbytes: float) -> tuple[float, float]:
    """(latency steps, bytes sent per device) of a one-axis ring collective (costmodel/collectives.py)."""
    if kind == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) / n * nbytes
    return n - 1, (n - 1) / n * nbytes


def fit_alpha_beta(samples: Sequence[tuple[float, float, float]]) -> dict[str, Any]:
    """Least-squares ``seconds = steps * alpha + sent / bw`` over ``(steps, sent, seconds)`` samples,
    with ``alpha >= 0`` and ``bw > 0``: ``{"alpha", "bandwidth", "fit"}``."""
    s11 = sum(a * a for a, _, _ in samples)
    s12 = sum(a * b for a, b, _ in samples)
    s22 = sum(b * b for _, b, _ in samples)
    y1 = sum(a * t for a, _, t in samples)
    y2 = sum(b * t for _, b, t in samples)
    det = s11 * s22 - s12 * s12
    alpha = beta = -1.0
    how = "least squares"
    if det > 1e-12 * s11 * s22:
        alpha, beta = (y1 * s22 - y2 * s12) / det, (s11 * y2 - s12 * y1) / det
    if alpha < 0 or beta <= 0:  # clamp: a latency-free fit through the origin (its slope is positive)
        alpha, beta, how = 0.0, y2 / s22, "least squares with alpha clamped to 0"
    return {"alpha": alpha, "bandwidth": 1 / beta, "fit": how}


def _measure_collectives(devices: Sequence[Any], mesh: Mesh, plan: Plan,
                         progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    arr = np.array(list(devices[: mesh.size]), dtype=object).reshape([s for _, s in mesh.axes])
    jm = jax.sharding.Mesh(arr, mesh.names)
    spec = P(mesh.names)
    out: dict[str, dict[str, Any]] = {}
    for axis, n in mesh.axes:
        if n < 2:
            continue
        progress(f"collectives over {axis}:{n}")
        res: dict[str, Any] = {"size": n}
        for kind in ("all-reduce", "all-gather"):
            if kind == "all-reduce":
                def body(x: Any, axis: str = axis) -> Any:
                    return lax.psum(x, axis)
            else:
                def body(x: Any, axis: str = axis) -> Any:
                    return lax.all_gather(x, axis, tiled=True)
            f = jax.jit(jax.shard_map(body, mesh=jm, in_specs=spec, out_specs=spec))
            samples = []
            for payload in plan.payloads:  # all-reduce: operand bytes; all-gather: output bytes (the model's)
                local = max(1, payload // 4 // (n if kind == "all-gather" else 1))
                nbytes = local * 4 * (n if kind == "all-gather" else 1)
                x = jax.device_put(jnp.ones((mesh.size * local,), jnp.float32), NamedSharding(jm, spec))
                samples.append({"bytes": nbytes, "seconds": _time(f, (x,), plan)})
                del x
            fit = fit_alpha_beta([(*_ring(kind, n, s["bytes"]), s["seconds"]) for s in samples])
            for s in samples:
                steps, sent = _ring(kind, n, s["bytes"])
                s["fitted_seconds"] = steps * fit["alpha"] + sent / fit["bandwidth"]
            res[kind] = {**fit, "samples": samples}
        res["alpha"], res["bandwidth"] = res["all-reduce"]["alpha"], res["all-reduce"]["bandwidth"]
        out[axis] = res
    return out


# -- devices and the preset to start from ---------------------------------------------------------------------------

def _devices(mesh: Mesh | None) -> list[Any]:
    """The devices to calibrate on; asks for simulated CPU devices before JAX starts if there is no accelerator."""
    from layoutsearch.devices import MAX_SIMULATED_DEVICES, jax_devices

    n = mesh.size if mesh is not None else DEFAULT_CPU_DEVICES
    try:
        devices = jax_devices(n)
    except LayoutSearchError:
        devices = None
    import jax

    default = jax.devices()
    accel = default[0].platform != "cpu"
    if mesh is None:
        return list(default) if accel else list(devices or default)
    if devices is not None and (devices[0].platform != "cpu" or not accel):
        return list(devices)
    have = default if accel else jax.devices("cpu")
    hint = (f" (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before JAX starts)"
            if not accel and mesh.size <= MAX_SIMULATED_DEVICES else
            f" (at most {MAX_SIMULATED_DEVICES} simulated CPU devices are started)" if not accel else "")
    raise _setting(MeshError(f"mesh {mesh} needs {mesh.size} devices and JAX has {len(have)} {have[0].platform} "
                             f"devices: use a smaller mesh{hint}"), "mesh")


def _base(base: str | Hardware | None) -> Hardware | None:
    if base is None or isinstance(base, Hardware):
        return base
    from layoutsearch.hwprofile import is_profile_path

    if is_profile_path(base):
        raise _setting(HardwareError(f"the base of a calibration is a preset name ({', '.join(PRESETS)}), not a "
                                     f"profile file: {base!r}"), "base")
    return hardware(base)


def _setting(err: LayoutSearchError, name: str) -> LayoutSearchError:
    """``err``, marked as caused by parameter ``name`` (the CLI names the flag that sets it)."""
    err.setting = name  # type: ignore[attr-defined]
    return err


# -- calibration ----------------------------------------------------------------------------------------------------

def calibrate(mesh: Mesh | str | None = None, base: str | Hardware | None = None, quick: bool = False,
              devices: Sequence[Any] | None = None,
              progress: Callable[[str], None] | None = None) -> tuple[Hardware, dict[str, Any]]:
    """Measure matmul rates, HBM bandwidth, the per-kernel launch time and per-axis collective alpha/beta on the
    JAX devices present.

    ``mesh``: the mesh whose axes are measured (default: every device on one axis ``data:N``; with no
    accelerator, ``N`` = 8 simulated CPU devices). ``base``: the preset whose vendor peaks, HBM size, tiles
    and links the measured figures complete (default: the preset of the device kind, if known). ``quick``:
    fewer, smaller sizes (a few seconds on 8 simulated CPU devices). ``devices``: the devices to use
    (default: JAX's). Returns the calibrated Hardware and the measurements (``measurements["meta"]``: the
    profile's ``"calibrated"`` metadata). MeshError / HardwareError for bad input.
    """
    say = progress or (lambda _msg: None)
    mesh = Mesh.of(mesh) if mesh is not None else None
    base_hw = _base(base)
    import jax

    mesh, devices = _mesh_devices(mesh, devices)
    dev = devices[0]
    platform, device_kind = dev.platform, dev.device_kind
    simulated = platform == "cpu"
    template, label, known = _template(base_hw, platform, device_kind, simulated)
    vendor = template.name != "cpu-sim" and known
    plan = plan_for(platform, quick)

    say("matmuls")
    rows = _measure_matmuls(dev, plan)
    best = {dt: max(r["flops_per_s"] for r in rows if r["dtype"] == dt) for dt in ("bfloat16", "float32")}
    say("HBM bandwidth")
    hbm = _measure_hbm(dev, plan)
    say("kernel launches")
    kernels = _measure_kernels(dev, plan)
    axes = _measure_collectives(devices, mesh, plan, say)
    rates, peak_note, hbm_note = _rates(template, vendor, best, hbm["bandwidth"], platform, device_kind)
    links, link_notes = _fit_links(template, mesh, axes)

    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    date = now.isoformat().replace("+00:00", "Z")
    source = (f"measured by layoutsearch calibrate on {date}, {device_kind} x {mesh.size}, JAX {jax.__version__}"
              + (" (simulated CPU devices: not performance figures)" if simulated else ""))
    changes: dict[str, Any] = {
        "name": f"calibrated-{label}", **rates, "fast_link": links["fast"],
        "slow_link": links["slow"], "source": source, "axis_links": (), "kernel_latency": kernels["kernel_latency"],
    }
    changes.update(_device_changes(dev, template, vendor, simulated))
    hw = dataclasses.replace(template, **changes)
    _check(hw)
    _model_matmuls(hw, rows)
    hbm.update(vendor_bandwidth=template.hbm_bandwidth if vendor else None,
               efficiency=hbm["bandwidth"] / rates["hbm_bandwidth"], note=hbm_note)

    meta: dict[str, Any] = {
        "date": date, "jax_version": jax.__version__, "platform": platform, "device_kind": device_kind,
        "device_count": mesh.size, "devices_available": len(jax.devices(platform)), "mesh": str(mesh),
        "base": template.name if known else None,
        "quick": quick, "simulated": simulated,
    }
    if simulated:
        meta["note"] = SIMULATED_NOTE
    measurements: dict[str, Any] = {
        "matmul": {"peaks": peak_note, "best_flops_per_s": best, "rows": rows},
        "hbm": hbm,
        "kernels": kernels,
        "collectives": {"model": "all-reduce: 2(n-1)/n * B / bw + 2(n-1) * alpha; all-gather (B = output bytes): "
                                 "(n-1)/n * B / bw + (n-1) * alpha; the link takes the all-reduce fit",
                        "axes": axes, "links": link_notes},
        "meta": meta,
    }
    if simulated:
        measurements["note"] = SIMULATED_NOTE
    return hw, measurements


def _mesh_devices(mesh: Mesh | None, devices: Sequence[Any] | None) -> tuple[Mesh, list[Any]]:
    """The mesh to measure (default: every device on one axis ``data``) and its devices, the first
    ``mesh.size`` of ``devices`` (default: JAX's, see :func:`_devices`)."""
    if devices is None:
        devices = _devices(mesh)
    devices = list(devices)
    if mesh is None:
        mesh = Mesh((("data", len(devices)),))
    if mesh.size > len(devices):
        raise MeshError(f"mesh {mesh} needs {mesh.size} devices and {len(devices)} are available")
    return mesh, devices[: mesh.size]


def _template(base_hw: Hardware | None, platform: str, device_kind: str,
              simulated: bool) -> tuple[Hardware, str, bool]:
    """The preset the measured figures complete, the label of the calibrated hardware's name, and whether
    the preset is known for the device (``base`` given, or the device kind's preset)."""
    detected = preset_for_device_kind(device_kind) if not simulated else None
    if base_hw is not None:
        template, label = base_hw, base_hw.name
    elif detected is not None:
        template, label = PRESETS[detected], detected
    else:
        template = PRESETS["cpu-sim" if simulated else "h100" if platform == "gpu" else "tpu-v5e"]
        label = platform
    return template, label, base_hw is not None or detected is not None


def _rates(template: Hardware, vendor: bool, best: dict[str, float], bandwidth: float, platform: str,
           device_kind: str) -> tuple[dict[str, float], str, str]:
    """The compute and HBM figures (``peak_flops``, ``peak_flops_fp32``, ``matmul_efficiency``,
    ``hbm_bandwidth``, ``memory_efficiency``) from the best matmul rates and the achieved ``bandwidth``:
    the ``template``'s vendor peaks and the achieved fraction of them when ``vendor``, else the achieved
    figures at efficiency 1; and a note on each (peaks, HBM)."""
    if vendor:
        peak, peak32 = template.peak_flops, template.peak_flops_fp32
        mm_eff = min(1.0, best["bfloat16"] / peak)
        hbm_bw, mem_eff = template.hbm_bandwidth, min(1.0, bandwidth / template.hbm_bandwidth)
        peak_note = f"vendor peaks of preset {template.name}; efficiency = best achieved bf16 rate / peak"
        hbm_note = f"vendor bandwidth of preset {template.name}; efficiency = achieved / vendor"
    else:
        peak, peak32, mm_eff = best["bfloat16"], best["float32"], 1.0
        hbm_bw, mem_eff = bandwidth, 1.0
        peak_note = (f"no vendor peak for {device_kind!r} ({platform}): peaks are the best achieved rates, "
                     "efficiency 1.0")
        hbm_note = f"no vendor figure for {device_kind!r} ({platform}): the achieved bandwidth, efficiency 1.0"
    rates = {"peak_flops": peak, "peak_flops_fp32": peak32, "matmul_efficiency": mm_eff, "hbm_bandwidth": hbm_bw,
             "memory_efficiency": mem_eff}
    return rates, peak_note, hbm_note


def _fit_links(template: Hardware, mesh: Mesh, axes: dict[str, Any]) -> tuple[dict[str, Link], dict[str, Any]]:
    """The fast and slow links from the per-axis fits ``axes`` (each marked with its link kind): a link takes
    the figures of the slowest axis that uses it, or keeps the ``template``'s when no axis does; and a note
    on each link."""
    # Which link kind each axis uses: links_for on a copy whose two links differ.
    probe = dataclasses.replace(template, fast_link=Link(2.0, 0.0), slow_link=Link(1.0, 0.0))
    kinds = {a: "fast" if link.bandwidth == 2.0 else "slow" for a, link in probe.links_for(mesh).items()}
    links = {"fast": template.fast_link, "slow": template.slow_link}
    link_notes: dict[str, Any] = {}
    for kind in ("fast", "slow"):
        measured = {a: r for a, r in axes.items() if kinds[a] == kind}
        for a in measured:
            measured[a]["link"] = kind
        if not measured:
            link_notes[kind] = {"measured": False, "axes": [], "bandwidth": links[kind].bandwidth,
                                "latency": links[kind].latency, "efficiency": links[kind].efficiency,
                                "note": f"no mesh axis of size >= 2 uses it: kept from preset {template.name}"}
            continue
        slowest = min(measured, key=lambda a: measured[a]["bandwidth"])
        links[kind] = Link(measured[slowest]["bandwidth"], measured[slowest]["alpha"], 1.0)
        link_notes[kind] = {"measured": True, "axes": list(measured), "from_axis": slowest,
                            "bandwidth": links[kind].bandwidth, "latency": links[kind].latency, "efficiency": 1.0}
    return links, link_notes


def _device_changes(dev: Any, template: Hardware, vendor: bool, simulated: bool) -> dict[str, Any]:
    """The Hardware fields the device itself gives: for an unknown accelerator, its core count and memory
    limit; for a known one, the memory the runtime reserves of the datasheet's; on CPU, ``cpu-sim``'s
    backend behaviour."""
    changes: dict[str, Any] = {}
    if not vendor and not simulated:  # an unknown accelerator: what JAX says of it
        cores = getattr(dev, "core_count", None)
        if isinstance(cores, int) and cores > 0:
            changes["compute_units"] = cores
        stats = _memory_stats(dev)
        if stats.get("bytes_limit"):
            changes["hbm_bytes"] = float(stats["bytes_limit"])
            changes["memory_reserved"] = 0.0
    elif not simulated:  # a known accelerator: what the runtime leaves of the datasheet's HBM
        limit = _memory_stats(dev).get("bytes_limit")
        if limit:
            changes["memory_reserved"] = max(0.0, template.hbm_bytes - float(limit))
    if simulated:  # what XLA on CPU compiles (reduce-scatter, fusion, ...), whatever the base preset
        changes.update({k: getattr(PRESETS["cpu-sim"], k) for k in BACKEND_BEHAVIOUR})
    return changes


def _model_matmuls(hw: Hardware, rows: list[dict[str, Any]]) -> None:
    """Add to each measured matmul row its achieved efficiency and the cost model's prediction on ``hw``
    (``model_efficiency``, ``predicted_seconds``)."""
    from layoutsearch.costmodel.compute import matmul_efficiency

    for r in rows:
        p = hw.peak_flops_fp32 if r["dtype"] == "float32" else hw.peak_flops
        itemsize = 4 if r["dtype"] == "float32" else 2
        e = matmul_efficiency(hw, (1, r["m"], r["n"], r["k"]))
        flops, moved = 2 * r["m"] * r["n"] * r["k"], (r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"]) * itemsize
        r["efficiency"] = r["flops_per_s"] / p
        r["model_efficiency"] = e
        r["predicted_seconds"] = max(flops / (p * e), moved / (hw.hbm_bandwidth * hw.memory_efficiency))


def _memory_stats(dev: Any) -> dict[str, Any]:
    try:
        return dict(dev.memory_stats() or {})
    except Exception:  # noqa: BLE001 -- not every backend has memory stats
        return {}


def _check(hw: Hardware) -> None:
    """Every measured figure positive and finite (a timing gone wrong must not reach a profile)."""
    figures = {"peak_flops": hw.peak_flops, "peak_flops_fp32": hw.peak_flops_fp32,
               "matmul_efficiency": hw.matmul_efficiency, "hbm_bandwidth": hw.hbm_bandwidth,
               "memory_efficiency": hw.memory_efficiency, "fast_link.bandwidth": hw.fast_link.bandwidth,
               "slow_link.bandwidth": hw.slow_link.bandwidth}
    for k, v in figures.items():
        if not (math.isfinite(v) and v > 0):
            raise HardwareError(f"calibration measured an invalid {k} = {v!r}")
    for k, v in {"fast_link.latency": hw.fast_link.latency, "slow_link.latency": hw.slow_link.latency,
                 "kernel_latency": hw.kernel_latency}.items():
        if not (math.isfinite(v) and v >= 0):
            raise HardwareError(f"calibration measured an invalid {k} = {v!r}")


def write_profile(hw: Hardware, measurements: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Save the result of :func:`calibrate` as a hardware profile (``measurements["meta"]`` -> ``"calibrated"``)."""
    from layoutsearch.hwprofile import save_profile

    meta = measurements.get("meta", {})
    save_profile(hw, path, {k: v for k, v in measurements.items() if k != "meta"}, meta)


__all__ = ["SIMULATED_NOTE", "calibrate", "fit_alpha_beta", "kernel_count", "plan_for", "preset_for_device_kind",
           "write_profile"]
