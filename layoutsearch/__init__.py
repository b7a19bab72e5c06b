"""layoutsearch: find, prove and run the sharding layout of a neural network's training step.

The public API::

    import layoutsearch as ls

    graph = ls.zoo.gpt(layers=4, d_model=256)          # or ls.zoo.build("gpt", ...), ls.load_graph("graphs/gpt.json")
    mesh = ls.Mesh.parse("data:2,model:4")
    report = ls.estimate(graph, ls.Layout.from_rules(mesh, "batch:data,d_ff:model"), "h100", remat="selective")
    plan = ls.search(graph, mesh, hardware="h100")      # the proven-optimal plan under the H100's memory
    program = plan.compile()                            # a jitted, sharded training step (JAX)
    state = program.init(seed=0)
    state, metrics = program.train_step(state, program.random_batch(seed=0))
    plan.save("plan.json"); ls.Plan.load("plan.json")   # reloads and runs with identical losses

JAX is imported only when a plan is compiled (``Plan.compile``, :mod:`layoutsearch.backend`).
"""

from layoutsearch import zoo
from layoutsearch.costmodel import CostReport, estimate
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import Graph, GraphBuilder, load_graph, training_graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh, hardware
from layoutsearch.solvers import search
from layoutsearch.solvers.pipeline_search import estimate_pipeline
from layoutsearch.solvers.plan import Plan

__all__ = [
    "CostReport", "Graph", "GraphBuilder", "Hardware", "Layout", "LayoutSearchError", "Mesh", "Plan", "estimate",
    "estimate_pipeline", "hardware", "load_graph", "search", "training_graph", "zoo",
]
