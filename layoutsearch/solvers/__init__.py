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

from layoutsearch.solvers.baselines import baseline_rules
from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.dispatch import SOLVERS
from layoutsearch.solvers.plan import Baseline, Costed, Plan
from layoutsearch.solvers.problem import Problem, Solution
from layoutsearch.solvers.search import InfeasibleError, search
from layoutsearch.solvers.space import SPACES, Space

__all__ = ["SOLVERS", "SPACES", "Baseline", "Costed", "InfeasibleError", "Plan", "Problem", "Solution", "Space",
           "baseline_rules", "build_space", "search"]
