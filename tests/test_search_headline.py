"""The headline searches (README "Search as a user runs it", ``bench/bench_search.py --cli``) find the plans they
found when their speed was last measured: the chosen plan and the two runner-ups, each with its remat policy,
micro-batch count and predicted step, proven optimal. The slow tier (``pytest -m slow``): about a minute.

Recorded 2026-12-04 (the plans every change to the search since 2026-12-03 was checked against, field by field
on the CLI's ``--json``). A change to the cost model that moves these steps updates them here, saying why."""

import pytest

from layoutsearch import zoo
from layoutsearch.solvers.search import search

FSDP_TP = "batch:data+fsdp,vocab:model,heads:model,d_ff:model,d_model:data+fsdp,d_model:model"
V5P = "batch:data+fsdp+seq,vocab:model,heads:model,d_ff:model,d_model:{},d_model:model"

HEADLINE = [  # (model overrides, mesh, hardware, pipeline, [(rules, remat, micro-batches, step_s)] best first)
    ({"preset": "gpt3-175b"}, "data:16,fsdp:8,model:8", "tpu-v4", "auto", [
        (FSDP_TP, "selective", 4, 16.395867120207978),
        (FSDP_TP.replace("d_model:model", "seq:model"), "selective", 4, 18.861624859247208),
        (FSDP_TP, "full", 1, 19.673761344773983)]),
    ({"preset": "megatron-145.6b", "batch": 2304}, "pipe:8,data:24,model:8", "a100", "auto", [
        ("batch:pipe+data,vocab:model,heads:model,d_ff:model,d_model:pipe+data,d_model:model", "none", 2,
         13.40625162300432),
        ("batch:pipe+data,vocab:model,heads:model,d_ff:model,d_model:data,d_model:model", "none", 2,
         13.41361192897287),
        ("batch:pipe+data,vocab:model,heads:model,d_ff:model,d_model:pipe+data,d_model:model", "selective", 1,
         13.454035285388821)]),
    ({"preset": "llama3-70b"}, "data:8,fsdp:8,model:8", "h100", "off", [
        ("batch:data+fsdp+model,d_model:fsdp+model", "full", 1, 27.024509489711754),
        ("batch:data+fsdp+model,d_model:data+fsdp+model", "full", 1, 27.0317940351508),
        ("batch:data+fsdp+model,d_model:fsdp+model", "full", 2, 27.128595832306672)]),
    ({"preset": "gpt3-175b", "batch": 2048}, "data:32,fsdp:16,model:8,seq:2", "tpu-v5p", "off", [
        (V5P.format("data+fsdp"), "none", 1, 1.5339674161536208),
        (V5P.format("data+fsdp+seq"), "none", 1, 1.5342210220575792),
        (V5P.format("data+seq"), "none", 1, 1.5363630399757606)]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", HEADLINE, ids=lambda c: f"{c[0]['preset']}-{c[2]}")
def test_a_headline_search_finds_the_recorded_plans(case):
    over, mesh, hw, pipeline, want = case
    plan = search(zoo.build("gpt", **over), mesh, hardware=hw, pipeline=pipeline)
    got = [(p.layout.describe(), p.remat, p.microbatches, p.step_s) for p in (plan.chosen, *plan.runner_ups)]
    assert plan.optimal and plan.chosen.stage_axis is None
    assert [g[:3] for g in got] == [w[:3] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-9)
