"""A MaxText run read in (``cost|search --maxtext CONFIG.yml [key=value ...]``): the graph with MaxText's
shapes, the mesh and the layout its rules give, checked against the hand-built published MaxText rows and,
in the MaxText tier (tests/test_maxtext.py), against MaxText's own loader."""

from __future__ import annotations

import pytest

from layoutsearch import zoo
from layoutsearch.costmodel.report import estimate
from layoutsearch.errors import LayoutError
from layoutsearch.ir.serialize import graph_to_dict
from layoutsearch.layout import Layout
from layoutsearch.maxtext.config_in import read_maxtext_run
from layoutsearch.mesh import hardware
from layoutsearch.published import RUNS, predict
from tests.clirun import run, run_json

MAXTEXT_ROWS = [r for r in RUNS if r.source.startswith("MaxText") and r.name.endswith((" x1", " x32"))]


def _published_config(run_, tmp_path):
    """The published row as the MaxText config that ran it (docs/published-runs.md section 2)."""
    scale = run_.sizes["preset"].split("-")[1][:-1]
    slices = int(run_.name.rsplit("x", 1)[1])
    per_device = run_.sizes["batch"] // (256 * slices)
    mesh = ("ici_fsdp_parallelism: 16\nici_tensor_parallelism: 16\n" if scale == "128"
            else "ici_fsdp_parallelism: 256\n")
    path = tmp_path / f"maxtext-{scale}b-x{slices}.yml"
    path.write_text(f"base_config: base.yml\nglobal_parameter_scale: {scale}\nper_device_batch_size: {per_device}\n"
                    f"remat_policy: full\n{mesh}dcn_data_parallelism: {slices}\nnum_slices: {slices}\n")
    return path


def _meta_free(graph):
    d = graph_to_dict(graph)
    d.pop("meta")
    return d


@pytest.mark.parametrize("row", MAXTEXT_ROWS, ids=lambda r: r.name)
def test_published_maxtext_rows_as_configs_are_the_hand_built_rows(row, tmp_path, monkeypatch):
    monkeypatch.delenv("LAYOUTSEARCH_MAXTEXT_PYTHON", raising=False)
    mt = read_maxtext_run(str(_published_config(row, tmp_path)))
    hand = zoo.build(row.model, **row.sizes)
    assert _meta_free(mt.graph) == _meta_free(hand)
    assert (mt.remat, mt.microbatches) == (row.remat, 1)
    layout = Layout.from_rules(row.mesh, row.layout)
    sizes = dict(layout.mesh.axes)
    for t in hand.tensors.values():  # the same split of every tensor but MaxText's RMSNorm scales (rule 'norm')
        want = {d: tuple(x for x in a if sizes[x] > 1) for d, a in layout.dim_layout(t).items()}
        want = {d: a for d, a in want.items() if a}
        got = mt.layout.dim_layout(mt.graph.tensors[t.name])
        if t.name.endswith(("ln_attn_scale", "ln_ff_scale", "final_ln_scale")):
            assert got == ({"d_model": ("tensor",)} if sizes.get("tensor", 1) > 1 else {}), t.name  # norm -> tensor
            continue
        assert got == want, t.name
    hw = hardware(row.hardware)
    rep = estimate(mt.graph, mt.layout, hw, remat=mt.remat, attention=row.attention, precision=row.precision,
                   overlap=row.overlap)
    p = predict(row)
    assert rep.step_s == pytest.approx(p["predicted_step_s"], rel=1e-3)  # (the norms' split: < 0.04%)
    assert rep.memory_bytes == pytest.approx(p["memory_bytes"], rel=1e-3)


def test_a_maxtext_run_reads_model_name_overrides_and_rules(tmp_path, monkeypatch):
    monkeypatch.delenv("LAYOUTSEARCH_MAXTEXT_PYTHON", raising=False)
    cfg = tmp_path / "llama.yml"
    cfg.write_text("base_config: base.yml\nmodel_name: llama3-8b\nper_device_batch_size: 4\n"
                   "max_target_length: 4096\nici_fsdp_parallelism: 16\nici_tensor_parallelism: 4\n")
    mt = read_maxtext_run(str(cfg), ["per_device_batch_size=2", "gradient_accumulation_steps=2",
                                     "remat_policy=minimal"])
    assert mt.graph.dims["d_model"] == 4096 and mt.graph.dims["kv_heads"] == 8 and mt.graph.dims["vocab"] == 128256
    assert mt.graph.dims["batch"] == 2 * 64 * 2 and mt.graph.dims["seq"] == 4096
    assert (mt.remat, mt.microbatches) == ("selective", 2)
    assert str(mt.layout.mesh) == "fsdp:16,tensor:4" and not mt.layout.tensors
    assert mt.layout.describe() == "batch:fsdp,kv_heads:tensor,d_ff:tensor,vocab:tensor,d_model:tensor,d_model:fsdp"
    # the command line's rules merge behind the base rules; with override_logical_axis_rules they replace them
    merged = read_maxtext_run(str(cfg), ["logical_axis_rules=[[activation_embed,[]]]"])
    carry = merged.graph.tensors["layer.0/ff_residual"]
    assert merged.layout.dim_layout(carry) == {"batch": ("fsdp",)}  # activation_embed -> [] merged in
    assert mt.layout.dim_layout(carry) == {"batch": ("fsdp",), "d_model": ("tensor",)}
    # a scanned layer is always checkpointed: remat_policy none prices as full, with a note
    scanned = read_maxtext_run(str(cfg), ["remat_policy=none"])
    assert scanned.remat == "full" and "still checkpoints" in scanned.notes[0]
    assert read_maxtext_run(str(cfg), ["remat_policy=none", "scan_layers=false"]).remat == "none"


@pytest.mark.parametrize(("text", "extra", "message"), [
    ("base_config: base.yml\nmodel_name: llama9-1b\n", [], "unknown MaxText model_name 'llama9-1b'"),
    ("base_config: base.yml\nnot_a_key: 1\nici_fsdp_parallelism: 8\n", [], "has no key 'not_a_key'"),
    ("base_config: base.yml\nici_fsdp_parallelism: 8\n", ["nokey=3"], "the command line: MaxText 0.2.5 has no key"),
    ("base_config: base.yml\n", [], "give the number of devices"),
    ("base_config: base.yml\nici_fsdp_parallelism: 8\n: [\n", [], "does not parse"),
    ("base_config: base.yml\nici_fsdp_parallelism: 8\ndecoder_block: deepseek\n", [], "decoder_block 'deepseek'"),
    ("base_config: other.yml\n", [], "neither a file beside it"),
    ("base_config: base.yml\nmodel_name: llama3-8b\nici_fsdp_parallelism: 8\n", ["base_emb_dim=1024"],
     "set by both model 'llama3-8b' and the command line"),
])
def test_a_bad_maxtext_config_is_one_clear_error(tmp_path, monkeypatch, text, extra, message):
    monkeypatch.delenv("LAYOUTSEARCH_MAXTEXT_PYTHON", raising=False)
    path = tmp_path / "run.yml"
    path.write_text(text)
    with pytest.raises(LayoutError, match=message):
        read_maxtext_run(str(path), extra)


def test_cost_and_search_take_a_maxtext_run(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("LAYOUTSEARCH_MAXTEXT_PYTHON", raising=False)
    path = tmp_path / "small.yml"
    path.write_text("base_config: base.yml\nbase_emb_dim: 256\nbase_num_query_heads: 4\nbase_num_kv_heads: 2\n"
                    "base_mlp_dim: 512\nbase_num_decoder_layers: 2\nhead_dim: 64\nvocab_size: 1024\n"
                    "max_target_length: 128\nper_device_batch_size: 4\nici_fsdp_parallelism: 8\n")
    cost = run_json(capsys, "cost", "--maxtext", path, "ici_fsdp_parallelism=4", "ici_tensor_parallelism=2",
                    "--hardware", "tpu-v5p")
    assert cost["maxtext"]["mesh"] == "fsdp:4,tensor:2" and cost["step_s"] > 0 and cost["remat"] == "full"
    found = run_json(capsys, "search", "--maxtext", path, "--hardware", "tpu-v5p", "--top", "1")
    mt = found["maxtext"]
    assert found["target"] == "maxtext" and mt["current"]["step_s"] >= found["step_s"]
    assert "logical_axis_rules" in mt["override"] and mt["speedup"] >= 1
    code, text, _ = run(capsys, "search", "--maxtext", path, "--hardware", "tpu-v5p", "--top", "1")
    assert code == 0 and "your MaxText run as it is" in text and "the MaxText override to apply" in text
    piped = tmp_path / "piped.yml"
    piped.write_text(path.read_text().replace("base_num_decoder_layers: 2", "base_num_decoder_layers: 4")
                     .replace("ici_fsdp_parallelism: 8", "ici_fsdp_parallelism: 4\nici_pipeline_parallelism: 2\n"
                              "num_layers_per_pipeline_stage: 2\nnum_pipeline_microbatches: 4"))
    cost = run_json(capsys, "cost", "--maxtext", piped, "--hardware", "tpu-v5p")
    assert cost["schedule"] == "maxtext" and cost["stages"] == 2 and cost["microbatches"] == 4
    found = run_json(capsys, "search", "--maxtext", piped, "--hardware", "tpu-v5p", "--top", "1")
    assert any(d["kind"] == "pipeline" and "over stage" in d["option"] for d in found["decisions"])
    for argv, message in [(["cost", "gpt", "--maxtext", path], "drop MODEL"),
                          (["cost", "--hardware", "tpu-v5p"], "give a MODEL"),
                          (["cost", "--maxtext", path, "--remat", "full"], "come from the MaxText config"),
                          (["cost", "--maxtext", tmp_path / "none.yml"], "no MaxText config file"),
                          (["cost", "gpt"], "--mesh is required")]:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)


def test_an_exported_plan_read_back_is_the_plan(tmp_path, monkeypatch):
    """export --format maxtext, then read as a MaxText run: the same graph, mesh, layout and decisions (a
    pipeline too)."""
    from layoutsearch.export import export

    monkeypatch.delenv("LAYOUTSEARCH_MAXTEXT_PYTHON", raising=False)
    graph = zoo.build("gpt", preset="llama3-8b", layers=4, d_model=256, heads=4, kv_heads=2, d_ff=512, vocab=1024,
                      seq=128, batch=32)
    cases = [(Layout.from_rules("fsdp:4,tensor:2", "batch:fsdp,kv_heads:tensor,d_ff:tensor,d_model:fsdp"),
              {"remat": "selective", "microbatches": 2}),
             (Layout.from_rules("stage:2,fsdp:4", "batch:fsdp,d_model:fsdp"),
              {"remat": "full", "microbatches": 4, "stage_axis": "stage", "schedule": "maxtext"})]
    for layout, kw in cases:
        path = tmp_path / "plan.yml"
        path.write_text("base_config: base.yml\n" + export(layout, graph, "maxtext", **kw))
        mt = read_maxtext_run(str(path))
        assert _meta_free(mt.graph) == _meta_free(graph) and mt.layout.mesh == layout.mesh
        assert (mt.remat, mt.microbatches, mt.stage_axis) == (kw["remat"], kw["microbatches"], kw.get("stage_axis"))
        for t in graph.tensors.values():
            assert mt.layout.dim_layout(t) == layout.dim_layout(t), t.name
    circular = tmp_path / "circular.yml"
    circular.write_text(path.read_text().replace("num_layers_per_pipeline_stage: 2", "num_layers_per_pipeline_stage: 1"))
    with pytest.raises(LayoutError, match="circular MaxText pipeline"):
        read_maxtext_run(str(circular))
