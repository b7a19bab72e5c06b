"""Solvers against the enumeration oracle: random problems, random small graphs and meshes, chains for the DP.

``pytest -m slow`` runs the same properties on many more examples.
"""

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir import GraphBuilder
from layoutsearch.layout import Layout
from layoutsearch.mesh import Mesh, hardware
from layoutsearch.solvers import dp, ilp
from layoutsearch.solvers import enumerate as enum
from layoutsearch.solvers.assemble import Excess, Item, Items, assemble, unique_rows
from layoutsearch.solvers.assemble import evaluate as evaluate_item
from layoutsearch.solvers.build import build_space
from layoutsearch.solvers.clock import Deadline
from layoutsearch.solvers.pricer import evaluate
from layoutsearch.solvers.problem import Factor, MemItem, MemRow, Problem, prune, restrict
from layoutsearch.solvers.rulesets import rule_sets, rules_of

HW = hardware("cpu-sim")
REL = 1e-9
FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


# -- random problems ------------------------------------------------------------------------------------------------

def random_problem(seed: int, chain: bool = False) -> Problem:
    """A random problem: 2-5 nodes, 1-4 strategies, edges (a chain with a hub when ``chain``) or factors over
    three nodes, nonnegative costs, memory items on nodes and factors, a few rows."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    sizes = [int(rng.integers(1, 5)) for _ in range(n)]
    unary = [rng.random(k) * rng.choice([1e-3, 1.0]) for k in sizes]
    factors: list[Factor] = []

    def factor(nodes: tuple[int, ...]) -> Factor:
        keys = tuple(rng.integers(0, max(1, sizes[m] - int(rng.integers(0, 2))), sizes[m]) for m in nodes)
        shape = tuple(int(k.max()) + 1 for k in keys)
        return Factor(nodes, keys, rng.random(shape) * rng.choice([0.1, 1.0]))

    if chain:
        hub = n - 1 if n > 2 and rng.random() < 0.5 else None
        path = [m for m in range(n) if m != hub]
        for a, b in itertools.pairwise(path):
            factors.append(factor((min(a, b), max(a, b))))
        if hub is not None:
            for m in path:
                if rng.random() < 0.6:
                    factors.append(factor((m, hub)))
    else:
        for a in range(n):
            for b in range(a + 1, n):
                if rng.random() < 0.5:
                    factors.append(factor((a, b)))
        if n >= 3 and rng.random() < 0.5:
            factors.append(factor((0, 1, 2)))
    items = [MemItem(m, None, rng.integers(0, 100, sizes[m]).astype(float)) for m in range(n)]
    items += [MemItem(None, i, rng.integers(0, 50, f.cost.shape).astype(float)) for i, f in enumerate(factors)
              if rng.random() < 0.5]
    rows = [MemRow(float(rng.integers(0, 20)), tuple((i, int(rng.integers(1, 4))) for i in range(len(items))
                                                    if rng.random() < 0.6)) for _ in range(int(rng.integers(1, 4)))]
    return Problem([f"n{m}" for m in range(n)], unary, factors, items, rows)


def limits(problem: Problem) -> list[float | None]:
    """No limit, a limit between the smallest and largest peak, and one below every peak."""
    lo = enum.min_memory(problem)
    hi = max(problem.memory(a) for a in np.ndindex(*problem.sizes))
    return [None, (lo + hi) / 2, lo, lo - 1]


def same(a: list, b: list) -> None:
    """Two solvers' answers agree: both infeasible with the same smallest peak, or the same optimal cost."""
    assert bool(a[0].assign) == bool(b[0].assign)
    if not a[0].assign:
        assert a[0].min_memory == pytest.approx(b[0].min_memory, rel=REL)
        return
    assert a[0].cost == pytest.approx(b[0].cost, rel=REL, abs=1e-300)


def check_problem(problem: Problem, solvers: tuple[str, ...]) -> None:
    for limit in limits(problem):
        want = enum.solve(problem, limit)
        for s in solvers:
            got = dp.solve(problem, limit) if s == "dp" else ilp.solve(problem, limit, backend=s)
            same(want, got)
            if got[0].assign:
                assert got[0].optimal
                assert problem.fits(got[0].assign, limit)


@FAST
@given(st.integers(0, 2**31 - 1))
@example(8137)  # CBC's preprocessing once returned a worse plan as optimal here
@example(23)  # a fractional limit: ilp-pulp admitted a row sum of floor(limit) + 1 and asked again forever
@example(70)
def test_ilp_backends_reach_the_enumeration_optimum_on_random_problems(seed):
    check_problem(random_problem(seed), ("pulp", "ortools"))


@FAST
@given(st.integers(0, 2**31 - 1))
def test_dp_reaches_the_enumeration_optimum_on_random_chains(seed):
    problem = random_problem(seed, chain=True)
    assert dp.chain_order(problem) is not None
    check_problem(problem, ("dp", "ortools"))


@pytest.mark.slow
@SLOW
@given(st.integers(0, 2**31 - 1), st.booleans())
def test_every_solver_reaches_the_enumeration_optimum_slow(seed, chain):
    problem = random_problem(seed, chain=chain)
    check_problem(problem, ("pulp", "ortools", "dp") if chain else ("pulp", "ortools"))


def test_runner_ups_are_the_next_best_assignments():
    problem = random_problem(7)
    want = enum.solve(problem, top=4)
    for backend in ("pulp", "ortools"):
        got = ilp.solve(problem, top=4, backend=backend)
        assert [s.cost for s in got] == pytest.approx([s.cost for s in want], rel=REL)
        assert len({s.assign for s in got}) == len(got)
    chain = random_problem(11, chain=True)
    assert [s.cost for s in dp.solve(chain, top=3)] == pytest.approx([s.cost for s in enum.solve(chain, top=3)])


def test_time_limited_ilp_reports_feasible_plan_and_gap():
    problem = random_problem(3)
    sol = ilp.solve(problem, backend="ortools", time_limit=30)[0]
    assert sol.optimal and sol.gap == 0.0


def test_pruning_keeps_the_optimum():
    for seed in range(20):
        problem = random_problem(seed)
        best = enum.solve(problem)[0]
        reduced, keep = prune(problem, best.cost)
        got = enum.solve(reduced)[0]
        assert got.cost == pytest.approx(best.cost, rel=REL)
        back = tuple(int(k[s]) for k, s in zip(keep, got.assign, strict=True))
        assert problem.cost(back) == pytest.approx(best.cost, rel=REL)


def test_restrict_evaluates_like_the_original():
    problem = random_problem(5)
    rng = random.Random(0)
    keep = [np.array(sorted(rng.sample(range(k), max(1, k - 1)))) for k in problem.sizes]
    small = restrict(problem, keep)
    for a in np.ndindex(*small.sizes):
        orig = tuple(int(k[s]) for k, s in zip(keep, a, strict=True))
        assert small.cost(a) == pytest.approx(problem.cost(orig), rel=1e-12)
        assert small.memory(a) == pytest.approx(problem.memory(orig), rel=1e-12)


def test_unique_rows_of_wide_tables_are_numpys():
    rng = np.random.default_rng(0)
    for _ in range(50):  # 30+ columns: past the packed-integer path, the hashed one
        width, top = int(rng.integers(30, 300)), int(rng.integers(0, 12))
        proto = rng.integers(-1, top + 1, size=(int(rng.integers(1, 20)), width))
        rows = proto[rng.integers(0, len(proto), size=int(rng.integers(1, 300)))]
        uniq, inv = unique_rows(rows)
        want, want_inv = np.unique(rows, axis=0, return_inverse=True)
        assert np.array_equal(uniq, want) and np.array_equal(inv, want_inv.reshape(-1))


def test_memory_items_of_equal_value_merge_and_price_the_same():
    """Items of equal bytes live on disjoint pieces of the schedule (the pieces of one shared copy's life)
    are one item live on both: fewer items and rows, the same peak under every plan."""
    keys = np.arange(3).reshape(3, 1)
    items = Items()

    def make(scale):
        return lambda: Item("store", [(0, keys)], lambda a: float(scale * (1 + a[0][0])))
    for k, (scale, span) in enumerate([(10, (0, 1)), (10, (2, 3)), (10, (4, 5)), (7, (1, 4))]):
        items.add_memory(("item", k), make(scale), span)
    points = [f"p{i}" for i in range(6)]
    problem = assemble(["n"], [3], items, points, ["c"] * 6, Deadline())
    assert len(problem.mem_items) == 2
    assert len(problem.mem_rows) == 1  # where both are live: that row dominates every other
    for s in range(3):
        assert problem.memory([s]) == pytest.approx(17 * (1 + s))


def test_dp_refuses_a_problem_that_is_not_a_chain():
    problem = Problem(["a", "b", "c", "d"], [np.zeros(2)] * 4,
                      [Factor((a, b), (np.arange(2), np.arange(2)), np.ones((2, 2)))
                       for a in range(4) for b in range(a + 1, 4)])
    with pytest.raises(LayoutSearchError, match="chain"):
        dp.solve(problem)


def test_enumeration_refuses_huge_problems():
    problem = Problem([str(i) for i in range(30)], [np.zeros(4)] * 30)
    with pytest.raises(LayoutSearchError, match="ilp"):
        enum.solve(problem)


# -- random graphs and meshes ---------------------------------------------------------------------------------------

@st.composite
def small_graphs(draw, blocks: int = 0):
    """A random small model (einsums with parameters, elementwise ops, a mean-square loss) and a 1-2 axis mesh
    whose axis sizes divide every dim."""
    axes = draw(st.lists(st.sampled_from([2, 4]), min_size=1, max_size=2))
    mesh = Mesh(tuple((f"a{i}", s) for i, s in enumerate(axes)))
    unit = math.lcm(*axes)
    b = GraphBuilder("random")
    names = ["batch", "x", "y", "z"][: draw(st.integers(2, 4))]
    dims = {n: b.dim(n, unit * draw(st.sampled_from([1, 2]))) for n in names}
    cur = b.input("inp", [dims["batch"], dims[names[1]]])
    n_ops = draw(st.integers(1, 3 if not blocks else 2))
    plan = [(draw(st.sampled_from(["einsum", "unary", "bias"])), draw(st.sampled_from(names[1:])),
             draw(st.sampled_from(["relu", "gelu", "tanh"]))) for _ in range(n_ops)]
    for layer in range(draw(st.integers(blocks, 4)) if blocks else 1):
        with b.block(f"layer.{layer}") if blocks else _null():
            for j, (kind, target, fn) in enumerate(plan):
                feat = cur.dims[-1]
                new = dims[target] if dims[target] != feat else None
                if kind == "einsum" and new is not None:
                    w = b.parameter(f"w{j}", [feat, new])
                    cur = b.einsum([cur, w], [dims["batch"], new])
                elif kind == "bias":
                    cur = cur + b.parameter(f"bias{j}", [feat])
                else:
                    cur = b.unary(fn, cur)
            if blocks and cur.dims[-1] != dims[names[1]]:
                w = b.parameter("back", [cur.dims[-1], dims[names[1]]])
                cur = b.einsum([cur, w], [dims["batch"], dims[names[1]]])
    loss = b.reduce(b.square(cur), [], fn="mean", name="loss")
    return b.build(loss), mesh


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def check_space(space, solvers):
    problem = space.problem
    assume(problem.num_assignments <= 150_000)
    for limit in limits(problem)[:3]:
        want = enum.solve(problem, limit)
        for s in solvers:
            got = dp.solve(problem, limit) if s == "dp" else ilp.solve(problem, limit, backend=s)
            same(want, got)


@FAST
@given(small_graphs())
def test_ilp_matches_enumeration_on_random_graphs_in_the_ops_space(gm):
    g, mesh = gm
    check_space(build_space(g, mesh, HW, "ops"), ("pulp", "ortools"))


@FAST
@given(small_graphs(blocks=2))
def test_dp_matches_enumeration_on_random_chains_of_layers(gm):
    g, mesh = gm
    rules = rule_sets(g, mesh)
    assume(len(rules) <= 12)
    space = build_space(g, mesh, HW, "layers", tie=False, rules=rules)
    assert dp.chain_order(space.problem) is not None
    check_space(space, ("dp", "ortools"))


@pytest.mark.slow
@SLOW
@given(small_graphs())
def test_solvers_match_enumeration_on_random_graphs_slow(gm):
    g, mesh = gm
    check_space(build_space(g, mesh, HW, "ops"), ("pulp", "ortools"))


@FAST
@given(small_graphs())
def test_rules_space_prices_every_candidate_as_the_cost_model(gm):
    g, mesh = gm
    space = build_space(g, mesh, HW, "rules")
    problem = space.problem
    for r in range(0, problem.sizes[0], max(1, problem.sizes[0] // 6)):
        rules = rules_of(space.nodes[0].rules, r, space.dims, mesh)
        lay = Layout(mesh, rules).check(g)
        assert space.layout((r,)).rules == rules
        comp, comm, mem = evaluate(g, mesh, HW, space.op_layouts((r,)),
                                   {t: lay.dim_layout(g.tensors[t]) for t in g.tensors})
        assert problem.cost((r,)) == pytest.approx(comp + comm, rel=REL)
        assert problem.memory((r,)) == mem


@FAST
@given(small_graphs(blocks=3))
def test_tied_layers_price_as_untied_ones(gm):
    g, mesh = gm
    rules = rule_sets(g, mesh)
    assume(len(rules) <= 40)
    tied = build_space(g, mesh, HW, "layers", tie=True, rules=rules)
    untied = build_space(g, mesh, HW, "layers", tie=False, rules=rules)
    assert len(tied.nodes) < len(untied.nodes)
    for r in range(len(rules)):
        assert tied.problem.cost((r,) * len(tied.nodes)) == pytest.approx(
            untied.problem.cost((r,) * len(untied.nodes)), rel=REL)
        assert tied.problem.memory((r,) * len(tied.nodes)) == untied.problem.memory((r,) * len(untied.nodes))


@pytest.mark.parametrize("hw", ["cpu-sim", "h100"])  # h100: fusion, flash attention, re-gathered weights
@pytest.mark.parametrize("remat", ["none", "selective", "full"])
@pytest.mark.parametrize("kind", ["rules", "layers"])
def test_spaces_price_plans_exactly_as_the_cost_model_with_remat(remat, kind, hw):
    from layoutsearch import zoo
    from layoutsearch.costmodel.report import estimate
    from layoutsearch.costmodel.step import training_step

    g = training_step(zoo.build("gpt", batch=4, seq=8, vocab=32, d_model=16, heads=2, layers=3))
    hw_ = hardware(hw)
    mesh = Mesh.parse("data:2,model:2")
    rng = random.Random(0)
    every = rule_sets(g, mesh)  # a sample of them (fallbacks of both slots included), for time
    sample = sorted(rng.sample(range(len(every)), 48) + [i for i in range(len(every)) if (every.fallback[i] >= 0).all()][:8])
    space = build_space(g, mesh, hw_, kind, remat=remat, rules=every.take(sample))
    problem = space.problem
    for trial in range(12):
        uniform = trial % 2 == 0 or kind == "rules"
        r = rng.randrange(problem.sizes[0])
        a = (r,) * len(problem.sizes) if uniform else tuple(rng.randrange(k) for k in problem.sizes)
        comp, comm, mem = evaluate(g, mesh, hw_, space.op_layouts(a), {t: space.storage(a, t) for t in g.tensors},
                                   remat)
        assert problem.cost(a) == pytest.approx(comp + comm, rel=REL)
        assert problem.memory(a) == mem
        if uniform:
            report = estimate(g, Layout(mesh, rules_of(space.nodes[0].rules, r, space.dims, mesh)), hw_, remat=remat,
                              overlap=0.0)
            assert report.step_s == pytest.approx(comp + comm, rel=REL)
            assert report.memory_bytes == mem


def test_an_excess_table_equals_calling_it_on_every_combination():
    """:class:`Excess` (a recomputation's buffers: the largest later term above the first) is evaluated term by
    term and broadcast; the table must be the item's value on every combination of its nodes' keys."""
    rng = np.random.default_rng(3)
    keys = {n: rng.integers(-1, 3, size=(12, 2)) for n in range(4)}
    roles = [(0, keys[0]), (1, keys[1]), (1, keys[1][:, :1]), (2, keys[2]), (3, keys[3]), (0, keys[0][:, 1:])]
    weight = rng.random((6, 2))

    def linear(which: list[int]):
        return lambda a: float(sum(weight[r] @ np.resize(x, 2) for r, x in zip(which, a, strict=True)))

    fn = Excess(((2, linear([0, 1])), (2, linear([2, 3])), (2, linear([4, 5]))))
    table = evaluate_item(Item("recompute", roles, fn))
    for s in itertools.product(range(12), repeat=4):
        want = fn([rows[s[n]] for n, rows in roles])
        got = table.table[tuple(k[s[i]] for i, k in enumerate(table.keys))]
        assert got == pytest.approx(want, abs=1e-12)


def test_the_maximal_cliques_are_networkx_s():
    """The rules space's dim groups come from the maximal cliques of the graph of parameter dims that no op or
    tensor has together (rulesets._maximal_cliques, written out to keep networkx off the search's start-up):
    the same cliques as networkx finds, on random graphs of up to 9 nodes."""
    import random

    import networkx as nx

    from layoutsearch.solvers.rulesets import _maximal_cliques

    rng = random.Random(0)
    for _ in range(300):
        nodes = [f"d{i}" for i in range(rng.randint(1, 9))]
        edges = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:] if rng.random() < rng.random()]
        g = nx.Graph()
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        assert sorted(map(sorted, _maximal_cliques(nodes, edges))) == sorted(map(sorted, nx.find_cliques(g)))
