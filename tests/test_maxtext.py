"""The MaxText round trip, checked by MaxText's own code (tier ``maxtext``: ``pytest -m maxtext``).

A Python 3.12+ venv with ``maxtext==0.2.5`` (tests/maxtext_harness/maxtext_venv.py, made once and cached) runs
MaxText's config loader, mesh builder and abstract model (layoutsearch/maxtext/probe.py) on each exported
plan, by both routes a MaxText user takes: the export as a config file on top of ``base.yml``
(``base_config: base.yml``) and as ``key=value`` command-line overrides. Every parameter's shape and
PartitionSpec, every activation MaxText constrains (attention inputs, q/k/v, attention output, MLP input,
logits) and the parameter elements held per device must equal the plan's: zero mismatches.
Skipped, with the reason, where no Python >= 3.12 exists."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from layoutsearch import zoo
from layoutsearch.errors import LayoutError
from layoutsearch.export import export, maxtext_axis_map
from layoutsearch.layout import Layout
from layoutsearch.maxtext import runner
from layoutsearch.maxtext.compare import compare
from layoutsearch.solvers.search import search

sys.path.insert(0, str(Path(__file__).resolve().parent / "maxtext_harness"))
import maxtext_venv as harness

pytestmark = pytest.mark.maxtext

SMALL_LLAMA = {"preset": "llama3-8b", "layers": 2, "d_model": 256, "heads": 4, "kv_heads": 2, "d_ff": 512,
               "vocab": 1024, "seq": 128, "batch": 32}


def _searched_llama3_8b():
    """The search's plan (``--target maxtext``) for llama3-8b, MaxText's own model, on fsdp:16,tensor:4 of TPU
    v5p (a v5p-128 slice: 64 chips)."""
    graph = zoo.build("gpt", preset="llama3-8b", batch=256)
    plan = search(graph, "fsdp:16,tensor:4", hardware="tpu-v5p", top=1, baselines=False, target="maxtext")
    c = plan.chosen
    return graph, c.layout, {"remat": c.remat, "microbatches": c.microbatches}


CASES = {
    # Megatron-style tensor parallelism of GPT-3 XL (MaxText's gpt3 block: fused qkv, learned positions)
    "gpt3-xl data x model": (lambda: (zoo.build("gpt", preset="gpt3-xl", batch=64),
                                      Layout.from_rules("data:2,model:4", "batch:data,heads:model,d_ff:model"),
                                      {"remat": "full"})),
    "llama3-8b searched on v5p fsdp:16,tensor:4": _searched_llama3_8b,
    # weights' d_model on fsdp, activations' d_model on tensor (as MaxText's default activation_embed rule)
    "activations split unlike weights": (lambda: (
        zoo.build("gpt", preset="llama3-8b", batch=64, seq=1024),
        Layout.from_rules("fsdp:16,tensor:4",
                          "batch:fsdp,d_ff:tensor,kv_heads:tensor,vocab:tensor,d_model:tensor,d_model:fsdp"),
        {"remat": "selective"})),
    "context parallel": (lambda: (zoo.build("gpt", **SMALL_LLAMA),
                                  Layout.from_rules("fsdp:4,context:2", "batch:fsdp,seq:context,kv_seq:context,"
                                                    "d_model:fsdp"),
                                  {"remat": "full"})),
    "gradient accumulation, no remat": (lambda: (zoo.build("gpt", **SMALL_LLAMA),
                                                 Layout.from_rules("data:2,fsdp:4", "batch:data+fsdp,d_model:fsdp"),
                                                 {"remat": "none", "microbatches": 2})),
    "pipeline (MaxText's)": (lambda: (zoo.build("gpt", **{**SMALL_LLAMA, "layers": 4}),
                                      Layout.from_rules("stage:2,fsdp:4", "batch:fsdp,d_model:fsdp"),
                                      {"remat": "full", "microbatches": 4, "stage_axis": "stage",
                                       "schedule": "maxtext"})),
}


@pytest.fixture(scope="module")
def maxtext_python():
    if harness.base_python() is None:
        pytest.skip("no Python >= 3.12 here (MaxText 0.2.5 needs it): the MaxText tier is skipped")
    return harness.maxtext_python()


@pytest.fixture(scope="module")
def round_trips(maxtext_python, tmp_path_factory):
    """Case name -> (plan, the two probe results: config file, command line)."""
    base = runner.base_config(maxtext_python)
    built = {name: make() for name, make in CASES.items()}
    by_devices: dict[int, list[tuple[str, list[str]]]] = {}
    texts = {}
    for name, (graph, layout, kw) in built.items():
        text = export(layout, graph, "maxtext", **kw)
        texts[name] = text
        path = tmp_path_factory.mktemp("maxtext") / "plan.yml"
        path.write_text("base_config: base.yml\n" + text)
        cli = [base] + [f"{k}={json.dumps(v)}" for k, v in yaml.safe_load(text).items()]
        by_devices.setdefault(layout.mesh.size, []).append((name, [str(path)]))
        by_devices[layout.mesh.size].append((name, cli))
    results: dict[str, list] = {name: [] for name in CASES}
    for devices, argvs in by_devices.items():
        for (name, _), res in zip(argvs, runner.probe([a for _, a in argvs], devices, python=maxtext_python)):
            results[name].append(res)
    return {name: (built[name], texts[name], results[name]) for name in CASES}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("route", ["config file", "command line"])
def test_maxtext_builds_exactly_the_plan(round_trips, case, route):
    (graph, layout, kw), text, results = round_trips[case]
    result = results[0 if route == "config file" else 1]
    rt = compare(result, layout, graph, maxtext_axis_map(layout.mesh.names, stage_axis=kw.get("stage_axis")),
                 stage_axis=kw.get("stage_axis"))
    assert rt.mismatches == [], "\n".join(rt.mismatches[:20])
    assert rt.params_compared >= (16 if "gpt3" in case else 12)
    assert {"attentions/inputs_q", "linears/x", "logits"} <= set(rt.activations_compared) or "gpt3" in case
    assert {"linears/x", "logits"} <= set(rt.activations_compared)
    assert rt.params_per_device_maxtext == rt.params_per_device_plan > 0
    cfg = result["config"]
    assert cfg["max_target_length"] == graph.dims["seq"]
    assert cfg["global_batch_size_to_train_on"] == graph.dims["batch"]


def test_the_export_names_maxtexts_own_model_and_the_run(round_trips):
    (graph, layout, kw), text, results = round_trips["llama3-8b searched on v5p fsdp:16,tensor:4"]
    cfg = yaml.safe_load(text)
    assert cfg["model_name"] == "llama3-8b" and "mesh_axes" not in cfg and cfg["override_logical_axis_rules"]
    assert results[1]["config"]["model_name"] == "llama3-8b"
    assert results[1]["config"]["base_emb_dim"] == 4096 and results[1]["config"]["vocab_size"] == 128256
    (graph, layout, kw), text, results = round_trips["gradient accumulation, no remat"]
    assert results[0]["config"]["gradient_accumulation_steps"] == 2
    assert results[0]["config"]["remat_policy"] in ("none", None)  # (MaxText reads "none" as None)
    assert results[0]["config"]["scan_layers"] is False


def test_a_plan_maxtext_names_cannot_express_is_refused():
    graph = zoo.build("gpt", preset="gpt3-xl", batch=64)
    layout = Layout.from_rules("data:2,model:4", "batch:data,heads:model,d_ff:model,vocab:model")
    with pytest.raises(LayoutError, match="pos_embed's seq.*'vocab'|embed's vocab.*'vocab'"):
        export(layout, graph, "maxtext")


READ_CASES = {
    "llama3-8b with overrides": ("model_name: llama3-8b\nper_device_batch_size: 4\nmax_target_length: 1024\n"
                                 "ici_fsdp_parallelism: 4\nici_tensor_parallelism: 2\n",
                                 ["per_device_batch_size=2", "gradient_accumulation_steps=2", "remat_policy=minimal"]),
    "global_parameter_scale 16 over 2 slices": ("global_parameter_scale: 16\nper_device_batch_size: 6\n"
                                                "remat_policy: full\nici_fsdp_parallelism: 4\n"
                                                "dcn_data_parallelism: 2\nnum_slices: 2\n", []),
    "gpt3 block, rules on the command line": (
        "decoder_block: gpt3\nbase_emb_dim: 256\nbase_num_query_heads: 4\nbase_num_kv_heads: 4\nbase_mlp_dim: 1024\n"
        "base_num_decoder_layers: 2\nhead_dim: 64\nvocab_size: 1024\nmlp_activations: [gelu]\n"
        "logits_via_embedding: true\nfused_qkv: true\ntrainable_position_size: 128\nmax_target_length: 128\n"
        "ici_data_parallelism: 2\nici_fsdp_parallelism: 1\nici_tensor_parallelism: 4\n",
        ["logical_axis_rules=[[activation_embed,[]],[norm,[]]]", "remat_policy=none", "scan_layers=false"]),
    "a pipeline": ("base_emb_dim: 256\nbase_num_query_heads: 4\nbase_num_kv_heads: 2\nbase_mlp_dim: 512\n"
                   "base_num_decoder_layers: 4\nhead_dim: 64\nvocab_size: 1024\nmax_target_length: 128\n"
                   "per_device_batch_size: 4\nici_fsdp_parallelism: 4\nici_pipeline_parallelism: 2\n"
                   "num_layers_per_pipeline_stage: 2\nnum_pipeline_microbatches: 4\n", []),
}
_SAME = ("emb_dim", "num_query_heads", "num_kv_heads", "mlp_dim", "num_decoder_layers", "head_dim", "vocab_size",
         "max_target_length", "global_batch_size_to_train_on", "gradient_accumulation_steps", "scan_layers",
         "mesh")


@pytest.mark.parametrize("case", list(READ_CASES))
def test_layoutsearchs_reader_of_a_maxtext_config_agrees_with_maxtexts_loader(maxtext_python, tmp_path,
                                                                              monkeypatch, case):
    from layoutsearch.maxtext.config_in import resolved_config, run_of

    text, overrides = READ_CASES[case]
    path = tmp_path / "run.yml"
    path.write_text("base_config: base.yml\n" + text)
    monkeypatch.delenv(runner.ENV_PYTHON, raising=False)
    ours, reader = resolved_config(str(path), overrides)
    assert reader.startswith("layoutsearch's reader")
    theirs, reader = resolved_config(str(path), overrides, python=maxtext_python)
    assert reader.startswith("MaxText 0.2.5's own loader")
    assert {k: ours[k] for k in _SAME} == {k: theirs[k] for k in _SAME}
    assert (ours["remat_policy"] or "none") == (theirs["remat_policy"] or "none")
    assert [[n, list(a)] for n, a in ours["logical_axis_rules"]] == [
        [n, [a] if isinstance(a, str) else list(a or [])] for n, a in theirs["logical_axis_rules"]]
    mine, by_maxtext = run_of(ours, "ours"), run_of(theirs, "MaxText")
    assert mine.layout == by_maxtext.layout
    assert (mine.remat, mine.microbatches, mine.stage_axis) == (by_maxtext.remat, by_maxtext.microbatches,
                                                                 by_maxtext.stage_axis)
    assert graph_dict(mine.graph) == graph_dict(by_maxtext.graph)


def graph_dict(graph):
    from layoutsearch.ir.serialize import graph_to_dict

    return graph_to_dict(graph)
