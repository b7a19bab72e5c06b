"""Exports of layouts: PartitionSpecs, Flax Linen and NNX rules, MaxText overrides, Python snippet, `export`."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutsearch import zoo
from layoutsearch.errors import LayoutError, LayoutSearchError
from layoutsearch.export import (
    FORMATS,
    MAXTEXT_REMAT_POLICY,
    export,
    flax_logical_axis_rules,
    maxtext_axis_map,
    maxtext_keys,
    maxtext_overrides,
    maxtext_parallelism_key,
    maxtext_yaml,
    nnx_logical_axis_rules,
    partition_specs,
    python_snippet,
)
from layoutsearch.ir import GraphBuilder
from layoutsearch.layout import Layout
from layoutsearch.maxtext.version import maxtext_version

GPT = zoo.build("gpt")
GQA = zoo.build("gpt", heads=4, kv_heads=2, mlp="swiglu", position="rotary", norm="rmsnorm", bias=0)
MESH = "data:2,model:4"


def flax_logical_to_mesh_axes(dim_names, rules):
    """Flax's ``_logical_to_mesh_axes`` (flax/linen/spmd.py), restated: rules in order; a rule claims a
    still-unassigned dim when none of its mesh axes is taken yet (a rule with no axes claims it unsplit)."""
    unassigned = object()
    result = [unassigned] * len(dim_names)
    for name, mesh_axes in rules:
        if name not in dim_names:
            continue
        pos = dim_names.index(name)
        new = set() if mesh_axes is None else {mesh_axes} if isinstance(mesh_axes, str) else set(mesh_axes)
        taken = {a for r in result if r is not unassigned and r is not None
                 for a in ([r] if isinstance(r, str) else r)}
        if not (new & taken) and result[pos] is unassigned:
            result[pos] = mesh_axes
    return tuple(None if r is unassigned else r for r in result)


def _exec(code):
    namespace: dict = {}
    exec(compile(code, "<export>", "exec"), namespace)  # noqa: S102 -- the exported code is ours; running it is the test
    return namespace


# -- PartitionSpecs --------------------------------------------------------------------------------------------------

def test_partition_specs_give_every_tensor_its_layout_spec():
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model,heads:model")
    specs = partition_specs(layout, GPT)
    assert set(specs) == set(GPT.tensors)
    assert specs["layer.0/wi"] == (None, "model")
    assert specs["ids"] == ("data", None)
    assert specs["loss"] == ()


def test_partition_specs_check_the_layout_first():
    with pytest.raises(LayoutError, match="not divisible"):
        partition_specs(Layout.from_rules("data:3", "batch:data"), GPT)


def test_partition_specs_include_per_tensor_entries():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    assert partition_specs(layout, GPT)["embed"] == (None, "model")


def test_specs_export_is_json_of_every_tensor():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,heads:model")
    doc = json.loads(export(layout, GPT, "specs"))
    assert set(doc) == set(GPT.tensors)
    assert doc["ids"] == [["data", "model"], None]
    assert doc["layer.0/wi"] == [None, "model"]
    for t in GPT.tensors.values():
        assert tuple(tuple(e) if isinstance(e, list) else e for e in doc[t.name]) == layout.spec(t)


# -- Flax Linen ------------------------------------------------------------------------------------------------------

def test_flax_rules_use_one_axis_a_tuple_of_axes_or_none():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,d_model:-")
    assert flax_logical_axis_rules(layout) == [("batch", ("data", "model")), ("d_ff", "model"), ("d_model", None)]


def test_an_empty_rule_claims_its_dim_as_in_flax():
    layout = Layout.from_rules(MESH, "d_ff:-,batch:data,d_ff:model")
    assert flax_logical_axis_rules(layout) == [("d_ff", None), ("batch", "data"), ("d_ff", "model")]
    assert "model" not in layout.spec(GPT.tensors["layer.0/ff_in"])
    t = GPT.tensors["layer.0/ff_in"]
    assert flax_logical_to_mesh_axes(list(t.dim_names), flax_logical_axis_rules(layout)) == layout.spec(t)


def test_rules_cannot_express_per_tensor_entries():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    with pytest.raises(LayoutError, match="per-tensor"):
        flax_logical_axis_rules(layout)
    with pytest.raises(LayoutError, match="per-tensor"):
        maxtext_overrides(layout)
    with pytest.raises(LayoutError, match="per-tensor"):
        export(layout, GPT, "flax")


_DIMS = sorted(GPT.dims)
_AXES = st.lists(st.sampled_from(["data", "model", "fsdp"]), unique=True, max_size=2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DIMS), _AXES), max_size=6))
def test_flax_applies_exported_rules_like_layoutsearch(rules):
    layout = Layout.from_rules("data:2,model:2,fsdp:2", rules)
    exported = flax_logical_axis_rules(layout)
    for t in GPT.tensors.values():
        assert flax_logical_to_mesh_axes(list(t.dim_names), exported) == layout.spec(t), t.name


def test_flax_export_is_python_that_defines_the_rules():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,d_model:-,heads:model")
    text = export(layout, GPT, "flax", remat="selective")
    assert _exec(text)["logical_axis_rules"] == flax_logical_axis_rules(layout)
    assert "checkpoint_dots_with_no_batch_dims" in text
    assert _exec(export(Layout.replicated(MESH), GPT, "flax"))["logical_axis_rules"] == []


def test_flax_export_of_a_pipeline_leaves_out_the_stage_axis_rules():
    layout = Layout.from_rules("stage:2,data:4", "batch:data,d_model:stage")
    text = export(layout, GPT, "flax", stage_axis="stage", microbatches=4, schedule="gpipe")
    assert _exec(text)["logical_axis_rules"] == [("batch", "data")]
    assert "pipeline over mesh axis 'stage'" in text


# -- Flax NNX --------------------------------------------------------------------------------------------------------

def test_nnx_rules_give_every_dim_one_value():
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model,heads:model,d_model:-")
    rules = nnx_logical_axis_rules(layout, GPT)
    assert [d for d, _ in rules][:4] == ["batch", "d_ff", "heads", "d_model"]
    assert sorted(d for d, _ in rules) == sorted(GPT.dims)
    values = dict(rules)
    assert values["batch"] == "data" and values["d_ff"] == "model" and values["d_model"] is None
    assert values["vocab"] is None
    assert _exec(export(layout, GPT, "nnx"))["logical_axis_rules"] == rules


def _nnx_spec(dim_names, rules):
    """What flax.nnx does (flax/core/spmd.py ``from_sharding_rules``): a dict lookup per name, no precedence."""
    table = dict(rules)
    return tuple(table.get(d, d) for d in dim_names)


@pytest.mark.parametrize("rules", ["batch:data,d_ff:model,heads:model", "batch:data,d_model:data",
                                   "batch:data+model,d_ff:model", "d_model:model,batch:data,d_model:data"])
def test_nnx_rules_are_exact_for_every_parameter(rules):
    layout = Layout.from_rules(MESH, rules)
    nnx_rules = nnx_logical_axis_rules(layout, GPT)
    for t in GPT.tensors.values():
        if t.role == "parameter":
            assert _nnx_spec(t.dim_names, nnx_rules) == layout.spec(t), t.name


def test_nnx_export_names_activations_it_cannot_follow():
    layout = Layout.from_rules(MESH, "batch:data,d_model:data")  # d_model split in weights, not in activations
    text = export(layout, GPT, "nnx")
    assert dict(_exec(text)["logical_axis_rules"])["d_model"] == "data"
    assert "Activations where the layout splits a dim otherwise" in text and "d_model:" in text


def test_nnx_refuses_a_dim_two_parameters_split_differently():
    mlp = zoo.build("mlp")
    layout = Layout.from_rules("data:2,model:4", "hidden:model,hidden2:model")  # [hidden, hidden2] weights
    with pytest.raises(LayoutError, match="one mesh-axes value"):
        nnx_logical_axis_rules(layout, mlp)


# -- MaxText ---------------------------------------------------------------------------------------------------------
# (checked by MaxText's own code in tests/test_maxtext.py; here: what needs no MaxText)

LLAMA = zoo.build("gpt", preset="llama3-8b", layers=2, d_model=256, heads=4, kv_heads=2, d_ff=512, vocab=1024,
                  seq=128, batch=32)
V = maxtext_version("0.2.5")


def test_the_maxtext_table_comes_from_maxtexts_own_files():
    assert V.version == "0.2.5" and "generated by python -m layoutsearch.maxtext.tables" in V.source
    assert len(V.keys) == 786 and {"ici_pipeline_parallelism", "override_logical_axis_rules", "model_name",
                                   "max_target_length"} <= V.keys
    assert "context" in V.mesh_axes and "sequence" not in V.mesh_axes
    assert {"embed_attn", "embed_vocab", "activation_batch_attn"} <= set(V.logical_names)
    assert "activation_batch_no_exp" not in V.logical_names
    assert V.tensors["llama2"]["params"]["decoder/layers/self_attention/query/kernel"] == [
        "embed_attn", "layers", "q_heads", "kv"]
    with pytest.raises(LayoutError, match="unsupported MaxText version '0.1.0'"):
        maxtext_version("0.1.0")


_MESHES = [
    ("data:2,model:4", {}, 1),
    ("stage:2,fsdp:4", {"microbatches": 4}, 1),
    ("data:2,fsdp:2,model:2", {}, 1),
    ("seq:2,tensor:4", {}, 1),
    ("expert:4,data:2", {}, 1),
    ("fsdp:8", {"remat": "full"}, 1),
    ("data:4,fsdp:4,tensor:2", {}, 2),
    ("dp:2,tp:4", {"microbatches": 2, "remat": "selective"}, 1),
    ("model:4,data:2", {}, 1),
]


@pytest.mark.parametrize(("mesh", "kw", "slices"), _MESHES)
def test_maxtext_writes_only_its_keys_and_sizes_every_axis(mesh, kw, slices):
    graph = zoo.build("gpt", layers=4, batch=32)
    layout = Layout.from_rules(mesh, "")
    kw = {"remat": "none", **kw}
    cfg = maxtext_overrides(layout, graph=graph, slices=slices, **kw)
    assert set(cfg) <= maxtext_keys() and "mesh_axes" not in cfg and cfg["override_logical_axis_rules"] is True
    ici = [cfg[maxtext_parallelism_key(a, "ici")] for a in V.mesh_axes]
    dcn = [cfg[maxtext_parallelism_key(a, "dcn")] for a in V.mesh_axes]
    assert math.prod(ici) * math.prod(dcn) == layout.mesh.size
    assert math.prod(dcn) == slices and math.prod(ici) == layout.mesh.size // slices
    assert cfg["max_target_length"] == graph.dims["seq"]
    text = export(layout, graph, "maxtext", slices=slices, **kw)
    written = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith((" ", "#", "]"))]
    assert set(written) == set(cfg) and set(written) <= maxtext_keys()


def test_maxtext_keeps_every_mesh_axis():
    cfg = maxtext_overrides(Layout.from_rules(MESH, "batch:data,d_ff:model"), graph=GPT)
    assert cfg["ici_data_parallelism"] == 2 and cfg["ici_tensor_parallelism"] == 4
    assert all(cfg[f"dcn_{a}_parallelism"] == 1 for a in ("data", "fsdp", "tensor", "pipeline", "context"))
    assert cfg["data_sharding"] == [["data"]]
    assert cfg["per_device_batch_size"] == 1


def test_maxtext_sizes_the_stage_axis_with_the_pipeline_key():
    graph = zoo.build("gpt", layers=4, batch=16)
    cfg = maxtext_overrides(Layout.from_rules("stage:2,fsdp:4", "batch:fsdp,d_model:fsdp"), graph=graph,
                            microbatches=4)
    assert cfg["ici_pipeline_parallelism"] == 2 and cfg["ici_fsdp_parallelism"] == 4
    assert "ici_stage_parallelism" not in cfg
    assert cfg["num_pipeline_microbatches"] == 4 and cfg["num_pipeline_repeats"] == 1
    assert cfg["num_layers_per_pipeline_stage"] == 2
    assert ["layers", ["stage"]] in cfg["logical_axis_rules"]
    cfg = maxtext_overrides(Layout.from_rules("pipe:2,fsdp:4", "batch:fsdp"), graph=graph, stage_axis="pipe",
                            microbatches=4, schedule="maxtext")
    assert cfg["ici_pipeline_parallelism"] == 2 and cfg["num_pipeline_repeats"] == 1
    assert cfg["num_layers_per_pipeline_stage"] == 2
    # the ops outside the stages (logits, input batch) split the batch over the stage axis too
    assert ["activation_embed_and_logits_batch", ["stage", "fsdp"]] in cfg["logical_axis_rules"]
    assert ["activation_batch", ["fsdp"]] in cfg["logical_axis_rules"]
    with pytest.raises(LayoutError, match="multiple of the pipeline stages"):
        maxtext_overrides(Layout.from_rules("stage:2,fsdp:4", ""), graph=graph, microbatches=3)
    with pytest.raises(LayoutError, match="do not split into 4 equal stages"):
        maxtext_overrides(Layout.from_rules("stage:4,fsdp:2", ""), graph=zoo.build("gpt", layers=6, batch=16),
                          microbatches=4)
    for schedule in ("1f1b", "gpipe", "interleaved:2"):
        with pytest.raises(LayoutError, match=f"priced under schedule {schedule} is not what MaxText runs"):
            maxtext_overrides(Layout.from_rules("stage:2,fsdp:4", ""), graph=graph, microbatches=4, schedule=schedule)


def test_remat_of_the_first_blocks_exports_as_what_each_framework_can_run():
    layout = Layout.from_rules(MESH, "batch:data")
    flax = export(layout, GPT, "flax", remat="full:1")
    assert "around each of the first 1 layers, no nn.remat around the others" in flax
    assert maxtext_overrides(layout, graph=GPT, remat="full:1")["remat_policy"] == "full"
    text = export(layout, GPT, "maxtext", remat="full:1")
    assert "remat_policy" in text and "MaxText remats every layer alike" in text


def test_maxtext_gradient_accumulation_and_remat():
    cfg = maxtext_overrides(Layout.from_rules(MESH, "batch:data"), graph=GPT, microbatches=2, remat="none")
    assert cfg["gradient_accumulation_steps"] == 2 and "num_pipeline_microbatches" not in cfg
    assert cfg["per_device_batch_size"] == 0.5  # 8 sequences / 8 devices / 2 steps
    assert cfg["remat_policy"] == "none" and cfg["scan_layers"] is False  # a scanned layer is always checkpointed
    assert MAXTEXT_REMAT_POLICY == {"none": "none", "selective": "minimal", "full": "full"}
    assert maxtext_overrides(Layout.from_rules(MESH, "batch:data"), graph=GPT, remat="selective")[
        "remat_policy"] == "minimal"
    assert "remat_policy" not in maxtext_overrides(Layout.from_rules(MESH, "batch:data"))


def test_maxtext_multi_slice_splits_the_major_axis_over_dcn():
    cfg = maxtext_overrides(Layout.from_rules("data:4,fsdp:4,tensor:2", "batch:data+fsdp"), slices=2)
    assert cfg["dcn_data_parallelism"] == 2 and cfg["ici_data_parallelism"] == 2
    assert cfg["ici_fsdp_parallelism"] == 4 and cfg["ici_tensor_parallelism"] == 2
    cfg = maxtext_overrides(Layout.from_rules("data:4,fsdp:4,tensor:2", ""), slices=4, dcn_axis="fsdp")
    assert cfg["dcn_fsdp_parallelism"] == 4 and cfg["ici_fsdp_parallelism"] == 1
    with pytest.raises(LayoutError, match="not divisible"):
        maxtext_overrides(Layout.from_rules("data:4,fsdp:4,tensor:2", ""), slices=4, dcn_axis="tensor")


def test_maxtext_maps_mesh_axes_by_name_or_axis_map():
    layout = Layout.from_rules("rows:2,cols:4", "batch:rows,d_ff:cols")
    with pytest.raises(LayoutError, match="no MaxText counterpart.*axis_map"):
        maxtext_overrides(layout)
    cfg = maxtext_overrides(layout, graph=GPT, axis_map={"rows": "data", "cols": "tensor"})
    assert cfg["ici_data_parallelism"] == 2 and cfg["ici_tensor_parallelism"] == 4
    assert ["mlp", ["tensor"]] in cfg["logical_axis_rules"]
    with pytest.raises(LayoutError, match="both map to MaxText's 'data'"):
        maxtext_overrides(Layout.from_rules("data:2,dp:4", ""))
    with pytest.raises(LayoutError, match="not a mesh axis of MaxText 0.2.5"):
        maxtext_overrides(layout, axis_map={"rows": "tensor_transpose", "cols": "tensor"})
    assert maxtext_overrides(Layout.from_rules("seq:2,tensor:4", ""))["ici_context_parallelism"] == 2


def test_maxtext_names_its_own_models_and_writes_the_shapes_of_others():
    cfg = maxtext_overrides(Layout.from_rules("fsdp:8", "batch:fsdp,d_model:fsdp"),
                            graph=zoo.build("gpt", preset="llama3-8b"))
    assert cfg["model_name"] == "llama3-8b" and "base_emb_dim" not in cfg
    assert cfg["max_target_length"] == 8192 and cfg["per_device_batch_size"] == 256
    cfg = maxtext_overrides(Layout.from_rules("fsdp:8", "batch:fsdp"), graph=LLAMA)
    assert "model_name" not in cfg and cfg["decoder_block"] == "llama2" and cfg["base_emb_dim"] == 256
    assert cfg["base_num_kv_heads"] == 2 and cfg["mlp_activations"] == ["silu", "linear"]
    cfg = maxtext_overrides(Layout.from_rules("fsdp:8", "batch:fsdp"), graph=GPT)
    assert cfg["decoder_block"] == "gpt3" and cfg["fused_qkv"] is True and cfg["logits_via_embedding"] is True


def _flax_spec(names, rules):
    mt_rules = [(n, None if not a else a[0] if len(a) == 1 else tuple(a)) for n, a in rules]
    return tuple(() if s is None else (s,) if isinstance(s, str) else tuple(s)
                 for s in flax_logical_to_mesh_axes(list(names), mt_rules))


@pytest.mark.parametrize(("graph", "mesh", "rules"), [
    (LLAMA, "fsdp:4,tensor:2", "batch:fsdp,d_ff:tensor,kv_heads:tensor,vocab:tensor,d_model:tensor,d_model:fsdp"),
    (LLAMA, "data:4,model:2", "batch:data,kv_heads:model,d_ff:model,vocab:model"),
    (LLAMA, "fsdp:4,context:2", "batch:fsdp,seq:context,kv_seq:context,d_model:fsdp"),
    (GPT, "data:2,model:4", "batch:data,heads:model,d_ff:model"),
    (GPT, "data:2,model:4", "batch:data,d_model:data"),
])
def test_maxtext_rules_give_every_maxtext_tensor_the_plans_spec(graph, mesh, rules):
    """Flax precedence on the exported rules, applied to the logical names MaxText 0.2.5 gives each of its
    tensors (the version table), yields the plan's PartitionSpec of the tensor it is (no MaxText needed; the
    MaxText tier checks the same on MaxText's own code)."""
    from layoutsearch.maxtext.tensors import ACTIVATIONS, PARAMS, decoder_block, zoo_dims, zoo_tensors

    layout = Layout.from_rules(mesh, rules)
    cfg = maxtext_overrides(layout, graph=graph)
    names = maxtext_axis_map(layout.mesh.names)
    block = decoder_block(graph)
    table = V.tensors[block]
    logical_of = {**table["params"], **table["activations"], "logits": table["logits"]}
    checked = 0
    for c in PARAMS[block] + ACTIVATIONS[block]:
        if c.maxtext not in logical_of:
            continue
        got = _flax_spec(logical_of[c.maxtext], cfg["logical_axis_rules"])
        for t in zoo_tensors(graph, c):
            lay = layout.dim_layout(t)
            want = tuple(tuple(names[a] for d in zd for a in lay.get(d, ())) for zd in zoo_dims(graph, c))
            assert tuple(g for g, zd in zip(got, zoo_dims(graph, c)) if zd) == tuple(w for w, zd in zip(
                want, zoo_dims(graph, c)) if zd), (c.maxtext, t.name)
            checked += 1
    assert checked > 20


def test_maxtext_refuses_what_its_names_cannot_express():
    with pytest.raises(LayoutError, match="one logical axis name, 'vocab'"):
        maxtext_overrides(Layout.from_rules(MESH, "batch:data,vocab:model"), graph=GPT)  # pos_embed's seq is 'vocab'
    with pytest.raises(LayoutError, match="dim_names is for models MaxText has no decoder for"):
        maxtext_overrides(Layout.from_rules(MESH, "batch:data"), {"batch": "b"}, graph=GPT)


def test_maxtext_dims_of_a_model_maxtext_lacks_keep_their_names():
    mtf = zoo.build("mtf-ffn")
    cfg = maxtext_overrides(Layout.from_rules(MESH, "batch:data,hidden:model"), graph=mtf)
    assert cfg["logical_axis_rules"] == [["batch", ["data"]], ["hidden", ["tensor"]]]
    renamed = maxtext_overrides(Layout.from_rules(MESH, "batch:data,hidden:model"), {"hidden": ["mlp"]}, graph=mtf)
    assert renamed["logical_axis_rules"] == [["batch", ["data"]], ["mlp", ["tensor"]]]
    assert "no MaxText decoder block" in export(Layout.from_rules(MESH, "batch:data"), mtf, "maxtext")


def test_maxtext_yaml_reads_back_as_the_overrides():
    yaml = pytest.importorskip("yaml")
    graph = zoo.build("gpt", layers=4, batch=16)
    layout = Layout.from_rules("stage:2,data:2,model:2", "batch:data,d_ff:model,d_model:-")
    kw = {"remat": "full", "microbatches": 4, "schedule": "maxtext"}
    text = maxtext_yaml(layout, graph, **kw)
    assert yaml.safe_load(text) == maxtext_overrides(layout, graph=graph, **kw)
    assert text == export(layout, graph, "maxtext", **kw)
    assert "MaxText 0.2.5" in text and "model -> tensor" in text


def test_maxtext_overrides_are_plain_json_able_lists():
    cfg = maxtext_overrides(Layout.from_rules("data:2,fsdp:2,model:2", "batch:data+fsdp,d_ff:model,d_model:-"),
                            graph=GPT)
    assert json.loads(json.dumps(cfg)) == cfg
    assert cfg["data_sharding"] == [["data", "fsdp"]]
    assert ["activation_batch", ["data", "fsdp"]] in cfg["logical_axis_rules"]
    assert ["embed", []] in cfg["logical_axis_rules"]


# -- Python snippet and the front door -------------------------------------------------------------------------------

def test_python_snippet_runs_and_rebuilds_every_partition_spec():
    layout = Layout.from_rules(MESH, "batch:data+model,d_ff:model,heads:model")
    namespace = _exec(python_snippet(layout, GPT))
    assert dict(namespace["mesh"].shape) == {"data": 2, "model": 4}
    assert namespace["partition_specs"] == {t.name: layout.partition_spec(t) for t in GPT.tensors.values()}
    assert set(namespace["shardings"]) == set(GPT.tensors)
    assert namespace["logical_axis_rules"] == flax_logical_axis_rules(layout)


def test_python_snippet_of_a_per_tensor_layout_has_no_rules():
    layout = Layout.from_rules(MESH, "batch:data").with_tensor("embed", {"d_model": "model"})
    code = python_snippet(layout, GPT)
    assert "'embed': P(None, 'model')" in code
    assert "logical_axis_rules" not in code


def _ffn_graph():
    b = GraphBuilder("ffn")
    batch, d_model, d_ff = b.dim("batch", 8), b.dim("d_model", 16), b.dim("d_ff", 32)
    x = b.input("x", [batch, d_model])
    wi, wo = b.parameter("wi", [d_model, d_ff]), b.parameter("wo", [d_ff, d_model])
    h = b.einsum([x, wi], [batch, d_ff], name="h")
    y = b.einsum([b.relu(h, name="h_relu"), wo], [batch, d_model], name="y")
    return b.build(b.reduce(y, [], fn="mean", name="loss"))


_FFN = textwrap.dedent("""
    import numpy as np
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x, wi, wo = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)])

    def ffn(x, wi, wo):
        return jnp.einsum("bf,fd->bd", jax.nn.relu(jnp.einsum("bd,df->bf", x, wi)), wo)

    args = [jax.device_put(a, shardings[n]) for a, n in [(x, "x"), (wi, "wi"), (wo, "wo")]]
    assert args[1].sharding.spec == P(None, "model") and args[2].sharding.spec == P("model", None)
    y = jax.jit(ffn)(*args)
    np.testing.assert_allclose(np.asarray(y), ffn(x, wi, wo), rtol=1e-4, atol=1e-4)
    grads = jax.jit(jax.grad(lambda *a: ffn(*a).sum(), argnums=(1, 2)))(*args)
    np.testing.assert_allclose(np.asarray(grads[0]), jax.grad(lambda *a: ffn(*a).sum(), argnums=1)(x, wi, wo),
                               rtol=1e-4, atol=1e-4)
    print("ffn ok", y.sharding.spec)
""")


def test_python_snippet_runs_a_megatron_ffn_as_printed():
    """The snippet, pasted as is, places a plain JAX FFN under the Megatron layout and jit runs it (Explicit mesh
    axes, jax.make_mesh's default in JAX 0.10, reject the split contraction)."""
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model")
    code = python_snippet(layout, _ffn_graph()) + _FFN
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ffn ok" in proc.stdout


def test_export_front_door():
    layout = Layout.from_rules(MESH, "batch:data,d_ff:model")
    for fmt in FORMATS:
        assert export(layout, GPT, fmt).endswith("\n")
    assert export(layout, GPT, "python") == python_snippet(layout, GPT)
    with pytest.raises(LayoutSearchError, match="unknown export format"):
        export(layout, GPT, "toml")
    with pytest.raises(LayoutError, match="unknown remat"):
        export(layout, GPT, "flax", remat="some")
    with pytest.raises(LayoutError, match="not divisible"):
        export(Layout.from_rules("data:3", "batch:data"), GPT, "maxtext")
