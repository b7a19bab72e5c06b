"""Bound builds split over forked processes (layoutsearch.solvers.forked): the same values as one process, a
failed child's share priced again by the parent, no child left behind, and no fork where it is unsafe.

The test process imports JAX (conftest), where the module never forks: the forking checks run in a fresh
interpreter without it."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from layoutsearch.solvers import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TWO_CORES = pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                               reason="forks only on Linux with two cores or more")


def run_fresh(code: str) -> str:
    """``code`` run by a fresh interpreter without JAX; its stdout (fails on a non-zero exit)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("LAYOUTSEARCH_PROCESSES", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@TWO_CORES
def test_a_search_split_over_processes_finds_what_one_process_finds():
    """A small GPT on 8 devices with shares of 4 candidates (so that its builds fork): the bounds of every
    candidate, and the search's plans, runner-ups and decisions, equal those of one process."""
    out = run_fresh("""
        import os, numpy as np
        from layoutsearch import zoo
        from layoutsearch.costmodel.step import training_step
        from layoutsearch.mesh import Mesh, hardware
        from layoutsearch.solvers import forked
        from layoutsearch.solvers.pricer import Pricer
        from layoutsearch.solvers.rules_search import RulesSearch, rules_candidates
        from layoutsearch.solvers.search import search
        forked.MIN_SHARE = 4
        assert "jax" not in __import__("sys").modules
        model = zoo.build("gpt", layers=2, batch=16)
        mesh, hw = Mesh.of("data:2,model:4"), hardware("tpu-v4")
        g = training_step(model)
        def bounds():
            pricer = Pricer(g, mesh, hw)
            rs = RulesSearch(g, mesh, hw, pricer, rules_candidates(g, mesh, hw, pricer, None), "full")
            idx = np.arange(len(rs.cands))
            return rs.overlap_bounds(idx), rs.overlap_bounds(idx, optimizer=False), len(idx)
        def plans():
            p = search(model, mesh, hardware=hw, memory_limit=3e6, top=3)
            return [(c.rules, c.remat, c.microbatches, c.step_s, c.memory_bytes) for c in (p.chosen, *p.runner_ups)], \\
                [(d.kind, d.option, d.step_s, d.why) for d in p.decisions]
        os.environ["LAYOUTSEARCH_PROCESSES"] = "1"
        one = bounds(), plans()
        os.environ["LAYOUTSEARCH_PROCESSES"] = "2"
        assert forked.processes(one[0][2]) == 2
        two = bounds(), plans()
        for (a, b) in zip(one[0][:2], two[0][:2]):
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), "bounds differ"
        assert one[1] == two[1], (one[1], two[1])
        print("ok", one[0][2], len(one[1][0]))
    """)
    assert out.startswith("ok")


@TWO_CORES
def test_a_failed_child_is_priced_again_and_an_error_leaves_no_child():
    """A share whose child dies is priced by the parent (the results complete and in order); an error in the
    work raises in the parent, with every child reaped."""
    out = run_fresh("""
        import os, numpy as np
        from layoutsearch.solvers import forked
        forked.MIN_SHARE = 1
        os.environ["LAYOUTSEARCH_PROCESSES"] = "2"
        parent = os.getpid()
        assert forked.processes(9) == 2
        def dies_in_children(share):
            if os.getpid() != parent and share[0] > 4:
                os._exit(9)
            return [share * 10, np.array([len(share)])]
        parts = forked.split(9, dies_in_children)
        assert len(parts) == 2 and np.concatenate([p[0] for p in parts]).tolist() == list(range(0, 90, 10))
        def fails(share):
            raise ValueError(f"share {share[0]}")
        try:
            forked.split(9, fails)
        except ValueError as e:
            assert str(e) == "share 0", e
        else:
            raise AssertionError("no error")
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            print("ok")
    """)
    assert out.strip() == "ok"


def test_no_fork_where_it_is_unsafe_or_asked_not_to(monkeypatch):
    """One process with JAX imported (as here), with another Python thread running, with
    LAYOUTSEARCH_PROCESSES=1, or for fewer candidates than two shares."""
    assert "jax" in sys.modules and forked.processes(10_000) == 1
    monkeypatch.delitem(sys.modules, "jax")
    monkeypatch.setenv("LAYOUTSEARCH_PROCESSES", "1")
    assert forked.processes(10_000) == 1
    monkeypatch.setenv("LAYOUTSEARCH_PROCESSES", "2")
    assert forked.processes(2 * forked.MIN_SHARE - 1) == 1
    if sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) > 1:
        assert forked.processes(2 * forked.MIN_SHARE) == 2
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            assert forked.processes(2 * forked.MIN_SHARE) == 1
        finally:
            stop.set()
            t.join()
    parts = forked.split(5, lambda share: [share + 1])
    assert [p[0].tolist() for p in parts] == [[1, 2, 3, 4, 5]]
