"""``layoutsearch calibrate`` and hardware profile files (``--hardware FILE``)."""

import copy
import json
import math
import subprocess
import sys

import pytest
from clirun import run, run_json

from layoutsearch import calibrate as calibration
from layoutsearch.calibrate import (calibrate, fit_alpha_beta, kernel_count, plan_for, preset_for_device_kind,
                                  write_profile)
from layoutsearch.errors import HardwareError
from layoutsearch.hwprofile import FORMAT, VERSION, hardware_to_json, load_profile, read_profile, save_profile
from layoutsearch.mesh import PRESETS, Hardware, Mesh, hardware

MESH = "data:2,model:4"


@pytest.fixture(scope="module")
def calibrated():
    return calibrate(MESH, quick=True)


def _positive(x):
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_calibrate_measures_positive_finite_figures(calibrated):
    hw, m = calibrated
    assert isinstance(hw, Hardware) and hw.name == "calibrated-cpu"
    for v in (hw.peak_flops, hw.peak_flops_fp32, hw.hbm_bytes, hw.hbm_bandwidth, hw.fast_link.bandwidth,
              hw.slow_link.bandwidth):
        assert _positive(v)
    for e in (hw.matmul_efficiency, hw.memory_efficiency, hw.fast_link.efficiency, hw.slow_link.efficiency):
        assert 0 < e <= 1
    for link in (hw.fast_link, hw.slow_link):
        assert math.isfinite(link.latency) and link.latency >= 0
    # CPU: no vendor peak, so the peaks are the best achieved rates (efficiency 1), and XLA-on-CPU behaviour
    rows = m["matmul"]["rows"]
    assert {r["dtype"] for r in rows} == {"bfloat16", "float32"}
    assert any(r["m"] == r["n"] == r["k"] for r in rows) and any(len({r["m"], r["n"], r["k"]}) > 1 for r in rows)
    assert all(_positive(r["seconds"]) and _positive(r["flops_per_s"]) for r in rows)
    assert hw.peak_flops == max(r["flops_per_s"] for r in rows if r["dtype"] == "bfloat16")
    assert hw.matmul_efficiency == hw.memory_efficiency == 1.0
    assert hw.hbm_bandwidth == m["hbm"]["bandwidth"] and not hw.fusion and not hw.reduce_scatter
    # collectives: both axes fitted; both use the fast link, which takes the slower axis's figures
    axes = m["collectives"]["axes"]
    assert set(axes) == {"data", "model"} and axes["model"]["size"] == 4
    for a in axes.values():
        for kind in ("all-reduce", "all-gather"):
            assert a[kind]["alpha"] >= 0 and _positive(a[kind]["bandwidth"]) and len(a[kind]["samples"]) >= 3
        assert a["link"] == "fast"
    assert hw.fast_link.bandwidth == min(a["bandwidth"] for a in axes.values())
    assert m["collectives"]["links"]["slow"]["measured"] is False
    assert hw.slow_link == PRESETS["cpu-sim"].slow_link
    # said to be no performance figure, in the measurements, the metadata and the source
    assert "not performance figures" in m["note"] and m["meta"]["simulated"] is True
    assert m["meta"]["device_count"] == 8 and m["meta"]["mesh"] == MESH and m["meta"]["platform"] == "cpu"
    assert hw.source.startswith("measured by layoutsearch calibrate on ") and "JAX " in hw.source
    assert set(hw.links_for(Mesh.parse(MESH))) == {"data", "model"}


def test_profile_round_trips_to_an_equal_hardware(calibrated, tmp_path):
    hw, m = calibrated
    path = tmp_path / "hw.json"
    write_profile(hw, m, path)
    assert load_profile(path) == hw
    assert hardware(str(path)) == hw
    loaded, doc = read_profile(path)
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    assert set(doc["calibrated"]) >= {"date", "jax_version", "platform", "device_kind", "device_count", "mesh"}
    assert set(doc["measurements"]) >= {"matmul", "hbm", "collectives"}
    assert doc["hardware"]["matmul_tile"] == [1, 1, 1] and doc["hardware"]["axis_links"] == {}
    for name, preset in PRESETS.items():  # every preset, with pinned axes too
        p = tmp_path / f"{name}.json"
        save_profile(preset.replace(axis_links={"data": "slow"}), p)
        assert load_profile(p) == preset.replace(axis_links={"data": "slow"}), name


def test_calibrate_with_a_base_keeps_its_vendor_peaks():
    hw, m = calibrate("data:1", base="tpu-v5e", quick=True)
    base = PRESETS["tpu-v5e"]
    assert hw.name == "calibrated-tpu-v5e"
    assert (hw.peak_flops, hw.hbm_bandwidth, hw.matmul_tile, hw.hbm_bytes) == (
        base.peak_flops, base.hbm_bandwidth, base.matmul_tile, base.hbm_bytes)
    best = max(r["flops_per_s"] for r in m["matmul"]["rows"] if r["dtype"] == "bfloat16")
    assert hw.matmul_efficiency == pytest.approx(best / base.peak_flops)
    assert hw.memory_efficiency == pytest.approx(m["hbm"]["bandwidth"] / base.hbm_bandwidth)
    assert m["collectives"]["axes"] == {}  # no axis of size >= 2: the links stay the preset's
    assert (hw.fast_link, hw.slow_link) == (base.fast_link, base.slow_link)


def test_fit_alpha_beta_recovers_the_ring_model_and_clamps():
    n, alpha, bw = 4, 5e-6, 1e11
    samples = [(2 * (n - 1), 2 * (n - 1) / n * b, 2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw)
               for b in (1e3, 1e5, 1e7)]
    fit = fit_alpha_beta(samples)
    assert fit["alpha"] == pytest.approx(alpha) and fit["bandwidth"] == pytest.approx(bw)
    fit = fit_alpha_beta([(2, 1e3, 1e-9), (2, 1e6, 1e-3)])  # negative intercept: alpha clamped to 0
    assert fit["alpha"] == 0 and fit["bandwidth"] > 0 and "clamped" in fit["fit"]


def test_the_kernel_launch_time_is_measured_and_reaches_the_profile(calibrated):
    hw, m = calibrated
    k = m["kernels"]
    assert [r["steps"] for r in k["rows"]] == list(plan_for("cpu", quick=True).kernels)
    counts = [r["kernels"] for r in k["rows"]]
    assert counts == sorted(counts) and counts[0] >= k["rows"][0]["steps"]  # a step is at least one kernel
    assert all(_positive(r["seconds"]) for r in k["rows"])
    assert hw.kernel_latency == k["kernel_latency"] and math.isfinite(hw.kernel_latency) and hw.kernel_latency >= 0


def test_kernel_count_reads_the_compiled_program():
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((256,), jnp.float32)
    assert kernel_count(jax.jit(lambda v: v * 2.0 + 1.0).lower(x).compile().as_text()) == 1  # one fusion

    def chain(n):
        def run(v):
            for _ in range(n):
                v = v - jnp.mean(v)
            return v
        return kernel_count(jax.jit(run).lower(x).compile().as_text())

    assert chain(2) < chain(4) < chain(8) and chain(8) - chain(4) == 2 * (chain(4) - chain(2))


def test_the_kernel_launch_fit_is_the_slope_per_kernel(monkeypatch):
    """With a device that takes 7 us per program plus 2 us per kernel, the fit recovers the 2 us."""
    monkeypatch.setattr(calibration, "_time", lambda fn, args, plan: 7e-6 + 2e-6 * kernel_count(fn.as_text()))
    import jax

    k = calibration._measure_kernels(jax.devices("cpu")[0], plan_for("cpu", quick=True))
    assert k["kernel_latency"] == pytest.approx(2e-6, rel=1e-9) and "clamped" not in k["fit"]


@pytest.mark.parametrize("kind, preset", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA A100-SXM4-80GB", "a100"), ("TPU v5 lite", "tpu-v5e"),
                                          ("TPU v5p", "tpu-v5p"), ("TPU v4", "tpu-v4"), ("cpu", None)])
def test_device_kinds_map_to_presets(kind, preset):
    assert preset_for_device_kind(kind) == preset


def test_modules_do_not_import_jax():
    code = ("import sys, layoutsearch.mesh, layoutsearch.hwprofile, layoutsearch.calibrate; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the command line -------------------------------------------------------------------------------------------------

def test_calibrate_command_writes_a_profile_that_every_command_reads(capsys, tmp_path):
    out = tmp_path / "hw.json"
    code, stdout, err = run(capsys, "calibrate", "--out", out, "--mesh", MESH, "--quick")
    assert code == 0, err
    for text in ("calibrated-cpu", "not performance figures", "m x n x k", "256x256x256", "HBM:", "all-reduce",
                 "all-gather", "alpha (us)", "fast_link", f"wrote {out}"):
        assert text in stdout, text
    assert json.loads(out.read_text())["calibrated"]["simulated"] is True

    d = run_json(capsys, "cost", "gpt", "--mesh", MESH, "--layout", "batch:data,d_ff:model", "--hardware", out)
    hw = load_profile(out)
    assert d["hardware"]["name"] == "calibrated-cpu" and d["hardware"]["peak_flops"] == hw.peak_flops
    assert _positive(d["step_s"]) and _positive(d["comm_s"])

    code, stdout, err = run(capsys, "hardware", out, "--mesh", MESH)
    assert code == 0, err
    assert "calibrated-cpu" in stdout and "measured by layoutsearch calibrate" in stdout
    assert "data uses the fast link" in stdout
    d = run_json(capsys, "hardware", out, "--hw", "peak_flops=1e12")
    assert d["hardware"]["peak_flops"] == 1e12 and d["hardware"]["name"] == "calibrated-cpu"
    d = run_json(capsys, "layout", "gpt", "--mesh", MESH, "--layout", "batch:data", "--hardware", out)
    assert d["hardware"]["name"] == "calibrated-cpu"


def test_calibrate_json_prints_the_result(capsys, tmp_path):
    out = tmp_path / "hw.json"
    d = run_json(capsys, "calibrate", "--out", out, "--mesh", "data:2", "--quick")
    assert d["out"] == str(out) and d["hardware"]["name"] == "calibrated-cpu"
    assert d["calibrated"]["mesh"] == "data:2" and set(d["measurements"]["collectives"]["axes"]) == {"data"}
    assert load_profile(out) == hardware(str(out))


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "data:x"], "bad mesh axis 'data:x'"),
    (["--mesh", "data:16"], "mesh data:16 needs 16 devices and JAX has 8"),
    (["--base", "tpu-v9"], "unknown hardware 'tpu-v9'"),
    (["--out", "/nonexistent-dir/hw.json"], "cannot write hardware profile '/nonexistent-dir/hw.json'"),
])
def test_calibrate_bad_input_is_one_line(capsys, tmp_path, argv, message):
    base = ["calibrate", "--out", str(tmp_path / "hw.json"), "--quick"]
    code, out, err = run(capsys, *base, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and err.startswith("layoutsearch: error: ")


# -- bad profiles -----------------------------------------------------------------------------------------------------

def _doc():
    return {"format": FORMAT, "version": VERSION, "hardware": hardware_to_json(PRESETS["h100"])}


def _with(path, value):
    doc = _doc()
    *keys, last = path.split(".")
    target = doc
    for k in keys:
        target = target[k]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return json.dumps(doc)


_DELETE = object()


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (_with("hardware.peak_flops", _DELETE), "hardware.peak_flops is missing"),
    (_with("hardware.hbm_bandwidth", -1), "hardware.hbm_bandwidth = -1.0 must be positive"),
    (_with("hardware.peak_flops", 0), "hardware.peak_flops = 0.0 must be positive"),
    (_with("hardware.matmul_efficiency", 1.5), "hardware.matmul_efficiency = 1.5: an efficiency is at most 1"),
    (_with("hardware.peak_flops", "fast"), "hardware.peak_flops must be a number, got a string 'fast'"),
    (_with("hardware.warp_speed", 9), "unknown field hardware.warp_speed"),
    (_with("hardware.fast_link.latency", -1e-6), "hardware.fast_link.latency = -1e-06 must be >= 0"),
    (_with("hardware.slow_link.bandwidth", _DELETE), "hardware.slow_link.bandwidth is missing"),
    (_with("hardware.devices_per_node", 2.5), "hardware.devices_per_node = 2.5 must be an integer"),
    (_with("hardware.fusion", "yes"), "hardware.fusion must be true or false"),
    (_with("hardware.matmul_tile", [128, 128]), "hardware.matmul_tile must be a list of 3 numbers"),
    (_with("hardware.axis_links", {"data": "medium"}), "hardware.axis_links.data must be \"fast\" or \"slow\""),
    (_with("extra", 1), "unknown field extra"),
    (_with("hardware", _DELETE), "the \"hardware\" object is missing"),
])
def test_bad_profiles_are_one_clear_error(capsys, tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HardwareError, match="hardware profile .*bad.json") as e:
        hardware(str(path))
    assert message in str(e.value)
    code, out, err = run(capsys, "cost", "mtf-ffn", "--mesh", "data:8", "--layout", "batch:data",
                         "--hardware", path)
    assert code == 2 and out == ""
    assert message in err and str(path) in err and err.count("\n") == 1


def test_profiles_may_leave_out_fields_with_defaults(tmp_path):
    h = {"name": "mine", "peak_flops": 1e14, "hbm_bytes": 1.6e10, "hbm_bandwidth": 1e12,
         "fast_link": {"bandwidth": 1e11, "latency": 1e-6}, "slow_link": {"bandwidth": 1e10, "latency": 1e-5},
         "devices_per_node": 4}
    path = tmp_path / "mine"  # an existing file names a profile even without the .json suffix
    path.write_text(json.dumps({"hardware": h}))
    hw = hardware(str(path))
    assert hw == Hardware("mine", 1e14, 1.6e10, 1e12, hw.fast_link, hw.slow_link, 4)
    assert hw.fast_link.efficiency == 1.0 and hw.peak_flops_fp32 == 1e14 and hw.matmul_tile == (1, 1, 1)
    doc = copy.deepcopy({"hardware": h})
    doc["hardware"]["peak_flops_fp32"] = 0  # a default of 0 ("same as peak_flops") is allowed
    path.write_text(json.dumps(doc))
    assert hardware(str(path)).peak_flops_fp32 == 1e14
    with pytest.raises(HardwareError, match="unknown hardware 'mine.txt'"):
        hardware("mine.txt")  # neither a preset nor a file: today's message
