"""Exports of a layout to the formats JAX, Flax and MaxText programs consume.

One front door, :func:`export` (``layout``, ``graph``, a format name -> paste-able text):

* ``flax``: Flax Linen ``logical_axis_rules`` (:func:`flax_logical_axis_rules`) as Python, logical
  axis names = the graph's dim names, for ``nn.logical_axis_rules`` / ``nn.logical_to_mesh_sharding``;
* ``nnx``: the rules Flax NNX applies to ``nnx.Variable`` ``out_sharding`` metadata
  (:func:`nnx_logical_axis_rules`): one mesh-axes value per logical name, every dim of the graph;
* ``maxtext``: a MaxText config override YAML with MaxText's own keys, mesh axes and logical axis
  names (:func:`maxtext_overrides`, :func:`maxtext_yaml`);
* ``specs``: JSON ``{tensor name: PartitionSpec entries}`` for every tensor (:func:`partition_specs`);
* ``python``: a paste-able Python snippet that builds the mesh and one ``NamedSharding`` per tensor
  (:func:`python_snippet`).

The formats live in :mod:`~layoutsearch.export.specs` (PartitionSpecs, Flax Linen and NNX rules, the
Python snippet) and :mod:`~layoutsearch.export.maxtext` (the MaxText override); their public names are
importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from layoutsearch.errors import LayoutError, LayoutSearchError
from layoutsearch.export.maxtext import (
    MAXTEXT_AXIS_NAMES,
    MAXTEXT_REMAT_POLICY,
    maxtext_axis_map,
    maxtext_keys,
    maxtext_overrides,
    maxtext_parallelism_key,
    maxtext_yaml,
)
from layoutsearch.export.specs import (
    flax_logical_axis_rules,
    nnx_logical_axis_rules,
    nnx_values,
    partition_specs,
    python_snippet,
    without_stage_rules,
)
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.remat import REMAT_POLICIES, check_remat, parse_remat
from layoutsearch.layout import Layout

__all__ = [
    "FORMATS", "MAXTEXT_AXIS_NAMES", "MAXTEXT_REMAT_POLICY",
    "REMAT_POLICIES", "export", "flax_logical_axis_rules", "maxtext_axis_map", "maxtext_keys", "maxtext_overrides",
    "maxtext_parallelism_key", "maxtext_yaml", "nnx_logical_axis_rules", "partition_specs", "python_snippet",
]

FORMATS = ("flax", "nnx", "maxtext", "specs", "python")
"""The formats :func:`export` writes."""

# -- the front door ---------------------------------------------------------------------------------------------------

_FLAX_REMAT = {
    "none": "no nn.remat",
    "selective": "nn.remat(Block, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)",
    "full": "nn.remat(Block) (policy None: nothing saved, the layer recomputed)",
}


def _plan_comments(layout: Layout, remat: str, microbatches: int, stage_axis: str | None,
                   schedule: str | None) -> list[str]:
    blocks = parse_remat(remat).blocks
    out = [f"# remat {remat}: {_FLAX_REMAT['full']} around each of the first {blocks} layers, no nn.remat around "
           "the others" if blocks is not None else f"# remat {remat}: {_FLAX_REMAT[remat]} around each layer"]
    if stage_axis is not None:
        out.append(f"# pipeline over mesh axis {stage_axis!r} ({layout.mesh.axis_size(stage_axis)} stages, schedule "
                   f"{schedule or '1f1b'}, {microbatches} micro-batches): these rules lay out each stage; rules "
                   f"naming {stage_axis!r} are left out")
    elif microbatches > 1:
        out.append(f"# gradient accumulation over {microbatches} micro-batches (batch / {microbatches} each)")
    return out


def _example_dims(graph: Graph) -> str:
    """The dim names of a parameter of ``graph`` (one with the most dims), as Python source, for the comments."""
    params = [t for t in graph.tensors.values() if t.role == "parameter"] or list(graph.tensors.values())
    best = max(params, key=lambda t: len(t.dim_names), default=None)
    return repr(tuple(best.dim_names)) if best is not None else "('batch',)"


def _entries_source(pairs: Sequence[tuple[str, Any]], open_: str, close: str) -> list[str]:
    if not pairs:
        return [f"logical_axis_rules = {open_}{close}"]
    return [f"logical_axis_rules = {open_}", *(f"    {(d, v)!r}," for d, v in pairs), close]


def export(layout: Layout, graph: Graph, fmt: str, *, remat: str = "none", microbatches: int = 1,
           stage_axis: str | None = None, schedule: str | None = None,
           dim_names: Mapping[str, str | Sequence[str]] | None = None, axis_map: Mapping[str, str] | None = None,
           slices: int = 1, dcn_axis: str | None = None, maxtext_version: str | None = None) -> str:
    """``layout`` (checked against ``graph``) in format ``fmt`` (:data:`FORMATS`), as paste-able text.

    * ``flax``: Python ``logical_axis_rules = [...]`` (Flax Linen; logical names = dim names);
    * ``nnx``: Python ``logical_axis_rules = (...)`` for ``nnx.logical_axis_rules`` (one pair per dim);
    * ``maxtext``: MaxText override YAML (:func:`maxtext_yaml`; ``dim_names``, ``axis_map``, ``slices``,
      ``dcn_axis`` and ``maxtext_version`` apply here only);
    * ``specs``: JSON ``{tensor: [entry, ...]}`` (an entry: null, an axis, or a list of axes);
    * ``python``: :func:`python_snippet`.

    ``remat`` (none, selective, full, full:N), ``microbatches``, ``stage_axis`` and ``schedule`` describe the plan:
    MaxText gets their keys, flax and nnx a comment, and with a ``stage_axis`` the rules naming it are
    dropped (each stage is laid out over the other axes, as the pipeline cost model does)."""
    if fmt not in FORMATS:
        raise LayoutSearchError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    check_remat(remat, LayoutError)
    layout = layout.restricted(graph).check(graph)  # (a per-op plan's layout names backward tensors too)
    given = [name for name, v in (("dim_names", dim_names), ("axis_map", axis_map), ("slices", slices != 1),
                                  ("dcn_axis", dcn_axis), ("maxtext_version", maxtext_version)) if v]
    if fmt != "maxtext" and given:
        raise LayoutSearchError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to the maxtext format "
                                f"only, not {fmt}")
    if fmt == "maxtext":
        return maxtext_yaml(layout, graph, dim_names=dim_names, axis_map=axis_map, remat=remat,
                            microbatches=microbatches, stage_axis=stage_axis, schedule=schedule, slices=slices,
                            dcn_axis=dcn_axis, version=maxtext_version)
    inner = without_stage_rules(layout, stage_axis)
    if fmt == "specs":
        specs = partition_specs(inner, graph)
        items = [f"  {json.dumps(n)}: {json.dumps([list(e) if isinstance(e, tuple) else e for e in s])}"
                 for n, s in specs.items()]
        return "{\n" + ",\n".join(items) + "\n}\n"
    if fmt == "python":
        return python_snippet(inner, graph)
    head = f"# layoutsearch: model {graph.name!r} on mesh {layout.mesh}, layout {inner.describe() or '(replicated)'}"
    plan = _plan_comments(layout, remat, microbatches, stage_axis, schedule)
    if fmt == "flax":
        lines = [head,
                 "# Flax Linen logical_axis_rules (logical axis names = the model's dim names), used with",
                 f"# nn.with_logical_partitioning(init, {_example_dims(graph)}) and `with nn.logical_axis_rules(",
                 "# logical_axis_rules):` or nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh,",
                 "# logical_axis_rules); rules apply in order, as in layoutsearch.",
                 *plan, *_entries_source(flax_logical_axis_rules(inner), "[", "]")]
        return "\n".join(lines) + "\n"
    values, differ = nnx_values(inner, graph)
    lines = [head,
             "# Flax NNX logical axis rules: one mesh-axes value per logical name (the model's dim names), every dim",
             "# listed (NNX takes a name without a rule as a mesh axis). Declare parameters with",
             f"# nnx.Param(value, out_sharding={_example_dims(graph)}) and build the model under",
             "# `with jax.set_mesh(mesh), nnx.logical_axis_rules(logical_axis_rules):` (NNX shards each Param as",
             "# it is created; nnx.get_partition_spec / get_named_sharding under the rules give the same specs).",
             "# Exact for every parameter."]
    if differ:
        lines.append("# Activations where the layout splits a dim otherwise (constrain them with the 'specs' export): "
                     + "; ".join(f"{d}: {len(ts)} ({ts[0]}{', ...' if len(ts) > 1 else ''})"
                                 for d, ts in differ.items()))
    lines += [*plan, *_entries_source(list(values.items()), "(", ")")]
    return "\n".join(lines) + "\n"
