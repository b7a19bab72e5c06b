"""The solvers behind one name: which one ``auto`` picks for a problem, and running it."""

from __future__ import annotations

import itertools
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers import dp, ilp
from layoutsearch.solvers import enumerate as enum
from layoutsearch.solvers.problem import Problem, Solution

SOLVERS = ("auto", "enumerate", "ilp-pulp", "ilp-ortools", "dp")
"""Solver names: ``auto`` picks enumeration for one node, the DP for chains, CBC (``ilp-pulp``) otherwise."""



def solver_for(problem: Problem, solver: str, limit: float | None) -> str:
    """``solver``, or for ``auto``: enumeration for tiny problems, the DP for chains (without a memory limit,
    or small enough for its labels), CBC otherwise. The LP relaxation of the formulation is tight on trees,
    which CBC's LP-based branch and cut exploits: on the ops space of a 4-layer GPT (d_model 1024) CBC proves
    the 3 best plans in 22 s (122k variables, 2 axes) and the best in about 6 min (2.2M variables, 3 axes)
    where CP-SAT, on 2 cores, runs past 10 min on the first and past 20 GiB of memory on the second."""
    if solver != "auto":
        return solver
    if len(problem.unary) == 1 or problem.num_assignments <= 4096:
        return "enumerate"
    shape = dp.chain_order(problem) if all(len(f.nodes) == 2 for f in problem.factors) else None
    if shape is not None:
        hub, order = shape
        sizes = problem.sizes
        work = (sizes[hub] if hub is not None else 1) * sum(sizes[a] * sizes[b] for a, b in itertools.pairwise(order))
        if limit is None or work * max(1, len(problem.mem_rows)) <= 2e5:
            return "dp"
    return "ilp-pulp"


def solve(problem: Problem, solver: str, limit: float | None, top: int, time_limit: float | None,
           hint: tuple[int, ...] | None = None) -> list[Solution]:
    if solver == "enumerate":
        return enum.solve(problem, limit, top)
    if solver == "dp":
        return dp.solve(problem, limit, top)
    if solver in ("ilp-pulp", "ilp-ortools"):
        return ilp.solve(problem, limit, backend=solver[4:], top=top, time_limit=time_limit, hint=hint)
    raise LayoutSearchError(f"unknown solver {solver!r} (known: {', '.join(SOLVERS)})")



def problem_stats(problem: Problem) -> dict[str, Any]:
    return {"nodes": len(problem.unary), "strategies": int(sum(problem.sizes)), "factors": len(problem.factors),
            "memory_rows": len(problem.mem_rows),
            "variables": int(sum(problem.sizes) + sum(f.cost.size for f in problem.factors))}



__all__ = ["SOLVERS", "problem_stats", "solve", "solver_for"]
