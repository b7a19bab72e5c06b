"""Building blocks shared by the zoo's transformer models, and argument checks.

One pre-LN decoder layer (self-attention + feed-forward, each with a residual)
serves both the Mesh-TF Transformer LM and GPT; their differences are
parameters of :class:`LayerStyle` (biases, layer-norm bias, activation).

Every op is named explicitly, so layer ``i``'s tensors are ``layer.i/<name>``
for the same ``<name>`` in every layer: solvers can match repeated layers by
name as well as by their ``block`` tag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layoutsearch.errors import GraphError
from layoutsearch.ir import DTYPE_BYTES, GraphBuilder, Ref
from layoutsearch.ir.dims import Dim


def check_sizes(model: str, **sizes: int) -> None:
    """Raise GraphError unless every size is a positive integer."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"model {model!r}: {name} must be a positive integer, got {value!r}")


def check_flag(model: str, name: str, value: int) -> None:
    """Raise GraphError unless ``value`` is 0 or 1 (a boolean switch given as an int)."""
    if isinstance(value, bool) or value not in (0, 1):
        raise GraphError(f"model {model!r}: {name} must be 0 or 1, got {value!r}")


def check_dtype(model: str, dtype: str) -> None:
    """Raise GraphError unless ``dtype`` is a floating-point dtype the IR knows."""
    floats = [d for d in DTYPE_BYTES if d != "int32"]
    if dtype not in floats:
        raise GraphError(f"model {model!r}: dtype must be one of {', '.join(floats)}, got {dtype!r}")


@dataclass(frozen=True)
class Dims:
    """The named dims a transformer layer uses."""

    batch: Dim
    seq: Dim
    kv_seq: Dim
    d_model: Dim
    heads: Dim
    d_kv: Dim
    d_ff: Dim


@dataclass(frozen=True)
class LayerStyle:
    """What differs between transformer variants.

    ``bias``: biases on every projection (GPT) or none (Mesh-TF);
    ``norm_bias``: layer norms have a bias as well as a scale;
    ``activation``: the feed-forward nonlinearity (an elementwise function).
    """

    bias: bool = False
    norm_bias: bool = False
    activation: str = "relu"


def norm(b: GraphBuilder, x: Ref, dim: Dim, name: str, bias: bool) -> Ref:
    """Layer norm over ``dim`` followed by a learned scale ``<name>_scale[dim]``
    (and bias ``<name>_bias[dim]`` when ``bias``)."""
    y = b.layer_norm(x, dim, name=name)
    y = b.binary("mul", y, b.parameter(f"{name}_scale", [dim]), name=f"{name}_scaled")
    if bias:
        y = b.binary("add", y, b.parameter(f"{name}_bias", [dim]), name=f"{name}_biased")
    return y


def _project(b: GraphBuilder, inputs: list[Ref], w_name: str, w_dims: list[Dim], out_dims: list[Dim],
             name: str, bias_dims: list[Dim] | None) -> Ref:
    """``einsum(inputs..., w) -> out_dims``, plus a bias over ``bias_dims`` when given."""
    w = b.parameter(w_name, w_dims)
    y = b.einsum([*inputs, w], out_dims, name=name)
    if bias_dims is not None:
        y = b.binary("add", y, b.parameter(f"{w_name}_bias", bias_dims), name=f"{name}_biased")
    return y


def self_attention(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle) -> Ref:
    """Multi-head self-attention of ``x[batch, seq, d_model]`` -> ``[batch, seq, d_model]``.

    Keys and values are projected from ``x`` renamed ``seq -> kv_seq`` (as
    Mesh-TF's ``SelfAttention`` does), so the logits are
    ``[batch, heads, seq, kv_seq]`` and the softmax runs over ``kv_seq``.
    The 1/sqrt(d_kv) scale is applied to the queries (same function as
    scaling the logits, on a smaller tensor). No causal mask: the IR has no
    constant tensors and a mask changes neither shapes, FLOPs nor
    communication.
    """
    bias = style.bias
    x_kv = b.rename(x, d.seq, d.kv_seq, name="attn_kv_input")
    q = _project(b, [x], "wq", [d.d_model, d.heads, d.d_kv], [d.batch, d.seq, d.heads, d.d_kv], "q",
                 [d.heads, d.d_kv] if bias else None)
    k = _project(b, [x_kv], "wk", [d.d_model, d.heads, d.d_kv], [d.batch, d.kv_seq, d.heads, d.d_kv], "k",
                 [d.heads, d.d_kv] if bias else None)
    v = _project(b, [x_kv], "wv", [d.d_model, d.heads, d.d_kv], [d.batch, d.kv_seq, d.heads, d.d_kv], "v",
                 [d.heads, d.d_kv] if bias else None)
    q = b.scale(q, 1.0 / math.sqrt(d.d_kv.size), name="q_scaled")
    logits = b.einsum([q, k], [d.batch, d.heads, d.seq, d.kv_seq], name="attn_logits")
    probs = b.softmax(logits, d.kv_seq, name="attn_probs")
    ctx = b.einsum([probs, v], [d.batch, d.seq, d.heads, d.d_kv], name="attn_context")
    return _project(b, [ctx], "wo", [d.heads, d.d_kv, d.d_model], [d.batch, d.seq, d.d_model], "attn_out",
                    [d.d_model] if bias else None)


def feed_forward(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle) -> Ref:
    """``x[batch, seq, d_model] · wi[d_model, d_ff] -> act -> · wo_ff[d_ff, d_model]``."""
    h = _project(b, [x], "wi", [d.d_model, d.d_ff], [d.batch, d.seq, d.d_ff], "ff_in",
                 [d.d_ff] if style.bias else None)
    h = b.unary(style.activation, h, name="ff_act")
    return _project(b, [h], "wo_ff", [d.d_ff, d.d_model], [d.batch, d.seq, d.d_model], "ff_out",
                    [d.d_model] if style.bias else None)


def decoder_layer(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle) -> Ref:
    """One pre-LN layer: ``x + attn(ln(x))`` then ``x + ff(ln(x))``."""
    h = norm(b, x, d.d_model, "ln_attn", style.norm_bias)
    x = b.binary("add", x, self_attention(b, h, d, style), name="attn_residual")
    h = norm(b, x, d.d_model, "ln_ff", style.norm_bias)
    return b.binary("add", x, feed_forward(b, h, d, style), name="ff_residual")


def decoder_stack(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle, layers: int) -> Ref:
    """``layers`` decoder layers, layer ``i`` in block ``layer.i``."""
    for i in range(layers):
        with b.block(f"layer.{i}"):
            x = decoder_layer(b, x, d, style)
    return x


def lm_loss(b: GraphBuilder, x: Ref, d: Dims, vocab: Dim, out_embed: Ref, labels: Ref, norm_bias: bool) -> Ref:
    """Final layer norm, logits ``x · out_embed`` over ``vocab``, mean cross-entropy.

    ``out_embed`` is ``[vocab, d_model]`` (tied to the input embedding) or
    ``[d_model, vocab]`` (a separate softmax weight): named dims make both the
    same einsum."""
    h = norm(b, x, d.d_model, "final_ln", norm_bias)
    logits = b.einsum([h, out_embed], [d.batch, d.seq, vocab], name="logits")
    xent = b.cross_entropy(logits, labels, vocab, name="xent")
    return b.reduce(xent, [], fn="mean", name="loss")
