"""``gpt``: a GPT decoder (Radford et al. 2018/2019, Brown et al. 2020), or Llama / PaLM / MaxText style.

Token ids ``[batch, seq]`` -> ``embed[vocab, d_model]`` gather + learned
``pos_embed[seq, d_model]`` (broadcast add) -> ``layers`` pre-LN layers
(layer norms with scale and bias; multi-head self-attention with
``d_kv = d_model / heads``; gelu MLP with ``d_ff`` = 4 · d_model by default;
biases on every projection; residual adds) -> final layer norm -> logits
through the input embedding (tied, the GPT default; ``tie_embeddings=0`` adds
a separate ``softmax_w[d_model, vocab]``) -> mean cross-entropy.

Attention is unmasked: a causal mask changes neither shapes, FLOPs nor
communication (see :func:`layoutsearch.zoo._blocks.self_attention`).

Parameters (tied, d_ff = 4h): 12·l·h² + 13·l·h + (vocab + seq)·h + 2h, the
formula of Narayanan et al. 2021 (section 5.1) plus the final layer norm.

Modern decoders are the same builder with other parameters (the defaults give
the GPT graph above, unchanged):

* ``d_kv``: the head dim, independent of ``d_model / heads`` (MaxText: 128
  with d_model 4096 and 64 heads); default ``d_model // heads``.
* ``kv_heads``: grouped-query attention (Ainslie et al. 2023; ``kv_heads=1``:
  multi-query). The graph has dims ``kv_heads`` and ``q_per_kv`` (= heads /
  kv_heads) instead of ``heads``: ``wq[d_model, kv_heads, q_per_kv, d_kv]``,
  ``wk, wv[d_model, kv_heads, d_kv]``, logits ``[batch, kv_heads, q_per_kv,
  seq, kv_seq]``, ``wo[kv_heads, q_per_kv, d_kv, d_model]``; a layout splits
  ``kv_heads`` and/or ``q_per_kv``. Default (or ``kv_heads == heads``):
  multi-head attention with the dim ``heads``.
* ``mlp``: ``gelu`` (default), ``relu``, or ``swiglu`` (Shazeer 2020; Llama,
  MaxText): ``silu(x · wi_gate) * (x · wi_up) · wo_ff``, outputs ``ff_gate``,
  ``ff_up``, ``ff_act``, ``ff_gated``.
* ``parallel_block=1``: ``x + attn(ln(x)) + mlp(ln(x))`` with one norm ``ln``
  per layer (PaLM, Chowdhery et al. 2022, section 2).
* ``norm``: ``layernorm`` (default) or ``rmsnorm`` (Zhang & Sennrich 2019;
  Llama, MaxText): the ``layer_norm`` op with ``center=False`` (no mean
  subtraction) and a learned scale, never a bias.
* ``bias=0``: no biases on the projections nor the layer norms (Llama, MaxText).
* ``position``: ``learned`` (default, ``pos_embed``), ``none``, or ``rotary``
  (RoPE, Su et al. 2021; Llama, MaxText). Rotary is exact: a graph input
  ``rope[seq, rope_out, rope_half, rope_freq]`` holds, per position ``s`` and
  frequency ``j``, the rotation ``[[cos, -sin], [sin, cos]]`` of angle ``s ·
  theta^(-2j/d_kv)`` (:func:`rotary_table`); queries and keys (with the table
  renamed to ``kv_seq``) are split ``d_kv -> (rope_half, rope_freq)``, rotated
  by one einsum contracting ``rope_half`` and merged back: ``x · cos +
  rotate_half(x) · sin`` with the GPT-NeoX / Llama pairing ``(x[j], x[j +
  d_kv/2])``. Compared with a fused rotary kernel (one pass reading ``x`` and
  the cos/sin tables, writing the result: 3 FLOPs per element), this costs 4
  FLOPs per element of ``q`` and ``k`` (an einsum contracting a dim of size 2,
  which the cost model prices as a matmul of tiny ``k`` and XLA as a dot)
  forward and again backward, two reshapes each way (the cost model charges
  their bytes; a kernel has none), the pairs and the rotated ``q`` and ``k``
  as extra activations, and a table of ``2 · seq · d_kv`` elements (as the
  cos and sin tables of a kernel). No collective, as long as ``d_kv`` is
  unsplit (the table is split like ``seq``).
* ``tie_embeddings=0``: a separate ``softmax_w[d_model, vocab]``.
* ``dropout``: the dropout rate (default 0: no dropout, the graph unchanged)
  of Megatron-LM's attention dropout, on the attention probabilities before
  they weight the values, and hidden dropout, on the attention and MLP outputs
  (with their biases) before each residual add (bias-dropout-add): ``x *
  dropout_mask(x)``, the mask seeded per layer and site
  (:func:`layoutsearch.zoo._blocks.dropout`). Megatron-LM trains with 0.1 for both
  (``--attention-dropout``, ``--hidden-dropout``, their defaults).

Published configurations are in :data:`GPT_PRESETS`, selected with
``preset="gpt3-175b"`` (or ``llama2-70b``, ``llama3-8b``, ``maxtext-16b``, ...);
explicit arguments override a preset's values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layoutsearch.errors import GraphError
from layoutsearch.ir import Graph, GraphBuilder
from layoutsearch.zoo._blocks import (
    Dims,
    LayerStyle,
    check_dropout,
    check_dtype,
    check_flag,
    check_sizes,
    decoder_stack,
    lm_loss,
    rotary_tables,
)

NAME = "gpt"

DEFAULTS: dict[str, Any] = {
    "batch": 8, "seq": 16, "vocab": 128, "d_model": 32, "heads": 4, "d_ff": None, "layers": 2,
    "tie_embeddings": 1, "dtype": "float32", "d_kv": None, "kv_heads": None, "mlp": "gelu", "norm": "layernorm",
    "position": "learned", "bias": 1, "parallel_block": 0, "dropout": 0.0,
}
"""Default sizes (small enough for CPU tests) and architecture options (GPT's);
``d_ff=None`` means 4 · d_model, ``d_kv=None`` d_model / heads, ``kv_heads=None``
heads (multi-head attention)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "mlp": ("gelu", "relu", "swiglu"), "norm": ("layernorm", "rmsnorm"), "position": ("learned", "none", "rotary"),
}
"""The values of the string-valued architecture options (the first is the default)."""

OPTIONS = ("kv_heads", "mlp", "norm", "position", "bias", "parallel_block", "dropout")
"""Architecture options recorded in a graph's ``meta`` only when they differ from
GPT's (so the default graph, and its JSON file, stay as they were before the
options existed); :func:`gpt_config` resolves all of them."""


def _gpt3(layers: int, d_model: int, heads: int, batch_tokens: int) -> dict[str, int]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "seq": 2048, "vocab": 50304,
            "batch": batch_tokens // 2048}


def _megatron(layers: int, d_model: int, heads: int, seq: int, batch: int) -> dict[str, int]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "seq": seq, "vocab": 51200, "batch": batch}


_MODERN: dict[str, Any] = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": 0, "tie_embeddings": 0}
"""What Llama and MaxText decoders share: SwiGLU, RMSNorm, rotary positions, no biases, untied embeddings."""


def _llama(layers: int, d_model: int, heads: int, kv_heads: int, d_ff: int, vocab: int, seq: int,
           batch: int) -> dict[str, Any]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "kv_heads": kv_heads, "d_ff": d_ff,
            "vocab": vocab, "seq": seq, "batch": batch, **_MODERN}


def _maxtext(layers: int, d_model: int, heads: int, mlp: int, per_device_batch: int) -> dict[str, Any]:
    return {"layers": layers, "d_model": d_model, "heads": heads, "d_kv": 128, "d_ff": mlp, "vocab": 32000,
            "seq": 2048, "batch": per_device_batch * 256, **_MODERN}


GPT_PRESETS: dict[str, dict[str, Any]] = {
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
    # Touvron et al. 2023 (Llama 2), Table 1 and the model cards: SwiGLU, RMSNorm, rotary positions, no
    # biases, untied embeddings, vocab 32000, context 4096, global batch 4M tokens = 1024 sequences; 70B
    # uses grouped-query attention with 8 KV heads. d_ff (11008, 13824, 28672) from the released configs.
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096, 1024),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096, 1024),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096, 1024),
    # Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: layers, d_model, FFN dim, heads, 8 KV
    # heads, context 8192. Vocab: the released tokenizer's 128,256 tokens (Table 3 rounds to 128K),
    # already a multiple of 128 (1002 x 128), so no padding. Batch: section 3.4.1 states it for the
    # 405B run only (4M tokens at seq 4096, then 8M tokens at seq 8192, then 16M tokens); we use its
    # final 16M tokens = 2048 sequences of 8192 for all three.
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192, 2048),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192, 2048),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192, 2048),
    # MaxText `global_parameter_scale` models as benchmarked on TPU v5e (AI-Hypercomputer/maxtext README,
    # see docs/published-runs.md section 2): head dim 128, SwiGLU with d_ff = the table's mlp, RMSNorm,
    # rotary, untied, no biases, multi-head attention, vocab 32000, seq 2048; batch = per-device batch
    # (16B: 6, 32B: 4, 64B: 2, 128B: 1) x 256 chips (one slice).
    "maxtext-16b": _maxtext(32, 4096, 64, 28672, 6),
    "maxtext-32b": _maxtext(32, 8192, 64, 28672, 4),
    "maxtext-64b": _maxtext(64, 8192, 64, 28672, 2),
    "maxtext-128b": _maxtext(64, 8192, 128, 57344, 1),
}
"""Published configurations by name (layers, d_model, heads, seq, vocab, batch in sequences; the
architecture options of the Llama and MaxText models)."""

PUBLISHED_PARAMS: dict[str, float] = {
    "gpt3-small": 125e6, "gpt3-medium": 350e6, "gpt3-large": 760e6, "gpt3-xl": 1.3e9, "gpt3-2.7b": 2.7e9,
    "gpt3-6.7b": 6.7e9, "gpt3-13b": 13.0e9, "gpt3-175b": 175.0e9,
    "megatron-1.2b": 1.2e9, "megatron-2.5b": 2.5e9, "megatron-4.2b": 4.2e9, "megatron-8.3b": 8.3e9,
    "megatron-1.7b": 1.7e9, "megatron-3.6b": 3.6e9, "megatron-7.5b": 7.5e9, "megatron-18.4b": 18.4e9,
    "megatron-39.1b": 39.1e9, "megatron-76.1b": 76.1e9, "megatron-145.6b": 145.6e9, "megatron-310.1b": 310.1e9,
    "megatron-529.6b": 529.6e9, "megatron-1t": 1008.0e9,
    # Llama 2 Table 1 says 7B, 13B, 70B; the released 7B checkpoint has 6.74B parameters (its model card /
    # Hugging Face count; "7B" is 3.8% off, outside the test's 3%), 13B 13.0B, 70B 69.0B.
    "llama2-7b": 6.74e9, "llama2-13b": 13.0e9, "llama2-70b": 70.0e9,
    # Llama 3 Table 3 (the released checkpoints: 8.03B, 70.6B, 405.9B).
    "llama3-8b": 8.0e9, "llama3-70b": 70.0e9, "llama3-405b": 405.0e9,
    # The MaxText README table's params column.
    "maxtext-16b": 15.8e9, "maxtext-32b": 31.7e9, "maxtext-64b": 62.8e9, "maxtext-128b": 125.0e9,
}
"""The parameter count each preset's paper reports."""


def _choice(name: str, value: Any) -> None:
    if value not in CHOICES[name]:
        raise GraphError(f"model 'gpt': {name} must be one of {', '.join(CHOICES[name])}, got {value!r}")


def gpt_config(preset: str | None = None, **sizes: Any) -> dict[str, Any]:
    """The resolved configuration: defaults, then the preset, then the non-None ``sizes``
    (``d_ff``, ``d_kv`` and ``kv_heads`` derived when not given).

    Raises GraphError naming the parameter and its allowed values."""
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
    for flag in ("tie_embeddings", "bias", "parallel_block"):
        check_flag(NAME, flag, cfg[flag])
    check_dtype(NAME, cfg["dtype"])
    check_dropout(NAME, cfg["dropout"])
    cfg["dropout"] = float(cfg["dropout"])
    for name in CHOICES:
        _choice(name, cfg[name])
    if cfg["d_ff"] is None:
        cfg["d_ff"] = 4 * cfg["d_model"]
    check_sizes(NAME, d_ff=cfg["d_ff"])
    d_model, heads = cfg["d_model"], cfg["heads"]
    if cfg["d_kv"] is None:
        if d_model % heads:
            near = [h for h in range(max(1, heads - 8), heads + 9) if d_model % h == 0]
            raise GraphError(f"model 'gpt': heads={heads} does not divide d_model={d_model} (d_kv = d_model / heads "
                             f"must be an integer); heads near {heads} that divide it: {near or 'none'} "
                             "(or set the head dim d_kv)")
        cfg["d_kv"] = d_model // heads
    check_sizes(NAME, d_kv=cfg["d_kv"])
    if cfg["kv_heads"] is None:
        cfg["kv_heads"] = heads
    check_sizes(NAME, kv_heads=cfg["kv_heads"])
    if heads % cfg["kv_heads"]:
        divisors = [k for k in range(1, heads + 1) if heads % k == 0]
        raise GraphError(f"model 'gpt': kv_heads={cfg['kv_heads']} does not divide heads={heads} (grouped-query "
                         f"attention needs heads to be a multiple of kv_heads); kv_heads that divide it: "
                         f"{', '.join(map(str, divisors))}")
    if cfg["position"] == "rotary" and cfg["d_kv"] % 2:
        raise GraphError(f"model 'gpt': position='rotary' rotates pairs of features: d_kv={cfg['d_kv']} must be even")
    return {"model": NAME, "preset": preset, **cfg}


def _meta(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` without the architecture options (:data:`OPTIONS`) that have GPT's values."""
    gpt_values = {**{k: DEFAULTS[k] for k in OPTIONS}, "kv_heads": cfg["heads"]}
    return {k: v for k, v in cfg.items() if k not in OPTIONS or v != gpt_values[k]}


def layer_style(cfg: dict[str, Any]) -> LayerStyle:
    """The decoder layer of a resolved configuration (GPT's: biases, layer norms with a bias, gelu)."""
    rms, bias = cfg["norm"] == "rmsnorm", bool(cfg["bias"])
    gated = cfg["mlp"] == "swiglu"
    return LayerStyle(bias=bias, norm_bias=bias and not rms, activation="silu" if gated else cfg["mlp"], gated=gated,
                      rms_norm=rms, parallel=bool(cfg["parallel_block"]), dropout=cfg["dropout"])


def rotary_table(seq: int, d_kv: int, theta: float = 10000.0) -> np.ndarray:
    """The values of the ``rope[seq, rope_out, rope_half, rope_freq]`` input of
    ``position="rotary"``: ``[[cos a, -sin a], [sin a, cos a]]`` with ``a = s ·
    theta^(-2j/d_kv)`` at position ``s``, frequency ``j`` (RoFormer; ``theta``
    10000 in Llama 2 and MaxText, 500000 in Llama 3)."""
    angle = np.arange(seq)[:, None] * theta ** (-2.0 * np.arange(d_kv // 2) / d_kv)[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.stack([np.stack([cos, -sin], axis=1), np.stack([sin, cos], axis=1)], axis=1).astype(np.float32)


def gpt(*, preset: str | None = None, batch: int | None = None, seq: int | None = None, vocab: int | None = None,
        d_model: int | None = None, heads: int | None = None, d_ff: int | None = None, layers: int | None = None,
        tie_embeddings: int | None = None, dtype: str | None = None, d_kv: int | None = None,
        kv_heads: int | None = None, mlp: str | None = None, norm: str | None = None, position: str | None = None,
        bias: int | None = None, parallel_block: int | None = None, dropout: float | None = None) -> Graph:
    """A GPT (or Llama/PaLM/MaxText-style) decoder; ``None`` arguments take the
    preset's value, else :data:`DEFAULTS`."""
    cfg = gpt_config(preset, batch=batch, seq=seq, vocab=vocab, d_model=d_model, heads=heads, d_ff=d_ff,
                     layers=layers, tie_embeddings=tie_embeddings, dtype=dtype, d_kv=d_kv, kv_heads=kv_heads,
                     mlp=mlp, norm=norm, position=position, bias=bias, parallel_block=parallel_block,
                     dropout=dropout)
    b = GraphBuilder(NAME, dtype=cfg["dtype"])
    if cfg["kv_heads"] == cfg["heads"]:  # multi-head attention
        head_dims = {"heads": b.dim("heads", cfg["heads"])}
    else:  # grouped-query attention
        head_dims = {"heads": None, "kv_heads": b.dim("kv_heads", cfg["kv_heads"]),
                     "q_per_kv": b.dim("q_per_kv", cfg["heads"] // cfg["kv_heads"])}
    d = Dims(batch=b.dim("batch", cfg["batch"]), seq=b.dim("seq", cfg["seq"]), kv_seq=b.dim("kv_seq", cfg["seq"]),
             d_model=b.dim("d_model", cfg["d_model"]), d_kv=b.dim("d_kv", cfg["d_kv"]),
             d_ff=b.dim("d_ff", cfg["d_ff"]), **head_dims)
    style = layer_style(cfg)
    vocab_d = b.dim("vocab", cfg["vocab"])
    ids = b.input("ids", [d.batch, d.seq], dtype="int32")
    labels = b.input("labels", [d.batch, d.seq], dtype="int32")
    embed = b.parameter("embed", [vocab_d, d.d_model])
    if cfg["position"] == "learned":
        pos_embed = b.parameter("pos_embed", [d.seq, d.d_model])
        x = b.binary("add", b.gather(embed, ids, vocab_d, name="tok_embedded"), pos_embed, name="embedded")
    else:
        x = b.gather(embed, ids, vocab_d, name="embedded")
    rope = rotary_tables(b, d) if cfg["position"] == "rotary" else None
    x = decoder_stack(b, x, d, style, cfg["layers"], rope)
    out_embed = embed if cfg["tie_embeddings"] else b.parameter("softmax_w", [d.d_model, vocab_d])
    loss = lm_loss(b, x, d, vocab_d, out_embed, labels, norm_bias=style.norm_bias, center=not style.rms_norm)
    return b.build(loss, meta=_meta(cfg))
