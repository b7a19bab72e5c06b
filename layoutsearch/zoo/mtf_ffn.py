"""``mtf-ffn``: the two fully-connected layers of the Mesh-TensorFlow paper.

Shazeer et al. 2018, "Mesh-TensorFlow: Deep Learning for Supercomputers",
section 2 / Table 1::

    h = x[batch, io] · w[io, hidden]        (tensor ``h``, before the relu)
    y = relu(h) · v[hidden, io]             (tensor ``y``)
    loss = mean over batch, io of (y - target)^2

Parameters: 2 · io · hidden.
"""

from __future__ import annotations

from layoutsearch.ir import Graph, GraphBuilder
from layoutsearch.zoo._blocks import check_dtype, check_sizes

NAME = "mtf-ffn"


def mtf_ffn(*, batch: int = 16, io: int = 32, hidden: int = 64, dtype: str = "float32") -> Graph:
    """The Mesh-TF two-layer feed-forward network with a squared-error loss."""
    check_sizes(NAME, batch=batch, io=io, hidden=hidden)
    check_dtype(NAME, dtype)
    b = GraphBuilder(NAME, dtype=dtype)
    d_batch, d_io, d_hidden = b.dim("batch", batch), b.dim("io", io), b.dim("hidden", hidden)
    x = b.input("x", [d_batch, d_io])
    target = b.input("target", [d_batch, d_io])
    w = b.parameter("w", [d_io, d_hidden])
    v = b.parameter("v", [d_hidden, d_io])
    h = b.einsum([x, w], [d_batch, d_hidden], name="h")
    y = b.einsum([b.relu(h, name="h_relu"), v], [d_batch, d_io], name="y")
    err = b.binary("sub", y, target, name="err")
    loss = b.reduce(b.square(err, name="err_sq"), [], fn="mean", name="loss")
    meta = {"model": NAME, "batch": batch, "io": io, "hidden": hidden, "dtype": dtype}
    return b.build(loss, meta=meta)
