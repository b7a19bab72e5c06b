"""The exact DP of :mod:`layoutsearch.solvers.partition.dp` against brute force on random small DAGs, with the
block of ideals it prices at once (``_CANDIDATES`` pairs) shrunk to a few, so that a pair's smaller ideal often
lies in the same block as the larger one: the DP must read its value only once final (``dp[s][I]`` depends
on ``dp[s - e_k][J]`` alone, and the blocks run the device-count states in order)."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest

import layoutsearch.solvers.partition.dp as dp_module
from layoutsearch.costdag import CostDAG, DeviceKind, Edge, Node
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition import partition

DEFAULT = dp_module._CANDIDATES
BLOCKS = [1, 3, 8, 30, 200, DEFAULT]
"""``_CANDIDATES`` values (candidate pairs per block, so ideals per block about that over the window width): one
ideal per block (1), a few (3-200), and every ideal at once at these sizes."""


def random_dag(rng, n, kinds=None):
    """``n`` nodes in a shuffled file order, random edges (some nodes sending different tensors to different
    consumers), compute, memory and activations; with ``kinds``, per-kind times (some nodes runnable on one
    kind only), co-location groups and backward nodes."""
    names = [f"v{i}" for i in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    density = rng.choice([0.15, 0.3, 0.5])
    nodes = []
    for i in order:
        if kinds:
            where = rng.choice(["both", "both", "acc", "cpu"]) if len(kinds) > 1 and kinds[1].count else "acc"
            times = {}
            if where != "cpu":
                times["accelerator"] = float(rng.randint(0, 9))
            if where != "acc":
                times["cpu"] = float(rng.randint(0, 20))
            nodes.append(Node(names[i], times=times, memory_bytes=rng.randint(0, 6),
                              group=rng.choice([None, None, None, None, "g0"]),
                              backward=rng.random() < 0.3 and i >= n // 2))
        else:
            nodes.append(Node(names[i], rng.randint(0, 9) * rng.choice([1.0, 0.1, 1.37]),
                              memory_bytes=rng.randint(0, 6), activation_bytes=rng.randint(0, 2)))
    edges = []
    for j in range(n):
        cost, split = float(rng.randint(0, 4)), rng.random() < 0.5
        for i in range(j + 1, n):
            if rng.random() < density:
                edges.append(Edge(names[j], names[i], float(rng.randint(0, 4)) if split else cost,
                                  tensor=f"to{i}" if split else None))
    if kinds:
        return CostDAG(tuple(nodes), tuple(edges), name="random", devices=kinds, time_unit="unit")
    return CostDAG(tuple(nodes), tuple(edges), name="random")


def random_case(seed):
    """(dag, stages, keyword arguments of :func:`partition`): ``stages`` identical stages (throughput or GPipe,
    2-4 stages, 6-12 nodes, some memory limits) or device kinds (1-3 accelerators, 0-1 CPU core)."""
    rng = random.Random(seed)
    if rng.random() < 0.7:
        k = rng.randint(2, 4)
        n = rng.randint(6, {2: 12, 3: 10, 4: 8}[k])
        dag = random_dag(rng, n)
        objective, mb = rng.choice(["throughput", "throughput", "gpipe"]), rng.randint(1, 3)
        mem = [node.memory_bytes + mb * node.activation_bytes for node in dag.nodes]
        tight = rng.randint(0, 3)
        limit = None if tight == 0 else max(max(mem), sum(mem) // k + tight * 3 - 3)
        at_most = objective == "throughput" and rng.random() < 0.3
        return dag, k, {"objective": objective, "microbatches": mb, "memory_limit": limit, "at_most": at_most}
    acc, cpu = rng.randint(1, 3), rng.randint(0, 1)
    dag = random_dag(rng, rng.randint(4, 6 if acc + cpu >= 3 else 8),
                     (DeviceKind("accelerator", acc), DeviceKind("cpu", cpu, host=True)))
    total = sum(node.memory_bytes for node in dag.nodes)
    limit = rng.choice([None, max(6, total // acc), max(6, total // acc + 3)])
    dag = replace(dag, devices=(DeviceKind("accelerator", acc, limit), DeviceKind("cpu", cpu, host=True)))
    return dag, None, {"at_most": rng.random() < 0.5}


def objective(dag, stages, **kw):
    """The objective, or None when nothing fits."""
    try:
        return partition(dag, stages, **kw).objective
    except PartitionError:
        return None


def same(a, b):
    return a is None and b is None or a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9,
                                                                                         abs_tol=1e-12)


@pytest.mark.parametrize("candidates", BLOCKS)
def test_dp_equals_brute_force_with_any_block_size(candidates, monkeypatch):
    monkeypatch.setattr(dp_module, "_CANDIDATES", candidates)
    for seed in range(100):
        dag, stages, kw = random_case(seed)
        got, expected = objective(dag, stages, solver="dp", **kw), objective(dag, stages, solver="brute", **kw)
        assert same(got, expected), f"seed {seed}, _CANDIDATES={candidates}: dp {got}, brute force {expected}"


def test_tiny_blocks_put_both_ideals_of_pairs_in_one_block(monkeypatch):
    """The test above exercises the case in question: blocks of several ideals where the smaller ideal of a
    pair is in the same block as the larger."""
    seen = {"pairs": 0, "same_block": 0}
    pairs = dp_module.DP._pairs

    def counting(self, a, b, lo, hi):
        q, p, loads = pairs(self, a, b, lo, hi)
        position = np.empty(self.I.m, dtype=int)
        position[self.order] = np.arange(len(self.order))
        seen["pairs"] += len(p)
        seen["same_block"] += int(((position[p] >= a) & (position[p] < b)).sum())
        return q, p, loads

    monkeypatch.setattr(dp_module.DP, "_pairs", counting)
    monkeypatch.setattr(dp_module, "_CANDIDATES", 3)
    for seed in range(20):
        dag, stages, kw = random_case(seed)
        objective(dag, stages, solver="dp", **kw)
    assert seen["same_block"] > 0.01 * seen["pairs"] > 0


@pytest.mark.parametrize("seed", range(6))
def test_block_size_does_not_change_the_optimum_beyond_brute_force_sizes(seed, monkeypatch):
    """14-18 nodes, 3-5 stages: every block size gives the same optimum."""
    rng = random.Random(1000 + seed)
    dag = random_dag(rng, rng.randint(14, 18))
    k, objective_name = rng.randint(3, 5), ["throughput", "gpipe"][seed % 2]
    values = []
    for candidates in (2, 7, 50, DEFAULT):
        monkeypatch.setattr(dp_module, "_CANDIDATES", candidates)
        values.append(objective(dag, k, solver="dp", objective=objective_name, microbatches=2))
    assert values[-1] is not None
    assert all(same(v, values[-1]) for v in values), values
