"""The model zoo: builders, registry, presets, parameter counts and JSON files."""

import json

import numpy as np
import pytest
from cases import GPT_VARIANTS

from layoutsearch import zoo
from layoutsearch.errors import GraphError
from layoutsearch.ir import Graph, LayerNorm, LayerNormGrad, graph_from_json, graph_to_json, load_graph, training_graph
from layoutsearch.zoo import FLOAT_PARAMS, JSON_DIR, MODELS, STR_PARAMS, list_models, parse_overrides
from layoutsearch.zoo.export_json import export
from layoutsearch.zoo.gpt import DEFAULTS, GPT_PRESETS, OPTIONS, PUBLISHED_PARAMS, gpt_config, rotary_table

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
        # architecture options absent from meta have GPT's values
        h, f, L, dk = m["d_model"], m["d_ff"], m["layers"], m["d_kv"]
        heads, kv = m["heads"], m.get("kv_heads", m["heads"])
        bias, rms, gated = m.get("bias", 1), m.get("norm") == "rmsnorm", m.get("mlp") == "swiglu"
        attn = 2 * h * heads * dk + 2 * h * kv * dk + bias * (heads * dk + 2 * kv * dk + h)
        mlp = (3 if gated else 2) * h * f + bias * ((2 if gated else 1) * f + h)
        ln = h * (1 if rms or not bias else 2)
        layer = attn + mlp + (1 if m.get("parallel_block") else 2) * ln
        embed = m["vocab"] * (2 - m["tie_embeddings"]) * h + (m["seq"] * h if m.get("position", "learned") == "learned"
                                                                else 0)
        return L * layer + embed + ln
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
    g = zoo.build(name)
    assert g.name == name and g.meta["model"] == name
    assert g.loss is not None and g.tensors[g.loss].dims == ()
    for k, v in spec.params.items():
        if name == "gpt" and k in OPTIONS or k == "dropout":  # recorded only where it differs from GPT's (none)
            assert k not in g.meta
            continue
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
    g = zoo.build(name, **over)
    for k, v in over.items():
        assert g.meta[k] == v
        if k in g.dims:
            assert g.dims[k] == v
    assert param_count(g) != param_count(zoo.build(name))


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("sized", [False, True])
def test_parameter_count_matches_closed_form(name, sized):
    g = zoo.build(name, **(OVERRIDES[name] if sized else {}))
    assert param_count(g) == expected_params(g.meta)


def test_mtf_ffn_has_the_papers_tensors_and_params():
    g = zoo.build("mtf-ffn", batch=64, io=256, hidden=1024)
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
    g = zoo.build(name, layers=2)
    assert g.tensors["layer.0/attn_logits"].dim_names == ("batch", "heads", "seq", "kv_seq")
    assert g.op("layer.0/attn_probs").dim == "kv_seq"
    assert g.tensors["layer.1/wq"].dim_names == ("d_model", "heads", "d_kv")
    assert g.tensors["layer.1/wo"].dim_names == ("heads", "d_kv", "d_model")


@pytest.mark.parametrize("name", ["mtf-transformer", "gpt", "moe", "mlp"])
def test_each_layer_is_a_tagged_block_with_the_same_op_names(name):
    g = zoo.build(name, layers=3)
    blocks = {op.block for op in g.ops if op.block is not None}
    assert blocks == {"layer.0", "layer.1", "layer.2"}
    for op in g.ops:
        if op.block is not None:
            assert op.name.startswith(op.block + "/")
    names = [{op.name.split("/", 1)[1] for op in g.ops if op.block == f"layer.{i}"} for i in range(3)]
    if name != "mlp":  # the mlp's first layer reads the features, the others a hidden dim
        assert names[0] == names[1] == names[2]


def test_gpt_defaults_derive_d_ff_and_d_kv():
    g = zoo.build("gpt", d_model=48, heads=6)
    assert g.meta["d_ff"] == 4 * 48 and g.meta["d_kv"] == 8
    assert g.dims["d_ff"] == 192 and g.dims["d_kv"] == 8


def test_gpt_tied_embedding_is_used_for_the_logits():
    tied = zoo.build("gpt")
    assert "softmax_w" not in tied.tensors
    assert "embed" in tied.op("logits").inputs
    untied = zoo.build("gpt", tie_embeddings=0)
    assert untied.tensors["softmax_w"].dim_names == ("d_model", "vocab")
    assert param_count(untied) - param_count(tied) == 128 * 32


def test_gpt3_175b_preset_has_175b_parameters_and_builds_96_layers():
    g = zoo.build("gpt", preset="gpt3-175b")
    assert g.meta["layers"] == 96 and g.meta["d_model"] == 12288 and g.meta["d_kv"] == 128
    assert g.meta["preset"] == "gpt3-175b"
    assert len({op.block for op in g.ops if op.block}) == 96
    n = param_count(g)
    assert n == expected_params(g.meta)
    assert abs(n / 175e9 - 1) < 0.02


@pytest.mark.parametrize("preset", list(GPT_PRESETS))
def test_every_preset_matches_its_published_parameter_count(preset):
    g = zoo.build("gpt", preset=preset)
    n = param_count(g)
    assert n == expected_params(g.meta)
    # Papers round; Narayanan et al.'s "1.7B" is 1.65B by their own formula.
    assert abs(n / PUBLISHED_PARAMS[preset] - 1) < 0.03, (preset, n)


def test_preset_values_can_be_overridden():
    g = zoo.build("gpt", preset="megatron-1t", layers=2, batch=4)
    assert g.meta["layers"] == 2 and g.meta["batch"] == 4
    assert g.meta["d_model"] == 25600 and g.meta["heads"] == 160 and g.meta["d_kv"] == 160


def test_moe_expert_weights_have_an_experts_dim():
    g = zoo.build("moe", experts=8, seq=16)
    assert g.meta["capacity"] == 4  # top-2, capacity factor 1: 2 * 16 / 8
    assert g.tensors["layer.0/wi"].dim_names == ("experts", "d_model", "d_ff")
    assert g.tensors["layer.0/wo"].dim_names == ("experts", "d_ff", "d_model")
    assert g.tensors["layer.0/expert_in"].dim_names == ("experts", "batch", "capacity", "d_model")
    assert g.tensors["layer.0/combine"].dim_names == ("batch", "seq", "experts", "capacity")


def test_mlp_alternates_hidden_dims():
    g = zoo.build("mlp", layers=3)
    assert [g.tensors[f"layer.{i}/w"].dim_names for i in range(3)] == [
        ("features", "hidden"), ("hidden", "hidden2"), ("hidden2", "hidden")]
    assert g.tensors["labels"].dtype == "int32" and g.tensors["labels"].dim_names == ("batch",)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_json_round_trip_is_exact(name):
    g = zoo.build(name, **OVERRIDES[name])
    assert graph_from_json(graph_to_json(g)) == g


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_json_files_equal_the_defaults(name):
    path = JSON_DIR / f"{name}.json"
    assert load_graph(path) == zoo.build(name)
    assert zoo.load(str(path)) == zoo.build(name)


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
    g = zoo.load("gpt", parse_overrides(["preset=gpt3-small", "layers=1"]))
    assert g.meta["d_model"] == 768 and g.meta["layers"] == 1


def test_dtype_applies_to_floats_only():
    g = zoo.build("gpt", dtype="bfloat16")
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
        zoo.build(name, **over)


def test_unknown_model_lists_the_zoo():
    with pytest.raises(GraphError, match=r"unknown model 'bert' \(zoo models: mtf-ffn, mtf-transformer, gpt"):
        zoo.build("bert")
    with pytest.raises(GraphError, match="not a zoo model .* nor a graph file"):
        zoo.load("bert")


def test_overrides_with_a_graph_file_are_refused():
    with pytest.raises(GraphError, match="is a graph file; size overrides"):
        zoo.load(str(JSON_DIR / "gpt.json"), {"batch": 2})
    assert zoo.load(str(JSON_DIR / "gpt.json"), {}) == zoo.build("gpt")


# -- modern decoders: the gpt builder's architecture options ---------------------------------------

GPT_DEFAULT_OPTIONS = {"d_kv": 8, "kv_heads": 4, "mlp": "gelu", "norm": "layernorm", "position": "learned",
                       "bias": 1, "parallel_block": 0, "tie_embeddings": 1}


def test_gpt_options_at_their_defaults_give_the_gpt_graph_and_its_json_file():
    g = zoo.build("gpt", **GPT_DEFAULT_OPTIONS)
    assert g == zoo.build("gpt")
    assert graph_to_json(g) + "\n" == (JSON_DIR / "gpt.json").read_text()
    assert not any(k in g.meta for k in OPTIONS)
    assert {k: gpt_config()[k] for k in GPT_DEFAULT_OPTIONS} == GPT_DEFAULT_OPTIONS


def test_gpt_options_are_listed_and_string_options_parse_as_strings():
    params = MODELS["gpt"].params
    for k in ("d_kv", "kv_heads", "mlp", "norm", "position", "bias", "parallel_block", "tie_embeddings"):
        assert k in params and params[k] == DEFAULTS[k]
    assert {"mlp", "norm", "position"} <= STR_PARAMS
    assert parse_overrides(["mlp=swiglu", "norm=rmsnorm", "position=rotary", "kv_heads=2", "bias=0"]) == {
        "mlp": "swiglu", "norm": "rmsnorm", "position": "rotary", "kv_heads": 2, "bias": 0}
    g = zoo.load("gpt", parse_overrides(["mlp=swiglu", "norm=rmsnorm", "heads=8", "kv_heads=2"]))
    assert g.meta["mlp"] == "swiglu" and g.meta["kv_heads"] == 2


@pytest.mark.parametrize("variant", list(GPT_VARIANTS))
def test_gpt_variants_build_count_and_round_trip(variant):
    g = zoo.build("gpt", **GPT_VARIANTS[variant])
    assert param_count(g) == expected_params(g.meta)
    assert graph_from_json(graph_to_json(g)) == g
    train = training_graph(g, "adam")
    assert graph_from_json(graph_to_json(train)) == train
    for k, v in GPT_VARIANTS[variant].items():
        assert gpt_config(**GPT_VARIANTS[variant])[k] == v


def test_gpt_head_dim_is_independent_of_d_model():
    g = zoo.build("gpt", d_model=32, heads=3, d_kv=16)   # 3 does not divide 32: fine with d_kv given
    assert g.dims["d_kv"] == 16 and g.tensors["layer.0/wq"].dim_names == ("d_model", "heads", "d_kv")
    assert param_count(g) == expected_params(g.meta)


def test_gpt_grouped_query_attention_dims():
    g = zoo.build("gpt", d_model=32, heads=8, kv_heads=2, d_kv=8)
    assert g.dims["kv_heads"] == 2 and g.dims["q_per_kv"] == 4 and "heads" not in g.dims
    shapes = {
        "layer.0/wq": ("d_model", "kv_heads", "q_per_kv", "d_kv"),
        "layer.0/q": ("batch", "seq", "kv_heads", "q_per_kv", "d_kv"),
        "layer.0/wk": ("d_model", "kv_heads", "d_kv"), "layer.0/wv": ("d_model", "kv_heads", "d_kv"),
        "layer.0/k": ("batch", "kv_seq", "kv_heads", "d_kv"), "layer.0/v": ("batch", "kv_seq", "kv_heads", "d_kv"),
        "layer.0/attn_logits": ("batch", "kv_heads", "q_per_kv", "seq", "kv_seq"),
        "layer.0/attn_context": ("batch", "seq", "kv_heads", "q_per_kv", "d_kv"),
        "layer.0/wo": ("kv_heads", "q_per_kv", "d_kv", "d_model"),
        "layer.0/wq_bias": ("kv_heads", "q_per_kv", "d_kv"), "layer.0/wk_bias": ("kv_heads", "d_kv"),
    }
    for t, dims in shapes.items():
        assert g.tensors[t].dim_names == dims, t
    # multi-query: one KV head; kv_heads == heads: the multi-head graph
    mqa = zoo.build("gpt", heads=4, kv_heads=1)
    assert mqa.dims["kv_heads"] == 1 and mqa.dims["q_per_kv"] == 4
    assert zoo.build("gpt", heads=4, kv_heads=4) == zoo.build("gpt")


def test_gpt_swiglu_mlp():
    g = zoo.build("gpt", mlp="swiglu", d_ff=48)
    for w in ("wi_gate", "wi_up"):
        assert g.tensors[f"layer.0/{w}"].dim_names == ("d_model", "d_ff")
    assert "layer.0/wi" not in g.tensors
    assert g.op("layer.0/ff_act").fn == "silu" and g.op("layer.0/ff_act").inputs == ("layer.0/ff_gate_biased",)
    assert g.op("layer.0/ff_gated").fn == "mul"
    assert g.op("layer.0/ff_out").inputs[0] == "layer.0/ff_gated"
    no_bias = zoo.build("gpt", mlp="swiglu", bias=0)
    assert no_bias.op("layer.0/ff_gated").inputs == ("layer.0/ff_act", "layer.0/ff_up")
    assert zoo.build("gpt", mlp="relu").op("layer.0/ff_act").fn == "relu"


def test_gpt_rmsnorm_and_no_bias():
    g = zoo.build("gpt", norm="rmsnorm")
    norms = [op for op in g.ops if isinstance(op, LayerNorm)]
    assert len(norms) == 2 * 2 + 1 and all(not op.center for op in norms)
    assert not any(t.endswith("ln_attn_bias") or t.endswith("final_ln_bias") for t in g.tensors)  # scale only
    assert "layer.0/wq_bias" in g.tensors                                                    # projections keep theirs
    grads = [op for op in training_graph(g).ops if isinstance(op, LayerNormGrad)]
    assert len(grads) == 5 and all(not op.center for op in grads)
    plain = zoo.build("gpt", bias=0)
    assert not [t for t in plain.tensors if t.endswith("_bias")]
    assert all(op.center for op in plain.ops if isinstance(op, LayerNorm))


def test_layer_norm_center_is_written_only_when_false_and_old_files_read_as_layer_norm():
    doc = json.loads(graph_to_json(zoo.build("gpt", norm="rmsnorm")))
    norms = [op for op in doc["ops"] if op["kind"] == "layer_norm"]
    assert norms and all(op["center"] is False for op in norms)
    old = json.loads((JSON_DIR / "gpt.json").read_text())
    assert all("center" not in op for op in old["ops"])
    assert all(op.center for op in load_graph(JSON_DIR / "gpt.json").ops if isinstance(op, LayerNorm))
    bad = json.loads(graph_to_json(zoo.build("gpt")))
    next(op for op in bad["ops"] if op["kind"] == "layer_norm")["center"] = "no"
    with pytest.raises(GraphError, match="center must be true or false"):
        graph_from_json(json.dumps(bad))


def test_gpt_parallel_block_has_one_norm_per_layer():
    g = zoo.build("gpt", parallel_block=1, layers=2)
    assert "layer.0/ln" in g.tensors and "layer.0/ln_attn" not in g.tensors and "layer.0/ln_ff" not in g.tensors
    assert g.op("layer.0/q").inputs[0] == "layer.0/ln_biased" == g.op("layer.0/ff_in").inputs[0]
    assert g.op("layer.0/attn_residual").inputs == ("embedded", "layer.0/attn_out_biased")
    assert g.op("layer.0/ff_residual").inputs == ("layer.0/attn_residual", "layer.0/ff_out_biased")
    assert param_count(g) == expected_params(g.meta)


def test_gpt_positions_none_and_rotary():
    none = zoo.build("gpt", position="none")
    assert "pos_embed" not in none.tensors and none.op("embedded").kind == "gather"
    g = zoo.build("gpt", position="rotary", heads=2, layers=1)   # d_kv 16
    assert g.tensors["rope"].role == "input"
    assert g.tensors["rope"].dim_names == ("seq", "rope_out", "rope_half", "rope_freq")
    assert g.tensors["rope_kv"].dim_names == ("kv_seq", "rope_out", "rope_half", "rope_freq")
    assert g.dims["rope_freq"] == 8 and "pos_embed" not in g.tensors
    assert g.op("layer.0/q_scaled").inputs == ("layer.0/q_rot",)
    assert g.op("layer.0/attn_logits").inputs == ("layer.0/q_scaled", "layer.0/k_rot")


def test_rotary_is_the_llama_rotation():
    """With :func:`rotary_table`, the graph's rotated queries and keys are Llama's
    ``x * cos + rotate_half(x) * sin`` (GPT-NeoX pairing), position by position."""
    from layoutsearch.backend.program import init_params, random_inputs, run_graph

    g = zoo.build("gpt", **GPT_VARIANTS["gpt-llama"])
    seq, d_kv = g.dims["seq"], g.dims["d_kv"]
    feeds = {**init_params(g), **random_inputs(g), "rope": rotary_table(seq, d_kv)}
    env = run_graph(g, feeds)
    inv = 10000.0 ** (-np.arange(0, d_kv, 2) / d_kv)
    angle = np.arange(seq)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1)            # [seq, d_kv]
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1)

    def rope(x, seq_axis):                                        # x[..., d_kv], positions along seq_axis
        half = d_kv // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        shape = [1] * x.ndim
        shape[seq_axis], shape[-1] = seq, d_kv
        return x * cos.reshape(shape) + rotated * sin.reshape(shape)

    for name in ("q", "k"):
        x = np.asarray(env[f"layer.0/{name}"])
        np.testing.assert_allclose(env[f"layer.0/{name}_rot"], rope(x, 1), rtol=1e-5, atol=1e-5)
    # a rotation keeps the norm of every pair
    q, q_rot = np.asarray(env["layer.0/q"]), np.asarray(env["layer.0/q_rot"])
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(q_rot, axis=-1), rtol=1e-5)


# Table 1 of Touvron et al. 2023, Table 3 of Dubey et al. 2024, the MaxText README table
MODERN_PRESETS = {
    "llama2-7b": (32, 4096, 32, 32, 11008, 32000, 4096, 1024),
    "llama2-13b": (40, 5120, 40, 40, 13824, 32000, 4096, 1024),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000, 4096, 1024),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, 2048),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192, 2048),
    "llama3-405b": (126, 16384, 128, 8, 53248, 128256, 8192, 2048),
    "maxtext-16b": (32, 4096, 64, 64, 28672, 32000, 2048, 6 * 256),
    "maxtext-32b": (32, 8192, 64, 64, 28672, 32000, 2048, 4 * 256),
    "maxtext-64b": (64, 8192, 64, 64, 28672, 32000, 2048, 2 * 256),
    "maxtext-128b": (64, 8192, 128, 128, 57344, 32000, 2048, 1 * 256),
}


@pytest.mark.parametrize("preset", list(MODERN_PRESETS))
def test_modern_presets_have_their_published_shapes(preset):
    cfg = gpt_config(preset)
    layers, d_model, heads, kv_heads, d_ff, vocab, seq, batch = MODERN_PRESETS[preset]
    assert (cfg["layers"], cfg["d_model"], cfg["heads"], cfg["kv_heads"], cfg["d_ff"], cfg["vocab"], cfg["seq"],
            cfg["batch"]) == MODERN_PRESETS[preset]
    assert cfg["d_kv"] == 128 and cfg["vocab"] % 128 == 0
    assert (cfg["mlp"], cfg["norm"], cfg["position"], cfg["bias"], cfg["tie_embeddings"], cfg["parallel_block"]) == (
        "swiglu", "rmsnorm", "rotary", 0, 0, 0)


def test_exact_parameter_counts_of_released_checkpoints():
    """The graph has exactly the parameters of the released models (Hugging Face counts)."""
    for preset, n in {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
                      "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496}.items():
        assert param_count(zoo.build("gpt", preset=preset)) == n, preset


@pytest.mark.parametrize("over, match", [
    ({"mlp": "geglu"}, "mlp must be one of gelu, relu, swiglu, got 'geglu'"),
    ({"norm": "batchnorm"}, "norm must be one of layernorm, rmsnorm, got 'batchnorm'"),
    ({"position": "alibi"}, "position must be one of learned, none, rotary, got 'alibi'"),
    ({"mlp": 3}, "mlp must be a string, got 3"),
    ({"heads": 8, "kv_heads": 3}, r"kv_heads=3 does not divide heads=8 .*kv_heads that divide it: 1, 2, 4, 8"),
    ({"kv_heads": 0}, "kv_heads must be a positive integer, got 0"),
    ({"heads": 4, "kv_heads": 8}, "kv_heads=8 does not divide heads=4"),
    ({"d_kv": 0}, "d_kv must be a positive integer, got 0"),
    ({"d_kv": -2}, "d_kv must be a positive integer, got -2"),
    ({"bias": 2}, "bias must be 0 or 1, got 2"),
    ({"parallel_block": -1}, "parallel_block must be 0 or 1, got -1"),
    ({"position": "rotary", "d_kv": 7}, r"position='rotary' rotates pairs of features: d_kv=7 must be even"),
    ({"d_model": 30, "heads": 4}, r"heads=4 does not divide d_model=30.*\(or set the head dim d_kv\)"),
])
def test_bad_gpt_options_raise_one_clear_error(over, match):
    with pytest.raises(GraphError, match=match):
        zoo.build("gpt", **over)


# -- dropout --------------------------------------------------------------------------------------------------------

def test_gpt_dropout_is_a_listed_number_and_leaves_the_graph_unchanged_at_zero():
    assert MODELS["gpt"].params["dropout"] == 0.0 and MODELS["mtf-transformer"].params["dropout"] == 0.0
    assert "dropout" in FLOAT_PARAMS and "dropout" not in STR_PARAMS
    assert parse_overrides(["dropout=0.1", "layers=2"]) == {"dropout": 0.1, "layers": 2}
    assert parse_overrides(["dropout=0"]) == {"dropout": 0.0}
    for name in ("gpt", "mtf-transformer"):
        assert zoo.build(name, dropout=0) == zoo.build(name) == zoo.build(name, dropout=0.0)
        assert graph_to_json(zoo.build(name, dropout="0")) + "\n" == (JSON_DIR / f"{name}.json").read_text()


@pytest.mark.parametrize("name", ["gpt", "mtf-transformer"])
def test_dropout_drops_the_attention_probabilities_and_both_residual_branches(name):
    base, g = zoo.build(name, layers=2), zoo.build(name, layers=2, dropout=0.1)
    assert g.meta["dropout"] == 0.1 and "dropout" not in base.meta
    assert param_count(g) == param_count(base)
    added = [op.name for op in g.ops if op.name not in {o.name for o in base.ops}]
    assert added == [f"layer.{i}/{site}_{what}" for i in range(2) for site in ("attn_probs", "attn_out", "ff_out")
                     for what in ("dropout_mask", "masked", "dropped")]
    assert g.tensors["layer.0/attn_probs_dropout_mask"].dtype == "uint8"  # a byte mask, as PyTorch keeps it
    for i in range(2):
        assert g.op(f"layer.{i}/attn_context").inputs[0] == f"layer.{i}/attn_probs_dropped"
        assert g.op(f"layer.{i}/attn_residual").inputs[1] == f"layer.{i}/attn_out_dropped"
        assert g.op(f"layer.{i}/ff_residual").inputs[1] == f"layer.{i}/ff_out_dropped"
    train = training_graph(g, "adam")
    assert graph_from_json(graph_to_json(train)) == train


@pytest.mark.parametrize("items, match", [
    (["dropout=abc"], "override 'dropout=abc': dropout must be a number, got 'abc'"),
    (["dropout="], "malformed override"),
])
def test_bad_dropout_overrides_are_named(items, match):
    with pytest.raises(GraphError, match=match):
        parse_overrides(items)


@pytest.mark.parametrize("name", ["gpt", "mtf-transformer"])
@pytest.mark.parametrize("value, match", [
    (1.0, r"dropout must be a number in \[0, 1\), got 1.0"),
    (-0.1, r"dropout must be a number in \[0, 1\), got -0.1"),
    (float("nan"), r"dropout must be a number in \[0, 1\), got nan"),
    ("abc", "dropout must be a number, got 'abc'"),
    (True, "dropout must be a number, got True"),
])
def test_bad_dropout_raises_one_clear_error(name, value, match):
    with pytest.raises(GraphError, match=match):
        zoo.build(name, dropout=value)
    if isinstance(value, float):  # the same through the command line's --set
        with pytest.raises(GraphError, match=match):
            zoo.load(name, parse_overrides([f"dropout={value}"]))
