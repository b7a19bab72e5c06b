"""Multi-host runs (:mod:`layoutsearch.distributed`): two local CPU processes of 4 simulated devices each (8 in
all) run a saved plan and get the single-process loss; a coordinator that does not answer is one readable
error within the timeout, not a hang.

The child processes set their own environment (``JAX_PLATFORMS=cpu``, 4 devices each): conftest.py's 8
devices are this process's. Every child runs under a subprocess timeout and is killed if it hangs.

Tolerance: the two processes run the same partitioned program as the single process (same mesh, same
shardings), but the collectives of a multi-process CPU job go through gloo, which may sum in another order
than the in-process ones: float32 reassociation, rtol 2e-5 as in test_program.py (observed: the first loss
bitwise equal, the next ones within ~1e-7). The two processes read the same replicated loss, so they must
agree exactly.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import layoutsearch as ls
from layoutsearch import distributed
from layoutsearch.errors import LayoutSearchError

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(layers=2, d_model=64, heads=4, seq=16, batch=8, vocab=128)
STEPS = 3

# A child process: join the job, load and compile the plan, train STEPS steps, print the losses as JSON.
WORKER = """
import json, sys
from layoutsearch import distributed
from layoutsearch.errors import LayoutSearchError

coordinator, n, pid, local, timeout, plan_path = sys.argv[1:7]
try:
    distributed.initialize(coordinator, int(n), int(pid), local_devices=int(local), timeout_s=float(timeout))
except LayoutSearchError as e:
    print(f"layoutsearch: error: {e}", file=sys.stderr)
    sys.exit(2)
if plan_path == "-":
    sys.exit(0)
import jax
import layoutsearch as ls
from layoutsearch.backend.train import Program

program = ls.Plan.load(plan_path).compile()
state = program.init(seed=0)
losses, norms = [], []
for i in range(%d):
    state, metrics = program.train_step(state, program.random_batch(seed=i))
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
mesh = [[d.process_index for d in row] for row in program.mesh.devices.reshape(program.mesh.devices.shape[0], -1)]
try:  # a mesh on process 0's devices only: process 1 has no part in it
    Program(program.graph, ls.Layout.from_rules(ls.Mesh.parse("model:4"), "d_ff:model"))
    small_mesh = None
except ls.LayoutSearchError as e:
    small_mesh = str(e)
print("RESULT " + json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                              "devices": jax.device_count(), "local": jax.local_device_count(),
                              "coordinator": distributed.is_coordinator(), "mesh_processes": mesh,
                              "losses": losses, "grad_norms": norms, "small_mesh": small_mesh}), flush=True)
""" % STEPS


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(local_devices: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # gRPC would honour a proxy
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", "")).strip()
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={local_devices}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


def _launch(coordinator: str, n: int, pid: int, *, local: int = 4, timeout: float = 120,
            plan: str = "-") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, coordinator, str(n), str(pid), str(local), str(timeout),
                             plan], cwd=ROOT, env=_env(local), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait(procs: list[subprocess.Popen], limit_s: float) -> list[tuple[int, str, str]]:
    """Each process's (exit status, stdout, stderr); every process killed and the test failed after
    ``limit_s``."""
    deadline, out = time.monotonic() + limit_s, []
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = [p.communicate()[1][-2000:] for p in procs]
        pytest.fail(f"a process hung for more than {limit_s} s and was killed; stderr tails: {tails}")
    return out


def _result(status: int, stdout: str, stderr: str) -> dict:
    assert status == 0, f"exit status {status}:\n{stderr[-3000:]}"
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]  # gloo prints on stdout too
    assert lines, f"no result printed:\n{stdout[-2000:]}\n{stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_two_processes_get_the_single_process_loss(tmp_path):
    plan = ls.search(ls.zoo.gpt(**SMALL), "data:2,model:4", precision="fp32", remat="none", microbatches=1,
                     baselines=False)
    path = tmp_path / "plan.json"
    plan.save(path)
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [_launch(coordinator, 2, pid, plan=str(path)) for pid in (0, 1)]
    try:
        program = plan.compile()  # in this process, on its 8 devices, while the children start
        state = program.init(seed=0)
        single, norms = [], []
        for i in range(STEPS):
            state, metrics = program.train_step(state, program.random_batch(seed=i))
            single.append(float(metrics["loss"]))
            norms.append(float(metrics["grad_norm"]))
    finally:
        results = [_result(*r) for r in _wait(procs, 400)]  # (three JAX processes compiling on 2 cores)
    assert [(r["process"], r["processes"], r["devices"], r["local"], r["coordinator"]) for r in results] == \
        [(0, 2, 8, 4, True), (1, 2, 8, 4, False)]
    # the mesh lies over both processes' devices: the major axis (data) across processes
    assert results[0]["mesh_processes"] == [[0] * 4, [1] * 4] == results[1]["mesh_processes"]
    assert results[0]["losses"] == results[1]["losses"] and results[0]["grad_norms"] == results[1]["grad_norms"]
    np.testing.assert_allclose(results[0]["losses"], single, rtol=2e-5, atol=0)
    np.testing.assert_allclose(results[0]["grad_norms"], norms, rtol=2e-5, atol=0)
    assert single[-1] < single[0]
    assert results[0]["small_mesh"] is None
    assert results[1]["small_mesh"] == ("mesh model:4 has no device of process 1 of 2: in a multi-process job the "
                                        "mesh must span the devices of every process (8 in all)")


def test_coordinator_that_does_not_answer_is_one_readable_error():
    # process 1 of 2, pointed at a port nobody listens on: a LayoutSearchError after ~5 s, not a hang
    coordinator = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    [(status, _, err)] = _wait([_launch(coordinator, 2, 1, timeout=5)], 60)
    took = time.monotonic() - start
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"layoutsearch: error: the coordinator {coordinator} did not answer within 5 s "
                               "(process 1 of 2"), err
    assert took >= 5  # (a hang fails in _wait)


def test_unresolvable_coordinator_host():
    [(status, _, err)] = _wait([_launch("nosuchhost.invalid:1234", 2, 1, timeout=5)], 60)
    assert status == 2 and err.startswith("layoutsearch: error: cannot resolve the coordinator's host "
                                          "'nosuchhost.invalid' (process 1 of 2"), err


def test_missing_processes_end_the_coordinator_with_one_line():
    # process 0 of 2 and no process 1: JAX's runtime would abort with a C++ stack trace after the timeout;
    # the watchdog ends the process first with one line
    coordinator = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    [(status, _, err)] = _wait([_launch(coordinator, 2, 0, timeout=3)], 60)
    took = time.monotonic() - start
    assert status == distributed.EXIT_STATUS, err
    ours = [ln for ln in err.splitlines() if ln.startswith("layoutsearch: error:")]
    assert ours == [f"layoutsearch: error: process 0 of 2 (the coordinator, on {coordinator}) waited 3 s for the "
                    "other processes: start process 1 with the same coordinator and number of processes"], err
    assert "Check failure" not in err and "Traceback" not in err, err
    assert took >= 3  # (a hang fails in _wait)


@pytest.mark.parametrize("args, message", [
    (("localhost", 2, 0), "is not HOST:PORT"),
    (("localhost:", 2, 0), "is not HOST:PORT"),
    (("host:port", 2, 0), "is not HOST:PORT"),
    (("localhost:0", 2, 0), "port 0 is not in 1..65535"),
    (("localhost:70000", 2, 0), "port 70000 is not in 1..65535"),
    (("localhost:1234", 0, 0), "num_processes must be at least 1"),
    (("localhost:1234", 2, 2), "process_id 2 is not below num_processes 2"),
    (("localhost:1234", 2, -1), "process_id must be at least 0"),
    (("localhost:1234", "2", 0), "num_processes must be an integer"),
])
def test_invalid_arguments(args, message):
    with pytest.raises(LayoutSearchError, match=re.escape(message)):
        distributed.initialize(*args)


def test_invalid_options_and_a_started_jax():
    with pytest.raises(LayoutSearchError, match="local_devices must be at least 1"):
        distributed.initialize("localhost:1234", 1, 0, local_devices=0)
    with pytest.raises(LayoutSearchError, match="timeout_s must be a positive number"):
        distributed.initialize("localhost:1234", 1, 0, timeout_s=0)
    # conftest.py has started JAX in this process: too late to join a job, and nothing is changed
    with pytest.raises(LayoutSearchError, match="JAX has already started"):
        distributed.initialize("127.0.0.1:1234", 1, 0)
    assert distributed.is_coordinator()
    assert distributed.parse_coordinator("[::1]:8476") == ("::1", 8476)
    assert distributed.parse_coordinator("10.0.0.1:1234") == ("10.0.0.1", 1234)


def test_cli_run_on_two_processes_matches_one(tmp_path):
    """``layoutsearch run PLAN --coordinator ... --num-processes 2 --process-id I`` on two processes (4 CPU
    devices each) prints the losses of the same plan run in one process."""
    plan = ls.search(ls.zoo.gpt(**SMALL), "data:2,model:4", precision="fp32", remat="none", microbatches=1,
                     baselines=False)
    path = tmp_path / "plan.json"
    plan.save(path)
    coordinator = f"127.0.0.1:{_free_port()}"
    argv = [sys.executable, str(ROOT / "cli.py"), "run", str(path), "--steps", str(STEPS), "--json",
            "--coordinator", coordinator, "--num-processes", "2", "--local-devices", "4", "--timeout", "120"]
    procs = [subprocess.Popen([*argv, "--process-id", str(pid)], cwd=ROOT, env=_env(4), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
    try:
        program = plan.compile()
        state = program.init(seed=0)
        single = []
        for i in range(STEPS):
            state, metrics = program.train_step(state, program.random_batch(seed=i))
            single.append(float(metrics["loss"]))
    finally:
        outs = _wait(procs, 400)
    for status, stdout, stderr in outs:
        assert status == 0, stderr[-3000:]
        doc = json.loads(stdout[stdout.index("{\n"):])  # gloo prints its own lines on stdout first
        assert doc["processes"] == 2 and doc["devices"] == 8
        np.testing.assert_allclose([s["loss"] for s in doc["steps"]], single, rtol=2e-5, atol=0)
