"""The named-dimension graph IR: dims, tensors, ops, graphs, builder, JSON."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

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
_LAZY = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    """The package's names (and its submodules, as when this module imported them all), imported when first read."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"layoutsearch.ir.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name.isidentifier() and importlib.util.find_spec(f"layoutsearch.ir.{name}") is not None:
        return importlib.import_module(f"layoutsearch.ir.{name}")
    raise AttributeError(f"module 'layoutsearch.ir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DTYPE_BYTES", "ELEMENTWISE_FNS", "OP_KINDS", "ROLES", "CrossEntropy", "CrossEntropyGrad", "Dim", "Einsum",
    "Elementwise", "Gather", "Graph", "GraphBuilder", "LayerNorm", "LayerNormGrad", "Op", "Optimizer", "Reduce", "Ref",
    "Reshape", "ScatterAdd", "Shape", "Softmax", "SoftmaxGrad", "Tensor", "graph_from_dict", "graph_from_json",
    "graph_to_dict", "graph_to_json", "load_graph", "save_graph", "training_graph",
]
