"""Published training runs the cost model must reproduce (a check, never an input to fit).

Each :class:`PublishedRun` is one row of a paper's or project's table: the
model, the hardware, the mesh and layout as published, the batch, the remat
policy and the published step time. :func:`predict` prices it with the tool's
own presets and returns the predicted step time, MFU and peak memory against
the device's HBM; ``tests/test_published_runs.py`` bounds the errors and
``bench/bench_published.py`` prints the table.

Sources (with the published tables, in ``docs/published-runs.md``):

* Megatron-LM on DGX A100 (Narayanan et al., SC'21, arXiv 2104.04473, Table 1):
  GPT, seq 2048, vocab 51,200, tied embeddings, mixed precision, Adam, full
  activation recomputation, interleaved 1F1B, tensor parallelism inside a
  node. Step time derived as ``F / (GPUs x achieved FLOP/s)`` with the paper's
  ``F = 96 B s l h^2 (1 + s / 6h + V / 16 l h)``. Megatron-LM as of 2021: no
  flash attention (``attention="standard"``), no sequence parallelism, bf16
  with float32 gradient accumulation and all-reduce (``mixed-fp32-grads``, which
  Megatron-LM requires with ``--bf16``), and the data-parallel gradient
  all-reduce run after the backward pass, not overlapped with it
  (``overlap=0``: its ``--overlap-grad-reduce`` came in 2023). The runs used
  Megatron-LM's default dropout 0.1 on the attention probabilities and on the
  attention and MLP outputs (``--attention-dropout 0.1 --hidden-dropout 0.1``):
  the zoo's ``dropout=0.1``.
* MaxText on TPU v5e (AI-Hypercomputer/maxtext README): ``global_parameter_scale``
  16B/32B/64B/128B on 1-32 slices of 256 chips, FSDP inside a slice (128B:
  FSDP 16 x tensor 16), data parallelism across slices over DCN, flash
  attention, full remat (128B: all but the q/k/v projections, which are
  offloaded to host memory). Layout as MaxText's default logical axis rules
  give it: weights' ``embed`` (d_model) over fsdp, batch over data and fsdp,
  heads / mlp / vocab over tensor and the activations' ``embed`` over tensor
  (``activation_embed: tensor``). Step time derived as per-device TFLOPs /
  published TFLOP/s.

Choices the sources leave open, made once here and never per row to match a
number: micro-batch size 1 for pipelined Megatron rows (M = batch / DP), the
whole per-replica batch as one micro-batch without a pipeline; interleaved
schedule with V = 2 virtual stages; the 128B row's remat priced as ``full``
(it recomputes the q/k/v projections that MaxText offloads: slightly slower
than published).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEGATRON = "Narayanan et al. 2021 (SC'21), Table 1"
MAXTEXT = "MaxText README, TPU v5e global_parameter_scale benchmarks"


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: what ran and how long a step took."""

    name: str
    source: str
    model: str                      # zoo model
    sizes: dict[str, Any]           # zoo parameters (preset and overrides)
    hardware: str
    mesh: str
    layout: str
    published_step_s: float
    stage_axis: str | None = None
    microbatches: int = 1
    schedule: str = "1f1b"
    remat: str = "full"
    attention: str = "flash"
    precision: str = "mixed"
    overlap: str | float = "auto"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _megatron(params: str, tp: int, pp: int, dp: int, batch: int, step_s: float) -> PublishedRun:
    mesh = ",".join(f"{a}:{n}" for a, n in (("pipe", pp), ("data", dp), ("model", tp)) if n > 1 or a == "data")
    rules = "batch:data" + (",heads:model,d_ff:model,vocab:model" if tp > 1 else "")
    piped = pp > 1
    return PublishedRun(f"megatron-{params}", MEGATRON, "gpt",
                        {"preset": f"megatron-{params}", "batch": batch, "dropout": 0.1},
                        "a100", mesh, rules, step_s, stage_axis="pipe" if piped else None,
                        microbatches=batch // dp if piped else 1, schedule="interleaved:2" if piped else "1f1b",
                        attention="standard", precision="mixed-fp32-grads", overlap=0.0)


_MAXTEXT_STEPS = {  # model -> step seconds on 1, 2, 4, 8, 16, 32 slices
    "16b": (10.31, 10.57, 10.57, 10.75, 11.14, 11.45),
    "32b": (12.09, 12.47, 12.67, 12.77, 12.98, 13.41),
    "64b": (13.47, 14.19, 14.45, 14.72, 15.14, 16.06),
    "128b": (14.42, 14.42, 14.69, 15.25, 15.87, 17.43),
}
_PER_DEVICE_BATCH = {"16b": 6, "32b": 4, "64b": 2, "128b": 1}


def _maxtext(scale: str, slices: int, step_s: float) -> PublishedRun:
    batch = _PER_DEVICE_BATCH[scale] * 256 * slices
    if scale == "128b":
        mesh, rules = f"data:{slices},fsdp:16,tensor:16", \
            "batch:data+fsdp,heads:tensor,d_ff:tensor,vocab:tensor,d_model:fsdp,d_model:tensor"
    else:
        mesh, rules = f"data:{slices},fsdp:256", "batch:data+fsdp,d_model:fsdp"
    return PublishedRun(f"maxtext-{scale} x{slices}", MAXTEXT, "gpt", {"preset": f"maxtext-{scale}", "batch": batch},
                        "tpu-v5e", mesh, rules, step_s)


RUNS: tuple[PublishedRun, ...] = (
    _megatron("1.7b", 1, 1, 32, 512, 3.53),
    _megatron("3.6b", 2, 1, 32, 512, 3.70),
    _megatron("7.5b", 4, 1, 32, 512, 3.70),
    _megatron("18.4b", 8, 1, 32, 1024, 9.40),
    _megatron("39.1b", 8, 2, 32, 1536, 14.45),
    _megatron("76.1b", 8, 4, 32, 1792, 16.06),
    _megatron("145.6b", 8, 8, 24, 2304, 24.82),
    *(_maxtext(scale, 2**i, s) for scale, steps in _MAXTEXT_STEPS.items() for i, s in enumerate(steps)),
)
"""Every published run (see the module docstring)."""


def predict(run: PublishedRun) -> dict[str, Any]:
    """The cost model's prediction for ``run``: step time, its error against the published one, MFU and
    peak memory against the device's usable memory (HBM less the runtime's reserve)."""
    from layoutsearch import zoo
    from layoutsearch.costmodel.report import estimate
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import hardware
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    graph = zoo.build(run.model, **run.sizes)
    layout = Layout.from_rules(run.mesh, run.layout)
    hw = hardware(run.hardware)
    if run.stage_axis is None and run.microbatches == 1:
        rep = estimate(graph, layout, hw, precision=run.precision, remat=run.remat, attention=run.attention,
                       overlap=run.overlap)
    else:
        rep = estimate_pipeline(graph, layout, hw, stage_axis=run.stage_axis, microbatches=run.microbatches,
                                schedule=run.schedule, remat=run.remat, precision=run.precision,
                                attention=run.attention, overlap=run.overlap)
    step, memory, devices = rep.step_s, rep.memory_bytes, layout.mesh.size
    return {"run": run.name, "source": run.source, "published_step_s": run.published_step_s, "predicted_step_s": step,
            "error": step / run.published_step_s - 1, "mfu": rep.model_flops / (devices * hw.peak_flops * step),
            "memory_bytes": memory, "hbm_bytes": hw.hbm_bytes, "usable_bytes": hw.usable_bytes,
            "fits": memory <= hw.usable_bytes}


def search_published(run: PublishedRun, **options: Any) -> Any:
    """The search on ``run``'s mesh, hardware and batch, under the device's usable memory, with the run's
    precision, attention kernel and overlap held fixed (what the framework implements) and the layout, remat
    policy and gradient accumulation searched. A pipelined run's mesh keeps its stage axis: pipelines are
    searched (``pipeline="auto"``: over any axis, chosen when faster) with the run's schedule and micro-batch
    count.
    ``options`` override the search's arguments. Returns the :class:`~layoutsearch.solvers.plan.Plan`."""
    from layoutsearch import zoo
    from layoutsearch.solvers.search import search

    graph = zoo.build(run.model, **run.sizes)
    kw: dict[str, Any] = {"hardware": run.hardware, "precision": run.precision, "attention": run.attention,
                          "overlap": run.overlap, "top": 1}
    if run.stage_axis is not None:

        kw.update(pipeline="auto", microbatches=run.microbatches,
                  schedule=run.schedule)
    kw.update(options)
    return search(graph, run.mesh, **kw)


__all__ = ["RUNS", "PublishedRun", "predict", "search_published"]
