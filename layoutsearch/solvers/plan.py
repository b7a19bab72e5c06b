"""The result of a search: the chosen layout, its cost, how it was proven, and what it beats."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import LayoutSearchError
from layoutsearch.hwprofile import hardware_from_json, hardware_to_json
from layoutsearch.ir import strictjson
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import DEFAULT_PRECISION
from layoutsearch.ir.serialize import graph_from_dict, graph_to_dict
from layoutsearch.layout import Axes, DimLayout, Layout
from layoutsearch.mesh import PRESETS, Mesh
from layoutsearch.solvers.plan_fields import PlanFields

PLAN_FORMAT = "layoutsearch-plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class Costed:
    """A layout with its predicted cost per device: ``step_s``, the ``compute_s`` and ``comm_s`` (hidden or
    not) it holds, peak ``memory_bytes``, and whether it ``fits`` the memory limit (the device's usable memory
    without one).

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

    def within(self, limit: float | None) -> bool:
        """Whether the peak fits ``limit`` (bytes; None: no limit), up to rounding."""
        return limit is None or self.memory_bytes <= limit * (1 + 1e-12)

    def rules_text(self) -> str:
        from layoutsearch.layout import format_rules

        return format_rules(self.rules) if self.rules is not None else "(per-op layouts)"

    @classmethod
    def from_summary(cls, d: dict[str, Any], layout: Layout) -> Costed:
        """A plan read back from :meth:`summary` (no report) on ``layout``'s mesh."""
        rules = tuple((r[0], tuple(r[1])) for r in d["rules"]) if d.get("rules") is not None else None
        return cls(d["name"], Layout(layout.mesh, rules) if rules is not None else layout, rules, d["step_s"],
                   d["compute_s"], d["comm_s"], d["memory_bytes"], d["fits"], remat=d.get("remat", "none"),
                   microbatches=d.get("microbatches", 1), stage_axis=d.get("stage_axis"),
                   schedule=d.get("schedule"))

    @classmethod
    def from_microbatched(cls, name: str, layout: Layout, rep: Any, limit: float | None,
                          usable_bytes: float) -> Costed:
        """A micro-batched step's :class:`~layoutsearch.costmodel.pipeline.PipelineReport` (gradient accumulation
        or a pipeline) as a plan: compute and communication per device over the step (the busiest stage's:
        every micro-batch's, the optimizer and once-per-step reductions once); it fits ``limit``
        (``usable_bytes``, the device's, without one)."""
        M = rep.microbatches
        fit = limit if limit is not None else usable_bytes
        return cls(name, layout, layout.rules, rep.step_s, rep.compute_s, rep.comm_s,
                   rep.memory_bytes, rep.memory_bytes <= fit, None, rep, remat=rep.remat, microbatches=M,
                   stage_axis=rep.stage_axis, schedule=str(rep.schedule) if rep.stage_axis is not None else None)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "rules": [[d, list(a)] for d, a in self.rules] if self.rules is not None else None,
                "step_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "memory_bytes": self.memory_bytes, "fits": self.fits, "remat": self.remat,
                "microbatches": self.microbatches, "stage_axis": self.stage_axis, "schedule": self.schedule}


@dataclass(frozen=True)
class Decision:
    """One option of a decision the search made besides the layout (``kind``: ``remat``, ``microbatches``
    or ``pipeline``): the best plan with that option (``step_s``, ``memory_bytes``), or, when nothing with
    it fits or none can beat the plans found, ``fits`` False with ``why``, the smallest peak memory when
    known, and ``at_least_s`` when the search proved that every plan with it takes at least that long;
    ``chosen`` when the plan uses it."""

    kind: str
    option: str
    step_s: float | None
    memory_bytes: float | None
    fits: bool
    why: str = ""
    chosen: bool = False
    at_least_s: float | None = None

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
    remat policy, micro-batch count and pipeline option searched; ``cut_short``: what the search's time limit
    cut short, in words (phases not searched, runner-ups not found; empty when nothing was).

    ``graph`` is the training graph the plan was priced on, ``model`` the forward graph searched; the
    settings held fixed (``precision``, ``optimizer``, ``attention``, ``overlap``) are kept so that
    :meth:`compile` runs and :meth:`from_json` re-prices exactly this plan.
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
    model: Graph | None = field(default=None, repr=False)
    precision: str = DEFAULT_PRECISION
    optimizer: str = "adam"
    attention: str = "auto"
    overlap: float | str = "auto"
    cut_short: tuple[str, ...] = ()

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

    @property
    def layers_per_stage(self) -> tuple[int, ...] | None:
        """A pipelined plan's layers per stage (the cost model's partition), else None."""
        return self.report.layers_per_stage() if self.chosen.pipelined and self.report is not None else None

    def compile(self, devices: Sequence[Any] | None = None, *, optimizer: Any = None) -> Any:
        """The plan as a running :class:`~layoutsearch.backend.train.Program` (parameters and optimizer state
        placed by the layout, attention run as priced; ``train_step``, ``loss``, ``random_batch``, ...) on
        ``devices`` (default: the first ``mesh.size`` of ``jax.devices()``). ``optimizer``: an optax
        ``GradientTransformation`` instead of the plan's optimizer. Example::

            plan = ls.search(ls.zoo.gpt(layers=2), "data:2,model:4")
            program = plan.compile()
            state = program.init(seed=0)
            state, metrics = program.train_step(state, program.random_batch(seed=0))
        """
        from layoutsearch.backend.train import Program  # JAX is imported only when a plan is run
        from layoutsearch.costmodel.fusion import resolve_attention

        if self.model is None:
            raise LayoutSearchError("this plan has no forward graph to run (build it with search())")
        c = self.chosen
        return Program(self.model, c.layout.restricted(self.model), remat=c.remat, microbatches=c.microbatches,
                       stage_axis=c.stage_axis, layers_per_stage=self.layers_per_stage, schedule=c.schedule,
                       precision=self.precision, optimizer=optimizer if optimizer is not None else self.optimizer,
                       devices=devices, attention=resolve_attention(self.attention, self.hardware))

    def to_json(self) -> str:
        """The plan as a JSON document that :meth:`from_json` reads back: the forward graph, the hardware,
        the settings, and :meth:`to_dict` (layout, costs, runner-ups, baselines, decisions)."""
        if self.model is None:
            raise LayoutSearchError("this plan has no forward graph to save (build it with search())")
        return strictjson.dumps({"format": PLAN_FORMAT, "version": PLAN_VERSION, "model": graph_to_dict(self.model),
                           "hardware": hardware_to_json(self.hardware),
                           "settings": {"precision": self.precision, "optimizer": self.optimizer,
                                        "attention": self.attention, "overlap": self.overlap},
                           "plan": {k: v for k, v in self.to_dict().items() if k != "search_s"}}, indent=1)
        # the search's wall time stays out: the same search writes the same file, byte for byte

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> Plan:
        """A plan saved by :meth:`to_json`; the chosen plan is priced again by the cost model (its report
        restored; the runner-ups and baselines keep their saved figures). LayoutSearchError naming
        ``source`` for a document that is not a plan."""
        from layoutsearch.solvers.search import price_plan

        doc = strictjson.loads(text, source, LayoutSearchError)
        strictjson.check_tree(doc, source, LayoutSearchError)
        if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
            raise LayoutSearchError(f"{source}: not a layoutsearch plan (no \"format\": \"{PLAN_FORMAT}\")")
        if doc.get("version") != PLAN_VERSION:
            raise LayoutSearchError(f"{source}: plan format version {doc.get('version')!r} "
                                    f"(this layoutsearch reads version {PLAN_VERSION})")
        try:
            model = graph_from_dict(doc["model"], f"{source}: model")
            hw = _label(hardware_from_json(doc["hardware"], f"{source}: hardware"))
            settings, d = doc["settings"], doc["plan"]
            PlanFields(source).check(d)
            lay = d["layout"]
            mesh = Mesh.parse(lay["mesh"])
            if Mesh.parse(d["mesh"]).shape != mesh.shape or d["devices"] != mesh.size:
                raise LayoutSearchError(f"plan.mesh {d['mesh']!r} ({d['devices']} devices) is not the layout's mesh "
                                        f"{lay['mesh']!r}")
            if isinstance(d.get("cost"), dict) and d["cost"].get("mesh", lay["mesh"]) != lay["mesh"]:
                raise LayoutSearchError(f"plan.cost.mesh {d['cost']['mesh']!r} is not the layout's mesh "
                                        f"{lay['mesh']!r}")
            if d["model"] != model.name:
                raise LayoutSearchError(f"plan.model {d['model']!r} is not the model's name {model.name!r}")
            if d["hardware"] != doc["hardware"].get("name"):
                raise LayoutSearchError(f"plan.hardware {d['hardware']!r} is not the hardware's name "
                                        f"{doc['hardware'].get('name')!r}")
            overrides = tuple((n, tuple((k, tuple(v)) for k, v in e.items()))
                              for n, e in (lay.get("overrides") or {}).items())
            rules = tuple((r[0], tuple(r[1])) for r in lay["rules"]) if lay.get("rules") is not None else ()
            train = training_step(model, settings["optimizer"], settings["precision"])
            layout = Layout(mesh, rules, overrides).check(train)  # (per-op layouts name backward tensors too)
            if lay.get("rules") is None:  # per-op layouts: priced op by op, as the ops space prices them
                chosen = _per_op(train, layout, hw, lay.get("iteration"), d["remat"], d["memory_limit"])
            else:
                chosen = price_plan(model, layout, hw, remat=d["remat"], microbatches=d["microbatches"],
                                    stage_axis=d["stage_axis"], schedule=d["schedule"],
                                    memory_limit=d["memory_limit"], **settings)
            plan = cls(train, hw, d["space"],
                       d["solver"], chosen, d["optimal"], d["gap"], d["memory_limit"], d.get("search_s", 0.0),
                       tuple(Costed.from_summary(r, layout) for r in d["runner_ups"]),
                       tuple(Baseline(b["name"], Costed.from_summary(b, layout) if b["applies"] else None,
                                      b.get("why", "")) for b in d["baselines"]),
                       dict(d["problem"]), tuple(Decision(**x) for x in d["decisions"]), model=model,
                       cut_short=tuple(str(x) for x in d.get("cut_short", ())), **settings)
        except LayoutSearchError as e:
            raise LayoutSearchError(str(e) if str(e).startswith(source) else f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise LayoutSearchError(f"{source}: malformed plan file ({type(e).__name__}: {e})") from None
        return plan

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` to ``path``."""
        strictjson.write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """A plan file written by :meth:`save` (LayoutSearchError if unreadable or not a plan)."""
        return cls.from_json(strictjson.read_text(path, "plan file", LayoutSearchError), str(path))

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
            "cut_short": list(self.cut_short),
        }


def _label(hw: Any) -> Any:
    """A plan's hardware as loaded: named as a preset but with figures of its own (``--hw`` overrides, or an
    edited file), it is renamed ``NAME (modified)`` so that nothing takes its figures for the preset's."""
    from layoutsearch.mesh import hardware

    if hw.name not in PRESETS or hardware_to_json(hw) == hardware_to_json(hardware(hw.name)):
        return hw
    return hw.replace(name=f"{hw.name} (modified)")


def _per_op(train: Graph, layout: Layout, hw: Any, iteration: Any, remat: str, limit: float | None) -> Costed:
    """A per-op plan (the ops space's: per-op iteration layouts, every tensor's storage in ``layout``) priced
    again op by op by the cost model's rules (:func:`~layoutsearch.solvers.pricer.evaluate`)."""
    from layoutsearch.ir.remat import check_remat
    from layoutsearch.solvers.pricer import evaluate

    ops, axes = {op.name: op for op in train.ops}, set(layout.mesh.names)
    if not isinstance(iteration, dict) or any(
            name not in ops or not isinstance(lay, dict) or any(
                d not in ops[name].iteration_dims(train.tensors) or not isinstance(a, list) or not set(a) <= axes
                for d, a in lay.items()) for name, lay in iteration.items()):
        raise LayoutSearchError("plan.layout.iteration: expected an object of the training graph's ops, each "
                                "mapping dims to lists of mesh axes")
    its = {name: {d: tuple(a) for d, a in lay.items()} for name, lay in iteration.items()}
    stored = dict(layout.tensors)
    storage = {t: dict(stored.get(t, ())) for t in train.tensors}
    comp, comm, mem = evaluate(train, layout.mesh, hw, its, storage, check_remat(remat))
    fit = limit if limit is not None else hw.usable_bytes
    return Costed("", layout, None, comp + comm, comp, comm, mem, mem <= fit, its, None, remat=remat)
