"""Hugging Face FlaxLlamaForCausalLM, tiny with grouped-query attention (4 heads, 2 KV heads); loss as
run_clm_flax.py writes it."""

import jax.numpy as jnp
import optax
from transformers import FlaxLlamaForCausalLM, LlamaConfig

from tests.thirdparty.common import BATCH, SEQ, Case, finish, tokens


def case() -> Case:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = FlaxLlamaForCausalLM(config, input_shape=(1, SEQ), seed=0)

    def loss(params, input_ids, attention_mask, labels):
        logits = model(input_ids, attention_mask=attention_mask, params=params, train=False)[0]
        shift_logits = logits[..., :-1, :]
        shift_labels = labels[..., 1:]
        return optax.softmax_cross_entropy_with_integer_labels(shift_logits, shift_labels).mean()

    ids = tokens(config.vocab_size)
    mask = jnp.ones((BATCH, SEQ), jnp.int32)
    return finish(Case("hf_llama", loss, model.params, (ids, mask, ids),
                       (None, ("batch", "seq"), ("batch", "seq"), ("batch", "seq"))))
