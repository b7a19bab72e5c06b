"""Pipeline-stage partitioning of cost DAGs: hand-solved cases, the contiguity definition, memory limits,
and DP / ILP (PuLP, OR-tools) against brute force on random small DAGs."""

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
from clirun import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutsearch.costdag import CostDAG, Edge, Node, load_costdag, save_costdag
from layoutsearch.errors import CostDAGError, LayoutSearchError, PartitionError
from layoutsearch.gantt import bubble_fraction, gpipe_schedule, render_gantt
from layoutsearch.solvers.partition import count_ideals, equal_split, partition, stage_loads
from layoutsearch.units import parse_bytes


def chain(computes, transfer=0.0, memory=None):
    nodes = [Node(f"n{i}", float(c), memory_bytes=(memory or [0] * len(computes))[i]) for i, c in enumerate(computes)]
    edges = [Edge(f"n{i}", f"n{i + 1}", transfer) for i in range(len(computes) - 1)]
    return CostDAG(tuple(nodes), tuple(edges), name="chain")


# -- the cost DAG ---------------------------------------------------------------------------------------------------

def test_cost_dag_round_trips_through_json(tmp_path):
    dag = CostDAG((Node("a", 1.5, 100, param_bytes=60, activation_bytes=8, layer=0), Node("b", 2.0)),
                  (Edge("a", "b", 0.25, bytes=1024, tensor="out0"),), name="toy", meta={"source": "test"})
    path = tmp_path / "toy.json"
    save_costdag(dag, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "layoutsearch.costdag" and doc["version"] == 1
    assert load_costdag(path) == dag


def test_cost_dag_reports_a_cycle_by_its_nodes():
    with pytest.raises(CostDAGError, match="cycle: a -> b -> c -> a"):
        CostDAG((Node("a", 1), Node("b", 1), Node("c", 1)), (Edge("a", "b"), Edge("b", "c"), Edge("c", "a")))


@pytest.mark.parametrize("nodes, edges, message", [
    ((Node("a", 1),), (Edge("a", "zz"),), "unknown node 'zz'"),
    ((Node("a", -1.0),), (), "compute_s must be a finite number of seconds >= 0, got -1.0"),
    ((Node("a", 1, memory_bytes=-5),), (), "memory_bytes must be an integer number of bytes >= 0"),
    ((Node("a", 1), Node("b", 1)), (Edge("a", "b", -0.5),), "transfer_s must be a finite"),
    ((Node("a", 1), Node("a", 2)), (), "duplicate node name 'a'"),
    ((Node("a", 1),), (Edge("a", "a"),), "from a node to itself"),
    ((Node("a", 1), Node("b", 1), Node("c", 1)), (Edge("a", "b", 1.0), Edge("a", "c", 2.0)),
     "edges of one tensor must agree"),
    ((Node("a", float("nan")),), (), "compute_s must be a finite"),
])
def test_cost_dag_rejects_invalid_input_with_a_clear_message(nodes, edges, message):
    with pytest.raises(CostDAGError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CostDAG(nodes, edges)


def test_cost_dag_file_errors_name_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"nodes": [{"name": "a", "compute_s": 1, "flops": 3}]}))
    with pytest.raises(CostDAGError, match=r"nodes\[0\]: unknown field\(s\) \['flops'\]"):
        load_costdag(path)
    from layoutsearch import zoo
    from layoutsearch.ir import graph_to_json

    path.write_text(graph_to_json(zoo.build("mtf-ffn")))  # a model graph where a cost DAG belongs
    with pytest.raises(CostDAGError, match="this is a model graph file, not a cost DAG: make its cost DAG with"):
        load_costdag(path)
    path.write_text("{not json")
    with pytest.raises(CostDAGError, match="not valid JSON"):
        load_costdag(path)
    path.write_text(json.dumps({"nodes": [{"name": "a"}]}))
    with pytest.raises(CostDAGError, match="missing field"):
        load_costdag(path)


def test_different_outputs_of_one_node_may_have_different_costs():
    dag = CostDAG((Node("a", 0), Node("b", 0), Node("c", 0)),
                  (Edge("a", "b", 1.0, tensor="x"), Edge("a", "c", 2.0, tensor="y")))
    assert stage_loads(dag, [["a"], ["b", "c"]]).loads == (3.0, 3.0)


def test_parse_bytes_reads_units():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("2e9") == 2_000_000_000
    with pytest.raises(LayoutSearchError, match="bad byte size"):
        parse_bytes("12 parsecs")


# -- the objectives -------------------------------------------------------------------------------------------------

def test_throughput_load_pays_each_tensor_once_per_sender_and_once_per_receiving_stage():
    # a's output goes to b and c (stage 1) and to d (stage 2): a pays 1 send, stages 1 and 2 one receive each.
    dag = CostDAG((Node("a", 1), Node("b", 1), Node("c", 1), Node("d", 1)),
                  (Edge("a", "b", 1.0), Edge("a", "c", 1.0), Edge("a", "d", 1.0)))
    costs = stage_loads(dag, {"a": 0, "b": 1, "c": 1, "d": 2})
    assert costs.loads == (1 + 1, 2 + 1, 1 + 1)
    assert costs.objective == 3.0


def test_gpipe_relays_tensors_over_the_stage_axis_and_multiplies_by_the_schedule_length():
    # a -> d skips stage 1: stage 1 receives and forwards it. 4 micro-batches, 3 stages: 6 slots.
    dag = CostDAG((Node("a", 1), Node("b", 1), Node("d", 1)),
                  (Edge("a", "b", 0.5, tensor="x"), Edge("b", "d", 0.5), Edge("a", "d", 1.0, tensor="skip")))
    costs = stage_loads(dag, [["a"], ["b"], ["d"]], objective="gpipe", microbatches=4)
    assert costs.loads == (1 + 0.5 + 1.0, 1 + 0.5 + 0.5 + 2 * 1.0, 1 + 0.5 + 1.0)
    assert costs.objective == pytest.approx((4 + 3 - 1) * 4.0)
    throughput = stage_loads(dag, [["a"], ["b"], ["d"]]).loads
    assert throughput == (2.5, 2.0, 2.5)  # direct transfers: stage 1 only sees x and b's output


def test_gpipe_rejects_stages_out_of_pipeline_order():
    with pytest.raises(PartitionError, match="from stage 1 back to stage 0"):
        stage_loads(chain([1, 1]), [["n1"], ["n0"]], objective="gpipe")


def test_memory_counts_activations_per_micro_batch_in_flight():
    dag = CostDAG((Node("a", 1, memory_bytes=100, activation_bytes=10), Node("b", 1, activation_bytes=1)),
                  (Edge("a", "b"),))
    assert stage_loads(dag, [["a", "b"]], microbatches=4).memory == (100 + 4 * 11,)


# -- hand-solved partitions -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["dp", "brute", "ilp-pulp", "ilp-ortools"])
def test_chain_split_hand_solved(solver):
    # [1 2 3 | 4]: 6 + 1 send = 7 and 4 + 1 receive = 5 (the cut [1 2 | 3 4] gives 4 and 8).
    part = partition(chain([1, 2, 3, 4], transfer=1.0), 2, solver=solver)
    assert part.stages == (("n0", "n1", "n2"), ("n3",))
    assert part.loads == (7.0, 5.0) and part.objective == 7.0 and part.optimal and part.gap == 0.0


def test_gpipe_partition_reports_step_time_and_bubble():
    part = partition(chain([1, 2, 3, 4, 5, 6]), 3, objective="gpipe", microbatches=5)
    assert part.loads == (6.0, 9.0, 6.0)  # [1 2 3 | 4 5 | 6]
    assert part.objective == pytest.approx((5 + 3 - 1) * 9.0)
    assert part.bubble_fraction == pytest.approx(2 / 7)


def two_branches():
    """s fans out into two 2-node branches that join at t; each branch is expensive to cut. File order
    (and so the canonical topological order) interleaves the branches."""
    nodes = tuple(Node(x, 1.0) for x in ("s", "a1", "b1", "a2", "b2", "t"))
    edges = (Edge("s", "a1", 0.0, tensor="to_a"), Edge("s", "b1", 0.0, tensor="to_b"), Edge("a1", "a2", 10.0),
             Edge("b1", "b2", 10.0), Edge("a2", "t", 0.0), Edge("b2", "t", 0.0))
    return CostDAG(nodes, edges, name="two-branches")


def test_optimal_contiguous_partition_need_not_be_an_interval_of_the_topological_order():
    dag = two_branches()
    order = dag.topological_order
    assert order == ("s", "a1", "b1", "a2", "b2", "t")
    best_interval = min(stage_loads(dag, [order[:i], order[i:]]).objective for i in range(1, len(order)))
    assert best_interval == 5.0
    part = partition(dag, 2)
    assert part.objective == 3.0 < best_interval
    assert {frozenset(s) for s in part.stages} == {frozenset({"s", "a1", "a2"}), frozenset({"b1", "b2", "t"})}
    assert part.info["interval_split"] == 5.0
    # Each stage is a difference of two ideals, and the stage prefixes are ideals.
    prefix: set[str] = set()
    for stage in part.stages:
        assert dag.is_contiguous(stage)
        prefix |= set(stage)
        assert dag.is_down_closed(prefix)


def test_interval_splits_of_a_topological_order_are_contiguous():
    dag = two_branches()
    order = dag.topological_order
    for i, j in itertools.combinations(range(len(order) + 1), 2):
        assert dag.is_contiguous(order[i:j])
    assert not dag.is_contiguous({"s", "t"})  # the path s -> a1 -> a2 -> t leaves the set and comes back


def test_non_contiguous_stages_can_beat_contiguous_ones_for_throughput():
    dag = chain([1, 2, 1])
    assert partition(dag, 2).objective == 3.0
    for solver in ("ilp-ortools", "ilp-pulp", "brute"):
        part = partition(dag, 2, contiguous=False, solver=solver)
        assert part.objective == 2.0
        assert {frozenset(s) for s in part.stages} == {frozenset({"n0", "n2"}), frozenset({"n1"})}


def test_gpipe_needs_contiguous_stages():
    with pytest.raises(PartitionError, match="needs contiguous stages"):
        partition(chain([1, 2]), 2, objective="gpipe", contiguous=False)


def test_memory_limit_is_respected_and_changes_the_answer():
    dag = chain([1, 1, 1, 10], memory=[5, 5, 5, 1])
    assert partition(dag, 2).stages == (("n0", "n1", "n2"), ("n3",))
    part = partition(dag, 2, memory_limit=11)
    assert part.stages == (("n0", "n1"), ("n2", "n3")) and max(part.memory) <= 11


@pytest.mark.parametrize("solver", ["dp", "brute"])
def test_infeasible_memory_limit_names_the_smallest_achievable_stage_memory(solver):
    dag = chain([1, 1, 1, 1], memory=[4, 4, 4, 4])
    with pytest.raises(PartitionError, match=r"smallest achievable largest-stage memory is 8 B"):
        partition(dag, 2, memory_limit=7, solver=solver)


@pytest.mark.parametrize("solver", ["ilp-pulp", "ilp-ortools"])
def test_infeasible_memory_limit_in_the_ilp(solver):
    dag = chain([1, 1, 1, 1], memory=[4, 4, 4, 4])
    with pytest.raises(PartitionError, match=r"largest-stage memory is 8 B"):
        partition(dag, 2, memory_limit=7, solver=solver)
    with pytest.raises(PartitionError, match=r"largest-stage memory is at least 8 B"):
        partition(dag, 2, memory_limit=7, solver=solver, contiguous=False)


def test_a_node_larger_than_the_limit_is_named():
    with pytest.raises(PartitionError, match="node 'n1' alone"):
        partition(chain([1, 1], memory=[1, 50]), 2, memory_limit=10)


def test_more_stages_than_nodes_is_an_error():
    with pytest.raises(PartitionError, match="cannot split 2 nodes"):
        partition(chain([1, 1]), 3)


def test_ilp_time_limit_returns_best_so_far_with_a_gap():
    rng = random.Random(1)
    nodes = [Node(f"v{i}", float(rng.randint(1, 20))) for i in range(40)]
    edges = [Edge(f"v{i}", f"v{j}", float(rng.randint(0, 5)), tensor=f"t{j}")
             for j in range(1, 40) for i in rng.sample(range(j), min(j, 2))]
    dag = CostDAG(tuple(nodes), tuple(edges))
    try:
        part = partition(dag, 6, contiguous=False, solver="ilp-ortools", time_limit=0.5)
    except PartitionError as e:  # a very slow machine may find nothing in time
        assert "time limit" in str(e)
        return
    assert part.optimal or 0 < part.gap <= 1  # (proven within 0.5 s only on a much faster machine)
    assert sorted(n for s in part.stages for n in s) == sorted(n.name for n in nodes)


def test_auto_falls_back_to_the_ilp_when_there_are_too_many_ideals():
    dag = CostDAG(tuple(Node(f"v{i}", float(i + 1)) for i in range(8)))  # no edges: 2^8 ideals
    assert count_ideals(dag) == 256
    part = partition(dag, 2, max_ideals=100)
    assert part.method == "ilp-ortools" and "fallback" in part.info
    assert part.objective == partition(dag, 2, solver="dp").objective == 18.0
    with pytest.raises(PartitionError, match="more than 100 down-closed sets"):
        partition(dag, 2, solver="dp", max_ideals=100)


def test_equal_split_by_layers_and_by_nodes():
    nodes = tuple(Node(f"n{i}", float(c), layer=i // 2) for i, c in enumerate([1, 1, 4, 4, 1, 1]))
    dag = CostDAG(nodes, tuple(Edge(f"n{i}", f"n{i + 1}") for i in range(5)))
    eq = equal_split(dag, 2)
    assert eq.method == "equal layers" and eq.stages == (("n0", "n1", "n2", "n3"), ("n4", "n5"))
    assert eq.objective == 10.0 and not eq.optimal
    assert equal_split(dag, 2, by="nodes").stages == (("n0", "n1", "n2"), ("n3", "n4", "n5"))
    assert partition(dag, 2).objective == 6.0


def test_partition_to_dict_is_json_ready():
    part = partition(chain([1, 2, 3]), 2, objective="gpipe", microbatches=2)
    doc = json.loads(json.dumps(part.to_dict()))
    assert doc["objective_kind"] == "gpipe" and doc["bubble_fraction"] == pytest.approx(1 / 3)
    assert [s["nodes"] for s in doc["stages"]] == [list(s) for s in part.stages]


# -- random small DAGs against brute force --------------------------------------------------------------------------

@st.composite
def small_dags(draw, with_memory=True):
    k = draw(st.integers(1, 4))
    n = draw(st.integers(k, 7 if k == 4 else 9))  # brute force visits up to K^n assignments
    perm = draw(st.permutations(range(n)))  # file order differs from the topological order
    names = [f"v{i}" for i in range(n)]
    nodes = [Node(names[i], float(draw(st.integers(0, 9))),
                  memory_bytes=draw(st.integers(0, 6)) if with_memory else 0,
                  activation_bytes=draw(st.integers(0, 2)) if with_memory else 0) for i in perm]
    edges = []
    for j in range(n):
        cost = float(draw(st.integers(0, 4)))
        split = draw(st.booleans())  # some nodes send different tensors to different consumers
        for i in range(j + 1, n):
            if draw(st.booleans()):
                c = float(draw(st.integers(0, 4))) if split else cost
                edges.append(Edge(names[j], names[i], c, tensor=f"to{i}" if split else None))
    return CostDAG(tuple(nodes), tuple(edges), name="random"), k


def solve(dag, k, **kw):
    """The objective, or the PartitionError message (e.g. an infeasible memory limit)."""
    try:
        part = partition(dag, k, **kw)
    except PartitionError as e:
        return ("error", str(e).split(":")[-1])
    limit = kw.get("memory_limit")
    assert limit is None or max(part.memory) <= limit
    assert stage_loads(dag, part.stages, kw.get("objective", "throughput"), kw.get("microbatches", 1)).objective \
        == part.objective
    return round(part.objective, 9)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def scaled(dag, factor):
    """The same DAG with times multiplied by ``factor`` (0.1: sums no longer exact in binary)."""
    return CostDAG(tuple(replace(n, compute_s=n.compute_s * factor) for n in dag.nodes),
                   tuple(replace(e, transfer_s=e.transfer_s * factor) for e in dag.edges))


@FAST
@given(small_dags(), st.sampled_from(["throughput", "gpipe"]), st.integers(1, 4), st.integers(0, 3),
       st.sampled_from([1.0, 0.1]))
def test_dp_equals_brute_force_over_contiguous_partitions(dag_k, objective, microbatches, tight, factor):
    dag, k = dag_k
    dag = scaled(dag, factor)
    mem = [n.memory_bytes + microbatches * n.activation_bytes for n in dag.nodes]
    limit = None if tight == 0 else max(max(mem), sum(mem) // k + tight * 3 - 3)
    kw = {"objective": objective, "microbatches": microbatches, "memory_limit": limit}
    dp, brute = solve(dag, k, solver="dp", **kw), solve(dag, k, solver="brute", **kw)
    assert dp == (pytest.approx(brute, rel=1e-9) if factor != 1.0 and not isinstance(brute, tuple) else brute)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.sampled_from(["throughput", "gpipe"]), st.booleans())
def test_ilp_equals_brute_force_over_contiguous_partitions(dag_k, objective, limited):
    dag, k = dag_k
    mem = [n.memory_bytes for n in dag.nodes]
    kw = {"objective": objective, "memory_limit": max(max(mem), sum(mem) // k) if limited else None}
    expected = solve(dag, k, solver="brute", **kw)
    for solver in ("ilp-ortools", "ilp-pulp"):
        assert solve(dag, k, solver=solver, **kw) == expected  # infeasible: the same exact smallest memory


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.booleans())
def test_ilp_equals_brute_force_over_non_contiguous_assignments(dag_k, limited):
    dag, k = dag_k
    mem = [n.memory_bytes for n in dag.nodes]
    kw = {"contiguous": False, "memory_limit": max(max(mem), sum(mem) // k) if limited else None}
    expected = solve(dag, k, solver="brute", **kw)
    if isinstance(expected, tuple):  # infeasible: the ILP says so too
        assert solve(dag, k, solver="ilp-ortools", **kw)[0] == "error"
        return
    assert solve(dag, k, solver="ilp-ortools", **kw) == expected
    assert solve(dag, k, solver="ilp-pulp", **kw) == expected
    contiguous = solve(dag, k, solver="dp", memory_limit=kw["memory_limit"])
    assert isinstance(contiguous, tuple) or expected <= contiguous  # more freedom never hurts


def acyclic_assignments(dag, k):
    """Every assignment of nodes to k non-empty stages whose quotient (stage) graph is acyclic."""
    names = dag.names
    for labels in itertools.product(range(k), repeat=len(names)):
        if len(set(labels)) < k:
            continue
        stage = dict(zip(names, labels, strict=True))
        quotient = nx.DiGraph((stage[e.src], stage[e.dst]) for e in dag.edges if stage[e.src] != stage[e.dst])
        if nx.is_directed_acyclic_graph(quotient):
            yield stage, quotient


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(with_memory=False))
def test_acyclic_stage_graphs_are_exactly_the_contiguous_partitions(dag_k):
    dag, k = dag_k
    if k ** len(dag.nodes) > 5000:
        k = 2 if len(dag.nodes) >= 2 else 1
    best = min(stage_loads(dag, a).objective for a, _ in acyclic_assignments(dag, k))
    assert best == pytest.approx(partition(dag, k).objective)
    for a, quotient in itertools.islice(acyclic_assignments(dag, k), 50):
        # Relabel the stages in a topological order of the quotient: every prefix is then an ideal.
        rank = {s: i for i, s in enumerate(nx.topological_sort(quotient))}
        rank.update({s: len(rank) + i for i, s in enumerate(set(range(k)) - set(rank))})
        prefix: set[str] = set()
        for s in sorted(range(k), key=rank.__getitem__):
            stage = {n for n, label in a.items() if label == s}
            assert dag.is_contiguous(stage)
            prefix |= stage
            assert dag.is_down_closed(prefix)


def layered_dag(layers, width, seed):
    """Layers of ``width`` nodes, each fed by one or two nodes of the previous layer, plus residual skips."""
    rng = random.Random(seed)
    names = [[f"l{i}.{j}" for j in range(width)] for i in range(layers)]
    nodes = [Node(n, float(rng.randint(1, 9)), memory_bytes=rng.randint(1, 5)) for row in names for n in row]
    edges = []
    for i in range(1, layers):
        for j, n in enumerate(names[i]):
            for src in {names[i - 1][j], rng.choice(names[i - 1])}:
                edges.append(Edge(src, n, float(rng.randint(0, 3)), tensor=f"to.{n}"))
            if i >= 2 and rng.random() < 0.3:
                edges.append(Edge(names[i - 2][j], n, 1.0, tensor=f"skip.{n}"))
    return CostDAG(tuple(nodes), tuple(edges))


@pytest.mark.parametrize("objective", ["throughput", "gpipe"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dp_agrees_with_the_ilp_beyond_brute_force_sizes(objective, seed):
    dag = layered_dag(8, 2, seed)
    limit = 1 + sum(n.memory_bytes for n in dag.nodes) // 3
    kw = {"objective": objective, "microbatches": 4, "memory_limit": limit}
    dp = partition(dag, 4, solver="dp", **kw)
    ilp = partition(dag, 4, solver="ilp-ortools", **kw)
    assert ilp.optimal and dp.objective == pytest.approx(ilp.objective, rel=1e-6)
    assert max(dp.memory) <= limit


# -- the documented example, the CLI and the Gantt chart ------------------------------------------------------------

def doc_example(tmp_path):
    text = (Path(__file__).resolve().parent.parent / "docs" / "costdag.md").read_text()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "tiny.json"
    path.write_text(block)
    return path


def test_the_documented_example_loads_and_partitions(tmp_path):
    dag = load_costdag(doc_example(tmp_path))
    assert dag.name == "tiny-transformer" and len(dag.nodes) == 10
    assert len(dag.tensors) == 9  # embed's and the adds' outputs each feed two consumers
    part = partition(dag, 2, objective="gpipe", microbatches=4, memory_limit=2**30)
    assert max(part.memory) <= 2**30
    assert part.objective <= equal_split(dag, 2, objective="gpipe", microbatches=4).objective


def test_cli_partition_prints_stages_bubble_and_gantt(capsys, tmp_path):
    code, out, err = run(capsys, "partition", doc_example(tmp_path), "--stages", "2", "--objective", "gpipe",
                             "--microbatches", "4", "--memory-limit", "1GiB")
    assert code == 0, err
    assert "tiny-transformer" in out and "optimal, dp" in out
    assert "bubble fraction 20.0%" in out
    assert "F0 F1 F2 F3" in out and "B3 B2 B1 B0" in out
    assert "baseline (equal layers)" in out


def test_cli_partition_json(capsys, tmp_path):
    code, out, _ = run(capsys, "partition", doc_example(tmp_path), "--stages", "3", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["num_stages"] == 3 and len(doc["stages"]) == 3 and doc["optimal"]
    assert doc["objective"] == pytest.approx(max(s["load"] for s in doc["stages"]))
    code, out, _ = run(capsys, "partition", doc_example(tmp_path), "--stages", "2", "--non-contiguous",
                           "--solver", "ilp-ortools", "--json")
    assert code == 0 and json.loads(out)["method"] == "ilp-ortools"


def test_cli_partition_errors_are_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "partition", doc_example(tmp_path), "--stages", "2", "--memory-limit", "100MiB")
    assert code == 2 and out == ""
    assert "smallest achievable largest-stage memory" in err and err.count("\n") == 1
    code, _, err = run(capsys, "partition", tmp_path / "missing.json", "--stages", "2")
    assert code == 2 and "cannot read cost DAG file" in err


def test_gpipe_gantt_chart():
    assert gpipe_schedule(2, 3) == [
        [("F", 0), ("F", 1), ("F", 2), None, None, ("B", 2), ("B", 1), ("B", 0)],
        [None, ("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0), None],
    ]
    text = render_gantt(2, 3, times=[1.0, 2.0])
    assert "bubble 1/4 = 25.0%" in text
    assert "stage 0 | F0 F1 F2 .  | .  B2 B1 B0 | busy 38%" in text
    assert "stage 1 | .  F0 F1 F2 | B2 B1 B0 .  | busy 75%" in text
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert "FFFFFFFFFFFFFFFFFFFFFFFF." in render_gantt(2, 24)  # compact cells for many micro-batches


def test_interleaved_gantt_chart_is_the_executors_tick_table():
    from layoutsearch.backend.tick_tables import interleaved
    from layoutsearch.gantt import interleaved_schedule

    K, V, M = 4, 2, 8
    grid = interleaved_schedule(K, V, M)
    assert all(len(row) == 2 * (M * V + K - 1) for row in grid)  # the bubble the cost model prices
    for k, row in enumerate(grid):  # every chunk of every micro-batch once forward and once backward
        assert sorted(c for c in row if c is not None) == sorted(
            (kind, m, c) for kind in "BF" for m in range(M) for c in range(V))
        assert [c for c in row if c is not None] == [
            ("F" if op[0] == 1 else "B", op[1], op[2]) for op in (t[k] for t in interleaved(K, V, M).ops) if op]
    text = render_gantt(2, 4, schedule="interleaved", virtual=2, times=[1.0, 2.0])
    assert "2 stages x 2 chunks x 4 micro-batches, 18 ticks" in text and "bubble 1/9 = 11.1%" in text
    assert "stage 0 | F0a F1a F0b F1b F2a B0b" in text and "busy 44%" in text  # 4 x 1 / ((4 + 1/2) x 2)


@pytest.mark.parametrize("seed", [4, 9, 14, 49])
def test_ilp_memory_limits_in_gib_agree_with_the_dp(seed):
    # Regression: with byte counts ~1e10 in the memory rows, SCIP's cuts, CP-SAT's presolve and CBC's
    # feasibility test all went wrong (suboptimal or "infeasible"); the rows now use units of <= 2^31.
    rng = random.Random(seed)
    nodes = [Node(f"v{i}", rng.uniform(1e-3, 5e-3), memory_bytes=rng.randint(1, 8) * 2**30 + rng.randint(0, 1000))
             for i in range(10)]
    dag = CostDAG(tuple(nodes), tuple(Edge(f"v{i}", f"v{i + 1}", rng.uniform(0, 1e-3)) for i in range(9)))
    limit = 2 * max(n.memory_bytes for n in nodes)
    dp = partition(dag, 4, memory_limit=limit, solver="dp")
    for solver in ("ilp-ortools", "ilp-pulp"):
        part = partition(dag, 4, memory_limit=limit, solver=solver)
        assert part.optimal and part.objective == pytest.approx(dp.objective, rel=1e-6)
        assert max(part.memory) <= limit


@pytest.mark.parametrize("objective", ["throughput", "gpipe"])
def test_dp_over_several_bitset_words_agrees_with_the_ilp(objective):
    dag = layered_dag(35, 2, 7)  # 70 units: ideals span two 64-bit words
    dp = partition(dag, 3, objective=objective, solver="dp")
    ilp = partition(dag, 3, objective=objective, solver="ilp-ortools")
    assert ilp.optimal and dp.objective == pytest.approx(ilp.objective, rel=1e-9)
