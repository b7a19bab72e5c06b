"""A Flax Linen decoder-only transformer (nn.Embed, nn.MultiHeadDotProductAttention with
nn.make_causal_mask, nn.LayerNorm, an nn.Dense MLP), written as Flax's examples/lm1b writes one, with
logical axis names (nn.with_logical_partitioning) on its kernels; loss:
optax.softmax_cross_entropy_with_integer_labels, mean."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from layoutsearch.importer import flax_dims
from tests.thirdparty.common import D_MODEL, HEADS, LAYERS, SEQ, VOCAB, Case, finish, tokens

part = nn.with_logical_partitioning
init = nn.initializers.lecun_normal()


class Block(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=HEADS, kernel_init=part(init, ("embed", "heads", "kv")),
            out_kernel_init=part(init, ("heads", "kv", "embed")), deterministic=True)(h, h, mask=mask)
        x = x + h
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * D_MODEL, kernel_init=part(init, ("embed", "mlp")))(h)
        h = nn.Dense(D_MODEL, kernel_init=part(init, ("mlp", "embed")))(nn.gelu(h))
        return x + h


class DecoderLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D_MODEL, embedding_init=part(nn.initializers.normal(1.0), ("vocab", "embed")))(tokens)
        pos = self.param("pos_embed", part(nn.initializers.normal(0.02), ("length", "embed")), (SEQ, D_MODEL))
        x = x + pos[None, : tokens.shape[1]]
        mask = nn.make_causal_mask(tokens)
        for _ in range(LAYERS):
            x = Block()(x, mask)
        x = nn.LayerNorm()(x)
        return nn.Dense(VOCAB, kernel_init=part(init, ("embed", "vocab")))(x)


def case() -> Case:
    model = DecoderLM()
    ids = tokens(VOCAB)
    boxed = model.init(jax.random.key(0), ids)
    params = nn.unbox(boxed)

    def loss(params, inputs, targets):
        logits = model.apply(params, inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    targets = jnp.roll(ids, -1, axis=1)
    return finish(Case("flax_linen_lm", loss, params, (ids, targets),
                       (flax_dims(boxed), ("batch", "seq"), ("batch", "seq"))))
