"""The interleaved 1F1B schedule (Megatron-LM, ``interleaved:V``) run by the pipeline executor on 8 simulated CPU
devices: its tick tables, its numerics, its compiled collectives against the pipeline cost model, and a searched
interleaved plan that trains.

Formulas checked (per device; K stages, V chunks per device, M micro-batches, D data-axis size, ``b`` one
micro-batch's activation between layers on one device, as in ``test_pipeline_exec.py``):

* the loop runs ``2(M V + K - 1)`` ticks (one chunk forward or backward each): ``(M + (K - 1) / V)`` loop steps
  of the cost model, its bubble;
* collective-permutes over ``stage``: after every tick one swap of ``b`` (K = 2) or one ring shift of ``b``
  each way (K > 2): one or two instructions executed ``2(M V + K - 1)`` times, what the pipeline cost model
  predicts for every stage;
* all-reduces, once per step: the stacked layer gradients over ``data`` (``V`` chunks of ``max(counts)``
  slots, padding included) and the outer gradients and the loss over ``stage`` x ``data``;
* numerics: loss and gradients as the unpipelined step within the tolerances of ``test_pipeline_exec.py``.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest
from test_pipeline_exec import FAST, MEGATRON, first_step_equals_unpipelined

from layoutsearch import zoo
from layoutsearch.backend import hlo, tick_tables
from layoutsearch.backend.pipeline import Pipeline
from layoutsearch.backend.program import forward_fn, init_params, random_inputs
from layoutsearch.backend.stages import IN
from layoutsearch.costmodel.schedule import Schedule
from layoutsearch.errors import GraphError, LayoutError
from layoutsearch.layout import Layout


@functools.cache
def _model(layers: int):
    g = zoo.build("gpt", layers=layers, d_model=32, batch=16, seq=8)
    params, inputs = init_params(g), random_inputs(g)
    ref = jax.jit(jax.value_and_grad(forward_fn(g))).lower(params, inputs).compile(FAST)(params, inputs)
    return g, params, inputs, ref


def _mesh(K: int, D: int, layout: str | None = None) -> dict[str, int]:
    return {"stage": K, **({"data": D} if D > 1 else {}), **({"model": 2} if layout else {})}


@functools.cache
def _compiled(layers: int, K: int, D: int, M: int, V: int, remat: str, counts: tuple[int, ...] | None = None,
              layout: str | None = None):
    g, params, inputs, _ = _model(layers)
    pipe = Pipeline(g, _mesh(K, D, layout), microbatches=M, remat=remat, schedule=f"interleaved:{V}",
                    layers_per_stage=counts, layout=layout)
    return pipe, pipe.compile(params, inputs, FAST)


def _assert_equal_to_reference(layers, loss, grads):
    _, _, _, (ref_loss, ref_grads) = _model(layers)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
    assert set(grads) == set(ref_grads)
    for name, ref in ref_grads.items():
        np.testing.assert_allclose(grads[name], ref, rtol=2e-5, atol=2e-6 * max(1.0, float(np.max(np.abs(ref)))),
                                   err_msg=name)


# (layers, K, D, M, V, remat, layers per chunk in virtual-stage order, layout): K = 2 and 4 with V = 2, with and
# without a data axis, remat none / full / selective, uneven chunks (a chunk without layers first or last), and a
# tensor-parallel layout inside the chunks.
CASES = [
    (4, 2, 1, 2, 2, "none", None, None),
    (4, 2, 2, 4, 2, "full", (0, 2, 1, 1), None),
    (8, 4, 2, 4, 2, "full", None, None),
    (8, 4, 1, 4, 2, "none", (2, 1, 1, 1, 1, 1, 1, 0), None),
    (4, 2, 2, 2, 2, "selective", None, MEGATRON),
]
IDS = ["K2-M2-none", "K2-D2-M4-full-0+2+1+1", "K4-D2-M4-full", "K4-M4-none-2+1+1+1+1+1+1+0",
       "K2-D2-M2-selective-megatron"]


@pytest.mark.parametrize(("K", "V", "M"), [(1, 2, 2), (2, 2, 2), (2, 3, 4), (3, 2, 6), (4, 2, 4), (4, 2, 8),
                                           (4, 4, 8), (8, 2, 8)])
def test_the_tick_table_is_megatrons_order_with_the_priced_bubble_and_in_flight(K, V, M):
    """Each device runs Megatron-LM's interleaved order of forwards and backwards; as soon as possible that takes
    2(MV + K - 1) ticks, the cost model's (M + (K - 1)/V) loop steps of 2V ticks; device 0 stashes V K + K - 1
    chunks (one V-th of its activations each), schedule.py's in_flight(0) micro-batches' worth (at most M), and no device
    stashes more (the SPMD program gives every device device 0's stash)."""
    plan = tick_tables.interleaved(K, V, M)
    sched = Schedule("interleaved", V)
    assert plan.ticks == 2 * V * sched.steps(K, M) == 2 * (M * V + K - 1)
    for k in range(K):
        assert [row[k] for row in plan.ops if row[k]] == tick_tables.megatron_order(k, K, V, M)
        assert plan.in_flight[k] == min(2 * (K - k - 1) + (V - 1) * K + 1, M * V)  # Megatron's warm-up + 1
    assert plan.stash_slots == max(plan.in_flight) == plan.in_flight[0]
    if M >= K:  # device 0's stash is what schedule.py prices (with M = K the warm-up runs every forward: all M)
        assert plan.stash_slots / V == pytest.approx(sched.in_flight(0, K, M))
    assert len(plan.channels) == 1 and len(plan.channels[0]) == (2 if K > 2 else 1)  # ring shifts; K = 2: a swap


def test_the_1f1b_table_is_pipedream_flush():
    plan = tick_tables.one_f_one_b(4, 8)
    assert plan.ticks == 2 * (8 + 4 - 1) and plan.in_flight == (4, 3, 2, 1)  # min(M, K - k)
    assert plan.act_slots == plan.grad_slots == 1  # what arrives is used at the next tick


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_interleaved_loss_and_grads_equal_the_unpipelined_step(case):
    """The interleaved step (backward written out) and its loss alone (the forwards as a circular pipeline)
    compute the unpipelined loss and gradients."""
    layers = case[0]
    _, params, inputs, _ = _model(layers)
    pipe, compiled = _compiled(*case)
    assert (pipe.schedule, pipe.V, len(pipe.counts)) == ("interleaved:2", 2, case[1] * 2)
    loss, grads = pipe.loss_and_grads(params, inputs, compiled)
    _assert_equal_to_reference(layers, loss, grads)
    np.testing.assert_allclose(jax.jit(pipe.sharded_loss)(*pipe.place(params, inputs)), _model(layers)[3][0],
                               rtol=2e-6)


def _groups(counts: tuple[int, ...]) -> list[list[str]]:
    """The cost model's units of each virtual stage: its layers, ``pre`` on the first, ``post`` on the last."""
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    groups = [[f"layer.{i}" for i in range(f, f + n)] for f, n in zip(first, counts, strict=True)]
    groups[0].insert(0, "pre")
    groups[-1].append("post")
    return groups


@pytest.mark.parametrize("case", [c for c in CASES if c[7] is None], ids=[i for c, i in zip(CASES, IDS, strict=True)
                                                                          if c[7] is None])
def test_interleaved_compiled_collectives_match_the_formulas_and_the_pipeline_cost_model(case):
    """See the module docstring; the cost model's permutes of every stage (device) equal the compiled ones
    (``costmodel.pipeline._permutes``), and its layer-gradient all-reduces over data add up to the layers'."""
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    layers, K, D, M, V, remat, counts, _ = case
    g, *_ = _model(layers)
    pipe, compiled = _compiled(*case)
    act = pipe.parts.layer.tensors[IN]
    b = 16 // (D * M) * math.prod(d.size for d in act.dims if d.name != "batch") * act.itemsize
    ticks = 2 * (M * V + K - 1)
    summary = hlo.summarize(compiled, pipe.mesh)
    permutes = [(c.axes, c.bytes, c.count) for c in summary.collectives if c.kind == "collective-permute"]
    assert permutes == [(("stage",), b, ticks)] * (1 if K == 2 else 2)
    assert all(c.kind in ("collective-permute", "all-reduce") for c in summary.collectives)
    assert all(c.count == 1 for c in summary.collectives if c.kind == "all-reduce")
    layer = sum(t.nbytes for t in g.parameters if t.name.startswith("layer.0/"))
    P_o = sum(t.nbytes for t in g.parameters if not t.name.startswith("layer."))
    reduces = {axes: n for (kind, axes), n in summary.bytes_by().items() if kind == "all-reduce"}
    assert reduces == ({("stage", "data"): P_o + 4, ("data",): V * pipe.slots * layer} if D > 1
                       else {("stage",): P_o + 4})

    counts = pipe.counts
    mesh = f"stage:{K},data:{D}" if D > 1 else f"stage:{K}"
    rep = estimate_pipeline(g, Layout.from_rules(mesh, "batch:data" if D > 1 else ""), "cpu-sim",
                            stage_axis="stage", microbatches=M, stages=_groups(tuple(counts)), precision="fp32",
                            schedule=f"interleaved:{V}", remat=remat)
    assert rep.layers_per_stage() == tuple(counts)
    # Known deviation, listed rather than hidden: the cost model books the inputs entering a unit as part of
    # what the stage before it sends (pipeline_units' ``boundary``), so a last chunk holding the post ops alone
    # is booked as receiving the labels too (B/(D M) x seq int32) from the device before, and as sending their
    # gradient back; the executor reads the labels where it runs the post ops.
    labels = 16 // (D * M) * g.tensors["labels"].dims[-1].size * 4 if counts[-1] == 0 else 0
    for k, stage in enumerate(rep.stages):
        extra = labels if k in ((K * V - 2) % K, K - 1) else 0
        assert [(a, by, n) for kind, a, by, n in stage.collectives if kind == "collective-permute"] == \
            [(a, by + extra, n) for a, by, n in permutes]
    if D > 1:  # (the executor all-reduces the outer gradients over stage x data: see test_pipeline_exec.py)
        sync = sum(by for s in rep.stages for kind, axes, by, n in s.collectives
                   if kind == "all-reduce" and axes == ("data",) and n == 1)
        outer = sum(t.nbytes for part in (pipe.parts.pre, pipe.parts.post) for t in part.parameters)
        assert sync - outer == layers * layer


def test_the_cost_models_chunks_are_what_the_executor_runs():
    """``layers_per_stage`` of an interleaved report: the layers of each chunk in virtual-stage order (chunk c
    of device k is virtual stage cK + k), a chunk with the embedding alone counting none."""
    from layoutsearch.solvers.pipeline_search import estimate_pipeline

    g, *_ = _model(4)
    groups = _groups((0, 2, 1, 1))
    rep = estimate_pipeline(g, Layout.from_rules("stage:2", ""), "cpu-sim", stage_axis="stage", microbatches=2,
                            stages=groups, schedule="interleaved:2", precision="fp32")
    assert [s.chunks for s in rep.stages] == [(("pre",), ("layer.2",)), (("layer.0", "layer.1"), ("layer.3", "post"))]
    assert rep.layers_per_stage() == (0, 2, 1, 1)
    pipe = Pipeline(g, {"stage": 2}, microbatches=2, schedule="interleaved:2", layers_per_stage=(0, 2, 1, 1))
    stacked, outer = pipe.stack(_model(4)[1])
    assert stacked["wq"].shape[:2] == (2, 2 * 2)  # [K, V slots]: device 0 = chunk 0 (padding), layer 2 (+ pad)
    np.testing.assert_array_equal(stacked["wq"][0, 2], _model(4)[1]["layer.2/wq"])
    np.testing.assert_array_equal(stacked["wq"][1, 3], _model(4)[1]["layer.3/wq"])
    assert pipe.unstack(stacked, outer).keys() == _model(4)[1].keys()


@pytest.mark.parametrize(("kw", "error", "match"), [
    ({"microbatches": 3}, LayoutError, "multiple of the stages"),
    ({"microbatches": 2, "layers_per_stage": (2, 2)}, GraphError, "4 chunks"),
    ({"microbatches": 2, "layers_per_stage": (1, 1, 1, 2)}, GraphError, "sum to the 4 layers"),
])
def test_interleaved_requests_the_executor_cannot_run_fail_clearly(kw, error, match):
    with pytest.raises(error, match=match):
        Pipeline(zoo.build("gpt", layers=4, d_model=32, batch=12, seq=8), {"stage": 2}, schedule="interleaved:2",
                 **kw)


def test_a_searched_interleaved_plan_trains(tmp_path, capsys):
    """``ls.search(..., pipeline=2, schedule="interleaved:2")`` on a 4-layer gpt: the program runs the plan's
    chunks with the interleaved schedule, its first step's loss and gradients are the unpipelined step's, it
    trains 2 steps (the same losses through ``layoutsearch run PLAN.json``)."""
    from clirun import run_json

    import layoutsearch as ls

    g = zoo.build("gpt", layers=4, d_model=32, heads=4, seq=8, batch=16, vocab=128)
    plan = ls.search(g, "stage:2,data:4", hardware="cpu-sim", pipeline=2, schedule="interleaved:2", precision="fp32",
                     remat="none", microbatches=4)
    assert (plan.chosen.stage_axis, plan.chosen.schedule) == ("stage", "interleaved:2")
    counts = plan.layers_per_stage
    assert len(counts) == 4 and sum(counts) == 4
    program = plan.compile()
    assert program.pipeline.schedule == "interleaved:2" and tuple(program.pipeline.counts) == counts
    losses = first_step_equals_unpipelined(program, g, 2)
    assert all(np.isfinite(losses))
    path = tmp_path / "plan.json"
    plan.save(path)
    out = run_json(capsys, "run", path, "--steps", "2", "--seed", "0")
    assert [s["loss"] for s in out["steps"]] == losses
    assert out["executed_schedule"] == "interleaved:2"
