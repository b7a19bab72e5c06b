"""The ``cost`` and ``table1`` commands."""


import pytest
from clirun import run, run_json


def test_cost_json_has_totals_memory_and_collectives(capsys):
    d = run_json(capsys, "cost", "mtf-ffn", "--mesh", "data:2,model:4", "--layout", "batch:data,hidden:model",
                 "--hardware", "tpu-v3", "--set", "batch=32")
    for key in ("step_s", "compute_s", "comm_s", "memory_bytes", "flops_per_device", "mfu", "bytes_per_axis",
                "collectives", "ops", "memory"):
        assert key in d, key
    assert d["hardware"]["name"] == "tpu-v3"
    kinds = {(c["op"], c["kind"], tuple(c["axes"])) for c in d["collectives"]}
    assert ("y", "all-reduce", ("model",)) in kinds  # hidden split: y's partial sums
    assert ("grad/w", "all-reduce", ("data",)) in kinds  # batch split: gradient all-reduce
    for c in d["collectives"]:
        assert set(c) >= {"op", "kind", "axes", "bytes", "seconds"} and c["bytes"] > 0
    # overlap auto (the default): the data-parallel gradient all-reduces hide behind the backward pass, the
    # tensor-parallel all-reduces of y do not
    assert d["overlap"] == "auto" and d["comm_exposed_s"] + d["comm_hidden_s"] == pytest.approx(d["comm_s"])
    assert d["step_s"] == pytest.approx(d["compute_s"] + d["comm_exposed_s"])
    assert d["overlap_by_class"]["critical"]["exposed_s"] >= d["overlap_by_class"]["critical"]["seconds"]
    assert d["overlap_by_class"]["gradient"]["exposed_s"] < d["overlap_by_class"]["gradient"]["seconds"]
    flat = run_json(capsys, "cost", "mtf-ffn", "--mesh", "data:2,model:4", "--layout", "batch:data,hidden:model",
                    "--hardware", "tpu-v3", "--set", "batch=32", "--overlap", "0")
    assert flat["step_s"] == pytest.approx(flat["compute_s"] + flat["comm_s"])
    assert flat["step_s"] > d["step_s"]


def test_cost_options_reach_the_estimate(capsys):
    d = run_json(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--layout", "batch:data,d_ff:model",
                 "--hardware", "h100", "--hw", "peak_flops=500e12", "--optimizer", "sgd", "--remat", "full",
                 "--overlap", "0.5", "--precision", "bf16")
    assert (d["optimizer"], d["precision"], d["remat"], d["overlap"]) == ("sgd", "bf16", "full", 0.5)
    assert d["hardware"]["peak_flops"] == 500e12
    assert d["memory"]["recomputed_ops"] > 0 and d["memory"]["breakdown"]["optimizer_state"] == 0


def test_cost_table_shows_totals_collectives_and_top_ops(capsys):
    code, out, err = run(capsys, "cost", "gpt", "--mesh", "data:2,model:4", "--layout", "batch:data,heads:model",
                         "--top", "3")
    assert code == 0 and err == ""
    for text in ("step", "peak memory", "collectives by kind and axes", "top 3 ops by time", "all-reduce"):
        assert text in out
    assert "\x1b" not in out


@pytest.mark.parametrize("argv, message", [
    (["--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'"),
    (["--layout", "batch:data", "--mesh", "data:3"], "cannot be split 3 ways"),
    (["--layout", "d_ff:data"], "names dim 'd_ff', which model 'mtf-ffn' lacks"),
    (["--hardware", "h100", "--hw", "fast_link.bandwidth=0"], "must be positive"),
])
def test_cost_bad_input_is_one_line(capsys, argv, message):
    base = ["cost", "mtf-ffn", "--mesh", "data:8", "--layout", "batch:data"]
    code, out, err = run(capsys, *base, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def table1_doc():
    from layoutsearch.table1 import table1

    return table1(batch=32, io=16, hidden=64)


def test_table1_compiled_numbers_equal_the_predicted_ones(table1_doc):
    rows = {r["layout"]: r for r in table1_doc["rows"]}
    assert list(rows) == ["replicated", "data-parallel", "model-parallel", "2-D"]
    for name, r in rows.items():
        assert r["comm_match"], name
        assert r["compiled"]["collectives"] == r["predicted"]["collectives"], name
        assert r["compiled"]["comm_bytes"] == r["predicted"]["comm_bytes"] == r["comm_formula_bytes"], name
        # FLOPs: matmuls exactly as the formula, elementwise and SGD within a few percent of XLA's count
        assert r["predicted"]["flops"] >= r["matmul_flops_formula"]
        assert r["compiled"]["flops"] == pytest.approx(r["predicted"]["flops"], rel=0.05), name
    b, io, h = 32, 16, 64
    assert rows["data-parallel"]["comm_formula_bytes"] == 2 * io * h * 4 + 4
    assert rows["model-parallel"]["comm_formula_bytes"] == b * io * 4
    assert rows["2-D"]["comm_formula_bytes"] == b // 2 * io * 4 + 2 * io * h // 4 * 4 + 4


def test_table1_command_prints_formulas_predictions_and_compiled(capsys):
    d = run_json(capsys, "table1", "--set", "batch=16", "--set", "io=16", "--set", "hidden=32")
    assert d["sizes"] == {"batch": 16, "io": 16, "hidden": 32} and d["mesh"] == "rows:2,cols:4"
    assert all(r["comm_match"] for r in d["rows"])
    code, out, _ = run(capsys, "table1", "--set", "batch=16", "--set", "io=16", "--set", "hidden=32")
    assert code == 0
    for text in ("data-parallel", "model-parallel", "2-D", "2·io·h·4", "b·io·4", "compiled B", "yes"):
        assert text in out


def test_table1_without_compiling(capsys):
    d = run_json(capsys, "table1", "--no-compile", "--mesh", "r:4,c:2")
    assert all("compiled" not in r for r in d["rows"])
    assert d["rows"][3]["rules"] == "batch:r,hidden:c"
    assert d["rows"][3]["predicted"]["comm_bytes"] == d["rows"][3]["comm_formula_bytes"]


def test_table1_bad_input_is_one_line(capsys):
    code, _, err = run(capsys, "table1", "--set", "seq=4")
    assert code == 2 and "table1 has no size 'seq'" in err
    code, _, err = run(capsys, "table1", "--mesh", "data:8", "--no-compile")
    assert code == 2 and "2-D mesh" in err
