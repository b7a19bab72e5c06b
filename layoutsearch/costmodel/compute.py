"""Compute time of one op on one device: a roofline with a shape-dependent matmul efficiency.

Model
-----
::

    compute_s = max(flops / rate, hbm_bytes / (hbm_bandwidth * memory_efficiency))
    rate      = peak(dtype) * matmul_efficiency(shape)   for einsums
              = peak_flops                                 for every other op (memory-bound in practice)
    peak(dtype) = Hardware.peak_flops (bf16/fp16), Hardware.peak_flops_fp32 (float32 operands)

The matmul efficiency of a two-operand einsum, seen as a batched matmul
``(batch, m, n, k)`` at the local sizes (:attr:`OpCost.matmul_dims`), is the
preset's best achievable fraction of peak (``Hardware.matmul_efficiency``,
measured on large well-shaped matmuls) times the losses of its shape, as
NVIDIA's "Matrix Multiplication Background User's Guide" (Deep Learning
Performance docs, sections "Tile quantization" and "Wave quantization")
describes them:

* **tile quantization**: the hardware computes whole tiles
  (``Hardware.matmul_tile = (tm, tn, tk)``: the output tile of a GPU kernel,
  or the MXU's 128 x 128 weight tile on a TPU, whose rows stream 8 at a time);
  a dim ``d`` pads to ``t * ceil(d / t)``: factor ``d / (t * ceil(d / t))`` per dim;
* **wave quantization** (GPUs): the ``batch * ceil(m/tm) * ceil(n/tn)`` output
  tiles run in waves of ``Hardware.compute_units`` (streaming multiprocessors);
  a last partial wave costs a full one: factor ``tiles / (units * ceil(tiles / units))``.

Skinny and small matmuls are slowed further by the roofline's HBM term
(``hbm_bytes`` counts the operands and the result). ``cpu-sim`` has tiles of 1
and one unit: its efficiency is the preset's constant.
"""

from __future__ import annotations

import math
from typing import Any

from layoutsearch.costmodel.ops import OpCost
from layoutsearch.mesh import Hardware


def _padding(d: int, tile: int) -> float:
    return d / (tile * math.ceil(d / tile)) if d > 0 else 1.0


def matmul_efficiency(hw: Hardware, dims: tuple[int, int, int, int] | None) -> float:
    """Achieved fraction of peak of a ``(batch, m, n, k)`` matmul on ``hw`` (see the module docstring);
    the preset's constant when the shape is unknown."""
    e = hw.matmul_efficiency
    if dims is None:
        return e
    batch, m, n, k = dims
    tm, tn, tk = hw.matmul_tile
    e *= _padding(m, tm) * _padding(n, tn) * _padding(k, tk)
    if hw.compute_units > 1:
        tiles = max(1, batch) * math.ceil(max(m, 1) / tm) * math.ceil(max(n, 1) / tn)
        e *= tiles / (hw.compute_units * math.ceil(tiles / hw.compute_units))
    return e


def peak_for(hw: Hardware, dtype: str) -> float:
    """Matmul peak FLOP/s for operands of ``dtype``."""
    return hw.peak_flops_fp32 if dtype == "float32" else hw.peak_flops


def compute_seconds(cost: OpCost, hw: Hardware) -> tuple[float, str]:
    """Roofline seconds of one op and what bounds it (``"flops"`` or ``"memory"``)."""
    rate = peak_for(hw, cost.dtype) * matmul_efficiency(hw, cost.matmul_dims) if cost.matmul else hw.peak_flops
    t_flops = cost.flops / rate
    t_mem = hbm_seconds(cost.hbm_bytes, hw)
    return (t_flops, "flops") if t_flops >= t_mem else (t_mem, "memory")


def hbm_seconds(nbytes: Any, hw: Hardware) -> Any:
    """Seconds to move ``nbytes`` through HBM at the achieved bandwidth (the roofline's memory term); a number
    or a numpy array of them."""
    return nbytes / (hw.hbm_bandwidth * hw.memory_efficiency)


def fastest_matmul_rate(hw: Hardware) -> float:
    """An upper bound of any matmul's achieved FLOP/s on ``hw`` (for lower bounds of step time)."""
    return max(hw.peak_flops, hw.peak_flops_fp32) * hw.matmul_efficiency


__all__ = ["compute_seconds", "fastest_matmul_rate", "hbm_seconds", "matmul_efficiency", "peak_for"]
