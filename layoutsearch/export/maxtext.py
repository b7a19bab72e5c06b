"""A plan as a MaxText config override, in the terms of one MaxText version (:func:`maxtext_overrides`; as
commented YAML :func:`maxtext_yaml`).

Everything MaxText-specific comes from that version's own files (:mod:`layoutsearch.maxtext.version`: its
``base.yml`` keys, mesh axes and logical-name vocabulary, the logical names its layers give each tensor)
and from which MaxText tensor is which tensor of the plan's graph (:mod:`layoutsearch.maxtext.tensors`):

* each MaxText logical name's rule is the mesh axes the plan gives the dims carrying that name, read off the
  PartitionSpecs of the plan's tensors (a weight's ``embed`` and an activation's ``activation_embed`` may
  differ); a name the plan would need two values for is refused, naming both tensors. Every name of the
  version's vocabulary gets a rule (``[]``: unsplit) and ``override_logical_axis_rules: true`` is written, so
  the rules are the plan's by both routes (a config file on top of ``base.yml``, where OmegaConf replaces
  the list, and ``key=value`` overrides, where MaxText would otherwise keep its base rules first);
* a graph MaxText has no decoder block for (:func:`layoutsearch.maxtext.tensors.decoder_block` is None)
  keeps its own dim names as logical names (``dim_names`` renames them), for a MaxText-style model of the
  user's own;
* ``mesh_axes`` is not written (MaxText's default list is right for every version; older ones refuse
  another length), every ``ici_*``/``dcn_*_parallelism`` key of the version's mesh axes is;
* ``model_name`` when a model file of the version has the graph's shapes field by field (and no rules of
  its own that differ from the plan's), else the shape keys (``decoder_block``, ``base_emb_dim``, ...);
  ``max_target_length``, ``per_device_batch_size``, ``remat_policy`` (:data:`MAXTEXT_REMAT_POLICY`) and the
  pipeline or gradient-accumulation keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from layoutsearch.errors import LayoutError
from layoutsearch.export.specs import without_stage_rules
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.remat import parse_remat
from layoutsearch.layout import Axes, Layout
from layoutsearch.maxtext.tensors import ACTIVATIONS, PARAMS, decoder_block, zoo_dims, zoo_tensors
from layoutsearch.maxtext.version import PIPELINE_OUTSIDE_BATCH, MaxTextVersion, maxtext_version
from layoutsearch.mesh import Mesh

MAXTEXT_AXIS_NAMES: dict[str, tuple[str, ...]] = {
    "data": ("data", "dp", "replica", "batch", "dcn", "slice"),
    "stage": ("stage", "stages", "pipe", "pipeline", "pp"),
    "fsdp": ("fsdp", "zero", "sharded"),
    "fsdp_transpose": ("fsdp_transpose",),
    "context": ("context", "cp", "seq", "sequence", "sp"),
    "tensor": ("tensor", "model", "tp", "mp"),
    "tensor_sequence": ("tensor_sequence",),
    "expert": ("expert", "experts", "ep"),
    "autoregressive": ("autoregressive",),
}
"""MaxText mesh axis -> the layoutsearch mesh axis names (case-insensitive) mapped onto it by default (a
target the version lacks is skipped). Other names need ``axis_map``."""

MAXTEXT_REMAT_POLICY: dict[str, str] = {"none": "none", "selective": "minimal", "full": "full"}
"""layoutsearch remat -> MaxText ``remat_policy`` (MaxText 0.2.5 ``layers/nnx_decoders.py``,
``get_remat_policy`` and ``minimal_policy``):

* ``selective`` -> ``minimal``: ``jax.checkpoint_policies.save_only_these_names`` of the projection outputs
  (query/key/value/qkv/out projections and the MLP's wi/wo), everything else recomputed: layoutsearch's
  ``selective`` (block inputs and projection outputs kept, Korthikanti et al. 2022);
* ``full`` -> ``full``: nothing saved in a layer;
* ``none`` -> ``none`` with ``scan_layers: false``: MaxText checkpoints a scanned layer whatever the policy
  (``none`` there is a checkpoint with no policy, i.e. ``full``); only its unscanned layer loop runs a layer
  without ``jax.checkpoint``. (Each layer is then compiled on its own.)

``full:N`` (the first N layers only) has no MaxText equivalent (one policy for every layer): it exports as
``full``, which holds no more memory and recomputes every layer (said in a comment)."""

_PIPELINE_KEYS = ("num_pipeline_microbatches", "num_layers_per_pipeline_stage", "num_pipeline_repeats")
_SHAPE_KEYS = ("decoder_block", "base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_mlp_dim",
               "base_num_decoder_layers", "head_dim", "vocab_size", "mlp_activations", "logits_via_embedding")


def maxtext_keys(version: str | None = None) -> frozenset[str]:
    """Every top-level key of MaxText ``version``'s ``base.yml``."""
    return maxtext_version(version).keys


def maxtext_parallelism_key(axis: str, kind: str = "ici", version: str | None = None) -> str:
    """The config key sizing MaxText mesh axis ``axis`` within (``ici``) or across (``dcn``) slices:
    ``ici_data_parallelism``, ..., and ``ici_pipeline_parallelism`` for the ``stage`` axis."""
    return maxtext_version(version).parallelism_key(axis, kind)


# -- mesh axes ----------------------------------------------------------------------------------------------------------

def maxtext_axis_map(mesh_names: Sequence[str], axis_map: Mapping[str, str] | None = None,
                     stage_axis: str | None = None, version: str | None = None) -> dict[str, str]:
    """Mesh axis -> MaxText mesh axis: ``axis_map`` first, ``stage_axis`` -> ``stage``, then the conventional
    names of :data:`MAXTEXT_AXIS_NAMES`. LayoutError for an axis with no counterpart or two axes on one."""
    v = maxtext_version(version)
    axis_map = dict(axis_map or {})
    for a, target in axis_map.items():
        if a not in mesh_names:
            raise LayoutError(f"axis_map names mesh axis {a!r}, which the mesh lacks (mesh axes: {', '.join(mesh_names)})")
        if target not in v.mesh_axes:
            raise LayoutError(f"axis_map maps {a!r} to {target!r}, which is not a mesh axis of MaxText {v.version} "
                              f"(its mesh axes: {', '.join(v.mesh_axes)})")
    out: dict[str, str] = {}
    for a in mesh_names:
        if a in axis_map:
            target = axis_map[a]
        elif a == stage_axis:
            target = "stage"
        else:
            target = next((m for m, names in MAXTEXT_AXIS_NAMES.items() if m in v.mesh_axes and a.lower() in names),
                          None)
            if target is None:
                raise LayoutError(
                    f"mesh axis {a!r} has no MaxText counterpart: name it like one of MaxText {v.version}'s mesh axes "
                    f"({', '.join(v.mesh_axes)}) or pass axis_map={{{a!r}: 'fsdp'}} (any of those)")
        if a == stage_axis and target != "stage":
            raise LayoutError(f"stage axis {a!r} must map to MaxText's 'stage' axis (axis_map maps it to {target!r})")
        clash = next((b for b, t in out.items() if t == target), None)
        if clash is not None:
            raise LayoutError(f"mesh axes {clash!r} and {a!r} both map to MaxText's {target!r} axis; "
                              "map one of them elsewhere with axis_map")
        out[a] = target
    return out


def maxtext_stage_axes(mesh_names: Sequence[str], version: str | None = None) -> tuple[str, ...]:
    """The mesh axes that can carry MaxText's pipeline stages: the one named like MaxText's ``stage`` axis when
    the mesh has one, else any (the export then maps the stage axis to ``stage``)."""
    maxtext_version(version)
    named = tuple(a for a in mesh_names if a.lower() in MAXTEXT_AXIS_NAMES["stage"])
    return named or tuple(mesh_names)


def _parallelism(v: MaxTextVersion, mesh: Mesh, names: Mapping[str, str], slices: int,
                 dcn_axis: str | None) -> dict[str, int]:
    """Every ``ici_*`` / ``dcn_*_parallelism`` key of the version's mesh axes: each axis's size within a slice
    and across ``slices`` (``dcn_axis``, default the major-most mesh axis they divide, spans the slices)."""
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise LayoutError(f"slices must be a positive integer, got {slices!r}")
    ici = dict.fromkeys(v.mesh_axes, 1)
    dcn = dict.fromkeys(v.mesh_axes, 1)
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
    out: dict[str, int] = {}
    for kind, sizes in (("ici", ici), ("dcn", dcn)):
        for a in v.mesh_axes:
            key = v.parallelism_key(a, kind)
            if key in v.keys:
                out[key] = sizes[a]
            elif sizes[a] != 1:
                raise LayoutError(f"MaxText {v.version} has no key {key} to size its {a!r} axis")
    return out


# -- logical axis rules -------------------------------------------------------------------------------------------------

def logical_axes(layout: Layout, graph: Graph, names: Mapping[str, str], version: str | None = None
                 ) -> dict[str, tuple[tuple[str, ...], str]]:
    """MaxText logical name -> (the MaxText mesh axes the plan gives the dims carrying it, the first tensor that
    carries it), over every MaxText parameter and activation with a counterpart in ``graph`` (a model of a
    MaxText decoder block). LayoutError for a name two tensors need different values for."""
    v = maxtext_version(version)
    block = decoder_block(graph)
    if block is None or block not in v.tensors:
        raise LayoutError(f"model {graph.name!r} is no MaxText {v.version} decoder block")
    # (the conflict message below suggests the search that avoids it)
    table = v.tensors[block]
    logical_of = {**table["params"], **table["activations"], "logits": table["logits"]}
    found: dict[str, tuple[tuple[str, ...], str]] = {}
    for c in PARAMS[block] + ACTIVATIONS[block]:
        logical = logical_of.get(c.maxtext)
        if logical is None and c in ACTIVATIONS[block]:
            continue  # a constraint this version does not apply
        if logical is None:
            raise LayoutError(f"MaxText {v.version}'s {block} block has no tensor {c.maxtext!r} (its table: {v.source})")
        dims = zoo_dims(graph, c)
        if len(logical) != len(dims):
            raise LayoutError(f"MaxText {v.version}'s {c.maxtext} has {len(logical)} axes, layoutsearch expects "
                              f"{len(dims)}")
        for t in zoo_tensors(graph, c, first_layer_only=not layout.tensors):  # (rules: every layer alike)
            lay = layout.dim_layout(t)
            for name, zd in zip(logical, dims):
                if name is None or not zd:
                    continue
                axes = tuple(names[a] for d in zd for a in lay.get(d, ()))
                where = f"{t.name}'s {'x'.join(zd)}"
                if name not in found:
                    found[name] = (axes, where)
                elif found[name][0] != axes:
                    raise LayoutError(
                        f"MaxText {v.version} gives {found[name][1]} and {where} one logical axis name, {name!r}; the "
                        f"plan splits them differently ({list(found[name][0]) or 'unsplit'} and {list(axes) or 'unsplit'}), "
                        "which MaxText's rules cannot express (search with --target maxtext for a plan they can)")
    return found


def maxtext_expressible(graph: Graph, mesh: Mesh, version: str | None = None):
    """A predicate on rule sets (``(dim, axes)`` pairs) over ``mesh``: whether MaxText ``version``'s logical
    names can express that layout of ``graph`` (:func:`logical_axes` finds no name needing two values).
    LayoutError when MaxText cannot run the model or the mesh at all (no decoder block, an axis with no
    MaxText counterpart)."""
    v = maxtext_version(version)
    block = decoder_block(graph)
    if block is None or block not in v.tensors:
        raise LayoutError(f"MaxText {v.version} has no decoder block for model {graph.name!r} (it runs the zoo's gpt "
                          "built Llama-style or GPT-3-style)")
    names = maxtext_axis_map(mesh.names, version=v.version)

    def keep(rules: Sequence[tuple[str, Axes]], among: Mesh | None = None) -> bool:
        """``among``: the mesh of the candidates (a pipeline's: ``mesh`` without its stage axis)."""
        try:
            layout = Layout(mesh, tuple(rules))
            logical_axes(layout, graph, names, v.version)
            if among is not None and among.names != mesh.names:  # a pipeline's inner layout
                stage = next(a for a in mesh.names if a not in among.names)
                _check_outside_batch(layout, graph, maxtext_axis_map(mesh.names, stage_axis=stage,
                                                                     version=v.version), mesh)
        except LayoutError:
            return False
        return True

    return keep


def _check_outside_batch(layout: Layout, graph: Graph, names: Mapping[str, str], mesh: Mesh) -> None:
    """LayoutError unless the plan splits the logits' batch (outside a pipeline's stages) over every axis
    MaxText forces it to when it pipelines (:data:`PIPELINE_OUTSIDE_BATCH`, but the stage axis)."""
    logits = graph.tensors.get("logits")
    if logits is None:
        return
    theirs = {a: names[a] for a in mesh.names}
    forced = {m for a, m in theirs.items() if m in PIPELINE_OUTSIDE_BATCH and m != "stage" and mesh.axis_size(a) > 1}
    ours = {theirs[a] for a in layout.dim_layout(logits).get("batch", ()) if mesh.axis_size(a) > 1}
    if ours != forced:
        raise LayoutError(f"MaxText splits the batch outside a pipeline's stages over {', '.join(sorted(forced)) or 'no'}"
                          f" axes besides stage, whatever the config says; the plan's logits split it over "
                          f"{', '.join(sorted(ours)) or 'none'}")


def _block_rules(layout: Layout, graph: Graph, names: Mapping[str, str], v: MaxTextVersion,
                 piped: bool) -> list[list[Any]]:
    """Every logical name's rule (:func:`logical_axes`); in a pipeline, ``layers`` and ``activation_stage`` on
    the stage axis, and the batch of the ops outside the stages (the logits' batch name) over the stage axis
    too, as MaxText's pipeline runs them (:data:`~layoutsearch.costmodel.schedule` ``maxtext``)."""
    found = logical_axes(layout, graph, names, v.version)
    block = decoder_block(graph)
    outside_batch = v.tensors[block]["logits"][0] if piped else None
    rules: list[list[Any]] = []
    for name in dict.fromkeys([*v.logical_names, *found]):
        axes = list(found.get(name, ((), ""))[0])
        if name in ("layers", "activation_stage"):
            axes = ["stage"] if piped else []
        elif name == outside_batch:  # (MaxText forces it to stage, data, fsdp, ... when it pipelines)
            axes = ["stage", *(a for a in v.mesh_axes if a in axes and a != "stage")]
        rules.append([name, axes])
    return rules


def _own_rules(inner: Layout, names: Mapping[str, str], dim_names: Mapping[str, str | Sequence[str]] | None,
               piped: bool) -> list[list[Any]]:
    """The rules of a graph MaxText has no decoder for: its dims as logical names (``dim_names`` renames)."""
    if inner.tensors:
        raise LayoutError("a layout with per-tensor entries cannot be written as MaxText rules for a model MaxText "
                          "has no decoder for; export it with the specs or python format")
    rules: list[list[Any]] = []
    for dim, axes in inner.rules:
        given = (dim_names or {}).get(dim, dim)
        for name in ((given,) if isinstance(given, str) else tuple(given)):
            rules.append([name, [names[a] for a in axes]])
    if piped:
        rules += [["layers", ["stage"]], ["activation_stage", ["stage"]]]
    return rules


# -- model shape, batch, remat, pipeline --------------------------------------------------------------------------------

def _shape_keys(graph: Graph, block: str) -> dict[str, Any]:
    m = graph.meta
    heads = int(m["heads"])
    keys: dict[str, Any] = {
        "decoder_block": block, "base_emb_dim": graph.dims["d_model"], "base_num_query_heads": heads,
        "base_num_kv_heads": int(m.get("kv_heads") or heads), "base_mlp_dim": graph.dims["d_ff"],
        "base_num_decoder_layers": int(m["layers"]), "head_dim": graph.dims["d_kv"],
        "vocab_size": graph.dims["vocab"],
        "mlp_activations": ["silu", "linear"] if block == "llama2" else ["gelu"],
        "logits_via_embedding": block == "gpt3",
    }
    if block == "gpt3":
        keys.update({"fused_qkv": True, "trainable_position_size": graph.dims["seq"], "use_iota_embed": True})
    return keys


def _model_keys(graph: Graph, block: str, v: MaxTextVersion, rules: list[list[Any]]) -> dict[str, Any]:
    """``model_name`` of the version's model file with the graph's shapes (and, if it has rules of its own,
    the same as ours), else the shape keys."""
    keys = _shape_keys(graph, block)
    ours = {r[0]: r[1] for r in rules}
    preset = graph.meta.get("preset")
    for name, model in sorted(v.models.items(), key=lambda item: item[0] != preset):
        if all(model.get(k) == keys[k] for k in _SHAPE_KEYS) and all(
                ours.get(r[0]) == ([r[1]] if isinstance(r[1], str) else list(r[1]))
                for r in model.get("logical_axis_rules", [])):
            return {"model_name": name}
    return keys


def _remat(remat: str) -> dict[str, Any]:
    kind = parse_remat(remat, LayoutError).kind
    out: dict[str, Any] = {"remat_policy": MAXTEXT_REMAT_POLICY[kind]}
    if kind == "none":
        out["scan_layers"] = False
    return out


def _pipeline(mesh: Mesh, stage_axis: str | None, microbatches: int, schedule: str | None,
              graph: Graph | None) -> dict[str, int]:
    """``num_pipeline_microbatches``, ``num_layers_per_pipeline_stage`` and ``num_pipeline_repeats`` over a stage
    axis of more than one stage, else ``gradient_accumulation_steps`` (more than one micro-batch)."""
    from layoutsearch.costmodel.schedule import Schedule

    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise LayoutError(f"microbatches must be a positive integer, got {microbatches!r}")
    Schedule.parse(schedule or "maxtext")
    stages = mesh.axis_size(stage_axis) if stage_axis is not None else 1
    out: dict[str, int] = {}
    if stages > 1:
        if microbatches > 1:
            if microbatches % stages:
                raise LayoutError(f"MaxText needs num_pipeline_microbatches to be a multiple of the pipeline "
                                  f"stages ({stages}); got {microbatches} micro-batches")
            out["num_pipeline_microbatches"] = microbatches
        layers = graph.meta.get("layers") if graph is not None else None
        if isinstance(layers, int):
            if layers % stages:
                raise LayoutError(f"{layers} layers do not split into {stages} equal stages "
                                  "(MaxText: layers = stages x num_layers_per_pipeline_stage)")
            out["num_layers_per_pipeline_stage"] = layers // stages
        out["num_pipeline_repeats"] = 1  # (MaxText's circular pipeline is not priced)
    elif microbatches > 1:
        out["gradient_accumulation_steps"] = microbatches
    return out


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def _batch_axes(inner: Layout, graph: Graph | None) -> Axes:
    """The mesh axes splitting the input batch: those of the graph's first input with a ``batch`` dim, else
    (no graph) those the rules give ``batch``."""
    if graph is not None:
        source = next((t for t in graph.tensors.values() if t.role == "input" and "batch" in t.dim_names), None)
        return inner.dim_layout(source).get("batch", ()) if source is not None else ()
    return inner.rules_layout(["batch"]).get("batch", ())


# -- the overrides --------------------------------------------------------------------------------------------------------

def maxtext_overrides(layout: Layout, dim_names: Mapping[str, str | Sequence[str]] | None = None, *,
                      graph: Graph | None = None, axis_map: Mapping[str, str] | None = None,
                      remat: str | None = None, microbatches: int = 1, stage_axis: str | None = None,
                      schedule: str | None = None, slices: int = 1, dcn_axis: str | None = None,
                      version: str | None = None) -> dict[str, Any]:
    """A MaxText config fragment (plain lists and numbers, ready for ``yaml.safe_dump`` or ``json.dumps``) for
    MaxText ``version`` (default :func:`layoutsearch.maxtext.version.default_version`); see the module
    docstring for what it holds.

    * ``axis_map``: layoutsearch mesh axis -> MaxText mesh axis, for names :data:`MAXTEXT_AXIS_NAMES` lacks.
    * ``dim_names``: dim -> logical name(s), for a graph MaxText has no decoder block for (a MaxText decoder's
      names come from MaxText's layers).
    * ``stage_axis``: the pipeline axis (MaxText ``stage``); an axis named like a stage axis is one anyway.
    * ``schedule``: the schedule a pipelined plan was priced under: ``maxtext`` (MaxText's pipeline; other
      schedules are refused, their stages and placement are not MaxText's); None for a layout alone.
    * ``slices`` (> 1: multi-slice) splits ``dcn_axis`` (default: the major-most mesh axis it divides) into
      ``slices`` across slices (``dcn_*``) times the rest within a slice (``ici_*``)."""
    v = maxtext_version(version)
    mesh = layout.mesh
    names = maxtext_axis_map(mesh.names, axis_map, stage_axis, v.version)
    if stage_axis is None:
        stage_axis = next((a for a, t in names.items() if t == "stage"), None)
    piped = stage_axis is not None and mesh.axis_size(stage_axis) > 1
    if schedule is not None and piped and not schedule.lower().startswith("maxtext"):
        raise LayoutError(f"a pipeline priced under schedule {schedule} is not what MaxText runs (GPipe over the "
                          "decoder layers in equal stages, the embeddings and the head outside them, on every "
                          "device): price it under --schedule maxtext (search --target maxtext does)")
    inner = without_stage_rules(layout, stage_axis)
    block = decoder_block(graph) if graph is not None else None
    if graph is not None:
        inner.restricted(graph).check(graph)
        unknown = sorted(set(dim_names or ()) - set(graph.dims))
        if unknown:
            raise LayoutError(f"dim_names names {', '.join(map(repr, unknown))}, which model {graph.name!r} lacks "
                              f"(dims: {', '.join(graph.dims)})")
    if block is not None and dim_names:
        raise LayoutError(f"model {graph.name!r} is MaxText's {block} decoder: its logical names come from MaxText's "
                          "own layers; dim_names is for models MaxText has no decoder for")
    if piped and block is not None and schedule is not None:
        _check_outside_batch(inner, graph, names, mesh)
    out: dict[str, Any] = {"override_logical_axis_rules": True}
    out.update(_parallelism(v, mesh, names, slices, dcn_axis))
    out["data_sharding"] = [[names[a] for a in _batch_axes(inner, graph)]]
    if block is not None:
        out["logical_axis_rules"] = _block_rules(inner, graph, names, v, piped)
        out.update(_model_keys(graph, block, v, out["logical_axis_rules"]))
    else:
        out["logical_axis_rules"] = _own_rules(inner, names, dim_names, piped)
    if remat is not None:
        out.update(_remat(remat))
    out.update(_pipeline(mesh, stage_axis, microbatches, schedule, graph))
    if graph is not None and "batch" in graph.dims:
        accumulation = out.get("gradient_accumulation_steps", 1)
        out["per_device_batch_size"] = _number(graph.dims["batch"] / (mesh.size * accumulation))
    if graph is not None and "seq" in graph.dims:
        out["max_target_length"] = graph.dims["seq"]
    unknown = sorted(set(out) - v.keys)
    if unknown:
        raise LayoutError(f"MaxText {v.version} has no key {', '.join(unknown)} (its base.yml)")
    return out


def maxtext_yaml(layout: Layout, graph: Graph | None = None, *, dim_names: Mapping[str, str | Sequence[str]] | None = None,
                 axis_map: Mapping[str, str] | None = None, remat: str | None = "none", microbatches: int = 1,
                 stage_axis: str | None = None, schedule: str | None = None, slices: int = 1,
                 dcn_axis: str | None = None, version: str | None = None) -> str:
    """:func:`maxtext_overrides` as commented YAML (each value a JSON flow value, which YAML reads as is): a
    config file for ``train.py CONFIG.yml`` (with ``base_config: base.yml`` added) or, key by key, the
    ``key=value`` overrides of a command line."""
    cfg = maxtext_overrides(layout, dim_names, graph=graph, axis_map=axis_map, remat=remat,
                            microbatches=microbatches, stage_axis=stage_axis, schedule=schedule, slices=slices,
                            dcn_axis=dcn_axis, version=version)
    v = maxtext_version(version)
    mesh = layout.mesh
    names = maxtext_axis_map(mesh.names, axis_map, stage_axis, v.version)
    stage = stage_axis or next((a for a, t in names.items() if t == "stage"), None)
    model = f"model {graph.name!r} " if graph is not None else ""
    block = decoder_block(graph) if graph is not None else None
    lines = [
        f"# layoutsearch: MaxText {v.version} config for {model}on mesh {mesh} ({mesh.size} devices, "
        f"{slices} slice{'s' if slices > 1 else ''}), layout {layout.describe() or '(replicated)'}",
        f"# Keys, mesh axes and logical names of MaxText {v.version} ({v.source}).",
        "# Use as a config file (add `base_config: base.yml`) or as key=value overrides on the command line.",
        "# mesh axes -> MaxText: " + ", ".join(f"{a} -> {t}" for a, t in names.items()),
    ]
    if block is None:
        lines.append(f"# model {graph.name if graph is not None else '(none given)'!r} has no MaxText decoder block: "
                     "logical names are its dim names, for a model of your own that uses them")
    else:
        lines.append(f"# MaxText decoder block {block}: each logical name's rule is what the plan gives the tensors "
                     "MaxText gives that name")
    ours = [names[a] for a in mesh.names]
    if ours != [a for a in v.mesh_axes if a in ours]:
        lines.append("# (MaxText orders its mesh axes as its mesh_axes, whatever the order of the mesh above: same "
                     "shardings, other device placement)")
    piped = False
    for key, value in cfg.items():
        if key == "data_sharding":
            lines.append("# data_sharding: the MaxText axes splitting the input batch")
        if key == "logical_axis_rules":
            lines.append("logical_axis_rules: [")
            lines += [f"  {json.dumps(r)}," for r in value[:-1]] + ([f"  {json.dumps(value[-1])}"] if value else [])
            lines.append("]")
            continue
        if key == "remat_policy":
            kind = parse_remat(remat, LayoutError)
            lines.append(f"# remat {remat} -> remat_policy {value!r}" + (
                " with scan_layers false (a scanned MaxText layer is always checkpointed)" if kind.kind == "none"
                else " (MaxText remats every layer alike: all of them recomputed, memory no higher)"
                if kind.blocks is not None else ""))
        if key in _PIPELINE_KEYS and stage is not None and not piped:
            piped = True
            lines.append(f"# pipeline over {stage!r} -> MaxText 'stage' ({mesh.axis_size(stage)} equal stages, GPipe "
                         "over the decoder layers; the embeddings and the head outside them, the batch over 'stage' "
                         "too)")
            if "num_pipeline_microbatches" not in cfg:
                lines.append("# num_pipeline_microbatches not written (1 micro-batch): MaxText's default is the stages")
        if key == "per_device_batch_size" and graph is not None:
            accumulation = cfg.get("gradient_accumulation_steps", 1)
            lines.append(f"# per_device_batch_size: the plan's batch {graph.dims['batch']} / {mesh.size} devices"
                         + (f" / {accumulation} accumulation steps (MaxText's global batch = per_device_batch_size"
                            " x devices x gradient_accumulation_steps)" if accumulation > 1 else ""))
        lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"
