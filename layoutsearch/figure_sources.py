"""Where each figure of each hardware preset comes from: a public document, a measurement, or ``"assumption"``.

:func:`figure_sources` gives, per figure of a :class:`~layoutsearch.mesh.Hardware` (the names ``--hw`` takes),
the source of its value: the document and the figure it states, the microbenchmark that measured it, or the
word ``assumption`` (no public figure; ``layoutsearch calibrate`` measures it on the devices present). A figure
given on the command line (``--hw``) or measured into a hardware profile is sourced as such. ``docs/hardware.md``
gives the same table with the arithmetic from the documents' figures to the presets'.

:func:`assumed_share` says how much of a predicted step rests on assumed figures, for ``cost``'s note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from layoutsearch.mesh import BACKEND_BEHAVIOUR, PRESETS, Hardware, Link

ASSUMPTION = "assumption"
"""The source of a figure no public document or measurement gives."""

_NVIDIA = {
    "v100": "NVIDIA V100 Tensor Core GPU datasheet (SXM2 32GB): 125 TFLOPS fp16 tensor, 15.7 TFLOPS fp32, 32 GB HBM2, "
            "900 GB/s, NVLink 300 GB/s",
    "a100": "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): 312 TFLOPS bf16 dense, 156 TFLOPS TF32 dense, "
            "80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s",
    "h100": "NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense (1,979 with sparsity), 494.7 TF32 "
            "dense, 80 GB HBM3, 3.35 TB/s, NVLink 900 GB/s",
    "h200": "NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense, 494.7 TF32 dense, 141 GB HBM3e, "
            "4.8 TB/s, NVLink 900 GB/s",
}
_SMS = {"v100": "NVIDIA Tesla V100 (Volta) architecture whitepaper: 80 SMs",
        "a100": "NVIDIA A100 (Ampere) architecture whitepaper: 108 SMs",
        "h100": "NVIDIA H100 (Hopper) architecture whitepaper: 132 SMs (SXM5)",
        "h200": "NVIDIA H200 datasheet: the H100 SXM's GH100 with 132 SMs"}
_IB = {"v100": ASSUMPTION,  # (DGX-1: 4 EDR NICs for 8 GPUs; the preset gives each GPU one)
       "a100": "NVIDIA DGX A100 datasheet: 8x 200 Gb/s HDR InfiniBand per 8 GPUs (25 GB/s per GPU)",
       "h100": "NVIDIA DGX H100 datasheet: 8x 400 Gb/s NDR InfiniBand per 8 GPUs (50 GB/s per GPU)",
       "h200": "NVIDIA DGX H200 datasheet: 8x 400 Gb/s NDR InfiniBand per 8 GPUs (50 GB/s per GPU)"}
_MAMF = ("measured: S. Bekman, mamf-finder.py, Machine Learning Engineering Open Book, 'Accelerators' (best large bf16 "
         "GEMM: A100 SXM 271.2 of 312, H100 SXM 794.5 of 989 TFLOPS)")
_GEMM_GUIDE = "NVIDIA Matrix Multiplication Background User's Guide: 128x128 output tiles, k step 64"

_TPU_DOC = {
    "tpu-v2": "Cloud TPU documentation, TPU v2: 45 TFLOPS bf16 per chip, 16 GiB HBM, 600 GB/s; 256-chip pod",
    "tpu-v3": "Cloud TPU documentation, TPU v3: 123 TFLOPS bf16 per chip, 32 GiB HBM, 900 GB/s; 1024-chip pod",
    "tpu-v4": "Cloud TPU documentation, TPU v4: 275 TFLOPS bf16 per chip, 32 GiB HBM, 1,200 GB/s; 4096-chip pod",
    "tpu-v5e": "Cloud TPU documentation, TPU v5e: 197 TFLOPS bf16 per chip, 16 GB HBM, 819 GB/s; 256-chip slice",
    "tpu-v5p": "Cloud TPU documentation, TPU v5p: 459 TFLOPS bf16 per chip, 95 GB HBM, 2,765 GB/s; 8960-chip pod",
}
_ICI = {"tpu-v2": ASSUMPTION, "tpu-v3": ASSUMPTION,
        "tpu-v4": "Cloud TPU documentation, TPU v4: 2,400 Gb/s ICI per chip over 6 links of a 3-D torus (a ring "
                  "along one dimension uses two: 100 GB/s)",
        "tpu-v5e": "Cloud TPU documentation, TPU v5e: 1,600 Gb/s ICI per chip over 4 links of a 2-D torus (two per "
                   "dimension: 100 GB/s)",
        "tpu-v5p": "Cloud TPU documentation, TPU v5p: 4,800 Gb/s ICI per chip over 6 links of a 3-D torus (two per "
                   "dimension: 200 GB/s)"}
_DCN = {"tpu-v2": ASSUMPTION, "tpu-v3": ASSUMPTION, "tpu-v4": ASSUMPTION,  # (v4: v5p's per-chip figure)
        "tpu-v5e": "Cloud TPU documentation, TPU v5e: 2x 100 Gb/s DCN per 8-chip host (3.125 GB/s per chip)",
        "tpu-v5p": "Cloud TPU documentation, TPU v5p: 50 Gb/s DCN per chip"}
_MXU = "Cloud TPU system architecture: the MXU, a 128x128 systolic array (weights n x k), rows streamed 8 at a time"
_BACKEND = "XLA's behaviour on this backend (docs/hardware.md, 'Backend behaviour')"
_LAUNCH_GPU = ("NVIDIA Developer Blog, A. Gray, 'Getting Started with CUDA Graphs' (2019): a 2.9 us kernel launched "
               "back to back on one stream takes 3.8 us per kernel (V100, CUDA 10.1): 0.9 us idle per kernel")
_LAUNCH_TPU = ("0: XLA compiles the step into one TPU program that the TensorCore's scalar unit sequences from its own "
               "instruction memory, no host launch per kernel (Norrie et al. 2021, 'The Design Process for Google's "
               "Training Chips: TPUv2 and TPUv3', IEEE Micro)")


def _preset_sources(name: str) -> dict[str, str]:
    """The sources of preset ``name``'s figures (every figure of :func:`figure_names`)."""
    if name == "cpu-sim":
        return {k: "nominal (simulated CPU devices: only relative costs mean anything)" for k in figure_names()} | {
            k: _BACKEND for k in BACKEND_BEHAVIOUR}
    out = dict.fromkeys(figure_names(), ASSUMPTION)
    out.update({k: _BACKEND for k in BACKEND_BEHAVIOUR})
    out["axis_links"] = "the default: an axis inside a node (slice) takes the fast links (docs/hardware.md)"
    if name in _NVIDIA:
        doc = _NVIDIA[name]
        out.update(peak_flops=doc, peak_flops_fp32=doc, hbm_bytes=doc, hbm_bandwidth=doc, fast_link_bandwidth=doc,
                   compute_units=_SMS[name], matmul_tile=_GEMM_GUIDE, slow_link_bandwidth=_IB[name],
                   devices_per_node="NVIDIA HGX/DGX: 8 GPUs per NVLink/NVSwitch node")
        out["kernel_latency"] = _LAUNCH_GPU
        if name in ("a100", "h100"):
            out["matmul_efficiency"] = _MAMF
    else:
        doc = _TPU_DOC[name]
        out.update(peak_flops=doc, hbm_bytes=doc, hbm_bandwidth=doc, devices_per_node=doc,
                   peak_flops_fp32=f"{doc} (a float32 matmul runs as one bf16 MXU pass: JAX's Precision.DEFAULT)",
                   fast_link_bandwidth=_ICI[name], slow_link_bandwidth=_DCN[name], matmul_tile=_MXU,
                   compute_units="one TensorCore's MXUs work on one matmul together", kernel_latency=_LAUNCH_TPU)
    return out


def figure_names() -> list[str]:
    """Every figure of a :class:`Hardware`, as ``--hw`` names them (link figures ``fast_link_bandwidth`` ...)."""
    names = [f.name for f in dataclasses.fields(Hardware) if f.name not in ("name", "fast_link", "slow_link",
                                                                            "source")]
    return names + [f"{link}_{f.name}" for link in ("fast_link", "slow_link") for f in dataclasses.fields(Link)]


def _flat(hw: Hardware) -> dict[str, Any]:
    """``hw``'s figures by their ``--hw`` names."""
    out = {k: getattr(hw, k) for k in figure_names() if not k.startswith(("fast_link_", "slow_link_"))}
    for link in ("fast_link", "slow_link"):
        out.update({f"{link}_{k}": v for k, v in dataclasses.asdict(getattr(hw, link)).items()})
    return out


def figure_sources(hw: Hardware) -> dict[str, str]:
    """The source of each of ``hw``'s figures: its preset's where the figure is the preset's, ``"given"``
    where it differs from every preset of that name (``--hw``, a profile's own figure: ``"measured"`` when
    the profile says its figures were measured), ``assumption`` otherwise."""
    base = PRESETS.get(hw.name)
    if base is None:  # a profile (calibrate's) or a renamed preset: its figures are its own
        how = "measured" if "calibrate" in (hw.source or "") else "given"
        return dict.fromkeys(figure_names(), f"{how} ({hw.source or hw.name})")
    sources = _preset_sources(base.name)
    preset, mine = _flat(base), _flat(hw)
    for k, v in mine.items():
        if v != preset[k]:
            sources[k] = "given (--hw)"
    return sources


LINK_FIGURES = ("fast_link_efficiency", "slow_link_efficiency", "fast_link_latency", "slow_link_latency")
"""The figures exposed communication rests on beyond the links' bandwidths."""


def assumed_share(report: Any) -> tuple[float, list[str]]:
    """The fraction of ``report``'s step time (a :class:`~layoutsearch.costmodel.costreport.CostReport`) that
    rests on assumed figures, and those figures, most time first: a matmul's time on ``matmul_efficiency``, a
    memory-bound op's on ``memory_efficiency``, exposed communication on the links' efficiencies and
    latencies (beyond the peaks and bandwidths, which datasheets give)."""
    sources = figure_sources(report.hardware)
    if not report.step_s > 0:
        return 0.0, []
    assumed: dict[str, float] = {}
    for op in report.ops:
        figure = "memory_efficiency" if op.bound == "memory" else "matmul_efficiency" if op.matmul else None
        if figure is not None and sources[figure] == ASSUMPTION:
            assumed[figure] = assumed.get(figure, 0.0) + op.compute_s
    links = [f for f in LINK_FIGURES if sources[f] == ASSUMPTION]
    if links and report.comm_exposed_s > 0:
        assumed["the links' " + ("efficiencies and latencies" if len(links) > 2 else ", ".join(links))] = \
            report.comm_exposed_s
    return min(1.0, sum(assumed.values()) / report.step_s), sorted(assumed, key=lambda k: -assumed[k])


__all__ = ["ASSUMPTION", "LINK_FIGURES", "assumed_share", "figure_names", "figure_sources"]
