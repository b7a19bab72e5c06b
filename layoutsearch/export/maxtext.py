"""A layout as a MaxText config override: MaxText's own keys, mesh axes and logical axis names
(:func:`maxtext_overrides`, as commented YAML :func:`maxtext_yaml`).

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

from layoutsearch.errors import LayoutError
from layoutsearch.export.specs import logical_rules, without_stage_rules
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.remat import parse_remat
from layoutsearch.layout import Axes, Layout
from layoutsearch.mesh import Mesh

# -- tables ---------------------------------------------------------------------------------------------------------

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
  holds less than layoutsearch's ``none`` plan and recomputes the elementwise ops).

``full:N`` (the first N layers only) has no MaxText equivalent (one policy for every scanned layer): it
exports as ``full``, which holds no more memory and recomputes every layer (said in a comment)."""

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


# -- the overrides ----------------------------------------------------------------------------------------------------

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
    inner = without_stage_rules(layout, stage_axis)
    if graph is not None:
        inner.check(graph)
        unknown = sorted(set(dim_names or ()) - set(graph.dims))
        if unknown:
            raise LayoutError(f"dim_names names {', '.join(map(repr, unknown))}, which model {graph.name!r} lacks "
                              f"(dims: {', '.join(graph.dims)})")
    rules = logical_rules(inner)  # per-tensor entries raise before any other check
    out: dict[str, Any] = {"mesh_axes": list(MAXTEXT_MESH_AXES)}
    out.update(_maxtext_parallelism(mesh, names, slices, dcn_axis))
    out["data_sharding"] = [[names[a] for a in _batch_axes(inner, graph)]]
    out["logical_axis_rules"] = _maxtext_logical_rules(rules, mesh, names, dim_names, stage_axis)
    if remat is not None:
        out["remat_policy"] = MAXTEXT_REMAT_POLICY[parse_remat(remat, LayoutError).kind]
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
    from layoutsearch.costmodel.schedule import Schedule

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
    for dim, _ in logical_rules(without_stage_rules(layout, stage)):
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
                " (MaxText always remats its layers; 'minimal' recomputes least)" if remat == "none" else
                " (MaxText remats every layer alike: all of them recomputed, memory no higher)"
                if remat not in MAXTEXT_REMAT_POLICY else ""))
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
