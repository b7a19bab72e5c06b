"""Kernel launches: the GPU's compute stream idles between kernels, one ``Hardware.kernel_latency`` per kernel of
the fusion plan (``costmodel/fusion.py``, "Kernels"); a TPU runs its compiled program without a launch per
kernel."""

from __future__ import annotations

import pytest

from layoutsearch import Layout, estimate, hardware, zoo
from layoutsearch.costmodel.explain import explain
from layoutsearch.costmodel.fusion import fusion_plan
from layoutsearch.costmodel.step import training_step
from layoutsearch.figure_sources import ASSUMPTION, figure_sources
from layoutsearch.ir import GraphBuilder
from layoutsearch.ir.graph import Graph
from layoutsearch.ir import ops as O
from layoutsearch.mesh import PRESETS
from layoutsearch.solvers.pipeline_search import estimate_pipeline

GPT = zoo.build("gpt", layers=2, batch=8, seq=64, d_model=128, heads=4, vocab=256)
DATA = Layout.from_rules("data:2", "batch:data")


def _mlp() -> Graph:
    """x · w1 -> gelu -> (+ bias) -> · w2 -> mean: two matmuls around one fusible chain."""
    b = GraphBuilder("chain")
    batch, d, f = b.dim("batch", 8), b.dim("d", 16), b.dim("f", 32)
    x = b.input("x", [batch, d])
    h = b.einsum([x, b.parameter("w1", [d, f])], [batch, f], name="h")
    a = b.binary("add", b.unary("gelu", h, name="a0"), b.parameter("bias", [f]), name="a")
    y = b.einsum([a, b.parameter("w2", [f, d])], [batch, d], name="y")
    return b.build(b.reduce(y, [], fn="mean", name="loss"))


def test_a_fusion_group_is_one_kernel_a_matmul_one_and_without_fusion_every_op_one():
    g = _mlp()
    fused, plain = fusion_plan(g, True), fusion_plan(g, False)
    assert plain.kernels == {op.name for op in g.ops}
    assert {"h", "y"} <= fused.kernels and "a0" in fused.kernels and "a" not in fused.kernels  # gelu + add: one
    # reshapes are bitcasts
    t = training_step(GPT)
    plan = fusion_plan(t, True, "flash")
    assert not any(isinstance(op, O.Reshape) and op.name in plan.kernels for op in t.ops)
    assert len(plan.kernels) < len(fusion_plan(t, False).kernels) == len(t.ops)


def test_a_flash_attention_core_is_one_kernel_each_way_and_its_recomputation_launches_nothing():
    t = training_step(GPT)
    flash, std = fusion_plan(t, True, "flash"), fusion_plan(t, True, "standard")
    core = flash.flash[0]
    forward = [op.name for op in t.ops if op.phase == "forward" and core.keeps(op.output)] + [core.context]
    assert sum(n in flash.kernels for n in forward) == 1 < sum(n in std.kernels for n in forward)
    rep = estimate(GPT, DATA, "h100", attention="flash")
    assert all(o.kernels == 0 for o in rep.ops if o.phase == "recompute")
    full = estimate(GPT, DATA, "h100", attention="flash", remat="full")  # remat's recomputation launches again
    assert full.kernels > rep.kernels


def test_the_step_pays_count_times_the_latency_on_gpus_and_nothing_on_tpus():
    h100 = estimate(GPT, DATA, "h100", overlap=0.0)
    t = training_step(GPT)
    assert h100.kernels == sum(o.kernels for o in h100.ops) >= len(fusion_plan(t, True, "flash").kernels)
    assert h100.launch_s == pytest.approx(h100.kernels * PRESETS["h100"].kernel_latency)
    free = estimate(GPT, DATA, hardware("h100", kernel_latency=0.0), overlap=0.0)
    assert h100.step_s == pytest.approx(free.step_s + h100.launch_s)
    assert h100.compute_s == free.compute_s and h100.comm_exposed_s == pytest.approx(free.comm_exposed_s)
    # on the compute stream: with overlap, the launches also hide gradient reductions behind them
    auto, auto_free = estimate(GPT, DATA, "h100"), estimate(GPT, DATA, hardware("h100", kernel_latency=0.0))
    assert auto_free.step_s < auto.step_s <= auto_free.step_s + auto.launch_s
    assert auto.step_s - auto.compute_s - auto.launch_s == pytest.approx(auto.comm_exposed_s)
    tpu = estimate(GPT, DATA, "tpu-v5p")
    assert tpu.kernels == h100.kernels and tpu.launch_s == 0.0
    assert estimate(GPT, DATA, "cpu-sim").launch_s == 0.0


def test_micro_batches_launch_their_kernels_each():
    one = estimate(GPT, DATA, "h100")
    acc = estimate_pipeline(GPT, DATA, "h100", stage_axis=None, microbatches=2)
    per_mb = acc.inner.launch_s
    optimizer = sum(o.launch_s for o in acc.inner.ops if o.phase == "optimizer")
    assert acc.launch_s == pytest.approx(2 * per_mb - optimizer)
    assert acc.launch_s > one.launch_s


def test_reports_show_the_launches_as_their_own_line_with_a_sourced_figure():
    rep = estimate(GPT, DATA, "h100")
    d = rep.to_dict()
    assert d["kernel_launch_s"] == rep.launch_s and d["kernels"] == rep.kernels > 0
    assert "kernel launches" in str(rep) and f"{rep.kernels} kernels x 900 ns" in str(rep)
    assert any(line.startswith("kernel launches") for line in explain(rep, GPT))
    tpu = explain(estimate(GPT, DATA, "tpu-v4"), GPT)
    assert any("none launched from the host" in line for line in tpu)
    for name in ("v100", "a100", "h100", "h200"):
        assert "CUDA Graphs" in figure_sources(PRESETS[name])["kernel_latency"]
    for name in ("tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p"):
        assert PRESETS[name].kernel_latency == 0.0 and figure_sources(PRESETS[name])["kernel_latency"] != ASSUMPTION
