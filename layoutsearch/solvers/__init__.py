"""Layout search: strategy spaces compiled to one problem, solved exactly.

* :mod:`.space` / :mod:`.build`: the spaces (Mesh-TF global rules, one rule set per repeated layer, per-op
  layouts with parameter storage) compiled into a :class:`~.problem.Problem`, priced by the cost model;
* :mod:`.enumerate` (the oracle), :mod:`.ilp` (PuLP/CBC, OR-tools CP-SAT), :mod:`.dp` (chains of layers);
* :mod:`.search`: :func:`search` -> :class:`~.plan.Plan`, with runner-ups and baselines;
* :mod:`.partition`: pipeline stages over a cost DAG.
"""

from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.plan import Baseline, Costed, Plan
from layoutsearch.solvers.problem import Problem, Solution
from layoutsearch.solvers.search import SOLVERS, InfeasibleError, baseline_rules, search
from layoutsearch.solvers.space import SPACES, Space

__all__ = ["SOLVERS", "SPACES", "Baseline", "Costed", "InfeasibleError", "Plan", "Problem", "Solution", "Space",
           "baseline_rules", "build_space", "search"]
