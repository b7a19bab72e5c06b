"""``mlp``: a deep, wide multilayer-perceptron classifier (a non-transformer).

``x[batch, features]`` -> ``layers`` hidden layers (einsum + bias + gelu) ->
logits ``[batch, classes]`` -> mean cross-entropy against ``labels[batch]``.

Hidden activations alternate between two dims of the same size, ``hidden``
and ``hidden2`` (layer ``i`` maps ``hidden``-> ``hidden2`` or back), so every
weight matrix has two distinct named dims and a layout can split the inputs
and the outputs of a layer differently, as Mesh-TF's ``io``/``hidden`` do.
Layer ``i`` is in block ``layer.i``.

Parameters: features · hidden + (layers - 1) · hidden² + hidden · classes
+ layers · hidden + classes.
"""

from __future__ import annotations

from layoutsearch.ir import Graph, GraphBuilder
from layoutsearch.ir.names import block_name
from layoutsearch.zoo._blocks import check_dtype, check_sizes

NAME = "mlp"


def mlp(*, batch: int = 16, features: int = 32, hidden: int = 64, classes: int = 10, layers: int = 3,
        dtype: str = "float32") -> Graph:
    """A ``layers``-deep gelu MLP classifier."""
    check_sizes(NAME, batch=batch, features=features, hidden=hidden, classes=classes, layers=layers)
    check_dtype(NAME, dtype)
    b = GraphBuilder(NAME, dtype=dtype)
    d_batch, d_feat, d_cls = b.dim("batch", batch), b.dim("features", features), b.dim("classes", classes)
    widths = (b.dim("hidden", hidden), b.dim("hidden2", hidden))
    x = b.input("x", [d_batch, d_feat])
    labels = b.input("labels", [d_batch], dtype="int32")
    d_in = d_feat
    for i in range(layers):
        d_out = widths[i % 2]
        with b.block(block_name(i)):
            w = b.parameter("w", [d_in, d_out])
            h = b.einsum([x, w], [d_batch, d_out], name="h")
            h = b.binary("add", h, b.parameter("bias", [d_out]), name="h_biased")
            x = b.gelu(h, name="act")
        d_in = d_out
    w = b.parameter("w_out", [d_in, d_cls])
    logits = b.einsum([x, w], [d_batch, d_cls], name="logits_raw")
    logits = b.binary("add", logits, b.parameter("b_out", [d_cls]), name="logits")
    xent = b.cross_entropy(logits, labels, d_cls, name="xent")
    loss = b.reduce(xent, [], fn="mean", name="loss")
    meta = {"model": NAME, "batch": batch, "features": features, "hidden": hidden, "classes": classes,
            "layers": layers, "dtype": dtype}
    return b.build(loss, meta=meta)
