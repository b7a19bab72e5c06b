"""``gpt``: a GPT decoder (Radford et al. 2018/2019, Brown et al. 2020).

Token ids ``[batch, seq]`` -> ``embed[vocab, d_model]`` gather + learned
``pos_embed[seq, d_model]`` (broadcast add) -> ``layers`` pre-LN layers
(layer norms with scale and bias; multi-head self-attention with
``d_kv = d_model / heads``; gelu MLP with ``d_ff`` = 4 · d_model by default;
biases on every projection; residual adds) -> final layer norm -> logits
through the input embedding (tied, the GPT default; ``tie_embeddings=0`` adds
a separate ``softmax_w[d_model, vocab]``) -> mean cross-entropy.

Attention is unmasked: a causal mask changes neither shapes, FLOPs nor
communication (see :func:`graphs._blocks.self_attention`).

Parameters (tied, d_ff = 4h): 12·l·h² + 13·l·h + (vocab + seq)·h + 2h, the
formula of Narayanan et al. 2021 (section 5.1) plus the final layer norm.

Published configurations are in :data:`GPT_PRESETS`, selected with
``preset="gpt3-175b"``; explicit arguments override a preset's values.
"""

from __future__ import annotations

from typing import Any

from graphs._blocks import Dims, LayerStyle, check_dtype, check_flag, check_sizes, decoder_stack, lm_loss
from layoutsearch.errors import GraphError
from layoutsearch.ir import Graph, GraphBuilder

NAME = "gpt"
STYLE = LayerStyle(bias=True, norm_bias=True, activation="gelu")

DEFAULTS: dict[str, Any] = {
    "batch": 8, "seq": 16, "vocab": 128, "d_model": 32, "heads": 4, "d_ff": None, "layers": 2,
    "tie_embeddings": 1, "dtype": "float32",
}
"""Default sizes (small enough for CPU tests); ``d_ff=None`` means 4 · d_model."""


def _gpt3(layers: int, d_model: int, heads: int, batch_tokens: int) -> dict[str, int]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "seq": 2048, "vocab": 50304,
            "batch": batch_tokens // 2048}


def _megatron(layers: int, d_model: int, heads: int, seq: int, batch: int) -> dict[str, int]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "seq": seq, "vocab": 51200, "batch": batch}


GPT_PRESETS: dict[str, dict[str, int]] = {
    # Brown et al. 2020, Table 2.1: n_layers, d_model, n_heads, batch size in tokens (seq 2048).
    # vocab: GPT-2's 50257 BPE tokens padded to 50304, a multiple of 128 (as Megatron pads), so the
    # vocab dim can be split evenly.  gpt3-xl: the table's 24 heads x 128 != d_model 2048 (and would
    # give 1.5B parameters, not 1.3B); we use 16 heads x 128 = 2048, which gives the published 1.3B.
    # gpt3-13b: the table's d_model 5140 is a typo for 40 heads x 128 = 5120.
    "gpt3-small": _gpt3(12, 768, 12, 524_288),
    "gpt3-medium": _gpt3(24, 1024, 16, 524_288),
    "gpt3-large": _gpt3(24, 1536, 16, 524_288),
    "gpt3-xl": _gpt3(24, 2048, 16, 1_048_576),
    "gpt3-2.7b": _gpt3(32, 2560, 32, 1_048_576),
    "gpt3-6.7b": _gpt3(32, 4096, 32, 2_097_152),
    "gpt3-13b": _gpt3(40, 5120, 40, 2_097_152),
    "gpt3-175b": _gpt3(96, 12288, 96, 3_145_728),
    # Shoeybi et al. 2019 (Megatron-LM), Table 1: GPT-2 scaling configs, seq 1024, batch 512,
    # vocab padded to 51200.
    "megatron-1.2b": _megatron(40, 1536, 16, 1024, 512),
    "megatron-2.5b": _megatron(54, 1920, 20, 1024, 512),
    "megatron-4.2b": _megatron(64, 2304, 24, 1024, 512),
    "megatron-8.3b": _megatron(72, 3072, 32, 1024, 512),
    # Narayanan et al. 2021 (Megatron-LM on GPU clusters), Table 1: seq 2048, vocab 51200, global batch.
    "megatron-1.7b": _megatron(24, 2304, 24, 2048, 512),
    "megatron-3.6b": _megatron(30, 3072, 32, 2048, 512),
    "megatron-7.5b": _megatron(36, 4096, 32, 2048, 512),
    "megatron-18.4b": _megatron(40, 6144, 48, 2048, 1024),
    "megatron-39.1b": _megatron(48, 8192, 64, 2048, 1536),
    "megatron-76.1b": _megatron(60, 10240, 80, 2048, 1792),
    "megatron-145.6b": _megatron(80, 12288, 96, 2048, 2304),
    "megatron-310.1b": _megatron(96, 16384, 128, 2048, 2160),
    "megatron-529.6b": _megatron(105, 20480, 128, 2048, 2520),
    "megatron-1t": _megatron(128, 25600, 160, 2048, 3072),
}
"""Published GPT configurations by name (layers, d_model, heads, seq, vocab, batch in sequences)."""

PUBLISHED_PARAMS: dict[str, float] = {
    "gpt3-small": 125e6, "gpt3-medium": 350e6, "gpt3-large": 760e6, "gpt3-xl": 1.3e9, "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9, "gpt3-13b": 13.0e9, "gpt3-175b": 175.0e9,
    "megatron-1.2b": 1.2e9, "megatron-2.5b": 2.5e9, "megatron-4.2b": 4.2e9, "megatron-8.3b": 8.3e9,
    "megatron-1.7b": 1.7e9, "megatron-3.6b": 3.6e9, "megatron-7.5b": 7.5e9, "megatron-18.4b": 18.4e9,
    "megatron-39.1b": 39.1e9, "megatron-76.1b": 76.1e9, "megatron-145.6b": 145.6e9, "megatron-310.1b": 310.1e9,
    "megatron-529.6b": 529.6e9, "megatron-1t": 1008.0e9,
}
"""The parameter count each preset's paper reports."""


def gpt_config(preset: str | None = None, **sizes: Any) -> dict[str, Any]:
    """The resolved configuration: defaults, then the preset, then the non-None ``sizes``."""
    cfg = dict(DEFAULTS)
    if preset is not None:
        if preset not in GPT_PRESETS:
            raise GraphError(f"model 'gpt': unknown preset {preset!r} (known: {', '.join(GPT_PRESETS)})")
        cfg.update(GPT_PRESETS[preset])
    unknown = set(sizes) - set(DEFAULTS)
    if unknown:
        raise GraphError(f"model 'gpt': unknown parameter(s) {sorted(unknown)} (known: {', '.join(DEFAULTS)})")
    cfg.update({k: v for k, v in sizes.items() if v is not None})
    check_sizes(NAME, **{k: cfg[k] for k in ("batch", "seq", "vocab", "d_model", "heads", "layers")})
    check_flag(NAME, "tie_embeddings", cfg["tie_embeddings"])
    check_dtype(NAME, cfg["dtype"])
    if cfg["d_ff"] is None:
        cfg["d_ff"] = 4 * cfg["d_model"]
    check_sizes(NAME, d_ff=cfg["d_ff"])
    d_model, heads = cfg["d_model"], cfg["heads"]
    if d_model % heads:
        near = [h for h in range(max(1, heads - 8), heads + 9) if d_model % h == 0]
        raise GraphError(f"model 'gpt': heads={heads} does not divide d_model={d_model} (d_kv = d_model / heads "
                         f"must be an integer); heads near {heads} that divide it: {near or 'none'}")
    cfg["d_kv"] = d_model // heads
    return {"model": NAME, "preset": preset, **cfg}


def gpt(*, preset: str | None = None, batch: int | None = None, seq: int | None = None, vocab: int | None = None,
        d_model: int | None = None, heads: int | None = None, d_ff: int | None = None, layers: int | None = None,
        tie_embeddings: int | None = None, dtype: str | None = None) -> Graph:
    """A GPT decoder; ``None`` arguments take the preset's value, else :data:`DEFAULTS`."""
    cfg = gpt_config(preset, batch=batch, seq=seq, vocab=vocab, d_model=d_model, heads=heads, d_ff=d_ff,
                     layers=layers, tie_embeddings=tie_embeddings, dtype=dtype)
    b = GraphBuilder(NAME, dtype=cfg["dtype"])
    d = Dims(batch=b.dim("batch", cfg["batch"]), seq=b.dim("seq", cfg["seq"]), kv_seq=b.dim("kv_seq", cfg["seq"]),
             d_model=b.dim("d_model", cfg["d_model"]), heads=b.dim("heads", cfg["heads"]),
             d_kv=b.dim("d_kv", cfg["d_kv"]), d_ff=b.dim("d_ff", cfg["d_ff"]))
    vocab_d = b.dim("vocab", cfg["vocab"])
    ids = b.input("ids", [d.batch, d.seq], dtype="int32")
    labels = b.input("labels", [d.batch, d.seq], dtype="int32")
    embed = b.parameter("embed", [vocab_d, d.d_model])
    pos_embed = b.parameter("pos_embed", [d.seq, d.d_model])
    x = b.binary("add", b.gather(embed, ids, vocab_d, name="tok_embedded"), pos_embed, name="embedded")
    x = decoder_stack(b, x, d, STYLE, cfg["layers"])
    out_embed = embed if cfg["tie_embeddings"] else b.parameter("softmax_w", [d.d_model, vocab_d])
    loss = lm_loss(b, x, d, vocab_d, out_embed, labels, norm_bias=True)
    return b.build(loss, meta=cfg)
