"""The named-dimension graph IR: dims, tensors, ops, graphs, builder, JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from layoutsearch.lazy import lazy_names

if TYPE_CHECKING:
    from layoutsearch.ir.builder import GraphBuilder, Ref
    from layoutsearch.ir.dims import Dim, Shape
    from layoutsearch.ir.graph import Graph
    from layoutsearch.ir.ops import (
        ELEMENTWISE_FNS,
        OP_KINDS,
        CrossEntropy,
        CrossEntropyGrad,
        Einsum,
        Elementwise,
        Gather,
        LayerNorm,
        LayerNormGrad,
        Op,
        Reduce,
        Reshape,
        ScatterAdd,
        Softmax,
        SoftmaxGrad,
    )
    from layoutsearch.ir.serialize import (
        graph_from_dict,
        graph_from_json,
        graph_to_dict,
        graph_to_json,
        load_graph,
        save_graph,
    )
    from layoutsearch.ir.tensor import DTYPE_BYTES, ROLES, Tensor
    from layoutsearch.ir.training import Optimizer, training_graph

_MODULES = {  # submodule -> the names it gives this package, imported on first use (PEP 562): reading a JSON
    # file with `ir.strictjson` or a policy of `ir.remat` does not import the graph, networkx or numpy
    "builder": ("GraphBuilder", "Ref"),
    "dims": ("Dim", "Shape"),
    "graph": ("Graph",),
    "ops": ("ELEMENTWISE_FNS", "OP_KINDS", "CrossEntropy", "CrossEntropyGrad", "Einsum", "Elementwise", "Gather",
            "LayerNorm", "LayerNormGrad", "Op", "Reduce", "Reshape", "ScatterAdd", "Softmax", "SoftmaxGrad"),
    "serialize": ("graph_from_dict", "graph_from_json", "graph_to_dict", "graph_to_json", "load_graph", "save_graph"),
    "tensor": ("DTYPE_BYTES", "ROLES", "Tensor"),
    "training": ("Optimizer", "training_graph"),
}
__getattr__, __dir__ = lazy_names(__name__, {name: f"{__name__}.{module}" for module, names in _MODULES.items()
                                             for name in names}, globals())


__all__ = [
    "DTYPE_BYTES", "ELEMENTWISE_FNS", "OP_KINDS", "ROLES", "CrossEntropy", "CrossEntropyGrad", "Dim", "Einsum",
    "Elementwise", "Gather", "Graph", "GraphBuilder", "LayerNorm", "LayerNormGrad", "Op", "Optimizer", "Reduce", "Ref",
    "Reshape", "ScatterAdd", "Shape", "Softmax", "SoftmaxGrad", "Tensor", "graph_from_dict", "graph_from_json",
    "graph_to_dict", "graph_to_json", "load_graph", "save_graph", "training_graph",
]
