"""A Haiku decoder-only LM (hk.Embed, hk.LayerNorm, hk.MultiHeadAttention, hk.Linear; hk.transform) and its
loss, as Haiku's examples/transformer (model.py, train.py) write them: log_softmax times one_hot, masked
by the non-pad tokens."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from tests.thirdparty.common import D_MODEL, HEADS, LAYERS, VOCAB, Case, finish, tokens

PAD = 0


def layer_norm(x):
    return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(x)


def forward(tokens):
    seq = tokens.shape[1]
    initializer = hk.initializers.VarianceScaling(2 / LAYERS)
    x = hk.Embed(VOCAB, D_MODEL, w_init=hk.initializers.TruncatedNormal(stddev=0.02))(tokens)
    x = x + hk.get_parameter("positional_embeddings", [seq, D_MODEL], init=hk.initializers.TruncatedNormal(0.02))
    causal_mask = np.tril(np.ones((1, 1, seq, seq)))
    for _ in range(LAYERS):
        h = layer_norm(x)
        h = hk.MultiHeadAttention(num_heads=HEADS, key_size=D_MODEL // HEADS, model_size=D_MODEL,
                                  w_init=initializer)(h, h, h, mask=causal_mask)
        x = x + h
        h = layer_norm(x)
        h = hk.Linear(4 * D_MODEL, w_init=initializer)(h)
        h = hk.Linear(D_MODEL, w_init=initializer)(jax.nn.gelu(h))
        x = x + h
    return hk.Linear(VOCAB)(layer_norm(x))


def case() -> Case:
    model = hk.transform(forward)
    ids = tokens(VOCAB)
    params = model.init(jax.random.key(0), ids)

    def loss(params, input_tokens, targets):
        logits = model.apply(params, None, input_tokens)
        log_probs = jax.nn.log_softmax(logits)
        one_hot_targets = jax.nn.one_hot(targets, VOCAB)
        log_likelihood = jnp.sum(one_hot_targets * log_probs, axis=-1)
        mask = jnp.not_equal(input_tokens, PAD)  # train.py: don't train on padding
        return -jnp.sum(log_likelihood * mask) / jnp.sum(mask)

    targets = jnp.roll(ids, -1, axis=1)
    return finish(Case("haiku_lm", loss, params, (ids, targets), (None, ("batch", "seq"), ("batch", "seq"))))
