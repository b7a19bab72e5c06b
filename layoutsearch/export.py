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

Rule precedence is the same in layoutsearch and in Flax Linen (rules in order; a rule applies to a
tensor when its dim is still unassigned and none of its mesh axes is used yet; a rule with no axes,
``d_model:-``, claims the dim unsplit), so Linen rules are the layout's rules unchanged.

Flax NNX is different (flax 0.12.8, ``flax/nnx/spmd.py: get_var_pspec`` and
``flax/core/spmd.py: from_sharding_rules``): it turns the rules into a dict and looks each logical name
of a Variable's ``out_sharding`` up in it, with no precedence, no fallback (of two rules for a name the
last wins) and no check that a mesh axis is used once; a name without a rule is kept as it is, i.e. taken
as a mesh axis name. The NNX export therefore gives every dim of the graph exactly one value, the one it
has in every parameter, and refuses a layout in which a dim needs two values in two parameters.

MaxText (:data:`MAXTEXT_MESH_AXES`, :data:`MAXTEXT_AXIS_NAMES`, :data:`MAXTEXT_DIM_NAMES`,
:data:`MAXTEXT_REMAT_POLICY`): the mesh axes of the layout are mapped onto MaxText's mesh axes by name
(or ``axis_map``), every ``ici_*_parallelism`` and ``dcn_*_parallelism`` key is written (the ici values
multiply to the devices per slice, the dcn values to ``slices``), the dims become MaxText's logical axis
names, and the keys written are checked against ``layoutsearch/data/maxtext_keys.txt`` (the MaxText
0.2.x ``base.yml`` keys; see that file's header for where the list comes from).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from layoutsearch.errors import LayoutError, LayoutSearchError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, Layout, SpecEntry
from layoutsearch.mesh import Mesh

FORMATS = ("flax", "nnx", "maxtext", "specs", "python")
"""The formats :func:`export` writes."""

REMAT_POLICIES = ("none", "selective", "full")

# -- MaxText tables ---------------------------------------------------------------------------------------------------

MAXTEXT_MESH_AXES = ("data", "stage", "fsdp", "fsdp_transpose", "sequence", "tensor", "expert", "autoregressive")
"""MaxText 0.2.x's ``mesh_axes``, in MaxText's order (its ``create_device_mesh`` takes the ici/dcn values in
this fixed order, so ``mesh_axes`` must be exactly this list)."""

MAXTEXT_AXIS_NAMES: dict[str, tuple[str, ...]] = {
    "data": ("data", "dp", "replica", "batch", "dcn", "slice"),
    "stage": ("stage", "stages", "pipe", "pipeline", "pp"),
    "fsdp": ("fsdp", "zero", "sharded"),
    "fsdp_transpose": ("fsdp_transpose",),
    "sequence": ("sequence", "seq", "sp", "context", "cp"),
    "tensor": ("tensor", "model", "tp", "mp"),
    "expert": ("expert", "experts", "ep"),
    "autoregressive": ("autoregressive",),
}
"""MaxText mesh axis -> the layoutsearch mesh axis names (case-insensitive) mapped onto it by default.
Other names need ``axis_map``."""

MAXTEXT_DIM_NAMES: dict[str, tuple[str, ...]] = {
    "batch": ("activation_batch", "activation_batch_no_exp", "activation_embed_and_logits_batch",
              "activation_kv_batch"),
    "seq": ("activation_length", "activation_q_length", "activation_norm_length"),
    "kv_seq": ("activation_kv_length",),
    "d_model": ("embed", "embed_no_exp", "activation_embed", "norm"),
    "d_ff": ("mlp", "activation_mlp"),
    "heads": ("heads", "q_heads", "kv_heads", "activation_heads", "activation_kv_heads"),
    "kv_heads": ("kv_heads", "q_heads", "heads", "activation_kv_heads", "activation_heads"),
    "d_kv": ("kv", "kv_head_dim", "activation_kv", "activation_kv_head_dim"),
    "vocab": ("vocab", "activation_vocab"),
    "experts": ("exp", "activation_exp"),
    "q_per_kv": (),
    "rope_half": (),
    "rope_out": (),
    "rope_freq": (),
    "capacity": (),
}
"""Dim of the zoo's transformers (``gpt``, ``mtf-transformer``, ``moe``) -> MaxText logical axis names.

MaxText names parameter and activation dims apart (``embed`` / ``activation_embed``); a dim's rule is
written for each of its names, in the rule's place, so precedence is unchanged. Query heads: MaxText
flattens them into ``q_heads`` (kv-head major), so a split of ``kv_heads`` is a contiguous split of
``q_heads``; ``q_per_kv`` and the rotary dims have no MaxText name (an empty tuple) and must stay
unsplit. Dims not listed keep their own name. Override per dim with ``dim_names``."""

MAXTEXT_REMAT_POLICY: dict[str, str] = {"none": "minimal", "selective": "minimal", "full": "full"}
"""layoutsearch remat -> MaxText ``remat_policy``.

* ``full`` -> ``full``: save nothing in a layer, recompute it before its backward pass.
* ``selective`` -> ``minimal``: ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims`` keeps the
  outputs of matmuls with a weight and recomputes elementwise ops and attention's batched matmuls, which
  is layoutsearch's ``selective`` (Korthikanti et al. 2022).
* ``none`` -> ``minimal``: MaxText always wraps its decoder layers in ``nn.remat`` and 0.2.x has no
  policy that saves every activation; ``minimal`` is the one that recomputes least (MaxText's step then
  holds less than layoutsearch's ``none`` plan and recomputes the elementwise ops)."""

_KEYS_FILE = "data/maxtext_keys.txt"
_PIPELINE_KEYS = ("num_pipeline_microbatches", "num_layers_per_pipeline_stage", "num_pipeline_repeats")


@lru_cache(maxsize=1)
def maxtext_keys() -> frozenset[str]:
    """The MaxText 0.2.x ``base.yml`` keys of ``layoutsearch/data/maxtext_keys.txt`` (see its header)."""
    text = resources.files("layoutsearch").joinpath(_KEYS_FILE).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def maxtext_parallelism_key(axis: str, kind: str = "ici") -> str:
    """The config key sizing MaxText mesh axis ``axis`` within (``ici``) or across (``dcn``) slices:
    ``ici_data_parallelism``, ..., and ``ici_pipeline_parallelism`` for the ``stage`` axis."""
    if axis not in MAXTEXT_MESH_AXES:
        raise LayoutError(f"{axis!r} is not a MaxText mesh axis (MaxText's: {', '.join(MAXTEXT_MESH_AXES)})")
    if kind not in ("ici", "dcn"):
        raise LayoutError(f"parallelism kind must be 'ici' or 'dcn', got {kind!r}")
    return f"{kind}_{'pipeline' if axis == 'stage' else axis}_parallelism"


# -- PartitionSpecs and Flax Linen ------------------------------------------------------------------------------------

def partition_specs(layout: Layout, graph: Graph) -> dict[str, tuple[SpecEntry, ...]]:
    """Tensor name -> PartitionSpec entries (None, an axis, or a tuple of axes per dim).

    Checks the layout against ``graph`` first (LayoutError if it does not fit)."""
    layout.check(graph)
    return {t.name: layout.spec(t) for t in graph.tensors.values()}


def _rules(layout: Layout) -> tuple[tuple[str, Axes], ...]:
    """The layout's rules, which apply exactly as Flax applies logical axis rules."""
    if layout.tensors:
        names = ", ".join(repr(n) for n, _ in layout.tensors)
        raise LayoutError(f"layout has per-tensor entries ({names}), which logical axis rules cannot express; "
                          "export it with partition_specs or python_snippet instead")
    return layout.rules


def _entry(axes: Axes) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def flax_logical_axis_rules(layout: Layout) -> list[tuple[str, str | tuple[str, ...] | None]]:
    """The global rules as Flax ``logical_axis_rules``: ``[("batch", "data"), ("embed", ("data", "fsdp")), ...]``.

    Logical axis names are the graph's dim names. Raises LayoutError for a
    layout with per-tensor entries (rules cannot express them)."""
    return [(dim, _entry(axes)) for dim, axes in _rules(layout)]


def _without_stage_rules(layout: Layout, stage_axis: str | None) -> Layout:
    """The layout inside a pipeline stage: rules naming the stage axis dropped (as the pipeline cost model does)."""
    if stage_axis is None:
        return layout
    layout.mesh.axis_size(stage_axis)  # a clear error for an axis the mesh lacks
    return Layout(layout.mesh, tuple((d, a) for d, a in layout.rules if stage_axis not in a), layout.tensors)


# -- Flax NNX ---------------------------------------------------------------------------------------------------------

def _nnx_values(layout: Layout, graph: Graph) -> tuple[dict[str, SpecEntry], dict[str, list[str]]]:
    """Dim -> its one NNX value, and dim -> the non-parameter tensors in which the layout gives it another."""
    specs = partition_specs(layout, graph)
    order = [d for d, _ in layout.rules if d in graph.dims]
    order += [d for d in graph.dims if d not in order]
    order = list(dict.fromkeys(order))
    first_rule = {}
    for d, axes in layout.rules:
        first_rule.setdefault(d, _entry(axes))
    param_value: dict[str, tuple[SpecEntry, str]] = {}
    for t in graph.tensors.values():
        if t.role not in ("parameter", "optimizer_state"):
            continue
        for d, s in zip(t.dim_names, specs[t.name], strict=True):
            if d not in param_value:
                param_value[d] = (s, t.name)
            elif param_value[d][0] != s:
                other_spec, other = param_value[d]
                raise LayoutError(
                    f"Flax NNX gives a logical axis one mesh-axes value, but this layout splits dim {d!r} as "
                    f"{other_spec!r} in {other!r} and as {s!r} in {t.name!r}; export it as 'flax' (Linen rules, "
                    "which nn.logical_to_mesh_axes applies with precedence) or 'specs' instead")
    values: dict[str, SpecEntry] = {}
    for d in order:
        values[d] = param_value[d][0] if d in param_value else first_rule.get(d)
    differ: dict[str, list[str]] = {}
    for t in graph.tensors.values():
        for d, s in zip(t.dim_names, specs[t.name], strict=True):
            if s != values[d]:
                differ.setdefault(d, []).append(t.name)
    return values, differ


def nnx_logical_axis_rules(layout: Layout, graph: Graph) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """The rules Flax NNX needs: ``(("batch", "data"), ("d_model", None), ...)``, one pair per dim of ``graph``.

    Use with ``nnx.logical_axis_rules(rules)`` (or a Variable's ``sharding_rules`` metadata) and Variables
    whose ``out_sharding`` holds the graph's dim names; ``nnx.get_partition_spec`` then gives every
    parameter the layout's PartitionSpec. NNX looks names up without precedence, so each dim gets the
    one value it has in every parameter (LayoutError if two parameters need two values); dims in no
    parameter get their first rule's axes. Activations in which the layout splits a dim otherwise are
    reported by :func:`export`'s ``nnx`` text; constrain them with the ``specs`` export."""
    values, _ = _nnx_values(layout, graph)
    return tuple(values.items())


# -- MaxText ----------------------------------------------------------------------------------------------------------

def maxtext_axis_map(mesh_names: Sequence[str], axis_map: Mapping[str, str] | None = None,
                     stage_axis: str | None = None) -> dict[str, str]:
    """Mesh axis -> MaxText mesh axis: ``axis_map`` first, ``stage_axis`` -> ``stage``, then the conventional
    names of :data:`MAXTEXT_AXIS_NAMES`. LayoutError for an axis with no counterpart or two axes on one."""
    axis_map = dict(axis_map or {})
    for a, target in axis_map.items():
        if a not in mesh_names:
            raise LayoutError(f"axis_map names mesh axis {a!r}, which the mesh lacks (mesh axes: {', '.join(mesh_names)})")
        if target not in MAXTEXT_MESH_AXES:
            raise LayoutError(f"axis_map maps {a!r} to {target!r}, which is not a MaxText mesh axis "
                              f"(MaxText's: {', '.join(MAXTEXT_MESH_AXES)})")
    out: dict[str, str] = {}
    for a in mesh_names:
        if a in axis_map:
            target = axis_map[a]
        elif a == stage_axis:
            target = "stage"
        else:
            target = next((m for m, names in MAXTEXT_AXIS_NAMES.items() if a.lower() in names), None)
            if target is None:
                raise LayoutError(
                    f"mesh axis {a!r} has no MaxText counterpart: name it like one of MaxText's mesh axes "
                    f"({', '.join(MAXTEXT_MESH_AXES)}) or pass axis_map={{{a!r}: 'fsdp'}} (any of those)")
        if a == stage_axis and target != "stage":
            raise LayoutError(f"stage axis {a!r} must map to MaxText's 'stage' axis (axis_map maps it to {target!r})")
        clash = next((b for b, t in out.items() if t == target), None)
        if clash is not None:
            raise LayoutError(f"mesh axes {clash!r} and {a!r} both map to MaxText's {target!r} axis; "
                              "map one of them elsewhere with axis_map")
        out[a] = target
    return out


def _maxtext_names(dim: str, dim_names: Mapping[str, str | Sequence[str]] | None) -> tuple[str, ...]:
    if dim_names is not None and dim in dim_names:
        names = dim_names[dim]
        return (names,) if isinstance(names, str) else tuple(names)
    return MAXTEXT_DIM_NAMES.get(dim, (dim,))


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def maxtext_overrides(layout: Layout, dim_names: Mapping[str, str | Sequence[str]] | None = None, *,
                      graph: Graph | None = None, axis_map: Mapping[str, str] | None = None,
                      remat: str | None = None, microbatches: int = 1, stage_axis: str | None = None,
                      schedule: str | None = None, slices: int = 1, dcn_axis: str | None = None) -> dict[str, Any]:
    """A MaxText config fragment (plain lists and numbers, ready for ``yaml.safe_dump`` or ``json.dumps``).

    Keys (all in :func:`maxtext_keys`): ``mesh_axes`` (MaxText's own list), ``ici_<axis>_parallelism`` and
    ``dcn_<axis>_parallelism`` for every MaxText mesh axis (``stage``: ``*_pipeline_parallelism``; the ici
    values multiply to the devices per slice, the dcn values to ``slices``), ``data_sharding`` (the
    MaxText axes splitting the input batch), ``logical_axis_rules`` (``[[logical name, [mesh axes]], ...]``
    in MaxText's names), and, as given: ``remat_policy`` (:data:`MAXTEXT_REMAT_POLICY`),
    ``num_pipeline_microbatches`` / ``num_pipeline_repeats`` / ``num_layers_per_pipeline_stage`` (with a
    stage axis), ``gradient_accumulation_steps`` (micro-batches without one), ``per_device_batch_size``
    (given a graph with a ``batch`` dim).

    * ``axis_map``: layoutsearch mesh axis -> MaxText mesh axis, for names :data:`MAXTEXT_AXIS_NAMES` lacks.
    * ``dim_names``: dim -> MaxText logical name(s), overriding :data:`MAXTEXT_DIM_NAMES` (an empty list:
      no name); dims in neither keep their name.
    * ``stage_axis``: the pipeline axis (MaxText ``stage``); an axis named like a stage axis is one anyway,
      as MaxText pipelines whenever ``ici_pipeline_parallelism`` > 1. Rules naming it are dropped.
    * ``schedule``: ``gpipe``, ``1f1b`` (MaxText's pipeline runs GPipe-style; the keys are the same) or
      ``interleaved:V`` (``num_pipeline_repeats: V``, MaxText's circular pipeline).
    * ``slices`` (> 1: multi-slice) splits ``dcn_axis`` (default: the major-most mesh axis it divides) into
      ``slices`` across slices (``dcn_*``) times the rest within a slice (``ici_*``)."""
    mesh = layout.mesh
    names = maxtext_axis_map(mesh.names, axis_map, stage_axis)
    if stage_axis is None:
        stage_axis = next((a for a, t in names.items() if t == "stage"), None)
    inner = _without_stage_rules(layout, stage_axis)
    if graph is not None:
        inner.check(graph)
    rules = _rules(inner)  # per-tensor entries raise before any other check
    out: dict[str, Any] = {"mesh_axes": list(MAXTEXT_MESH_AXES)}
    out.update(_maxtext_parallelism(mesh, names, slices, dcn_axis))
    out["data_sharding"] = [[names[a] for a in _batch_axes(inner, graph)]]
    out["logical_axis_rules"] = _maxtext_logical_rules(rules, mesh, names, dim_names, stage_axis)
    if remat is not None:
        if remat not in MAXTEXT_REMAT_POLICY:
            raise LayoutError(f"unknown remat {remat!r} (known: {', '.join(REMAT_POLICIES)})")
        out["remat_policy"] = MAXTEXT_REMAT_POLICY[remat]
    out.update(_maxtext_pipeline(mesh, stage_axis, microbatches, schedule, graph))
    if graph is not None and "batch" in graph.dims:
        accumulation = out.get("gradient_accumulation_steps", 1)
        out["per_device_batch_size"] = _number(graph.dims["batch"] / (mesh.size * accumulation))
    unknown = sorted(set(out) - maxtext_keys())
    assert not unknown, f"keys not in {_KEYS_FILE}: {unknown}"
    return out


def _maxtext_parallelism(mesh: Mesh, names: Mapping[str, str], slices: int, dcn_axis: str | None) -> dict[str, int]:
    """The ``ici_*`` and ``dcn_*`` parallelism keys of :func:`maxtext_overrides`: every MaxText mesh axis's
    size within a slice and across ``slices`` (``dcn_axis``, default the major-most mesh axis they divide,
    spans the slices)."""
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise LayoutError(f"slices must be a positive integer, got {slices!r}")
    ici = dict.fromkeys(MAXTEXT_MESH_AXES, 1)
    dcn = dict.fromkeys(MAXTEXT_MESH_AXES, 1)
    for a, size in mesh.axes:
        ici[names[a]] = size
    if slices > 1:
        if dcn_axis is None:
            dcn_axis = next((a for a, s in mesh.axes if s % slices == 0), None)
            if dcn_axis is None:
                raise LayoutError(f"no mesh axis of {mesh} is divisible by {slices} slices")
        size = mesh.axis_size(dcn_axis)
        if size % slices:
            raise LayoutError(f"mesh axis {dcn_axis!r} (size {size}) cannot span {slices} slices: not divisible")
        ici[names[dcn_axis]] = size // slices
        dcn[names[dcn_axis]] = slices
    elif dcn_axis is not None:
        mesh.axis_size(dcn_axis)
    assert math.prod(ici.values()) * math.prod(dcn.values()) == mesh.size
    out = {maxtext_parallelism_key(a, "ici"): ici[a] for a in MAXTEXT_MESH_AXES}
    out.update({maxtext_parallelism_key(a, "dcn"): dcn[a] for a in MAXTEXT_MESH_AXES})
    return out


def _batch_axes(inner: Layout, graph: Graph | None) -> Axes:
    """The mesh axes splitting the input batch: those of the graph's first input with a ``batch`` dim, else
    (no graph) those the rules give ``batch``."""
    if graph is not None:
        source = next((t for t in graph.tensors.values() if t.role == "input" and "batch" in t.dim_names), None)
        return inner.dim_layout(source).get("batch", ()) if source is not None else ()
    return inner.rules_layout(["batch"]).get("batch", ())


def _maxtext_logical_rules(rules_in: Sequence[tuple[str, Axes]], mesh: Mesh, names: Mapping[str, str],
                           dim_names: Mapping[str, str | Sequence[str]] | None,
                           stage_axis: str | None) -> list[list[Any]]:
    """MaxText's ``logical_axis_rules`` for ``rules_in`` (the layout's rules without those of the stage axis),
    in MaxText's logical names and mesh axes, plus the layers-over-stages rules of a pipeline."""
    rules: list[list[Any]] = []
    for dim, axes in rules_in:
        logical = _maxtext_names(dim, dim_names)
        if not logical and axes:
            raise LayoutError(
                f"rule {dim}:{'+'.join(axes)} splits dim {dim!r}, which has no MaxText logical axis name"
                + (" (MaxText flattens query heads into q_heads, kv-head major: split kv_heads instead)"
                   if dim == "q_per_kv" else "") + f"; pass dim_names={{{dim!r}: [...]}} to name it")
        for name in logical:
            rules.append([name, [names[a] for a in axes]])
    if stage_axis is not None and mesh.axis_size(stage_axis) > 1:
        rules += [["layers", ["stage"]], ["activation_stage", ["stage"]]]
    return rules


def _maxtext_pipeline(mesh: Mesh, stage_axis: str | None, microbatches: int, schedule: str | None,
                      graph: Graph | None) -> dict[str, int]:
    """The micro-batch keys of :func:`maxtext_overrides`: ``num_pipeline_microbatches``,
    ``num_layers_per_pipeline_stage`` and ``num_pipeline_repeats`` over a stage axis of more than one stage,
    else ``gradient_accumulation_steps`` (more than one micro-batch)."""
    from layoutsearch.costmodel.pipeline import Schedule

    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise LayoutError(f"microbatches must be a positive integer, got {microbatches!r}")
    sched = Schedule.parse(schedule or "1f1b")
    stages = mesh.axis_size(stage_axis) if stage_axis is not None else 1
    out: dict[str, int] = {}
    if stages > 1:
        if microbatches > 1:
            if microbatches % stages:
                raise LayoutError(f"MaxText needs num_pipeline_microbatches to be a multiple of the pipeline "
                                  f"stages ({stages}); got {microbatches} micro-batches")
            out["num_pipeline_microbatches"] = microbatches
        repeats = sched.virtual if sched.kind == "interleaved" else 1
        layers = graph.meta.get("layers") if graph is not None else None
        if isinstance(layers, int):
            if layers % (stages * repeats):
                raise LayoutError(f"{layers} layers do not split into {stages} stages x {repeats} repeats "
                                  "(MaxText: layers = stages x num_layers_per_pipeline_stage x num_pipeline_repeats)")
            out["num_layers_per_pipeline_stage"] = layers // (stages * repeats)
        out["num_pipeline_repeats"] = repeats
    elif microbatches > 1:
        out["gradient_accumulation_steps"] = microbatches
    return out


def maxtext_yaml(layout: Layout, graph: Graph | None = None, *, dim_names: Mapping[str, str | Sequence[str]] | None = None,
                 axis_map: Mapping[str, str] | None = None, remat: str | None = "none", microbatches: int = 1,
                 stage_axis: str | None = None, schedule: str | None = None, slices: int = 1,
                 dcn_axis: str | None = None) -> str:
    """:func:`maxtext_overrides` as commented YAML (each value a JSON flow value, which YAML reads as is)."""
    cfg = maxtext_overrides(layout, dim_names, graph=graph, axis_map=axis_map, remat=remat,
                            microbatches=microbatches, stage_axis=stage_axis, schedule=schedule, slices=slices,
                            dcn_axis=dcn_axis)
    mesh = layout.mesh
    names = maxtext_axis_map(mesh.names, axis_map, stage_axis)
    stage = stage_axis or next((a for a, t in names.items() if t == "stage"), None)
    model = f"model {graph.name!r} " if graph is not None else ""
    lines = [
        f"# layoutsearch: MaxText config overrides for {model}on mesh {mesh} ({mesh.size} devices, "
        f"{slices} slice{'s' if slices > 1 else ''}), layout {layout.describe() or '(replicated)'}",
        "# Keys of MaxText 0.2.x MaxText/configs/base.yml (list: layoutsearch/data/maxtext_keys.txt); merge them",
        "# into your MaxText config.",
        "# mesh axes -> MaxText: " + ", ".join(f"{a} -> {t}" for a, t in names.items()),
    ]
    ours = [names[a] for a in mesh.names]
    if ours != [a for a in MAXTEXT_MESH_AXES if a in ours]:
        lines.append("# (MaxText orders its mesh axes as mesh_axes below, whatever the order of the mesh above: same "
                     "shardings, other device placement)")
    lines += ["# mesh_axes is MaxText 0.2.x's own list, in the order its code builds the mesh from the ici/dcn values;",
              "# if your MaxText's base.yml lists other mesh axes, keep its mesh_axes and drop this line."]
    renamed = []
    for dim, _ in _rules(_without_stage_rules(layout, stage)):
        logical = _maxtext_names(dim, dim_names)
        if logical != (dim,):
            renamed.append(f"{dim} -> {', '.join(logical) or '(none)'}")
    piped = False
    for key, value in cfg.items():
        if key == "data_sharding":
            lines.append("# data_sharding: the MaxText axes splitting the input batch")
        if key == "logical_axis_rules":
            if renamed:
                lines.append("# logical axis names: " + "; ".join(dict.fromkeys(renamed)))
            lines.append("logical_axis_rules: [")
            lines += [f"  {json.dumps(r)}," for r in value[:-1]] + ([f"  {json.dumps(value[-1])}"] if value else [])
            lines.append("]")
            continue
        if key == "remat_policy":
            lines.append(f"# remat {remat} -> remat_policy {value!r}" + (
                " (MaxText always remats its layers; 'minimal' recomputes least)" if remat == "none" else ""))
        if key in _PIPELINE_KEYS and stage is not None and not piped:
            piped = True
            sched = schedule or "1f1b"
            lines.append(f"# pipeline over {stage!r} -> MaxText 'stage' ({mesh.axis_size(stage)} stages), schedule "
                         f"{sched}" + (": MaxText's pipeline runs GPipe-style (all micro-batches in flight)"
                                       if sched == "1f1b" else " (MaxText's circular pipeline)"
                                       if sched.startswith("interleaved") else ""))
            if "num_pipeline_microbatches" not in cfg:
                lines.append("# num_pipeline_microbatches not written (1 micro-batch): MaxText's default is the stages")
        if key == "per_device_batch_size" and graph is not None:
            accumulation = cfg.get("gradient_accumulation_steps", 1)
            lines.append(f"# per_device_batch_size: the plan's batch {graph.dims['batch']} / {mesh.size} devices"
                         + (f" / {accumulation} accumulation steps (MaxText's global batch = per_device_batch_size"
                            " x devices x gradient_accumulation_steps)" if accumulation > 1 else ""))
        lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


# -- Python snippet ---------------------------------------------------------------------------------------------------

def _spec_source(spec: tuple[SpecEntry, ...]) -> str:
    parts = []
    for s in spec:
        if s is None:
            parts.append("None")
        elif isinstance(s, str):
            parts.append(repr(s))
        else:
            parts.append("(" + ", ".join(repr(a) for a in s) + ")")
    return "P(" + ", ".join(parts) + ")"


def _mesh_source(layout: Layout) -> list[str]:
    mesh = layout.mesh
    return [
        "# Auto axes: XLA propagates shardings through every op (jax.make_mesh's default, Explicit axes,",
        "# rejects e.g. a matmul whose contracted dim is split).",
        f"mesh = jax.make_mesh({tuple(s for _, s in mesh.axes)!r}, {tuple(mesh.names)!r},",
        f"                     axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axes)})",
    ]


def python_snippet(layout: Layout, graph: Graph) -> str:
    """Paste-able Python: the mesh (Auto axes), ``partition_specs`` (one ``PartitionSpec`` per tensor),
    ``shardings`` (``NamedSharding`` per tensor) and, for a rules-only layout, ``logical_axis_rules``."""
    specs = partition_specs(layout, graph)
    mesh = layout.mesh
    rules = layout.describe() or "replicated"
    lines = [
        f"# layoutsearch: model {graph.name!r} on mesh {mesh} (rules: {rules})",
        "import jax",
        "from jax.sharding import NamedSharding",
        "from jax.sharding import PartitionSpec as P",
        "",
        *_mesh_source(layout),
        "partition_specs = {",
        *(f"    {name!r}: {_spec_source(spec)}," for name, spec in specs.items()),
        "}",
        "shardings = {name: NamedSharding(mesh, spec) for name, spec in partition_specs.items()}",
    ]
    if not layout.tensors:
        lines.append(f"logical_axis_rules = {flax_logical_axis_rules(layout)!r}  # Flax nn.logical_axis_rules")
    return "\n".join(lines) + "\n"


# -- the front door ---------------------------------------------------------------------------------------------------

_FLAX_REMAT = {
    "none": "no nn.remat",
    "selective": "nn.remat(Block, policy=jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims)",
    "full": "nn.remat(Block) (policy None: nothing saved, the layer recomputed)",
}


def _plan_comments(layout: Layout, remat: str, microbatches: int, stage_axis: str | None,
                   schedule: str | None) -> list[str]:
    out = [f"# remat {remat}: {_FLAX_REMAT[remat]} around each layer"]
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
           slices: int = 1, dcn_axis: str | None = None) -> str:
    """``layout`` (checked against ``graph``) in format ``fmt`` (:data:`FORMATS`), as paste-able text.

    * ``flax``: Python ``logical_axis_rules = [...]`` (Flax Linen; logical names = dim names);
    * ``nnx``: Python ``logical_axis_rules = (...)`` for ``nnx.logical_axis_rules`` (one pair per dim);
    * ``maxtext``: MaxText override YAML (:func:`maxtext_yaml`; ``dim_names``, ``axis_map``, ``slices``,
      ``dcn_axis`` apply here only);
    * ``specs``: JSON ``{tensor: [entry, ...]}`` (an entry: null, an axis, or a list of axes);
    * ``python``: :func:`python_snippet`.

    ``remat`` (none, selective, full), ``microbatches``, ``stage_axis`` and ``schedule`` describe the plan:
    MaxText gets their keys, flax and nnx a comment, and with a ``stage_axis`` the rules naming it are
    dropped (each stage is laid out over the other axes, as the pipeline cost model does)."""
    if fmt not in FORMATS:
        raise LayoutSearchError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    if remat not in REMAT_POLICIES:
        raise LayoutError(f"unknown remat {remat!r} (known: {', '.join(REMAT_POLICIES)})")
    layout.check(graph)
    if fmt == "maxtext":
        return maxtext_yaml(layout, graph, dim_names=dim_names, axis_map=axis_map, remat=remat,
                            microbatches=microbatches, stage_axis=stage_axis, schedule=schedule, slices=slices,
                            dcn_axis=dcn_axis)
    inner = _without_stage_rules(layout, stage_axis)
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
    values, differ = _nnx_values(inner, graph)
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
