"""Precision policies: the dtype of every float tensor of a training step.

A policy says in which dtype the step computes and what it keeps, the way
frameworks train (Micikevicius et al. 2018, "Mixed precision training", ICLR;
Megatron-LM's ``--bf16``; MaxText's ``dtype: bfloat16`` with float32
``weight_dtype``):

====================  ============  ==========  ==========  ==============  ===============
policy                activations   parameters  parameter   master weights  optimizer state
                      and their                 gradients   (the copy the
                      gradients                             optimizer
                                                            updates)
====================  ============  ==========  ==========  ==============  ===============
``mixed``             bfloat16      bfloat16    bfloat16    float32         float32
``mixed-fp32-grads``  bfloat16      bfloat16    float32     float32         float32
``bf16``              bfloat16      bfloat16    bfloat16    none            bfloat16
``fp32``              float32       float32     float32     none            float32
====================  ============  ==========  ==========  ==============  ===============

``mixed`` is the default of the cost model and of the CLI: per parameter 2
bytes of bf16 weights, 2 of bf16 gradients and 12 of float32 optimizer state
(master weights, Adam's m and v), the 16 bytes per parameter of Rajbhandari et
al. 2020 (ZeRO, section 3.1, "K = 12" plus 2 + 2). Collectives move the dtype of
the tensor they carry: gradients are reduced in bf16 under ``mixed``.
``mixed-fp32-grads`` is Megatron-LM's bf16 recipe, which accumulates and
all-reduces the parameter gradients in float32 (its ``main_grad`` buffers,
``--accumulate-allreduce-grads-in-fp32``, required with ``--bf16``): 18 bytes
per parameter, and gradient collectives of 4 bytes per element.

The scalar loss and the per-token losses stay float32 under every policy (the
cross-entropy runs in float32 in Megatron-LM and MaxText).

:func:`with_precision` applies a policy to a forward graph; the training
graph derivation (:func:`layoutsearch.ir.training.training_graph`) adds the
master weights and types the optimizer state.
"""

from __future__ import annotations

from dataclasses import dataclass

from layoutsearch.errors import GraphError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.ops import CrossEntropy
from layoutsearch.ir.tensor import Tensor


@dataclass(frozen=True)
class Precision:
    """A precision policy (see the module docstring). ``master``: dtype of the
    optimizer's copy of each parameter, or None when the optimizer updates the
    parameters themselves."""

    name: str
    compute: str
    params: str
    master: str | None
    optimizer_state: str
    grads: str | None = None
    """dtype of the parameter gradients (None: the parameters')."""

    @classmethod
    def of(cls, spec: Precision | str) -> Precision:
        """``spec`` itself, or the policy named ``spec``."""
        if isinstance(spec, Precision):
            return spec
        if not isinstance(spec, str) or spec not in PRECISIONS:
            raise GraphError(f"unknown precision {spec!r} (known: {', '.join(PRECISIONS)})")
        return PRECISIONS[spec]


PRECISIONS: dict[str, Precision] = {
    "mixed": Precision("mixed", "bfloat16", "bfloat16", "float32", "float32"),
    "mixed-fp32-grads": Precision("mixed-fp32-grads", "bfloat16", "bfloat16", "float32", "float32", "float32"),
    "bf16": Precision("bf16", "bfloat16", "bfloat16", None, "bfloat16"),
    "fp32": Precision("fp32", "float32", "float32", None, "float32"),
}
"""Precision policies by name."""

DEFAULT_PRECISION = "mixed"
"""The policy the cost model, the solvers and the CLI use unless told otherwise."""


def _loss_tensors(graph: Graph) -> set[str]:
    """The loss, the per-token losses (cross-entropy outputs) and everything computed from them only."""
    out = {op.output for op in graph.ops if isinstance(op, CrossEntropy)} | ({graph.loss} if graph.loss else set())
    for op in graph.ops:
        if op.inputs and all(i in out or not graph.tensors[i].is_float for i in op.inputs):
            if any(i in out for i in op.inputs):
                out.add(op.output)
    return out


def with_precision(graph: Graph, precision: Precision | str) -> Graph:
    """``graph`` (a forward graph) with every float tensor in the policy's dtype:
    parameters in ``params``, the loss path in float32, the rest in ``compute``.
    ``meta["precision"]`` records the policy's name."""
    p = Precision.of(precision)
    if any(op.phase != "forward" for op in graph.ops):
        raise GraphError(f"graph {graph.name!r} is a training graph: apply a precision to its forward graph")
    losses = _loss_tensors(graph)

    def dtype(t: Tensor) -> str:
        if not t.is_float:
            return t.dtype
        if t.name in losses:
            return "float32"
        return p.params if t.role == "parameter" else p.compute

    tensors = [t if dtype(t) == t.dtype else Tensor(t.name, t.dims, dtype(t), t.role, t.updates)
               for t in graph.tensors.values()]
    return Graph(graph.name, tensors, graph.ops, loss=graph.loss, meta={**graph.meta, "precision": p.name})


__all__ = ["DEFAULT_PRECISION", "PRECISIONS", "Precision", "with_precision"]
