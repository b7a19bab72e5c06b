"""Cost reports in plain words: each kind of communication named with the dims that cause it."""

import layoutsearch as ls
from layoutsearch.costmodel.explain import explain

G = ls.zoo.gpt(layers=2, d_model=256, heads=4, seq=64, batch=16, vocab=512)


def _lines(mesh, rules):
    return explain(ls.estimate(G, ls.Layout.from_rules(mesh, rules), "h100"), G)


def test_data_parallel():
    lines = _lines("data:8", "batch:data")
    assert lines[0].startswith("gradient all-reduce over data (batch): 37 per step")
    assert any(line.startswith("loss all-reduce over data") for line in lines)
    assert not any("parameter all-gather" in line or "critical-path" in line for line in lines)
    assert lines[-1].startswith("peak memory") and "optimizer state" in lines[-1]


def test_fsdp_and_tensor_parallel():
    lines = _lines("data:2,model:4", "batch:data,d_ff:model,heads:model,d_model:data")
    kinds = {line.split(":")[0] for line in lines}
    assert "critical-path all-reduce over model (heads, d_ff)" in kinds
    assert "parameter all-gather over data (d_model)" in kinds
    assert "gradient reduce-scatter over data (batch, d_model)" in kinds


def test_no_communication():
    lines = _lines("data:1", "")
    assert lines[0] == "no communication: every op runs on local data."


def test_without_overlap_nothing_is_hidden():
    lines = explain(ls.estimate(G, ls.Layout.from_rules("data:8", "batch:data"), "h100", overlap=0), G)
    assert lines[0].startswith("gradient all-reduce over data (batch)") and "hidden" not in lines[0]
