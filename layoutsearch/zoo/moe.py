"""``moe``: a stack of mixture-of-experts feed-forward layers (GShard / Mesh-TF MoE).

Lepikhin et al. 2020 (GShard), Shazeer et al. 2017 and Mesh-TF's ``moe.py``,
with each sequence a routing group (``batch`` is the group dim, ``seq`` the
group size). Each layer, in block ``layer.i``::

    xn       = layer_norm(x) * ln_scale                       [batch, seq, d_model]
    gates    = softmax_experts(xn · gate_w[d_model, experts])  [batch, seq, experts]
    combine  = broadcast(gates)                               [batch, seq, experts, capacity]
    expert_in  = einsum(xn, combine)                          [experts, batch, capacity, d_model]
    expert_h   = relu(expert_in · wi[experts, d_model, d_ff]) [experts, batch, capacity, d_ff]
    expert_out = expert_h · wo[experts, d_ff, d_model]        [experts, batch, capacity, d_model]
    x = x + einsum(expert_out, combine)                       [batch, seq, d_model]

and the loss is the mean squared error of the last ``x`` against ``target``.

What the IR cannot express is the routing *decision*: top-k selection and
the cumsum that assigns tokens to capacity slots produce a 0/1 dispatch mask
and no gradient. Here the dispatch/combine tensor is the gate probabilities
broadcast over ``capacity`` (soft routing). Shapes, FLOPs of every einsum
(including GShard's dense dispatch and combine einsums) and the all-to-alls
that appear when ``batch`` and ``experts`` are split over the same mesh axis
are those of GShard; the function computed is a soft mixture.

``capacity`` defaults to GShard's top-2 with capacity factor 1:
``min(seq, ceil(2 · seq / experts))``.

Parameters: layers · (d_model · experts + 2 · experts · d_model · d_ff + d_model).
"""

from __future__ import annotations

import math

from layoutsearch.ir import Graph, GraphBuilder
from layoutsearch.ir.names import block_name
from layoutsearch.zoo._blocks import check_dtype, check_sizes, norm

NAME = "moe"


def default_capacity(seq: int, experts: int) -> int:
    """Expert capacity per group for top-2 routing with capacity factor 1."""
    return min(seq, math.ceil(2 * seq / experts))


def moe(*, batch: int = 8, seq: int = 16, d_model: int = 32, d_ff: int = 64, experts: int = 4,
        capacity: int | None = None, layers: int = 2, dtype: str = "float32") -> Graph:
    """A stack of MoE feed-forward layers with a real ``experts`` dim on the expert weights."""
    check_sizes(NAME, batch=batch, seq=seq, d_model=d_model, d_ff=d_ff, experts=experts, layers=layers)
    if capacity is None:
        capacity = default_capacity(seq, experts)
    check_sizes(NAME, capacity=capacity)
    check_dtype(NAME, dtype)
    b = GraphBuilder(NAME, dtype=dtype)
    d_batch, d_seq, d_model_d = b.dim("batch", batch), b.dim("seq", seq), b.dim("d_model", d_model)
    d_ff_d, d_exp, d_cap = b.dim("d_ff", d_ff), b.dim("experts", experts), b.dim("capacity", capacity)
    x = b.input("x", [d_batch, d_seq, d_model_d])
    target = b.input("target", [d_batch, d_seq, d_model_d])
    for i in range(layers):
        with b.block(block_name(i)):
            xn = norm(b, x, d_model_d, "ln", bias=False)
            gate_w = b.parameter("gate_w", [d_model_d, d_exp])
            gate_logits = b.einsum([xn, gate_w], [d_batch, d_seq, d_exp], name="gate_logits")
            gates = b.softmax(gate_logits, d_exp, name="gates")
            combine = b.elementwise("identity", [gates], [d_batch, d_seq, d_exp, d_cap], name="combine")
            expert_in = b.einsum([xn, combine], [d_exp, d_batch, d_cap, d_model_d], name="expert_in")
            wi = b.parameter("wi", [d_exp, d_model_d, d_ff_d])
            wo = b.parameter("wo", [d_exp, d_ff_d, d_model_d])
            h = b.einsum([expert_in, wi], [d_exp, d_batch, d_cap, d_ff_d], name="expert_h")
            h = b.relu(h, name="expert_act")
            out = b.einsum([h, wo], [d_exp, d_batch, d_cap, d_model_d], name="expert_out")
            y = b.einsum([out, combine], [d_batch, d_seq, d_model_d], name="combined")
            x = b.binary("add", x, y, name="residual")
    err = b.binary("sub", x, target, name="err")
    loss = b.reduce(b.square(err, name="err_sq"), [], fn="mean", name="loss")
    meta = {"model": NAME, "batch": batch, "seq": seq, "d_model": d_model, "d_ff": d_ff, "experts": experts,
            "capacity": capacity, "layers": layers, "dtype": dtype}
    return b.build(loss, meta=meta)
