"""Device meshes (ordered named axes) and hardware presets.

A mesh is parsed from ``data:2,model:4`` (or ``data=2,model=4``); axes are
ordered major to minor, as in ``jax.make_mesh``. Hardware presets give peak
FLOP/s, HBM size and bandwidth, and two kinds of links: fast (NVLink /
NVSwitch inside a node, ICI inside a TPU slice) and slow (InfiniBand / DCN
between nodes or slices). Each mesh axis uses one of them: by default the
minor axes whose product fits in one node take the fast links, the others the
slow ones; ``axis_links`` overrides this per axis. Every figure is
overridable (``Hardware.replace`` or ``--hw key=value`` in the CLI).

Figures are vendor peak numbers (dense bf16) from ``docs/hardware.md``; the
``source`` field of each preset cites them. Efficiency factors (achieved
fraction of peak) are separate fields so that a measured number can replace
them without touching the peaks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.errors import HardwareError, MeshError

_AXIS = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*[:=]\s*([0-9]+)\s*")
_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

MAX_MESH_DEVICES = 2**20
"""The most devices a mesh has (1,048,576): with dims of at most ``2**40``
(:data:`layoutsearch.ir.dims.MAX_DIM_SIZE`), a dim times a mesh stays below ``2**60``."""

MAX_TILE = 2**20
"""The largest matmul tile size (``Hardware.matmul_tile``)."""

FIGURE_RANGE = (1e-30, 1e30)
"""The magnitudes a positive hardware figure may take: a finite number, so that every time the cost model
divides by one (bytes / bandwidth, FLOPs / peak) stays finite."""


@dataclass(frozen=True)
class Mesh:
    """An ordered set of named mesh axes with sizes (major first)."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.axes, tuple | list) or not all(
                isinstance(a, tuple | list) and len(a) == 2 for a in self.axes):
            raise MeshError(f"mesh axes must be (name, size) pairs, got {_short(self.axes)}")
        object.__setattr__(self, "axes", tuple((a, s) for a, s in self.axes))
        for a, _ in self.axes:
            if not isinstance(a, str) or not _AXIS_NAME.fullmatch(a):
                raise MeshError(f"invalid mesh axis name {_short(a)}: use letters, digits and '_'")
        names = [a for a, _ in self.axes]
        if len(set(names)) != len(names):
            raise MeshError(f"mesh repeats an axis: {names}")
        for a, s in self.axes:
            if not isinstance(s, int) or isinstance(s, bool) or s < 1:
                raise MeshError(f"mesh axis {a!r} has invalid size {_short(s)}: must be a positive integer")
            if s > MAX_MESH_DEVICES:
                raise MeshError(f"mesh axis {a!r} has invalid size {_short(s)}: a mesh has at most 2**20 "
                                f"({MAX_MESH_DEVICES:,}) devices")
        if math.prod(s for _, s in self.axes) > MAX_MESH_DEVICES:
            raise MeshError(f"mesh {self} has {math.prod(s for _, s in self.axes):,} devices: a mesh has at most "
                            f"2**20 ({MAX_MESH_DEVICES:,})")

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """Parse ``data:2,model:4`` (or ``data=2,model=4``)."""
        if not isinstance(text, str) or not text.strip():
            raise MeshError("empty mesh: write axes like 'data:2,model:4'")
        axes = []
        for part in text.split(","):
            m = _AXIS.fullmatch(part)
            if not m:
                raise MeshError(f"bad mesh axis {_short(part.strip())} in {_short(text)}: write axes like "
                                "'data:2,model:4'")
            digits = m.group(2).lstrip("0") or "0"
            if len(digits) > 7:  # more than MAX_MESH_DEVICES (7 digits)
                raise MeshError(f"mesh axis {m.group(1)!r} has invalid size {_short(m.group(2))}: a mesh has at "
                                f"most 2**20 ({MAX_MESH_DEVICES:,}) devices")
            axes.append((m.group(1), int(digits)))
        return cls(tuple(axes))

    @classmethod
    def of(cls, obj: Mesh | str | Mapping[str, int]) -> Mesh:
        """A Mesh from a Mesh, a mesh string or a {axis: size} mapping."""
        if isinstance(obj, Mesh):
            return obj
        if isinstance(obj, str):
            return cls.parse(obj)
        return cls(tuple((str(k), v) for k, v in obj.items()))

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(s for _, s in self.axes)

    @functools.cached_property
    def _sizes(self) -> dict[str, int]:
        return dict(self.axes)

    def axis_size(self, axis: str) -> int:
        try:
            return self._sizes[axis]
        except KeyError:
            raise MeshError(f"unknown mesh axis {axis!r} (mesh has: {', '.join(self.names)})") from None

    @functools.cached_property
    def _groups(self) -> dict[tuple[str, ...], int]:
        return {}

    def group_size(self, axes: tuple[str, ...] | list[str]) -> int:
        """Product of the sizes of ``axes`` (1 for none)."""
        key = axes if isinstance(axes, tuple) else tuple(axes)
        n = self._groups.get(key)
        if n is None:
            n = self._groups[key] = math.prod(self.axis_size(a) for a in key)
        return n

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.axes)

    def __str__(self) -> str:
        return ",".join(f"{a}:{s}" for a, s in self.axes)


@dataclass(frozen=True)
class Link:
    """One kind of interconnect as seen by one device.

    ``bandwidth``: bytes/s per device per direction (what a ring collective
    can use); ``latency``: seconds per collective step (the alpha of the
    alpha-beta model); ``efficiency``: achieved fraction of ``bandwidth``.
    """

    bandwidth: float
    latency: float
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        for f in ("bandwidth", "latency", "efficiency"):
            _check_finite(f"link {f}", getattr(self, f))

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Hardware:
    """Figures of one accelerator and its interconnect (all overridable).

    Compute: ``peak_flops`` (dense bf16/fp16 matmul peak), ``peak_flops_fp32``
    (matmuls of float32 operands, as XLA runs them by default: TF32 tensor cores
    on A100/H100, one bf16 pass on TPUs); ``matmul_efficiency``: the achieved
    fraction of peak on large well-shaped matmuls, lowered per matmul shape by
    ``matmul_tile`` (tile sizes m, n, k) and ``compute_units`` (streaming
    multiprocessors; see :mod:`layoutsearch.costmodel.compute`);
    ``memory_efficiency``: achieved fraction of HBM bandwidth.

    Memory: ``hbm_bytes`` (the datasheet figure) less ``memory_reserved``,
    what the runtime holds before the training step allocates anything (CUDA
    context, cuBLAS workspace and NCCL buffers on GPUs; the TPU runtime's own
    buffers): :attr:`usable_bytes`, the default memory limit of every search
    and what "fits" means in every report. ``calibrate`` measures the usable
    bytes on the devices present (JAX's ``memory_stats()["bytes_limit"]``).

    ``devices_per_node``: how many devices the fast links join (a GPU node or
    a TPU slice); mesh axes inside that extent use ``fast_link``, the others
    ``slow_link``.

    Backend behaviour (what the compiler and runtime do; XLA on CPU differs
    from XLA on GPU/TPU, and the ``cpu-sim`` preset says so):

    * ``reduce_scatter``: the compiler emits reduce-scatter for partial sums
      whose result stays split (XLA on CPU all-reduces and slices instead);
    * ``combined_gradient_all_reduce``: the parameter-gradient all-reduces are
      deferred to the end of the backward pass and run as one out-of-place
      all-reduce (XLA on CPU; charged by :mod:`layoutsearch.costmodel.memory`);
    * ``fusion``: elementwise, normalization and softmax ops are fused with
      their producers and consumers, so tensors between them never reach HBM
      (XLA on GPU/TPU; :mod:`layoutsearch.costmodel.fusion`);
    * ``async_collectives``: collectives run beside compute, so those off the
      critical path (weight all-gathers, gradient reductions) can hide behind
      it (:mod:`layoutsearch.costmodel.overlap`); XLA on CPU runs them in line;
    * ``collective_matmul``: an all-gather of a matmul's activation operand, or
      a reduce-scatter of its result, is decomposed into ring steps that
      overlap the matmul itself (XLA on TPU: "collective matmul", Wang et al.
      2023, ASPLOS; used by PaLM and MaxText for tensor parallelism); elsewhere
      tensor-parallel collectives wait for, or are waited for by, their matmul;
    * ``float32_collectives``: collectives of bf16/fp16 tensors run in float32
      (XLA on CPU converts around them), moving 4 bytes per element;
    * ``regather_weights``: a parameter all-gathered for the forward pass is
      released after use and gathered again for the backward pass (FSDP as
      XLA on GPU/TPU schedules it) instead of kept alive from one to the other.

    ``kernel_latency``: seconds the compute stream is idle per kernel it runs
    (the launch of one kernel after another on a GPU stream); 0 where the
    device runs the compiled program without a launch per kernel (TPUs). The
    kernels of a step are the fusion plan's (:mod:`layoutsearch.costmodel.fusion`).
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    fast_link: Link
    slow_link: Link
    devices_per_node: int
    matmul_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    source: str = ""
    axis_links: tuple[tuple[str, str], ...] = field(default=())
    reduce_scatter: bool = True
    combined_gradient_all_reduce: bool = False
    peak_flops_fp32: float = 0.0
    matmul_tile: tuple[int, int, int] = (1, 1, 1)
    compute_units: int = 1
    fusion: bool = True
    async_collectives: bool = True
    regather_weights: bool = True
    float32_collectives: bool = False
    collective_matmul: bool = False
    memory_reserved: float = 0.0
    kernel_latency: float = 0.0

    @property
    def usable_bytes(self) -> float:
        """Per-device bytes a training step may use: ``hbm_bytes - memory_reserved``."""
        return self.hbm_bytes - self.memory_reserved

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                _check_finite(f.name, v)
        if not self.peak_flops_fp32:
            object.__setattr__(self, "peak_flops_fp32", self.peak_flops)
        tile = tuple(self.matmul_tile)
        if len(tile) != 3 or not all(isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= MAX_TILE
                                     for t in tile):
            raise HardwareError(f"matmul_tile must be three positive integers (m, n, k), got {self.matmul_tile!r}")
        object.__setattr__(self, "matmul_tile", tile)
        if self.memory_reserved >= self.hbm_bytes:
            raise HardwareError(f"hardware {self.name!r}: memory_reserved ({self.memory_reserved:.4g} bytes) must be "
                                f"below hbm_bytes ({self.hbm_bytes:.4g}): nothing would be left for a step")

    def replace(self, **changes: Any) -> Hardware:
        """A copy with some figures changed, e.g. ``hw.replace(peak_flops=300e12)``.

        Link figures are set with ``fast_link_bandwidth=...``, ``slow_link_latency=...``
        and the like; ``axis_links={"data": "slow"}`` pins axes to a link kind."""
        direct: dict[str, Any] = {}
        links = {"fast_link": self.fast_link, "slow_link": self.slow_link}
        for key, value in changes.items():
            link = next((k for k in links if key.startswith(k + "_")), None)
            if link is not None:
                sub = key[len(link) + 1:]
                if sub not in {f.name for f in dataclasses.fields(Link)}:
                    raise HardwareError(f"unknown hardware figure {key!r}")
                links[link] = dataclasses.replace(links[link], **{sub: _figure(key, value, float)})
            elif key == "axis_links":
                try:
                    pins = dict(value)
                except (TypeError, ValueError):
                    raise HardwareError(f"axis_links must map mesh axes to 'fast' or 'slow', got {_short(value)}") \
                        from None
                for axis, kind in pins.items():
                    if not isinstance(axis, str):
                        raise HardwareError(f"axis_links must map mesh axes (names) to 'fast' or 'slow', got "
                                            f"{_short(axis)}")
                    if not isinstance(kind, str) or kind not in ("fast", "slow"):
                        raise HardwareError(f"axis link kind must be 'fast' or 'slow', got {_short(kind)}")
                direct[key] = tuple(pins.items())
            elif key == "matmul_tile":
                direct[key] = _tile(value)
            elif key == "name":
                if not isinstance(value, str) or not value.strip():
                    raise HardwareError(f"hardware name must be a non-empty string, got {_short(value)}")
                direct[key] = value.strip()
            elif key in {f.name for f in dataclasses.fields(self)} and key != "source":
                direct[key] = _figure(key, value, type(getattr(self, key)))
            else:
                raise HardwareError(f"unknown hardware figure {key!r} (known: {', '.join(_figure_names())})")
        for link in links.values():
            if not (link.bandwidth > 0 and link.latency >= 0 and 0 < link.efficiency <= 1):
                raise HardwareError(f"invalid link figures {link}: bandwidth > 0, latency >= 0, 0 < efficiency <= 1")
        return dataclasses.replace(self, **direct, **links)

    def links_for(self, mesh: Mesh) -> dict[str, Link]:
        """The link each mesh axis uses (see the class docstring)."""
        pinned = dict(self.axis_links)
        for a in pinned:
            if a not in mesh.names:
                raise HardwareError(f"axis_links pins axis {a!r}, which mesh {mesh} lacks")
        out: dict[str, Link] = {}
        extent = 1
        for axis, size in reversed(mesh.axes):  # minor axes first
            extent *= size
            kind = pinned.get(axis, "fast" if extent <= self.devices_per_node else "slow")
            out[axis] = self.fast_link if kind == "fast" else self.slow_link
        return {a: out[a] for a in mesh.names}

    def link_kinds(self, mesh: Mesh) -> dict[str, str]:
        """``fast`` or ``slow``: the kind of link each mesh axis uses (:meth:`links_for`)."""
        return {a: "fast" if link == self.fast_link else "slow" for a, link in self.links_for(mesh).items()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _figure(key: str, value: Any, typ: type) -> Any:
    """Convert an overridden figure to its type; HardwareError if it is not one, or not a finite number
    within :data:`FIGURE_RANGE` (latencies and ``memory_reserved`` may also be 0)."""
    try:
        if typ is bool:
            if str(value).lower() not in ("1", "0", "true", "false"):
                raise ValueError
            return str(value).lower() in ("1", "true")
        if isinstance(value, bool):
            raise ValueError
        v = float(value)
        if not math.isfinite(v):
            raise HardwareError(f"hardware figure {key}={_short(value)} must be a finite number")
        if typ is int:
            if v != int(v):
                raise ValueError
            v = int(v)
    except (TypeError, ValueError, OverflowError):
        raise HardwareError(f"hardware figure {key}={_short(value)} is not a valid {typ.__name__}") from None
    if key.endswith("latency") or key == "memory_reserved":
        if not v >= 0:
            raise HardwareError(f"hardware figure {key}={_short(value)} must be >= 0")
    elif not v > 0:
        raise HardwareError(f"hardware figure {key}={_short(value)} must be positive")
    if key.endswith("efficiency") and v > 1:
        raise HardwareError(f"hardware figure {key}={_short(value)}: an efficiency is at most 1")
    lo, hi = FIGURE_RANGE
    if v > hi or 0 < v < lo:
        raise HardwareError(f"hardware figure {key}={_short(value)} is out of range: a figure is 0 or between "
                            f"{lo:g} and {hi:g}")
    return v


def _short(v: Any) -> str:
    text = repr(v) if not (isinstance(v, int) and v.bit_length() > 200) else f"(an integer of {v.bit_length()} bits)"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _tile(value: Any) -> tuple[int, int, int]:
    """``(m, n, k)`` from a sequence or a string ``"128,128,64"``."""
    items = value.replace("x", ",").split(",") if isinstance(value, str) else value
    try:
        tile = tuple(int(v) for v in items)
    except (TypeError, ValueError, OverflowError):
        raise HardwareError(f"matmul_tile must be three positive integers m,n,k, got {_short(value)}") from None
    if len(tile) != 3 or min(tile) < 1 or max(tile) > MAX_TILE:
        raise HardwareError(f"matmul_tile must be three positive integers m,n,k (at most {MAX_TILE:,}), "
                            f"got {_short(value)}")
    return tile  # type: ignore[return-value]


def _check_finite(name: str, v: float) -> None:
    try:
        ok = math.isfinite(v)
    except OverflowError:  # an int beyond the float range
        ok = False
    if not ok:
        raise HardwareError(f"hardware figure {name}={_short(v)} must be a finite number")


def _figure_names() -> list[str]:
    names = [f.name for f in dataclasses.fields(Hardware) if f.name not in ("fast_link", "slow_link", "source")]
    for link in ("fast_link", "slow_link"):
        names += [f"{link}_{f.name}" for f in dataclasses.fields(Link)]
    return names


GB = 1e9
GiB = 2**30
TB = 1e12

# Memory: STREAM-like kernels reach ~85-90% of peak HBM bandwidth. Links: NCCL bus bandwidth reaches ~80% of
# NVLink peak and ~90% of InfiniBand line rate. Matmul efficiency: see docs/hardware.md ("Efficiency factors")
# for the source of each figure.
_MEM = 0.85

_NV = "NVIDIA datasheets (V100 SXM2, A100 SXM 80GB, H100 SXM, H200 SXM): dense bf16/fp16 tensor-core peak"
_TPU = "Google Cloud TPU system architecture pages: per-chip bf16 peak, HBM, ICI/DCN bandwidth"
_GPU_TILE = (128, 128, 64)   # output tile m x n of a tensor-core GEMM kernel, k step (NVIDIA GEMM guide)
_TPU_TILE = (8, 128, 128)    # MXU: 128 x 128 weight tile (n x k), rows streamed 8 at a time (m)
_TPU_MM = 0.90               # see docs/hardware.md: no published microbenchmark; calibrate to measure
# Memory the runtime holds before a step allocates anything (docs/hardware.md, "Usable memory"): assumptions, not
# datasheet figures; `calibrate` measures the usable bytes (memory_stats()["bytes_limit"]) on the devices present.
_GPU_RESERVED = 1 * GiB      # CUDA context (~0.3-0.6 GiB), cuBLAS workspace, NCCL channel buffers
_TPU_RESERVED = 0.5 * GiB    # TPU runtime: program binaries and scratch buffers
# GPU idle per kernel launched back to back on one stream (docs/hardware.md, "Kernel launches"): NVIDIA Developer
# Blog, A. Gray, "Getting Started with CUDA Graphs" (2019): a 2.9 us kernel launched back to back takes 3.8 us per
# kernel on V100. TPUs: 0, the TensorCore sequences the compiled program itself (no launch per kernel).
_KERNEL_LATENCY = 0.9e-6


def _gpu(name: str, peak: float, fp32: float, hbm: float, bw: float, fast: Link, slow: Link, e: float, sms: int,
         source: str) -> Hardware:
    return Hardware(name, peak, hbm, bw, fast, slow, 8, e, _MEM, source, peak_flops_fp32=fp32,
                    matmul_tile=_GPU_TILE, compute_units=sms, memory_reserved=_GPU_RESERVED,
                    kernel_latency=_KERNEL_LATENCY)


def _tpu(name: str, peak: float, hbm: float, bw: float, ici: float, dcn: float, chips: int, source: str) -> Hardware:
    return Hardware(name, peak, hbm, bw, Link(ici, 2e-6, 0.9), Link(dcn, 20e-6, 0.9), chips, _TPU_MM, _MEM,
                    source, matmul_tile=_TPU_TILE, collective_matmul=True, memory_reserved=_TPU_RESERVED)


PRESETS: dict[str, Hardware] = {
    "v100": _gpu("v100", 125 * TB, 15.7 * TB, 32 * GB, 900 * GB, Link(150 * GB, 5e-6, 0.8),
                 Link(12.5 * GB, 10e-6, 0.9), 0.75, 80, _NV + "; NVLink 300 GB/s bidir, IB EDR 100 Gb/s per GPU"),
    "a100": _gpu("a100", 312 * TB, 156 * TB, 80 * GB, 2039 * GB, Link(300 * GB, 5e-6, 0.8),
                 Link(25 * GB, 10e-6, 0.9), 0.869, 108, _NV + "; NVLink3 600 GB/s bidir, 8x200 Gb/s HDR per node"),
    "h100": _gpu("h100", 989 * TB, 494.7 * TB, 80 * GB, 3350 * GB, Link(450 * GB, 5e-6, 0.8),
                 Link(50 * GB, 10e-6, 0.9), 0.803, 132, _NV + "; NVLink4 900 GB/s bidir, 8x400 Gb/s NDR per node"),
    "h200": _gpu("h200", 989 * TB, 494.7 * TB, 141 * GB, 4800 * GB, Link(450 * GB, 5e-6, 0.8),
                 Link(50 * GB, 10e-6, 0.9), 0.803, 132, _NV + "; NVLink4 900 GB/s bidir, 400 Gb/s per GPU"),
    # TPU ICI: per-axis figure is the bandwidth a ring along one torus dimension
    # gets (both directions of that dimension's links). DCN: per chip.
    "tpu-v2": _tpu("tpu-v2", 45 * TB, 16 * GiB, 600 * GB, 62.5 * GB, 3 * GB, 256, _TPU + "; 2-D torus, 256-chip pod"),
    "tpu-v3": _tpu("tpu-v3", 123 * TB, 32 * GiB, 900 * GB, 82 * GB, 3 * GB, 1024,
                   _TPU + "; 2-D torus, up to 1024 chips"),
    "tpu-v4": _tpu("tpu-v4", 275 * TB, 32 * GiB, 1200 * GB, 100 * GB, 6.25 * GB, 4096,
                   _TPU + "; 3-D torus, 6 ICI links of 50 GB/s, up to 4096 chips"),
    "tpu-v5e": _tpu("tpu-v5e", 197 * TB, 16 * GB, 819 * GB, 100 * GB, 3.1 * GB, 256,
                    _TPU + "; 2-D torus ICI 1600 Gb/s per chip, 2x100 Gb/s DCN per 8-chip host"),
    "tpu-v5p": _tpu("tpu-v5p", 459 * TB, 95 * GB, 2765 * GB, 200 * GB, 6.25 * GB, 8960,
                    _TPU + "; 3-D torus ICI 4800 Gb/s per chip, 50 Gb/s DCN per chip"),
    # Simulated CPU devices (tests): nominal figures, only for relative costs. XLA on CPU finishes partial sums
    # with all-reduce + slice, never reduce-scatter; combines the gradient all-reduces into one out-of-place
    # all-reduce after the backward pass; runs bf16 collectives in float32; runs collectives synchronously;
    # keeps a weight gathered for the
    # forward pass alive for the backward pass (one all-gather, CSE'd); and is priced without fusion, as the
    # compiled-program agreement tests count it.
    "cpu-sim": Hardware("cpu-sim", 100e9, 24 * GiB, 20 * GB, Link(10 * GB, 1e-6), Link(1 * GB, 10e-6),
                        8, 1.0, 1.0, "nominal figures for simulated CPU devices", reduce_scatter=False,
                        combined_gradient_all_reduce=True, fusion=False, async_collectives=False,
                        regather_weights=False, float32_collectives=True),
}
"""Hardware presets by name."""

BACKEND_BEHAVIOUR = ("reduce_scatter", "combined_gradient_all_reduce", "fusion", "async_collectives",
                     "regather_weights", "float32_collectives", "collective_matmul")
"""The :class:`Hardware` fields that describe what the compiler and runtime do (see its docstring)."""

_ALIASES = {"tpu-v5litepod": "tpu-v5e", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v4": "tpu-v4", "v3": "tpu-v3",
            "v2": "tpu-v2", "h100-sxm": "h100", "a100-80gb": "a100", "cpu": "cpu-sim"}


def hardware(name: str | Hardware, /, **overrides: Any) -> Hardware:
    """A hardware preset by name (case-insensitive), or a hardware profile file (a name ending in ``.json``,
    or an existing file: see :mod:`layoutsearch.hwprofile`), with figures overridden (``name`` is
    positional only: ``name=`` among the overrides renames the result)."""
    if isinstance(name, Hardware):
        hw = name
    else:
        from layoutsearch.hwprofile import is_profile_path, load_profile  # no JAX; imports this module

        key = name.strip().lower()
        key = _ALIASES.get(key, key)
        if key.endswith(".json") or (key not in PRESETS and is_profile_path(name)):
            hw = load_profile(name)
        elif key not in PRESETS:
            raise HardwareError(f"unknown hardware {name!r} (presets: {', '.join(PRESETS)})")
        else:
            hw = PRESETS[key]
    return hw.replace(**overrides) if overrides else hw
