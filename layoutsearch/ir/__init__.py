"""The named-dimension graph IR: dims, tensors, ops, graphs, builder, JSON."""

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

__all__ = [
    "DTYPE_BYTES", "ELEMENTWISE_FNS", "OP_KINDS", "ROLES", "CrossEntropy", "CrossEntropyGrad", "Dim", "Einsum",
    "Elementwise", "Gather", "Graph", "GraphBuilder", "LayerNorm", "LayerNormGrad", "Op", "Optimizer", "Reduce", "Ref",
    "Reshape", "ScatterAdd", "Shape", "Softmax", "SoftmaxGrad", "Tensor", "graph_from_dict", "graph_from_json",
    "graph_to_dict", "graph_to_json", "load_graph", "save_graph", "training_graph",
]
