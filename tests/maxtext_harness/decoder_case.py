"""MaxText 0.2.5's own decoder (a tiny llama2 config) as a third-party case of the importer
(tests/test_import_maxtext_decoder.py). A script for the MaxText venv's interpreter
(``maxtext_venv.py``), with this repository on ``PYTHONPATH``.

``decoder_case.py export DIR`` (one CPU device): builds the model as MaxText's trainer does (``pyconfig``
on ``base.yml``, ``model_creation_utils.from_config`` with nnx rngs, under the config's logical axis rules),
takes its parameters as ``train_step`` does (``nnx.split(model, nnx.Param, ...)``) and its loss as
``train_step``'s ``diff_wrapper`` does: ``nnx.merge`` then MaxText's own ``train.loss_fn`` (one-hot cross
entropy over the vocab, masked by ``targets_segmentation``, summed / number of tokens). Imports it with
layoutsearch's importer (dims: MaxText's logical axis names from its params' metadata, ``flax_dims``) and
writes ``DIR/graph.json``, ``DIR/params.npz`` (keyed by pytree path), ``DIR/batch.npz`` and ``DIR/case.json``
(the eager loss, the dims of the graph).

``decoder_case.py grads DIR`` (8 simulated CPU devices): reads ``DIR/specs.json`` (the plan's
PartitionSpecs for the parameters and the batch, from ``layoutsearch.importer.partition_specs``, written by
the test) and ``DIR/params.npz``, puts MaxText's parameters and batch on a mesh ``data:2,model:4`` as the
plan says (MaxText's mesh itself: its ``data`` and ``tensor`` axes, ``tensor`` standing for the plan's
``model``), takes ``jax.jit(jax.grad(loss))`` and the unsharded ``jax.grad(loss)`` (one device, the export's
model) and writes ``DIR/grads.json``: the largest error of each gradient leaf relative to rtol 2e-5 /
atol 1e-6 (``worst`` <= 1 means they agree), the mesh, and how many parameters the plan split (``split``).
"""

from __future__ import annotations

import json
import os
import sys

SIZES = {"base_emb_dim": 64, "base_num_query_heads": 4, "base_num_kv_heads": 4, "head_dim": 16, "base_mlp_dim": 128,
         "base_num_decoder_layers": 2, "vocab_size": 128, "max_target_length": 16}
BATCH = 8


def _config(devices: int):
    from maxtext.configs import pyconfig

    overrides = {**SIZES, "decoder_block": "llama2", "attention": "dot_product", "scan_layers": "false",
                 "dtype": "float32", "weight_dtype": "float32", "matmul_precision": "highest",
                 "enable_dropout": "false", "dropout_rate": 0.0, "per_device_batch_size": BATCH // devices,
                 "run_name": "layoutsearch_decoder_case", "skip_jax_distributed_system": "true",
                 "enable_checkpointing": "false", "packing": "false"}
    if devices > 1:  # the plan's mesh data:2,model:4 as MaxText's axes data:2, tensor:4
        overrides.update(ici_data_parallelism=2, ici_fsdp_parallelism=1, ici_tensor_parallelism=4)
    else:
        overrides.update(ici_fsdp_parallelism=1)
    argv = [sys.argv[0], os.path.join(pyconfig.MAXTEXT_CONFIGS_DIR, "base.yml")]
    return pyconfig.initialize(argv + [f"{k}={v}" for k, v in overrides.items()])


def build(devices: int):
    """MaxText's config, mesh and model; the model's params (``nnx.State`` of ``nnx.Param``) and the loss
    ``loss(params, data)`` as train_step's diff_wrapper computes it."""
    import jax
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxtext.trainers.pre_train import train
    from maxtext.utils import maxtext_utils, maxtext_utils_nnx, model_creation_utils

    cfg = _config(devices)
    mesh = maxtext_utils.get_mesh_from_config(cfg, jax.devices()[:devices])
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(cfg.logical_axis_rules):
        model = model_creation_utils.from_config(cfg, mesh=mesh, rngs=maxtext_utils_nnx.create_nnx_rngs(cfg))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, data):
        local_model = nnx.merge(graphdef, params, rest, copy=True)
        value, _ = train.loss_fn(local_model, cfg, dict(data), None, None, is_train=True)
        return value

    def run(fn, *args):  # MaxText's own context: its mesh and logical axis rules
        with jax.set_mesh(mesh), nn_partitioning.axis_rules(cfg.logical_axis_rules):
            return fn(*args)

    return cfg, mesh, params, loss, run


def example_batch(cfg):
    """A batch as MaxText's input pipeline gives one (unpacked): inputs, targets (inputs shifted), positions,
    segmentation ids (1 = a real token; the last position of each row is padding, 0)."""
    import numpy as np

    rng = np.random.default_rng(0)
    length = cfg.max_target_length
    ids = rng.integers(1, cfg.vocab_size, (BATCH, length + 1), dtype=np.int32)
    segmentation = np.ones((BATCH, length), np.int32)
    segmentation[:, -1] = 0
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (BATCH, length)).copy()
    return {"inputs": ids[:, :-1], "inputs_position": positions, "inputs_segmentation": segmentation,
            "targets": ids[:, 1:], "targets_segmentation": segmentation}


def _flat(tree):
    import jax
    import numpy as np

    from layoutsearch.ir.names import pytree_key

    return {pytree_key(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def export(out: str) -> None:
    import jax
    import numpy as np

    from layoutsearch.importer import flax_dims, from_jax
    from layoutsearch.ir.names import pytree_key
    from layoutsearch.ir.serialize import save_graph

    cfg, _, params, loss, run = build(1)
    data = example_batch(cfg)
    eager = float(run(loss, params, data))
    # MaxText's logical axis names, read outside its axis rules (under them, Flax gives the mesh axes instead)
    dims = (flax_dims(params), {k: ("batch", "seq") for k in data})
    graph = run(lambda: from_jax(loss, params, data, dims=dims, name="maxtext_llama2"))
    save_graph(graph, os.path.join(out, "graph.json"))
    np.savez(os.path.join(out, "params.npz"), **_flat(params))
    np.savez(os.path.join(out, "batch.npz"), **data)
    logical = {pytree_key(p): list(d) for p, d in
               jax.tree_util.tree_flatten_with_path(dims[0], is_leaf=lambda x: isinstance(x, tuple))[0]}
    with open(os.path.join(out, "case.json"), "w") as f:
        json.dump({"eager_loss": eager, "dims": dict(graph.dims), "logical": logical,
                   "jax": jax.__version__}, f, indent=1)


def grads(out: str) -> None:
    import jax
    import numpy as np

    with open(os.path.join(out, "specs.json")) as f:
        specs = json.load(f)
    stored = dict(np.load(os.path.join(out, "params.npz")))
    data = dict(np.load(os.path.join(out, "batch.npz")))

    def user_values(params):
        from layoutsearch.ir.names import pytree_key

        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        return jax.tree_util.tree_unflatten(treedef, [stored[pytree_key(p)] for p, _ in flat])

    def spec(entries):
        rename = {"model": "tensor"}
        return jax.sharding.PartitionSpec(*[
            None if e is None else (tuple(rename.get(a, a) for a in e) if isinstance(e, list) else rename.get(e, e))
            for e in entries])

    # the unsharded reference: the model on one device
    cfg1, _, params1, loss1, run1 = build(1)
    want = _flat(run1(jax.grad(loss1), user_values(params1), data))

    cfg, mesh, params, loss, run = build(8)
    from layoutsearch.ir.names import pytree_key

    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    placed = jax.tree_util.tree_unflatten(treedef, [
        jax.device_put(stored[pytree_key(p)], jax.sharding.NamedSharding(mesh, spec(specs["params"][pytree_key(p)])))
        for p, _ in flat])
    batch = {k: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec(specs["batch"][k]))) for k, v in data.items()}
    got = _flat(run(jax.jit(jax.grad(loss)), placed, batch))
    report = {}
    for k, ref in want.items():
        err = np.abs(got[k] - ref) / (1e-6 + 2e-5 * np.abs(ref))
        report[k] = float(err.max())
    with open(os.path.join(out, "grads.json"), "w") as f:
        json.dump({"worst": max(report.values()), "leaves": report, "mesh": dict(mesh.shape),
                   "split": sum(not x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(placed))},
                  f, indent=1)


def main() -> None:
    command, out = sys.argv[1], sys.argv[2]
    devices = 8 if command == "grads" else 1
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.argv = sys.argv[:1]
    stdout, sys.stdout = sys.stdout, sys.stderr  # MaxText prints: keep stdout for the one result line
    {"export": export, "grads": grads}[command](out)
    stdout.write(json.dumps({"ok": command}) + "\n")


if __name__ == "__main__":
    main()
