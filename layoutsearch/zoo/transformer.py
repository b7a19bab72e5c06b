"""``mtf-transformer``: the Mesh-TensorFlow Transformer language model.

Vaswani et al. 2017 as laid out in Mesh-TF (Shazeer et al. 2018, section 5):
token ids ``[batch, seq]`` -> embedding gather from ``embed[vocab, d_model]``
-> ``layers`` pre-LN layers (layer norm with a learned scale, no bias;
multi-head self-attention with independent ``heads`` and ``d_kv`` dims and
projections ``wq/wk/wv[d_model, heads, d_kv]``, ``wo[heads, d_kv, d_model]``;
relu feed-forward ``wi[d_model, d_ff]``, ``wo_ff[d_ff, d_model]``; residual
adds; no biases) -> final layer norm -> logits through a separate (untied)
``softmax_w[d_model, vocab]`` -> mean cross-entropy against ``labels[batch, seq]``.

Attention is unmasked (see :func:`layoutsearch.zoo._blocks.self_attention`); there is no
position embedding (Mesh-TF adds a sinusoidal/learned one: it changes no
layout decision of the layer stack).

``dropout``: the rate of dropout on the attention probabilities and on the
attention and feed-forward outputs before their residual adds (as GPT's, see
:func:`layoutsearch.zoo._blocks.dropout`); 0 (default): none, the graph unchanged.

Parameters: 2 · vocab · d_model + layers · (4 · d_model · heads · d_kv
+ 2 · d_model · d_ff + 2 · d_model) + d_model.
"""

from __future__ import annotations

import dataclasses

from layoutsearch.ir import Graph, GraphBuilder
from layoutsearch.zoo._blocks import Dims, LayerStyle, check_dropout, check_dtype, check_sizes, decoder_stack, lm_loss

NAME = "mtf-transformer"
STYLE = LayerStyle(bias=False, norm_bias=False, activation="relu")


def mtf_transformer(*, batch: int = 8, seq: int = 16, vocab: int = 128, d_model: int = 32, heads: int = 4,
                    d_kv: int = 8, d_ff: int = 64, layers: int = 2, dtype: str = "float32",
                    dropout: float = 0.0) -> Graph:
    """The Mesh-TF Transformer LM (decoder-only layer stack)."""
    check_sizes(NAME, batch=batch, seq=seq, vocab=vocab, d_model=d_model, heads=heads, d_kv=d_kv, d_ff=d_ff,
                layers=layers)
    check_dtype(NAME, dtype)
    check_dropout(NAME, dropout)
    b = GraphBuilder(NAME, dtype=dtype)
    d = Dims(batch=b.dim("batch", batch), seq=b.dim("seq", seq), kv_seq=b.dim("kv_seq", seq),
             d_model=b.dim("d_model", d_model), heads=b.dim("heads", heads), d_kv=b.dim("d_kv", d_kv),
             d_ff=b.dim("d_ff", d_ff))
    vocab_d = b.dim("vocab", vocab)
    ids = b.input("ids", [d.batch, d.seq], dtype="int32")
    labels = b.input("labels", [d.batch, d.seq], dtype="int32")
    embed = b.parameter("embed", [vocab_d, d.d_model])
    x = b.gather(embed, ids, vocab_d, name="embedded")
    x = decoder_stack(b, x, d, dataclasses.replace(STYLE, dropout=float(dropout)), layers)
    softmax_w = b.parameter("softmax_w", [d.d_model, vocab_d])
    loss = lm_loss(b, x, d, vocab_d, softmax_w, labels, norm_bias=False)
    meta = {"model": NAME, "batch": batch, "seq": seq, "vocab": vocab, "d_model": d_model, "heads": heads,
            "d_kv": d_kv, "d_ff": d_ff, "layers": layers, "dtype": dtype}
    if dropout:  # recorded only when used: the graph without dropout is unchanged
        meta["dropout"] = float(dropout)
    return b.build(loss, meta=meta)
