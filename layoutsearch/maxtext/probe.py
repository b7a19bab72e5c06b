"""Run MaxText's own code on a MaxText config and print what it builds, as JSON.

This file is a script for the Python that has MaxText installed (MaxText needs Python 3.12+; it may be
another interpreter than layoutsearch's): it imports nothing of layoutsearch. It reads one JSON object on
stdin, ``{"devices": N, "cases": [{"argv": [CONFIG.yml, "key=value", ...]}, ...]}``, and writes one JSON
object per case on stdout (one line each), in order. For each case it runs MaxText's config loader
(``pyconfig.initialize``, the loader ``train.py`` uses: the config file, its ``base_config`` chain, the
model file of ``model_name``, then the command-line overrides), MaxText's mesh builder
(``maxtext_utils.get_mesh_from_config``) on ``N`` simulated CPU devices, builds the model abstractly
(``model_creation_utils.create_nnx_abstract_model``: shapes and shardings, nothing allocated) and traces
one forward pass abstractly (``jax.eval_shape``) with MaxText's ``debug_sharding`` on, which records every
activation sharding constraint the layers apply. Output per case:

* ``config``: the resolved values of the keys in :data:`CONFIG_KEYS` (``logical_axis_rules`` as lists);
* ``mesh``: MaxText mesh axis -> size, in MaxText's order;
* ``params``: every parameter (``path``, ``shape``, ``logical``: MaxText's logical axis names per dim, with
  the scanned layers axis named as MaxText inserts it, ``spec``: the PartitionSpec MaxText gives it,
  size-one mesh axes removed, as a list of ``null`` / axis / [axes]);
* ``activations``: the constrained activations (``site``: MaxText's ``file/variable``, ``shape``,
  ``logical``, ``spec``), and ``logits``, the output logits' sharding as the decoder builds it from its
  logical names;
* ``error``: instead of the above, MaxText's own message when a step refuses the config.

A failure of one case does not stop the others. ``{"files": true}`` instead of cases writes one object
with MaxText's own files as data: ``base`` (every top-level key of ``configs/base.yml`` with its value) and
``models`` (each ``configs/models/NAME.yml``'s keys and values), which layoutsearch's version tables are
generated from (``python -m layoutsearch.maxtext.tables``).
"""

import json
import os
import sys
import traceback

CONFIG_KEYS = (
    "model_name", "decoder_block", "base_emb_dim", "emb_dim", "base_num_query_heads", "num_query_heads",
    "base_num_kv_heads", "num_kv_heads", "base_mlp_dim", "mlp_dim", "base_num_decoder_layers",
    "num_decoder_layers", "head_dim", "vocab_size", "mlp_activations", "logits_via_embedding", "fused_qkv",
    "use_iota_embed", "trainable_position_size", "max_target_length", "per_device_batch_size",
    "global_batch_size_to_train_on", "micro_batch_size_to_train_on", "gradient_accumulation_steps",
    "num_pipeline_microbatches", "num_layers_per_pipeline_stage", "num_pipeline_repeats",
    "pipeline_parallel_layers", "remat_policy", "scan_layers", "param_scan_axis", "dtype", "weight_dtype",
    "mesh_axes", "data_sharding", "input_data_sharding_logical_axes", "logical_axis_rules",
    "override_logical_axis_rules", "num_slices", "ici_parallelism", "dcn_parallelism", "enable_dropout",
    "dropout_rate", "normalization_layer_epsilon", "use_bias_in_projections", "shard_mode",
)

LOGITS_LOGICAL = ("activation_embed_and_logits_batch", "activation_length", "activation_vocab")
"""The logical names MaxText's decoder gives its output logits in training (``layers/nnx_decoders.py``,
``apply_output_head``)."""


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if hasattr(x, "value") and isinstance(x.value, (str, int)):  # enums
        return x.value
    return str(x)


def _spec(spec):
    return [None if s is None else (list(s) if isinstance(s, tuple) else s) for s in spec]


def _logical_names(axes):
    if axes is None:
        return None
    if isinstance(axes, str):
        axes = (axes,)
    return [None if a is None else str(a) for a in axes]


def run_case(argv, devices):
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils, model_creation_utils
    from maxtext.utils import sharding as mt_sharding

    argv = list(argv) + ["run_name=layoutsearch_probe", "skip_jax_distributed_system=true",
                         "enable_checkpointing=false", "debug_sharding=true"]
    cfg = pyconfig.initialize([sys.argv[0]] + argv)
    try:
        mesh = maxtext_utils.get_mesh_from_config(cfg, jax.devices()[:devices])
        built_by = "MaxText"
    except ValueError as e:  # a multi-slice mesh: MaxText's hybrid builder reads TPU slice indices
        if "slice_index" not in str(e):
            raise
        mesh = _slices_mesh(cfg, jax.devices()[:devices])
        built_by = "the probe (ici x dcn per axis: MaxText's hybrid mesh builder needs TPU slices)"
    out = {"config": {k: _plain(getattr(cfg, k, None)) for k in CONFIG_KEYS},
           "mesh": {str(a): int(s) for a, s in mesh.shape.items()}, "mesh_built_by": built_by}
    _, model = model_creation_utils.create_nnx_abstract_model(cfg, mesh)
    graphdef, state = nnx.split(model)
    params = []
    for path, var in jax.tree_util.tree_leaves_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable)):
        if not isinstance(var, nnx.Param):
            continue
        value = var.get_value()
        meta = var.get_metadata()
        logical = list(_logical_names(meta.get("out_sharding") or meta.get("sharding_names")
                                      or meta.get("sharding")) or [])
        if "param_scan_axis" in meta and nnx.PARTITION_NAME in meta and meta[nnx.PARTITION_NAME] not in logical:
            logical.insert(meta.get("param_scan_axis", 0), meta[nnx.PARTITION_NAME])
        params.append({
            "path": "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path),
            "shape": list(value.shape), "logical": logical,
            "spec": _spec(mt_sharding.remove_size_one_mesh_axis(value.sharding.spec, mesh)),
        })
    out["params"] = params

    batch, length = cfg.micro_batch_size_to_train_on, cfg.max_target_length

    def forward(state, ids):
        m = nnx.merge(graphdef, state)
        return m(decoder_input_tokens=ids, decoder_positions=ids, decoder_segment_ids=ids, enable_dropout=False)

    mt_sharding.clear_input_shardings_dump()
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    with jax.set_mesh(mesh), nn.logical_axis_rules(cfg.logical_axis_rules):
        jax.eval_shape(forward, state, ids)
        logits = mt_sharding.logical_to_mesh_axes(LOGITS_LOGICAL, mesh, rules=cfg.logical_axis_rules)
    acts = []
    for entry in mt_sharding._ACTIVATION_SHARDINGS_DUMP:  # MaxText's own record of debug_sharding
        (key, rec), = entry.items()
        site, _, aval = key.partition(": ")
        logical = rec["logic_axes"]
        acts.append({"site": site, "aval": aval,
                     "logical": None if logical == "Unknown" else list(eval_tuple(logical)),
                     "spec": _spec(eval_spec(rec["PartitionSpec"]))})
    out["activations"] = acts
    out["logits"] = {"logical": list(LOGITS_LOGICAL), "spec": _spec(logits)}
    return out


def _slices_mesh(cfg, devices):
    """The mesh of a multi-slice config on simulated devices: each axis ici x dcn, slices major (the shape
    MaxText's ``create_hybrid_device_mesh`` builds), the -1 entries filled by MaxText's own helper."""
    import numpy as np
    from jax.sharding import Mesh
    from maxtext.utils import max_utils

    slices = cfg.num_slices
    ici = max_utils.fill_unspecified_mesh_axes(list(cfg.ici_parallelism), len(devices) // slices, "ICI")
    dcn = max_utils.fill_unspecified_mesh_axes(list(cfg.dcn_parallelism), slices, "DCN")
    grid = np.array(devices).reshape([*dcn, *ici])
    n = len(ici)
    grid = grid.transpose([i for pair in zip(range(n), range(n, 2 * n)) for i in pair])
    return Mesh(grid.reshape([d * i for d, i in zip(dcn, ici)]), cfg.mesh_axes)


def eval_tuple(text):
    """MaxText's dump writes the logical names as a Python tuple literal: read it as a literal."""
    import ast
    value = ast.literal_eval(text)
    return value if isinstance(value, tuple) else (value,)


def eval_spec(text):
    """``P('fsdp', None, ('data', 'tensor'))`` as a tuple of entries, read as a literal (no eval); a name
    such as ``UNCONSTRAINED`` becomes the string ``<UNCONSTRAINED>``."""
    import ast

    def convert(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(convert(e) for e in node.elts)
        if isinstance(node, ast.Name):
            return f"<{node.id}>"
        if isinstance(node, ast.Attribute):
            return f"<{node.attr}>"
        raise ValueError(f"unexpected PartitionSpec entry in {text!r}")

    call = ast.parse(text, mode="eval").body
    if not isinstance(call, ast.Call):
        raise ValueError(f"not a PartitionSpec: {text!r}")
    return tuple(convert(a) for a in call.args)


def read_files():
    """MaxText's ``base.yml`` and model files, as plain data (OmegaConf's reader, interpolations unresolved)."""
    import omegaconf
    from maxtext.configs import pyconfig

    root = pyconfig.MAXTEXT_CONFIGS_DIR

    def load(path):
        return _plain(omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(path), resolve=False))

    models_dir = os.path.join(root, "models")
    return {"base": load(os.path.join(root, "base.yml")),
            "models": {f[:-4]: load(os.path.join(models_dir, f)) for f in sorted(os.listdir(models_dir))
                       if f.endswith(".yml")}}


def main():
    request = json.load(sys.stdin)
    devices = int(request["devices"])
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    stdout = sys.stdout
    sys.stdout = sys.stderr  # MaxText prints; the JSON lines alone go to the real stdout
    import maxtext
    version = getattr(maxtext, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v
        version = _v("maxtext")
    if request.get("files"):
        stdout.write(json.dumps({"maxtext_version": version, **read_files()}) + "\n")
        return
    for case in request["cases"]:
        try:
            result = run_case(case["argv"], devices)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        result["maxtext_version"] = version
        stdout.write(json.dumps(result) + "\n")
        stdout.flush()


if __name__ == "__main__":
    main()
