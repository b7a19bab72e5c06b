"""The pipeline cost model: units, stage partition, schedules (GPipe, 1F1B, interleaved), step time and memory,
and gradient accumulation."""

import pytest

from layoutsearch import zoo
from layoutsearch.costmodel.pipeline import speedup, unit_of_ops
from layoutsearch.costmodel.report import estimate
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import CostModelError, PartitionError
from layoutsearch.layout import Layout
from layoutsearch.mesh import hardware
from layoutsearch.solvers.pipeline_search import estimate_pipeline

GPT = zoo.build("gpt", layers=8, batch=32, seq=64, d_model=256, heads=4, vocab=64, tie_embeddings=0)


def layout(k: int) -> Layout:
    return Layout.from_rules(f"stage:{k},data:2", "batch:data")


def test_every_op_gets_a_unit_and_embedding_and_loss_sit_outside_the_blocks():
    g = training_step(GPT)
    unit = unit_of_ops(g)
    assert set(unit) == {op.name for op in g.ops}
    assert set(unit.values()) == {"pre", "post"} | {f"layer.{i}" for i in range(8)}
    kinds = {u: {g.op(n).kind for n, v in unit.items() if v == u} for u in ("pre", "post")}
    assert "gather" in kinds["pre"] and "scatter_add" in kinds["pre"]
    assert "cross_entropy" in kinds["post"] and "cross_entropy_grad" in kinds["post"]


def test_one_stage_one_microbatch_is_the_unpipelined_step():
    r = estimate_pipeline(GPT, layout(1), "h100", stage_axis="stage", microbatches=1)
    plain = estimate(GPT, Layout.from_rules("data:2", "batch:data"), "h100")
    assert r.step_s == pytest.approx(plain.step_s, rel=1e-9)


@pytest.mark.parametrize("k, m", [(2, 2), (2, 8), (4, 4), (4, 8)])
def test_identical_layers_follow_the_gpipe_speedup(k, m):
    """Against one stage running the same M micro-batches, K stages of
    identical layers speed the micro-batch loop up by K*M/(M+K-1). Links are
    made free (no latency, 1 PB/s) so only the schedule shows; the embedding
    and head ride on the first and last stage: under 3% of a layer here,
    hence a 3% tolerance."""
    big = zoo.build("gpt", layers=8, batch=64, seq=256, d_model=1024, heads=8, vocab=64)
    hw = hardware("h100", fast_link_latency=0, fast_link_bandwidth=1e15)
    one = estimate_pipeline(big, layout(1), hw, stage_axis="stage", microbatches=m)
    many = estimate_pipeline(big, layout(k), hw, stage_axis="stage", microbatches=m)
    assert one.pipeline_s / many.pipeline_s == pytest.approx(speedup(k, m), rel=0.03)
    assert many.bubble_fraction == pytest.approx((k - 1) / (m + k - 1))
    assert [len(s.units) - ("pre" in s.units) - ("post" in s.units) for s in many.stages] == [8 // k] * k


def test_step_time_is_the_gpipe_formula_plus_once_per_step_work():
    r = estimate_pipeline(GPT, layout(4), "h100", stage_axis="stage", microbatches=8)
    loop = (8 + 4 - 1) * max(s.microbatch_s for s in r.stages)
    assert r.pipeline_s == pytest.approx(loop)
    assert r.step_s == pytest.approx(loop + max(s.once_s for s in r.stages))  # embeddings untied: no stage sync
    assert all(s.transfer_s > 0 for s in r.stages)


def test_tied_embeddings_on_first_and_last_stage_add_a_gradient_all_reduce():
    tied = zoo.build("gpt", layers=4, batch=32, seq=64, d_model=256, heads=4, vocab=64, tie_embeddings=1)
    r = estimate_pipeline(tied, layout(2), "h100", stage_axis="stage", microbatches=4)
    assert r.step_s > r.pipeline_s + max(s.once_s for s in r.stages)


def test_microbatching_keeps_activations_and_remat_trades_them_for_time():
    """GPipe keeps the activations of all M micro-batches of batch/M until the
    backward pass: as much as the whole batch, whatever M. With remat only the
    block inputs are kept, plus one block's activations during recomputation,
    so more micro-batches mean less memory."""
    kw = {"stage_axis": "stage", "stages": _even(4), "schedule": "gpipe"}
    a = estimate_pipeline(GPT, layout(4), "h100", microbatches=2, **kw)
    b = estimate_pipeline(GPT, layout(4), "h100", microbatches=8, **kw)
    ra = estimate_pipeline(GPT, layout(4), "h100", microbatches=2, remat="full", **kw)
    rb = estimate_pipeline(GPT, layout(4), "h100", microbatches=8, remat="full", **kw)
    assert b.stages[1].activation_bytes == a.stages[1].activation_bytes
    assert rb.memory_bytes < ra.memory_bytes < a.memory_bytes
    assert ra.stages[1].microbatch_s > a.stages[1].microbatch_s  # recomputation costs time
    assert a.stages[1].static_bytes == b.stages[1].static_bytes


def _even(k):
    layers = [f"layer.{i}" for i in range(8)]
    per = len(layers) // k
    groups = [layers[i * per:(i + 1) * per] for i in range(k)]
    groups[0].insert(0, "pre")
    groups[-1].append("post")
    return groups


def test_memory_limit_is_respected_and_impossible_limits_are_named():
    free = estimate_pipeline(GPT, layout(4), "h100", stage_axis="stage", microbatches=4)
    fit = estimate_pipeline(GPT, layout(4), "h100", stage_axis="stage", microbatches=4,
                            memory_limit=free.memory_bytes)
    assert fit.memory_bytes <= free.memory_bytes
    with pytest.raises(PartitionError, match="smallest achievable largest-stage memory"):
        estimate_pipeline(GPT, layout(4), "h100", stage_axis="stage", microbatches=4, memory_limit=1e5)


def test_bad_pipeline_requests_get_clear_errors():
    with pytest.raises(CostModelError, match="do not divide batch=32"):
        estimate_pipeline(GPT, layout(2), "h100", stage_axis="stage", microbatches=3)
    with pytest.raises(CostModelError, match="into 16 stages"):
        estimate_pipeline(GPT, Layout.from_rules("stage:16", ""), "h100", stage_axis="stage", microbatches=1)
    with pytest.raises(CostModelError, match=r"splits over the stage axis 'stage' \(batch:stage\)"):
        estimate_pipeline(GPT, Layout.from_rules("stage:2,data:2", "batch:stage"), "h100", stage_axis="stage",
                          microbatches=2)  # (the rule was dropped: a replicated stage priced)
    ffn = zoo.build("mtf-ffn")
    with pytest.raises(CostModelError, match="no repeated blocks"):
        estimate_pipeline(ffn, Layout.from_rules("stage:2", ""), "h100", stage_axis="stage", microbatches=2)


def test_per_tensor_entries_apply_inside_the_stages():
    """A layout's per-tensor entries lay out those tensors inside each stage (they were dropped)."""
    wi = GPT.tensors["layer.0/wi"]
    base = Layout.from_rules("stage:2,data:2", "batch:data")
    split = Layout(base.mesh, base.rules, (("layer.0/wi", (("d_ff", ("data",)),)),))
    plain, per_tensor = (estimate_pipeline(GPT, lay, "h100", stage_axis="stage", microbatches=2)
                         for lay in (base, split))
    assert split.local_bytes(wi) * 2 == base.local_bytes(wi)
    assert per_tensor.stages[0].memory["parameters"] < plain.stages[0].memory["parameters"]


def test_costdag_command_writes_a_dag_the_partitioner_reads(tmp_path, capsys):
    import json

    from layoutsearch import cli
    from layoutsearch.costdag import load_costdag

    out = tmp_path / "gpt.dag.json"
    code = cli.main(["costdag", "gpt", "--set", "layers=4", "--mesh", "data:2", "--layout", "batch:data",
                     "--microbatches", "2", "--hardware", "h100", "--out", str(out), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == ["pre", "layer.0", "layer.1", "layer.2", "layer.3", "post"]
    assert len(load_costdag(out).edges) == 5
    code = cli.main(["partition", str(out), "--stages", "2", "--objective", "gpipe", "--microbatches", "2", "--json"])
    assert code == 0 and len(json.loads(capsys.readouterr().out)["stages"]) == 2


def test_step_compute_counts_the_optimizer_once_and_each_stage_its_own_ops():
    """A micro-batched step's compute per device was the whole micro-batch step's (every stage's ops, the
    optimizer) times M: above the step itself for gradient accumulation, K times a stage's for pipelines."""
    M = 4
    acc = estimate_pipeline(GPT, Layout.from_rules("data:2", "batch:data"), "h100", stage_axis=None, microbatches=M)
    optimizer = sum(o.compute_s for o in acc.inner.ops if o.phase == "optimizer")
    assert optimizer > 0
    assert acc.compute_s == pytest.approx(M * acc.inner.compute_s - (M - 1) * optimizer, rel=1e-9)
    assert acc.compute_s <= acc.step_s * (1 + 1e-9)
    pipe = estimate_pipeline(GPT, layout(4), "h100", stage_axis="stage", microbatches=8)
    assert pipe.compute_s < 8 * pipe.inner.compute_s / 2  # a stage runs about a quarter of the ops
    assert pipe.compute_s <= pipe.step_s and 0 < pipe.mfu < 1
    d = pipe.to_dict()
    assert d["mfu"] == pipe.mfu and d["compute_s"] == pipe.compute_s and d["comm_s"] == pipe.comm_s
