"""`layoutsearch run` and `layoutsearch export`: a plan file trained on the devices present and exported."""

import json

import pytest
import yaml
from clirun import run, run_json

import layoutsearch as ls

SIZES = ["--set", "layers=2", "--set", "d_model=64", "--set", "heads=4", "--set", "seq=16", "--set", "batch=8",
         "--set", "vocab=128"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    ls.search(ls.zoo.gpt(layers=2, d_model=64, heads=4, seq=16, batch=8, vocab=128), "data:2,model:4",
              hardware="h100", remat="selective").save(path)
    return path


def test_run_a_plan_file(capsys, plan_file):
    out = run_json(capsys, "run", plan_file, "--steps", "4", "--seed", "1")
    assert out["devices"] == 8 and out["platform"] == "cpu" and out["hardware_here"] == "cpu-sim"
    assert [s["step"] for s in out["steps"]] == [1, 2, 3, 4]
    assert out["steps"][-1]["loss"] < out["steps"][0]["loss"]
    assert out["remat"] == "selective" and out["predicted"]["hardware"] == "h100"
    assert out["predicted_here"]["hardware"] == "cpu-sim" and out["measured_over_predicted"] > 0
    assert out["attention"] == "flash" and out["predicted_here"]["memory_bytes"] > 0  # as priced for the h100
    assert out["tokens_per_step"] == 8 * 16 and out["tokens_per_s"] > 0
    # the same plan from Python: identical losses
    program = ls.Plan.load(plan_file).compile()
    state = program.init(1)
    for i, s in enumerate(out["steps"]):
        state, m = program.train_step(state, program.random_batch(1 + i))
        assert float(m["loss"]) == s["loss"]
    code, text, _ = run(capsys, "run", plan_file, "--steps", "2")
    assert code == 0 and "measured step" in text and "predicted" in text and "tokens/s" in text


def test_run_a_model_searches_first(capsys):
    out = run_json(capsys, "run", "gpt", *SIZES, "--mesh", "data:8", "--steps", "3")
    assert out["mesh"] == "data:8" and len(out["steps"]) == 3 and out["predicted"]["hardware"] == "cpu-sim"
    assert out["predicted_here"] is None and out["measured_over_predicted"] > 0
    assert out["attention"] == "standard"  # as priced for cpu-sim


def test_search_out_then_run_and_export(capsys, tmp_path):
    path = tmp_path / "p.json"
    out = run_json(capsys, "search", "gpt", *SIZES, "--mesh", "data:2,model:4", "--target", "maxtext", "--out", path)
    assert out["target"] == "maxtext"
    assert json.loads(path.read_text())["plan"]["layout"]["rules"] == out["layout"]["rules"]
    ran = run_json(capsys, "run", path, "--steps", "20")
    assert ran["steps"][-1]["loss"] < ran["steps"][0]["loss"]
    specs = run_json(capsys, "export", path, "--format", "specs")
    assert json.loads(specs["text"])["layer.0/wi"] is not None
    code, text, _ = run(capsys, "export", path, "--format", "maxtext", "--out", tmp_path / "mt.yml")
    assert code == 0 and yaml.safe_load(text) == yaml.safe_load((tmp_path / "mt.yml").read_text())
    assert yaml.safe_load(text)["ici_tensor_parallelism"] == 4
    code, _, err = run(capsys, "export", path, "--format", "flax", "--slices", "2")  # (was ignored)
    assert code == 2 and "slices applies to the maxtext format only, not flax" in err
    code, _, err = run(capsys, "export", path, "--format", "maxtext", "--dim-name", "foo=bar")
    assert code == 2 and "dim_names names 'foo', which model 'gpt' lacks" in err


@pytest.mark.parametrize("argv, message", [
    (["run", "nomodel", "--mesh", "data:8"], "unknown model 'nomodel'"),
    (["run", "gpt"], "needs --mesh"),
    (["run", "gpt", "--mesh", "data:16"], "needs 16 devices"),
    (["run", "gpt", "--mesh", "data:x"], "mesh"),
    (["run", "gpt", "--mesh", "data:8", "--steps", "0"], "--steps must be an integer from 1 to 1,000,000"),
    (["run", "gpt", "--mesh", "data:8", "--coordinator", "localhost:1"], "needs --coordinator, --num-processes"),
    (["export", "missing.json", "--format", "flax"], "cannot read plan file"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1, err


def test_mismatched_or_broken_plan_files(capsys, plan_file, tmp_path):
    code, _, err = run(capsys, "run", plan_file, "--mesh", "data:4,model:2")
    assert code == 2 and "is a plan for mesh data:2,model:4, not data:4,model:2" in err
    code, _, err = run(capsys, "run", plan_file, "--set", "layers=4")
    assert code == 2 and "drop --set" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "layoutsearch-plan", "version": 1, "model": {}}))
    code, _, err = run(capsys, "run", bad)
    assert code == 2 and err.count("bad.json") == 1 and "model: graph: missing field 'name'" in err
    bad.write_bytes(b"\xff\xfe{")
    code, _, err = run(capsys, "export", bad, "--format", "specs")
    assert code == 2 and "bad.json: not UTF-8 text: byte 0xff at offset 0" in err


def test_a_per_op_plan_from_the_ops_space_runs_and_exports(capsys, tmp_path):
    """An ops-space plan lays out backward tensors too (``grad/...``), which the forward graph saved with it
    lacks: it loads, runs with the forward tensors' layouts, and exports them."""
    path = tmp_path / "ops.json"
    one_layer = [a.replace("layers=2", "layers=1") for a in SIZES]  # (a smaller ILP)
    run_json(capsys, "search", "gpt", *one_layer, "--mesh", "data:2,model:2", "--space", "ops", "--remat", "none",
             "--microbatches", "1", "--top", "1", "--out", path)
    overrides = json.loads(path.read_text())["plan"]["layout"]["overrides"]
    assert any(name.startswith("grad/") for name in overrides)
    plan = ls.Plan.load(path)
    ran = run_json(capsys, "run", path, "--steps", "2")
    assert len(ran["steps"]) == 2
    specs = json.loads(run_json(capsys, "export", path, "--format", "specs")["text"])
    assert not any(name.startswith("grad/") for name in specs)
    wi = plan.model.tensors["layer.0/wi"]
    assert specs["layer.0/wi"] == [list(s) if isinstance(s, tuple) else s for s in plan.chosen.layout.spec(wi)]
    assert json.loads(ls.export.export(plan.chosen.layout, plan.model, "specs")) == specs  # the Python API too


def test_a_plan_priced_on_a_hardware_profile_is_its_own_reference(capsys, tmp_path):
    """A profile (calibrate's) describes the devices it was measured on: measured/predicted is against the plan's
    prediction, not against the preset of these devices (it was against cpu-sim)."""
    from layoutsearch.hwprofile import save_profile
    from layoutsearch.mesh import hardware

    profile = tmp_path / "hw.json"
    save_profile(hardware("cpu-sim").replace(name="calibrated-here", peak_flops=5e10), profile)
    out = run_json(capsys, "run", "gpt", *SIZES, "--mesh", "data:8", "--hardware", profile, "--steps", "3")
    assert out["predicted"]["hardware"] == "calibrated-here" and out["predicted_here"] is None
    assert out["measured_over_predicted"] == pytest.approx(out["median_step_s"] / out["predicted"]["step_s"])


def test_export_for_maxtext_reprices_a_plan_as_maxtext_runs_it(capsys, tmp_path):
    path = tmp_path / "p.json"
    llama = ["--set", "mlp=swiglu", "--set", "norm=rmsnorm", "--set", "position=rotary", "--set", "bias=0",
             "--set", "tie_embeddings=0"]
    run_json(capsys, "search", "gpt", *SIZES, *llama, "--mesh", "data:2,model:4", "--remat", "full:1", "--out", path)
    out = run_json(capsys, "export", path, "--format", "maxtext")
    ran = out["maxtext_execution"]
    assert ran["remat"] == "full" and ran["step_s"] > 0 and ran["fits"] is True
    assert out["text"].startswith("# MaxText runs this plan with remat full") and "remat_policy: \"full\"" in out["text"]
    code, _, err = run(capsys, "search", "gpt", *SIZES, "--mesh", "data:2,model:4", "--target", "maxtext",
                       "--remat", "full:1")
    assert code == 2 and "MaxText has no remat policy for the first blocks only" in err
    code, _, err = run(capsys, "search", "mtf-ffn", "--mesh", "data:2,model:4", "--target", "maxtext")
    assert code == 2 and "no decoder block for model" in err
    piped = tmp_path / "piped.json"
    run_json(capsys, "search", "gpt", *SIZES, *llama, "--mesh", "stage:2,data:4", "--pipeline", "2",
             "--microbatches", "4", "--schedule", "gpipe", "--top", "1", "--out", piped)
    code, _, err = run(capsys, "export", piped, "--format", "maxtext")
    assert code == 2 and "priced under schedule gpipe is not what MaxText runs" in err
    ours = tmp_path / "maxtext-piped.json"
    found = run_json(capsys, "search", "gpt", *SIZES, *llama, "--mesh", "stage:2,data:4", "--pipeline", "2",
                     "--target", "maxtext", "--top", "1", "--out", ours)
    assert found["schedule"] == "maxtext" and found["stage_axis"] == "stage" and found["remat"] != "none"
    text = run_json(capsys, "export", ours, "--format", "maxtext")["text"]
    assert "num_layers_per_pipeline_stage: 1" in text and '["activation_embed_and_logits_batch", ["stage", "data"]]' \
        in text
