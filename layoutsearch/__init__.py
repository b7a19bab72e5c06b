"""layoutsearch: find, prove and run the sharding layout of a neural network's training step.

The public API (re-exported from the implementation modules)::

    from layoutsearch import Layout, Mesh, estimate, load_graph
    graph = load_graph("graphs/gpt.json")           # or graphs.build_model("gpt", ...)
    layout = Layout.from_rules(Mesh.parse("data:2,model:4"), "batch:data,d_ff:model")
    report = estimate(graph, layout, "h100", remat="selective")
    report.step_s, report.memory_bytes, report.to_dict()
"""

from layoutsearch.costmodel import CostReport, estimate
from layoutsearch.ir import Graph, GraphBuilder, load_graph, training_graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Hardware, Mesh, hardware

__all__ = [
    "CostReport", "Graph", "GraphBuilder", "Hardware", "Layout", "Mesh", "estimate", "hardware", "load_graph",
    "training_graph",
]
