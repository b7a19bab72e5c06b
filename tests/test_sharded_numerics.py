"""Sharded == unsharded: every zoo case (``tests/cases.py``) run on 8 simulated
devices under its layout computes the same training step as the unsharded
interpreter, and the same gradients as ``jax.grad`` of the unsharded forward.

Tolerance: float32, ``rtol = atol = 1e-5``. A sharded program sums partial
results in another order than the unsharded one (an all-reduce adds per-device
partial sums; a split softmax/layer norm/cross-entropy combines per-device
statistics), so results differ by rounding: a few float32 ulps per reduction
level, ~1e-6 relative for the reductions here (at most a few hundred terms).
``atol`` covers values that cancel to ~0 (e.g. GPT's key-bias gradient, zero in
exact arithmetic). The optimizers are chosen so that comparing the new
parameters checks the gradients at full strength (SGD with lr 1: ``new/P = P -
grad``) and does not amplify rounding noise (Adam with ``eps = lr``); see
:data:`cases.SGD` and :data:`cases.ADAM`.

The executables are compiled once per session (:func:`cases.compiled`) and
shared with ``test_xla_agreement.py``; references are computed eagerly on one
device (jitted), once per model.
"""

from __future__ import annotations

from functools import cache

import jax
import numpy as np
import pytest
from cases import ADAM, CASES, CASES_BY_NAME, SGD, Case, case_params, compiled, feeds, placed

from layoutsearch.backend.program import forward_fn, run_graph
from layoutsearch.backend.sharding import FAST_COMPILE, run_sharded, step_outputs
from layoutsearch.ir import Optimizer
from layoutsearch.ir.ops import is_dropout_mask
from layoutsearch.layout import Layout

RTOL = 1e-5
ATOL = 1e-5

ADAM_CASES = tuple(CASES_BY_NAME[n] for n in (
    "mtf-ffn/fsdp", "mlp/2d", "mtf-transformer/mp", "gpt/2d", "gpt/fsdp", "moe/ep", "gpt-llama/2d"))
"""Adam runs on a subset in the fast tier (one or two per model, covering every
kind of split of the optimizer state); the rest are marked slow."""


def _close(name: str, got: object, want: object) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL, err_msg=name)


def _on_one_device(f, *args):
    """``f(*args)`` jitted on one device, without sharding constraints (faster than eager)."""
    args = jax.device_put(args, jax.devices()[0])
    return jax.jit(f).lower(*args).compile(compiler_options=FAST_COMPILE)(*args)


@cache
def _reference(family: str, optimizer: Optimizer) -> dict[str, np.ndarray]:
    """Every tensor of the unsharded training step of ``family`` (a model at the sizes
    of its cases, see :attr:`Case.family`; no constraints, one device)."""
    case = next(c for c in CASES if c.family == family)
    g = case.training(optimizer)
    env = _on_one_device(lambda f: run_graph(g, f), feeds(case, optimizer))
    return {k: np.asarray(v) for k, v in env.items()}


@cache
def _jax_grad(family: str) -> dict[str, np.ndarray]:
    """``jax.grad`` of the unsharded forward graph's loss with respect to every parameter."""
    case = next(c for c in CASES if c.family == family)
    fwd = case.graph()
    f = feeds(case, SGD)
    params = {p.name: f[p.name] for p in fwd.parameters}
    inputs = {t.name: f[t.name] for t in fwd.inputs}
    grads = _on_one_device(jax.grad(forward_fn(fwd)), params, inputs)
    return {k: np.asarray(v) for k, v in grads.items()}


def _run(case: Case, optimizer: Optimizer) -> dict[str, np.ndarray]:
    exe, _ = compiled(case, optimizer)
    return {k: np.asarray(v) for k, v in exe(placed(case, optimizer)).items()}


def _check_step(case: Case, optimizer: Optimizer) -> None:
    got = _run(case, optimizer)
    want = _reference(case.family, optimizer)
    g = case.training(optimizer)
    assert sorted(got) == sorted(step_outputs(g))
    for k in step_outputs(g):
        _close(f"{case.name}: {k}", got[k], want[k])


@pytest.mark.parametrize("case", case_params())
def test_sharded_sgd_step_equals_unsharded(case: Case):
    """Loss and new parameters (= parameters - gradients) of the sharded step."""
    _check_step(case, SGD)


@pytest.mark.parametrize("case", case_params(ADAM_CASES))
def test_sharded_adam_step_equals_unsharded(case: Case):
    """Loss, new parameters and new Adam moments of the sharded step."""
    _check_step(case, ADAM)


@pytest.mark.slow
@pytest.mark.parametrize("case", case_params(tuple(c for c in CASES if c not in ADAM_CASES)))
def test_sharded_adam_step_equals_unsharded_all(case: Case):
    _check_step(case, ADAM)


@pytest.mark.parametrize("case", case_params())
def test_sharded_gradients_equal_jax_grad(case: Case):
    """The sharded step's gradients (``P - new/P`` with SGD at lr 1) against
    ``jax.grad`` of the unsharded forward: the derived backward pass, run
    sharded, is the true gradient."""
    got = _run(case, SGD)
    grads = _jax_grad(case.family)
    f = feeds(case, SGD)
    assert grads, case.name
    for p, g in grads.items():
        _close(f"{case.name}: new/{p}", got[f"new/{p}"], np.asarray(f[p]) - g)


@pytest.mark.parametrize("family", sorted({c.family for c in CASES}))
def test_unsharded_derived_gradients_equal_jax_grad(family: str):
    ref = _reference(family, SGD)
    for p, g in _jax_grad(family).items():
        _close(f"{family}: grad/{p}", ref[f"grad/{p}"], g)


def test_default_pipeline_runs_the_same_step():
    """The executables above skip XLA's fusion pass (see ``test_xla_agreement``);
    the ordinary ``jax.jit`` path (:func:`run_sharded`) computes the same step."""
    case = CASES_BY_NAME["gpt/2d"]
    got = run_sharded(case.training(SGD), case.layout(), feeds(case, SGD))
    want = _reference(case.family, SGD)
    for k, v in got.items():
        _close(f"{case.name} (fused): {k}", v, want[k])


def test_every_model_and_strategy_is_covered():
    assert {c.model for c in CASES} == {"mtf-ffn", "mlp", "mtf-transformer", "gpt", "moe"}
    assert {c.strategy for c in CASES} >= {"dp", "mp", "2d", "fsdp", "ep", "sp"}
    for c in CASES:
        c.layout().check(c.training(SGD))
    # FSDP: activations split over data by batch, parameters by a model dim
    fsdp = CASES_BY_NAME["gpt/fsdp"]
    g, lay = fsdp.graph(), fsdp.layout()
    assert lay.spec(g.tensors["layer.0/wq"]) == ("data", None, None)
    assert lay.spec(g.tensors["layer.0/ln_attn"]) == ("data", None, None)
    # Llama-style GQA: the KV heads (and the query heads grouped under them) split over model
    llama = CASES_BY_NAME["gpt-llama/2d"]
    g, lay = llama.graph(), llama.layout()
    assert lay.spec(g.tensors["layer.0/wk"]) == (None, "model", None)
    assert lay.spec(g.tensors["layer.0/wq"]) == (None, "model", None, None)
    assert lay.spec(g.tensors["layer.0/attn_logits"]) == ("data", "model", None, None, None)
    assert lay.spec(g.tensors["layer.0/wi_gate"]) == (None, "model")


@pytest.mark.parametrize("rules", ["batch:data,heads:model,d_ff:model,vocab:model", "kv_seq:data,d_model:model"],
                         ids=["2d", "minor-dims"])
def test_dropout_masks_do_not_depend_on_the_sharding(rules: str):
    """Every dropout mask of the sharded step is bitwise the unsharded one (partitionable threefry: each
    device draws its block of the same mask), whichever dims the layout splits (also the minor ones)."""
    case = CASES_BY_NAME["gpt-dropout/2d"]
    g = case.training(SGD)
    masks = [op.output for op in g.ops if is_dropout_mask(op)]
    assert len(masks) == 3
    got = run_sharded(g, Layout.from_rules(case.mesh, rules), feeds(case, SGD), outputs=masks)
    want = _reference(case.family, SGD)
    for m in masks:
        assert len(got[m].sharding.device_set) == 8
        np.testing.assert_array_equal(np.asarray(got[m]), want[m], err_msg=m)
        assert 0.8 < np.mean(want[m] > 0) < 1.0
