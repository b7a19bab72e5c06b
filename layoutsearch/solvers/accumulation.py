"""Gradient accumulation searched with the layout: the plans of a step over ``M`` micro-batches, proven per remat
policy by bound-and-price on one micro-batch's rules space with the accumulated step as the objective
(:func:`~.rules_search.accumulated_top`), and the micro-batch counts worth trying."""

from __future__ import annotations

import math

import numpy as np

from layoutsearch.costmodel.step import resized, training_step
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.precision import Precision
from layoutsearch.ir.remat import recomputes_within
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.baselines import baseline_rules, baseline_sets
from layoutsearch.solvers.clock import Deadline, Progress
from layoutsearch.solvers.plan import Costed
from layoutsearch.solvers.pricer import Pricer
from layoutsearch.solvers.rules_search import RulesSearch, accumulated_top, rules_candidates
from layoutsearch.solvers.rulesets import rules_of


def micro_searches(graph: Graph, mesh: Mesh, hw: Hardware, M: int, policies: tuple[str, ...], optimizer: str,
                   precision: Precision | str, attention: str) -> list[RulesSearch]:
    """The rules spaces of one of ``M`` micro-batches of ``graph``'s training step, one per remat policy (in
    the order of ``policies``)."""
    micro = training_step(resized(graph, {"batch": graph.dims["batch"] // M}), optimizer, precision)
    pricer = Pricer(micro, mesh, hw, attention)
    candidates = rules_candidates(micro, mesh, hw, pricer, baseline_sets(baseline_rules(micro, mesh)))
    return [RulesSearch(micro, mesh, hw, pricer, candidates, policy) for policy in policies]


def micro_may_fit(searches: list[RulesSearch], limit: float | None) -> bool:
    """Whether some layout's micro-batch may fit ``limit`` under some policy of ``searches`` (the policy
    recomputing most first: it fits most, and its bound is needed most often)."""
    return any(len(rs.may_fit_among(np.arange(len(rs.cands)), limit)) for rs in reversed(searches))


def accumulated(graph: Graph, mesh: Mesh, hw: Hardware, M: int, searches: list[RulesSearch], limit: float | None,
                 top: int, upper: float | None, optimizer: str, precision: Precision | str, attention: str,
                 overlap: float | str, deadline: Deadline, progress: Progress | None,
                 pruning: dict[str, dict[str, int]] | None = None) -> tuple[list[Costed], bool]:
    """The fastest plans with ``M`` gradient-accumulation micro-batches (with ``upper``: those faster than it),
    proven per remat policy by :func:`~.rules_search.accumulated_top` over the rules space of one micro-batch
    (``searches``: :func:`micro_searches`), each priced as the accumulated step
    (:func:`~layoutsearch.costmodel.pipeline.price_pipeline` without a stage axis). Returns (plans, proven)."""
    from layoutsearch.costmodel.pipeline import price_pipeline

    out: list[Costed] = []
    proven = True
    policies = tuple(rs.remat for rs in searches)
    floors: dict[str, dict[int, float]] = {}  # policy -> candidate -> a lower bound of its accumulated step
    serial = overlap != "auto" or not hw.async_collectives  # priced with no collective overlapping compute
    for i, (policy, rs) in enumerate(zip(policies, searches, strict=True)):
        if out and deadline.passed():
            proven = False
            break
        if progress is not None:
            progress(f"{M} micro-batches, remat {policy}: searching the layout of one micro-batch")

        def price(k: int, rs: RulesSearch = rs, policy: str = policy) -> Costed | None:
            layout = Layout(mesh, rules_of(rs.cands, k, rs.dims, mesh))
            try:
                rep = price_pipeline(graph, layout, hw, stage_axis=None, microbatches=M, remat=policy,
                                     optimizer=optimizer, precision=precision, attention=attention,
                                     overlap=overlap if overlap == "auto" else 0)
            except LayoutSearchError:
                return None
            return Costed.from_microbatched("", layout, rep, limit, hw.usable_bytes)

        steps = sorted(p.step_s for p in out if p.within(limit))
        bound = min(upper if upper is not None else math.inf, steps[top - 1] if len(steps) >= top else math.inf)
        later = [other for other in searches[i + 1:] if recomputes_within(policy, other.remat)]
        plans, ok = accumulated_top(rs, M, price, limit, top, bound if bound < math.inf else None, deadline,
                                    progress, floors, later, serial)
        if pruning is not None:
            pruning[f"{M} micro-batches, remat {policy}"] = rs.pruning(limit)
        out += plans
        proven = proven and ok
    return out, proven


def microbatch_options(batch: int, microbatches: int | str) -> list[int]:
    """Gradient-accumulation micro-batch counts to try beyond 1: the one given, or powers of two dividing
    the batch up to 64."""
    if microbatches != "auto":
        return [int(microbatches)] if int(microbatches) > 1 else []
    return [m for m in (2, 4, 8, 16, 32, 64) if batch % m == 0]


__all__ = ["accumulated", "micro_may_fit", "micro_searches", "microbatch_options"]
