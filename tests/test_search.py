"""search(): plans that fit memory limits, the impossible-limit message, baselines never better, JSON."""

import itertools
import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutsearch import zoo
from layoutsearch.costmodel.report import estimate
from layoutsearch.errors import LayoutSearchError
from layoutsearch.ir.remat import block_groups
from layoutsearch.solvers.baselines import baseline_sets
from layoutsearch.solvers.search import InfeasibleError, baseline_rules, search

MESH = "data:2,model:4"
GPT = {"batch": 8, "seq": 16, "vocab": 64, "d_model": 32, "heads": 4, "layers": 2}


@pytest.fixture(scope="module")
def gpt():
    return zoo.build("gpt", **GPT)


@pytest.fixture(scope="module")
def free(gpt):
    return search(gpt, MESH, hardware="h100")


def data_parallel(plan):
    return next(b for b in plan.baselines if b.name == "data-parallel").plan


def test_plan_is_proven_optimal_and_priced_by_its_report(free, gpt):
    assert free.optimal and free.gap == 0.0
    assert free.chosen.rules is not None
    report = estimate(gpt, free.layout, "h100", remat=free.chosen.remat)
    assert report.step_s == pytest.approx(free.step_s, rel=1e-12)
    assert report.memory_bytes == free.memory_bytes


def test_a_limit_below_data_parallel_memory_gives_a_plan_that_fits(gpt, free):
    dp_mem = data_parallel(free).memory_bytes
    limit = dp_mem * 0.7
    plan = search(gpt, MESH, memory_limit=limit, hardware="h100", microbatches=1)
    assert plan.memory_bytes <= limit
    assert estimate(gpt, plan.layout, "h100", remat=plan.chosen.remat).memory_bytes <= limit
    assert plan.optimal
    assert not data_parallel(plan).fits


@pytest.mark.parametrize("space", ["layers", "ops"])
def test_finer_spaces_respect_the_limit_and_beat_the_rules_plan(gpt, free, space):
    limit = data_parallel(free).memory_bytes * 0.7
    # the layers and ops spaces price a step without overlap: compare with the rules space on those terms
    rules = search(gpt, MESH, memory_limit=limit, hardware="h100", overlap=0.0, microbatches=1, remat="none")
    plan = search(gpt, MESH, memory_limit=limit, hardware="h100", space=space, time_limit=20, top=1, microbatches=1,
                  remat="none")  # (top 1: the time goes to the plan checked, not to runner-ups)
    assert plan.memory_bytes <= limit
    assert plan.step_s <= rules.step_s * (1 + 1e-9)


def test_an_impossible_limit_names_the_smallest_peak(gpt):
    with pytest.raises(InfeasibleError, match=r"smallest peak memory any layout needs is [0-9.e-]+ GiB") as e:
        search(gpt, MESH, memory_limit="1KiB", hardware="h100")
    peak = e.value.min_memory
    assert peak > 1024
    plan = search(gpt, MESH, memory_limit=peak, hardware="h100", microbatches=1)  # exactly the smallest peak: fits
    assert plan.memory_bytes == pytest.approx(peak)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["data:8", "data:2,model:4", "data:4,model:2", "data:2,fsdp:2,model:2"]),
       st.sampled_from(["h100", "tpu-v3", "cpu-sim"]), st.sampled_from([None, 0.5, 0.8]))
def test_the_chosen_plan_is_never_worse_than_a_baseline_that_fits(gpt, free, mesh, hw, fraction):
    limit = None if fraction is None else data_parallel(free).memory_bytes * fraction
    try:
        plan = search(gpt, mesh, memory_limit=limit, hardware=hw, top=1, remat="none", microbatches=1)
    except InfeasibleError as e:  # then no baseline may fit either
        assert limit is not None and e.min_memory > limit
        return
    for b in plan.baselines:
        if b.plan is not None and b.plan.fits:
            assert plan.step_s <= b.plan.step_s * (1 + 1e-9), b.name


def test_baselines_are_the_textbook_layouts(gpt):
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import rules_of

    mesh = Mesh.parse(MESH)
    base = baseline_rules(gpt, mesh)
    dims = list(gpt.dims)
    text = {k: dict(rules_of(rs, 0, dims, mesh)) for k, (rs, _) in base.items()}
    assert text["data-parallel"] == {"batch": ("data", "model")}
    assert text["fsdp"]["batch"] == ("data", "model") and text["fsdp"]["d_model"] == ("data", "model")
    assert text["megatron"] == {"batch": ("data",), "vocab": ("model",), "heads": ("model",), "d_ff": ("model",)}
    assert text["mesh-tf-2d"] == text["megatron"]


def test_runner_ups_and_json(free):
    d = json.loads(json.dumps(free.to_dict()))
    assert d["solver"] and d["optimal"] is True and d["gap"] == 0.0
    assert set(d["layout"]) >= {"rules", "tensors"}
    assert d["cost"]["step_s"] == pytest.approx(free.step_s)
    assert {b["name"] for b in d["baselines"]} == {"data-parallel", "fsdp", "megatron", "mesh-tf-2d"}
    for b in d["baselines"]:
        assert set(b) >= {"name", "step_s", "memory_bytes", "fits"}
    steps = [free.step_s] + [r["step_s"] for r in d["runner_ups"]]
    assert steps == sorted(steps) and len(d["runner_ups"]) == 2


@pytest.mark.parametrize("solver", ["enumerate", "ilp-pulp", "ilp-ortools", "dp"])
def test_every_solver_gives_the_same_rules_optimum(gpt, free, solver):
    plan = search(gpt, MESH, hardware="h100", solver=solver, top=1)
    assert plan.step_s == pytest.approx(free.step_s, rel=1e-9)


def test_bad_arguments_raise_clear_errors(gpt):
    with pytest.raises(LayoutSearchError, match="unknown solver"):
        search(gpt, MESH, solver="magic")
    with pytest.raises(LayoutSearchError, match="unknown search space"):
        search(gpt, MESH, space="galaxy")
    with pytest.raises(LayoutSearchError, match="bad byte size"):
        search(gpt, MESH, memory_limit="lots")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mtf-ffn", "mtf-transformer", "moe", "mlp"])
def test_zoo_models_search_in_every_space(model):
    g = zoo.build(model)
    plans = [search(g, MESH, hardware="tpu-v3", space=s, top=1) for s in ("rules", "layers", "ops")]
    assert plans[1].step_s <= plans[0].step_s * (1 + 1e-9)
    assert plans[2].step_s <= plans[0].step_s * (1 + 1e-9)


@pytest.mark.parametrize("remat", ["none", "selective", "full", "full:1"])
def test_the_bounds_the_search_prunes_with_hold_on_every_candidate(gpt, remat):
    """The roofline (with the einsums remat runs again) and live-set bounds never exceed a candidate's priced
    step and peak, and the critical-path
    bound (compute + the collectives a step always waits for) never exceeds the overlapped step (which may
    exceed the step without overlap: a critical collective can wait behind a prefetched gather)."""
    import importlib

    import numpy as np

    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.build import build_space
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rulesets import rules_of

    s = importlib.import_module("layoutsearch.solvers.rules_search")
    g, mesh, hw = training_step(gpt), Mesh.parse(MESH), hardware("h100")
    pricer = Pricer(g, mesh, hw)
    candidates = s.rules_candidates(g, mesh, hw, pricer, None)
    rs = s.RulesSearch(g, mesh, hw, pricer, candidates, remat)
    every = np.arange(len(rs.cands))
    rs.price(every)
    assert np.all(rs.lb <= rs.cost * (1 + 1e-9)) and np.all(rs.mem_lb <= rs.mem * (1 + 1e-9))
    assert (remat == "none") == np.array_equal(rs.lb, candidates[1])  # recomputed einsums raise the bound
    sample = np.random.default_rng(0).choice(every, 12, replace=False)
    bound = build_space(g, mesh, hw, "rules", rules=rs.cands.take(sample), pricer=rs.pricer.bound(), remat=remat)
    vectors = s.strategy_values(bound.problem)[0]
    lower, peaks = rs.overlap_bounds(sample)
    assert np.array_equal(peaks, s.strategy_values(bound.problem)[1])
    assert np.array_equal(lower, vectors.max(axis=1))
    streams = {v: k for k, v in rs.pricer.streams.items()}
    for k, low, vec in zip(sample, lower, vectors, strict=True):
        rep = estimate(g, Layout(mesh, rules_of(rs.cands, int(k), rs.dims, mesh)), hw, remat=remat)
        assert rs.lb[k] <= vec[0] * (1 + 1e-9) and low <= rep.step_s * (1 + 1e-9)
        # each communicator's entry is the time of the collectives the step runs over it
        per_stream: dict[tuple, float] = {}
        for o in rep.ops:
            for c in o.collectives:
                per_stream[c.axes] = per_stream.get(c.axes, 0.0) + c.seconds
        for j in range(1, len(vec)):
            assert vec[j] == pytest.approx(per_stream.get(streams[j], 0.0), rel=1e-9, abs=1e-15)
        serial = estimate(g, Layout(mesh, rules_of(rs.cands, int(k), rs.dims, mesh)), hw, remat=remat, overlap=0.0)
        assert serial.step_s == pytest.approx(rs.cost[k], rel=1e-9)
    # the live-set bound is the largest live set at any point of the schedule (every point counted)
    from layoutsearch.costmodel.memory import lifetimes, remat_plan

    life = lifetimes(g, remat_plan(g, remat))
    for k in sample:
        layout = Layout(mesh, rules_of(rs.cands, int(k), rs.dims, mesh))
        live = np.zeros(len(g.ops))
        for row in range(len(life.tensor)):
            t = life.tensors[int(life.tensor[row])]
            if t.name not in pricer.fusion.on_chip and life.start[row] <= life.end[row]:
                live[max(0, life.start[row]):life.end[row] + 1] += layout.local_bytes(t)
        assert rs.mem_lb[k] == pytest.approx(live.max(), rel=1e-12)


def test_the_rules_space_holds_sequence_parallelism_and_hybrid_fsdp(gpt):
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import format_rules
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import rule_sets, rules_of

    g, mesh = training_step(gpt), Mesh.parse("data:2,fsdp:2,model:2")
    sets = rule_sets(g, mesh)
    texts = {format_rules(rules_of(sets, r, list(g.dims), mesh)) for r in range(len(sets))}
    assert "batch:data+fsdp,vocab:model,heads:model,d_ff:model,seq:model" in texts  # Megatron-SP
    assert "batch:data+fsdp,vocab:model,heads:model,d_ff:model,d_model:fsdp" in texts  # hybrid FSDP + TP
    assert "batch:data+fsdp,vocab:model,heads:model,d_ff:model,d_model:fsdp,seq:model" in texts


def test_decisions_say_what_each_option_costs(gpt, free):
    kinds = [(d.kind, d.option) for d in free.decisions]
    assert kinds == [("remat", "none"), ("remat", "selective"), ("remat", "full"), ("remat", "full:1")]  # 2 layers
    chosen = [d for d in free.decisions if d.chosen]
    assert len(chosen) == 1 and chosen[0].option == free.chosen.remat
    assert chosen[0].step_s == pytest.approx(free.step_s)
    assert all(d.step_s >= free.step_s * (1 - 1e-9) for d in free.decisions if d.fits)
    assert free.memory_limit == pytest.approx(80e9 - 2**30)  # h100: 80 GB HBM less the documented 1 GiB reserve


def test_a_remat_policy_no_plan_of_which_can_beat_the_best_is_proven_so_without_pricing(gpt, free):
    """With top=1, the policies after the first are searched only below its plan: their lower bounds prove
    them slower (the decision says at least how slow), and the plan is the same as with runner-ups."""
    plan = search(gpt, MESH, hardware="h100", top=1)
    assert plan.optimal and plan.step_s == pytest.approx(free.step_s, rel=1e-12)
    bounded = [d for d in plan.decisions if d.at_least_s is not None]
    assert bounded and all(not d.fits and "no plan can beat" in d.why for d in bounded)
    best = {d.option: d.step_s for d in free.decisions}
    for d in bounded:
        assert plan.step_s * (1 - 1e-9) <= d.at_least_s <= (best[d.option] or math.inf) * (1 + 1e-9)


BLOCKS = {"batch": 16, "seq": 64, "vocab": 64, "d_model": 32, "heads": 4, "layers": 4}
"""Activations dominate: at 60% of the fastest unrematerialized plan's peak, recomputing three of the four
blocks beats recomputing all of them, or all but the projections."""


@pytest.fixture(scope="module")
def blocks():
    g = zoo.build("gpt", **BLOCKS)
    free = search(g, "data:2,model:2", memory_limit=None, hardware="h100", top=1, microbatches=1, remat="none")
    return g, 0.6 * free.chosen.memory_bytes


@pytest.mark.parametrize("launches", [True, False])
def test_remat_of_the_first_blocks_is_a_decision_of_the_search(blocks, launches):
    """On the h100 preset, and on an h100 without kernel launches (kernel_latency 0), where the search also
    proves the plan optimal. With launches this tiny step is launch-bound and the rules search does not prove
    it: under remat none, the 256 plans it prices with overlap (MAX_REFINED) leave the overlap bound of the
    rest 21% below the best (issue 32: a known limit of that bound, not of the plan, which the brute force
    below checks)."""
    import dataclasses

    from layoutsearch.mesh import hardware

    g, limit = blocks
    hw = hardware("h100") if launches else dataclasses.replace(hardware("h100"), kernel_latency=0.0)
    kw = {"memory_limit": limit, "hardware": hw, "top": 1, "microbatches": 1, "baselines": False}
    plan = search(g, "data:2,model:2", **kw)
    assert plan.chosen.remat == "full:3" and plan.chosen.memory_bytes <= limit
    if launches:  # not proven: the gap reported is the bound's (see the docstring), the plan the brute force's
        assert not plan.optimal and 0 < plan.gap < 0.25
    else:
        assert plan.optimal and plan.gap == 0.0
    options = {d.option: d for d in plan.decisions}
    assert list(options) == ["none", "selective", "full", "full:1", "full:2", "full:3"]
    assert options["full"].step_s > plan.step_s and options["selective"].step_s > plan.step_s
    assert plan.step_s == pytest.approx(search(g, "data:2,model:2", remat="full:3", **kw).step_s, rel=1e-12)
    with pytest.raises(LayoutSearchError, match="searched in the rules space"):
        search(g, "data:2,model:2", remat="full:3", space="layers", **kw)
    with pytest.raises(LayoutSearchError, match="unknown remat policy 'full:-1'"):
        search(g, "data:2,model:2", remat="full:-1", **kw)


@pytest.mark.slow
def test_remat_of_the_first_blocks_plan_is_the_best_of_every_rule_set_and_policy(blocks):
    """Brute force: every rule set under every policy the search tries, priced by the cost model (about 14,000
    plans, a few minutes)."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import rule_sets, rules_of

    g, limit = blocks
    plan = search(g, "data:2,model:2", memory_limit=limit, hardware="h100", top=1, microbatches=1, baselines=False)
    mesh, tg = Mesh.parse("data:2,model:2"), training_step(g)
    sets = rule_sets(tg, mesh)
    best = math.inf
    for k in range(len(sets)):
        layout = Layout(mesh, rules_of(sets, k, list(tg.dims), mesh))
        for policy in ("none", "selective", *block_groups(4), "full"):
            rep = estimate(g, layout, "h100", remat=policy)
            if rep.memory_bytes <= limit:
                best = min(best, rep.step_s)
    assert plan.step_s == pytest.approx(best, rel=1e-12)


def test_an_impossible_limit_names_a_pipeline_only_where_one_could_help(gpt):
    with pytest.raises(InfeasibleError, match=r"a pipeline \(pipeline='auto'\)") as e:
        search(gpt, MESH, memory_limit="1KiB", hardware="h100")  # 4 pipeline units: axes of 2 and 4 can carry them
    assert e.value.options == {"pipeline": "auto"}  # remat full and accumulation were searched
    with pytest.raises(InfeasibleError) as e:
        search(gpt, MESH, memory_limit="1KiB", hardware="h100", pipeline="auto", remat="none", microbatches=1)
    assert "pipeline" not in e.value.options and "pipelines: no pipelined plan" in str(e.value)  # tried
    assert e.value.options == {"remat": "full", "microbatches": "auto"}
    with pytest.raises(InfeasibleError) as e:
        search(gpt, "data:8", memory_limit="1KiB", hardware="h100")  # 8 stages > 4 units
    assert "pipeline" not in str(e.value) and not e.value.options


def test_auto_solves_the_ops_space_with_cbc_reporting_every_phase(gpt):
    said = []
    plan = search(gpt, MESH, hardware="h100", space="ops", remat="none", microbatches=1, top=1, progress=said.append)
    assert plan.solver == "ilp-pulp" and plan.problem["nodes"] > 1
    for phase in ("rules space: enumerating rule sets", "rules space: priced", "ops space: building",
                  "ops space: solving for the best plan with ilp-pulp", "pricing the baselines"):
        assert any(m.startswith(phase) for m in said), phase


def test_phases_without_steps_report_until_they_end():
    import importlib
    import time

    s = importlib.import_module("layoutsearch.solvers.clock")
    said = []
    with s.reporting(said.append, "solving", every=0.02):
        time.sleep(0.3)
    assert said[0] == "solving" and len(said) >= 2  # (every 0.02 s over 0.3 s: at least one on a loaded machine)
    assert all(re.fullmatch(r"solving, \d+ s so far", m) for m in said[1:])
    n = len(said)
    time.sleep(0.1)
    assert len(said) == n


def test_time_limit_covers_the_whole_search_and_says_what_it_cut(gpt, free):
    plan = search(gpt, MESH, hardware="h100", space="layers", time_limit=1e-6, baselines=False)
    assert not plan.optimal and plan.gap is None
    assert any("layers space was not searched" in c for c in plan.cut_short)
    assert any(c.startswith("remat full: not searched") for c in plan.cut_short)
    assert plan.to_dict()["cut_short"] == list(plan.cut_short)
    assert free.cut_short == ()


def test_time_limit_leaves_the_baselines_their_time_or_says_which_it_cut(gpt, free):
    plan = search(gpt, MESH, hardware="h100", time_limit=1e-6)
    cut = [b for b in plan.baselines if b.plan is None and b.why == "not priced: the time limit ran out first"]
    assert cut and all(f"baseline {b.name}: not priced" in " ".join(plan.cut_short) for b in cut)
    assert all(b.plan is not None for b in free.baselines)


def test_a_deadline_keeps_its_tail_the_time_of_its_slowest_plan():
    import importlib
    import time

    clock = importlib.import_module("layoutsearch.solvers.clock")
    d = clock.Deadline.after(100.0, tail=4)
    assert not d.passed() and d.left() > 99
    d.priced(10.0)
    d.priced(2.0)  # (the slowest counts)
    assert 59 < d.left() <= 60 and not d.passed()
    d.priced(30.0)
    assert d.passed() and d.left() == 0.0 and d.final().at == d.at and not d.final().passed()
    assert d.timed(lambda x: time.sleep(0.01) or x, 7) == 7 and d.slowest == 30.0
    assert clock.Deadline().left() is None and not clock.Deadline(tail=3).passed()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True])
def test_time_limit_must_be_positive_and_finite(gpt, bad):
    with pytest.raises(LayoutSearchError, match="time limit must be a positive number of seconds"):
        search(gpt, MESH, time_limit=bad)


# -- gradient accumulation: bounds and optimality -------------------------------------------------------------------

ACCUMULATE = {"batch": 16, "seq": 64, "vocab": 64, "d_model": 32, "heads": 4, "layers": 2}
"""Activations dominate this model's memory: a limit below every unaccumulated plan's peak leaves accumulated
plans that fit."""


@pytest.fixture(scope="module")
def accumulating():
    """(model, mesh, hardware, limit, the micro-batch's candidates): the limit 3% below the smallest peak of
    any unaccumulated plan."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.baselines import baseline_sets
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch, rules_candidates

    g, mesh, hw = zoo.build("gpt", **ACCUMULATE), Mesh.of("data:2,model:2"), hardware("h100")
    full = training_step(g)
    pricer = Pricer(full, mesh, hw)
    cands = rules_candidates(full, mesh, hw, pricer, baseline_sets(baseline_rules(full, mesh)))
    limit = 0.97 * min(RulesSearch(full, mesh, hw, pricer, cands, p).min_memory()[0]
                       for p in ("none", "selective", "full"))
    return g, mesh, hw, limit, cands[0]


def _accumulated_plans(g, mesh, hw, limit, cands, M, policies, pick=None, overlap="auto"):
    """Every (rule set, remat policy) in ``pick`` (default: all) priced as an accumulated step by
    ``price_plan``, independently of the search's bounds."""
    from layoutsearch.layout import Layout
    from layoutsearch.solvers.rulesets import rules_of
    from layoutsearch.solvers.search import price_plan

    for k in range(len(cands)) if pick is None else pick:
        rules = rules_of(cands, k, list(g.dims), mesh)
        for policy in policies:
            try:
                yield k, policy, price_plan(g, Layout(mesh, rules), hw, remat=policy, microbatches=M,
                                            memory_limit=limit, overlap=overlap)
            except LayoutSearchError:
                continue


@pytest.mark.parametrize("M", [2, 4])
def test_accumulation_bounds_never_exceed_the_accumulated_step(accumulating, M):
    """M x (one micro-batch's bound vector without the optimizer, its largest entry) is a lower bound of the
    accumulated step, and a micro-batch that does not fit means the accumulated step does not: checked on
    random rule sets against ``price_plan``."""
    import numpy as np

    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch

    g, mesh, hw, limit, cands = accumulating
    micro = training_step(resized(g, {"batch": g.dims["batch"] // M}))
    pricer = Pricer(micro, mesh, hw)
    pick = np.random.default_rng(M).choice(len(cands), 60, replace=False)
    for policy in ("none", "full"):
        rs = RulesSearch(micro, mesh, hw, pricer, (cands, np.zeros(len(cands))), policy)
        rs.price(pick)
        bound = dict(zip(pick.tolist(), M * rs.overlap_bounds(pick, optimizer=False)[0], strict=True))
        for k, _, plan in _accumulated_plans(g, mesh, hw, limit, cands, M, (policy,), pick.tolist()):
            assert bound[k] <= plan.step_s * (1 + 1e-9)
            assert rs.mem[k] <= plan.memory_bytes
            assert M * rs.lb[k] <= plan.step_s * (1 + 1e-9)


def test_without_overlap_the_accumulation_bound_is_the_accumulated_step(accumulating):
    """Where no collective overlaps compute (overlap 0), the search's bound of an accumulated step is the step
    itself: M - 1 micro-batches summed over their ops without the optimizer and the once-per-step gradient
    all-reduces, plus the sum with them."""
    import numpy as np

    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch

    g, mesh, hw, limit, cands = accumulating
    M = 4
    micro = training_step(resized(g, {"batch": g.dims["batch"] // M}))
    pick = np.random.default_rng(5).choice(len(cands), 40, replace=False)
    rs = RulesSearch(micro, mesh, hw, Pricer(micro, mesh, hw), (cands, np.zeros(len(cands))), "selective")
    without = dict(zip(pick.tolist(), rs.overlap_bounds(pick, optimizer=False, serial=True)[0], strict=True))
    whole = dict(zip(pick.tolist(), rs.overlap_bounds(pick, serial=True)[0], strict=True))
    plans = list(_accumulated_plans(g, mesh, hw, None, cands, M, ("selective",), pick.tolist(), overlap=0.0))
    assert len(plans) > 20
    for k, _, plan in plans:
        assert whole[k] > without[k]  # the optimizer and the gradient all-reduce, once
        assert whole[k] + (M - 1) * without[k] == pytest.approx(plan.step_s, rel=1e-9)


@pytest.mark.slow
def test_accumulated_plan_is_the_best_of_every_rule_set_and_policy(accumulating):
    """The search's accumulated plan equals brute force: every rule set under every remat policy applied to
    every block alike priced as an accumulated step (7,000 plans, about a minute; with and without overlap)."""
    g, mesh, hw, limit, cands = accumulating
    alike = ("none", "selective", "full")  # (the block groups full:N are searched without accumulation)
    for overlap in ("auto", 0.0):  # (0: the accumulated step bounded by itself)
        plan = search(g, mesh, memory_limit=limit, hardware=hw, microbatches=2, baselines=False, top=1,
                      overlap=overlap)
        fitting = [p for _, _, p in _accumulated_plans(g, mesh, hw, limit, cands, 2, alike, overlap=overlap)
                   if p.fits]
        assert plan.optimal and plan.chosen.microbatches == 2
        assert plan.chosen.step_s == pytest.approx(min(p.step_s for p in fitting), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=3, max_size=3), min_size=1, max_size=60),
       st.integers(1, 9), st.sampled_from([1, 7, 1 << 24]))
def test_the_undominated_live_points_are_exactly_those_no_other_point_covers(rows, chunk, budget):
    """The points the live-set bound and the memory rows maximize over: the rows no other distinct row is at
    least in every column, whatever the chunking and the comparison budget."""
    import numpy as np

    from layoutsearch.solvers.assemble import undominated

    points = np.unique(np.array(rows, dtype=float), axis=0)
    want = {tuple(p) for i, p in enumerate(points)
            if not any(j != i and np.all(q >= p) for j, q in enumerate(points))}
    got = undominated(points, chunk, budget)
    assert {tuple(p) for p in points[got]} == want and len(got) == len(want) == len(set(got.tolist()))


def test_a_candidates_split_of_some_dims_is_the_product_of_the_axes_its_projection_uses(gpt):
    import numpy as np

    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import rule_sets

    g = training_step(gpt)
    mesh = Mesh.of("data:2,fsdp:2,model:2")
    cands = rule_sets(g, mesh)
    dims = list(g.dims)
    for names in [("batch",), ("batch", "d_model"), ("heads", "d_kv", "d_model"), ()]:
        mask = np.zeros(len(dims) + 1, bool)
        mask[[dims.index(d) for d in names]] = True
        proj = cands.project(mask)
        want = [np.prod([s for (_, s), c in zip(mesh.axes, row, strict=True) if c >= 0]) for row in proj]
        assert cands.split(mask, (2, 2, 2)).tolist() == want
        assert cands.split(mask, (2, 2, 2)) is cands.split(mask.copy(), (2, 2, 2))  # remembered


@pytest.mark.parametrize("mesh", ["data:4,fsdp:2,model:2,seq:2", "data:8,model:4", "pipe:2,data:4,model:2"])
def test_a_micro_batchs_candidates_are_those_enumerated_afresh(mesh):
    """:func:`rule_sets` of a graph whose dim sizes divide a remembered one's (a micro-batch: batch 16 / M,
    sequences halved) are the remembered candidates that divide them, exactly the enumeration's (rows, order)."""
    import numpy as np

    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers import rulesets

    g = zoo.build("gpt", **{**GPT, "batch": 16, "heads": 8})
    m = Mesh.of(mesh)
    rulesets._RULE_SETS.clear()
    full = rulesets.rule_sets(training_step(g), m)
    fewer = False
    for sizes in ({"batch": 8}, {"batch": 4}, {"batch": 2}, {"batch": 1}, {"batch": 8, "seq": 8, "kv_seq": 8}):
        micro = training_step(resized(g, sizes))
        got = rulesets.rule_sets(micro, m)
        fresh = rulesets._enumerated(micro, m, True, True)
        fewer = fewer or len(got) < len(full)
        assert got.choices == fresh.choices
        for a, b in ((got.primary, fresh.primary), (got.fallback, fresh.fallback),
                     (got.fallback_axes, fresh.fallback_axes)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert fewer  # (some micro-batch rules candidates out: the filter is exercised)


def test_a_micro_batch_whose_sizes_rule_out_no_rule_set_has_the_same_candidates():
    """The rules space of one micro-batch whose sizes divide as the whole batch's do is the same candidates
    (one object, what it remembered shared), equal to those found afresh."""
    import numpy as np

    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers import rules_search, rulesets
    from layoutsearch.solvers.pricer import Pricer

    g = zoo.build("gpt", **{**GPT, "batch": 16})
    mesh, hw = Mesh.of("data:2,model:4"), hardware("h100")
    full, micro = training_step(g), training_step(resized(g, {"batch": 8}))
    first = rules_search.rules_candidates(full, mesh, hw, Pricer(full, mesh, hw), None)[0]
    again, lb = rules_search.rules_candidates(micro, mesh, hw, Pricer(micro, mesh, hw), None)
    assert again is first
    rulesets._RULE_SETS.clear()
    rules_search._CANDIDATES.clear()
    fresh, fresh_lb = rules_search.rules_candidates(micro, mesh, hw, Pricer(micro, mesh, hw), None)
    assert fresh is not first and np.array_equal(fresh.primary, first.primary)
    assert np.array_equal(fresh.fallback, first.fallback) and np.array_equal(fresh_lb, lb)


@pytest.mark.parametrize("mesh", ["data:2,model:4", "data:4,fsdp:2,model:2", "data:2,fsdp:2,seq:2,model:2"])
def test_a_micro_batch_whose_sizes_rule_out_rule_sets_has_the_whole_batchs_others(mesh):
    """The rules space of a micro-batch whose sizes rule out some rule sets (batch 16 / M over 4-16 devices)
    is the whole batch's candidates that divide its sizes: those found afresh (rows, order, the roofline
    bounds, the memory bound's columns), the splits they remember taken along."""
    import numpy as np

    from layoutsearch.costmodel.step import resized, training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers import rules_search, rulesets
    from layoutsearch.solvers.baselines import baseline_rules, baseline_sets
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch

    g = zoo.build("gpt", **{**GPT, "batch": 16})
    m, hw = Mesh.of(mesh), hardware("tpu-v4")
    full = training_step(g)

    def found(graph):
        pricer = Pricer(graph, m, hw)
        cands = rules_search.rules_candidates(graph, m, hw, pricer, baseline_sets(baseline_rules(graph, m)))
        return cands, RulesSearch(graph, m, hw, pricer, cands, "full").mem_lb

    ruled_out = False
    for M in (2, 4, 8, 16):
        rulesets._RULE_SETS.clear()
        rules_search._CANDIDATES.clear()
        whole = found(full)[0][0]
        micro = training_step(resized(g, {"batch": 16 // M}))
        (got, lb), mem = found(micro)
        rulesets._RULE_SETS.clear()
        rules_search._CANDIDATES.clear()
        (fresh, fresh_lb), fresh_mem = found(micro)
        ruled_out = ruled_out or len(got) < len(whole)
        for a, b in ((got.primary, fresh.primary), (got.fallback, fresh.fallback),
                     (got.fallback_axes, fresh.fallback_axes), (lb, fresh_lb), (mem, fresh_mem)):
            assert a.shape == b.shape and np.array_equal(a, b), (mesh, M)
    assert ruled_out


def test_a_candidates_axis_maps_are_what_its_layout_gives_every_tensor_and_op(gpt):
    """:meth:`RuleSets.project` (one mask, and every mask at once where :meth:`RuleSets.distinct` records them)
    gives each mesh axis the dim the candidate's rules split over it (Flax precedence, fallbacks included)."""
    import numpy as np

    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import RuleSets, rule_sets, rules_of

    g = training_step(gpt)
    mesh = Mesh.of("data:2,fsdp:2,model:2")
    dims = list(g.dims)
    sets = rule_sets(g, mesh)
    plain = RuleSets(sets.choices, sets.primary, sets.fallback, sets.fallback_axes)
    first = sets.distinct(g)
    kept = sets.take(first)  # (projections read from the table distinct made)
    spaces = sorted({t.dim_names for t in g.tensors.values()} | {op.iteration_dims(g.tensors) for op in g.ops})
    sample = np.random.default_rng(0).choice(len(kept), 40, replace=False)
    for names in spaces:
        mask = np.isin(np.arange(len(dims)), [dims.index(d) for d in names])
        fresh, recorded = plain.project(mask), kept.project(mask)
        assert fresh.dtype == recorded.dtype == np.int32 and np.array_equal(fresh[first], recorded)
        for k in sample.tolist():
            laid = Layout(mesh, rules_of(kept, k, dims, mesh)).rules_layout(names)
            want = [next((dims.index(d) for d, axes in laid.items() if a in axes), -1) for a in mesh.names]
            assert recorded[k].tolist() == want


def test_the_live_set_bound_tells_which_candidates_exceed_a_limit_as_their_bounds_do():
    """:meth:`LiveBound.over` decides most columns by cheaper bounds, the rest by their bound: the same answer
    as the bounds themselves, also for bounds equal to the threshold; :meth:`LiveBound.values` of some
    candidates are theirs of all."""
    import numpy as np

    from layoutsearch.solvers.rules_search import LiveBound

    rng = np.random.default_rng(1)
    live = np.sort(rng.integers(0, 1 << 20, (40, 5)).astype(float), axis=0)[::-1]
    inv = 1.0 / rng.choice([1.0, 2.0, 4.0, 8.0], (5, 300))
    of = rng.integers(0, 300, 1000)
    every = LiveBound(live, inv, of).values()
    for threshold in (*np.quantile(every, [0.0, 0.1, 0.5, 0.9, 1.0]), every[17], -1.0):
        bound = LiveBound(live, inv, of)
        assert np.array_equal(bound.over(threshold), every > threshold)
        assert bound.over(threshold) is bound.over(threshold)  # remembered
    idx = rng.choice(len(of), 50)
    assert np.array_equal(LiveBound(live, inv, of).values(idx), every[idx])


@pytest.mark.parametrize("hw, remat", [("tpu-v4", "none"), ("tpu-v4", "selective"), ("h100", "none")])
def test_the_overlap_bound_is_a_lower_bound_of_every_candidates_step(hw, remat):
    """What the rules search proves its plans with, the largest entry of a candidate's bound vector
    (``RulesSearch.overlap_bounds``), never exceeds the step the cost model's overlap schedule gives it, for
    a sample of every layout of a 3-axis mesh: on TPU (collective matmuls: an all-gather of a matmul's operand
    runs beside it, so it is not critical; counted as critical, the bound had excluded GPT-3 175B's best plan
    on tpu-v4) and on a GPU."""
    import numpy as np

    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch, costed_rules, rules_candidates
    from layoutsearch.solvers.rulesets import rules_of

    g = training_step(zoo.build("gpt", layers=2, d_model=256, heads=8, seq=256, batch=32, vocab=512), "adam",
                      "mixed")
    mesh, hwo = Mesh.of("data:2,fsdp:2,model:2"), hardware(hw)
    pricer = Pricer(g, mesh, hwo)
    rs = RulesSearch(g, mesh, hwo, pricer, rules_candidates(g, mesh, hwo, pricer, None), remat)
    idx = np.random.default_rng(0).choice(len(rs.cands), 120, replace=False)
    bounds, _ = rs.overlap_bounds(idx)
    for i, bound in zip(idx, bounds, strict=True):
        plan = costed_rules("", g, mesh, hwo, rules_of(rs.cands, i, list(g.dims), mesh), None, "adam", remat)
        assert bound <= plan.step_s * (1 + 1e-9), (plan.rules_text(), bound, plan.step_s)


def test_a_matmul_holds_the_compute_stream_while_its_decomposed_collectives_run(monkeypatch):
    """On TPU (collective matmuls) a matmul ends when its compute and its decomposed collectives (the
    all-gather of its activation operand, the reduce-scatter of its result: ring steps beside the partial
    products) both have: the bound's compute entry counts the longer, so it rises for layouts with tensor or
    sequence parallelism (GPT-3 175B with model+seq on 8,192 v5p: 1.48 s without it, 2.02 s with it, step
    2.02 s; six plans that could not make the top 3 were priced with overlap), and stays a lower bound of
    each step."""
    import numpy as np

    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import RulesSearch, costed_rules, rules_candidates
    from layoutsearch.solvers.rulesets import rules_of

    g = training_step(zoo.build("gpt", layers=2, d_model=256, heads=8, seq=256, batch=32, vocab=512), "adam",
                      "mixed")
    mesh, hw = Mesh.of("data:2,model:2,seq:2"), hardware("tpu-v5p")

    def bounds(held: bool) -> tuple[RulesSearch, np.ndarray]:
        pricer = Pricer(g, mesh, hw)
        if not held:
            monkeypatch.setattr(pricer, "decomposed", lambda *a, **k: {})
        rs = RulesSearch(g, mesh, hw, pricer, rules_candidates(g, mesh, hw, pricer, None))
        return rs, rs.overlap_bounds(np.arange(len(rs.cands)))[0]

    rs, tight = bounds(True)
    _, loose = bounds(False)
    assert (tight >= loose * (1 - 1e-12)).all() and (tight > loose * 1.01).sum() >= 10
    risen = np.flatnonzero(tight > loose * 1.01)
    for i in risen[np.argsort(tight[risen] - loose[risen])][-12:]:  # the largest rises
        plan = costed_rules("", g, mesh, hw, rules_of(rs.cands, int(i), list(g.dims), mesh), None, "adam")
        assert tight[i] <= plan.step_s * (1 + 1e-9), (plan.rules_text(), tight[i], plan.step_s)


@pytest.mark.parametrize("hw, limit", [("tpu-v4", 3e6), ("h100", None)])
def test_the_top_plans_are_the_fastest_of_every_candidate_priced(hw, limit):
    """The rules search (candidates bounded in roofline order, priced with overlap in bound order) returns the
    3 fastest fitting plans of all, as pricing every one of the 1,882 candidates with the cost model finds
    them: on TPU (collective matmuls: matmuls held by their ring steps) with a memory limit that rules out
    candidates, and on a GPU."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import costed_rules, rules_candidates
    from layoutsearch.solvers.rulesets import rules_of

    g = zoo.build("gpt", batch=16, seq=32, vocab=256, d_model=128, heads=4, layers=1)
    mesh, hwo = Mesh.of("data:2,model:4"), hardware(hw)
    plan = search(g, mesh, limit, hardware=hw, remat="none", microbatches=1, baselines=False)
    train = training_step(g)
    cands, _ = rules_candidates(train, mesh, hwo, Pricer(train, mesh, hwo), None)
    every = [costed_rules("", train, mesh, hwo, rules_of(cands, k, list(train.dims), mesh), limit, "adam")
             for k in range(len(cands))]
    fitting = sorted((c.step_s for c in every if limit is None or c.memory_bytes <= limit * (1 + 1e-12)))
    assert len(fitting) < len(every) or limit is None
    found = [plan.chosen.step_s, *(r.step_s for r in plan.runner_ups)]
    assert found == pytest.approx(fitting[:3], rel=1e-12) and plan.optimal


def test_every_candidate_and_runner_up_is_a_distinct_layout():
    """The rules space held the same layout twice (a fallback on axes splitting nothing else is that dim's
    primary choice on them): runner-ups came in identical pairs. Now one candidate per layout, checked against
    the layouts :class:`Layout` gives every tensor and op."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Mesh
    from layoutsearch.solvers.rulesets import rule_sets, rules_of

    g = training_step(zoo.gpt(batch=32))
    mesh = Mesh.parse("data:2,model:4")
    sets = rule_sets(g, mesh)
    kept = sets.take(sets.distinct(g))
    assert len(kept) < len(sets)

    def layout(s, k):
        lay = Layout(mesh, rules_of(s, k, list(g.dims), mesh))
        return (tuple(str(lay.spec(t)) for t in g.tensors.values())
                + tuple(str(lay.rules_layout(op.iteration_dims(g.tensors))) for op in g.ops))

    seen = {layout(kept, k) for k in range(len(kept))}
    assert len(seen) == len(kept)  # no two candidates kept are one layout
    assert {layout(sets, k) for k in range(len(sets))} == seen  # and every layout is kept
    plan = search(zoo.gpt(batch=32), mesh, hardware="h100", top=5)
    options = [(c.rules, c.remat, c.microbatches) for c in (plan.chosen, *plan.runner_ups)]
    assert len(set(options)) == len(options) == 5


def test_layouts_that_only_rename_interchangeable_axes_are_one_candidate(monkeypatch):
    """On ``data:16,fsdp:8,model:8`` (one TPU slice: fsdp and model alike) the runner-up of GPT-3 was the chosen
    plan with fsdp and model swapped, priced again for nothing. The rules space now keeps one layout per class
    of such twins: the same best plan, runner-ups that are other plans, and each candidate dropped is the twin
    of one kept, at the same price."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout, parse_rules
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers import rules_search
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rulesets import interchangeable_axes, rules_of

    mesh, hw = Mesh.parse("data:2,fsdp:2,model:2"), hardware("h100")  # one node: every axis on NVLink
    assert interchangeable_axes(mesh, hw) == [[0, 1, 2]]
    # data:4 spans two nodes of 8: only fsdp and model alike
    assert interchangeable_axes(Mesh.parse("data:4,fsdp:2,model:2"), hw) == [[1, 2]]
    assert not interchangeable_axes(Mesh.parse("data:2,model:2"), hardware("h100").replace(devices_per_node=2))

    g = training_step(zoo.gpt(batch=32))
    base = baseline_sets(baseline_rules(g, mesh))
    kept, _ = rules_search.rules_candidates(g, mesh, hw, Pricer(g, mesh, hw), base)
    with monkeypatch.context() as m:
        m.setattr(rules_search, "interchangeable_axes", lambda mesh, hw: [])
        every, _ = rules_search.rules_candidates(g, mesh, hw, Pricer(g, mesh, hw), base)
        plain = search(zoo.gpt(batch=32), mesh, hardware=hw, top=3)
    assert len(kept) < len(every)
    dims, perms = list(g.dims), list(itertools.permutations(range(3)))
    spaces = sorted({t.dim_names for t in g.tensors.values()} | {op.iteration_dims(g.tensors) for op in g.ops})

    def layout(rules, perm=(0, 1, 2)):  # what the rules give every tensor and op, axes relabelled by ``perm``
        names = [mesh.names[i] for i in perm]
        lay = Layout(mesh, [(d, tuple(names[mesh.names.index(a)] for a in axes)) for d, axes in rules])
        return tuple(tuple(sorted(lay.rules_layout(sp).items())) for sp in spaces)

    ours = {layout(rules_of(kept, k, dims, mesh)): k for k in range(len(kept))}
    for k in range(0, len(every), len(every) // 12):  # a sample of the full space: each has a twin kept, at its price
        rules = rules_of(every, k, dims, mesh)
        twin = next((ours[layout(rules, p)] for p in perms if layout(rules, p) in ours), None)
        assert twin is not None, rules
        assert estimate(g, Layout(mesh, rules_of(kept, twin, dims, mesh)), hw).step_s == pytest.approx(
            estimate(g, Layout(mesh, rules), hw).step_s, rel=1e-12)
    # relabelling data and fsdp in batch:data+fsdp+model gives batch:fsdp+data+model, another layout: so
    # d_model:fsdp+model beside it has no twin d_model:data+model (Llama 3 70B on data:8,fsdp:8,model:8 lost its
    # best plan, 0.03% faster, to that mistake)
    for d_model in ("fsdp+model", "data+model", "data+fsdp"):
        assert layout(parse_rules(f"batch:data+fsdp+model,d_model:{d_model}")) in ours, d_model

    plan = search(zoo.gpt(batch=32), mesh, hardware=hw, top=3)
    assert plan.chosen.rules == plain.chosen.rules and plan.chosen.step_s == plain.chosen.step_s

    def renamed(plans):  # each plan as the set of its relabellings
        return [frozenset((layout(p.rules, q), p.remat, p.microbatches) for q in perms) for p in plans]

    options = renamed((plan.chosen, *plan.runner_ups))
    assert len(set(options)) == len(options)  # no plan is another one renamed
    before = renamed((plain.chosen, *plain.runner_ups))
    assert len(set(before)) < len(before)  # (as it was: a renamed copy among the runner-ups)


def test_the_baselines_rule_sets_stay_among_the_candidates():
    """The baselines are found among the rules space's candidates by their encoding (pipeline stage layouts,
    ``first_fitting``): one that has an enumerated twin (the same layout) must be the one kept."""
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.pricer import Pricer
    from layoutsearch.solvers.rules_search import rules_candidates

    for model, mesh in (("mtf-ffn", "fsdp:2,model:2"), ("mlp", "data:2,model:4"), ("gpt", "data:2,model:4")):
        g, m = training_step(zoo.build(model)), Mesh.parse(mesh)
        cands, _ = rules_candidates(g, m, hardware("h100"), Pricer(g, m, hardware("h100")),
                                    baseline_sets(baseline_rules(g, m)))
        for name, (rs, _) in baseline_rules(g, m).items():
            if rs is not None:
                assert cands.index(rs) is not None, (model, mesh, name)
