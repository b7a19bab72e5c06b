"""Non-contiguous latency (a node-level schedule, P|prec,c_ij|Cmax): the ILP against brute force over every
assignment and every device order, the list-scheduling heuristic never better than the optimum, every
returned schedule re-scored from (assignment, order) alone by an independent scorer, and bad input."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import networkx as nx
import pytest
from clirun import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_placement import node_times

from layoutsearch.costdag import CostDAG, DeviceKind, Edge, Node, load_costdag
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition import partition
from layoutsearch.solvers.partition.instance import compile_dag, kinds_of, schedule_makespan
from layoutsearch.solvers.partition.schedule import Problem, heuristic, priced
from layoutsearch.solvers.partition.schedule_ilp import solve_schedule_ilp

EXAMPLES = settings(max_examples=int(__import__("os").environ.get("LAT_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PLACEMENT = Path("/work/shared/placement/latency-inputs/LayerGraphs")


# -- the objective, from its definition (independent of the package) -------------------------------------------------

def devices_of(dag, stages=None):
    """[(label, kind, memory limit, host)] per device."""
    if not dag.devices:
        return [(str(i), "stage", None, False) for i in range(stages)]
    return [(f"{k.name} {i}", k.name, k.memory_bytes, k.host) for k in dag.devices for i in range(k.count)]


def node_time(node, kind):
    return node.compute_s if node.times is None else node.times.get(kind)


def delays(dag):
    """(src, dst) -> the transfer time of the tensors src sends dst (one per src and tensor label)."""
    seen, out = set(), {}
    for e in dag.edges:
        if (e.src, e.tensor, e.dst) in seen:
            continue
        seen.add((e.src, e.tensor, e.dst))
        out[(e.src, e.dst)] = out.get((e.src, e.dst), 0.0) + e.transfer_s
    return out


def makespan(dag, devs, place, order):
    """The latency of running each device's nodes in ``order[d]`` (node names): the longest path of the graph
    whose arcs are the dependencies (node time plus, across devices, the transfer paid by each non-host end)
    and each device's consecutive nodes of positive time; None when that graph has a cycle."""
    node = {n.name: n for n in dag.nodes}
    dur = {v: node_time(node[v], devs[place[v]][1]) for v in place}
    g = nx.DiGraph()
    g.add_nodes_from(place)
    hop = delays(dag)
    for e in dag.edges:
        du, dv = place[e.src], place[e.dst]
        c = 0.0 if du == dv else hop[(e.src, e.dst)] * ((not devs[du][3]) + (not devs[dv][3]))
        w = dur[e.src] + c
        if g.get_edge_data(e.src, e.dst, {"w": -1})["w"] < w:
            g.add_edge(e.src, e.dst, w=w)
    for names in order.values():
        busy = [v for v in names if dur[v] > 0]
        for a, b in itertools.pairwise(busy):
            w = max(dur[a], g.get_edge_data(a, b, {"w": -1})["w"])
            g.add_edge(a, b, w=w)
    if not nx.is_directed_acyclic_graph(g):
        return None
    start = {}
    for v in nx.topological_sort(g):
        start[v] = max((start[u] + g[u][v]["w"] for u in g.predecessors(v)), default=0.0)
    return max(start[v] + dur[v] for v in place)


def feasible(dag, devs, place, at_most):
    for n in dag.nodes:
        if node_time(n, devs[place[n.name]][1]) is None:
            return False
    for d, (_, _, limit, _) in enumerate(devs):
        if limit is not None and sum(n.memory_bytes for n in dag.nodes if place[n.name] == d) > limit:
            return False
    groups = {}
    if any(n.group is not None and groups.setdefault(n.group, place[n.name]) != place[n.name] for n in dag.nodes):
        return False
    return at_most or len(set(place.values())) == len(devs)


def brute_force(dag, devs, at_most):
    """The least makespan over every feasible assignment and every device order (the orders a linear extension
    of the DAG induces: a schedule's nodes sorted by start, ties in a topological order, form one)."""
    g = nx.DiGraph((e.src, e.dst) for e in dag.edges)
    g.add_nodes_from(dag.names)
    extensions = list(nx.all_topological_sorts(g))
    node = {n.name: n for n in dag.nodes}
    best = None
    for labels in itertools.product(range(len(devs)), repeat=len(dag.names)):
        place = dict(zip(dag.names, labels, strict=True))
        if not feasible(dag, devs, place, at_most):
            continue
        orders = {tuple(tuple(v for v in ext if place[v] == d and node_time(node[v], devs[d][1]) > 0)
                        for d in range(len(devs))) for ext in extensions}
        for order in orders:
            got = makespan(dag, devs, place, dict(enumerate(order)))
            if got is not None and (best is None or got < best):
                best = got
    return best


def returned(part, devs):
    """(node -> device index, device index -> node names in run order) of a returned placement."""
    index = {label: d for d, (label, _, _, _) in enumerate(devs)}
    labels = part.devices or tuple(str(k) for k in range(part.num_stages))
    place = {name: index[label] for label, stage in zip(labels, part.stages, strict=True) for name in stage}
    order = {index[label]: list(stage) for label, stage in zip(labels, part.stages, strict=True)}
    return place, order


def check_schedule(dag, devs, part, at_most):
    """The returned schedule is feasible, re-scored to its objective, and its start times are consistent."""
    place, order = returned(part, devs)
    assert feasible(dag, devs, place, at_most)
    got = makespan(dag, devs, place, order)
    assert got is not None and got == pytest.approx(part.objective, rel=1e-9, abs=1e-12)
    starts = part.info["start_times"]
    assert [len(s) for s in starts] == [len(s) for s in part.stages]
    assert max((t + node_time(next(n for n in dag.nodes if n.name == v), devs[place[v]][1])
                for s, ts in zip(part.stages, starts, strict=True) for v, t in zip(s, ts, strict=True)),
               default=0.0) == pytest.approx(part.objective, rel=1e-9, abs=1e-12)


# -- random small problems -------------------------------------------------------------------------------------------

@st.composite
def latency_dags(draw):
    """Two device kinds (1-2 accelerators with a memory limit or none, 0-1 CPU cores; at most 3 devices) or a
    pipeline of 2-3 stages; per-kind times, nodes runnable on one kind only, co-location groups, transfers,
    nodes sending different tensors to different consumers. Returns (dag, stages, at_most)."""
    kinds = draw(st.booleans())
    acc, cpu = (draw(st.integers(1, 2)), draw(st.integers(0, 1))) if kinds else (draw(st.integers(2, 3)), 0)
    n = draw(st.integers(2, 7 if acc + cpu <= 2 else 6))
    names = [f"v{i}" for i in range(n)]
    nodes = []
    for i in range(n):
        times = node_times(draw, cpu)
        group = draw(st.sampled_from([None, None, None, None, "g0"]))
        memory = draw(st.integers(0, 6))
        nodes.append(Node(names[i], times=times, memory_bytes=memory, group=group) if kinds
                     else Node(names[i], times["accelerator"], memory_bytes=memory, group=group))
    edges = []
    for j in range(n):
        cost, split = float(draw(st.integers(0, 4))), draw(st.booleans())
        for i in range(j + 1, n):
            if draw(st.integers(0, 2)) == 0:
                c = float(draw(st.integers(0, 4))) if split else cost
                edges.append(Edge(names[j], names[i], c, tensor=f"to{i}" if split else None))
    total = sum(nd.memory_bytes for nd in nodes)
    limit = draw(st.sampled_from([None, None, max(6, total // acc + 2)]))
    if not kinds:
        return CostDAG(tuple(nodes), tuple(edges), name="pipe"), acc, draw(st.booleans()), limit
    devices = (DeviceKind("accelerator", acc, limit), DeviceKind("cpu", cpu, None, host=True))
    return CostDAG(tuple(nodes), tuple(edges), name="random", devices=devices, time_unit="unit"), None, True, None


def devices_with_limit(dag, stages, limit):
    return [(label, kind, limit if stages else lim, host) for label, kind, lim, host in devices_of(dag, stages)]


def optimum(case):
    """The case's devices (with its memory limit) and its optimal makespan by brute force (None: infeasible)."""
    dag, stages, at_most, limit = case
    devs = devices_with_limit(dag, stages, limit)
    return devs, brute_force(dag, devs, at_most)


def scheduled(case, solver):
    """The non-contiguous latency placement of ``case`` by ``solver``; None when it finds none."""
    dag, stages, at_most, limit = case
    try:
        return partition(dag, stages, objective="latency", contiguous=False, solver=solver, at_most=at_most,
                         memory_limit=limit)
    except PartitionError:
        return None


@EXAMPLES
@given(latency_dags())
def test_the_schedule_ilps_equal_brute_force_over_assignments_and_orders(case):
    dag, stages, at_most, limit = case
    devs, best = optimum(case)
    for solver in ("ilp-ortools", "ilp-pulp"):
        part = scheduled(case, solver)
        if part is None:
            assert best is None, f"{solver} found no schedule; brute force found {best}"
            continue
        assert best is not None, f"{solver} returned a schedule where none is feasible"
        check_schedule(dag, devs, part, at_most)
        assert part.objective == pytest.approx(best, rel=1e-9, abs=1e-12), solver
        assert part.optimal and part.gap == 0.0
        assert part.info["lower_bound"] <= best * (1 + 1e-9) + 1e-12


@EXAMPLES
@given(latency_dags(), st.booleans())
def test_the_schedule_ilp_alone_is_exact_from_a_poor_start_or_none(case, started):
    """The formulation itself (the front door often proves the heuristic optimal by its bound, no ILP run),
    with the trivial lower bound: from no start (CBC; CP-SAT 9.15 without a hint can idle to its time limit
    on these tiny models after finding the optimum) or from a poor one, every unit on one device in unit order
    when that fits, else the list scheduler's (both backends)."""
    dag, stages, at_most, limit = case
    devs, best = optimum(case)
    inst = compile_dag(dag, kinds_of(dag, stages, limit))
    problem = Problem(inst, at_most)
    hint = None
    if started:
        hint = heuristic(inst, at_most)
        for d in range(inst.num_devices):
            sigma = [d] * inst.n
            if (at_most or inst.num_devices == 1) and feasible(dag, devs, dict(zip(inst.names, sigma)), at_most):
                hint = priced(inst, sigma, [list(range(inst.n)) if e == d else [] for e in range(inst.num_devices)])
                break
        if hint is None:
            return
    for backend in ("ilp-ortools", "ilp-pulp") if started else ("ilp-pulp",):
        sol, got = solve_schedule_ilp(problem, backend, None, 0.0, hint, {})
        if best is None:
            assert got is None and sol.status == "infeasible"
            continue
        assert sol.status == "optimal" and got is not None, backend
        assert got.value == pytest.approx(best, rel=1e-9, abs=1e-12), backend
        assert sol.objective == pytest.approx(best, rel=1e-6, abs=1e-6), backend
        place = {inst.names[v]: d for v, d in enumerate(got.sigma)}
        order = {d: [inst.names[v] for v in run] for d, run in enumerate(got.order)}
        assert feasible(dag, devs, place, at_most)
        assert makespan(dag, devs, place, order) == pytest.approx(got.value, rel=1e-12, abs=1e-12)


@EXAMPLES
@given(latency_dags())
def test_the_list_scheduler_returns_a_valid_schedule_never_better_than_the_optimum(case):
    dag, stages, at_most, limit = case
    devs, best = optimum(case)
    part = scheduled(case, "local")
    if part is None:
        return  # a heuristic may miss a tight memory limit; the ILP test covers feasibility
    assert best is not None
    check_schedule(dag, devs, part, at_most)
    assert part.objective >= best * (1 - 1e-9) - 1e-12
    assert part.gap is not None and part.gap >= 0.0
    assert part.info["lower_bound"] <= best * (1 + 1e-9) + 1e-12


@EXAMPLES
@given(latency_dags())
def test_a_contiguous_placement_scheduled_in_topological_order_is_no_slower_than_its_contiguous_latency(case):
    dag, stages, at_most, limit = case
    devs = devices_with_limit(dag, stages, limit)
    try:
        contiguous = partition(dag, stages, objective="latency", solver="ilp-ortools", at_most=at_most,
                               memory_limit=limit)
    except PartitionError:
        return
    place, _ = returned(contiguous, devs)
    topo = list(nx.topological_sort(nx.DiGraph([(e.src, e.dst) for e in dag.edges]))) + list(dag.names)
    order = {d: [v for v in dict.fromkeys(topo) if place[v] == d] for d in range(len(devs))}
    got = makespan(dag, devs, place, order)
    assert got is not None and got <= contiguous.objective * (1 + 1e-9) + 1e-12
    # and the package's scorer of (assignment, order) agrees with the independent one
    inst = compile_dag(dag, kinds_of(dag, stages, limit))
    sigma = [place[name] for name in inst.names]
    pos = {name: i for i, name in enumerate(inst.names)}
    value, _ = schedule_makespan(inst, sigma, [[pos[v] for v in order[d]] for d in range(len(devs))])
    assert value == pytest.approx(got, rel=1e-12, abs=1e-12)
    noncontiguous = partition(dag, stages, objective="latency", contiguous=False, solver="ilp-ortools",
                              at_most=at_most, memory_limit=limit)
    assert noncontiguous.objective <= got * (1 + 1e-9) + 1e-12


# -- hand-solved cases ------------------------------------------------------------------------------------------------

def ping_pong():
    """a -> b -> c: a and c fast on the accelerator, b on the CPU core. Non-contiguous: a and c on the
    accelerator, b on the core: 1 + 0.1 + 1 + 0.1 + 1 = 3.2 (the accelerator pays each transfer once, the
    core none). Contiguous (one accelerator, so the device graph acc -> cpu -> acc is refused): 12."""
    nodes = (Node("a", times={"accelerator": 1.0, "cpu": 10.0}), Node("b", times={"accelerator": 10.0, "cpu": 1.0}),
             Node("c", times={"accelerator": 1.0, "cpu": 10.0}))
    edges = (Edge("a", "b", 0.1), Edge("b", "c", 0.1))
    kinds = (DeviceKind("accelerator", 1, None), DeviceKind("cpu", 1, None, host=True))
    return CostDAG(nodes, edges, name="ping-pong", devices=kinds, time_unit="unit")


@pytest.mark.parametrize("solver", ["ilp-ortools", "ilp-pulp", "local", "auto"])
def test_non_contiguous_latency_beats_contiguous_hand_solved(solver):
    dag = ping_pong()
    contiguous = partition(dag, objective="latency", solver="ilp-ortools")
    assert contiguous.objective == pytest.approx(12.0)
    part = partition(dag, objective="latency", contiguous=False, solver=solver)
    assert part.objective == pytest.approx(3.2)
    assert part.stages == (("a", "c"), ("b",)) and part.devices == ("accelerator 0", "cpu 0")
    assert part.info["start_times"] == [[0.0, pytest.approx(2.2)], [pytest.approx(1.1)]]
    check_schedule(dag, devices_of(dag), part, True)


def test_parallel_branches_overlap_and_accelerator_transfers_cost_twice():
    """s -> {x, y} -> t on two stages (no host), s and t of time 1, x and y of 5, every transfer c; a hop
    between two non-host devices costs 2c. Both branches on one device: 12. Split (s, x on one device, y, t on
    the other): y runs from 1 + 2c to 6 + 2c, x's result reaches t at 6 + 2c, t ends at 7 + 2c: 8 for c = 1/2,
    9 for c = 1 (a split puts one branch behind a hop from s and the other's result behind a hop to t); for
    c = 3 one device wins. The contiguous latency (devices one after another, transfers in their loads) of
    that split is 14 or 16: 12 is the contiguous optimum in every case."""
    def dag(c):
        nodes = (Node("s", 1.0), Node("x", 5.0), Node("y", 5.0), Node("t", 1.0))
        edges = (Edge("s", "x", c), Edge("s", "y", c), Edge("x", "t", c), Edge("y", "t", c))
        return CostDAG(nodes, edges, name="diamond")
    for c, want in ((0.5, 8.0), (1.0, 9.0), (3.0, 12.0)):
        for solver in ("ilp-ortools", "local"):
            got = partition(dag(c), 2, objective="latency", contiguous=False, at_most=True, solver=solver)
            assert got.objective == pytest.approx(want), (c, solver)
        assert partition(dag(c), 2, objective="latency", at_most=True).objective == pytest.approx(12.0)
    exact = partition(dag(0.5), 2, objective="latency", contiguous=False)  # exactly two stages
    assert exact.num_stages == 2 and exact.objective == pytest.approx(8.0)


def test_the_package_scorer_refuses_orders_that_contradict_the_dependencies():
    dag = ping_pong()
    inst = compile_dag(dag, kinds_of(dag, None, None))
    assert schedule_makespan(inst, [0, 1, 0], [[0, 2], [1], []] if inst.num_devices == 3 else [[0, 2], [1]])[0] == \
        pytest.approx(3.2)
    with pytest.raises(PartitionError, match="contradict"):
        schedule_makespan(inst, [0, 1, 0], [[2, 0], [1]])
    with pytest.raises(PartitionError, match="every node once"):
        schedule_makespan(inst, [0, 1, 0], [[0], [1]])
    with pytest.raises(PartitionError, match="not assigned"):
        schedule_makespan(inst, [0, 1, 0], [[0, 1], [2]])


# -- bad input ---------------------------------------------------------------------------------------------------------

def test_bad_non_contiguous_latency_input_is_a_clear_error():
    dag = ping_pong()
    with pytest.raises(PartitionError, match="gpipe objective needs contiguous"):
        partition(CostDAG((Node("a", 1.0), Node("b", 1.0)), (Edge("a", "b"),)), 2, objective="gpipe",
                  contiguous=False)
    with pytest.raises(PartitionError, match="backward nodes"):
        partition(CostDAG((Node("a", 1.0), Node("b", 1.0, backward=True)), (Edge("a", "b"),)), 2,
                  objective="latency", contiguous=False)
    with pytest.raises(PartitionError, match="brute force covers contiguous"):
        partition(dag, objective="latency", contiguous=False, solver="brute")
    with pytest.raises(PartitionError, match="DP covers"):
        partition(dag, objective="latency", contiguous=False, solver="dp")
    split = CostDAG((Node("a", times={"accelerator": 1.0}, group="g"), Node("b", times={"cpu": 1.0}, group="g")),
                    (Edge("a", "b"),), devices=dag.devices, time_unit="unit")
    with pytest.raises(PartitionError, match="cannot share a device"):
        partition(split, objective="latency", contiguous=False)
    nowhere = CostDAG((Node("a", times={"accelerator": 1.0}),), (), devices=(DeviceKind("accelerator", 0, None),
                                                                              DeviceKind("cpu", 1, None, True)))
    with pytest.raises(PartitionError, match="no device"):
        partition(nowhere, objective="latency", contiguous=False)
    with pytest.raises(PartitionError):
        partition(dag, 0, objective="latency", contiguous=False)
    big = CostDAG((Node("a", 1.0, memory_bytes=10), Node("b", 1.0, memory_bytes=10)), (Edge("a", "b"),))
    with pytest.raises(PartitionError, match="memory"):
        partition(big, 2, objective="latency", contiguous=False, memory_limit=5)


def test_the_cli_runs_non_contiguous_latency_and_refuses_bad_input(capsys, tmp_path):
    from layoutsearch.costdag import save_costdag

    path = tmp_path / "dag.json"
    save_costdag(ping_pong(), path)
    code, out, _ = run(capsys, "partition", str(path), "--objective", "latency", "--non-contiguous", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["objective"] == pytest.approx(3.2) and got["contiguous"] is False
    assert [s["nodes"] for s in got["stages"]] == [["a", "c"], ["b"]]
    code, out, _ = run(capsys, "partition", str(path), "--objective", "latency", "--non-contiguous")
    assert code == 0 and "non-contiguous" in out and "latency" in out
    split = CostDAG((Node("a", times={"accelerator": 1.0}, group="g"), Node("b", times={"cpu": 1.0}, group="g")),
                    (Edge("a", "b"),), devices=ping_pong().devices, time_unit="unit")
    save_costdag(split, path)
    code, _, err = run(capsys, "partition", str(path), "--objective", "latency", "--non-contiguous")
    assert code == 2 and "cannot share a device" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(not PLACEMENT.is_dir(), reason="the placement instances are not present")
def test_bert24_non_contiguous_latency_is_proven_and_rescored():
    dag = load_costdag(PLACEMENT / "bert24_inference.json")
    part = partition(dag, objective="latency", contiguous=False, solver="ilp-ortools", time_limit=60)
    check_schedule(dag, devices_of(dag), part, True)
    assert part.optimal and part.objective == pytest.approx(100.2185, rel=1e-6)
    assert not math.isnan(part.info["lower_bound"])
