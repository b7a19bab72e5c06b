"""The result of a search: the chosen layout, its cost, how it was proven, and what it beats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, DimLayout, Layout


@dataclass(frozen=True)
class Costed:
    """A layout with its predicted cost per device: ``step_s`` = ``compute_s`` + ``comm_s``, peak
    ``memory_bytes``, and whether it ``fits`` the memory limit (the device's HBM without one).

    ``rules``: the global rules when they describe the layout (else None: per-op layouts, see
    ``iteration``); ``report``: the cost model's :class:`~layoutsearch.costmodel.report.CostReport` when the
    layout is expressed by rules and per-tensor entries (always in the rules space), or its
    :class:`~layoutsearch.costmodel.pipeline.PipelineReport` for a micro-batched plan.

    The decisions besides the layout: ``remat`` policy, ``microbatches`` per step (gradient accumulation
    without a ``stage_axis``, pipeline micro-batches with one), ``stage_axis`` and ``schedule`` of a
    pipeline (None: no pipeline)."""

    name: str
    layout: Layout
    rules: tuple[tuple[str, Axes], ...] | None
    step_s: float
    compute_s: float
    comm_s: float
    memory_bytes: int
    fits: bool
    iteration: dict[str, DimLayout] | None = field(default=None, repr=False)
    report: Any = field(default=None, repr=False)
    remat: str = "none"
    microbatches: int = 1
    stage_axis: str | None = None
    schedule: str | None = None

    @property
    def pipelined(self) -> bool:
        return self.stage_axis is not None

    def rules_text(self) -> str:
        from layoutsearch.layout import format_rules

        return format_rules(self.rules) if self.rules is not None else "(per-op layouts)"

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "rules": [[d, list(a)] for d, a in self.rules] if self.rules is not None else None,
                "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "memory_bytes": self.memory_bytes, "fits": self.fits, "remat": self.remat,
                "microbatches": self.microbatches, "stage_axis": self.stage_axis, "schedule": self.schedule}


@dataclass(frozen=True)
class Decision:
    """One option of a decision the search made besides the layout (``kind``: ``remat``, ``microbatches``
    or ``pipeline``): the best plan with that option (``step_s``, ``memory_bytes``), or, when nothing with
    it fits, ``fits`` False with the smallest peak memory when known and ``why``; ``chosen`` when the plan
    uses it."""

    kind: str
    option: str
    step_s: float | None
    memory_bytes: float | None
    fits: bool
    why: str = ""
    chosen: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Baseline:
    """A textbook layout costed on the same mesh, hardware and memory limit (None when it does not apply to
    the model or mesh, with ``why``)."""

    name: str
    plan: Costed | None
    why: str = ""

    def to_dict(self, chosen_step_s: float) -> dict[str, Any]:
        if self.plan is None:
            return {"name": self.name, "applies": False, "why": self.why, "step_s": None, "memory_bytes": None,
                    "fits": False, "ratio": None}
        d = self.plan.summary()
        d["applies"] = True
        d["ratio"] = chosen_step_s / self.plan.step_s if self.plan.step_s > 0 else None
        return d


@dataclass(frozen=True)
class Plan:
    """The layout a search chose, with its proof and comparisons.

    ``chosen``: the plan; ``optimal``: proven optimal in ``space`` (``gap``:
    the relative optimality gap when not, None if unknown); ``runner_ups``:
    the next best plans of the space; ``baselines``: data-parallel, FSDP,
    Megatron-style tensor parallelism and the Mesh-TF 2-D layout on the same
    mesh (each at its fastest remat policy that fits), each with ``ratio`` =
    chosen step time / baseline step time; ``decisions``: the best plan per
    remat policy, micro-batch count and pipeline option searched.
    """

    graph: Graph = field(repr=False)
    hardware: Any = field(repr=False)
    space: str
    solver: str
    chosen: Costed
    optimal: bool
    gap: float | None
    memory_limit: float | None
    search_s: float
    runner_ups: tuple[Costed, ...] = ()
    baselines: tuple[Baseline, ...] = ()
    problem: dict[str, Any] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()

    @property
    def remat(self) -> str:
        """The chosen plan's remat policy."""
        return self.chosen.remat

    @property
    def layout(self) -> Layout:
        return self.chosen.layout

    @property
    def report(self) -> Any:
        return self.chosen.report

    @property
    def step_s(self) -> float:
        return self.chosen.step_s

    @property
    def memory_bytes(self) -> int:
        return self.chosen.memory_bytes

    def to_dict(self, ops: bool = False) -> dict[str, Any]:
        """JSON-ready: layout (rules and every tensor's PartitionSpec), cost (the cost report's JSON, or the
        totals for per-op layouts), solver, optimal, gap, runner-ups and baselines."""
        c = self.chosen
        layout = c.layout.to_dict(self.graph)
        layout["rules"] = [[d, list(a)] for d, a in c.rules] if c.rules is not None else None
        if c.iteration is not None:
            layout["iteration"] = {op: {d: list(a) for d, a in lay.items()} for op, lay in c.iteration.items()}
        cost = (c.report.to_dict() if c.pipelined or c.microbatches > 1 else c.report.to_dict(ops=ops)) \
            if c.report is not None else {
            "step_s": c.step_s, "compute_s": c.compute_s, "comm_s": c.comm_s, "memory_bytes": c.memory_bytes,
            "fits": c.fits}
        return {
            "model": self.graph.name, "mesh": str(c.layout.mesh), "devices": c.layout.mesh.size,
            "hardware": self.hardware.name, "space": self.space, "solver": self.solver, "optimal": self.optimal,
            "gap": self.gap, "memory_limit": self.memory_limit, "remat": self.remat,
            "microbatches": c.microbatches, "stage_axis": c.stage_axis, "schedule": c.schedule,
            "search_s": self.search_s,
            "step_s": c.step_s, "compute_s": c.compute_s, "comm_s": c.comm_s, "memory_bytes": c.memory_bytes,
            "fits": c.fits,
            "layout": layout, "cost": cost,
            "runner_ups": [r.summary() for r in self.runner_ups],
            "baselines": [b.to_dict(c.step_s) for b in self.baselines],
            "decisions": [d.to_dict() for d in self.decisions],
            "problem": dict(self.problem),
        }
