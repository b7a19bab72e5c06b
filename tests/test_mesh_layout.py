"""Meshes, hardware presets and layouts."""

import pytest
from jax.sharding import PartitionSpec

from layoutsearch.errors import HardwareError, LayoutError, MeshError
from layoutsearch.ir import GraphBuilder
from layoutsearch.layout import Layout, parse_rules
from layoutsearch.mesh import PRESETS, Mesh, hardware


def graph():
    b = GraphBuilder("g")
    batch, io, hidden = b.dim("batch", 64), b.dim("io", 256), b.dim("hidden", 1024)
    x = b.input("x", [batch, io])
    w = b.parameter("w", [io, hidden])
    b.einsum([x, w], [batch, hidden], name="h")
    return b.build()


def test_mesh_parses_both_separators_and_keeps_order():
    m = Mesh.parse("data=2, model:4")
    assert m.names == ("data", "model") and m.size == 8 and str(m) == "data:2,model:4"


@pytest.mark.parametrize("text", ["", "data", "data:x", "data:2,data:2", "data:0", "2:data"])
def test_bad_mesh_strings_are_rejected(text):
    with pytest.raises(MeshError):
        Mesh.parse(text)


def test_every_issue_preset_exists_and_unknown_hardware_is_named():
    for name in ["tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "v100", "a100", "h100", "h200", "cpu-sim"]:
        assert name in PRESETS
    with pytest.raises(HardwareError, match="unknown hardware 'tpu-v9'"):
        hardware("tpu-v9")


def test_hardware_figures_are_overridable():
    hw = hardware("h100", peak_flops=1e15, slow_link_bandwidth=1e9, axis_links={"model": "slow"})
    assert hw.peak_flops == 1e15 and hw.slow_link.bandwidth == 1e9
    links = hw.links_for(Mesh.parse("data:2,model:4"))
    assert links["model"] is hw.slow_link and links["data"] is hw.fast_link
    with pytest.raises(HardwareError, match="unknown hardware figure 'peak_flop'"):
        hardware("h100", peak_flop=1)
    for change in ({"memory_reserved": 1e12}, {"hbm_bytes": 5e8}):  # (a negative usable memory was accepted)
        with pytest.raises(HardwareError, match=r"memory_reserved \(.*\) must be below hbm_bytes"):
            hardware("h100", **change)


def test_axes_beyond_one_node_use_slow_links():
    hw = hardware("a100")
    links = hw.links_for(Mesh.parse("node:4,data:2,model:4"))
    assert links["model"] is hw.fast_link and links["data"] is hw.fast_link and links["node"] is hw.slow_link


def test_rules_give_specs_local_shapes_and_flax_precedence():
    g = graph()
    lay = Layout.from_rules("data:2,model:4", "batch:data,hidden:model,io:model").check(g)
    x, w, h = (g.tensors[n] for n in "xwh")
    assert lay.spec(x) == ("data", "model")
    assert lay.spec(w) == (None, "model")  # hidden takes 'model' first; io falls back to unsplit
    assert lay.local_shape(h) == (32, 256)
    assert lay.replication(w) == 2
    assert lay.partition_spec(w) == PartitionSpec(None, "model")


def test_one_dim_over_several_axes():
    g = graph()
    lay = Layout.from_rules("data:2,fsdp:4", "batch:data+fsdp").check(g)
    assert lay.spec(g.tensors["x"]) == (("data", "fsdp"), None)
    assert lay.local_shape(g.tensors["x"]) == (8, 256)
    assert parse_rules("batch:data+fsdp,io:-") == (("batch", ("data", "fsdp")), ("io", ()))


@pytest.mark.parametrize("mesh, rules, message", [
    ("data:2", "batch:model", "unknown mesh axis 'model'"),
    ("data:2", "d_ff:data", "names dim 'd_ff', which model 'g' lacks"),
    ("data:3", "batch:data", "dim 'batch' of size 64 cannot be split 3 ways"),
    ("data:2", "batch:data+data", "repeats a mesh axis"),
    ("data:2", "batch", "bad layout rule"),
])
def test_bad_layouts_get_clear_errors(mesh, rules, message):
    with pytest.raises(LayoutError, match=message):
        Layout.from_rules(mesh, rules).check(graph())


def test_per_tensor_layout_rejects_one_axis_on_two_dims():
    lay = Layout.from_rules("data:2,model:4", "batch:data")
    with pytest.raises(LayoutError, match="mesh axis 'model' splits two dims"):
        lay.with_tensor("x", {"batch": "model", "io": "model"})
    ok = lay.with_tensor("w", {"io": "data", "hidden": "model"}).check(graph())
    assert ok.spec(graph().tensors["w"]) == ("data", "model")
