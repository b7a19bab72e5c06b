"""The layers and ops spaces, searched from the rules optimum.

The rules optimum is a plan of theirs (their candidates include its projections), so its cost is an upper
bound and :func:`~.problem.prune` drops every strategy whose lower bound exceeds it before the solver runs.
Their plans are priced again by the cost model's op rules (:func:`~.pricer.evaluate`), without overlap; the
better of the two is returned, so a plan is never worse than the rules optimum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.mesh import Hardware, Mesh
from layoutsearch.solvers.axismaps import NONE
from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.clock import Deadline, Progress, TimeUp, reporting
from layoutsearch.solvers.dispatch import problem_stats, solve, solver_for
from layoutsearch.solvers.enumerate import MAX_ASSIGNMENTS
from layoutsearch.solvers.plan import Costed
from layoutsearch.solvers.pricer import Pricer, evaluate
from layoutsearch.solvers.problem import Solution, prune
from layoutsearch.solvers.rules_search import SEARCH_OVERLAP, RulesSearch, costed_rules
from layoutsearch.solvers.rulesets import RuleSets, rules_of
from layoutsearch.solvers.space import Space


def _costed(name: str, g: Graph, mesh: Mesh, hw: Hardware, space: Space, assign: tuple[int, ...],
            limit: float | None, optimizer: str, remat: str = "none", attention: str = "auto") -> Costed:
    """A plan of ``space`` priced as the space prices it (no overlap): by the cost model's report when rules
    describe it, else op by op."""
    rules = space.rules(assign)
    if rules is not None:
        return costed_rules(name, g, mesh, hw, rules, limit, optimizer, remat, attention, SEARCH_OVERLAP)
    fit = limit if limit is not None else hw.usable_bytes
    iteration = space.op_layouts(assign)
    storage = {t: space.storage(assign, t) for t in g.tensors}
    comp, comm, mem = evaluate(g, mesh, hw, iteration, storage, remat)
    return Costed(name, space.layout(assign), None, comp + comm, comp, comm, mem, mem <= fit, iteration, None,
                  remat=remat)



@dataclass(frozen=True)
class FinerResult:
    """The layers or ops space solved from the rules optimum: the chosen plan and the runner-ups, the solver
    used, the proof (``optimal``, ``gap``), the problem's size (``stats``) and what the time limit cut short
    (``cut_short``, in words; empty when nothing)."""

    chosen: Costed
    runner_ups: tuple[Costed, ...]
    solver: str
    optimal: bool
    gap: float | None
    stats: dict[str, Any]
    cut_short: tuple[str, ...] = ()


def solve_finer(g: Graph, mesh: Mesh, hw: Hardware, kind: str, solver: str, limit: float | None, top: int,
                deadline: Deadline, tie: bool, pricer: Pricer, rs: RulesSearch, sub: RuleSets, best: Solution,
                optimizer: str, progress: Progress | None, remat: str = "none", attention: str = "auto"
                ) -> FinerResult:
    """Solve the layers or ops space, starting from the rules optimum ``best`` (an upper bound), within
    ``deadline``: when it passes while the space is built, the rules optimum, not proven; while the solver
    runs, the solver's best plan with its gap."""
    dims = list(g.dims)
    start = sub.take([best.assign[0]])

    def rules_plan() -> Costed:
        return costed_rules("rules optimum", g, mesh, hw, rules_of(sub, best.assign[0], dims, mesh), limit,
                            optimizer, remat, attention, SEARCH_OVERLAP)

    # enumeration, the oracle, evaluates the space as built: refused before pricing when it is too large,
    # not pruned by the bounds it is there to check
    oracle = solver == "enumerate"
    try:
        with reporting(progress, f"{kind} space: building"):
            space, assign = _space(g, mesh, hw, kind, tie, pricer, rs, start, remat, deadline,
                                   MAX_ASSIGNMENTS if oracle else None)
            problem = space.problem
            feasible = problem.fits(assign, limit)
            if oracle:
                reduced, keep = problem, [np.arange(k) for k in problem.sizes]
            else:
                reduced, keep = prune(problem, problem.cost(assign) if feasible else None, limit)
            deadline.check()
    except TimeUp:
        return FinerResult(rules_plan(), (), "enumerate", False, None, {},
                           (f"the {kind} space was not searched: the time limit ran out while it was built "
                            "(the rules optimum is returned, not proven; runner-ups not searched)",))
    hint = None
    if feasible:
        hint = tuple(int(np.nonzero(k == s)[0][0]) for k, s in zip(keep, assign, strict=True))
    name = solver_for(reduced, solver, limit)
    plans = f"the best {top} plans" if top > 1 else "the best plan"
    with reporting(progress, f"{kind} space: solving for {plans} with {name} "
                             f"({problem_stats(reduced)['variables']} variables)"):
        sols = solve(reduced, name, limit, top, deadline.left(), hint)
    stats = problem_stats(reduced) | {"unpruned": problem_stats(problem)}
    cut: tuple[str, ...] = ()
    if deadline.passed() and 0 < len(sols) < top and sols[0].assign:
        cut = (f"runner-ups: the time limit ran out after {len(sols)} of the best {top} plans of the {kind} "
               "space",)
    if not sols[0].assign:
        return FinerResult(rules_plan(), (), name, False, None, stats, cut)
    full = [tuple(int(k[s]) for k, s in zip(keep, sol.assign, strict=True)) for sol in sols]
    costed = [_costed(f"#{i + 1}", g, mesh, hw, space, a, limit, optimizer, remat, attention)
              for i, a in enumerate(full)]
    chosen = costed[0]
    optimal, gap = sols[0].optimal, sols[0].gap
    rules = rules_plan()
    if (rules.fits or not chosen.fits) and rules.step_s < chosen.step_s * (1 - 1e-12):
        # priced by the cost model itself, the rules optimum is better: keep it (see the module docstring)
        costed.insert(0, rules)
        chosen = rules
    return FinerResult(chosen, tuple(costed[1:top]), name, optimal, gap, stats, cut)


def _space(g: Graph, mesh: Mesh, hw: Hardware, kind: str, tie: bool, pricer: Pricer, rs: RulesSearch,
           start: RuleSets, remat: str, deadline: Deadline, max_assignments: int | None
           ) -> tuple[Space, tuple[int, ...]]:
    """The layers or ops space (at most ``max_assignments`` assignments) and the assignment of the rules plan
    ``start`` in it."""
    if kind == "layers":
        # per block: the rule sets the rules search priced (whole-graph roofline bound below its k-th best)
        cands = rs.cands.take(np.nonzero(~np.isnan(rs.cost))[0])
        space = build_space(g, mesh, hw, "layers", tie=tie, rules=cands, pricer=pricer, remat=remat,
                            deadline=deadline, max_assignments=max_assignments)
        r = cands.index(start)
        return space, tuple(r for _ in space.nodes)
    space = build_space(g, mesh, hw, "ops", tie=tie, include=start, pricer=pricer, remat=remat, deadline=deadline,
                        max_assignments=max_assignments)
    return space, locate(space, start)


def locate(space: Space, rules: RuleSets) -> tuple[int, ...]:
    """The assignment of the ops space that lays out every op and tensor as ``rules`` does."""
    out = []
    for node in space.nodes:
        if node.kind == "source":
            m = np.zeros(len(space.dims) + 1, bool)
            m[[space.dims.index(d) for d in node.tensor.dim_names]] = True
            want = rules.project(m)[0]
            hit = np.nonzero((node.storage == want).all(axis=1))[0]
        else:
            op = node.op
            t = space.graph.tensors
            mi = np.zeros(len(space.dims) + 1, bool)
            mi[[space.dims.index(d) for d in op.iteration_dims(t)]] = True
            mo = np.zeros(len(space.dims) + 1, bool)
            mo[[space.dims.index(d) for d in t[op.output].dim_names]] = True
            it = rules.project(mi)[0]
            if isinstance(op, O.Reshape):
                it = np.full_like(it, NONE)
            owns = t[op.output].updates is None
            ot = rules.project(mo)[0] if owns else np.where(mo[it], it, NONE)
            hit = np.nonzero((node.iteration == it).all(axis=1) & (node.output == ot).all(axis=1))[0]
        if not len(hit):
            raise AssertionError(f"node {node.name} lacks the projection of the rules plan")  # pragma: no cover
        out.append(int(hit[0]))
    return tuple(out)


__all__ = ["FinerResult", "locate", "solve_finer"]
