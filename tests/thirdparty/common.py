"""Shared by the third-party model cases: the Case record and the tiny example batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH, SEQ, VOCAB, D_MODEL, LAYERS, HEADS = 8, 16, 128, 64, 2, 4


@dataclass
class Case:
    name: str
    loss: Callable[..., Any]          # loss(params, *batch_args) -> scalar
    params: Any                       # the user's parameter pytree (plain arrays)
    batch_args: tuple[Any, ...]       # example inputs (int32 ids, labels, masks)
    dims: tuple[Any, ...]             # dims= for from_jax: None for params, names for batch axes
    eager_loss: float = float("nan")  # float(loss(params, *batch_args))


def tokens(vocab: int = VOCAB, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> np.ndarray:
    """A random batch of token ids, int32 [batch, seq]."""
    return np.random.default_rng(seed).integers(0, vocab, (batch, seq), dtype=np.int32)


def finish(case: Case) -> Case:
    """Run the loss eagerly and record it (must be finite)."""
    case.eager_loss = float(case.loss(case.params, *case.batch_args))
    assert np.isfinite(case.eager_loss), (case.name, case.eager_loss)
    return case
