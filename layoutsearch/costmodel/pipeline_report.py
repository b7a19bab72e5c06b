"""The cost report of a micro-batched step: :class:`PipelineReport` (the step) and :class:`StageReport` (each
stage), with their JSON form, the partition as the executor takes it and a text Gantt chart.

The step is priced by :mod:`layoutsearch.costmodel.pipeline` (its docstring gives the formulas).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layoutsearch.costmodel.costreport import CostReport
from layoutsearch.costmodel.schedule import Schedule
from layoutsearch.gantt import render_gantt
from layoutsearch.ir.names import BLOCK_PREFIX, block_index
from layoutsearch.mesh import Mesh


@dataclass(frozen=True)
class StageReport:
    """One pipeline stage (or the only one, for gradient accumulation): its units and its cost per device.

    ``microbatch_s``: one micro-batch through the stage (forward, backward and recomputation with their
    exposed communication, transfers included); ``once_s``: once per step (gradient all-reduces as exposed
    behind the last micro-batch, and the optimizer); ``memory`` the breakdown of ``memory_bytes``."""

    units: tuple[str, ...]
    microbatch_s: float
    transfer_s: float
    once_s: float
    in_flight: float
    memory_bytes: int
    memory: dict[str, int]
    collectives: tuple[tuple[str, tuple[str, ...], int, int], ...] = ()  # (kind, axes, bytes, count) per step

    @property
    def static_bytes(self) -> int:
        """Parameters, optimizer state and gradients."""
        return sum(self.memory.get(k, 0) for k in ("parameters", "optimizer_state", "gradients"))

    @property
    def activation_bytes(self) -> int:
        """Activations kept for the micro-batches in flight, plus the recomputation workspace."""
        return sum(self.memory.get(k, 0) for k in ("activations", "recompute_workspace"))

    chunks: tuple[tuple[str, ...], ...] = ()
    """The contiguous groups of units the device runs (one, or V with the interleaved schedule)."""
    compute_s: float = 0.0
    """The device's compute over the step: every micro-batch's, the optimizer once."""
    comm_s: float = 0.0
    """The device's communication over the step, hidden or not: every micro-batch's collectives and
    transfers, the once-per-step reductions once."""
    launch_s: float = 0.0
    """The device's kernel launches over the step (GPU: :attr:`CostReport.launch_s` of each micro-batch)."""

    def to_dict(self) -> dict[str, Any]:
        colls = [{"kind": k, "axes": list(a), "bytes": b, "count": c} for k, a, b, c in self.collectives]
        return {"units": list(self.units), "chunks": [list(c) for c in self.chunks or (self.units,)],
                "microbatch_s": self.microbatch_s, "transfer_s": self.transfer_s,
                "once_s": self.once_s, "in_flight": self.in_flight, "memory_bytes": self.memory_bytes,
                "compute_s": self.compute_s, "comm_s": self.comm_s, "kernel_launch_s": self.launch_s,
                "memory": dict(self.memory), "collectives": colls}


@dataclass(frozen=True)
class PipelineReport:
    """Predicted cost of a micro-batched step (see :mod:`layoutsearch.costmodel.pipeline`). ``stage_axis`` None:
    gradient accumulation on one stage."""

    model: str
    mesh: Mesh
    stage_axis: str | None
    schedule: Schedule
    microbatches: int
    remat: str
    inner_layout: str
    stages: tuple[StageReport, ...]
    step_s: float
    tied_s: float
    partition_method: str
    partition_optimal: bool
    inner: CostReport = field(repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def bubble_fraction(self) -> float:
        """Idle fraction of the micro-batch loop with equal stages."""
        return self.schedule.bubble(self.num_stages, self.microbatches)

    @property
    def pipeline_s(self) -> float:
        """The micro-batch loop: ``steps(K, M) * max_k t_k``."""
        return self.schedule.steps(self.num_stages, self.microbatches) * max(s.microbatch_s for s in self.stages)

    @property
    def memory_bytes(self) -> int:
        """Peak memory per device: the largest stage's."""
        return max(s.memory_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.inner.hardware.usable_bytes

    @property
    def compute_s(self) -> float:
        """Compute per device over the step: the busiest stage's (every micro-batch, the optimizer once)."""
        return max(s.compute_s for s in self.stages)

    @property
    def comm_s(self) -> float:
        """Communication per device over the step, hidden or not: the busiest stage's."""
        return max(s.comm_s for s in self.stages)

    @property
    def launch_s(self) -> float:
        """Kernel launches per device over the step: the busiest stage's."""
        return max(s.launch_s for s in self.stages)

    @property
    def model_flops(self) -> float:
        """The step's model FLOPs (as :attr:`CostReport.model_flops`): every micro-batch's."""
        return self.inner.model_flops * self.microbatches

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization of the step over every device of the mesh (as :attr:`CostReport.mfu`)."""
        peak = self.mesh.size * self.inner.hardware.peak_flops * self.step_s
        return self.model_flops / peak if peak > 0 else 0.0

    def layers_per_stage(self, prefix: str = BLOCK_PREFIX) -> tuple[int, ...]:
        """How many ``prefix.i`` blocks each stage runs, the partition as the executor takes it
        (``backend.pipeline.Pipeline(layers_per_stage=...)``): one count per device, or with ``interleaved:V``
        one per chunk in virtual-stage order (chunk ``c`` of device ``k`` is virtual stage ``c K + k``; a chunk
        may have no block, e.g. the embedding alone)."""
        K = self.num_stages
        chunks = [s.chunks or (s.units,) for s in self.stages]
        groups = [chunks[v % K][v // K] for v in range(K * len(chunks[0]))]
        return tuple(sum(block_index(u, prefix) is not None for u in g) for g in groups)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "mesh": str(self.mesh), "stage_axis": self.stage_axis,
            "schedule": str(self.schedule), "stages": self.num_stages, "microbatches": self.microbatches,
            "remat": self.remat, "inner_layout": self.inner_layout, "step_s": self.step_s,
            "pipeline_s": self.pipeline_s, "tied_s": self.tied_s, "memory_bytes": self.memory_bytes,
            "bubble_fraction": self.bubble_fraction, "fits": self.fits, "compute_s": self.compute_s,
            "comm_s": self.comm_s, "kernel_launch_s": self.launch_s, "model_flops": self.model_flops, "mfu": self.mfu,
            "hbm_bytes": self.inner.hardware.hbm_bytes, "usable_bytes": self.inner.hardware.usable_bytes,
            "hardware": self.inner.hardware.name,
            "precision": self.inner.precision, "attention": self.inner.attention,
            "partition": {"method": self.partition_method, "optimal": self.partition_optimal},
            "stage_costs": [s.to_dict() for s in self.stages],
            "microbatch": self.inner.to_dict(ops=False),
        }

    def gantt(self) -> str:
        """The schedule as a text Gantt chart (GPipe, 1F1B or interleaved 1F1B, one tick per chunk), with each
        stage's busy fraction."""
        labels = [f"stage {k} ({' + '.join(f'{c[0]}..{c[-1]}' for c in s.chunks or (s.units,))})"
                  for k, s in enumerate(self.stages)]
        return render_gantt(self.num_stages, self.microbatches, labels=labels,
                            times=[s.microbatch_s for s in self.stages], schedule=self.schedule.kind,
                            virtual=self.schedule.virtual)
