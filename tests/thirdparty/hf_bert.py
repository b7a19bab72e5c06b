"""Hugging Face FlaxBertForMaskedLM, tiny; the masked-LM loss as run_mlm_flax.py writes it (cross entropy
weighted by a label mask, labels -100 where not masked)."""

import jax.numpy as jnp
import numpy as np
import optax
from flax.training.common_utils import onehot  # run_mlm_flax.py's onehot
from transformers import BertConfig, FlaxBertForMaskedLM

from tests.thirdparty.common import BATCH, SEQ, Case, finish, tokens


def case() -> Case:
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)
    model = FlaxBertForMaskedLM(config, input_shape=(1, SEQ), seed=0)

    def loss(params, input_ids, attention_mask, token_type_ids, labels):
        # run_mlm_flax.py train_step: label_mask = jnp.where(labels > 0, 1.0, 0.0) (labels are -100 where
        # not masked), onehot cross entropy times the mask, summed, divided by the number of masked tokens
        logits = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                       params=params, train=False)[0]
        label_mask = jnp.where(labels > 0, 1.0, 0.0)
        loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
        return loss.sum() / label_mask.sum()

    rng = np.random.default_rng(1)
    labels = tokens(config.vocab_size)
    masked = rng.random((BATCH, SEQ)) < 0.15
    masked[:, 0] = True  # at least one masked token per row
    input_ids = np.where(masked, 4, labels).astype(np.int32)  # 4: a stand-in [MASK] id (no tokenizer)
    labels = np.where(masked, labels, -100).astype(np.int32)
    mask = jnp.ones((BATCH, SEQ), jnp.int32)
    type_ids = jnp.zeros((BATCH, SEQ), jnp.int32)
    bs = ("batch", "seq")
    return finish(Case("hf_bert_mlm", loss, model.params, (input_ids, mask, type_ids, labels),
                       (None, bs, bs, bs, bs)))
