"""Hugging Face FlaxGPT2LMHeadModel, tiny, built from a config; loss as run_clm_flax.py writes it."""

import jax.numpy as jnp
import optax
from transformers import FlaxGPT2LMHeadModel, GPT2Config

from tests.thirdparty.common import BATCH, SEQ, Case, finish, tokens


def case() -> Case:
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    model = FlaxGPT2LMHeadModel(config, input_shape=(1, SEQ), seed=0)

    def loss(params, input_ids, attention_mask, labels):
        # run_clm_flax.py: logits = state.apply_fn(**batch, params=params, dropout_rng=..., train=True)[0]
        logits = model(input_ids, attention_mask=attention_mask, params=params, train=False)[0]
        shift_logits = logits[..., :-1, :]
        shift_labels = labels[..., 1:]
        return optax.softmax_cross_entropy_with_integer_labels(shift_logits, shift_labels).mean()

    ids = tokens(config.vocab_size)
    mask = jnp.ones((BATCH, SEQ), jnp.int32)
    return finish(Case("hf_gpt2", loss, model.params, (ids, mask, ids),
                       (None, ("batch", "seq"), ("batch", "seq"), ("batch", "seq"))))
