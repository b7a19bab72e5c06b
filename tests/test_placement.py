"""Device placement (Tarnawski et al. 2020): every exact method's split re-scored by an independent
implementation of the objectives written here from their definitions (docs/costdag.md), against a brute
force written here too; the paper's instances as shipped; bad input; determinism and Ctrl-C of the CLI."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
from clirun import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutsearch.costdag import CostDAG, DeviceKind, Edge, Node, load_costdag
from layoutsearch.errors import PartitionError
from layoutsearch.solvers.partition import baselines, partition

ROOT = Path(__file__).resolve().parent.parent
PLACEMENT = Path("/work/shared/placement")
INSTANCES = sorted(PLACEMENT.glob("*-inputs/*/*.json")) if PLACEMENT.is_dir() else []
EXPERTS = sorted(PLACEMENT.glob("human-experts/*.json")) if PLACEMENT.is_dir() else []
needs_instances = pytest.mark.skipif(not INSTANCES, reason="the placement instances are not present")


# -- the objectives, from their definitions -------------------------------------------------------------------------

def devices_of(dag, stages=None):
    """[(label, kind name, memory limit, host)] of every device: the DAG's kinds, or ``stages`` pipeline stages."""
    if not dag.devices:
        return [(str(i), "stage", None, False) for i in range(stages)]
    return [(f"{k.name} {i}", k.name, k.memory_bytes, k.host) for k in dag.devices for i in range(k.count)]


def node_time(node, kind):
    if node.times is None:
        return node.compute_s
    return node.times.get(kind)


def tensors(dag):
    """(src, transfer time, consumers) per output: edges of one src with one label carry one tensor."""
    out = {}
    for e in dag.edges:
        out.setdefault((e.src, e.tensor), (e.src, e.transfer_s, []))[2].append(e.dst)
    return list(out.values())


def feasible(dag, place, devs, contiguous, at_most, microbatches=1):
    """Whether ``place`` (node -> device index) honours eligibility, memory, groups, contiguity and the
    device count."""
    for n in dag.nodes:
        if node_time(n, devs[place[n.name]][1]) is None:
            return False
    for d, (_, _, limit, _) in enumerate(devs):
        used = sum(n.memory_bytes + microbatches * n.activation_bytes for n in dag.nodes if place[n.name] == d)
        if limit is not None and used > limit:
            return False
    groups = {}
    for n in dag.nodes:
        if n.group is not None and groups.setdefault(n.group, place[n.name]) != place[n.name]:
            return False
    if contiguous:
        quotient = nx.DiGraph((place[e.src], place[e.dst]) for e in order_edges(dag) if place[e.src] != place[e.dst])
        if not nx.is_directed_acyclic_graph(quotient):
            return False
    return at_most or len(set(place.values())) == len(devs)


def order_edges(dag):
    """The edges contiguity follows: all but those between backward nodes co-located with forward nodes,
    reversed between backward nodes."""
    anchors = {n.group for n in dag.nodes if not n.backward and n.group is not None}
    tied = {n.name for n in dag.nodes if n.backward and n.group in anchors}
    backward = {n.name for n in dag.nodes if n.backward}
    return [replace(e, src=e.dst, dst=e.src) if e.src in backward and e.dst in backward else e
            for e in dag.edges if not (e.src in tied and e.dst in tied)]


def score(dag, place, devs, objective, microbatches=1):
    """The objective of ``place`` (node -> device index), from the definitions:

    throughput: a device's load is its nodes' time on its kind plus, unless it is a host (CPU core), the
    transfer time of every tensor it sends off the device (once) and of every tensor it receives (once per
    receiving device); the largest load. Latency: a device starts when every device it receives from has
    finished, and works for its load; the last finish. GPipe: stages in index order, each paying its
    compute plus its point-to-point transfers, a tensor relayed by every stage between its producer and its
    last consumer; ``(M + K - 1)`` times the largest."""
    load = [0.0] * len(devs)
    for n in dag.nodes:
        load[place[n.name]] += node_time(n, devs[place[n.name]][1])
    used = sorted(set(place.values()))
    for src, cost, consumers in tensors(dag):
        s = place[src]
        recv = {place[c] for c in consumers} - {s}
        if not recv:
            continue
        if objective == "gpipe":
            rank = {d: i for i, d in enumerate(used)}
            last = max(rank[r] for r in recv)
            assert min(rank[r] for r in recv) > rank[s]
            for i in range(rank[s], last + 1):
                load[used[i]] += cost if i in (rank[s], last) else 2 * cost
            continue
        for d in (s, *recv):
            if not devs[d][3]:
                load[d] += cost
    if objective == "throughput":
        return max(load)
    if objective == "gpipe":
        return (microbatches + len(used) - 1) * max(load[d] for d in used)
    graph = nx.DiGraph()
    graph.add_nodes_from(used)
    graph.add_edges_from((place[e.src], place[e.dst]) for e in dag.edges if place[e.src] != place[e.dst])
    finish = {}
    for d in nx.topological_sort(graph):
        finish[d] = load[d] + max((finish[p] for p in graph.predecessors(d)), default=0.0)
    return max(finish.values())


def brute_force(dag, devs, objective, contiguous, at_most, microbatches=1):
    """The optimum over every assignment (None when none is feasible)."""
    names = dag.names
    best = None
    for labels in itertools.product(range(len(devs)), repeat=len(names)):
        place = dict(zip(names, labels, strict=True))
        if objective == "gpipe" and any(place[e.src] > place[e.dst] for e in dag.edges):
            continue  # pipeline stages in index order (any contiguous split has such a labelling)
        if not feasible(dag, place, devs, contiguous, at_most, microbatches):
            continue
        got = score(dag, place, devs, objective, microbatches)
        best = got if best is None else min(best, got)
    return best


def placement_of(part, devs):
    """The node -> device index map of a returned partition."""
    index = {label: d for d, (label, _, _, _) in enumerate(devs)}
    labels = part.devices or tuple(str(k) for k in range(part.num_stages))
    return {name: index[label] for label, stage in zip(labels, part.stages, strict=True) for name in stage}


# -- random small placement problems --------------------------------------------------------------------------------

def node_times(draw, cpu: int) -> dict[str, float]:
    """A node's time per device kind: on accelerators and, when there is a CPU core, mostly on both, some on
    one kind only."""
    where = draw(st.sampled_from(["both", "both", "both", "acc", "cpu"] if cpu else ["acc"]))
    times = {}
    if where != "cpu":
        times["accelerator"] = float(draw(st.integers(0, 9)))
    if where != "acc":
        times["cpu"] = float(draw(st.integers(0, 20)))
    return times


@st.composite
def placement_dags(draw):
    """Accelerators (1-3, a memory limit or none) and 0-1 CPU cores; per-kind times with some nodes runnable on
    one kind only; memory; co-location groups; backward marks; some nodes sending different tensors."""
    acc, cpu = draw(st.integers(1, 3)), draw(st.integers(0, 1))
    n = draw(st.integers(2, 5 if acc + cpu == 4 else 6))
    names = [f"v{i}" for i in range(n)]
    nodes = []
    for i in range(n):
        times = node_times(draw, cpu)
        nodes.append(Node(names[i], times=times, memory_bytes=draw(st.integers(0, 6)),
                          group=draw(st.sampled_from([None, None, None, "g0", "g1"])),
                          backward=draw(st.booleans()) and i >= n // 2))
    edges = []
    for j in range(n):
        cost = float(draw(st.integers(0, 4)))
        split = draw(st.booleans())
        for i in range(j + 1, n):
            if draw(st.booleans()):
                c = float(draw(st.integers(0, 4))) if split else cost
                edges.append(Edge(names[j], names[i], c, tensor=f"to{i}" if split else None))
    total = sum(nd.memory_bytes for nd in nodes)
    limit = draw(st.sampled_from([None, max(6, total // acc), max(6, total // acc + 3)]))
    kinds = (DeviceKind("accelerator", acc, limit), DeviceKind("cpu", cpu, None, host=True))
    return CostDAG(tuple(nodes), tuple(edges), name="random", devices=kinds, time_unit="unit")


@st.composite
def pipeline_dags(draw):
    """One kind of identical stages (GPipe): compute, memory and activations, groups."""
    k = draw(st.integers(1, 3))
    n = draw(st.integers(k, 6))
    names = [f"v{i}" for i in range(n)]
    nodes = [Node(names[i], float(draw(st.integers(0, 9))), memory_bytes=draw(st.integers(0, 6)),
                  activation_bytes=draw(st.integers(0, 2)), group=draw(st.sampled_from([None, None, "g0"])))
             for i in range(n)]
    costs = [float(draw(st.integers(0, 4))) for _ in range(n)]
    edges = [Edge(names[j], names[i], costs[j]) for j in range(n) for i in range(j + 1, n) if draw(st.booleans())]
    return CostDAG(tuple(nodes), tuple(edges), name="pipeline"), k


def check_exact(dag, devs, objective, contiguous, at_most, solvers, microbatches=1, stages=None, limit=None):
    """Every solver's split: feasible, re-scored to its reported objective, and equal to the brute-force optimum."""
    if limit is not None:
        devs = [(label, kind, limit, host) for label, kind, _, host in devs]
    best = brute_force(dag, devs, objective, contiguous, at_most, microbatches)
    for solver in solvers:
        try:
            part = partition(dag, stages, objective=objective, contiguous=contiguous, solver=solver, at_most=at_most,
                             microbatches=microbatches, memory_limit=limit)
        except PartitionError:
            assert best is None, f"{solver} found no placement; brute force found {best}"
            continue
        assert best is not None, f"{solver} returned a placement where none is feasible"
        place = placement_of(part, devs)
        assert feasible(dag, place, devs, contiguous, at_most, microbatches), solver
        assert score(dag, place, devs, objective, microbatches) == pytest.approx(part.objective, rel=1e-9), solver
        assert part.objective == pytest.approx(best, rel=1e-6, abs=1e-9), solver
        assert part.optimal and part.gap == 0.0


EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ILPS = ("ilp-ortools", "ilp-pulp")


@EXAMPLES
@given(placement_dags(), st.booleans())
def test_contiguous_throughput_of_every_exact_method_rescored_against_brute_force(dag, at_most):
    check_exact(dag, devices_of(dag), "throughput", True, at_most, ("dp", *ILPS))


def test_the_dp_finds_an_optimum_above_the_total_when_a_cpu_core_is_slow():
    """Found by hypothesis: a node that only the CPU core can take besides the accelerator's, at 5x the time.
    The optimum (5) exceeds the total of the accelerator times (2), where the DP used to stop looking."""
    from layoutsearch.costdag import DeviceKind

    nodes = (Node("v0", 0.0, times={"accelerator": 1.0, "cpu": 5.0}), Node("v1", 0.0, times={"accelerator": 1.0}))
    dag = CostDAG(nodes, (), name="slow-cpu", devices=(DeviceKind("accelerator", 1), DeviceKind("cpu", 1, host=True)))
    check_exact(dag, devices_of(dag), "throughput", True, False, ("dp", *ILPS))


@EXAMPLES
@given(placement_dags(), st.booleans())
def test_non_contiguous_throughput_of_the_ilps_rescored_against_brute_force(dag, at_most):
    check_exact(dag, devices_of(dag), "throughput", False, at_most, ILPS)


@EXAMPLES
@given(placement_dags(), st.booleans())
def test_latency_of_the_ilps_rescored_against_brute_force(dag, at_most):
    dag = replace(dag, nodes=tuple(replace(n, backward=False) for n in dag.nodes))  # inference graphs
    check_exact(dag, devices_of(dag), "latency", True, at_most, ILPS)


@EXAMPLES
@given(pipeline_dags(), st.integers(1, 3), st.booleans(), st.booleans())
def test_gpipe_of_every_exact_method_rescored_against_brute_force(dag_k, microbatches, at_most, limited):
    dag, k = dag_k
    mem = [n.memory_bytes + microbatches * n.activation_bytes for n in dag.nodes]
    limit = max(max(mem), sum(mem) // k + 2) if limited else None
    check_exact(dag, devices_of(dag, k), "gpipe", True, at_most, ("dp", *ILPS), microbatches, k, limit)


def test_the_independent_scorer_prices_a_hand_solved_placement():
    """a (accelerator) sends to b (accelerator 1) and c (CPU): a pays once, b pays to receive, c nothing."""
    dag = CostDAG((Node("a", times={"acc": 1.0, "cpu": 5.0}), Node("b", times={"acc": 2.0}),
                   Node("c", times={"cpu": 3.0})), (Edge("a", "b", 0.5), Edge("a", "c", 0.5)),
                  devices=(DeviceKind("acc", 2), DeviceKind("cpu", 1, host=True)))
    devs = devices_of(dag)
    place = {"a": 0, "b": 1, "c": 2}
    assert score(dag, place, devs, "throughput") == 3.0  # max(1 + 0.5, 2 + 0.5, 3)
    assert score(dag, place, devs, "latency") == 4.5  # a (1.5), then c (3)
    assert partition(dag, objective="latency", solver="ilp-ortools").objective == 4.5


def test_at_most_k_devices_beats_forcing_all_of_them():
    """Two nodes of compute 1 joined by a transfer of 10: one device (2.0), not two (11.0)."""
    dag = CostDAG((Node("a", 1.0), Node("b", 1.0)), (Edge("a", "b", 10.0),),
                  devices=(DeviceKind("accelerator", 2),))
    for solver in ("dp", *ILPS, "brute"):
        assert partition(dag, solver=solver).objective == 2.0
        assert partition(dag, solver=solver, at_most=False).objective == 11.0


# -- the paper's instances as shipped -------------------------------------------------------------------------------

@needs_instances
@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}")
def test_every_paper_instance_loads_with_its_devices_groups_and_backward_nodes(path):
    doc = json.loads(path.read_text())
    dag = load_costdag(path)
    assert len(dag.nodes) == len(doc["nodes"]) and len(dag.edges) == len(doc["edges"])
    acc, cpu = dag.devices
    assert (acc.count, cpu.count, acc.memory_bytes, cpu.host) == (doc["maxFPGAs"], doc["maxCPUs"],
                                                                  doc["maxSizePerFPGA"], True)
    by_id = {i: dag.node(name) for name, i in dag.meta["node_ids"].items()}
    for raw in doc["nodes"]:
        node = by_id[raw["id"]]
        assert node.backward == bool(raw.get("isBackwardNode", False))
        assert node.time_on("cpu") == raw["cpuLatency"]
        assert node.time_on("accelerator") == (raw["fpgaLatency"] if raw.get("supportedOnFpga", True) else None)
        assert node.group == (None if raw.get("colorClass") is None else str(raw["colorClass"]))
    assert dag.time_unit == "unit"


@needs_instances
@pytest.mark.parametrize("path", EXPERTS, ids=lambda p: p.stem)
def test_every_expert_split_is_priced_against_its_instance(path):
    name = path.stem.removesuffix("_expert")
    dag = load_costdag(PLACEMENT / "throughput-inputs" / "LayerGraphs" / f"{name}.json")
    split = baselines.read_expert(path, dag)
    expert = baselines.expert_split(dag, split, "throughput", 1)
    assert expert.num_stages >= 2 and expert.objective > 0
    assert partition(dag, solver="dp").objective <= expert.objective * (1 + 1e-9)


# -- bad input: one clear line, exit 2 ------------------------------------------------------------------------------

def write(tmp_path, doc, name="dag.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def v2(nodes, edges=(), acc=2, memory=None, cpu=1):
    devices = [{"name": "accelerator", "count": acc} | ({"memory_bytes": memory} if memory is not None else {}),
               {"name": "cpu", "count": cpu, "host": True}]
    return {"version": 2, "devices": devices, "nodes": list(nodes), "edges": list(edges)}


BAD = {
    "group of nodes that cannot share a device": (
        v2([{"name": "a", "times": {"accelerator": 1}, "group": "g"}, {"name": "b", "times": {"cpu": 1}, "group": "g"}]),
        [], "co-location group 'g' (2 nodes) spans nodes that cannot share a device"),
    "group larger than any device memory": (
        v2([{"name": "a", "times": {"accelerator": 1}, "memory_bytes": 6, "group": "g"},
            {"name": "b", "times": {"accelerator": 1}, "memory_bytes": 6, "group": "g"}], memory=10),
        [], "co-location group 'g' (2 nodes) needs 12 B of memory"),
    "node runnable nowhere": (
        v2([{"name": "a", "times": {"accelerator": 1}}, {"name": "b", "times": {"cpu": 1}}], cpu=0),
        [], "node 'b' can run on no device"),
    "k = 0": (v2([{"name": "a", "compute_s": 1}]), ["--stages", "0"], "must be an integer from 1 to 4096, got 0"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_placement_input_is_one_line_and_exit_2(capsys, tmp_path, case):
    doc, flags, message = BAD[case]
    code, out, err = run(capsys, "partition", write(tmp_path, doc), *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("layoutsearch: error: ") and message in err, err


def test_an_expert_file_naming_unknown_nodes_is_one_line_and_exit_2(capsys, tmp_path):
    dag = write(tmp_path, v2([{"name": "a", "compute_s": 1}, {"name": "b", "compute_s": 1}],
                             [{"src": "a", "dst": "b", "transfer_s": 1}]))
    expert = write(tmp_path, {"fpgas": [{"nodes": ["a"]}, {"nodes": ["zz"]}], "cpus": []}, "expert.json")
    code, out, err = run(capsys, "partition", dag, "--expert", expert)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "names unknown node 'zz'" in err, err


# -- the CLI in separate processes: determinism, Ctrl-C ------------------------------------------------------------

def cli(*args):
    return [sys.executable, str(ROOT / "cli.py"), *map(str, args)]


def tie_prone(tmp_path):
    """Twelve identical nodes in two identical chains, four accelerators: many equally good placements."""
    nodes = [{"name": f"{c}{i}", "compute_s": 1.0, "memory_bytes": 1} for c in "ab" for i in range(6)]
    edges = [{"src": f"{c}{i}", "dst": f"{c}{i + 1}", "transfer_s": 0.25} for c in "ab" for i in range(5)]
    return write(tmp_path, {"version": 2, "devices": [{"name": "accelerator", "count": 4, "memory_bytes": 4}],
                            "nodes": nodes, "edges": edges})


@pytest.mark.parametrize("solver", ILPS)
def test_non_contiguous_partition_json_is_byte_identical_across_processes(tmp_path, solver):
    path = tie_prone(tmp_path)
    outs = [subprocess.run(cli("partition", path, "--non-contiguous", "--solver", solver, "--json"),
                           capture_output=True, text=True, timeout=300, cwd=ROOT) for _ in range(2)]
    assert outs[0].returncode == 0, outs[0].stderr
    assert outs[0].stdout == outs[1].stdout
    assert json.loads(outs[0].stdout)["optimal"]


def children(pid):
    """The ids of the live child processes of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def alive(pid):
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_instances
@pytest.mark.slow
@pytest.mark.parametrize("solver", ILPS)
def test_sigint_during_a_long_solve_exits_130_and_leaves_nothing_behind(tmp_path, solver):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    path = PLACEMENT / "throughput-inputs" / "OperatorGraphs" / "resnet50_training.json"
    proc = subprocess.Popen(cli("partition", path, "--non-contiguous", "--solver", solver, "--time-limit", 500),
                            cwd=ROOT, env=os.environ | {"TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    kids: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        kids = children(proc.pid)
        if solver == "ilp-ortools" or kids:  # CP-SAT runs in-process; CBC as a child
            time.sleep(3.0)  # well into the solve
            kids = children(proc.pid) or kids
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the solve ended before it could be interrupted"
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 5.0
    assert "interrupted" in err
    assert not any(alive(k) for k in kids)
    assert list(tmp.iterdir()) == []


def test_the_documented_placement_example(tmp_path):
    """docs/costdag.md's v2 example: CPU-only lookup on the CPU core (no transfer paid there), the group together."""
    text = (ROOT / "docs" / "costdag.md").read_text()
    path = tmp_path / "toy.json"
    path.write_text(text.split("```json\n")[2].split("```", 1)[0])
    dag = load_costdag(path)
    place = {"embed": 0, "w": 1, "mlp": 1, "lookup": 2}
    assert score(dag, place, devices_of(dag), "throughput") == 3.75  # mlp 3 + receives 0.5 + 0.25
    assert partition(dag).objective == 3.75
    assert partition(dag, objective="latency", solver="ilp-pulp").objective == 5.75  # max(1.5, 2) + 3.75


@EXAMPLES
@given(placement_dags(), st.sampled_from(["throughput", "latency"]))
def test_the_local_search_heuristic_returns_a_feasible_placement_no_better_than_the_optimum(dag, objective):
    dag = replace(dag, nodes=tuple(replace(n, backward=False) for n in dag.nodes))
    devs = devices_of(dag)
    best = brute_force(dag, devs, objective, True, True)
    try:
        part = partition(dag, objective=objective, solver="local")
    except PartitionError:
        return  # nothing feasible, or no start (the first kind cannot hold the DAG in order)
    place = placement_of(part, devs)
    assert feasible(dag, place, devs, True, True)
    assert score(dag, place, devs, objective) == pytest.approx(part.objective, rel=1e-9)
    assert part.objective >= best - 1e-9 and not part.optimal


@needs_instances
def test_placement_baselines_are_priced_and_never_beat_the_contiguous_optimum():
    dag = load_costdag(PLACEMENT / "throughput-inputs" / "LayerGraphs" / "bert24_inference.json")
    best = partition(dag)
    rows = {b.method: b for b in baselines.placement_baselines(dag, "throughput", 1, time_limit=2.0)}
    assert set(rows) == {"one accelerator", "equal split", "PipeDream-style planner",
                         "local search (from equal split)"}
    for b in rows.values():
        assert b.objective >= best.objective * (1 - 1e-9)
    assert rows["one accelerator"].objective == pytest.approx(sum(n.time_on("accelerator") for n in dag.nodes))


# -- lower bounds and the latency ILP against its heuristic ---------------------------------------------------------

def reduced_instances(dag, contiguous):
    """The compiled DAG and its exact reduction, as the solvers see them."""
    from layoutsearch.solvers.partition.instance import compile_dag, kinds_of
    from layoutsearch.solvers.partition.reduce import reduce

    full = compile_dag(dag, kinds_of(dag, None, None))
    return full, reduce(full, contiguous=contiguous, at_most=True, microbatches=1)


@EXAMPLES
@given(placement_dags(), st.sampled_from([("throughput", True), ("throughput", False), ("latency", True)]))
def test_the_lower_bounds_never_exceed_the_brute_force_optimum(dag, setting):
    from layoutsearch.solvers.partition.bounds import objective_bound

    objective, contiguous = setting
    if objective == "latency":
        dag = replace(dag, nodes=tuple(replace(n, backward=False) for n in dag.nodes))
    best = brute_force(dag, devices_of(dag), objective, contiguous, True)
    if best is None:
        return
    for inst in reduced_instances(dag, contiguous):
        assert objective_bound(inst, objective) <= best * (1 + 1e-9) + 1e-9


@EXAMPLES
@given(placement_dags())
def test_the_latency_ilp_is_exact_never_worse_than_its_heuristic_and_bounded_below_honestly(dag):
    dag = replace(dag, nodes=tuple(replace(n, backward=False) for n in dag.nodes))
    best = brute_force(dag, devices_of(dag), "latency", True, True)
    try:
        heur = partition(dag, objective="latency", solver="local")
    except PartitionError:
        heur = None
    for solver in ILPS:
        try:
            part = partition(dag, objective="latency", solver=solver)
        except PartitionError:
            assert best is None
            continue
        assert part.objective == pytest.approx(best, rel=1e-6, abs=1e-9) and part.optimal
        assert heur is None or part.objective <= heur.objective + 1e-9
        assert part.info["lower_bound"] <= best * (1 + 1e-9) + 1e-9


@needs_instances
@pytest.mark.parametrize("name", ["bert24_inference", "gnmt_inference"])
def test_a_stopped_latency_ilp_keeps_the_better_of_itself_and_its_heuristic_and_states_its_gap(name):
    dag = load_costdag(PLACEMENT / "latency-inputs" / "LayerGraphs" / f"{name}.json")
    part = partition(dag, objective="latency", solver="ilp-ortools", time_limit=3.0)
    heur = partition(dag, objective="latency", solver="local", time_limit=1.5)  # the time the ILP gives its own
    devs = devices_of(dag)
    place = placement_of(part, devs)
    assert feasible(dag, place, devs, True, True)
    assert score(dag, place, devs, "latency") == pytest.approx(part.objective, rel=1e-9)
    assert part.objective <= heur.objective * (1 + 1e-9)
    bound = part.info["lower_bound"]
    assert 0 < bound <= part.objective
    assert part.optimal or part.gap == pytest.approx((part.objective - bound) / part.objective, rel=1e-9)


# -- latency: the path bound and the interval-chain start on memory-bound chains ------------------------------------

@st.composite
def latency_dags(draw):
    """Inference graphs shaped like the paper's: a chain with skip edges and short branches, tensors that cost
    more than the nodes, accelerators (1-3) whose memory forces splits, 0-1 CPU cores ten times slower."""
    acc, cpu = draw(st.integers(1, 3)), draw(st.integers(0, 1))
    n = draw(st.integers(2, 5 if acc + cpu == 4 else 6))
    names = [f"v{i}" for i in range(n)]
    nodes = []
    for i in range(n):
        t = float(draw(st.integers(0, 4)))
        times = {"accelerator": t} | ({"cpu": 10 * t + draw(st.integers(0, 3))} if cpu else {})
        nodes.append(Node(names[i], times=times, memory_bytes=draw(st.integers(1, 6))))
    edges = []
    for j in range(n - 1):
        cost = float(draw(st.integers(0, 12)))
        edges.append(Edge(names[j], names[j + 1], cost))
        for i in range(j + 2, n):
            if draw(st.integers(0, 3)) == 0:
                edges.append(Edge(names[j], names[i], cost))
    total = sum(nd.memory_bytes for nd in nodes)
    limit = draw(st.sampled_from([max(6, -(-total // acc)), max(6, total // 2), 6]))
    kinds = (DeviceKind("accelerator", acc, limit), DeviceKind("cpu", cpu, None, host=True))
    return CostDAG(tuple(nodes), tuple(edges), name="chain", devices=kinds, time_unit="unit")


@EXAMPLES
@given(latency_dags())
def test_latency_on_memory_bound_chains_every_method_rescored_against_brute_force(dag):
    """The ILPs (started from the heuristic, their objective capped at its latency) reach the brute-force
    optimum; the heuristic's split is feasible, re-scored to its value and never below the optimum; the path
    bound and the reported lower bound never exceed the optimum."""
    from layoutsearch.solvers.partition.bounds import objective_bound, path_bound

    devs = devices_of(dag)
    best = brute_force(dag, devs, "latency", True, True)
    check_exact(dag, devs, "latency", True, True, ILPS)
    if best is None:
        return
    for inst in reduced_instances(dag, True):
        assert path_bound(inst) <= best * (1 + 1e-9) + 1e-9
        assert objective_bound(inst, "latency") <= best * (1 + 1e-9) + 1e-9
    try:
        heur = partition(dag, objective="latency", solver="local")
    except PartitionError:
        return
    place = placement_of(heur, devs)
    assert feasible(dag, place, devs, True, True)
    assert score(dag, place, devs, "latency") == pytest.approx(heur.objective, rel=1e-9)
    assert heur.objective >= best - 1e-9
    assert heur.info["lower_bound"] <= best * (1 + 1e-9) + 1e-9


@EXAMPLES
@given(latency_dags())
def test_the_interval_chain_start_is_contiguous_and_priced_as_its_sum_of_loads_at_most(dag):
    from layoutsearch.solvers.partition.chain import chain_start
    from layoutsearch.solvers.partition.instance import evaluate, value

    devs = devices_of(dag)
    best = brute_force(dag, devs, "latency", True, True)
    full, inst = reduced_instances(dag, True)
    sigma = chain_start(inst, 1)
    if sigma is None:
        return
    from layoutsearch.solvers.partition.reduce import expand

    flat = expand(full, inst, sigma)
    place = {full.names[v]: flat[v] for v in range(full.n)}
    assert feasible(dag, place, devs, True, True)
    loads, _ = evaluate(inst, sigma, "latency", 1)
    got = score(dag, place, devs, "latency")
    assert got == pytest.approx(value(inst, sigma, loads, "latency", 1), rel=1e-9)
    assert best is not None and best - 1e-9 <= got <= sum(loads) + 1e-9


def test_the_path_bound_prices_a_forced_split_hand_solved():
    """a -> b -> c, each of time 1 and memory 4 on accelerators holding 8, no CPU: two accelerators, the cut
    after a or after b pays its tensor twice (sent, received): 3 + 2 * 2 = 7 (the cheaper tensor, a's 2)."""
    from layoutsearch.solvers.partition.bounds import critical_path, path_bound

    dag = CostDAG(tuple(Node(x, times={"accelerator": 1.0}, memory_bytes=4) for x in "abc"),
                  (Edge("a", "b", 2.0), Edge("b", "c", 5.0)),
                  devices=(DeviceKind("accelerator", 2, 8), DeviceKind("cpu", 0, None, host=True)))
    full, _ = reduced_instances(dag, True)
    assert critical_path(full) == 3.0
    assert path_bound(full) == 7.0
    assert partition(dag, objective="latency", solver="ilp-ortools").objective == 7.0
    assert brute_force(dag, devices_of(dag), "latency", True, True) == 7.0


def test_the_path_bound_charges_the_skip_tensor_hand_solved():
    """a feeds b, x and c (one tensor of cost 3), b and x feed c (cost 1 each); memory (4 + 2 + 2 + 4 over
    accelerators holding 8) forces a cut. Best: a alone, then b, x, c: 1 + 3 (sent) + 3 (received) + 3 = 10.
    The path a -> b -> c cut after a pays a's tensor on both sides (9: the path's hull leaves x out); cut
    after b it pays a's skip tensor too (11, not 2 + 1 + 1 + 1 + 1 = 6 for the path's own tensors only).
    With the min cuts, the device of b and c either holds x (time 1) or receives its tensor (1): 10, tight."""
    from layoutsearch.solvers.partition.bounds import path_bound

    def node(name, mem):
        return Node(name, times={"accelerator": 1.0}, memory_bytes=mem)

    nodes = (node("a", 4), node("b", 2), node("x", 2), node("c", 4))
    edges = (Edge("a", "b", 3.0), Edge("a", "x", 3.0), Edge("a", "c", 3.0), Edge("b", "c", 1.0), Edge("x", "c", 1.0))
    dag = CostDAG(nodes, edges, devices=(DeviceKind("accelerator", 3, 8), DeviceKind("cpu", 0, None, host=True)))
    full, _ = reduced_instances(dag, True)
    assert brute_force(dag, devices_of(dag), "latency", True, True) == 10.0
    assert path_bound(full, refine_s=0.0) == 9.0
    tight = path_bound(full, refine_s=60)  # (not the default's 2 s: a stalled machine may stop it early)
    assert tight == pytest.approx(10.0, rel=1e-6) and tight <= 10.0
    part = partition(dag, objective="latency", solver="ilp-ortools")
    assert part.objective == 10.0 and part.optimal
