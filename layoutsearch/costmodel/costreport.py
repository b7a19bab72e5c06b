"""The cost report of one training step: :class:`CollectiveRecord` (one collective and its cause),
:class:`OpReport` (one op execution) and :class:`CostReport` (the step's totals, their breakdowns by cause and
its JSON form), as :func:`~layoutsearch.costmodel.report.estimate` returns them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.costmodel.memory import MemoryReport
from layoutsearch.costmodel.ops import OpCost, OpWork
from layoutsearch.costmodel.overlap import Overlap
from layoutsearch.costmodel.render import render_report
from layoutsearch.ir.names import fold_block_numbers
from layoutsearch.mesh import Hardware, Mesh

PHASES = ("forward", "backward", "optimizer", "recompute")
"""Phases of a step in a report (``recompute``: forward ops run again by remat)."""


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of the step: the op that causes it, what and why.

    ``bytes``: payload per device (conventions of
    :mod:`~layoutsearch.costmodel.collectives`); ``link_bytes``: bytes each
    device sends over each axis; ``cause``: the tensor and dims behind it."""

    op: str
    phase: str
    kind: str
    axes: tuple[str, ...]
    bytes: int
    seconds: float
    tensor: str
    cause: str
    link_bytes: dict[str, float] = field(hash=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "phase": self.phase, "kind": self.kind, "axes": list(self.axes), "bytes": self.bytes,
                "seconds": self.seconds, "tensor": self.tensor, "cause": self.cause}


@dataclass(frozen=True)
class OpReport(OpWork):
    """Per-device cost of one op execution: ``bound`` is ``"flops"`` or ``"memory"``
    (which roofline term set ``compute_s``); ``collectives`` its communication; ``kernels`` the kernels it
    launches (1 when it starts one, :attr:`FusionPlan.kernels <layoutsearch.costmodel.fusion.FusionPlan>`) and
    ``launch_s`` the compute stream's idle time for them (:attr:`Hardware.kernel_latency` each)."""

    compute_s: float
    bound: str
    collectives: tuple[CollectiveRecord, ...]
    output: str = ""
    kernels: int = 0
    launch_s: float = 0.0

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def seconds(self) -> float:
        return self.compute_s + self.comm_s

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "phase": self.phase, "block": self.block, "flops": self.flops,
                "hbm_bytes": self.hbm_bytes, "matmul": self.matmul, "compute_s": self.compute_s,
                "bound": self.bound, "comm_s": self.comm_s, "launch_s": self.launch_s}


def _residue_to_zero(seconds: float, scale: float) -> float:
    """``seconds``, or 0 when it is a floating-point residue of a difference of sums about ``scale``."""
    return 0.0 if abs(seconds) <= 1e-12 * max(abs(scale), 1e-30) else seconds


@dataclass(frozen=True)
class CostReport:
    """Predicted cost of one training step of ``model`` under ``layout`` on ``hardware``.

    Times in seconds, bytes and FLOPs per device unless named global (see the
    module docstring for the model). ``ops``: one entry per executed op, in
    schedule order (recomputed ops appear again with phase ``recompute``).
    ``launch_s``: the compute stream's idle time between its ``kernels`` kernels (GPU kernel launches).
    """

    model: str
    mesh: Mesh
    devices: int
    layout: str
    hardware: Hardware = field(repr=False)
    optimizer: str
    precision: str
    remat: str
    attention: str
    overlap: float | str
    compute_s: float
    comm_s: float
    step_s: float
    flops_per_device: float
    model_flops: float
    mfu: float
    bytes_per_axis: dict[str, float]
    memory: MemoryReport
    ops: tuple[OpReport, ...] = field(repr=False)
    exposure: Overlap | None = field(default=None, repr=False)
    launch_s: float = 0.0
    kernels: int = 0
    op_costs: tuple[OpCost, ...] = field(default=(), repr=False, compare=False)
    """The op rules' cost of every op of the training graph, each with all its collectives (the input of the
    memory simulation), for callers that split the step further (pipeline stages)."""

    @property
    def comm_exposed_s(self) -> float:
        """Communication on the critical path: ``step_s - compute_s - launch_s`` (a rounding residue: 0)."""
        return _residue_to_zero(self.step_s - self.compute_s - self.launch_s, self.step_s)

    @property
    def comm_hidden_s(self) -> float:
        """Communication hidden behind compute (a rounding residue: 0)."""
        return _residue_to_zero(self.comm_s - self.comm_exposed_s, self.step_s)

    @property
    def memory_bytes(self) -> int:
        """Peak memory per device."""
        return self.memory.peak_bytes

    @property
    def fits(self) -> bool:
        """Whether the peak fits in the device's usable memory (:attr:`Hardware.usable_bytes`)."""
        return self.memory.peak_bytes <= self.hardware.usable_bytes

    @property
    def collectives(self) -> list[CollectiveRecord]:
        """Every collective of the step, in schedule order."""
        return [c for op in self.ops for c in op.collectives]

    def bytes_by_kind(self) -> dict[str, int]:
        """Payload bytes per device per step, by collective kind."""
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[c.kind] += c.bytes
        return dict(sorted(out.items()))

    def by_phase(self) -> dict[str, dict[str, float]]:
        """Compute, kernel-launch and communication seconds and FLOPs per device, by phase."""
        out = {p: {"compute_s": 0.0, "launch_s": 0.0, "comm_s": 0.0, "flops": 0.0} for p in PHASES}
        for op in self.ops:
            d = out[op.phase]
            d["compute_s"] += op.compute_s
            d["launch_s"] += op.launch_s
            d["comm_s"] += op.comm_s
            d["flops"] += op.flops
        return {p: d for p, d in out.items() if any(d.values())}

    def compute_by_bound(self) -> dict[str, float]:
        """Compute seconds split by what bounds them: matmul FLOPs, other FLOPs, HBM bandwidth."""
        out = {"matmul": 0.0, "other_flops": 0.0, "memory": 0.0}
        for op in self.ops:
            key = "memory" if op.bound == "memory" else "matmul" if op.matmul else "other_flops"
            out[key] += op.compute_s
        return out

    def comm_groups(self) -> list[dict[str, Any]]:
        """Collectives grouped by (kind, axes): count, bytes, seconds, and their causes
        (with layer numbers folded, ``layer.*``), largest time first."""
        groups: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        for c in self.collectives:
            g = groups.setdefault((c.kind, c.axes), {"kind": c.kind, "axes": list(c.axes), "count": 0, "bytes": 0,
                                                      "seconds": 0.0, "causes": defaultdict(lambda: [0, 0, 0.0])})
            g["count"] += 1
            g["bytes"] += c.bytes
            g["seconds"] += c.seconds
            cause = g["causes"][(c.phase, fold_block_numbers(c.cause))]
            cause[0] += 1
            cause[1] += c.bytes
            cause[2] += c.seconds
        out = []
        for g in sorted(groups.values(), key=lambda g: -g["seconds"]):
            causes = [{"phase": p, "cause": why, "count": n, "bytes": b, "seconds": s}
                      for (p, why), (n, b, s) in g["causes"].items()]
            out.append({**g, "causes": sorted(causes, key=lambda c: -c["seconds"])})
        return out

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        """JSON-ready report; ``ops=False`` leaves out the per-op and per-collective lists."""
        hw = self.hardware
        d: dict[str, Any] = {
            "model": self.model, "mesh": str(self.mesh), "devices": self.devices, "layout": self.layout,
            "optimizer": self.optimizer, "precision": self.precision, "remat": self.remat,
            "attention": self.attention, "overlap": self.overlap,
            "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
            "kernel_launch_s": self.launch_s, "kernels": self.kernels,
            "comm_exposed_s": self.comm_exposed_s, "comm_hidden_s": self.comm_hidden_s,
            "overlap_by_class": self.exposure.to_dict()["by_class"] if self.exposure else None,
            "memory_bytes": self.memory_bytes, "fits": self.fits,
            "flops_per_device": self.flops_per_device, "model_flops": self.model_flops, "mfu": self.mfu,
            "bytes_per_axis": dict(self.bytes_per_axis), "bytes_by_kind": self.bytes_by_kind(),
            "compute_by_bound_s": self.compute_by_bound(), "phases": self.by_phase(),
            "memory": self.memory.to_dict(), "comm_groups": self.comm_groups(),
            "hardware": {
                "name": hw.name, "peak_flops": hw.peak_flops, "matmul_efficiency": hw.matmul_efficiency,
                "hbm_bytes": hw.hbm_bytes, "usable_bytes": hw.usable_bytes, "hbm_bandwidth": hw.hbm_bandwidth,
                "memory_efficiency": hw.memory_efficiency, "kernel_latency": hw.kernel_latency,
                "reduce_scatter": hw.reduce_scatter,
                "links": {a: {"kind": "fast" if link == hw.fast_link else "slow", "bandwidth": link.bandwidth,
                              "efficiency": link.efficiency, "latency": link.latency}
                          for a, link in hw.links_for(self.mesh).items()},
                "source": hw.source,
            },
        }
        if ops:
            d["collectives"] = [c.to_dict() for c in self.collectives]
            d["ops"] = [o.to_dict() for o in self.ops]
        return d

    def render(self, top: int = 15) -> list[Any]:
        """Rich renderables (strings and tables) of the report; see :func:`render_report`."""
        return render_report(self.to_dict(), top=top)

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=160, record=True, file=_Null(), force_terminal=False, highlight=False,
                          markup=False, emoji=False)
        for item in self.render():
            console.print(item)
        return "\n".join(line.rstrip() for line in console.export_text().splitlines())


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


__all__ = ["PHASES", "CollectiveRecord", "CostReport", "OpReport"]
