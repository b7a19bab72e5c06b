"""Layout search: strategy spaces compiled to one problem, solved exactly.

* :mod:`.space` / :mod:`.build`: the spaces (Mesh-TF global rules, one rule set per repeated layer, per-op
  layouts with parameter storage) compiled into a :class:`~.problem.Problem`, priced by the cost model;
* :mod:`.enumerate` (the oracle), :mod:`.ilp` (PuLP/CBC, OR-tools CP-SAT), :mod:`.dp` (chains of layers);
* :mod:`.dispatch`: which solver ``auto`` picks, and running it;
* :mod:`.search`: :func:`search` -> :class:`~.plan.Plan`, with runner-ups and baselines, built from
  :mod:`.rules_search` (the rules space by bound-and-price), :mod:`.finer` (the layers and ops spaces from the
  rules optimum), :mod:`.baselines` (the textbook layouts) and :mod:`.clock` (progress, the time limit);
* :mod:`.partition`: pipeline stages over a cost DAG; :mod:`.pipeline_search`: choosing the stages of a
  micro-batched step (``estimate_pipeline``) and the joint pipeline search.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from layoutsearch.lazy import lazy_names

if TYPE_CHECKING:
    from layoutsearch.solvers.baselines import baseline_rules
    from layoutsearch.solvers.build import build_space
    from layoutsearch.solvers.dispatch import SOLVERS
    from layoutsearch.solvers.plan import Baseline, Costed, Plan
    from layoutsearch.solvers.problem import Problem, Solution
    from layoutsearch.solvers.search import InfeasibleError, search
    from layoutsearch.solvers.space import SPACES, Space

_LAZY = {  # name -> the submodule that defines it, imported on first use (PEP 562): `partition` alone does not
    # import the layout search and the cost model
    "baseline_rules": "baselines", "build_space": "build", "SOLVERS": "dispatch", "Baseline": "plan",
    "Costed": "plan", "Plan": "plan", "Problem": "problem", "Solution": "problem", "InfeasibleError": "search",
    "SPACES": "space", "Space": "space",
}


__getattr__, __dir__ = lazy_names(__name__, {k: f"{__name__}.{m}" for k, m in _LAZY.items()}, globals())


class _Solvers(types.ModuleType):
    """This package: its ``search`` is the function :func:`.search.search`, also once the submodule of that name
    is imported (which would set the submodule here; eagerly, the function was bound after it)."""

    @property
    def search(self) -> Any:
        from layoutsearch.solvers.search import search

        return search

    @search.setter
    def search(self, value: Any) -> None:  # the import system setting the submodule: the name stays the function
        pass


sys.modules[__name__].__class__ = _Solvers

__all__ = ["SOLVERS", "SPACES", "Baseline", "Costed", "InfeasibleError", "Plan", "Problem", "Solution", "Space",
           "baseline_rules", "build_space", "search"]
