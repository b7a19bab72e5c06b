"""Pipeline execution (layoutsearch.backend.pipeline) on 8 simulated CPU devices: GPipe and 1F1B, equal and
unequal stages. The GPipe formulas follow; the 1F1B ones are stated at its tests, at the end of the file.

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

With a tensor-parallel layout on a third axis ``model`` (Megatron,
``heads:model,d_ff:model``, gpt), per layer and loop step (count
T·L/K each), on top of the above (b unchanged: the activation between layers
is replicated over ``model``; ``P_s`` is the local, model-split bytes):

* forward loop: 2 all-reduces of ``b`` (attention output, ff output);
* backward loop: ``b`` (input gradient of ``wi``) + ``3b`` (input gradients
  of ``wq``, ``wk``, ``wv``: XLA all-reduces the three partial sums as one
  tuple instead of adding them first), plus the 2 forward ones again with remat.

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

from layoutsearch import zoo
from layoutsearch.backend import hlo
from layoutsearch.backend.pipeline import Pipeline, compile_pipeline, pipelined_loss_and_grads
from layoutsearch.backend.program import forward_fn, init_params, random_inputs
from layoutsearch.backend.stages import IN, split_graph
from layoutsearch.errors import GraphError, LayoutError
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh

FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
SIZES = {"layers": 4, "d_model": 32, "batch": 16, "seq": 8}
MODEL_SIZES = {"gpt": SIZES, "mtf-transformer": SIZES, "moe": {"layers": 2, "batch": 8, "seq": 16, "d_model": 32}}

# (model, K stages, D data, M micro-batches, remat): each model covers K in {2, 4}, M in {2, 4},
# remat on and off, with and without a data axis (gpt together with TP_CASE below).
CASES = [
    ("gpt", 2, 1, 2, True),
    ("gpt", 4, 2, 4, False),
    ("mtf-transformer", 4, 1, 2, False),
    ("mtf-transformer", 4, 2, 2, True),
    ("mtf-transformer", 2, 2, 4, False),
    ("moe", 2, 2, 2, True),
]
IDS = [f"{m}-K{k}-D{d}-M{mb}-{'remat' if r else 'noremat'}" for m, k, d, mb, r in CASES]


@functools.cache
def _model(name: str):
    g = zoo.build(name, **MODEL_SIZES[name])
    params, inputs = init_params(g), random_inputs(g)
    ref = jax.jit(jax.value_and_grad(forward_fn(g))).lower(params, inputs).compile(FAST)(params, inputs)
    return g, params, inputs, ref


def _mesh(K: int, D: int) -> dict[str, int]:
    return {"stage": K, "data": D} if D > 1 else {"stage": K}


MEGATRON = "heads:model,d_ff:model"


@functools.cache
def _compiled(model: str, K: int, D: int, M: int, remat: bool | str, layout: str | None = None,
              schedule: str = "gpipe", counts: tuple[int, ...] | None = None):
    g, params, inputs, _ = _model(model)
    mesh = {**_mesh(K, D), "model": 2} if layout else _mesh(K, D)
    kw = {"remat": remat, "layout": layout, "schedule": schedule, "layers_per_stage": counts}
    # The function API and compile_pipeline build equal pipelines: run one's program through the other.
    fn, pipe = pipelined_loss_and_grads(g, mesh, microbatches=M, stages=K, **kw)
    assert fn == pipe.loss_and_grads
    compiled, jax_mesh = compile_pipeline(g, mesh, params, inputs, microbatches=M, compiler_options=FAST, **kw)
    assert jax_mesh.shape == pipe.mesh.shape
    return pipe, compiled


TP_CASE = ("gpt", 2, 2, 2, True, MEGATRON)  # stage 2 x data 2 x model 2 = 8 devices


@pytest.mark.parametrize("case", [*CASES, TP_CASE], ids=[*IDS, "gpt-K2-D2-M2-remat-megatron"])
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
    model, _, D, *_ = case
    g, *_ = _model(model)
    pipe, compiled = _compiled(*case)
    b, T, P_s, P_o = _sizes(g, pipe, *case[:4])
    summary = hlo.summarize(compiled, pipe.mesh)
    permutes = [c for c in summary.collectives if c.kind == "collective-permute"]
    assert [(c.axes, c.bytes, c.count) for c in permutes] == [(("stage",), b, T)] * 2
    assert all(c.kind in ("collective-permute", "all-reduce") for c in summary.collectives)
    reduces = [c for c in summary.collectives if c.kind == "all-reduce"]
    assert all(c.count == 1 for c in reduces), [(c.axes, c.count) for c in reduces]
    expected = {("stage", "data"): P_o + 4, ("data",): P_s} if D > 1 else {("stage",): P_o + 4}
    assert {axes: n for (kind, axes), n in summary.bytes_by().items() if kind == "all-reduce"} == expected


def _sizes(g, pipe: Pipeline, model: str, K: int, D: int, M: int) -> tuple[int, int, int, int]:
    """b, T, P_s, P_o of the module docstring (local bytes under the pipeline's layout)."""
    L, T, B = MODEL_SIZES[model]["layers"], M + K - 1, MODEL_SIZES[model]["batch"]
    act = pipe.parts.layer.tensors[IN]
    b = B // (D * M) * math.prod(d.size for d in act.dims if d.name != "batch") * act.itemsize
    P_s = L // K * sum(pipe.layout.local_bytes(t) for t in g.parameters if t.name.startswith("layer.0/"))
    P_o = sum(pipe.layout.local_bytes(t) for t in g.parameters if not t.name.startswith("layer."))
    return b, T, P_s, P_o


def test_tensor_parallel_layout_inside_stages_adds_the_megatron_all_reduces():
    """See the module docstring: stage x data x model = 2 x 2 x 2, M = 2, remat."""
    g, *_ = _model("gpt")
    pipe, compiled = _compiled(*TP_CASE)
    b, T, P_s, P_o = _sizes(g, pipe, *TP_CASE[:4])
    L_K = MODEL_SIZES["gpt"]["layers"] // 2
    assert P_s < L_K * sum(t.nbytes for t in g.parameters if t.name.startswith("layer.0/"))  # split over model
    summary = hlo.summarize(compiled, pipe.mesh)
    assert [(c.axes, c.bytes, c.count) for c in summary.collectives if c.kind == "collective-permute"] == \
        [(("stage",), b, T)] * 2
    model = [c for c in summary.collectives if c.axes == ("model",)]
    assert {(c.kind, c.count) for c in model} == {("all-reduce", T * L_K)}
    assert sorted(c.bytes for c in model) == sorted([b, b] + [b, b] + [b, 3 * b])  # forward, recompute, backward
    rest = {axes: n for (kind, axes), n in summary.bytes_by().items() if axes != ("model",) and kind == "all-reduce"}
    assert rest == {("stage", "data"): P_o + 4, ("data",): P_s}


def test_remat_wraps_the_stage_function_in_checkpoint():
    g, params, inputs, _ = _model("mtf-transformer")
    for remat in (True, False):
        pipe = Pipeline(g, {"stage": 2}, microbatches=2, remat=remat)
        jaxpr = str(jax.make_jaxpr(pipe.step)(*pipe.place(params, inputs)))
        assert ("remat" in jaxpr) == remat


@pytest.mark.parametrize(("counts", "mesh"), [((1, 3), {"stage": 2, "data": 2}), ((1, 2, 1), {"stage": 3})])
def test_any_contiguous_stage_partition_computes_the_unpipelined_step(counts, mesh):
    """Unequal stages (as the pipeline cost model's exact partition may choose): padding slots pass the
    activation through, and the gradients equal the unpipelined step's (same tolerances)."""
    g, params, inputs, (ref_loss, ref_grads) = _model("gpt")
    pipe = Pipeline(g, mesh, microbatches=2, layers_per_stage=counts)
    stacked, outer = pipe.stack(params)
    assert stacked["wq"].shape[:2] == (len(counts), max(counts))
    assert pipe.unstack(stacked, outer).keys() == params.keys()
    loss, grads = pipe.loss_and_grads(params, inputs, pipe.compile(params, inputs, FAST))
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        np.testing.assert_allclose(grads[name], ref, rtol=2e-5, atol=2e-6 * max(1.0, float(np.max(np.abs(ref)))),
                                   err_msg=name)


def test_the_cost_models_partition_is_what_the_executor_runs():
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    g, params, inputs, (ref_loss, _) = _model("gpt")
    rep = estimate_pipeline(g, Layout.from_rules("stage:2", ""), "h100", stage_axis="stage", microbatches=2,
                            schedule="gpipe")
    counts = rep.layers_per_stage()
    assert len(counts) == 2 and sum(counts) == 4
    pipe = Pipeline(g, {"stage": 2}, microbatches=2, layers_per_stage=counts)
    loss, _ = pipe.loss_and_grads(params, inputs, pipe.compile(params, inputs, FAST))
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)


def test_a_partition_that_does_not_cover_the_layers_fails_clearly():
    g = zoo.build("gpt", **SIZES)
    for counts in ((2, 1), (4, 0), (1, 1, 2)):
        with pytest.raises(GraphError, match="layers_per_stage"):
            Pipeline(g, {"stage": 2}, microbatches=2, layers_per_stage=counts)


def test_stack_and_unstack_parameters():
    g, params, *_ = _model("gpt")
    pipe = Pipeline(g, {"stage": 2, "data": 2}, microbatches=4)
    assert (pipe.K, pipe.D, pipe.M, pipe.remat) == (2, 2, 4, "full")  # remat=True is full
    stacked, outer = pipe.stack(params)
    assert stacked["wq"].shape == (2, 2, 32, 4, 8)
    np.testing.assert_array_equal(stacked["wq"][1, 0], params["layer.2/wq"])
    back = pipe.unstack(stacked, outer)
    assert back.keys() == params.keys() and all(np.array_equal(back[k], params[k]) for k in params)


def test_split_graph_cuts_pre_layer_post():
    parts = split_graph(zoo.build("gpt", **SIZES), stages=2, microbatches=4, data=2)
    assert (parts.entry, parts.exit, parts.layer_out, parts.layers) == ("embedded", "layer.3/ff_residual",
                                                                        "ff_residual", 4)
    assert parts.layer.dims["batch"] == 2 and parts.pre.dims["batch"] == parts.post.dims["batch"] == 8
    assert set(parts.outer_params) == {"embed", "pos_embed", "final_ln_scale", "final_ln_bias"}
    assert "wq" in parts.layer_params and parts.post.loss == "loss"


@pytest.mark.parametrize(("model", "mesh", "M", "error", "match"), [
    ("gpt", {"stage": 3}, 2, GraphError, "do not split into 3 equal stages"),
    ("gpt", {"stage": 2, "data": 2}, 3, GraphError, "not divisible"),
    ("mlp", {"stage": 2}, 2, GraphError, "same dims|differs"),
])
def test_unpipelinable_requests_fail_clearly(model, mesh, M, error, match):
    g = zoo.build(model, layers=4) if model == "mlp" else zoo.build(model, **SIZES)
    with pytest.raises(error, match=match):
        Pipeline(g, mesh, microbatches=M)


@pytest.mark.parametrize(("layout", "match"), [
    ("d_ff:data", "may only use the other mesh axes"),
    ("batch:model", "may only use the other mesh axes"),
    (Layout.from_rules(Mesh.of({"stage": 2, "model": 4}), "heads:model"), "differs from the pipeline mesh"),
    ("vocab:model", "cannot be split"),
])
def test_layouts_the_pipeline_cannot_honour_fail_clearly(layout, match):
    g = zoo.build("gpt", **SIZES, vocab=63)
    with pytest.raises(LayoutError, match=match):
        Pipeline(g, {"stage": 2, "data": 2, "model": 2}, microbatches=2, layout=layout)


def test_stages_must_match_the_stage_axis():
    with pytest.raises(LayoutError, match="stages=4"):
        Pipeline(zoo.build("gpt", **SIZES), {"stage": 2}, microbatches=2, stages=4)


def test_pipeline_cost_model_predicts_the_compiled_collectives():
    """The pipeline cost model (layoutsearch.costmodel.pipeline) against the
    compiled GPipe program, gpt with K=4 stages x D=2 data, M=4: a middle
    stage's collective-permutes (2 x T x b) and its layer-gradient all-reduce
    over data (P_s, once per step) are predicted exactly.

    Known deviation, listed rather than hidden: the backend runs the ops
    outside the layers (embedding, head, loss) on every stage and all-reduces
    their gradients over stage x data; the cost model places them on the
    first and last stage and synchronizes them over data only."""
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    case = ("gpt", 4, 2, 4, False)
    g, *_ = _model("gpt")
    pipe, compiled = _compiled(*case)
    summary = hlo.summarize(compiled, pipe.mesh)
    groups = [[f"layer.{i}"] for i in range(4)]
    groups[0].insert(0, "pre")
    groups[-1].append("post")
    rep = estimate_pipeline(g, Layout.from_rules("stage:4,data:2", "batch:data"), "cpu-sim", stage_axis="stage",
                            microbatches=4, stages=groups, precision="fp32")
    middle = rep.stages[1].collectives
    predicted_permute = sum(b * n for kind, _, b, n in middle if kind == "collective-permute")
    compiled_permute = sum(c.total_bytes for c in summary.collectives if c.kind == "collective-permute")
    assert predicted_permute == compiled_permute
    predicted_sync = sum(b for kind, axes, b, n in middle if kind == "all-reduce" and axes == ("data",))
    assert all(n == 1 for kind, _, _, n in middle if kind == "all-reduce")
    assert predicted_sync == summary.bytes_by()[("all-reduce", ("data",))]  # P_s: this stage's layer


# -- 1F1B (PipeDream-flush) and unequal stages --------------------------------------------------------------
# (model, K, D, M, remat, layout, schedule, layers per stage): K = 2 and 4, with and without a data axis,
# remat none / selective / full, a tensor-parallel layout, and unequal stages (1 + 3 on two stages with a data
# axis, 1 + 2 + 1 on three).
ONE_F_ONE_B = [
    ("gpt", 2, 1, 2, True, None, "1f1b", None),
    ("gpt", 4, 2, 4, False, None, "1f1b", None),
    ("moe", 2, 2, 2, True, None, "1f1b", None),
    ("gpt", 2, 2, 2, True, MEGATRON, "1f1b", None),
    ("gpt", 2, 2, 4, "selective", None, "1f1b", (1, 3)),
    ("gpt", 3, 1, 4, False, None, "1f1b", (1, 2, 1)),
]
ONE_F_ONE_B_IDS = ["gpt-K2-M2-remat", "gpt-K4-D2-M4", "moe-K2-D2-M2-remat", "gpt-K2-D2-M2-megatron",
                   "gpt-K2-D2-M4-selective-1+3", "gpt-K3-M4-1+2+1"]


def _assert_equal_to_reference(model, loss, grads):
    _, _, _, (ref_loss, ref_grads) = _model(model)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        np.testing.assert_allclose(grads[name], ref, rtol=2e-5, atol=2e-6 * max(1.0, float(np.max(np.abs(ref)))),
                                   err_msg=name)


@pytest.mark.parametrize("case", ONE_F_ONE_B, ids=ONE_F_ONE_B_IDS)
def test_1f1b_loss_and_grads_equal_the_unpipelined_step_and_gpipe(case):
    """The 1F1B step (backward written out, post ops per micro-batch) computes the unpipelined loss and
    gradients (the tolerances of the module docstring) and GPipe's loss (rtol 2e-6: the loss of the local
    batch is the mean of the micro-batches' losses rather than one mean, a different float32 summation order)."""
    model, params, inputs = case[0], *_model(case[0])[1:3]
    pipe, compiled = _compiled(*case)
    assert pipe.schedule == "1f1b"
    loss, grads = pipe.loss_and_grads(params, inputs, compiled)
    _assert_equal_to_reference(model, loss, grads)
    gpipe = (*case[:6], "gpipe", case[7])
    if gpipe[:5] in CASES or gpipe[:6] == TP_CASE:  # compiled already by the GPipe tests
        g_pipe, g_compiled = _compiled(*gpipe)
        np.testing.assert_allclose(loss, g_pipe.loss_and_grads(params, inputs, g_compiled)[0], rtol=2e-6)


@pytest.mark.parametrize("case", [c for c in ONE_F_ONE_B if c[5] is None],
                         ids=[i for c, i in zip(ONE_F_ONE_B, ONE_F_ONE_B_IDS, strict=True) if c[5] is None])
def test_1f1b_compiled_collectives_match_the_formulas(case):
    """1F1B runs 2T ticks (T = M + K - 1 loop steps of two ticks): at each tick, the neighbours (k, k+1) with k
    of the tick's parity swap an activation (forward) and a gradient (backward), one collective-permute of
    ``b`` per tick: two instructions (even and odd ticks), T executions each; with K = 2 the odd ticks have no
    pair, one instruction. Per device that is what the pipeline cost model charges a stage (``b`` per loop step
    and neighbour: 2T·b in the middle, T·b at an end). The gradient all-reduces are GPipe's, once per step."""
    model, K, D, M, _, _, _, counts = case
    g, *_ = _model(model)
    pipe, compiled = _compiled(*case)
    b, T, P_s, P_o = _sizes(g, pipe, model, K, D, M)
    P_s = P_s * K // MODEL_SIZES[model]["layers"] * pipe.slots  # a stage's stacked slots, padding included
    summary = hlo.summarize(compiled, pipe.mesh)
    permutes = [c for c in summary.collectives if c.kind == "collective-permute"]
    assert [(c.axes, c.bytes, c.count) for c in permutes] == [(("stage",), b, T)] * (2 if K > 2 else 1)
    assert all(c.kind in ("collective-permute", "all-reduce") for c in summary.collectives)
    assert all(c.count == 1 for c in summary.collectives if c.kind == "all-reduce")
    expected = {("stage", "data"): P_o + 4, ("data",): P_s} if D > 1 else {("stage",): P_o + 4}
    assert {axes: n for (kind, axes), n in summary.bytes_by().items() if kind == "all-reduce"} == expected


@pytest.mark.parametrize("counts", [(1, 3), (2, 2)])
def test_pipeline_cost_model_predicts_the_1f1b_collectives(counts):
    """The pipeline cost model prices each stage's permutes (b per loop step and neighbour) and its layer-gradient
    all-reduce over data; for K = 2 every stage is an end stage and sends T·b, exactly the compiled program's
    one instruction. Unequal stages: the compiled all-reduce covers the padded slots, max(counts) layers, which is
    the layers of the largest stage (the one that sets the step time); the cost model prices a smaller stage's
    (count) layers, the executor all-reduces max(counts) (see the module docstring of backend/pipeline.py)."""
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    case = ("gpt", 2, 2, 4, "selective", None, "1f1b", counts)
    g, *_ = _model("gpt")
    pipe, compiled = _compiled(*case)
    summary = hlo.summarize(compiled, pipe.mesh)
    groups = [["pre", *[f"layer.{i}" for i in range(counts[0])]], [f"layer.{i}" for i in range(counts[0], 4)]]
    groups[-1].append("post")
    rep = estimate_pipeline(g, Layout.from_rules("stage:2,data:2", "batch:data"), "cpu-sim", stage_axis="stage",
                            microbatches=4, stages=groups, precision="fp32", schedule="1f1b", remat="selective")
    compiled_permute = sum(c.total_bytes for c in summary.collectives if c.kind == "collective-permute")
    for stage in rep.stages:
        assert sum(b * n for kind, _, b, n in stage.collectives if kind == "collective-permute") == compiled_permute
    # once per step over data: the stage's layers' gradients and those of its pre / post parameters (which the
    # executor all-reduces over stage x data instead: the known deviation of the GPipe test above)
    sync = [sum(b for kind, axes, b, n in s.collectives if kind == "all-reduce" and axes == ("data",) and n == 1)
            for s in rep.stages]
    outer = [sum(t.nbytes for t in part.parameters) for part in (pipe.parts.pre, pipe.parts.post)]
    layer = sum(t.nbytes for t in g.parameters if t.name.startswith("layer.0/"))
    assert sum(sync) - sum(outer) == sum(counts) * layer  # (the cost model books a gradient of a parameter
    # of post, or of the tied embedding, on the stage where its backward ends: compare the sum over stages)
    assert summary.bytes_by()[("all-reduce", ("data",))] == max(counts) * layer


def test_1f1b_holds_fewer_micro_batches_than_gpipe():
    """M = 8 > K = 2, no remat (every activation of a layer is kept for the backward): the cost model says 1F1B
    holds K = 2 micro-batches in flight on stage 0 where GPipe holds M = 8, and the compiled programs agree in
    direction: XLA's temporary buffers per device (``memory_analysis().temp_size_in_bytes``; arguments and
    outputs are the same) are smaller for 1F1B. GPipe's scan keeps the residuals of all M + K - 1 loop steps,
    1F1B a stash of K slots (see the module docstring of backend/pipeline.py for the measured sizes)."""
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    g, *_ = _model("gpt")
    temp, predicted = {}, {}
    groups = [["pre", "layer.0", "layer.1"], ["layer.2", "layer.3", "post"]]
    for schedule in ("gpipe", "1f1b"):
        pipe, compiled = _compiled("gpt", 2, 1, 8, "none", None, schedule, None)
        m = compiled.memory_analysis()
        temp[schedule] = m.temp_size_in_bytes
        rep = estimate_pipeline(g, Layout.from_rules("stage:2", ""), "cpu-sim", stage_axis="stage", microbatches=8,
                                stages=groups, precision="fp32", schedule=schedule, remat="none")
        predicted[schedule] = rep.stages[0].memory["activations"]
        assert rep.stages[0].in_flight == (8 if schedule == "gpipe" else 2)
    assert predicted["1f1b"] * 4 == predicted["gpipe"]
    assert temp["1f1b"] < 0.7 * temp["gpipe"], temp


def first_step_equals_unpipelined(program, g, steps: int) -> list[float]:
    """Check a compiled pipelined plan's first loss and gradients against the unpipelined step's (rtol 2e-6
    and 2e-5: float32 reassociation), then train ``steps`` steps; returns the losses."""
    ref_loss, ref_grads = jax.value_and_grad(forward_fn(g))(init_params(g, 0), random_inputs(g, 0))
    state = program.init(0)
    loss, grads = jax.jit(program._loss_and_grads)(state.params, program.random_batch(0))
    grads = program.pipeline.unstack(grads["stacked"], grads["outer"])
    np.testing.assert_allclose(float(loss), ref_loss, rtol=2e-6)
    assert set(grads) == set(ref_grads)
    for name, r in ref_grads.items():
        np.testing.assert_allclose(grads[name], r, rtol=2e-5, atol=2e-6, err_msg=name)
    losses = []
    for i in range(steps):
        state, metrics = program.train_step(state, program.random_batch(i))
        losses.append(float(metrics["loss"]))
    assert losses[0] == pytest.approx(float(ref_loss), rel=2e-6)
    return losses


def test_a_searched_plan_with_unequal_stages_and_1f1b_trains(tmp_path, capsys):
    """``ls.search(..., pipeline=2)`` on a 3-layer gpt picks stages of 2 + 1 layers and the 1F1B schedule: the
    program runs them as chosen, trains 3 steps (the same losses through ``layoutsearch run PLAN.json``), and its
    first step's loss and gradients are the unpipelined step's."""
    from clirun import run_json

    import layoutsearch as ls

    g = zoo.build("gpt", layers=3, d_model=32, heads=4, seq=8, batch=16, vocab=128)
    plan = ls.search(g, "stage:2,data:4", hardware="cpu-sim", pipeline=2, schedule="1f1b", precision="fp32",
                     remat="none", microbatches=4)
    assert (plan.chosen.stage_axis, plan.chosen.schedule, plan.layers_per_stage) == ("stage", "1f1b", (2, 1))
    program = plan.compile()
    assert program.pipeline.schedule == "1f1b" and program.pipeline.counts == [2, 1]
    losses = first_step_equals_unpipelined(program, g, 3)
    assert losses[-1] < losses[0]
    path = tmp_path / "plan.json"
    plan.save(path)
    out = run_json(capsys, "run", path, "--steps", "3", "--seed", "0")
    assert [s["loss"] for s in out["steps"]] == losses


def test_unknown_schedules_fail_clearly():
    with pytest.raises(LayoutError, match="runs the schedules gpipe, 1f1b, interleaved:V, maxtext, not 'zero-bubble'"):
        Pipeline(zoo.build("gpt", **SIZES), {"stage": 2}, microbatches=2, schedule="zero-bubble")


def test_bf16_pipelines_compile_on_cpu():
    """Under the ``bf16`` policy the pipeline's parameters enter its ``shard_map`` in bfloat16; the all-reduce
    of their cotangents (JAX's ``psum_invariant``, whose reduction ends in a ``copy``) aborted XLA:CPU's
    AllReducePromotion pass, and the process with it. Such programs compile without that pass on CPU (in its
    own process: a regression would abort the test run)."""
    import subprocess
    import sys
    import textwrap

    from layoutsearch.backend.sharding import BF16_SHARD_MAP_ON_CPU, merge_compiler_options

    assert merge_compiler_options({"xla_disable_hlo_passes": "fusion", "a": 1}, None, BF16_SHARD_MAP_ON_CPU,
                                  {"a": 2}) == {"xla_disable_hlo_passes": "fusion,all-reduce-promotion", "a": 2}
    code = textwrap.dedent("""
        import math, layoutsearch as ls
        from layoutsearch import zoo
        from layoutsearch.backend.train import Program, train
        g = zoo.build('gpt', layers=2, d_model=64, heads=4, seq=16, batch=8, vocab=128)
        lay = ls.Layout.from_rules('data:2,model:2,stage:2', 'batch:data,d_ff:model')
        for precision in ('bf16', 'mixed'):
            p = Program(g, lay, precision=precision, stage_axis='stage', microbatches=2)
            assert (p.pipeline.compiler_options != {}) == (precision == 'bf16')
            assert math.isfinite(train(p, 2).records[-1].loss)
        print('trained')
    """)
    env = {**__import__("os").environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0 and "trained" in run.stdout, run.stderr[-2000:]
