"""An Equinox decoder-only LM (eqx.nn.Embedding, eqx.nn.LayerNorm, eqx.nn.MultiheadAttention, eqx.nn.Linear),
written per example and jax.vmap'ed over the batch as Equinox's examples (e.g. the BERT and GPT ones)
do. params, static = eqx.partition(model, eqx.is_array); the loss recombines them."""

import equinox as eqx
import jax
import jax.numpy as jnp

from tests.thirdparty.common import D_MODEL, HEADS, LAYERS, SEQ, VOCAB, Case, finish, tokens


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(D_MODEL)
        self.attn = eqx.nn.MultiheadAttention(HEADS, D_MODEL, key=k1)
        self.ln2 = eqx.nn.LayerNorm(D_MODEL)
        self.up = eqx.nn.Linear(D_MODEL, 4 * D_MODEL, key=k2)
        self.down = eqx.nn.Linear(4 * D_MODEL, D_MODEL, key=k3)

    def __call__(self, x, mask):  # x: [seq, d_model]
        h = jax.vmap(self.ln1)(x)
        x = x + self.attn(h, h, h, mask=mask)
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(lambda t: self.down(jax.nn.gelu(self.up(t))))(h)


class DecoderLM(eqx.Module):
    embed: eqx.nn.Embedding
    pos: jax.Array
    blocks: list[Block]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        keys = jax.random.split(key, LAYERS + 3)
        self.embed = eqx.nn.Embedding(VOCAB, D_MODEL, key=keys[0])
        self.pos = 0.02 * jax.random.normal(keys[1], (SEQ, D_MODEL))
        self.blocks = [Block(k) for k in keys[2:-1]]
        self.ln_f = eqx.nn.LayerNorm(D_MODEL)
        self.head = eqx.nn.Linear(D_MODEL, VOCAB, use_bias=False, key=keys[-1])

    def __call__(self, tokens):  # tokens: [seq] -> logits [seq, vocab]
        x = jax.vmap(self.embed)(tokens) + self.pos[: tokens.shape[0]]
        mask = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), bool))
        for block in self.blocks:
            x = block(x, mask)
        return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))


def case() -> Case:
    model = DecoderLM(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, inputs, targets):
        model = eqx.combine(params, static)
        logits = jax.vmap(model)(inputs)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))

    ids = tokens(VOCAB)
    targets = jnp.roll(ids, -1, axis=1)
    return finish(Case("equinox_lm", loss, params, (ids, targets), (None, ("batch", "seq"), ("batch", "seq"))))
