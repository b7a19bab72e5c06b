"""The cost model's picture of real accelerators: precision policies, fusion and flash attention, overlap,
FSDP re-gathering, pipeline schedules and gradient accumulation, shape-dependent matmul efficiency, the
conventional layout, and the CLI around them (bad input included)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from clirun import run, run_json

from layoutsearch import Layout, estimate, hardware, zoo
from layoutsearch.costmodel.compute import matmul_efficiency
from layoutsearch.costmodel.fusion import attention_cores, fusion_plan
from layoutsearch.costmodel.overlap import classify, collective_classes, schedule
from layoutsearch.costmodel.pipeline import Schedule
from layoutsearch.costmodel.step import training_step
from layoutsearch.errors import CostModelError, GraphError, LayoutSearchError
from layoutsearch.ir.precision import PRECISIONS, with_precision
from layoutsearch.layout import conventional_rules
from layoutsearch.mesh import Mesh
from layoutsearch.solvers.pipeline_search import estimate_pipeline

GPT = zoo.build("gpt", layers=4, batch=16, seq=128, d_model=256, heads=4, vocab=256)
TP = Layout.from_rules("data:2,model:4", "batch:data,heads:model,d_ff:model,vocab:model")
FSDP = Layout.from_rules("data:8", "batch:data,d_model:data")


# -- precision ------------------------------------------------------------------------------------------------------

def test_policies_type_every_float_tensor():
    for name, p in PRECISIONS.items():
        g = training_step(GPT, "adam", name)
        emb = g.tensors["embed"]
        assert emb.dtype == p.params and g.tensors["layer.0/ff_in"].dtype == p.compute
        assert g.tensors["loss"].dtype == "float32" and g.tensors["xent"].dtype == "float32"
        assert g.tensors["ids"].dtype == "int32"
        assert g.tensors["adam_m/embed"].dtype == p.optimizer_state
        assert g.tensors["grad/embed"].dtype == (p.grads or p.params)
        assert ("master/embed" in g.tensors) == (p.master is not None)
    with pytest.raises(GraphError, match="unknown precision 'fp8'"):
        with_precision(GPT, "fp8")


def test_mixed_precision_keeps_16_bytes_per_parameter_and_moves_bf16_gradients():
    params = sum(t.num_elements for t in GPT.parameters)
    mixed = estimate(GPT, FSDP, "h100", precision="mixed")
    fp32 = estimate(GPT, FSDP, "h100", precision="fp32")
    megatron = estimate(GPT, FSDP, "h100", precision="mixed-fp32-grads")
    res = mixed.memory.resident
    # (per parameter 2 + 4 + 4 + 4 bytes, an eighth of each; the few biases FSDP cannot split over d_model add 2%)
    assert res["parameters"] + res["optimizer_state"] == pytest.approx(14 * params / 8, rel=0.03)
    assert fp32.memory.resident["parameters"] + fp32.memory.resident["optimizer_state"] == pytest.approx(
        12 * params / 8, rel=0.03)
    # gradient reduce-scatters in bf16 (mixed), float32 (fp32 and Megatron's fp32 gradients)
    rs = {name: r.bytes_by_kind()["reduce-scatter"] for name, r in (("mixed", mixed), ("fp32", fp32),
                                                                    ("megatron", megatron))}
    assert rs["fp32"] == pytest.approx(2 * rs["mixed"], rel=0.05) and rs["megatron"] > 1.9 * rs["mixed"]
    # matmul peak follows the dtype: fp32 matmuls run at the TF32 rate on H100
    assert fp32.compute_s > 1.5 * mixed.compute_s


def test_cpu_backend_runs_bf16_collectives_in_float32():
    mixed_cpu = estimate(GPT, TP, "cpu-sim", precision="mixed").bytes_by_kind()
    fp32_cpu = estimate(GPT, TP, "cpu-sim", precision="fp32").bytes_by_kind()
    assert mixed_cpu["all-reduce"] == pytest.approx(fp32_cpu["all-reduce"], rel=1e-3)  # XLA:CPU: f32 collectives
    assert estimate(GPT, TP, "h100", precision="mixed", overlap=0.0).bytes_by_kind()["all-reduce"] < \
        fp32_cpu["all-reduce"]


# -- fusion and flash attention ---------------------------------------------------------------------------------------

def test_fusion_keeps_elementwise_chains_on_chip_and_cuts_traffic():
    g = training_step(GPT)
    fused = fusion_plan(g, True)
    plain = fusion_plan(g, False)
    assert not plain.on_chip and fused.on_chip
    # a tensor read by the backward pass or by a matmul is written to HBM; elementwise intermediates are not
    assert "layer.0/ff_in" not in fused.on_chip and "layer.0/ln_attn_scaled" in fused.on_chip
    gpu = estimate(GPT, TP, "h100", attention="standard", overlap=0.0)
    unfused = estimate(GPT, TP, hardware("h100", fusion=False), attention="standard", overlap=0.0)
    traffic = lambda r: sum(o.hbm_bytes for o in r.ops)  # noqa: E731
    assert traffic(gpu) < 0.8 * traffic(unfused)
    assert gpu.memory_bytes < unfused.memory_bytes
    assert gpu.flops_per_device == unfused.flops_per_device  # fusion moves bytes, not FLOPs


def test_flash_attention_keeps_the_scores_off_hbm_and_recomputes_them():
    g = training_step(GPT)
    cores = attention_cores(g)
    assert len(cores) == 4 and all("/attn_probs" in " ".join(c.scores) for c in cores)
    assert cores[0].recompute == ("layer.0/attn_logits", "layer.0/attn_probs")
    std = estimate(GPT, TP, "h100", attention="standard", overlap=0.0)
    flash = estimate(GPT, TP, "h100", attention="flash", overlap=0.0)
    assert flash.memory_bytes < std.memory_bytes
    redo = [o for o in flash.ops if o.phase == "recompute"]
    assert {o.op.split("/")[1] for o in redo} == {"attn_logits", "attn_probs"} and len(redo) == 8
    assert flash.flops_per_device > std.flops_per_device
    assert estimate(GPT, TP, "h100").attention == "flash" and estimate(GPT, TP, "cpu-sim").attention == "standard"
    with pytest.raises(CostModelError, match="unknown attention 'paged'"):
        estimate(GPT, TP, "h100", attention="paged")


def test_flash_attention_keeps_attention_dropout_on_chip_and_regenerates_its_mask():
    """With attention dropout the probabilities reach ``probs · v`` through ``mul(probs, mask)``: the mask and
    the dropped probabilities are scores too (FlashAttention fuses the dropout and draws the mask again in its
    backward pass), and no ``[batch, heads, seq, kv_seq]`` tensor takes memory; the hidden dropout's masks are
    ordinary activations."""
    drop = zoo.build("gpt", layers=4, batch=16, seq=128, d_model=256, heads=4, vocab=256, dropout=0.1)
    g = training_step(drop)
    cores = attention_cores(g)
    assert len(cores) == 4
    base = {c.block: c for c in attention_cores(training_step(GPT))}
    for c in cores:
        p = c.block + "/"
        assert c.recompute == tuple(p + n for n in ("attn_logits", "attn_probs", "attn_probs_dropout_mask",
                                                    "attn_probs_masked", "attn_probs_dropped"))
        assert c.scores == base[c.block].scores | {p + "attn_probs_dropout_mask", p + "attn_probs_masked",
                                                   p + "attn_probs_dropped", f"grad/{p}attn_probs_masked",
                                                   f"grad/{p}attn_probs_dropped"}
        assert p + "attn_out_dropout_mask" not in c.scores and p + "ff_out_dropout_mask" not in c.scores
    scores = {"batch", "heads", "seq", "kv_seq"}
    square = {n for n, t in g.tensors.items() if set(t.dim_names) == scores}
    assert len(square) == 4 * 9  # logits, probs, mask, masked and dropped probs, the gradients of all but the mask
    assert square <= fusion_plan(g, True, "flash").on_chip
    assert not square <= fusion_plan(g, True, "standard").on_chip     # standard attention saves mask and probs
    flash = estimate(drop, TP, "h100", attention="flash", overlap=0.0)
    std = estimate(drop, TP, "h100", attention="standard", overlap=0.0)
    plain = {a: estimate(GPT, TP, "h100", attention=a, overlap=0.0) for a in ("flash", "standard")}
    # what dropout adds with flash attention: the hidden dropout's [batch, seq, d_model] masks and outputs only
    hidden = 16 * 128 * 256 * 2 // 2                                   # one bf16 [batch, seq, d_model] per data shard
    assert flash.memory_bytes - plain["flash"].memory_bytes <= 2 * 4 * hidden
    assert std.memory_bytes - plain["standard"].memory_bytes > flash.memory_bytes - plain["flash"].memory_bytes
    redo = [o.op.split("/")[1] for o in flash.ops if o.phase == "recompute"]
    assert redo.count("attn_probs_dropout_mask") == 4 and redo.count("attn_probs_dropped") == 4
    assert all(o.hbm_bytes == 0 for o in flash.ops if o.kind != "einsum" and o.op in {
        op.name for op in g.ops if set(g.tensors[op.output].dim_names) == scores})
    # without dropout nothing changes (the test above); the existing cores are found in both graphs
    assert {c.block for c in cores} == set(base)


# -- overlap --------------------------------------------------------------------------------------------------------

def test_overlap_classes_follow_the_collective():
    g = training_step(GPT)
    rep = estimate(g, FSDP, "h100", overlap=0.0)
    classes = collective_classes(g)
    kinds = {classify(c, classes) for c in rep.collectives}
    assert kinds == {"weight", "gradient", "critical"}
    gathers = [c for c in rep.collectives if c.kind == "all-gather" and c.tensor.endswith("/wi")]
    assert gathers and all(classify(c, classes) == "weight" for c in gathers)
    assert all(classify(c, classes) == "gradient" for c in rep.collectives if c.kind == "reduce-scatter")


def test_fsdp_communication_hides_behind_compute_where_collectives_are_asynchronous():
    big = zoo.build("gpt", layers=4, batch=64, seq=512, d_model=1024, heads=8, vocab=512)
    auto = estimate(big, FSDP, "h100")
    flat = estimate(big, FSDP, "h100", overlap=0.0)
    assert auto.step_s < flat.step_s and auto.comm_hidden_s > 0.3 * auto.comm_s
    assert auto.step_s == pytest.approx(auto.compute_s + auto.launch_s + auto.comm_exposed_s)
    assert auto.exposure.by_class["weight"]["exposed_s"] < auto.exposure.by_class["weight"]["seconds"]
    cpu = estimate(big, FSDP, "cpu-sim")
    assert cpu.step_s == pytest.approx(cpu.compute_s + cpu.comm_s)  # XLA:CPU: collectives in line


@dataclass(frozen=True)
class _Coll:
    kind: str
    axes: tuple[str, ...]
    seconds: float
    tensor: str


@dataclass(frozen=True)
class _Op:
    phase: str
    block: str | None
    compute_s: float
    collectives: tuple[_Coll, ...] = ()
    matmul: bool = True
    output: str = "y"
    launch_s: float = 0.0


def test_a_blocks_weights_are_prefetched_one_block_ahead_even_with_recomputation_inside_its_backward_pass():
    """Selective remat and flash attention run forward ops again between a block's backward ops: the block's
    backward pass is still one prefetch unit, its gathers issued when the previous block's backward pass
    starts (not when the last recomputed op before them does)."""
    gather = lambda w: (_Coll("all-gather", ("data",), 1.0, w),)  # noqa: E731
    ops = [_Op("backward", "layer.1", 2.0),  # layer.1's backward pass: 3 s of compute
           _Op("recompute", "layer.1", 0.5),
           _Op("backward", "layer.1", 0.5),
           _Op("recompute", "layer.0", 0.1),  # layer.0's: its gathers go out at layer.1's start
           _Op("backward", "layer.0", 1.0, gather("w0")),
           _Op("recompute", "layer.0", 0.1),
           _Op("backward", "layer.0", 1.0, gather("v0"))]
    run = schedule(ops, {"w0": "weight", "v0": "weight"})
    assert run.step_s == pytest.approx(5.2) and run.by_class["weight"]["exposed_s"] == 0.0


def test_tensor_parallel_collectives_are_critical_on_gpu_and_decomposed_on_tpu():
    big = zoo.build("gpt", layers=2, batch=8, seq=2048, d_model=4096, heads=32, vocab=1024)
    sp = Layout.from_rules("model:8", "heads:model,d_ff:model,vocab:model,seq:model")
    gpu = estimate(big, sp, "h100")
    tpu = estimate(big, sp, "tpu-v5p")
    assert gpu.exposure.by_class["critical"]["exposed_s"] >= gpu.exposure.by_class["critical"]["seconds"] > 0
    assert tpu.exposure.by_class["decomposed"]["seconds"] > 0
    assert tpu.exposure.by_class["decomposed"]["exposed_s"] < tpu.exposure.by_class["decomposed"]["seconds"]


def test_fsdp_weights_are_gathered_again_for_the_backward_pass_on_gpu_but_not_on_cpu():
    gpu = estimate(GPT, FSDP, "h100", overlap=0.0)
    cpu = estimate(GPT, FSDP, hardware("h100", regather_weights=False), overlap=0.0)
    ag = lambda r: r.bytes_by_kind()["all-gather"]  # noqa: E731
    assert ag(gpu) > 1.5 * ag(cpu)
    assert gpu.memory.breakdown["transient"] <= cpu.memory.breakdown["transient"]


# -- matmul efficiency ------------------------------------------------------------------------------------------------

def test_matmul_efficiency_falls_for_shapes_that_waste_tiles():
    hw = hardware("a100")
    assert matmul_efficiency(hw, (1, 8192, 8192, 8192)) == pytest.approx(hw.matmul_efficiency, rel=0.01)
    full = matmul_efficiency(hw, (1, 8192, 8192, 8192))
    assert matmul_efficiency(hw, (1, 8192, 8193, 8192)) < full  # n pads to 8320
    assert matmul_efficiency(hw, (1, 8192, 129, 8192)) < 0.55 * full  # n pads to 256
    assert matmul_efficiency(hw, (1, 128, 128, 8192)) == pytest.approx(hw.matmul_efficiency / 108)  # 1 of 108 SMs
    assert matmul_efficiency(hardware("cpu-sim"), (1, 3, 5, 7)) == 1.0
    assert matmul_efficiency(hw, None) == hw.matmul_efficiency


# -- pipelines and gradient accumulation ------------------------------------------------------------------------------

PIPE = Layout.from_rules("stage:4,data:2", "batch:data")


def test_schedules_parse_and_follow_their_laws():
    assert str(Schedule.parse("interleaved:2")) == "interleaved:2" and Schedule.parse("1F1B").kind == "1f1b"
    for bad in ("interleaved:0", "interleaved", "zigzag", "gpipe:2"):
        with pytest.raises(CostModelError):
            Schedule.parse(bad)
    g, one, il = Schedule("gpipe"), Schedule("1f1b"), Schedule("interleaved", 2)
    K, M = 4, 8
    assert g.bubble(K, M) == one.bubble(K, M) == pytest.approx((K - 1) / (M + K - 1))
    assert il.steps(K, M) == pytest.approx(M + (K - 1) / 2)
    assert [one.in_flight(k, K, M) for k in range(K)] == [4, 3, 2, 1] and g.in_flight(3, K, M) == M
    assert il.in_flight(0, K, M) == pytest.approx(4 * (1 + 3 / 8))
    with pytest.raises(CostModelError, match="multiple of the stages"):
        il.check(4, 6)


def test_1f1b_holds_fewer_microbatches_than_gpipe_at_the_same_step_time():
    kw = {"stage_axis": "stage", "microbatches": 8}
    gp = estimate_pipeline(GPT, PIPE, "h100", schedule="gpipe", **kw)
    fb = estimate_pipeline(GPT, PIPE, "h100", schedule="1f1b", **kw)
    il = estimate_pipeline(GPT, PIPE, "h100", schedule="interleaved:1", **kw)
    assert fb.step_s == pytest.approx(gp.step_s) and fb.memory_bytes < gp.memory_bytes
    assert [s.in_flight for s in fb.stages] == [4, 3, 2, 1]
    assert il.bubble_fraction == pytest.approx(fb.bubble_fraction)
    layers8 = zoo.build("gpt", layers=8, batch=16, seq=128, d_model=256, heads=4, vocab=256)
    i2 = estimate_pipeline(layers8, PIPE, "h100", schedule="interleaved:2", **kw)
    assert i2.bubble_fraction == pytest.approx(1.5 / 9.5) and len(i2.stages) == 4
    assert all(len(s.units) >= 2 for s in i2.stages)  # two chunks per device


def test_remat_policies_inside_a_pipeline_trade_memory_for_time():
    kw = {"stage_axis": "stage", "microbatches": 8, "schedule": "gpipe"}
    none, sel, full = (estimate_pipeline(GPT, PIPE, "h100", remat=r, **kw) for r in ("none", "selective", "full"))
    assert full.memory_bytes < sel.memory_bytes < none.memory_bytes
    assert none.stages[1].microbatch_s < full.stages[1].microbatch_s


def test_remat_of_the_first_blocks_lies_between_none_and_full():
    """``full:N`` (Megatron's recompute-num-layers): the first N of the 4 blocks recompute, the others keep
    everything; compute grows and memory falls with N, ``full:4`` is ``full``, and the plan recomputes
    exactly the first N blocks' ops."""
    from layoutsearch.costmodel.memory import remat_plan

    g = training_step(GPT)
    reps = {r: estimate(GPT, TP, "h100", remat=r) for r in ("none", "full:1", "full:2", "full:3", "full:4", "full")}
    steps = [reps[r].compute_s for r in ("none", "full:1", "full:2", "full:3", "full")]
    peaks = [reps[r].memory_bytes for r in ("none", "full:1", "full:2", "full:3", "full")]
    assert steps == sorted(steps) and len(set(steps)) == 5
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]
    assert reps["full:4"].step_s == reps["full"].step_s and reps["full:4"].memory_bytes == reps["full"].memory_bytes
    blocks = {g.op(n).block for n in remat_plan(g, "full:2").recomputed}
    assert blocks == {"layer.0", "layer.1"}
    assert set(remat_plan(g, "full:2").recomputed) < set(remat_plan(g, "full").recomputed)
    for bad, message in (("full:0", "unknown remat policy 'full:0'"), ("full:x", "unknown remat policy"),
                         ("half", "full:N"), ("full:5", "has 4 blocks, not 5")):
        with pytest.raises(CostModelError, match=message):
            estimate(GPT, TP, "h100", remat=bad)
    with pytest.raises(CostModelError, match="a pipeline's stages remat every block alike"):
        estimate_pipeline(GPT, PIPE, "h100", stage_axis="stage", microbatches=4, remat="full:2")
    acc = estimate_pipeline(GPT, TP, "h100", stage_axis=None, microbatches=2, remat="full:2")
    assert acc.remat == "full:2" and acc.step_s > estimate_pipeline(GPT, TP, "h100", stage_axis=None,
                                                                    microbatches=2).step_s


def test_gradient_accumulation_trades_activations_for_steps():
    one = estimate_pipeline(GPT, FSDP, "h100", stage_axis=None, microbatches=1)
    acc = estimate_pipeline(GPT, FSDP, "h100", stage_axis=None, microbatches=2)
    with pytest.raises(CostModelError, match="micro-batches of 4 cannot be split 8 ways"):
        estimate_pipeline(GPT, FSDP, "h100", stage_axis=None, microbatches=4)
    plain = estimate(GPT, FSDP, "h100")
    assert one.step_s == pytest.approx(plain.step_s) and one.memory_bytes == plain.memory_bytes
    assert acc.stages[0].memory["activations"] < one.stages[0].memory["activations"]
    assert acc.step_s > one.step_s  # smaller matmuls, gathers every micro-batch
    assert acc.num_stages == 1 and acc.stage_axis is None and acc.bubble_fraction == 0


# -- conventional layout ----------------------------------------------------------------------------------------------

def test_conventional_rules_follow_the_axis_names():
    g = zoo.build("gpt", preset="gpt3-175b")
    assert conventional_rules(g, Mesh.parse("stage:8,model:8"), "stage") == \
        "heads:model,d_ff:model,vocab:model,seq:model"
    assert conventional_rules(g, Mesh.parse("data:16,fsdp:8,tensor:8")) == \
        "batch:data+fsdp,heads:tensor,d_ff:tensor,vocab:tensor,d_model:fsdp,seq:tensor"
    assert conventional_rules(g, Mesh.parse("x:8")) == ""


# -- command line -----------------------------------------------------------------------------------------------------

def test_must_show_gpt3_175b_1f1b_pipeline_fits_an_a100(capsys):
    d = run_json(capsys, "cost", "gpt", "--set", "preset=gpt3-175b", "--mesh", "stage:8,model:8", "--hardware",
                 "a100", "--stage-axis", "stage", "--microbatches", "64", "--schedule", "1f1b", "--remat", "full")
    assert d["fits"] and d["memory_bytes"] <= 80e9 and d["schedule"] == "1f1b" and d["stages"] == 8
    assert 0 < d["bubble_fraction"] == pytest.approx(7 / 71)
    mb = d["microbatch"]
    assert mb["comm_exposed_s"] + mb["comm_hidden_s"] == pytest.approx(mb["comm_s"])
    assert d["stage_costs"][0]["in_flight"] == 8 and "1F1B schedule" in d["gantt"]


def test_cost_command_prices_remat_of_the_first_blocks(capsys):
    d = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100", "--remat", "full:1")
    none = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100")
    assert d["remat"] == "full:1" and d["compute_s"] > none["compute_s"]


def test_cost_command_prices_gradient_accumulation(capsys):
    d = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100", "--microbatches", "2")
    assert d["stage_axis"] is None and d["microbatches"] == 2 and d["stages"] == 1
    code, out, _ = run(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100", "--microbatches", "2")
    assert code == 0 and "2 micro-batches of gradient accumulation" in out
    # overlap 0 (as Megatron-LM 2021 reduced gradients: after the backward pass) prices it as the Python API does
    flat = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100", "--microbatches", "2",
                    "--overlap", "0")
    want = estimate_pipeline(zoo.build("gpt"), Layout.from_rules("data:2,model:4", d["inner_layout"]), "h100",
                             stage_axis=None, microbatches=2, overlap=0)
    assert flat["step_s"] == pytest.approx(want.step_s) and flat["step_s"] > d["step_s"]
    assert (flat["overlap"], d["overlap"]) == (0, "auto")


def test_cost_command_picks_the_fastest_stage_split_that_fits_the_device(capsys):
    base = ["cost", "gpt", "--set", "layers=6", "--set", "seq=256", "--set", "d_model=128", "--set", "vocab=64",
            "--set", "tie_embeddings=0", "--mesh", "pipe:3,data:2", "--layout", "batch:data", "--hardware", "h100",
            "--stage-axis", "pipe", "--microbatches", "4", "--hw", "memory_reserved=0"]
    free = run_json(capsys, *base)
    assert free["fits"]
    tight = run_json(capsys, *base, "--hw", f"hbm_bytes={free['memory_bytes'] - 1}")  # the fastest split no longer fits
    assert tight["fits"] and tight["memory_bytes"] < free["memory_bytes"] and tight["step_s"] > free["step_s"]
    assert [s["units"] for s in tight["stage_costs"]] != [s["units"] for s in free["stage_costs"]]
    none = run_json(capsys, *base, "--hw", "hbm_bytes=1000")  # nothing fits: the fastest split, not fitting
    assert not none["fits"] and none["step_s"] == pytest.approx(free["step_s"])


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8"], "invalid choice"),
    (["--attention", "paged"], "invalid choice"),
    (["--schedule", "interleaved:0", "--stage-axis", "data"], "interleaved:V with V >= 1"),
    (["--schedule", "zigzag", "--stage-axis", "data"], "unknown schedule 'zigzag'"),
    (["--microbatches", "3"], "3 micro-batches do not divide batch=8"),
    (["--microbatches", "0"], "--microbatches must be a positive integer"),
    (["--stage-axis", "pipe", "--microbatches", "2"], "unknown mesh axis 'pipe'"),
    (["--top", "-1"], "--top must be at least 0"),
    (["--overlap", "1.5"], "expected 'auto' or a number in [0, 1]"),
    (["--overlap", "0.5", "--microbatches", "2"], "--overlap takes 'auto' or 0 with --microbatches"),
    (["--remat", "full:0"], "unknown remat policy 'full:0'"),
    (["--remat", "partial"], "full:N (the first N blocks full, the rest none)"),
    (["--remat", "full:9"], "has 2 blocks, not 9"),
    (["--schedule", "gpipe", "--microbatches", "2"], "--schedule gpipe applies to pipelines: add --stage-axis"),
    (["--stage-axis", "data", "--microbatches", "2", "--layout", "batch:data"],
     "the layout splits over the stage axis 'data' (batch:data)"),
])
def test_bad_realism_options_are_one_clear_error(capsys, args, message):
    code, out, err = run(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--hardware", "h100", *args)
    assert code == 2 and not out and message in err and "Traceback" not in err


def test_a_layout_string_replicated_opts_out_of_the_conventional_layout(capsys):
    d = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--layout", "replicated")
    assert d["layout"] == "" and not d["collectives"]
    d = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4")
    assert d["layout"].startswith("batch:data,heads:model")
    assert math.isfinite(d["step_s"])


def test_precision_and_layout_errors_from_python_are_layoutsearch_errors():
    with pytest.raises(LayoutSearchError):
        estimate(GPT, TP, "h100", precision="fp64")
    with pytest.raises(LayoutSearchError, match="overlap of a micro-batched step"):
        estimate_pipeline(GPT, PIPE, "h100", stage_axis="stage", microbatches=4, overlap=0.5)


def test_the_default_layout_says_what_it_leaves_out(capsys):
    """An axis of unknown name, or a conventional rule that would not divide its dim, was dropped silently."""
    code, _, err = run(capsys, "cost", "gpt", "--mesh", "data:3,model:4", "--json")
    assert code == 0 and "note: the default layout leaves out batch:data: batch=8 is not divisible by 3" in err
    code, _, err = run(capsys, "cost", "gpt", "--mesh", "foo:2,model:4", "--json")
    assert code == 0 and "mesh axis 'foo' has no conventional role" in err
    code, _, err = run(capsys, "cost", "gpt", "--set", "preset=llama3-8b", "--mesh", "data:2,model:8", "--json")
    assert code == 0 and "note" not in err  # q_per_kv left out where kv_heads takes the axis: nothing to say
    code, _, err = run(capsys, "search", "gpt", "--mesh", "data:2,model:4", "--schedule", "gpipe")
    assert code == 2 and "--schedule gpipe applies to pipelined plans: add --pipeline" in err
