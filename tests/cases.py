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

from graphs import build_model
from layoutsearch.ir import Graph, training_graph
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

SIZES: dict[str, dict[str, Any]] = {
    "mtf-ffn": {"batch": 16, "io": 32, "hidden": 64},
    "mlp": {"batch": 16, "features": 32, "hidden": 64, "classes": 16, "layers": 3},
    "mtf-transformer": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "d_kv": 8, "d_ff": 64,
                        "layers": 1},
    "gpt": {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 8, "layers": 1},
    "moe": {"batch": 8, "seq": 16, "d_model": 32, "d_ff": 64, "experts": 8, "capacity": 4, "layers": 1},
}
"""Small sizes of each zoo model used by the cases."""


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

    def graph(self) -> Graph:
        return _forward(self.model, tuple(sorted(self.sizes.items())))

    def training(self, optimizer: str = "sgd") -> Graph:
        return _training(self.model, tuple(sorted(self.sizes.items())), optimizer)

    def layout(self) -> Layout:
        return Layout.from_rules(Mesh.parse(self.mesh), self.rules)


@cache
def _forward(model: str, sizes: tuple[tuple[str, Any], ...]) -> Graph:
    return build_model(model, **dict(sizes))


@cache
def _training(model: str, sizes: tuple[tuple[str, Any], ...], optimizer: str) -> Graph:
    return training_graph(_forward(model, sizes), optimizer)


def _c(model: str, strategy: str, mesh: str, rules: str, suffix: str = "") -> Case:
    return Case(f"{model}/{strategy}{suffix}", model, mesh, rules, strategy)


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
    # Mesh-TF transformer LM
    _c("mtf-transformer", "dp", "data:8", "batch:data"),
    _c("mtf-transformer", "mp", "model:8", _TRANSFORMER_MP),
    _c("mtf-transformer", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP),
    _c("mtf-transformer", "fsdp", "data:8", "batch:data,d_model:data"),
    _c("mtf-transformer", "sp", "data:2,seq:4", "batch:data,seq:seq"),
    # GPT decoder (tied embeddings)
    _c("gpt", "dp", "data:8", "batch:data"),
    _c("gpt", "mp", "model:8", _TRANSFORMER_MP),
    _c("gpt", "2d", "data:2,model:4", "batch:data," + _TRANSFORMER_MP),
    _c("gpt", "fsdp", "data:8", "batch:data,d_model:data"),
    # mixture of experts
    _c("moe", "dp", "data:8", "batch:data"),
    _c("moe", "ep", "data:2,expert:4", "batch:data,experts:expert"),
    _c("moe", "mp", "data:2,model:4", "batch:data,d_ff:model"),
)
"""Every case, in a stable order."""

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}


def case_params(cases: tuple[Case, ...] = CASES) -> list[Any]:
    """``pytest.param`` objects with readable ids."""
    import pytest

    return [pytest.param(c, id=c.name) for c in cases]
