"""The model zoo: builders, registry, presets, parameter counts and JSON files."""

import pytest

from graphs import JSON_DIR, MODELS, build_model, list_models, load_model, parse_overrides
from graphs.export_json import export
from graphs.gpt import GPT_PRESETS, PUBLISHED_PARAMS
from layoutsearch.errors import GraphError
from layoutsearch.ir import Graph, graph_from_json, graph_to_json, load_graph

MODEL_NAMES = list(MODELS)

# Non-default sizes per model (all different from the defaults).
OVERRIDES = {
    "mtf-ffn": {"batch": 4, "io": 8, "hidden": 24},
    "mtf-transformer": {"batch": 2, "seq": 8, "vocab": 50, "d_model": 16, "heads": 2, "d_kv": 6, "d_ff": 40,
                        "layers": 3},
    "gpt": {"batch": 2, "seq": 8, "vocab": 50, "d_model": 24, "heads": 3, "d_ff": 40, "layers": 3,
            "tie_embeddings": 0},
    "moe": {"batch": 2, "seq": 8, "d_model": 16, "d_ff": 24, "experts": 8, "capacity": 3, "layers": 3},
    "mlp": {"batch": 4, "features": 12, "hidden": 20, "classes": 5, "layers": 4},
}


def param_count(g: Graph) -> int:
    return sum(t.num_elements for t in g.parameters)


def expected_params(m: dict) -> int:
    """Closed-form parameter count of a zoo graph from its meta."""
    name = m["model"]
    if name == "mtf-ffn":
        return 2 * m["io"] * m["hidden"]
    if name == "mtf-transformer":
        d, L = m["d_model"], m["layers"]
        return 2 * m["vocab"] * d + L * (4 * d * m["heads"] * m["d_kv"] + 2 * d * m["d_ff"] + 2 * d) + d
    if name == "gpt":
        h, f, L = m["d_model"], m["d_ff"], m["layers"]
        layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        embed = (m["vocab"] * (2 - m["tie_embeddings"]) + m["seq"]) * h
        return L * layer + embed + 2 * h
    if name == "moe":
        d, e = m["d_model"], m["experts"]
        return m["layers"] * (d * e + 2 * e * d * m["d_ff"] + d)
    if name == "mlp":
        h, L = m["hidden"], m["layers"]
        return m["features"] * h + (L - 1) * h * h + h * m["classes"] + L * h + m["classes"]
    raise AssertionError(name)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_builds_with_defaults_and_describes_itself(name):
    spec = MODELS[name]
    g = build_model(name)
    assert g.name == name and g.meta["model"] == name
    assert g.loss is not None and g.tensors[g.loss].dims == ()
    for k, v in spec.params.items():
        assert k in g.meta
        if v is not None:
            assert g.meta[k] == v
    for k, v in g.meta.items():
        if k in g.dims:
            assert g.dims[k] == v, k
    assert g.parameters and g.inputs


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_overrides_change_sizes_and_meta(name):
    over = OVERRIDES[name]
    g = build_model(name, **over)
    for k, v in over.items():
        assert g.meta[k] == v
        if k in g.dims:
            assert g.dims[k] == v
    assert param_count(g) != param_count(build_model(name))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("sized", [False, True])
def test_parameter_count_matches_closed_form(name, sized):
    g = build_model(name, **(OVERRIDES[name] if sized else {}))
    assert param_count(g) == expected_params(g.meta)


def test_mtf_ffn_has_the_papers_tensors_and_params():
    g = build_model("mtf-ffn", batch=64, io=256, hidden=1024)
    for t in ("x", "target", "w", "v", "h", "y"):
        assert t in g.tensors
    assert g.tensors["w"].dim_names == ("io", "hidden")
    assert g.tensors["v"].dim_names == ("hidden", "io")
    assert g.tensors["h"].dim_names == ("batch", "hidden")
    assert g.tensors["y"].dim_names == ("batch", "io")
    assert param_count(g) == 2 * 256 * 1024
    assert {t.name for t in g.parameters} == {"w", "v"}
    assert set(g.dims) == {"batch", "io", "hidden"}


@pytest.mark.parametrize("name", ["mtf-transformer", "gpt"])
def test_attention_has_heads_and_kv_seq(name):
    g = build_model(name, layers=2)
    assert g.tensors["layer.0/attn_logits"].dim_names == ("batch", "heads", "seq", "kv_seq")
    assert g.op("layer.0/attn_probs").dim == "kv_seq"
    assert g.tensors["layer.1/wq"].dim_names == ("d_model", "heads", "d_kv")
    assert g.tensors["layer.1/wo"].dim_names == ("heads", "d_kv", "d_model")


@pytest.mark.parametrize("name", ["mtf-transformer", "gpt", "moe", "mlp"])
def test_each_layer_is_a_tagged_block_with_the_same_op_names(name):
    g = build_model(name, layers=3)
    blocks = {op.block for op in g.ops if op.block is not None}
    assert blocks == {"layer.0", "layer.1", "layer.2"}
    for op in g.ops:
        if op.block is not None:
            assert op.name.startswith(op.block + "/")
    names = [{op.name.split("/", 1)[1] for op in g.ops if op.block == f"layer.{i}"} for i in range(3)]
    if name != "mlp":  # the mlp's first layer reads the features, the others a hidden dim
        assert names[0] == names[1] == names[2]


def test_gpt_defaults_derive_d_ff_and_d_kv():
    g = build_model("gpt", d_model=48, heads=6)
    assert g.meta["d_ff"] == 4 * 48 and g.meta["d_kv"] == 8
    assert g.dims["d_ff"] == 192 and g.dims["d_kv"] == 8


def test_gpt_tied_embedding_is_used_for_the_logits():
    tied = build_model("gpt")
    assert "softmax_w" not in tied.tensors
    assert "embed" in tied.op("logits").inputs
    untied = build_model("gpt", tie_embeddings=0)
    assert untied.tensors["softmax_w"].dim_names == ("d_model", "vocab")
    assert param_count(untied) - param_count(tied) == 128 * 32


def test_gpt3_175b_preset_has_175b_parameters_and_builds_96_layers():
    g = build_model("gpt", preset="gpt3-175b")
    assert g.meta["layers"] == 96 and g.meta["d_model"] == 12288 and g.meta["d_kv"] == 128
    assert g.meta["preset"] == "gpt3-175b"
    assert len({op.block for op in g.ops if op.block}) == 96
    n = param_count(g)
    assert n == expected_params(g.meta)
    assert abs(n / 175e9 - 1) < 0.02


@pytest.mark.parametrize("preset", list(GPT_PRESETS))
def test_every_preset_matches_its_published_parameter_count(preset):
    g = build_model("gpt", preset=preset)
    n = param_count(g)
    assert n == expected_params(g.meta)
    # Papers round; Narayanan et al.'s "1.7B" is 1.65B by their own formula.
    assert abs(n / PUBLISHED_PARAMS[preset] - 1) < 0.03, (preset, n)


def test_preset_values_can_be_overridden():
    g = build_model("gpt", preset="megatron-1t", layers=2, batch=4)
    assert g.meta["layers"] == 2 and g.meta["batch"] == 4
    assert g.meta["d_model"] == 25600 and g.meta["heads"] == 160 and g.meta["d_kv"] == 160


def test_moe_expert_weights_have_an_experts_dim():
    g = build_model("moe", experts=8, seq=16)
    assert g.meta["capacity"] == 4  # top-2, capacity factor 1: 2 * 16 / 8
    assert g.tensors["layer.0/wi"].dim_names == ("experts", "d_model", "d_ff")
    assert g.tensors["layer.0/wo"].dim_names == ("experts", "d_ff", "d_model")
    assert g.tensors["layer.0/expert_in"].dim_names == ("experts", "batch", "capacity", "d_model")
    assert g.tensors["layer.0/combine"].dim_names == ("batch", "seq", "experts", "capacity")


def test_mlp_alternates_hidden_dims():
    g = build_model("mlp", layers=3)
    assert [g.tensors[f"layer.{i}/w"].dim_names for i in range(3)] == [
        ("features", "hidden"), ("hidden", "hidden2"), ("hidden2", "hidden")]
    assert g.tensors["labels"].dtype == "int32" and g.tensors["labels"].dim_names == ("batch",)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_json_round_trip_is_exact(name):
    g = build_model(name, **OVERRIDES[name])
    assert graph_from_json(graph_to_json(g)) == g


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_json_files_equal_the_defaults(name):
    path = JSON_DIR / f"{name}.json"
    assert load_graph(path) == build_model(name)
    assert load_model(str(path)) == build_model(name)


def test_export_writes_one_file_per_model(tmp_path):
    paths = export(tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{n}.json" for n in MODEL_NAMES)
    for p in paths:
        assert p.read_text() == (JSON_DIR / p.name).read_text()


def test_list_models_and_specs():
    specs = list_models()
    assert [s.name for s in specs] == MODEL_NAMES
    assert {"mtf-ffn", "mtf-transformer", "gpt", "moe", "mlp"} <= set(MODELS)
    for s in specs:
        assert s.description and s.params
    assert MODELS["mtf-ffn"].params == {"batch": 16, "io": 32, "hidden": 64, "dtype": "float32"}
    assert "preset" in MODELS["gpt"].params


def test_parse_overrides():
    assert parse_overrides(["batch=32", "layers = 4", "preset=gpt3-175b", "dtype=bfloat16"]) == {
        "batch": 32, "layers": 4, "preset": "gpt3-175b", "dtype": "bfloat16"}
    assert parse_overrides([]) == {}
    g = load_model("gpt", parse_overrides(["preset=gpt3-small", "layers=1"]))
    assert g.meta["d_model"] == 768 and g.meta["layers"] == 1


def test_dtype_applies_to_floats_only():
    g = build_model("gpt", dtype="bfloat16")
    assert g.tensors["embed"].dtype == "bfloat16"
    assert g.tensors["ids"].dtype == "int32"


@pytest.mark.parametrize("items, match", [
    (["batch"], "malformed override 'batch'"),
    (["=3"], "malformed override"),
    (["batch="], "malformed override"),
    (["batch=abc"], "override 'batch=abc': batch must be an integer"),
    (["batch=1.5"], "batch must be an integer"),
    (["batch=2", "batch=3"], "given twice"),
])
def test_bad_override_items_are_named(items, match):
    with pytest.raises(GraphError, match=match):
        parse_overrides(items)


@pytest.mark.parametrize("name, over, match", [
    ("gpt", {"hidden": 3}, r"model 'gpt' has no parameter 'hidden' \(parameters: preset, batch"),
    ("mtf-ffn", {"batch": "abc"}, "batch must be an integer, got 'abc'"),
    ("mtf-ffn", {"batch": 2.5}, "batch must be an integer"),
    ("mtf-ffn", {"batch": 0}, "batch must be a positive integer, got 0"),
    ("gpt", {"d_model": 30, "heads": 4}, r"heads=4 does not divide d_model=30.*heads near 4 that divide it: "),
    ("gpt", {"preset": "gpt5"}, r"unknown preset 'gpt5' \(known: gpt3-small"),
    ("gpt", {"tie_embeddings": 2}, "tie_embeddings must be 0 or 1"),
    ("mlp", {"dtype": "int32"}, "dtype must be one of"),
    ("mlp", {"dtype": 3}, "dtype must be a string"),
])
def test_bad_overrides_raise_clear_errors(name, over, match):
    with pytest.raises(GraphError, match=match):
        build_model(name, **over)


def test_unknown_model_lists_the_zoo():
    with pytest.raises(GraphError, match=r"unknown model 'bert' \(zoo models: mtf-ffn, mtf-transformer, gpt"):
        build_model("bert")
    with pytest.raises(GraphError, match="not a zoo model .* nor a graph file"):
        load_model("bert")


def test_overrides_with_a_graph_file_are_refused():
    with pytest.raises(GraphError, match="is a graph file; size overrides"):
        load_model(str(JSON_DIR / "gpt.json"), {"batch": 2})
    assert load_model(str(JSON_DIR / "gpt.json"), {}) == build_model("gpt")
