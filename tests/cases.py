"""The zoo x layout cases shared by the sharded-numerics, XLA-agreement, golden-cost
and solver tests: each is data (model, sizes, mesh, global rules, a short name).

Sizes are small (fast CPU compiles) and chosen so every split dim divides by
the mesh axes it is split over (8, or 2 and 4). Rules follow Flax precedence
(see :mod:`layoutsearch.layout`): e.g. FSDP ``batch:data,d_model:data`` gives
activations ``batch`` split over ``data`` and weights ``d_model`` split over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from layoutsearch import zoo
from layoutsearch.ir import Graph, Optimizer, training_graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

SGD = Optimizer(kind="sgd", lr=1.0)
"""SGD with lr 1: ``P - new/P`` is the gradient itself, so comparing the new
parameters checks the gradients at full strength (a small lr would hide them)."""

ADAM = Optimizer(kind="adam", lr=1e-3, eps=1e-3, step=1)
"""Adam with ``eps = lr``: at step 1 the update is ``lr * g / (|g| + eps)``, whose
derivative in ``g`` is at most ``lr / eps = 1``, so rounding noise in a gradient
that is exactly zero in exact arithmetic (GPT's key bias: softmax is invariant
to it) is not amplified into a +-lr step, as it is with ``eps = 1e-8``."""

SIZES: dict[str, dict[str, Any]] = {
    "mtf-ffn": {"batch": 16, "io": 32, "hidden": 64},
    "mlp": {"batch": 16, "features": 32, "hidden": 64, "classes": 16, "layers": 3},
    "mtf-transformer": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "d_kv": 8, "d_ff": 64,
                        "layers": 1},
    "gpt": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1},
    "moe": {"batch": 8, "seq": 16, "d_model": 32, "d_ff": 64, "experts": 8, "capacity": 4, "layers": 1},
}
"""Small sizes of each zoo model used by the cases."""

GPT_VARIANTS: dict[str, dict[str, Any]] = {
    # Llama / MaxText style: SwiGLU, grouped-query attention (8 query heads, 2 KV heads) with a head
    # dim independent of d_model / heads, RMSNorm, rotary positions, no biases, untied embeddings.
    "gpt-llama": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "kv_heads": 2, "d_kv": 8,
                  "d_ff": 64, "layers": 1, "mlp": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": 0,
                  "tie_embeddings": 0},
    # PaLM style: parallel attention and feed-forward with one layer norm (here with GPT's biases)
    "gpt-palm": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1, "parallel_block": 1},
    # multi-query attention, relu MLP, no position embedding
    "gpt-mqa": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 4, "kv_heads": 1, "layers": 1,
                "mlp": "relu", "position": "none"},
    # grouped-query attention (8 query heads, 2 KV heads) and a SwiGLU MLP, GPT's layer norm, positions and biases
    # otherwise (`--set mlp=swiglu --set kv_heads=2`)
    "gpt-gqa": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "kv_heads": 2, "layers": 1,
                "mlp": "swiglu"},
    # Megatron-LM's dropout: 0.1 on the attention probabilities and on the attention and MLP outputs
    "gpt-dropout": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1, "dropout": 0.1},
}
"""Small ``gpt`` configurations with the modern architecture options, by name."""


@dataclass(frozen=True)
class Case:
    """One model under one layout: ``name`` is ``<model>/<strategy>``."""

    name: str
    model: str
    mesh: str
    rules: str
    strategy: str  # dp, mp, 2d, fsdp, ep, sp
    sizes: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.sizes:
            object.__setattr__(self, "sizes", dict(SIZES[self.model]))

    @property
    def id(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        """The model and sizes the case lays out: its name before the ``/`` (e.g. ``gpt`` or
        ``gpt-llama``); cases of one family share their feeds and references."""
        return self.name.split("/", 1)[0]

    def graph(self) -> Graph:
        return _forward(self.model, tuple(sorted(self.sizes.items())))

    def training(self, optimizer: Optimizer | str = SGD) -> Graph:
        return _training(self.model, tuple(sorted(self.sizes.items())), Optimizer.of(optimizer))

    def layout(self) -> Layout:
        return Layout.from_rules(Mesh.parse(self.mesh), self.rules)


@cache
def _forward(model: str, sizes: tuple[tuple[str, Any], ...]) -> Graph:
    return zoo.build(model, **dict(sizes))


@cache
def _training(model: str, sizes: tuple[tuple[str, Any], ...], optimizer: Optimizer) -> Graph:
    return training_graph(_forward(model, sizes), optimizer)


def _c(model: str, strategy: str, mesh: str, rules: str, suffix: str = "") -> Case:
    return Case(f"{model}/{strategy}{suffix}", model, mesh, rules, strategy)


def _v(variant: str, strategy: str, mesh: str, rules: str, suffix: str = "") -> Case:
    """A case of a ``gpt`` variant (:data:`GPT_VARIANTS`)."""
    return Case(f"{variant}/{strategy}{suffix}", "gpt", mesh, rules, strategy, dict(GPT_VARIANTS[variant]))


_TRANSFORMER_MP = "heads:model,d_ff:model,vocab:model"

CASES: tuple[Case, ...] = (
    # Mesh-TF Table 1 network
    _c("mtf-ffn", "dp", "data:8", "batch:data"),
    _c("mtf-ffn", "mp", "model:8", "hidden:model"),
    _c("mtf-ffn", "2d", "data:2,model:4", "batch:data,hidden:model"),
    _c("mtf-ffn", "fsdp", "data:8", "batch:data,io:data"),
    # wide MLP classifier (hidden: column-parallel in, row-parallel out, Megatron style)
    _c("mlp", "dp", "data:8", "batch:data"),
    _c("mlp", "mp", "model:8", "hidden:model"),
    _c("mlp", "2d", "data:4,model:2", "batch:data,hidden:model,classes:model"),
    _c("mlp", "fsdp", "data:8", "batch:data,hidden:data,hidden2:data"),
    _c("mlp", "mp", "model:8", "hidden:model,hidden2:model", "-alternating"),
    # Mesh-TF transformer LM
    _c("mtf-transformer", "dp", "data:8", "batch:data"),
    _c("mtf-transformer", "mp", "model:8", _TRANSFORMER_MP),
    _c("mtf-transformer", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP),
    _c("mtf-transformer", "fsdp", "data:8", "batch:data,d_model:data"),
    _c("mtf-transformer", "sp", "data:2,seq:4", "batch:data,seq:seq"),
    _c("mtf-transformer", "2d", "data:2,model:4", "batch:data,d_model:model", "-dmodel"),
    # GPT decoder (tied embeddings)
    _c("gpt", "dp", "data:8", "batch:data"),
    _c("gpt", "mp", "model:8", _TRANSFORMER_MP),
    _c("gpt", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP),
    _c("gpt", "fsdp", "data:8", "batch:data,d_model:data"),
    # Llama-style GPT: KV heads split over model (Megatron-style GQA), or the query groups (K/V
    # replicated), or d_model (RMSNorm statistics all-reduced)
    _v("gpt-llama", "2d", "data:4,model:2", "batch:data,kv_heads:model,d_ff:model,vocab:model"),
    _v("gpt-llama", "2d", "data:2,model:4", "batch:data,q_per_kv:model,d_ff:model,vocab:model", "-groups"),
    _v("gpt-llama", "2d", "data:2,model:4", "batch:data,d_model:model", "-dmodel"),
    # the conventional layout of data:2,model:4 (`layoutsearch validate gpt --mesh data:2,model:4`): Megatron's
    # tensor parallelism with sequence parallelism on the same axis (seq:model applies where a tensor has none of
    # heads, d_ff, vocab: layer-norm inputs and outputs, residuals, pos_embed), and its llama-style variant
    _c("gpt", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP + ",seq:model", "-seq"),
    _v("gpt-gqa", "2d", "data:2,model:4", "batch:data,q_per_kv:model,d_ff:model,vocab:model,seq:model", "-seq"),
    # GPT with dropout: the masks are drawn per device block, the same as unsharded
    _v("gpt-dropout", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP),
    # mixture of experts
    _c("moe", "dp", "data:8", "batch:data"),
    _c("moe", "ep", "data:2,expert:4", "batch:data,experts:expert"),
    _c("moe", "mp", "data:2,model:4", "batch:data,d_ff:model"),
    _c("moe", "ep", "data:8", "experts:data,batch:data", "-gshard"),
)
"""Every case, in a stable order."""

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}


def feeds(case: Case, optimizer: Optimizer | str = SGD) -> dict[str, Any]:
    """Deterministic parameters, optimizer state and inputs of ``case``'s training graph
    (the same for every layout of one model)."""
    return _feeds(case.model, tuple(sorted(case.sizes.items())), Optimizer.of(optimizer))


@cache
def _feeds(model: str, sizes: tuple[tuple[str, Any], ...], optimizer: Optimizer) -> dict[str, Any]:
    from layoutsearch.backend.program import init_params, random_inputs

    g = _training(model, sizes, optimizer)
    return {**init_params(g), **random_inputs(g)}


def compiled(case: Case, optimizer: Optimizer | str = SGD, *, fused: bool = False) -> tuple[Any, Any]:
    """``(executable, jax mesh)`` of one training step of ``case`` under its layout,
    compiled once per session and shared by every test that needs it.

    LLVM runs at -O0 (:data:`~layoutsearch.backend.sharding.FAST_COMPILE`: the
    same HLO, a faster compile). Default: compiled with
    :data:`~layoutsearch.backend.sharding.UNFUSED` (the
    program whose FLOPs the op rules predict; same partitioning and
    collectives); the executable runs on feeds placed with :func:`placed`.
    ``fused=True``: the program a training loop runs, XLA's default pipeline
    with the updated parameters and optimizer state donated (what the memory
    model assumes); for inspection only (it takes ``(donated, kept)`` dicts)."""
    return _compiled(case, Optimizer.of(optimizer), fused)


@cache
def _compiled(case: Case, optimizer: Optimizer, fused: bool) -> tuple[Any, Any]:
    from layoutsearch.backend.sharding import FAST_COMPILE, UNFUSED, compile_step

    options = FAST_COMPILE if fused else {**UNFUSED, **FAST_COMPILE}
    return compile_step(case.training(optimizer), case.layout(), feeds(case, optimizer),
                        compiler_options=options, donate=fused)


def placed(case: Case, optimizer: Optimizer | str = SGD) -> dict[str, Any]:
    """The feeds of ``case`` put on its mesh with their layout's shardings (an
    argument of :func:`compiled`'s executable)."""
    import jax

    from layoutsearch.backend.sharding import feed_names, jax_mesh, named_shardings

    g = case.training(optimizer)
    sh = named_shardings(g, case.layout(), jax_mesh(case.layout().mesh))
    f = feeds(case, optimizer)
    return {k: jax.device_put(f[k], sh[k]) for k in feed_names(g)}


def case_params(cases: tuple[Case, ...] = CASES) -> list[Any]:
    """``pytest.param`` objects with readable ids."""
    import pytest

    return [pytest.param(c, id=c.name) for c in cases]
