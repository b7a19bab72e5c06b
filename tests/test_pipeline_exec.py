"""GPipe execution (layoutsearch.backend.pipeline) on 8 simulated CPU devices.

Each case compiles the pipelined training step once and checks both that it
computes the unpipelined step and that its compiled program has exactly the
collectives of the pipeline cost model. The formulas verified (per device;
K stages, M micro-batches, D = data-axis size (1 without one), L layers,
T = M + K - 1 loop steps, all in bytes):

* ``b``   = one micro-batch of the activation between layers on one device
            = (B / (D·M)) · (product of its other dims) · itemsize;
* ``P_s`` = the parameters of one stage = (L/K) · bytes of one layer's parameters;
* ``P_o`` = the parameters outside the layers (embeddings, final norm, head).

Collectives of one training step (loss and gradients):

* collective-permute over ``stage``: two instructions, the forward loop's and
  the backward loop's, each executed T times with ``b`` bytes -> 2·T·b in all
  (bubble steps send too; the last forward step's send is unused but runs);
* all-reduce over ``data`` (only when D > 1): the stacked layer gradients,
  ``P_s`` bytes, executed ONCE per step (accumulated over micro-batches
  outside the loop, not once per iteration);
* all-reduce over ``stage`` × ``data`` (over ``stage`` alone when D = 1): the
  outer parameters' gradients plus the scalar loss, ``P_o + 4`` bytes, once
  (pre/post ops run on every stage, so their gradients, nonzero on the first
  or last stage only, are summed over ``stage``);
* nothing else (no all-gather, reduce-scatter, all-to-all).

XLA on CPU combines the gradient all-reduces of one replica group into one
tuple all-reduce; the test sums bytes per mesh-axis group, so split or
combined instructions pass alike.

Numerics: float32; loss within rtol 2e-6, gradients within rtol 2e-5 and
atol 2e-6 · max(1, max |reference gradient of that tensor|) of
``jax.value_and_grad(forward_fn(graph))`` (the reduction order differs:
per-micro-batch and per-shard partial sums; the scale only matters for moe,
whose soft-routed gradients reach 1e5 and whose unpipelined jit and eager
runs already differ by ~1e-6 of the maximum).

Compiles use ``FAST`` (LLVM optimization off): the HLO, hence every collective,
is identical to a default compile; only CPU code generation is cheaper.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest

from graphs import build_model
from layoutsearch.backend import hlo
from layoutsearch.backend.pipeline import IN, Pipeline, compile_pipeline, pipelined_loss_and_grads, split_graph
from layoutsearch.backend.program import forward_fn, init_params, random_inputs
from layoutsearch.errors import GraphError, LayoutError

FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
SIZES = {"layers": 4, "d_model": 32, "batch": 16, "seq": 8}
MODEL_SIZES = {"gpt": SIZES, "mtf-transformer": SIZES, "moe": {"layers": 2, "batch": 8, "seq": 16, "d_model": 32}}

# (model, K stages, D data, M micro-batches, remat): each model covers K in {2, 4}, M in {2, 4},
# remat on and off, with and without a data axis.
CASES = [
    ("gpt", 2, 1, 2, True),
    ("gpt", 4, 2, 4, False),
    ("gpt", 2, 2, 4, True),
    ("mtf-transformer", 4, 1, 2, False),
    ("mtf-transformer", 4, 2, 2, True),
    ("mtf-transformer", 2, 2, 4, False),
    ("moe", 2, 2, 2, True),
]
IDS = [f"{m}-K{k}-D{d}-M{mb}-{'remat' if r else 'noremat'}" for m, k, d, mb, r in CASES]


@functools.cache
def _model(name: str):
    g = build_model(name, **MODEL_SIZES[name])
    params, inputs = init_params(g), random_inputs(g)
    ref = jax.jit(jax.value_and_grad(forward_fn(g))).lower(params, inputs).compile(FAST)(params, inputs)
    return g, params, inputs, ref


def _mesh(K: int, D: int) -> dict[str, int]:
    return {"stage": K, "data": D} if D > 1 else {"stage": K}


@functools.cache
def _compiled(model: str, K: int, D: int, M: int, remat: bool):
    g, params, inputs, _ = _model(model)
    pipe = Pipeline(g, _mesh(K, D), microbatches=M, stages=K, remat=remat)
    compiled = pipe.compile(params, inputs, FAST)
    return pipe, compiled


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pipelined_loss_and_grads_equal_unpipelined_step(case):
    _, params, inputs, (ref_loss, ref_grads) = _model(case[0])
    pipe, compiled = _compiled(*case)
    loss, grads = pipe.loss_and_grads(params, inputs, compiled)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        scale = max(1.0, float(np.max(np.abs(ref))))  # moe's gradients reach 1e5
        np.testing.assert_allclose(grads[name], ref, rtol=2e-5, atol=2e-6 * scale, err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_collectives_match_pipeline_formulas(case):
    """See the module docstring for the formulas."""
    model, K, D, M, _ = case
    g, *_ = _model(model)
    pipe, compiled = _compiled(*case)
    L, T, B = MODEL_SIZES[model]["layers"], M + K - 1, MODEL_SIZES[model]["batch"]
    act = pipe.parts.layer.tensors[IN]
    b = B // (D * M) * math.prod(d.size for d in act.dims if d.name != "batch") * act.itemsize
    P_s = L // K * sum(t.nbytes for t in g.parameters if t.name.startswith("layer.0/"))
    P_o = sum(t.nbytes for t in g.parameters if not t.name.startswith("layer."))

    summary = hlo.summarize(compiled, pipe.mesh)
    permutes = [c for c in summary.collectives if c.kind == "collective-permute"]
    assert [(c.axes, c.bytes, c.count) for c in permutes] == [(("stage",), b, T)] * 2
    assert all(c.kind in ("collective-permute", "all-reduce") for c in summary.collectives)
    reduces = [c for c in summary.collectives if c.kind == "all-reduce"]
    assert all(c.count == 1 for c in reduces), [(c.axes, c.count) for c in reduces]
    expected = {("stage", "data"): P_o + 4, ("data",): P_s} if D > 1 else {("stage",): P_o + 4}
    assert {axes: n for (kind, axes), n in summary.bytes_by().items() if kind == "all-reduce"} == expected


def test_remat_wraps_the_stage_function_in_checkpoint():
    g, params, inputs, _ = _model("mtf-transformer")
    for remat in (True, False):
        pipe = Pipeline(g, {"stage": 2}, microbatches=2, remat=remat)
        jaxpr = str(jax.make_jaxpr(pipe.step)(*pipe.place(params, inputs)))
        assert ("remat" in jaxpr) == remat


def test_function_api_and_compile_pipeline_agree_with_the_class():
    g, params, inputs, _ = _model("gpt")
    fn, pipe = pipelined_loss_and_grads(g, {"stage": 2, "data": 2}, stages=2, microbatches=4)
    assert fn == pipe.loss_and_grads and (pipe.K, pipe.D, pipe.M, pipe.remat) == (2, 2, 4, True)
    case_pipe, case_compiled = _compiled("gpt", 2, 2, 4, True)
    compiled, mesh = compile_pipeline(g, {"stage": 2, "data": 2}, params, inputs, microbatches=4,
                                      compiler_options=FAST)
    assert mesh.axis_names == ("stage", "data")
    assert hlo.summarize(compiled, mesh).bytes_by() == hlo.summarize(case_compiled, case_pipe.mesh).bytes_by()
    stacked, outer = pipe.stack(params)
    assert stacked["wq"].shape == (2, 2, 32, 4, 8)
    assert pipe.unstack(stacked, outer).keys() == params.keys()


def test_split_graph_cuts_pre_layer_post():
    parts = split_graph(build_model("gpt", **SIZES), stages=2, microbatches=4, data=2)
    assert (parts.entry, parts.exit, parts.layer_out, parts.layers) == ("embedded", "layer.3/ff_residual",
                                                                        "ff_residual", 4)
    assert parts.layer.dims["batch"] == 2 and parts.pre.dims["batch"] == parts.post.dims["batch"] == 8
    assert set(parts.outer_params) == {"embed", "pos_embed", "final_ln_scale", "final_ln_bias"}
    assert "wq" in parts.layer_params and parts.post.loss == "loss"


@pytest.mark.parametrize(("model", "mesh", "M", "error", "match"), [
    ("gpt", {"stage": 3}, 2, GraphError, "do not split into 3 equal stages"),
    ("gpt", {"stage": 2, "data": 2}, 3, GraphError, "not divisible"),
    ("gpt", {"stage": 2, "model": 2}, 2, LayoutError, "other axes are not supported"),
    ("mlp", {"stage": 2}, 2, GraphError, "same dims|differs"),
])
def test_unpipelinable_requests_fail_clearly(model, mesh, M, error, match):
    g = build_model(model, layers=4) if model == "mlp" else build_model(model, **SIZES)
    with pytest.raises(error, match=match):
        Pipeline(g, mesh, microbatches=M)


def test_stages_must_match_the_stage_axis():
    with pytest.raises(LayoutError, match="stages=4"):
        Pipeline(build_model("gpt", **SIZES), {"stage": 2}, microbatches=2, stages=4)
