"""A Flax NNX decoder-only transformer (nnx.Embed, nnx.MultiHeadAttention, nnx.LayerNorm, nnx.Linear) with
logical axis names from nnx.with_partitioning, as the NNX guides (and examples/gemma, lm1b_nnx) write them.
params = nnx.state(model, nnx.Param); the loss merges them back with nnx.merge."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layoutsearch.importer import flax_dims
from tests.thirdparty.common import D_MODEL, HEADS, LAYERS, VOCAB, Case, finish, tokens

init = nnx.initializers.lecun_normal()
named = nnx.with_partitioning


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=HEADS, in_features=D_MODEL, decode=False, deterministic=True,
            kernel_init=named(init, ("embed", "heads", "kv")),
            out_kernel_init=named(init, ("heads", "kv", "embed")), rngs=rngs)
        self.ln2 = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.up = nnx.Linear(D_MODEL, 4 * D_MODEL, kernel_init=named(init, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(4 * D_MODEL, D_MODEL, kernel_init=named(init, ("mlp", "embed")), rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class DecoderLM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, D_MODEL, embedding_init=named(nnx.initializers.normal(1.0), ("vocab", "embed")),
                               rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.ln_f = nnx.LayerNorm(D_MODEL, rngs=rngs)
        self.head = nnx.Linear(D_MODEL, VOCAB, kernel_init=named(init, ("embed", "vocab")), rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def case() -> Case:
    # flax 0.12 shards a Variable with names as it is created (flax_always_shard_variable, default on) and
    # refuses without a mesh: "An auto mesh context or metadata is required ..."; build it unsharded
    with nnx.use_eager_sharding(False):
        model = DecoderLM(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(params, inputs, targets):
        model = nnx.merge(graphdef, params)
        logits = model(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    ids = tokens(VOCAB)
    targets = jnp.roll(ids, -1, axis=1)
    return finish(Case("flax_nnx_lm", loss, params, (ids, targets),
                       (flax_dims(params), ("batch", "seq"), ("batch", "seq"))))
