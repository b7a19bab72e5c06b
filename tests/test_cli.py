"""The command line: outputs, JSON, exit codes and one-line errors."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import run, run_json

from layoutsearch import cli, zoo
from layoutsearch.costmodel.report import estimate
from layoutsearch.export import python_snippet
from layoutsearch.ir import graph_to_dict, load_graph
from layoutsearch.layout import Layout

ROOT = Path(__file__).resolve().parent.parent


def test_models_lists_the_zoo_with_defaults(capsys):
    code, out, err = run(capsys, "models")
    assert code == 0 and err == ""
    for name in ("gpt", "mtf-ffn", "moe", "mlp"):
        assert name in out
    assert "batch=" in out
    assert "\x1b" not in out  # plain text when stdout is not a terminal


def test_models_json_has_name_description_and_params(capsys):
    models = {m["name"]: m for m in run_json(capsys, "models")["models"]}
    assert models["gpt"]["params"]["layers"] == 2
    assert models["gpt"]["description"]


def test_flags_may_come_before_the_command(capsys):
    code, out, _ = run(capsys, "--json", "models")
    assert code == 0 and "models" in json.loads(out)


def test_graph_summary_counts_parameters(capsys):
    doc = run_json(capsys, "graph", "mtf-ffn", "--set", "io=8", "--set", "hidden=16")
    assert doc["dims"]["io"] == 8 and doc["dims"]["hidden"] == 16
    assert doc["parameter_count"] == 2 * 8 * 16
    assert doc["parameter_bytes"] == 4 * 2 * 8 * 16
    assert doc["ops_by_kind"]["einsum"] == 2
    assert {p["name"] for p in doc["parameters"]} == {"w", "v"}


def test_graph_table_names_dims_and_parameters(capsys):
    code, out, _ = run(capsys, "graph", "mtf-ffn")
    assert code == 0
    assert "hidden" in out and "einsum" in out and "parameters" in out


def test_graph_out_writes_a_loadable_graph_file(capsys, tmp_path):
    path = tmp_path / "gpt.json"
    code, out, _ = run(capsys, "graph", "gpt", "--set", "layers=1", "--out", str(path))
    assert code == 0 and str(path) in out
    assert graph_to_dict(load_graph(path)) == graph_to_dict(zoo.build("gpt", layers=1))
    doc = run_json(capsys, "graph", str(path))
    assert doc["model"] == "gpt"


def test_layout_shows_specs_and_per_device_shapes(capsys):
    doc = run_json(capsys, "layout", "mtf-ffn", "--mesh", "data:2,model:4", "--layout", "batch:data,hidden:model")
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert tensors["w"]["spec"] == [None, "model"]
    assert tensors["w"]["local_shape"] == [32, 16]
    assert tensors["x"]["spec"] == ["data", None] and tensors["x"]["replication"] == 4
    assert doc["export"]["flax_logical_axis_rules"] == [["batch", "data"], ["hidden", "model"]]
    # a model MaxText has no decoder for keeps its dim names; model -> tensor
    assert doc["export"]["maxtext"]["logical_axis_rules"] == [["batch", ["data"]], ["hidden", ["tensor"]]]
    assert doc["export"]["maxtext"]["ici_data_parallelism"] * doc["export"]["maxtext"]["ici_tensor_parallelism"] == 8
    odd = run_json(capsys, "layout", "mtf-ffn", "--mesh", "rows:2,cols:4", "--layout", "batch:rows")
    assert "rows" in odd["export"]["maxtext"]["error"]
    code, _, err = run(capsys, "layout", "mtf-ffn", "--mesh", "rows:2,cols:4", "--export", "maxtext")
    assert code == 2 and "rows" in err


def test_layout_table_includes_the_exports(capsys):
    code, out, _ = run(capsys, "layout", "mtf-ffn", "--mesh", "data:2,model:4", "--layout", "batch:data+model")
    assert code == 0
    assert "P(('data', 'model'), None)" in out
    assert "logical_axis_rules = [('batch', ('data', 'model'))]" in out
    assert "partition_specs = {" in out


def test_layout_export_python_prints_only_the_snippet(capsys):
    code, out, _ = run(capsys, "layout", "gpt", "--mesh", "data:2,model:4", "--layout", "batch:data,d_ff:model",
                       "--export", "python")
    assert code == 0
    expected = python_snippet(Layout.from_rules("data:2,model:4", "batch:data,d_ff:model"), zoo.build("gpt"))
    assert out == expected


def test_layout_with_hardware_names_each_axis_link(capsys):
    doc = run_json(capsys, "layout", "mtf-ffn", "--mesh", "data:2,model:4", "--hardware", "h100",
                   "--hw", "axis_links.model=slow", "--hw", "peak_flops=300e12")
    links = doc["hardware"]["axis_links"]
    assert links["data"]["kind"] == "fast" and links["model"]["kind"] == "slow"


def test_hardware_lists_presets_and_applies_overrides(capsys):
    assert "h100" in run_json(capsys, "hardware")["presets"]
    doc = run_json(capsys, "hardware", "h100", "--hw", "peak_flops=300e12", "--hw", "fast_link.bandwidth=1e11")
    assert doc["hardware"]["peak_flops"] == 300e12
    assert doc["hardware"]["fast_link"]["bandwidth"] == 1e11


def _cycle_file(path: Path) -> Path:
    doc = {"name": "cyclic", "dims": {"a": 4},
           "tensors": [{"name": "x", "dims": ["a"], "role": "input"}, {"name": "y", "dims": ["a"]},
                       {"name": "z", "dims": ["a"]}],
           "ops": [{"kind": "elementwise", "name": "f", "inputs": ["x", "z"], "output": "y", "fn": "add"},
                   {"kind": "elementwise", "name": "g", "inputs": ["y"], "output": "z", "fn": "relu"}]}
    path.write_text(json.dumps(doc))
    return path


USER_ERRORS = {
    "unknown model": (["graph", "no-such-model"], "no-such-model"),
    "malformed mesh": (["layout", "gpt", "--mesh", "data2"], "data2"),
    "unknown hardware": (["layout", "gpt", "--mesh", "data:2", "--hardware", "tpu-v99"], "tpu-v99"),
    "unknown axis": (["layout", "gpt", "--mesh", "data:2", "--layout", "batch:nosuchaxis"], "nosuchaxis"),
    "indivisible split": (["layout", "gpt", "--mesh", "data:3", "--layout", "batch:data"], "batch"),
    "unknown dim": (["layout", "gpt", "--mesh", "data:2", "--layout", "nosuchdim:data"], "nosuchdim"),
    "malformed --set": (["graph", "gpt", "--set", "layers"], "layers"),
    "unknown --set key": (["graph", "gpt", "--set", "depth=3"], "depth"),
    "malformed --hw": (["layout", "gpt", "--mesh", "data:2", "--hardware", "h100", "--hw", "peak_flops=fast"],
                       "peak_flops"),
    "unknown figure": (["hardware", "h100", "--hw", "warp_speed=9"], "warp_speed"),
    "malformed JSON": (["graph", "{tmp}/broken.json"], "broken.json"),
    "cycle": (["graph", "{tmp}/cycle.json"], "cycle"),
    "missing graph file": (["graph", "{tmp}/missing.json"], "missing.json"),
}


@pytest.fixture
def graph_files(tmp_path):
    (tmp_path / "broken.json").write_text('{"name": "x", "dims": {')
    _cycle_file(tmp_path / "cycle.json")
    return tmp_path


@pytest.mark.parametrize("case", list(USER_ERRORS))
@pytest.mark.parametrize("json_flag", [False, True])
def test_user_errors_exit_2_with_one_line_naming_the_offender(capsys, graph_files, case, json_flag):
    argv, offender = USER_ERRORS[case]
    argv = [a.replace("{tmp}", str(graph_files)) for a in argv] + (["--json"] if json_flag else [])
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("layoutsearch: error: ")
    assert offender in lines[0]
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys):
    code, out, err = run(capsys, "graph", "no-such-model", "--debug")
    assert code == 2 and out == ""
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("layoutsearch: error: ")


def test_unexpected_errors_exit_1_with_a_hint(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli.models, "run", boom)
    code, out, err = run(capsys, "models")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "kaboom" in err and "--debug" in err and "Traceback" not in err
    code, _, err = run(capsys, "models", "--debug")
    assert code == 1 and "Traceback" in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "no-such-command")[0] == 2
    assert run(capsys, "layout", "gpt")[0] == 2  # --mesh is required
    assert run(capsys)[0] == 2
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "models" in out


def test_root_shim_runs_the_cli():
    ok = subprocess.run([sys.executable, "cli.py", "models"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "gpt" in ok.stdout and "\x1b" not in ok.stdout
    bad = subprocess.run([sys.executable, "cli.py", "layout", "gpt", "--mesh", "data:x"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "data:x" in bad.stderr


TINY = ["--set", "layers=1", "--set", "d_model=32", "--set", "batch=8", "--set", "seq=16", "--set", "vocab=64",
        "--set", "heads=4"]


def test_search_echoes_the_limit_fills_the_chosen_row_and_folds_identical_baselines(capsys):
    code, out, err = run(capsys, "search", "gpt", *TINY, "--mesh", "data:2,model:4", "--hardware", "h100",
                         "--memory-limit", "80GB")
    assert code == 0, err
    assert "against a limit of 80GB (74.51 GiB)" in out  # as written, and its size
    assert "layout (for --layout): replicated" in out  # this tiny model runs fastest unsplit
    assert re.search(r"^chosen\s+replicated\s+remat none", out, re.M)  # the row's rules were blank
    # on a 2-axis mesh Megatron and the Mesh-TF 2-D layout are the same layout: one row naming both
    assert len(re.findall(r"^megatron = mesh-tf-2d\s+batch:data,", out, re.M)) == 1
    assert not re.search(r"^mesh-tf-2d\s", out, re.M)
    # how each rules search pruned its space: one row per remat policy
    assert "how each rules search pruned its space" in out
    rows = re.findall(r"^remat (none|selective|full)\s+([\d,]+)\s+([\d,]+)\s+([\d,-]+)\s+([\d,]+)\s+([\d,]+)$",
                      out, re.M)
    assert [r[0] for r in rows] == ["none", "selective", "full"]
    # everything fits without remat here: the remat searches leave out every layout (the same one, no faster)
    assert [r[2] for r in rows] == ["0", rows[0][1], rows[0][1]] and [r[4] for r in rows[1:]] == ["0", "0"]
    assert out.splitlines()[-1] == ("next: layoutsearch cost gpt " + " ".join(TINY) + " --mesh data:2,model:4 "
                                    "--hardware h100 --layout replicated --remat none")


def test_search_next_command_costs_the_chosen_plan(capsys):
    mesh = "data:2,model:4"
    graph = zoo.build("gpt", layers=1, d_model=32, batch=8, seq=16, vocab=64, heads=4)
    replicated = estimate(graph, Layout.replicated(mesh), "h100").memory_bytes
    limit = str(int(0.6 * replicated))  # replicated does not fit: the plan splits
    doc = run_json(capsys, "search", "gpt", *TINY, "--mesh", mesh, "--hardware", "h100", "--memory-limit", limit,
                   "--microbatches", "1")
    assert {"model", "mesh", "devices", "hardware", "space", "solver", "optimal", "gap", "memory_limit", "remat",
            "microbatches", "stage_axis", "schedule", "search_s", "step_s", "compute_s", "comm_s", "memory_bytes",
            "fits", "layout", "cost", "runner_ups", "baselines", "decisions", "problem"} <= set(doc)
    text = doc["layout"]["rules_text"]
    assert text not in (None, "replicated") and Layout.from_rules(mesh, text).rules == \
        tuple((d, tuple(a)) for d, a in doc["layout"]["rules"])
    argv = shlex.split(doc["next"])
    assert argv[:3] == ["layoutsearch", "cost", "gpt"] and argv[argv.index("--layout") + 1] == text
    cost = run_json(capsys, *argv[1:])
    assert cost["step_s"] == pytest.approx(doc["step_s"], rel=1e-9)
    assert cost["memory_bytes"] == doc["memory_bytes"] <= int(limit)


def test_search_per_op_plans_say_no_rule_string_expresses_them(capsys):
    code, out, err = run(capsys, "search", "gpt", *TINY, "--mesh", "data:2,model:4", "--hardware", "h100",
                         "--space", "ops", "--remat", "none", "--microbatches", "1", "--top", "1")
    assert code == 0, err
    assert "which one --layout rule string cannot express: the per-tensor PartitionSpecs below are the plan" in out
    assert re.search(r"^embed\s+P\(", out, re.M)  # the per-tensor specs
    assert re.search(r"^chosen\s+\(per-op: PartitionSpecs above\)", out, re.M)
    assert out.splitlines()[-1] == ("next: layoutsearch search gpt " + " ".join(TINY) + " --mesh data:2,model:4 "
                                    "--hardware h100 --remat none --microbatches 1 --space rules  # the best plan "
                                    "of one rule string, which `cost` takes")


def test_infeasible_search_names_the_pipeline_flag(capsys):
    code, out, err = run(capsys, "search", "gpt", *TINY, "--mesh", "data:2,model:2", "--hardware", "h100",
                         "--memory-limit", "1KiB")
    assert code == 2 and out == ""
    assert "a pipeline (pipeline='auto')" in err and "(on the command line: --pipeline auto)" in err


@pytest.mark.parametrize("preset", ["h100", "tpu-v5p", "a100", "tpu-v4"])
def test_every_hardware_figure_has_a_source_or_says_assumption(capsys, preset):
    """Issue 32, deliver 1: ``hardware PRESET --json`` gives every figure a source (a document, a measurement)
    or ``assumption``; the peaks and capacities always cite their datasheet; a figure given with --hw is
    sourced as given."""
    from layoutsearch.figure_sources import ASSUMPTION, figure_names

    res = run_json(capsys, "hardware", preset)
    sources = res["sources"]
    assert set(sources) == set(figure_names())
    assert all(isinstance(v, str) and v for v in sources.values())
    for figure in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "fast_link_bandwidth"):
        assert sources[figure] != ASSUMPTION and ("datasheet" in sources[figure] or "Cloud TPU" in sources[figure])
    assert sources["memory_efficiency"] == ASSUMPTION and sources["fast_link_latency"] == ASSUMPTION
    assert (sources["matmul_efficiency"] == ASSUMPTION) == preset.startswith("tpu")
    given = run_json(capsys, "hardware", preset, "--hw", "memory_efficiency=0.9")["sources"]
    assert given["memory_efficiency"] == "given (--hw)" and given["peak_flops"] == sources["peak_flops"]


def test_cost_notes_a_step_that_rests_on_assumed_figures(capsys):
    code, out, _ = run(capsys, "cost", "gpt", "--mesh", "data:4,model:2", "--layout", "batch:data,d_ff:model",
                       "--hardware", "tpu-v5p")
    assert code == 0 and "rests on assumed figures" in out and "matmul_efficiency" in out
    res = run_json(capsys, "cost", "gpt", "--mesh", "data:4,model:2", "--layout", "batch:data,d_ff:model",
                   "--hardware", "tpu-v5p")
    assert 0.5 < res["assumed"]["share"] <= 1 and "matmul_efficiency" in res["assumed"]["figures"]


# -- start-up: what each command imports ----------------------------------------------------------------------------

def test_the_command_table_gives_each_command_its_modules_help():
    """``cli.COMMANDS`` lists each command with the help its module registers (``--help`` shows the table's)."""
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert [c.dest for c in sub._choices_actions] == list(cli.COMMANDS)
    assert {c.dest: c.help for c in sub._choices_actions} == cli.COMMANDS


IMPORTED = ("jax", "pulp", "ortools", "scipy", "networkx", "numpy", "layoutsearch.costmodel",
            "layoutsearch.solvers.search")


def imported_by(*argv):
    """The modules of IMPORTED that ``layoutsearch ARGV...`` (a fresh interpreter) has imported when it exits."""
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: print('IMPORTED', *[m for m in {IMPORTED!r} if m in sys.modules], "
            "file=sys.stderr))\n"
            "sys.argv[0] = 'layoutsearch'\n"
            "from layoutsearch.cli import run\n"
            "run()\n")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("IMPORTED"))
    return set(line.split()[1:])


def test_commands_that_need_neither_jax_nor_a_solver_import_neither(tmp_path):
    chain = tmp_path / "chain.json"
    chain.write_text(json.dumps({
        "format": "layoutsearch.costdag", "version": 1, "name": "chain",
        "nodes": [{"name": f"n{i}", "compute_s": 1.0 + i % 3} for i in range(8)],
        "edges": [{"src": f"n{i}", "dst": f"n{i + 1}", "transfer_s": 0.1} for i in range(7)]}))
    assert imported_by("--help") == set()
    assert imported_by("hardware") == set()
    assert imported_by("hardware", "h100", "--json") == set()
    assert imported_by("models") <= {"numpy"}  # the zoo builds graphs of the IR
    # a search imports its own modules and numpy, not networkx (0.13 s of start-up) nor a solver
    assert imported_by("search", "mlp", "--mesh", "data:2,model:2") == {
        "numpy", "layoutsearch.costmodel", "layoutsearch.solvers.search"}
    assert imported_by("partition", chain, "--stages", "2") <= {"networkx", "numpy"}  # the partitioner's own


def test_import_layoutsearch_imports_the_public_api_on_first_use():
    code = ("import sys, layoutsearch as ls\n"
            "assert sorted(m for m in sys.modules if m.startswith('layoutsearch')) == ['layoutsearch',"
            " 'layoutsearch.lazy'], sys.modules\n"  # (lazy: the PEP 562 helper, standard library only)
            "assert set(ls.__all__) <= set(dir(ls))\n"
            "from layoutsearch import *\n"
            "from layoutsearch.solvers.search import search as s\n"
            "import layoutsearch.solvers.search\n"
            "from layoutsearch.solvers import search as t\n"
            "assert ls.search is s is t is search and callable(s), (s, t)\n"
            "assert ls.zoo.build and ls.Plan and ls.Mesh.parse('data:2').size == 2\n"
            "assert ls.ir.Graph is ls.Graph and ls.costmodel.estimate is ls.estimate\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout == "ok\n", proc.stderr
