"""``bench/bench_device.py`` (predicted against measured on an accelerator) end to end on CPU, at toy sizes, so
that the script a session with a GPU runs in its short device lease is known to work before it gets there."""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_device  # noqa: E402


def test_the_device_bench_measures_predicts_and_validates(tmp_path):
    out = ["--out", str(tmp_path)]
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
