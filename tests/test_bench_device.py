"""``bench/bench_device.py`` (predicted against measured on an accelerator) end to end on CPU, at toy sizes, so
that the script a session with a GPU runs in its short device lease is known to work before it gets there."""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_device  # noqa: E402


def test_the_device_bench_measures_predicts_and_validates(tmp_path):
    out = ["--out", str(tmp_path), "--budget-s", "1e9"]  # (a slow machine must not skip configurations)
    assert bench_device.main(["--smoke", "--only", "llama", "--only", "flash", "--steps", "3", *out]) == 0
    doc = json.loads((tmp_path / "device.json").read_text())
    rows = {r["config"]: r for r in doc["rows"]}
    assert set(rows) == {"llama-0.7b none", "gpt-0.7b flash"}
    for row in rows.values():
        assert "error" not in row, row.get("traceback")
        assert row["mesh"] == "data:1" and row["measured_step_s"] > 0 and row["compiled_memory_bytes"] > 0
        assert row["predicted_step_s"] > 0 and math.isfinite(row["loss_last"])
    flash = rows["gpt-0.7b flash"]
    assert flash["attention"] == "flash" and flash["predicted_step_s"] != flash["predicted_standard_step_s"]
    assert doc["meta"]["hardware"] == "cpu-sim" and "error" not in doc["meta"]["validate"]
    md = (tmp_path / "device.md").read_text()
    assert "| llama-0.7b none | data:1 `batch:data` |" in md and "`validate` on" in md


def test_the_device_profile_traces_kernels_back_to_ir_ops(tmp_path):
    """``bench/profile_device.py`` on CPU (its own process: the XLA dump flags must be set before JAX starts):
    every traced thunk of the step is traced back to an HLO instruction, and the IR ops of the model appear."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, str(root / "bench" / "profile_device.py"), "--smoke", "--only",
                          "gpt-0.3b", "--budget-s", "1e9", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    row, = json.loads((tmp_path / "profile.json").read_text())["rows"]
    assert "error" not in row, row.get("traceback")
    t = row["time"]
    assert t["kernels"] > 0 and t["kernel_s"] > 0 and t["unattributed_s"] <= 0.01 * t["kernel_s"]
    assert {"forward matmul", "backward matmul"} <= set(t["by_class"]) <= set(row["predicted_compute"]) | {
        "forward other", "backward other", "optimizer other", "xla other"}
    ops = set(t["ops_traced"])  # every op, not the timed top list: which ops take longest depends on the machine
    assert "logits" in ops and any(op.startswith("layer.0/") for op in ops)
    assert {op for op, _ in t["top_ops"]} <= ops
    mem = row["memory"]
    assert mem["peak_bytes"] > 0 and mem["top"][0]["bytes"] >= mem["top"][-1]["bytes"]
    assert "### gpt-0.3b none" in (tmp_path / "profile.md").read_text()


def test_the_truth_bench_reprices_every_recorded_device_step():
    """``bench/bench_truth.py`` without an accelerator: each step time of ``bench/device_steps.json`` against
    today's prediction of the same configuration and preset."""
    import bench_truth

    lines = bench_truth.devices_recorded()
    rec = json.loads(bench_truth.RECORDED.read_text())
    assert rec["preset"] == "h200" and {r["config"] for r in rec["rows"]} <= {c.name for c in bench_device.CONFIGS}
    rows = [line for line in lines if "measured / predicted" in line and "ms" in line]
    assert len(rows) == len(rec["rows"]) and lines[-1].startswith("measured / predicted today: ")
    for line, r in zip(rows, rec["rows"], strict=True):
        assert r["config"] in line and f"measured {r['measured_step_s'] * 1e3:7.1f} ms" in line
