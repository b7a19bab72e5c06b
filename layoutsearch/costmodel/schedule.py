"""Pipeline schedules: how many micro-batch steps a loop over K stages takes, its bubble, and how many
micro-batches' activations a stage holds (see :mod:`layoutsearch.costmodel.pipeline` for how a step is priced).

::

    gpipe          (Huang et al. 2019, "GPipe", NeurIPS): all forwards, then all backwards
                   loop = (M + K - 1) * t,  stage k holds M micro-batches in flight
    1f1b           (PipeDream-flush, Narayanan et al. 2021, SC'21, section 2.2): one forward, one backward
                   loop = (M + K - 1) * t,  stage k holds min(M, K - k)
    interleaved:V  (Narayanan et al. 2021, section 2.2.1): each device holds V chunks of L / (K V) layers
                   loop = (M + (K - 1) / V) * t,  bubble (K - 1) / (V M); the first device holds
                   K (1 + (K - 1) / (K V)) micro-batches' worth of its activations (Korthikanti et al.
                   2022, "Reducing activation recomputation in large transformer models", section 4.2.3);
                   Megatron-LM requires M to be a multiple of K.

    maxtext        MaxText's pipeline (``layers/pipeline.py``, 0.2.5): GPipe over the decoder layers only, in
                   equal stages (``num_layers_per_pipeline_stage``); the embedding, the final norm, the
                   logits and the loss run outside the stages, on every device, the batch split over the stage
                   axis too (MaxText's ``activation_embed_and_logits_batch`` rule includes ``stage``)
                   loop = (M + K - 1) * t, stage k holds M micro-batches in flight; M a multiple of K

``t`` is the slowest stage's time for one micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from layoutsearch.errors import CostModelError

SCHEDULE_KINDS = ("gpipe", "1f1b", "interleaved", "maxtext")
"""Pipeline schedules (see the module docstring); ``interleaved`` is written ``interleaved:V``."""


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``kind`` (:data:`SCHEDULE_KINDS`) and ``virtual`` stages per device (V)."""

    kind: str = "1f1b"
    virtual: int = 1

    @classmethod
    def parse(cls, spec: Schedule | str) -> Schedule:
        """``gpipe``, ``1f1b``, ``interleaved:V`` (V >= 1) or ``maxtext``."""
        if isinstance(spec, Schedule):
            return spec
        if not isinstance(spec, str):
            raise CostModelError(f"schedule must be a string like '1f1b', got {spec!r}")
        name, colon, v = spec.strip().lower().partition(":")
        if name == "interleaved":
            if not colon or not v.strip().isdigit() or int(v) < 1:
                raise CostModelError(f"bad schedule {spec!r}: write interleaved:V with V >= 1 virtual stages "
                                     "per device, e.g. interleaved:2")
            return cls("interleaved", int(v))
        if name in ("gpipe", "1f1b", "maxtext") and not colon:
            return cls(name)
        raise CostModelError(f"unknown schedule {spec!r} (known: gpipe, 1f1b, interleaved:V, maxtext)")

    def __str__(self) -> str:
        return f"interleaved:{self.virtual}" if self.kind == "interleaved" else self.kind

    def check(self, stages: int, microbatches: int) -> None:
        """CostModelError if the schedule cannot run ``microbatches`` over ``stages``."""
        if self.kind == "interleaved" and stages > 1 and microbatches % stages:
            raise CostModelError(f"the interleaved schedule needs the micro-batches to be a multiple of the "
                                 f"stages (Megatron-LM's constraint): {microbatches} micro-batches, {stages} stages")
        if self.kind == "maxtext" and stages > 1 and microbatches % stages:
            raise CostModelError(f"MaxText needs num_pipeline_microbatches to be a multiple of the stages: "
                                 f"{microbatches} micro-batches, {stages} stages")

    @property
    def outside(self) -> bool:
        """Whether the ops before and after the blocks (embedding, head, loss) run outside the stages, on every
        device (MaxText's pipeline), rather than in the first and last stage."""
        return self.kind == "maxtext"

    def steps(self, stages: int, microbatches: int) -> float:
        """Length of the micro-batch loop in units of the slowest stage's micro-batch time."""
        bubble = stages - 1
        return microbatches + (bubble / self.virtual if self.kind == "interleaved" else bubble)

    def bubble(self, stages: int, microbatches: int) -> float:
        """The idle fraction of the loop with equal stages."""
        steps = self.steps(stages, microbatches)
        return (steps - microbatches) / steps

    def in_flight(self, stage: int, stages: int, microbatches: int) -> float:
        """Micro-batches' worth of activations stage ``stage`` holds at its peak."""
        if self.kind in ("gpipe", "maxtext"):
            return float(microbatches)
        held = float(min(microbatches, stages - stage))
        if self.kind == "interleaved" and stages > 1:
            # never more than the micro-batches there are (M = K: every chunk of every micro-batch at most)
            held = min(held * (1 + (stages - 1) / (stages * self.virtual)), float(microbatches))
        return held


def speedup(stages: int, microbatches: int) -> float:
    """GPipe speed-up of K identical stages over one: ``K * M / (M + K - 1)``."""
    return stages * microbatches / (microbatches + stages - 1)


__all__ = ["SCHEDULE_KINDS", "Schedule", "speedup"]
