"""Which tensor of a zoo ``gpt`` graph each MaxText tensor is, dim by dim.

MaxText's dense decoder blocks (``llama2``: Llama 2/3, Mistral; ``gpt3``) and the zoo's ``gpt`` builder
compute the same model with other names and other array layouts: MaxText stacks the layers along a scanned
axis (``param_scan_axis``), flattens query heads (kv-head major), fuses GPT-3's q/k/v kernels along a ``qkv``
axis. A :class:`Counterpart` says, for one MaxText parameter path or activation constraint site (as
:mod:`layoutsearch.maxtext.probe` reports them), which zoo tensor(s) it is and which zoo dim(s) each of its
axes holds. MaxText's logical axis names for those axes come from the version table
(:mod:`layoutsearch.maxtext.version`), never from this file: together they say which logical name is
carried by which dim of which zoo tensor, the one fact the MaxText export derives its rules from and the
round-trip check compares with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor

LAYERS = "<layers>"
"""The scanned layers axis of a MaxText parameter (one zoo tensor per layer)."""
STACK = "<stack>"
"""An axis stacking several zoo tensors (GPT-3's fused ``qkv``)."""
Q_HEADS = "<q_heads>"
"""Query heads: ``heads`` in a multi-head graph, ``(kv_heads, q_per_kv)`` flattened in a grouped-query one."""
KV_HEADS = "<kv_heads>"
"""Key/value heads: ``heads`` in a multi-head graph, ``kv_heads`` in a grouped-query one."""

Axis = str | tuple[str, ...]


@dataclass(frozen=True)
class Counterpart:
    """MaxText tensor ``maxtext`` = zoo tensor(s) ``zoo`` (``layer.*/`` one per layer; alternatives with
    ``|``, the first the graph has; several: stacked along the :data:`STACK` axis), its axes holding ``dims``
    (a zoo dim, a tuple of zoo dims flattened major first, :data:`LAYERS`, :data:`STACK`, or a symbolic
    head dim)."""

    maxtext: str
    zoo: tuple[str, ...]
    dims: tuple[Axis, ...]


def _c(maxtext: str, zoo: str | tuple[str, ...], *dims: Axis) -> Counterpart:
    return Counterpart(maxtext, (zoo,) if isinstance(zoo, str) else zoo, dims)


_L = "layer.*/"
PARAMS: dict[str, tuple[Counterpart, ...]] = {
    "llama2": (
        _c("token_embedder/embedding", "embed", "vocab", "d_model"),
        _c("decoder/logits_dense/kernel", "softmax_w", "d_model", "vocab"),
        _c("decoder/decoder_norm/scale", "final_ln_scale", "d_model"),
        _c("decoder/layers/pre_self_attention_layer_norm/scale", _L + "ln_attn_scale", "d_model", LAYERS),
        _c("decoder/layers/post_self_attention_layer_norm/scale", _L + "ln_ff_scale", "d_model", LAYERS),
        _c("decoder/layers/self_attention/query/kernel", _L + "wq", "d_model", LAYERS, Q_HEADS, "d_kv"),
        _c("decoder/layers/self_attention/key/kernel", _L + "wk", "d_model", LAYERS, KV_HEADS, "d_kv"),
        _c("decoder/layers/self_attention/value/kernel", _L + "wv", "d_model", LAYERS, KV_HEADS, "d_kv"),
        _c("decoder/layers/self_attention/out/kernel", _L + "wo", Q_HEADS, LAYERS, "d_kv", "d_model"),
        _c("decoder/layers/mlp/wi_0/kernel", _L + "wi_gate", "d_model", LAYERS, "d_ff"),
        _c("decoder/layers/mlp/wi_1/kernel", _L + "wi_up", "d_model", LAYERS, "d_ff"),
        _c("decoder/layers/mlp/wo/kernel", _L + "wo_ff", "d_ff", LAYERS, "d_model"),
    ),
    "gpt3": (
        _c("token_embedder/embedding", "embed", "vocab", "d_model"),
        _c("decoder/position_embedder/embedding", "pos_embed", "seq", "d_model"),
        _c("decoder/decoder_norm/scale", "final_ln_scale", "d_model"),
        _c("decoder/decoder_norm/bias", "final_ln_bias", "d_model"),
        _c("decoder/layers/pre_self_attention_norm/scale", _L + "ln_attn_scale", "d_model", LAYERS),
        _c("decoder/layers/pre_self_attention_norm/bias", _L + "ln_attn_bias", "d_model", LAYERS),
        _c("decoder/layers/self_attention/qkv_proj/kernel", (_L + "wq", _L + "wk", _L + "wv"),
           "d_model", LAYERS, STACK, "heads", "d_kv"),
        _c("decoder/layers/self_attention/qkv_proj/bias", (_L + "wq_bias", _L + "wk_bias", _L + "wv_bias"),
           STACK, LAYERS, "heads", "d_kv"),
        _c("decoder/layers/self_attention/out/kernel", _L + "wo", "heads", LAYERS, "d_kv", "d_model"),
        _c("decoder/layers/self_attention/out/bias", _L + "wo_bias", "d_model", LAYERS),
        _c("decoder/layers/mlp/mlp_layer_norm/scale", _L + "ln_ff_scale", "d_model", LAYERS),
        _c("decoder/layers/mlp/mlp_layer_norm/bias", _L + "ln_ff_bias", "d_model", LAYERS),
        _c("decoder/layers/mlp/wi/kernel", _L + "wi", "d_model", LAYERS, "d_ff"),
        _c("decoder/layers/mlp/wi/bias", _L + "wi_bias", "d_ff", LAYERS),
        _c("decoder/layers/mlp/wo/kernel", _L + "wo_ff", "d_ff", LAYERS, "d_model"),
        _c("decoder/layers/mlp/wo/bias", _L + "wo_ff_bias", "d_model", LAYERS),
    ),
}
"""MaxText parameter path (as the probe reports it) -> zoo tensors, per decoder block."""

ACTIVATIONS: dict[str, tuple[Counterpart, ...]] = {
    "llama2": (
        _c("nnx_decoders/carry", _L + "ff_residual", "batch", "seq", "d_model"),
        _c("nnx_decoders/y_in", _L + "ff_residual", "batch", "seq", "d_model"),
        _c("attentions/inputs_q", _L + "ln_attn_scaled", "batch", "seq", "d_model"),
        _c("attentions/inputs_kv", _L + "attn_kv_input", "batch", "kv_seq", "d_model"),
        _c("attentions/query", _L + "q", "batch", "seq", Q_HEADS, "d_kv"),
        _c("attentions/key", _L + "k", "batch", "kv_seq", KV_HEADS, "d_kv"),
        _c("attentions/value", _L + "v", "batch", "kv_seq", KV_HEADS, "d_kv"),
        _c("attentions/out", _L + "attn_context", "batch", "seq", Q_HEADS, "d_kv"),
        _c("linears/x", _L + "ff_gated|" + _L + "ff_act", "batch", "seq", "d_ff"),
        _c("logits", "logits", "batch", "seq", "vocab"),
    ),
    "gpt3": (
        _c("linears/x", _L + "ff_act", "batch", "seq", "d_ff"),
        _c("logits", "logits", "batch", "seq", "vocab"),
    ),
}
"""MaxText activation constraint site (``file/variable``, as MaxText's ``debug_sharding`` names it; ``logits``:
the decoder's output) -> zoo tensors, per decoder block. ``nnx_decoders/carry`` is the scanned layers' input,
``nnx_decoders/y_in`` the unscanned layers'."""

MAIN_ACTIVATIONS = ("attentions/inputs_q", "attentions/inputs_kv", "linears/x", "logits")
"""The activations a round trip must reproduce at least: attention inputs, MLP inputs, logits."""


def decoder_block(graph: Graph) -> str | None:
    """The MaxText decoder block computing the same model as ``graph``, or None: ``llama2`` for a zoo ``gpt``
    built Llama-style (SwiGLU, RMSNorm, rotary, no biases, untied), ``gpt3`` for GPT-3-style (gelu, layer
    norm, learned positions, biases, tied); anything else (a parallel block, dropout, ...) has none."""
    m = graph.meta
    if m.get("model") != "gpt" or m.get("parallel_block", 0) or m.get("dropout", 0.0):
        return None
    style = (m.get("mlp", "gelu"), m.get("norm", "layernorm"), m.get("position", "learned"), m.get("bias", 1),
             m.get("tie_embeddings", 1))
    if style == ("swiglu", "rmsnorm", "rotary", 0, 0):
        return "llama2"
    if style == ("gelu", "layernorm", "learned", 1, 1):
        return "gpt3"
    return None


def _symbolic(graph: Graph, axis: Axis) -> tuple[str, ...]:
    if axis == Q_HEADS:
        return ("heads",) if "heads" in graph.dims else ("kv_heads", "q_per_kv")
    if axis == KV_HEADS:
        return ("heads",) if "heads" in graph.dims else ("kv_heads",)
    return (axis,) if isinstance(axis, str) else tuple(axis)


def zoo_dims(graph: Graph, c: Counterpart) -> tuple[tuple[str, ...], ...]:
    """Per MaxText axis of ``c``, the zoo dims it holds (flattened major first; () for the layers and stack
    axes)."""
    return tuple(() if a in (LAYERS, STACK) else _symbolic(graph, a) for a in c.dims)


def zoo_tensors(graph: Graph, c: Counterpart, first_layer_only: bool = False) -> Iterator[Tensor]:
    """Every zoo tensor ``c`` stands for in ``graph`` (each layer's, or only the first layer's, each stacked
    one); none if the graph lacks them."""
    layers = 1 if first_layer_only else int(graph.meta.get("layers", 0))
    for name in c.zoo:
        chosen = next((alt for alt in name.split("|") if alt.replace("*", "0") in graph.tensors), None)
        if chosen is None:
            continue
        for i in (range(layers) if "*" in chosen else (None,)):
            t = graph.tensors.get(chosen.replace("*", str(i)) if i is not None else chosen)
            if t is not None:
                yield t
