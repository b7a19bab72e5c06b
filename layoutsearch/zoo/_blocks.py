"""Building blocks shared by the zoo's transformer models, and argument checks.

One pre-LN decoder layer (self-attention + feed-forward, each with a residual)
serves both the Mesh-TF Transformer LM and GPT; their differences are
parameters of :class:`LayerStyle` (biases, layer-norm bias, activation, gated
feed-forward, RMSNorm, parallel attention and feed-forward), of :class:`Dims`
(grouped-query attention) and an optional :class:`Rotary` position encoding.

Every op is named explicitly, so layer ``i``'s tensors are ``layer.i/<name>``
for the same ``<name>`` in every layer: solvers can match repeated layers by
name as well as by their ``block`` tag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layoutsearch.errors import GraphError
from layoutsearch.ir import GraphBuilder, Ref
from layoutsearch.ir.dims import MAX_DIM_SIZE, Dim, short_repr
from layoutsearch.ir.names import block_name
from layoutsearch.ir.tensor import FLOAT_DTYPES

MAX_LAYERS = 10_000
"""The most layers a zoo model is built with (its graph grows with them)."""


def check_sizes(model: str, **sizes: int) -> None:
    """Raise GraphError unless every size is a positive integer of at most
    :data:`~layoutsearch.ir.dims.MAX_DIM_SIZE` (``2**40``; ``layers``: at most 10,000)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"model {model!r}: {name} must be a positive integer, got {short_repr(value)}")
        limit, text = (MAX_LAYERS, f"{MAX_LAYERS:,}") if name == "layers" else (MAX_DIM_SIZE, f"2**40 ({MAX_DIM_SIZE:,})")
        if value > limit:
            raise GraphError(f"model {model!r}: {name} must be at most {text}, got {short_repr(value)}")


def check_flag(model: str, name: str, value: int) -> None:
    """Raise GraphError unless ``value`` is 0 or 1 (a boolean switch given as an int)."""
    if isinstance(value, bool) or value not in (0, 1):
        raise GraphError(f"model {model!r}: {name} must be 0 or 1, got {value!r}")


def check_dtype(model: str, dtype: str) -> None:
    """Raise GraphError unless ``dtype`` is a floating-point dtype the IR knows."""
    floats = list(FLOAT_DTYPES)
    if dtype not in floats:
        raise GraphError(f"model {model!r}: dtype must be one of {', '.join(floats)}, got {dtype!r}")


@dataclass(frozen=True)
class Dims:
    """The named dims a transformer layer uses.

    Multi-head attention: ``heads`` (queries, keys and values have one head
    dim). Grouped-query attention (Ainslie et al. 2023; multi-query: one KV
    head): ``heads=None`` and the query heads are ``kv_heads`` x ``q_per_kv``,
    keys and values have ``kv_heads`` only."""

    batch: Dim
    seq: Dim
    kv_seq: Dim
    d_model: Dim
    heads: Dim | None
    d_kv: Dim
    d_ff: Dim
    kv_heads: Dim | None = None
    q_per_kv: Dim | None = None

    @property
    def q_heads(self) -> list[Dim]:
        """The head dims of the queries (and of the attention logits, context and ``wo``)."""
        if self.kv_heads is not None and self.q_per_kv is not None:
            return [self.kv_heads, self.q_per_kv]
        assert self.heads is not None
        return [self.heads]

    @property
    def kv_head_dims(self) -> list[Dim]:
        """The head dims of the keys and values."""
        if self.kv_heads is not None:
            return [self.kv_heads]
        assert self.heads is not None
        return [self.heads]


@dataclass(frozen=True)
class LayerStyle:
    """What differs between transformer variants.

    ``bias``: biases on every projection (GPT) or none (Mesh-TF);
    ``norm_bias``: layer norms have a bias as well as a scale;
    ``activation``: the feed-forward nonlinearity (an elementwise function);
    ``gated``: gated feed-forward ``act(x · wi_gate) * (x · wi_up)`` (GLU
    variants, Shazeer 2020: SwiGLU with ``silu``) instead of ``act(x · wi)``;
    ``rms_norm``: RMSNorm (no mean subtraction) instead of layer norm;
    ``parallel``: ``x + attn(ln(x)) + ff(ln(x))`` with one norm (PaLM) instead
    of the sequential ``x + attn(ln(x))`` then ``x + ff(ln(x))``;
    ``dropout``: the rate of dropout (:func:`dropout`) on the attention
    probabilities and on the attention and feed-forward outputs before their
    residual adds (Megatron-LM's attention and hidden dropout); 0: none (no op).
    """

    bias: bool = False
    norm_bias: bool = False
    activation: str = "relu"
    gated: bool = False
    rms_norm: bool = False
    parallel: bool = False
    dropout: float = 0.0


@dataclass(frozen=True)
class Rotary:
    """Rotary position embedding (RoPE, Su et al. 2021) as a rotation table.

    ``d_kv`` is split into ``rope_half`` (2: first or second half) x
    ``rope_freq`` (d_kv / 2), and each pair ``(x[i], x[i + d_kv/2])`` is
    rotated by the angle of its position and frequency: one einsum with the
    table ``rope[seq, rope_out, rope_half, rope_freq]`` (``[[cos, -sin], [sin,
    cos]]`` per position and frequency; ``q_table``), and with the table
    renamed ``seq -> kv_seq`` for keys (``kv_table``). This is
    ``x * cos + rotate_half(x) * sin`` (GPT-NeoX / Llama layout of the pairs)."""

    q_table: Ref
    kv_table: Ref
    half: Dim
    out: Dim
    freq: Dim


def norm(b: GraphBuilder, x: Ref, dim: Dim, name: str, bias: bool, center: bool = True) -> Ref:
    """Layer norm (RMSNorm unless ``center``) over ``dim`` followed by a learned
    scale ``<name>_scale[dim]`` (and bias ``<name>_bias[dim]`` when ``bias``)."""
    y = b.layer_norm(x, dim, name=name, center=center)
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


DROPOUT_SITES = ("attn_probs", "attn_out", "ff_out")
"""Where a layer drops out (:attr:`LayerStyle.dropout`): the attention probabilities, the attention
output and the feed-forward output."""


def dropout_seed(layer: int, site: str) -> int:
    """The seed of layer ``layer``'s dropout mask at ``site`` (one of :data:`DROPOUT_SITES`): distinct for
    every layer and site."""
    return len(DROPOUT_SITES) * layer + DROPOUT_SITES.index(site)


def dropout(b: GraphBuilder, x: Ref, rate: float, layer: int, site: str) -> Ref:
    """``x`` dropped out at ``rate``: ``<site>_dropped = x * <site>_dropout_mask / (1 - rate)``, the mask a
    byte (``uint8``) ``dropout_mask`` of ``x`` seeded by :func:`dropout_seed`, as PyTorch keeps it; ``x``
    itself when ``rate`` is 0."""
    if not rate:
        return x
    mask = b.elementwise("dropout_mask", [x], name=f"{site}_dropout_mask", dtype="uint8", rate=rate,
                         seed=dropout_seed(layer, site))
    return b.scale(b.binary("mul", x, mask, name=f"{site}_masked"), 1.0 / (1.0 - rate), name=f"{site}_dropped")


def check_dropout(model: str, rate: float) -> None:
    """Raise GraphError unless ``rate`` is a number in [0, 1)."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1:
        raise GraphError(f"model {model!r}: dropout must be a number in [0, 1), got {short_repr(rate)}")


def rotary_tables(b: GraphBuilder, d: Dims) -> Rotary:
    """The rotation table input ``rope[seq, rope_out, rope_half, rope_freq]``
    and its copy over ``kv_seq`` (a rename), shared by every layer."""
    if d.d_kv.size % 2:
        raise GraphError(f"rotary position embedding rotates pairs of features: d_kv={d.d_kv.size} must be even")
    half, out, freq = b.dim("rope_half", 2), b.dim("rope_out", 2), b.dim("rope_freq", d.d_kv.size // 2)
    table = b.input("rope", [d.seq, out, half, freq])
    return Rotary(table, b.rename(table, d.seq, d.kv_seq, name="rope_kv"), half, out, freq)


def rotate(b: GraphBuilder, x: Ref, table: Ref, d: Dims, rope: Rotary, name: str) -> Ref:
    """``x[..., d_kv]`` rotated by ``table`` (see :class:`Rotary`): split ``d_kv``
    into pairs (``<name>_pairs``), one einsum (``<name>_rotated``), merge back
    (``<name>_rot``)."""
    pairs = b.split(x, d.d_kv, [rope.half, rope.freq], name=f"{name}_pairs")
    out = [rope.out if dim.name == rope.half.name else dim for dim in pairs.dims]
    rotated = b.einsum([pairs, table], out, name=f"{name}_rotated")
    return b.merge(rotated, [rope.out, rope.freq], d.d_kv, name=f"{name}_rot")


def self_attention(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle, rope: Rotary | None = None,
                   layer: int = 0) -> Ref:
    """Multi-head self-attention of ``x[batch, seq, d_model]`` -> ``[batch, seq, d_model]``.

    Keys and values are projected from ``x`` renamed ``seq -> kv_seq`` (as
    Mesh-TF's ``SelfAttention`` does), so the logits are
    ``[batch, heads, seq, kv_seq]`` and the softmax runs over ``kv_seq``.
    The 1/sqrt(d_kv) scale is applied to the queries (same function as
    scaling the logits, on a smaller tensor). No causal mask: the IR has no
    constant tensors and a mask changes neither shapes, FLOPs nor
    communication.

    Grouped-query attention (``d.kv_heads``): queries, logits and context
    have the head dims ``kv_heads, q_per_kv`` where keys and values have
    ``kv_heads``, so each key/value head serves ``q_per_kv`` query heads.
    ``rope``: queries and keys are rotated (:func:`rotate`) after their
    projection (and bias). ``style.dropout``: the probabilities are dropped
    out before they weight the values (seeded by ``layer``).
    """
    bias = style.bias
    qh, kvh = d.q_heads, d.kv_head_dims
    x_kv = b.rename(x, d.seq, d.kv_seq, name="attn_kv_input")
    q = _project(b, [x], "wq", [d.d_model, *qh, d.d_kv], [d.batch, d.seq, *qh, d.d_kv], "q",
                 [*qh, d.d_kv] if bias else None)
    k = _project(b, [x_kv], "wk", [d.d_model, *kvh, d.d_kv], [d.batch, d.kv_seq, *kvh, d.d_kv], "k",
                 [*kvh, d.d_kv] if bias else None)
    v = _project(b, [x_kv], "wv", [d.d_model, *kvh, d.d_kv], [d.batch, d.kv_seq, *kvh, d.d_kv], "v",
                 [*kvh, d.d_kv] if bias else None)
    if rope is not None:
        q = rotate(b, q, rope.q_table, d, rope, "q")
        k = rotate(b, k, rope.kv_table, d, rope, "k")
    q = b.scale(q, 1.0 / math.sqrt(d.d_kv.size), name="q_scaled")
    logits = b.einsum([q, k], [d.batch, *qh, d.seq, d.kv_seq], name="attn_logits")
    probs = b.softmax(logits, d.kv_seq, name="attn_probs")
    probs = dropout(b, probs, style.dropout, layer, "attn_probs")
    ctx = b.einsum([probs, v], [d.batch, d.seq, *qh, d.d_kv], name="attn_context")
    return _project(b, [ctx], "wo", [*qh, d.d_kv, d.d_model], [d.batch, d.seq, d.d_model], "attn_out",
                    [d.d_model] if bias else None)


def feed_forward(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle) -> Ref:
    """``x[batch, seq, d_model] · wi[d_model, d_ff] -> act -> · wo_ff[d_ff, d_model]``;
    gated (``style.gated``): ``act(x · wi_gate) * (x · wi_up) -> · wo_ff``."""
    bias = [d.d_ff] if style.bias else None
    if style.gated:
        gate = _project(b, [x], "wi_gate", [d.d_model, d.d_ff], [d.batch, d.seq, d.d_ff], "ff_gate", bias)
        up = _project(b, [x], "wi_up", [d.d_model, d.d_ff], [d.batch, d.seq, d.d_ff], "ff_up", bias)
        h = b.binary("mul", b.unary(style.activation, gate, name="ff_act"), up, name="ff_gated")
    else:
        h = _project(b, [x], "wi", [d.d_model, d.d_ff], [d.batch, d.seq, d.d_ff], "ff_in", bias)
        h = b.unary(style.activation, h, name="ff_act")
    return _project(b, [h], "wo_ff", [d.d_ff, d.d_model], [d.batch, d.seq, d.d_model], "ff_out",
                    [d.d_model] if style.bias else None)


def decoder_layer(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle, rope: Rotary | None = None,
                  layer: int = 0) -> Ref:
    """One pre-LN layer: ``x + attn(ln(x))`` then ``x + ff(ln(x))``; parallel
    (``style.parallel``, PaLM): ``x + attn(ln(x)) + ff(ln(x))`` with one norm ``ln``.
    ``style.dropout``: ``attn`` and ``ff`` are dropped out before the residual adds
    (Megatron-LM's bias-dropout-add), seeded by ``layer``."""
    center = not style.rms_norm

    def attn(h: Ref) -> Ref:
        return dropout(b, self_attention(b, h, d, style, rope, layer), style.dropout, layer, "attn_out")

    def ff(h: Ref) -> Ref:
        return dropout(b, feed_forward(b, h, d, style), style.dropout, layer, "ff_out")

    if style.parallel:
        h = norm(b, x, d.d_model, "ln", style.norm_bias, center)
        x = b.binary("add", x, attn(h), name="attn_residual")
        return b.binary("add", x, ff(h), name="ff_residual")
    h = norm(b, x, d.d_model, "ln_attn", style.norm_bias, center)
    x = b.binary("add", x, attn(h), name="attn_residual")
    h = norm(b, x, d.d_model, "ln_ff", style.norm_bias, center)
    return b.binary("add", x, ff(h), name="ff_residual")


def decoder_stack(b: GraphBuilder, x: Ref, d: Dims, style: LayerStyle, layers: int,
                  rope: Rotary | None = None) -> Ref:
    """``layers`` decoder layers, layer ``i`` in block ``layer.i``."""
    for i in range(layers):
        with b.block(block_name(i)):
            x = decoder_layer(b, x, d, style, rope, i)
    return x


def lm_loss(b: GraphBuilder, x: Ref, d: Dims, vocab: Dim, out_embed: Ref, labels: Ref, norm_bias: bool,
            center: bool = True) -> Ref:
    """Final layer norm (RMSNorm unless ``center``), logits ``x · out_embed`` over
    ``vocab``, mean cross-entropy.

    ``out_embed`` is ``[vocab, d_model]`` (tied to the input embedding) or
    ``[d_model, vocab]`` (a separate softmax weight): named dims make both the
    same einsum."""
    h = norm(b, x, d.d_model, "final_ln", norm_bias, center)
    logits = b.einsum([h, out_embed], [d.batch, d.seq, vocab], name="logits")
    xent = b.cross_entropy(logits, labels, vocab, name="xent")
    return b.reduce(xent, [], fn="mean", name="loss")
