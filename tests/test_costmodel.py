"""Memory per device and the cost report: hand-checked cases, invariants, bad input."""

import dataclasses
import json
import math

import pytest

from layoutsearch import CostReport, Layout, Mesh, estimate, hardware, training_graph, zoo
from layoutsearch.costmodel.memory import memory_profile, remat_plan
from layoutsearch.errors import CostModelError, HardwareError, LayoutError
from layoutsearch.mesh import Link

B, IO, H = 64, 32, 128


@pytest.fixture(scope="module")
def ffn():
    return zoo.build("mtf-ffn", batch=B, io=IO, hidden=H)


@pytest.fixture(scope="module")
def gpt():
    return zoo.build("gpt", layers=3)


def lay(mesh, rules):
    return Layout.from_rules(Mesh.parse(mesh), rules)


# -- memory ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rules, split", [("", 1), ("batch:data", 1), ("hidden:data", 8), ("io:data", 8)])
def test_parameters_and_adam_state_are_the_layouts_slices(ffn, rules, split):
    m = memory_profile(ffn, lay("data:8", rules), precision="fp32")
    params = 2 * IO * H * 4 // split
    assert m.resident["parameters"] == params
    assert m.resident["optimizer_state"] == 2 * params  # Adam: m and v, float32
    assert m.breakdown["parameters"] == params and m.breakdown["optimizer_state"] == 2 * params


def test_sgd_has_no_optimizer_state(ffn):
    m = memory_profile(ffn, lay("data:8", "batch:data"), optimizer="sgd", precision="fp32")
    assert m.resident["optimizer_state"] == 0
    # mixed precision: the fp32 master weights are the optimizer's state, SGD's only one
    m = memory_profile(ffn, lay("data:8", "batch:data"), optimizer="sgd")
    assert m.resident == {"parameters": 2 * IO * H * 2, "optimizer_state": 2 * IO * H * 4,
                          "inputs": 2 * B // 8 * IO * 2}


def test_data_parallel_peak_is_hand_checked(ffn):
    # The peak is at the last backward op grad/w = einsum(x, grad/h): the parameters, Adam state, inputs
    # (x, target: batch split 8 ways), both parameter gradients (replicated: the layout splits only batch),
    # grad/h (its input, batch split) and the loss (a step output) are live; every forward activation is freed.
    m = memory_profile(ffn, lay("data:8", "batch:data"), precision="fp32")
    p = 2 * IO * H * 4
    assert m.peak_op == "grad/w"
    assert m.breakdown == {"parameters": p, "optimizer_state": 2 * p, "inputs": 2 * B // 8 * IO * 4,
                           "gradients": p, "activations": 4, "activation_gradients": B // 8 * H * 4, "transient": 0}
    assert m.peak_bytes == sum(m.breakdown.values())
    # mixed precision (the default): bf16 parameters, gradients, inputs and activations; fp32 master weights,
    # m and v (12 bytes per parameter: Rajbhandari et al. 2020's K = 12); the loss stays fp32
    m = memory_profile(ffn, lay("data:8", "batch:data"))
    n = 2 * IO * H
    assert m.breakdown == {"parameters": 2 * n, "optimizer_state": 12 * n, "inputs": 2 * B // 8 * IO * 2,
                           "gradients": 2 * n, "activations": 4, "activation_gradients": B // 8 * H * 2,
                           "transient": 0}


def test_new_values_of_parameters_alias_the_old_buffers(ffn):
    # the optimizer writes new/w, new/adam_m/w, ... into the donated buffers: the last op adds nothing
    m = memory_profile(ffn, lay("data:8", "batch:data"))
    tg = training_graph(ffn)
    last = [i for i, op in enumerate(tg.ops) if op.phase == "optimizer"]
    resident = sum(m.resident.values())
    assert m.timeline[last[-1]] <= resident + 4 + 2 * IO * H * 4  # resident + loss + gradients at most


def test_an_all_gathered_parameter_is_a_transient_buffer(ffn):
    # FSDP-style: w stored split over data on io, but h = x·w runs with io unsplit: w is all-gathered for the op
    layout = lay("data:8", "batch:data").with_tensor("w", {"io": "data"})
    m = memory_profile(ffn, layout, precision="fp32")
    tg = training_graph(ffn)
    i = [op.name for op in tg.ops].index("h")
    base = memory_profile(ffn, lay("data:8", "batch:data"), precision="fp32")
    # at op h: w is held as an eighth (7/8 less than replicated) plus the whole gathered copy
    w = IO * H * 4
    assert m.timeline[i] - base.timeline[i] == w - 7 * w // 8
    assert m.timeline[i + 1] - base.timeline[i + 1] == -7 * w // 8  # the copy is gone after the op


def test_remat_full_keeps_less_than_selective_less_than_none(gpt):
    layout = lay("data:2,model:4", "batch:data,d_ff:model,heads:model")
    none, sel, full = (memory_profile(gpt, layout, r) for r in ("none", "selective", "full"))
    assert full.peak_bytes < sel.peak_bytes < none.peak_bytes
    assert full.breakdown["activations"] < none.breakdown["activations"]
    assert none.recomputed_ops == 0 < sel.recomputed_ops < full.recomputed_ops


def test_remat_recomputes_only_what_the_backward_pass_needs(gpt):
    tg = training_graph(gpt)
    full = remat_plan(tg, "full")
    sel = remat_plan(tg, "selective")
    names = set(full.recomputed)
    # boundary tensors (read by the next layer) are kept; layer outputs are never recomputed
    assert not any(n.endswith("/ff_residual") for n in names)
    # the feed-forward output is only added to the residual: its backward needs nothing from it
    assert "layer.0/ff_out" not in names
    # full remat recomputes projections (and their forward all-reduces); selective keeps them
    assert "layer.0/attn_out" in names and "layer.0/attn_out" not in sel.recomputed
    assert "layer.0/attn_probs" in sel.recomputed  # the attention core is recomputed by both
    assert all(tg.op(n).phase == "forward" and tg.op(n).block for n in full.recomputed)


def test_remat_changes_nothing_without_blocks(ffn):
    layout = lay("data:8", "batch:data")
    assert memory_profile(ffn, layout, "full").peak_bytes == memory_profile(ffn, layout).peak_bytes


# -- the report -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report(gpt):
    return estimate(gpt, lay("data:2,model:4", "batch:data,d_ff:model,heads:model,vocab:model"), "h100",
                    remat="selective", overlap=0.0)


def test_totals_are_the_sums_of_the_per_op_parts(report):
    assert isinstance(report, CostReport)
    assert math.isclose(report.compute_s, sum(o.compute_s for o in report.ops), rel_tol=1e-12)
    assert math.isclose(report.comm_s, sum(c.seconds for c in report.collectives), rel_tol=1e-12)
    assert math.isclose(report.launch_s, sum(o.launch_s for o in report.ops), rel_tol=1e-12)
    assert math.isclose(report.step_s, report.compute_s + report.launch_s + report.comm_s, rel_tol=1e-12)
    assert math.isclose(report.flops_per_device, sum(o.flops for o in report.ops), rel_tol=1e-12)
    for axis, nbytes in report.bytes_per_axis.items():
        assert math.isclose(nbytes, sum(c.link_bytes.get(axis, 0.0) for c in report.collectives), rel_tol=1e-12)
    assert sum(report.bytes_by_kind().values()) == sum(c.bytes for c in report.collectives)
    phases = report.by_phase()
    assert math.isclose(sum(p["compute_s"] + p["launch_s"] + p["comm_s"] for p in phases.values()), report.step_s,
                        rel_tol=1e-12)
    assert math.isclose(sum(report.compute_by_bound().values()), report.compute_s, rel_tol=1e-12)
    groups = report.comm_groups()
    assert sum(g["count"] for g in groups) == len(report.collectives)
    assert all(sum(c["count"] for c in g["causes"]) == g["count"] for g in groups)


def test_compute_seconds_follow_the_roofline(report):
    hw = hardware("h100")
    for o in report.ops:
        rate = hw.peak_flops * (hw.matmul_efficiency if o.matmul else 1.0)
        want = max(o.flops / rate, o.hbm_bytes / (hw.hbm_bandwidth * hw.memory_efficiency))
        # a matmul's shape only lowers its efficiency (tile and wave quantization)
        assert o.compute_s >= want * (1 - 1e-12) if o.matmul else math.isclose(o.compute_s, want, rel_tol=1e-12)
        if o.bound == "memory":
            assert math.isclose(o.compute_s, o.hbm_bytes / (hw.hbm_bandwidth * hw.memory_efficiency), rel_tol=1e-12)


def test_recomputed_ops_are_priced_again(gpt):
    layout = lay("data:2,model:4", "batch:data,d_ff:model,heads:model")
    none, full = (estimate(gpt, layout, "h100", remat=r, attention="standard") for r in ("none", "full"))
    again = [o for o in full.ops if o.phase == "recompute"]
    assert len(again) == full.memory.recomputed_ops > 0
    assert math.isclose(full.flops_per_device - none.flops_per_device, sum(o.flops for o in again), rel_tol=1e-9)
    assert full.model_flops == none.model_flops and full.mfu < none.mfu
    assert any(c.phase == "recompute" and c.cause.startswith("recompute") for c in full.collectives)


def test_mfu_is_model_flops_over_devices_peak_and_step(report, gpt):
    hw = hardware("h100")
    assert 0 < report.mfu < hw.matmul_efficiency
    assert math.isclose(report.mfu, report.model_flops / (8 * hw.peak_flops * report.step_s), rel_tol=1e-12)
    replicated = estimate(gpt, lay("data:8", ""), "h100")
    assert replicated.comm_s == 0 and replicated.mfu <= 1 / 8
    # model FLOPs are global and do not depend on the layout
    assert replicated.model_flops == report.model_flops
    assert math.isclose(replicated.flops_per_device * 8 / replicated.model_flops, 8, rel_tol=0.05)


def test_overlap_hides_the_shorter_of_compute_and_communication(gpt):
    layout = lay("data:2,model:4", "batch:data,d_ff:model")
    r = estimate(gpt, layout, "h100", overlap=1.0)
    assert math.isclose(r.step_s, max(r.compute_s, r.comm_s), rel_tol=1e-12)
    with pytest.raises(CostModelError, match="overlap"):
        estimate(gpt, layout, "h100", overlap=1.5)


def test_forward_and_training_graphs_give_the_same_report(ffn):
    layout = lay("data:2,model:4", "batch:data,hidden:model")
    a = estimate(ffn, layout, "tpu-v3", optimizer="sgd")
    b = estimate(training_graph(ffn, "sgd", "mixed"), layout, "tpu-v3")
    assert a.to_dict() == b.to_dict()
    assert b.optimizer == "sgd"


def test_mesh_tf_table1_traffic_falls_out_of_the_training_graph(ffn):
    # data-parallel: gradients of w and v all-reduced (+ the loss); hidden split: y's partial sums
    dp = estimate(ffn, lay("data:8", "batch:data"), optimizer="sgd", precision="fp32")
    assert dp.bytes_by_kind() == {"all-reduce": 2 * IO * H * 4 + 4}
    mp = estimate(ffn, lay("model:8", "hidden:model"), optimizer="sgd", precision="fp32")
    assert mp.bytes_by_kind() == {"all-reduce": B * IO * 4}
    # mixed precision: bf16 gradients and activations; the loss stays fp32
    dp = estimate(ffn, lay("data:8", "batch:data"), "h100", optimizer="sgd")
    assert dp.bytes_by_kind() == {"all-reduce": 2 * IO * H * 2 + 4}
    assert {c.op for c in mp.collectives} == {"y"}
    assert all("hidden" in c.cause for c in mp.collectives)


def test_fsdp_gradients_are_reduce_scattered_where_the_hardware_can(ffn):
    layout = lay("data:8", "batch:data,io:data")
    kinds = estimate(ffn, layout, "h100").bytes_by_kind()
    assert kinds.get("all-gather") and kinds.get("reduce-scatter")
    assert "reduce-scatter" not in estimate(ffn, layout, "cpu-sim").bytes_by_kind()


def test_report_json_has_the_documented_keys(report):
    d = json.loads(json.dumps(report.to_dict()))
    for key in ("step_s", "compute_s", "comm_s", "memory_bytes", "flops_per_device", "mfu", "bytes_per_axis",
                "memory", "collectives", "ops", "fits", "model_flops", "bytes_by_kind", "comm_groups", "hardware"):
        assert key in d, key
    assert set(d["memory"]["breakdown"]) >= {"parameters", "gradients", "optimizer_state", "activations",
                                             "inputs", "transient"}
    c = d["collectives"][0]
    assert set(c) >= {"op", "kind", "axes", "bytes", "seconds", "cause", "tensor"}
    assert d["memory_bytes"] == d["memory"]["peak_bytes"]
    assert "ops" not in report.to_dict(ops=False)


def test_human_rendering_names_collectives_and_causes(report):
    text = str(report)
    assert "all-reduce" in text and "contracted" in text and "peak memory" in text and "layer.*" in text


def test_memory_fits_against_the_hardware(gpt):
    layout = lay("data:8", "batch:data")
    assert estimate(gpt, layout, "h100").fits
    assert not estimate(gpt, layout, hardware("h100", hbm_bytes=1000, memory_reserved=0)).fits


# -- bad input ------------------------------------------------------------------------------------------------------

def test_unknown_hardware_is_one_clear_error(ffn):
    with pytest.raises(HardwareError, match="unknown hardware 'tpu-v9'"):
        estimate(ffn, lay("data:8", "batch:data"), "tpu-v9")


def test_indivisible_split_is_one_clear_error(ffn):
    with pytest.raises(LayoutError, match="cannot be split 3 ways"):
        estimate(ffn, lay("data:3", "batch:data"))


def test_layout_naming_a_dim_the_model_lacks_is_one_clear_error(ffn):
    with pytest.raises(LayoutError, match="names dim 'd_ff', which model 'mtf-ffn' lacks"):
        estimate(ffn, lay("data:8", "d_ff:data"))


def test_mesh_axis_without_bandwidth_is_one_clear_error(ffn):
    hw = dataclasses.replace(hardware("h100"), fast_link=Link(0.0, 1e-6))
    with pytest.raises(CostModelError, match="mesh axis 'data' has no bandwidth"):
        estimate(ffn, lay("data:8", "batch:data"), hw)


def test_unknown_remat_policy_is_one_clear_error(ffn):
    with pytest.raises(CostModelError, match="unknown remat policy 'some'"):
        estimate(ffn, lay("data:8", "batch:data"), remat="some")


# -- scale ----------------------------------------------------------------------------------------------------------

def test_gpt3_175b_is_estimated():
    g = zoo.build("gpt", preset="gpt3-175b")
    r = estimate(g, lay("data:8,model:8", "batch:data,d_ff:model,heads:model,vocab:model"), "h100",
                 remat="full")
    params = sum(t.num_elements for t in g.parameters)
    assert 170e9 < params < 180e9
    assert r.memory.resident["parameters"] == pytest.approx(params * 2 / 8, rel=0.01)  # bf16, 8-way model split
    assert r.memory.resident["optimizer_state"] == pytest.approx(params * 12 / 8, rel=0.01)  # fp32 master, m, v
    assert r.step_s > 0 and 0 < r.mfu < 1
    # model FLOPs ~ 6 N tokens plus attention
    tokens = g.dims["batch"] * g.dims["seq"]
    assert 6 * params * tokens < r.model_flops < 8 * params * tokens


# -- memoized op costs ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, mesh, rules", [
    ("gpt", "data:2,model:4", "batch:data,d_ff:model,heads:model,vocab:model"),
    ("gpt", "data:8", "batch:data,d_model:data"),
    ("mtf-transformer", "data:4,model:2", "batch:data,d_ff:model,heads:model"),
    ("moe", "data:2,model:4", "batch:data,experts:model"),
    ("mlp", "data:2,model:4", "batch:data,hidden:model"),
])
def test_repeated_layers_are_priced_once_with_the_same_result(model, mesh, rules):
    from layoutsearch.costmodel.step import repeats, step_costs, training_step

    g = training_step(zoo.build(model, layers=4))
    layout = lay(mesh, rules)
    assert step_costs(g, layout, memo=True) == step_costs(g, layout, memo=False)
    assert len(set(repeats(g))) < len(g.ops) / (2 if model in ("gpt", "mtf-transformer") else 1)
    weight = next(t.name for t in g.parameters if t.name.startswith("layer.2/"))
    explicit = layout.with_tensor(weight, {})  # a tensor laid out by name: its ops are priced one by one
    assert step_costs(g, explicit, memo=True) == step_costs(g, explicit, memo=False)
