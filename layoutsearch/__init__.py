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
    graph = ls.from_jax(loss_fn, params, batch, dims=(param_dims, batch_dims))  # your own JAX/Flax model

JAX is imported only when a plan is compiled (``Plan.compile``, :mod:`layoutsearch.backend`) or a
function imported (``from_jax``, :mod:`layoutsearch.importer`). The names above are imported when first
used: ``import layoutsearch`` itself imports nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layoutsearch.lazy import lazy_names

if TYPE_CHECKING:
    from layoutsearch import zoo
    from layoutsearch.costmodel import CostReport, estimate
    from layoutsearch.errors import LayoutSearchError
    from layoutsearch.ir import Graph, GraphBuilder, load_graph, training_graph
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Hardware, Mesh, hardware
    from layoutsearch.solvers.pipeline_search import estimate_pipeline
    from layoutsearch.solvers.plan import Plan
    from layoutsearch.solvers.search import search

_LAZY = {  # public name -> the module that defines it, imported on first use (so that `layoutsearch --help` and
    # the commands that need neither the cost model nor a solver start fast: docs/architecture.md)
    "CostReport": "layoutsearch.costmodel", "estimate": "layoutsearch.costmodel",
    "LayoutSearchError": "layoutsearch.errors",
    "Graph": "layoutsearch.ir", "GraphBuilder": "layoutsearch.ir", "load_graph": "layoutsearch.ir",
    "training_graph": "layoutsearch.ir",
    "Layout": "layoutsearch.layout",
    "Hardware": "layoutsearch.mesh", "Mesh": "layoutsearch.mesh", "hardware": "layoutsearch.mesh",
    "estimate_pipeline": "layoutsearch.solvers.pipeline_search",
    "Plan": "layoutsearch.solvers.plan",
    "search": "layoutsearch.solvers.search",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


def from_jax(fn: Any, *args: Any, **kwargs: Any) -> Graph:
    """The forward graph of the JAX function ``fn(*args)`` (a scalar loss), dims named by ``dims=``:
    :func:`layoutsearch.importer.from_jax` (docs/import.md)."""
    from layoutsearch.importer import from_jax as _from_jax

    return _from_jax(fn, *args, **kwargs)


__all__ = [
    "CostReport", "Graph", "GraphBuilder", "Hardware", "Layout", "LayoutSearchError", "Mesh", "Plan", "estimate",
    "estimate_pipeline", "from_jax", "hardware", "load_graph", "search", "training_graph", "zoo",
]
