"""A user's MaxText run read into layoutsearch's terms: the model graph with MaxText's shapes, the mesh, the layout
MaxText's logical axis rules give every tensor, the remat policy and the gradient-accumulation steps
(:func:`read_maxtext_run`).

The run is ``CONFIG.yml [key=value ...]`` as ``train.py`` takes it: the config file and its ``base_config``
chain, the model file of ``model_name``, then the command-line overrides, with MaxText's precedence (OmegaConf
replaces a list a later file gives; a model file's ``logical_axis_rules`` merge over the base rules; the
command line's merge behind them unless ``override_logical_axis_rules``). Two readers give the same values:

* MaxText's own loader (``pyconfig.initialize``, through :mod:`layoutsearch.maxtext.runner`) when a Python
  with MaxText is found (``$LAYOUTSEARCH_MAXTEXT_PYTHON``, or this one);
* else layoutsearch's reader of the keys in :data:`layoutsearch.maxtext.tables.READ_KEYS` and every
  ``ici_*``/``dcn_*_parallelism`` key, on the version table's ``base.yml`` defaults and model files (any other
  key MaxText has is accepted and ignored; a key MaxText lacks is an error).

The layout: each MaxText tensor's PartitionSpec follows from its logical names (the version table) under the
run's rules with Flax's precedence, and is given to the zoo tensor it is (:mod:`layoutsearch.maxtext.tensors`);
rules for the dims of the tensors MaxText does not constrain (attention scores, ...) follow the activations
around them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Layout
from layoutsearch.maxtext.tensors import ACTIVATIONS, PARAMS, zoo_dims, zoo_tensors
from layoutsearch.maxtext.version import PIPELINE_OUTSIDE_BATCH, MaxTextVersion, maxtext_version
from layoutsearch.mesh import Mesh

MAXTEXT_REMAT: dict[str, str] = {"full": "full", "minimal": "selective", "none": "none"}
"""MaxText ``remat_policy`` -> layoutsearch remat (the inverse of the export's map; ``none`` only with
``scan_layers: false``, a scanned layer being always checkpointed). Any other policy is priced as the nearest
one that recomputes at least as much, with a note."""

_NEAREST: dict[str, str] = {"minimal_with_context": "selective", "minimal_flash": "selective",
                            "save_dot_with_context_except_mlp": "full", "save_dot_except_mlpwi": "full",
                            "save_dot_except_mlp": "full", "save_qkv_proj": "full", "save_out_proj": "full",
                            "qkv_proj_offloaded": "full", "minimal_offloaded": "full", "custom": "full"}

_ROUTE_KEYS = ("logical_axis_rules", "override_logical_axis_rules", "base_config")


@dataclass
class MaxTextRun:
    """A MaxText run in layoutsearch's terms (see the module docstring). ``config``: the resolved values it was
    built from; ``reader``: which reader resolved them; ``notes``: what is priced otherwise than MaxText runs it."""

    graph: Graph
    layout: Layout
    remat: str
    microbatches: int
    config: dict[str, Any]
    reader: str
    notes: list[str] = field(default_factory=list)
    stage_axis: str | None = None
    """``stage`` for a pipelined run (MaxText's pipeline: schedule ``maxtext``), else None."""

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule (``maxtext``) of a pipelined run, else None."""
        return "maxtext" if self.stage_axis is not None else None


# -- resolving the config ---------------------------------------------------------------------------------------------

def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LayoutError(f"cannot read MaxText config {str(path)!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise LayoutError(f"MaxText config {str(path)!r} does not parse: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise LayoutError(f"MaxText config {str(path)!r} is not a mapping of keys to values")
    return doc


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """OmegaConf's merge: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, Mapping) else v
    return out


def _chain(path: Path, v: MaxTextVersion, depth: int = 0) -> dict[str, Any]:
    """The config file over its ``base_config`` chain; MaxText's own ``base.yml`` is the version table's."""
    if depth > 16:
        raise LayoutError(f"MaxText config {str(path)!r}: base_config chain longer than 16 files (a cycle?)")
    doc = _yaml(path)
    parent = doc.pop("base_config", None)
    if parent is None:
        base: dict[str, Any] = {}
    else:
        candidate = path.parent / str(parent)
        if candidate.is_file():
            base = _chain(candidate, v, depth + 1)
        elif Path(str(parent)).name == "base.yml":
            base = {**v.defaults, "logical_axis_rules": [[n, list(a)] for n, a in v.logical_axis_rules]}
        else:
            raise LayoutError(f"MaxText config {str(path)!r}: base_config {parent!r} is neither a file beside it nor "
                              "MaxText's base.yml")
    return _merge(base, doc)


def _overrides(items: Sequence[str]) -> dict[str, Any]:
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or "." in key:
            raise LayoutError(f"malformed MaxText override {item!r}: expected key=value (a top-level key)")
        try:
            out[key] = yaml.safe_load(value) if value else None
        except yaml.YAMLError:
            out[key] = value
    return out


def _rules(value: Any, where: str) -> list[list[Any]]:
    if not isinstance(value, list) or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in value):
        raise LayoutError(f"{where}: logical_axis_rules must be a list of [name, mesh axes] pairs")
    return [[str(n), [] if a is None else [a] if isinstance(a, str) else list(a)] for n, a in value]


def _merge_rules(base: list[list[Any]], new: list[list[Any]]) -> list[list[Any]]:
    """MaxText's ``_merge_logical_axis_rules``: the base rules of other names, then the new ones."""
    names = {r[0] for r in new}
    return [r for r in base if r[0] not in names] + new


def _read(config: str, overrides: Sequence[str], v: MaxTextVersion) -> dict[str, Any]:
    """layoutsearch's reader: the resolved keys of :data:`~layoutsearch.maxtext.tables.READ_KEYS` and the
    parallelism keys (``logical_axis_rules`` as MaxText merges them)."""
    path = Path(config)
    if not path.is_file():
        raise LayoutError(f"no MaxText config file {config!r}")
    chained = _chain(path, v)
    cli = _overrides(overrides)
    for where, doc in ((str(path), chained), ("the command line", cli)):
        unknown = sorted(set(doc) - v.keys - {"base_config"})
        if unknown:
            raise LayoutError(f"{where}: MaxText {v.version} has no key {', '.join(map(repr, unknown))}")
    merged = _merge(chained, cli)
    name = merged.get("model_name", "default")
    model: dict[str, Any] = {}
    if name != "default":
        if name not in v.models:
            known = ", ".join(sorted(v.models))
            raise LayoutError(f"unknown MaxText model_name {name!r} (MaxText {v.version}'s dense decoders: {known})")
        model = dict(v.models[name])
        if not merged.get("override_model_config"):
            twice = sorted(k for k in model if k in cli and k != "logical_axis_rules" and cli[k] != model[k])
            if twice:
                raise LayoutError(f"keys {twice} are set by both model {name!r} and the command line with different "
                                  "values (MaxText refuses this unless override_model_config=true)")
        else:
            model = {k: x for k, x in model.items() if k not in cli}
    rules = _rules(chained.get("logical_axis_rules", []), str(path))
    if "logical_axis_rules" in model:
        rules = _merge_rules(rules, _rules(model["logical_axis_rules"], f"model {name}"))
    if "logical_axis_rules" in cli:
        new = _rules(cli["logical_axis_rules"], "the command line")
        rules = new if cli.get("override_logical_axis_rules") else _merge_rules(rules, new)
    out = _merge(_merge(chained, {k: x for k, x in model.items() if k != "logical_axis_rules"}), cli)
    out["logical_axis_rules"] = rules
    return out


def _scaled(cfg: Mapping[str, Any]) -> dict[str, int]:
    """The model dims from the ``base_*`` keys and ``global_parameter_scale`` (MaxText's
    ``get_individual_scales``: a power of two; heads and mlp scale by 2^ceil(log2/3), d_model by
    2^(floor(log2/3) + (rem > 1)), layers by 2^floor(log2/3))."""
    scale = int(cfg.get("global_parameter_scale", 1))
    if scale < 1 or scale & (scale - 1):
        raise LayoutError(f"global_parameter_scale must be a power of two, got {scale}")
    base, rem = divmod(int(math.log2(scale)), 3)
    heads = base + int(rem > 0)
    emb = base + int(rem > 1)
    return {"emb_dim": 2**emb * int(cfg["base_emb_dim"]), "num_query_heads": 2**heads * int(cfg["base_num_query_heads"]),
            "num_kv_heads": 2**heads * int(cfg["base_num_kv_heads"]), "mlp_dim": 2**heads * int(cfg["base_mlp_dim"]),
            "num_decoder_layers": 2**base * int(cfg["base_num_decoder_layers"])}


def _mesh(cfg: Mapping[str, Any], v: MaxTextVersion, devices: int | None) -> tuple[dict[str, int], int]:
    """MaxText mesh axis -> size (ici x dcn), with the -1 entries filled as ``fill_unspecified_mesh_axes`` does,
    and the device count."""
    slices = int(cfg.get("num_slices", -1))
    slices = slices if slices > 0 else 1
    sizes: dict[str, dict[str, int]] = {}
    for kind, total in (("ici", None), ("dcn", slices)):
        given = {a: int(cfg.get(v.parallelism_key(a, kind), 1)) for a in v.mesh_axes}
        free = [a for a, s in given.items() if s == -1]
        if len(free) > 1:
            raise LayoutError(f"more than one {kind}_*_parallelism is -1 ({', '.join(free)}): MaxText fills one")
        if kind == "ici":
            if devices is None and free:
                raise LayoutError(f"the config leaves {v.parallelism_key(free[0], 'ici')} to the device count (-1): "
                                  "give the number of devices (--devices N)")
            total = (devices // slices) if devices is not None else math.prod(given.values())
        known = math.prod(s for s in given.values() if s != -1)
        if free:
            if total % known:
                raise LayoutError(f"{kind} parallelism {known} does not divide {total}")
            given[free[0]] = total // known
        elif math.prod(given.values()) != total:
            raise LayoutError(f"the {kind}_*_parallelism values multiply to {math.prod(given.values())}, not {total}"
                              + (" (the devices per slice)" if kind == "ici" else " (num_slices)"))
        sizes[kind] = given
    mesh = {a: sizes["ici"][a] * sizes["dcn"][a] for a in v.mesh_axes}
    n = math.prod(mesh.values())
    if devices is not None and n != devices:
        raise LayoutError(f"the config's mesh has {n} devices, not {devices}")
    return mesh, n


def _pipelined(rules: list[list[Any]], mesh: dict[str, int]) -> tuple[list[list[Any]], dict[str, int]]:
    """MaxText's changes to a pipelined run: the logits' batch rule forced to :data:`PIPELINE_OUTSIDE_BATCH`,
    the ``stage`` mesh axis moved before ``data``."""
    rules = [[n, list(PIPELINE_OUTSIDE_BATCH)] if n == "activation_embed_and_logits_batch" else r
             for r in rules for n in (r[0],)]
    names = list(mesh)
    if "data" in names and names.index("stage") > names.index("data"):
        i, j = names.index("stage"), names.index("data")
        names[i], names[j] = names[j], names[i]
    return rules, {a: mesh[a] for a in names}


def resolved_config(config: str, overrides: Sequence[str] = (), *, devices: int | None = None,
                    version: str | None = None, python: str | None = None) -> tuple[dict[str, Any], str]:
    """The run's resolved values (model dims, batch, mesh, rules, remat, ...) and which reader gave them."""
    from layoutsearch.maxtext import runner

    v = maxtext_version(version)
    python = python or runner.maxtext_python()
    if python is not None:
        if devices is None:
            devices = _mesh(_read(config, overrides, v), v, None)[1]
        result = runner.probe([[config, *overrides]], devices, python=python)[0]
        if "error" in result:
            raise LayoutError(f"MaxText refuses the config: {result['error'].splitlines()[0]}")
        cfg = dict(result["config"])
        cfg["mesh"] = dict(result["mesh"])
        cfg["devices"] = devices
        return cfg, f"MaxText {result.get('maxtext_version', v.version)}'s own loader"
    raw = _read(config, overrides, v)
    mesh, n = _mesh(raw, v, devices)
    if mesh.get("stage", 1) > 1:
        raw["logical_axis_rules"], mesh = _pipelined(raw["logical_axis_rules"], mesh)
    cfg = {**raw, **_scaled(raw), "mesh": mesh, "devices": n}
    ga = int(raw.get("gradient_accumulation_steps", 1))
    batch = float(raw["per_device_batch_size"]) * n
    cfg["micro_batch_size_to_train_on"] = int(batch)
    cfg["global_batch_size_to_train_on"] = int(batch) * ga
    if not float(batch).is_integer():
        raise LayoutError(f"per_device_batch_size {raw['per_device_batch_size']} x {n} devices is not a whole batch")
    return cfg, f"layoutsearch's reader of MaxText {v.version}'s keys"


# -- the graph and the layout -------------------------------------------------------------------------------------------

def _graph(cfg: Mapping[str, Any], notes: list[str]) -> tuple[Graph, str]:
    from layoutsearch import zoo

    block = str(cfg["decoder_block"]).lower().rsplit(".", 1)[-1]
    sizes = {"d_model": int(cfg["emb_dim"]), "heads": int(cfg["num_query_heads"]), "d_kv": int(cfg["head_dim"]),
             "d_ff": int(cfg["mlp_dim"]), "layers": int(cfg["num_decoder_layers"]), "vocab": int(cfg["vocab_size"]),
             "seq": int(cfg["max_target_length"]),
             "batch": int(cfg["global_batch_size_to_train_on"]), "dtype": "float32"}
    activations = [str(a) for a in cfg.get("mlp_activations") or []]
    tied = bool(cfg.get("logits_via_embedding"))
    if block in ("llama2", "mistral"):
        if activations != ["silu", "linear"] or tied:
            raise LayoutError(f"decoder_block {block} with mlp_activations {activations} and logits_via_embedding "
                              f"{tied}: layoutsearch reads it with SwiGLU (silu, linear) and untied logits only")
        kv = int(cfg["num_kv_heads"])
        sizes.update(kv_heads=kv if kv != sizes["heads"] else None, mlp="swiglu", norm="rmsnorm", position="rotary",
                     bias=0, tie_embeddings=0)
        if block == "mistral":
            notes.append("mistral's sliding-window attention is priced as full attention")
        block = "llama2"
    elif block == "gpt3":
        if activations != ["gelu"] or not tied:
            raise LayoutError(f"decoder_block gpt3 with mlp_activations {activations} and logits_via_embedding {tied}: "
                              "layoutsearch reads it with gelu and tied logits only")
        positions = int(cfg.get("trainable_position_size") or -1)
        if positions != sizes["seq"]:
            notes.append(f"MaxText's position table has {positions} rows; the graph's has max_target_length "
                         f"{sizes['seq']}")
    else:
        raise LayoutError(f"decoder_block {block!r}: layoutsearch reads MaxText's llama2, mistral and gpt3 decoders")
    if cfg.get("enable_dropout") and float(cfg.get("dropout_rate") or 0) > 0:
        notes.append(f"MaxText's dropout (rate {cfg['dropout_rate']}) is not priced")
    return zoo.build("gpt", **{k: x for k, x in sizes.items() if x is not None}), block


def _flax_spec(logical: Sequence[str | None], rules: Sequence[Sequence[Any]]) -> list[tuple[str, ...]]:
    """Flax's ``logical_to_mesh_axes``: rules in order, a rule claims a still-unassigned name when none of its
    mesh axes is taken (a rule with no axes claims it unsplit)."""
    out: list[tuple[str, ...] | None] = [None] * len(logical)
    taken: set[str] = set()
    for name, axes in rules:
        axes = tuple(axes)
        for i, n in enumerate(logical):
            if n == name and out[i] is None and taken.isdisjoint(axes):
                out[i] = axes
                taken.update(axes)
    return [a or () for a in out]


def _split(graph: Graph, dims: tuple[str, ...], axes: tuple[str, ...], mesh: Mesh, where: str) -> dict[str, tuple[str, ...]]:
    """The axes of a MaxText axis holding ``dims`` flattened (major first), given to each dim: a block split of
    the flattened dim is one of the major dim first, then (once it is split to size 1) the next."""
    out: dict[str, tuple[str, ...]] = {}
    rest = list(axes)
    for d in dims:
        remaining, got = graph.dims[d], []
        while rest and remaining % mesh.axis_size(rest[0]) == 0:
            remaining //= mesh.axis_size(rest[0])
            got.append(rest.pop(0))
        if got:
            out[d] = tuple(got)
        if rest and remaining > 1:
            break
    if rest:
        raise LayoutError(f"{where}: MaxText splits {'x'.join(dims)} over {'+'.join(axes)}, which no split of "
                          f"{', '.join(dims)} ({', '.join(str(graph.dims[d]) for d in dims)}) gives")
    return out


_RULE_SOURCES = (("batch", "ff_residual"), ("kv_heads", "q"), ("q_per_kv", "q"), ("heads", "q"), ("d_ff", "ff"),
                 ("vocab", "logits"), ("d_kv", "q"), ("seq", "ff_residual"), ("kv_seq", "k"), ("d_model", "ff_residual"))
"""The dims of the tensors MaxText does not constrain, in rule order, and the activation whose layout each
follows (``ff``: the MLP's hidden activation)."""


def _layout(graph: Graph, block: str, cfg: Mapping[str, Any], v: MaxTextVersion, notes: list[str]) -> Layout:
    sizes = {a: int(s) for a, s in cfg["mesh"].items()}
    mesh = Mesh(tuple((a, s) for a, s in sizes.items() if s > 1)) if any(s > 1 for s in sizes.values()) \
        else Mesh((("data", 1),))
    # (the stage axis of a pipeline holds the stages: the layout applies inside them, over the other axes)
    rules = [[n, [a for a in axes if sizes.get(a, 1) > 1 and a != "stage"]]
             for n, axes in _rules(cfg["logical_axis_rules"], "config")]
    table = v.tensors[block]
    logical_of = {**table["params"], **table["activations"], "logits": table["logits"]}
    per_tensor: dict[str, dict[str, tuple[str, ...]]] = {}
    for c in PARAMS[block] + ACTIVATIONS[block]:
        logical = logical_of.get(c.maxtext)
        if logical is None:
            continue
        spec = _flax_spec(logical, rules)
        for t in zoo_tensors(graph, c):
            entry: dict[str, tuple[str, ...]] = {}
            for axes, zd in zip(spec, zoo_dims(graph, c)):
                if zd:
                    entry.update(_split(graph, zd, tuple(axes), mesh, c.maxtext))
            per_tensor[t.name] = entry
    ends = {"ff_residual": ("/ff_residual",), "q": ("/q",), "k": ("/k",), "ff": ("/ff_gated", "/ff_act"),
            "logits": ("logits",)}
    first = {role: next((n for n in per_tensor if n.endswith(suffixes)), None) for role, suffixes in ends.items()}
    global_rules = []
    for dim, role in _RULE_SOURCES:
        source = first.get(role)
        if dim in graph.dims and source is not None and per_tensor[source].get(dim):
            global_rules.append((dim, per_tensor[source][dim]))
    for c in PARAMS[block]:  # fallbacks: where a weight gives a dim other axes (weights' d_model on fsdp, ...)
        t = next(zoo_tensors(graph, c, first_layer_only=True), None)
        for dim, axes in (per_tensor.get(t.name, {}).items() if t is not None else ()):
            if (dim, axes) not in global_rules:
                global_rules.append((dim, axes))
    layout = Layout(mesh, tuple(global_rules))
    entries = tuple((name, tuple((d, a) for d, a in e.items()))
                    for name, e in per_tensor.items() if layout.dim_layout(graph.tensors[name]) != e)
    return Layout(mesh, tuple(global_rules), entries).check(graph)


def _remat(cfg: Mapping[str, Any], notes: list[str]) -> str:
    policy = cfg.get("remat_policy") or "none"
    policy = str(policy).lower()
    if policy == "none" and cfg.get("scan_layers", True):
        notes.append("remat_policy none on scanned layers: MaxText still checkpoints each layer (priced as full)")
        return "full"
    if policy in MAXTEXT_REMAT:
        return MAXTEXT_REMAT[policy]
    nearest = _NEAREST.get(policy, "full")
    notes.append(f"remat_policy {policy} is priced as layoutsearch's {nearest} (no exact counterpart)")
    return nearest


def read_maxtext_run(config: str, overrides: Sequence[str] = (), *, devices: int | None = None,
                     version: str | None = None, python: str | None = None) -> MaxTextRun:
    """The MaxText run ``config`` (a YAML file) with ``overrides`` (``key=value``) on ``devices`` devices (default:
    what the parallelism keys multiply to), as a graph, a layout and the decisions (see the module docstring)."""
    v = maxtext_version(version)
    cfg, reader = resolved_config(config, overrides, devices=devices, version=v.version, python=python)
    return run_of(cfg, reader, v.version)


def run_of(cfg: Mapping[str, Any], reader: str, version: str | None = None) -> MaxTextRun:
    """The :class:`MaxTextRun` of resolved values ``cfg`` (:func:`resolved_config`)."""
    v = maxtext_version(version)
    notes: list[str] = []
    graph, block = _graph(cfg, notes)
    layout = _layout(graph, block, cfg, v, notes)
    microbatches = int(cfg.get("gradient_accumulation_steps") or 1)
    remat = _remat(cfg, notes)
    stages = int(cfg["mesh"].get("stage", 1))
    if stages == 1:
        return MaxTextRun(graph, layout, remat, microbatches, dict(cfg), reader, notes)
    layers = int(cfg["num_decoder_layers"])
    per_stage = int(cfg.get("num_layers_per_pipeline_stage") or 1)
    repeats = int(cfg.get("num_pipeline_repeats") or -1)
    repeats = layers // (stages * per_stage) if repeats < 1 else repeats
    if repeats != 1 or stages * per_stage != layers:
        raise LayoutError(f"a circular MaxText pipeline ({layers} layers, {stages} stages x {per_stage} layers per "
                          f"stage x {repeats} repeats) is not priced: only num_layers_per_pipeline_stage = layers / "
                          "stages")
    if microbatches > 1:
        raise LayoutError("gradient accumulation over a MaxText pipeline is not priced")
    pipeline_mb = int(cfg.get("num_pipeline_microbatches") or -1)
    if remat == "none":
        notes.append("remat_policy none: MaxText's pipeline checkpoints every iteration (priced as full)")
        remat = "full"
    return MaxTextRun(graph, layout, remat, pipeline_mb if pipeline_mb > 0 else stages, dict(cfg), reader, notes,
                      stage_axis="stage")
