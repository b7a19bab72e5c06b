"""MaxText's own decoder in the third-party corpus (issue 30, item 5): MaxText 0.2.5's llama2 decoder at a
tiny config (d_model 64, 2 layers, 4 heads of 16, MLP 128, vocab 128, 16 tokens, batch 8; float32, dot-product
attention, no dropout, unscanned layers), its loss MaxText's own ``train.loss_fn`` (one-hot cross entropy over
the vocab, masked by ``targets_segmentation``, summed / number of tokens), called as ``train_step``'s
``diff_wrapper`` calls it (``nnx.merge`` of the ``nnx.Param`` state, the only argument differentiated).

MaxText needs Python >= 3.12, and layoutsearch's own venv runs another JAX, so the case runs across two
interpreters (``tests/maxtext_harness/decoder_case.py`` in the MaxText venv of ``maxtext_venv.py``):

1. MaxText's venv builds the model, computes the eager loss, imports the loss unmodified with layoutsearch's
   importer (dims: MaxText's logical axis names, ``flax_dims`` of its params' metadata) and writes the graph
   (the graph format: the bridge between the two JAX versions), the parameters (by pytree path), the batch;
2. here: the graph is loaded, searched on ``data:2,model:4``, compiled, and trained 5 steps from MaxText's
   parameters (the nested dict of their pytree paths) and batch: the first loss is MaxText's eager loss (rtol
   1e-5) and the loss falls;
3. the plan's PartitionSpecs for MaxText's own pytree (``partition_specs``) go back to MaxText's venv, which
   puts the parameters and batch on 8 devices as the plan says and checks ``jax.jit(jax.grad(loss))``, with
   MaxText's loss and code, against the unsharded gradients (rtol 2e-5, atol 1e-6). The check runs on
   MaxText's own function (what a user would run with the plan), not on the graph's program: the plan's mesh
   axes ``data``/``model`` are MaxText's mesh axes ``data``/``tensor``, the model built on that mesh (its own
   activation constraints apply, as in MaxText).

Skipped, with the reason, where no Python >= 3.12 exists or the MaxText venv cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import layoutsearch as ls
from layoutsearch.importer import partition_specs
from layoutsearch.ir.names import pytree_key
from tests.test_import_thirdparty import UNREADABLE

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "maxtext_harness"
sys.path.insert(0, str(HARNESS))
import maxtext_venv as harness  # noqa: E402

pytestmark = pytest.mark.maxtext

MAXTEXT_NAMES = {"embed", "embed_attn", "embed_vocab", "norm", "mlp", "q_heads", "kv_heads", "heads", "kv",
                 "kv_head_dim", "vocab"}
"""MaxText's logical axis names of the llama2 decoder's parameters (``layers/*.py``)."""


@pytest.fixture(scope="module")
def maxtext_python():
    if harness.base_python() is None:
        pytest.skip("no Python >= 3.12 here (MaxText 0.2.5 needs it): MaxText's decoder case is skipped")
    try:
        return harness.maxtext_python()
    except RuntimeError as e:
        pytest.skip(f"the MaxText 0.2.5 venv could not be made ({e}): MaxText's decoder case is skipped")


def _run_case(python: str, command: str, out: Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([python, str(HARNESS / "decoder_case.py"), command, str(out)], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith(json.dumps({"ok": command})), \
        f"decoder_case.py {command} failed:\n{done.stderr[-6000:]}"


def _nested(flat: dict[str, np.ndarray]) -> dict:
    """The parameter pytree from its leaves by path (``decoder/layers_0/mlp/wi_0/kernel``): MaxText's own
    structure as plain nested dicts."""
    tree: dict = {}
    for key, value in flat.items():
        *path, leaf = key.split("/")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


@pytest.fixture(scope="module")
def imported(maxtext_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("maxtext_decoder")
    _run_case(maxtext_python, "export", out)
    case = json.loads((out / "case.json").read_text())
    graph = ls.load_graph(out / "graph.json")
    params = _nested(dict(np.load(out / "params.npz")))
    batch = dict(np.load(out / "batch.npz"))
    plan = ls.search(graph, "data:2,model:4", precision="fp32", top=1, baselines=False)
    return maxtext_python, out, case, graph, params, batch, plan


def test_dims_are_maxtexts_logical_names(imported) -> None:
    _, _, case, graph, _, _, _ = imported
    unreadable = [d for d in graph.dims if UNREADABLE.search(d)]
    assert not unreadable, dict(graph.dims)
    assert {"batch", "seq", "vocab"} <= set(graph.dims)
    assert MAXTEXT_NAMES <= set(graph.dims), dict(graph.dims)
    logical = {tuple(v) for v in case["logical"].values()}
    assert ("embed", "mlp") in logical and ("embed_attn", "q_heads", "kv") in logical
    for t in graph.tensors.values():  # every parameter's dims are the logical names MaxText gives it
        if t.role == "parameter":
            assert tuple(d.name for d in t.dims) == tuple(case["logical"][t.name]), t.name


def test_trains_from_maxtexts_parameters(imported) -> None:
    _, _, case, graph, params, batch, plan = imported
    program = plan.compile()
    state = program.init(params=params)
    inputs = program.batch(batch)
    losses = []
    for _ in range(5):
        state, metrics = program.train_step(state, inputs)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses[0], case["eager_loss"], rtol=1e-5)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_the_plan_on_maxtexts_pytree_gives_the_unsharded_gradients(imported) -> None:
    python, out, _, graph, params, batch, plan = imported
    layout = plan.chosen.layout

    def entries(spec):
        return [None if e is None else list(e) if isinstance(e, tuple) else e for e in spec]

    def specs(tree, arg):
        got = partition_specs(layout, graph, tree, arg=arg)
        return {pytree_key(p): entries(s) for p, s in jax.tree_util.tree_flatten_with_path(
            got, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))[0]}

    sent = {"params": specs(params, 0), "batch": specs(batch, 1)}
    assert any(any(e is not None for e in s) for s in sent["params"].values()), sent  # the plan splits weights
    (out / "specs.json").write_text(json.dumps(sent))
    _run_case(python, "grads", out)
    got = json.loads((out / "grads.json").read_text())
    assert got["mesh"]["data"] == 2 and got["mesh"]["tensor"] == 4
    assert set(got["leaves"]) == set(sent["params"])
    assert got["split"] > 0, got
    assert got["worst"] <= 1.0, got  # |sharded - unsharded| <= 1e-6 + 2e-5 |unsharded|, every element
