"""The textbook layouts a search compares its plan with, as rule sets of the rules space.

Data parallelism (batch over every axis), FSDP (data parallelism with parameters, gradients and optimizer
state split over the same axes), Megatron-style tensor parallelism (the heads / feed-forward / vocabulary
dims over the minor axis, batch over the others; Shoeybi et al. 2019) and the Mesh-TensorFlow 2-D layout
(batch over the major axis, the model dims over the others; Shazeer et al. 2018).
"""

from __future__ import annotations

import math
from typing import Any

from layoutsearch.ir.graph import Graph
from layoutsearch.mesh import Mesh
from layoutsearch.solvers.rulesets import RuleSets, model_groups, rule_set

_MODEL_DIMS = ("heads", "kv_heads", "q_per_kv", "d_ff", "hidden", "vocab", "experts")


def _dividing(axes: list[tuple[str, int]], size: int) -> list[str]:
    """The longest prefix of ``axes`` whose product divides ``size``."""
    out, prod = [], 1
    for a, s in axes:
        if size % (prod * s):
            break
        out.append(a)
        prod *= s
    return out


def baseline_rules(graph: Graph, mesh: Mesh) -> dict[str, tuple[RuleSets | None, str]]:
    """The baselines as one-candidate rule sets (None, with the reason, when one does not apply)."""
    dims = list(graph.dims)
    big = [(a, s) for a, s in mesh.axes if s > 1]
    batch = "batch" if "batch" in dims else (graph.inputs[0].dim_names[0] if graph.inputs else dims[0])
    out: dict[str, tuple[RuleSets | None, str]] = {}
    data = _dividing(big, graph.dims[batch])
    choice: dict[str, Any] = {a: batch for a in data}
    pick = lambda ch: [ch.get(a) for a in mesh.names]
    out["data-parallel"] = (rule_set(pick(choice), dims, mesh), "") if data else (None, f"{batch} is not divisible")
    pbytes: dict[str, int] = {}
    for t in graph.parameters:
        for d in t.dim_names:
            pbytes[d] = pbytes.get(d, 0) + t.nbytes
    group = math.prod(s for a, s in big if a in data)
    fsdp_dim = next((d for d in sorted(pbytes, key=lambda d: -pbytes[d]) if graph.dims[d] % group == 0), None)
    if data and fsdp_dim is not None:
        out["fsdp"] = (rule_set(pick(choice), dims, mesh, fsdp_dim, data), "")
    else:
        out["fsdp"] = (None, "no parameter dim divisible by the data-parallel axes")
    groups = model_groups(graph)
    named = [d for d in _MODEL_DIMS if d in dims]
    ranked = sorted(groups, key=lambda g: -sum(d in named for d in g))
    model: tuple[str, ...] | None = ranked[0] if ranked and any(d in named for d in ranked[0]) else None
    if model is None:
        model = (named[0],) if named else (max(pbytes, key=lambda d: (pbytes[d], d)),) if pbytes else None
    if len(big) < 2 or model is None:
        why = "needs at least two mesh axes" if len(big) < 2 else "no model dims"
        out["megatron"] = (None, why)
        out["mesh-tf-2d"] = (None, why)
        return out

    def tensor_parallel(data_axes: list[tuple[str, int]], model_axes: list[tuple[str, int]]) -> RuleSets | None:
        size = math.prod(s for _, s in model_axes)
        members = tuple(d for d in model if graph.dims[d] % size == 0)
        d_axes = _dividing(data_axes, graph.dims[batch])
        if not members:
            return None
        ch: dict[str, Any] = {a: batch for a in d_axes}
        ch.update({a: members if len(members) > 1 else members[0] for a, _ in model_axes})
        return rule_set(pick(ch), dims, mesh)

    mega = tensor_parallel(big[:-1], big[-1:])
    out["megatron"] = (mega, "") if mega is not None else (None, "no model dim divisible by the minor axis")
    two_d = tensor_parallel(big[:1], big[1:])
    out["mesh-tf-2d"] = (two_d, "") if two_d is not None else (None, "no model dim divisible by the minor axes")
    return out



def baseline_sets(base: dict[str, tuple[RuleSets | None, str]]) -> RuleSets | None:
    """The baselines' rule sets (:func:`baseline_rules`), as extra candidates of the rules space."""
    extra = None
    for rs, _ in base.values():
        if rs is not None:
            extra = rs if extra is None else extra.concat(rs)
    return extra



__all__ = ["baseline_rules", "baseline_sets"]
