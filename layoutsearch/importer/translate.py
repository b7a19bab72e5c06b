"""Translate a flattened JAX program (:mod:`layoutsearch.importer.trace`) into an IR graph.

Each value gets one label per axis (:mod:`layoutsearch.importer.labels`); each primitive becomes at most
a few IR ops over named dims:

* ``dot_general`` -> einsum (contracted and batch axes paired by name); ``transpose``, unit reshapes,
  ``squeeze``/``expand_dims``, ``copy``, sharding constraints -> no op (dims are named, not ordered);
* elementwise primitives -> elementwise ops, broadcasting by name: a ``broadcast_in_dim`` is not
  materialized unless a non-elementwise op reads it; scalar constants fold into ``scale``/``shift``
  (or a ``fill`` tensor); ``max(x, 0)`` is ``relu``;
* ``reduce_sum``/``reduce_max`` -> reduce; ``reshape`` splitting or merging dims -> reshape (split parts
  named from ``splits``, else ``name_0``, ``name_1``; merges ``a_b``);
* ``gather`` of whole rows (``table[ids]``, ``jnp.take``) -> gather; static full ``slice`` -> no op;
* the composites of :mod:`layoutsearch.importer.patterns` -> softmax, layer_norm, gelu, cross_entropy,
  mean.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.importer.trace import ELEMENTWISE_PRIMITIVES, Const, Node, Var
from layoutsearch.importer.translate_elementwise import (
    ALIAS_PRIMITIVES,
    COMPARE_PRIMITIVES,
    UNARY_PRIMITIVES,
    ElementwiseRules,
)
from layoutsearch.importer.translate_reduce import ReductionRules
from layoutsearch.importer.translate_shape import ShapeRules
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.training import trained_parameters

BLOCK_PATTERN = re.compile(r"^(layer|layers|block|blocks|h)[._]?\d+$", re.IGNORECASE)
"""Scope names (``jax.named_scope``, Flax module names) that mark a repeated block: ``layer.3``,
``layers_0``, ``Block_2``, ``h.11``."""


class Translator(ElementwiseRules, ShapeRules, ReductionRules):
    """Builds the IR graph of a flattened program, node by node."""

    # -- translation
    def run(self, nodes: Sequence[Node], block_of: Callable[[Node], str | None]) -> None:
        for node in nodes:
            self.node, self.block = node, block_of(node)
            try:
                self._translate(node)
            except GraphError as e:
                if "cannot import primitive" in str(e):
                    raise
                raise GraphError(f"{e} (importing primitive {node.prim!r} at {node.where})") from None

    def _translate(self, node: Node) -> None:
        if node.prim in ELEMENTWISE_PRIMITIVES:  # a constant of one value everywhere is a scalar here
            node.ins = [(a.uniform() or a) if isinstance(a, Const) else a for a in node.ins]
        rule = getattr(self, "_" + node.prim, None)
        if rule is None:
            if node.prim in UNARY_PRIMITIVES:
                fn = UNARY_PRIMITIVES[node.prim]
                self.vals[node.outs[0]] = self.elementwise(fn, node.ins, node.outs[0])
                return
            if node.prim in COMPARE_PRIMITIVES:
                fn = COMPARE_PRIMITIVES[node.prim]
                self.vals[node.outs[0]] = self.elementwise(fn, node.ins, node.outs[0])
                return
            if node.prim in ALIAS_PRIMITIVES:
                self._alias(node)
                return
            raise self.unsupported("the importer has no rule for it")
        out = rule(node)
        if out is not None:
            self.vals[node.outs[0]] = out

    # -- the graph
    def graph(self, name: str, loss: Var, meta: Mapping[str, Any]) -> Graph:
        """The IR graph of everything translated, with ``loss`` (a scalar) as its loss."""
        lv = self.vals[loss]
        if lv.labels or self.tensors[lv.tensor].role != "activation":
            raise GraphError("the function must return a scalar loss computed from its arguments "
                             f"(got a value of shape {list(loss.shape)})")
        graph = self.pending.build(name, lv.tensor, meta, self.constants)
        if not trained_parameters(graph):
            names = meta.get("arguments") or []
            which = ", ".join(repr(names[k]) for k in meta.get("params_argnums", [0]) if k < len(names)) or "0"
            raise GraphError(f"the loss is not differentiable in the parameters (the float arrays of argument "
                             f"{which}): none reaches it but through comparisons, stop_gradient or integer ids"
                             + ("" if graph.parameters else "; the argument holds no float array"))
        return graph


def block_of(node: Node) -> str | None:
    """The repeated block a node belongs to: its scan iteration, else the first scope matching
    :data:`BLOCK_PATTERN`."""
    if node.block:
        return node.block
    for part in node.scope.split("/"):
        part = part.strip("[]")
        if BLOCK_PATTERN.match(part):
            return part
    return None
