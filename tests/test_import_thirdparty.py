"""Model code nobody here wrote, imported as its authors wrote it (issue 30, item 5): Hugging Face Flax GPT-2,
Llama, Mistral and BERT (transformers<5), a Flax Linen LM with ``nn.MultiHeadDotProductAttention``, a Flax NNX
LM, an Equinox LM and a Haiku LM, each with its loss as its authors' examples write it (``tests/thirdparty/``;
``python -m tests.thirdparty.report`` prints the same table with timings).

Each: imports unmodified (no monkeypatch), gets readable dims (no dim named after a parameter's leaf or a
placeholder), is searched on ``data:2,model:4``, compiled, trained 5 steps from the user's own parameters
(the first loss is the user's eager loss, float32: rtol 1e-5; the loss falls), and the plan put back on the
user's pytree gives the unsharded gradients (rtol 2e-5: float32 sums reassociated across 8 devices).
The libraries come with the ``test`` extra; a case whose library does not install is skipped with the reason.
The ninth, MaxText's own decoder, needs Python >= 3.12 and runs across two interpreters:
``tests/test_import_maxtext_decoder.py``.
"""

from __future__ import annotations

import importlib
import re

import jax
import numpy as np
import pytest

import layoutsearch as ls
from layoutsearch.importer import from_jax, partition_specs

CASES = {
    "hf_gpt2": "transformers", "hf_llama": "transformers", "hf_mistral": "transformers", "hf_bert": "transformers",
    "flax_linen_lm": "flax", "flax_nnx_lm": "flax", "equinox_lm": "equinox", "haiku_lm": "haiku",
}
UNREADABLE = re.compile(r"^(kernel|bias|weight|w|b|embedding|embeddings|constant|dim|x)(_\d+)*$|_\d+_\d+")
"""Dim names made of a parameter's leaf name or a placeholder and axis numbers (``kernel_1``, ``dim8``,
``bias_0_2``): what the importer names a dim it has no role for."""


def _case(module: str):
    pytest.importorskip(CASES[module], reason=f"{CASES[module]} does not install here")
    return importlib.import_module(f"tests.thirdparty.{module}").case()


@pytest.fixture(scope="module", params=sorted(CASES))
def imported(request):
    case = _case(request.param)
    graph = from_jax(case.loss, case.params, *case.batch_args, dims=case.dims)
    plan = ls.search(graph, "data:2,model:4", precision="fp32", top=1, baselines=False)
    return case, graph, plan


def test_dims_are_readable(imported) -> None:
    case, graph, _ = imported
    unreadable = [d for d in graph.dims if UNREADABLE.search(d)]
    assert not unreadable, (case.name, dict(graph.dims))
    assert {"batch", "seq", "vocab"} <= set(graph.dims)
    assert {"heads"} <= set(graph.dims) or "heads" in str(graph.dims)


def test_trains_from_the_users_parameters(imported) -> None:
    case, graph, plan = imported
    program = plan.compile()
    state = program.init(params=case.params)
    batch = program.batch(*case.batch_args)
    losses = []
    for _ in range(5):
        state, metrics = program.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses[0], case.eager_loss, rtol=1e-5)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_the_plan_on_the_users_pytree_gives_the_unsharded_gradients(imported) -> None:
    case, graph, plan = imported
    layout = plan.chosen.layout
    names, sizes = zip(*layout.mesh.axes, strict=True)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(sizes), names)

    def put(tree, arg):
        specs = partition_specs(layout, graph, tree, arg=arg)
        return jax.device_put(tree, jax.tree_util.tree_map(lambda s: jax.sharding.NamedSharding(mesh, s), specs,
                                                           is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)))

    sharded = jax.jit(jax.grad(case.loss))(put(case.params, 0), *(put(a, k + 1) for k, a in enumerate(case.batch_args)))
    want = jax.grad(case.loss)(case.params, *case.batch_args)
    for got, ref in zip(jax.tree_util.tree_leaves(sharded), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=1e-6)
