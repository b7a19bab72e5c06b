"""Joint search of pipelined plans (stage axis, K, M, remat, inner layout)."""

import pytest

from layoutsearch import zoo
from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers.pipeline_search import microbatch_candidates, search_pipeline
from layoutsearch.solvers.search import InfeasibleError, search

# Activation-heavy: long sequences, few parameters, so remat in a pipeline saves what no layout can.
GPT = zoo.build("gpt", layers=4, batch=16, seq=256, d_model=128, heads=4, vocab=64, tie_embeddings=0)
MESH = "pipe:4,data:2"


def test_microbatch_candidates_divide_the_batch_up_to_4k():
    assert microbatch_candidates(16, 2) == [1, 2, 4, 8]
    assert microbatch_candidates(12, 4) == [1, 2, 3, 4, 6, 12]


def test_a_stage_axis_whose_pipelined_mesh_is_another_renamed_is_not_searched_again():
    """On ``pipe:2,data:2,model:2`` inside one node every axis is alike: stages over ``data`` or ``model`` give
    ``pipe``'s plans renamed (the pipelined mesh, stage axis first, has the same sizes and links position by
    position), so only ``pipe`` is searched; searched alone, either finds a plan of the same step time."""
    from layoutsearch.solvers.pipeline_search import STAGE_AXES

    mesh = "pipe:2,data:2,model:2"
    plan = search_pipeline(GPT, mesh, hardware="h100")
    assert {c.stage_axis for c in plan.candidates} == {"pipe"}
    for axis in ("data", "model"):
        token = STAGE_AXES.set((axis,))
        try:
            alone = search_pipeline(GPT, mesh, hardware="h100")
        finally:
            STAGE_AXES.reset(token)
        assert {c.stage_axis for c in alone.candidates} == {axis}
        assert alone.step_s == pytest.approx(plan.step_s, rel=1e-12)
    # links follow the position in the pipelined mesh, unless pinned to an axis: then model differs
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.pipeline_search import _untwinned_stage_axes

    m, axes = Mesh.parse(mesh), ["pipe", "data", "model"]
    assert _untwinned_stage_axes(m, hardware("h100").replace(devices_per_node=4), axes) == ["pipe"]
    assert _untwinned_stage_axes(m, hardware("h100").replace(axis_links={"model": "slow"}), axes) == ["pipe", "model"]
    assert _untwinned_stage_axes(Mesh.parse("pipe:2,data:4"), hardware("h100"), ["pipe", "data"]) == ["pipe", "data"]


def test_a_limit_only_a_pipeline_meets_gets_a_pipelined_plan():
    with pytest.raises(InfeasibleError) as info:
        search(GPT, MESH, memory_limit=1, hardware="h100", remat="none")
    smallest = info.value.min_memory  # the least any non-pipelined layout needs without remat
    limit = 0.8 * smallest
    with pytest.raises(InfeasibleError, match="what could help: .*remat full.*gradient accumulation.*pipeline"):
        search(GPT, MESH, memory_limit=limit, hardware="h100", microbatches=1, remat="none")
    plan = search_pipeline(GPT, MESH, limit, hardware="h100")
    assert plan.memory_bytes <= limit
    assert plan.report.remat in ("selective", "full")  # without recomputation nothing fits
    best = min(c.step_s for c in plan.candidates if c.fits)
    assert plan.step_s == best
    # stages over data (K=2) were ruled out by their bounds or priced: searched alone, none is faster
    over_data = search_pipeline(GPT, MESH, limit, hardware="h100", stages=2)
    assert {c.stage_axis for c in over_data.candidates} == {"data"}
    assert over_data.step_s >= plan.step_s * (1 - 1e-9)
    joint = search(GPT, MESH, memory_limit=limit, hardware="h100", pipeline="auto")
    assert joint.memory_bytes <= limit
    assert joint.step_s <= plan.step_s * (1 + 1e-9)  # the pipelined plan is one of the options
    assert not next(d for d in joint.decisions if d.kind == "remat" and d.option == "none").fits


def test_fixed_stage_count_and_microbatches_are_honoured():
    plan = search_pipeline(GPT, MESH, hardware="h100", stages=4, microbatches=8)
    assert plan.report.stage_axis == "pipe" and plan.report.num_stages == 4 and plan.report.microbatches == 8
    assert all(c.microbatches == 8 and c.stages == 4 for c in plan.candidates)


def test_impossible_pipeline_requests_are_explained():
    with pytest.raises(LayoutSearchError, match="can carry 3 pipeline stages"):
        search_pipeline(GPT, MESH, hardware="h100", stages=3)
    with pytest.raises(LayoutSearchError, match="no pipelined plan"):
        search_pipeline(GPT, MESH, 1e3, hardware="h100", stages=4)


SIZES = ["--set", "layers=4", "--set", "batch=16", "--set", "seq=256", "--set", "d_model=128", "--set", "vocab=64",
         "--set", "tie_embeddings=0"]


def test_search_command_with_pipeline_auto_shows_stages_bubble_and_gantt(capsys):
    from clirun import run, run_json

    d = run_json(capsys, "search", "gpt", *SIZES, "--mesh", MESH, "--hardware", "h100", "--pipeline", "auto")
    piped = next(x for x in d["decisions"] if x["kind"] == "pipeline")
    others = [x["step_s"] for x in d["decisions"] if x["kind"] != "pipeline" and x["fits"]]
    assert piped["fits"] and piped["chosen"] == (piped["step_s"] < min(others))
    assert piped["chosen"] == (d["stage_axis"] is not None)
    code, out, _ = run(capsys, "search", "gpt", *SIZES, "--mesh", MESH, "--hardware", "h100", "--pipeline", "4",
                       "--microbatches", "8")
    assert code == 0 and "4 pipeline stages over 'pipe', schedule 1f1b, 8 micro-batches" in out and "27.3%" in out
    assert "1F1B schedule" in out


def test_search_command_falls_back_to_accumulation_or_a_pipeline_when_nothing_else_fits(capsys):
    from clirun import run_json

    with pytest.raises(InfeasibleError) as info:
        search(GPT, MESH, memory_limit=1, hardware="h100")
    limit = str(int(0.9 * info.value.min_memory))  # below the smallest peak of any unaccumulated plan
    d = run_json(capsys, "search", "gpt", *SIZES, "--mesh", MESH, "--hardware", "h100", "--memory-limit", limit,
                 "--pipeline", "auto")
    assert d["fits"] and d["memory_bytes"] <= int(limit) and (d["stage_axis"] or d["microbatches"] > 1)
    assert not any(x["fits"] for x in d["decisions"] if x["kind"] == "remat")
    assert sum(x["chosen"] for x in d["decisions"]) == 1


def test_bad_pipeline_flags_are_one_line_errors(capsys):
    from clirun import run

    code, out, err = run(capsys, "search", "gpt", "--mesh", MESH, "--pipeline", "many")
    assert code == 2 and not out and "--pipeline takes a positive integer or 'auto'" in err


HARDWARE = ["h100", "tpu-v5p", "cpu-sim"]  # asynchronous collectives; with collective matmuls; all in line


@pytest.mark.parametrize("hw", HARDWARE)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved:2"])
def test_the_loop_bound_that_prunes_pipelines_holds_for_every_remat_policy(schedule, hw):
    """The bounds the search skips a (layout, M, remat) with, computed on the step without remat, never exceed
    the priced pipelined step: without remat's under any policy (recomputation only adds work), a policy's
    (its recomputations added) under that policy."""
    from layoutsearch.costmodel.pipeline import microbatch_step
    from layoutsearch.layout import Layout
    from layoutsearch.solvers.pipeline_search import _loop_bound, choose_stages

    stage, inner = ("data", "pipe") if schedule.startswith("interleaved") else ("pipe", "data")  # 6 units
    for rules, M in (("batch:{}", 4), ("d_ff:{},heads:{}", 8), ("", 2)):
        layout = Layout.from_rules(MESH, rules.format(inner, inner))
        steps = {r: microbatch_step(GPT, layout, hw, stage_axis=stage, microbatches=M, schedule=schedule,
                                    remat=r) for r in ("none", "selective", "full")}
        bound = _loop_bound(steps["none"])
        for r, step in steps.items():
            priced = step.report(*choose_stages(step)).step_s
            assert 0 < bound <= priced * (1 + 1e-9), (rules, M, r)
            # the bound of a policy from the step without remat: its recomputations replayed, no more
            own = _loop_bound(steps["none"], r)
            assert bound <= own <= priced * (1 + 1e-9) and own == pytest.approx(_loop_bound(step), rel=1e-9)
        assert _loop_bound(steps["none"], "full") > _loop_bound(steps["none"], "selective") > bound


@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved:2"])
def test_the_roofline_bound_of_an_inner_layout_holds_for_every_micro_batch_count(schedule, hw_name):
    """steps(K, M) / M x a K-th of the inner layout's full-batch bound (what the search skips configurations
    with before pricing them: the roofline bound, or with something to beat the sharper bound of its compute
    and critical collectives or a communicator's collectives) never exceeds the priced pipelined step."""
    from layoutsearch.costmodel.pipeline import microbatch_step
    from layoutsearch.costmodel.schedule import Schedule
    from layoutsearch.costmodel.step import training_step
    from layoutsearch.layout import Layout
    from layoutsearch.mesh import Mesh, hardware
    from layoutsearch.solvers.clock import Deadline
    from layoutsearch.solvers.pipeline_search import _inner_space, _stage_layouts, choose_stages

    stage, K = ("data", 2) if schedule.startswith("interleaved") else ("pipe", 4)
    inner_mesh = Mesh(tuple((a, s) for a, s in Mesh.parse(MESH).axes if a != stage))
    trained, hw = training_step(GPT), hardware(hw_name)
    inner = _inner_space(trained, inner_mesh, hw, "auto")
    rooflines = dict(_stage_layouts(inner, trained, inner_mesh, Deadline()))
    # something to beat (however large): the sharper bound
    layouts = _stage_layouts(inner, trained, inner_mesh, Deadline(), beat=1e30, loop=lambda split: 1.0)
    assert len(layouts) >= 2 and {r for r, _ in layouts} == set(rooflines)
    assert all(b >= rooflines[r] for r, b in layouts) and any(b > 1.05 * rooflines[r] for r, b in layouts)
    # with no collective overlapping compute (overlap 0): the serial step's sum, sharper still
    serial = dict(_stage_layouts(inner, trained, inner_mesh, Deadline(), beat=1e30, loop=lambda split: 1.0,
                                 serial=True))
    assert all(serial[r] >= b * (1 - 1e-9) for r, b in layouts)
    if hw.async_collectives:
        assert any(serial[r] > b for r, b in layouts)
    else:  # every collective in line: the compute stream's entry is the serial sum (once-per-step work left out)
        assert all(serial[r] == pytest.approx(b, rel=1e-12) for r, b in layouts)
    for overlap, bounds in (("auto", layouts), (0, serial.items())):
        for rules, bound in bounds:
            layout = Layout(Mesh.parse(f"{stage}:{K}," + ",".join(f"{a}:{s}" for a, s in inner_mesh.axes)), rules)
            for M in (2, 8):
                for remat in ("none", "full"):
                    try:
                        step = microbatch_step(GPT, layout, hw, stage_axis=stage, microbatches=M, schedule=schedule,
                                               remat=remat, overlap=overlap)
                    except LayoutSearchError:
                        continue  # micro-batches this layout cannot split
                    priced = step.report(*choose_stages(step)).step_s
                    assert bound / K * Schedule.parse(schedule).steps(K, M) / M <= priced * (1 + 1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_stages_are_the_fastest_split_that_fits_with_each_stages_own_micro_batches(schedule):
    """The stage split (``choose_stages``) against every split of the units into K contiguous stages, each
    priced by the pipeline report: the one it picks fits the limit, and no split that fits has a slower
    slowest stage (the cost DAG's loads: unit times plus the transfers across the stage's cuts). Under 1F1B the
    last stages hold fewer micro-batches (K - k), so at a limit the first stage's count would rule every split
    out, some fit; below every split, the error names the smallest largest-stage memory."""
    import itertools

    from layoutsearch.costmodel.pipeline import microbatch_step
    from layoutsearch.errors import PartitionError
    from layoutsearch.layout import Layout
    from layoutsearch.solvers.pipeline_search import choose_stages

    g = zoo.build("gpt", layers=6, batch=8, seq=256, d_model=128, heads=4, vocab=64, tie_embeddings=0)
    K = 3
    step = microbatch_step(g, Layout.from_rules(f"pipe:{K},data:2", "batch:data"), "h100", stage_axis="pipe",
                           microbatches=4, schedule=schedule)
    dag = step.costdag()
    names = [n.name for n in dag.nodes]
    into = {e.dst: e.transfer_s for e in dag.edges}

    def load(group):
        edges = [into.get(group[0], 0.0)] + [into.get(names[names.index(group[-1]) + 1], 0.0)
                                             if group[-1] != names[-1] else 0.0]
        return sum(dag.nodes[names.index(u)].compute_s for u in group) + sum(edges)

    splits = []
    for cuts in itertools.combinations(range(1, len(names)), K - 1):
        groups = [tuple(names[a:b]) for a, b in zip((0, *cuts), (*cuts, len(names)), strict=True)]
        rep = step.report(groups)
        splits.append((max(load(gr) for gr in groups), max(s.memory_bytes for s in rep.stages),
                       [s.memory_bytes for s in rep.stages], groups))
    fastest = min(splits)
    least = min(m for _, m, _, _ in splits)
    limit = (least + fastest[1]) / 2  # the fastest split does not fit, the leanest does
    groups, method, optimal = choose_stages(step, limit)
    chosen = step.report(groups, method, optimal)
    assert optimal and chosen.memory_bytes <= limit and chosen.num_stages == K
    fitting = [s for s in splits if s[1] <= limit]
    assert max(load(gr) for gr in groups) == pytest.approx(min(s[0] for s in fitting), rel=1e-12)
    if schedule == "1f1b":  # with every stage holding the first stage's K micro-batches, none would fit
        def as_first(groups, mems):
            return max(m + k * sum(step.priced.units[u].saved for u in gr)  # stage k holds K - k, k short of K
                       for k, (m, gr) in enumerate(zip(mems, groups, strict=True)))
        assert all(as_first(gr, mem) > limit for _, _, mem, gr in fitting)
    with pytest.raises(PartitionError, match=f"smallest achievable largest-stage memory is {int(least)} B"):
        choose_stages(step, least - 1)


def test_interleaved_stages_that_leave_a_device_over_the_limit_are_split_again_within_it():
    """Interleaved chunks: the partitioner holds each chunk to the whole limit, while a device runs V of them;
    when its split leaves a device over the limit, the chunks are split again with each held to limit / V
    (every device then fits) if such a split exists, else the partitioner's split is returned. The limits
    come from the priced memory of every split of a 6-layer GPT into 2 x 2 chunks (points within each gap
    between two distinct device peaks), not from a figure that holds under one version of the step times:
    at least one of them must leave the partitioner's split over the limit and be split again within it."""
    import itertools
    import math

    from layoutsearch.costmodel.pipeline import microbatch_step
    from layoutsearch.layout import Layout
    from layoutsearch.solvers.partition import partition
    from layoutsearch.solvers.pipeline_search import choose_stages

    g = zoo.build("gpt", layers=6, batch=8, seq=256, d_model=128, heads=4, vocab=64, tie_embeddings=0)
    step = microbatch_step(g, Layout.from_rules("pipe:2,data:2", "batch:data"), "h100", stage_axis="pipe",
                           microbatches=4, schedule="interleaved:2")
    names = list(step.units)
    peaks = sorted({step.report([names[a:b] for a, b in zip((0, *cuts), (*cuts, len(names)), strict=True)]
                                ).memory_bytes for cuts in itertools.combinations(range(1, len(names)), 3)})
    assert len(peaks) >= 2
    limits = [lo + f * (hi - lo) for lo, hi in itertools.pairwise(peaks) for f in (0.05, 0.25, 0.5, 0.75, 0.95)]
    over, recovered = 0, 0
    for limit in limits:
        held_whole = partition(step.costdag(), 4, objective="throughput", microbatches=math.ceil(step.in_flight),
                               memory_limit=limit)  # every chunk held to the whole limit
        if step.report(held_whole.stages).memory_bytes <= limit:
            continue  # the premise does not hold at this limit
        over += 1  # a device over the limit: split again with every chunk held to limit / 2, if possible
        groups, method, optimal = choose_stages(step, limit)
        if method == "chain dp (limit / 2 per chunk)":
            assert step.report(groups).memory_bytes <= limit and not optimal
            recovered += 1
        else:  # no split holds every chunk to limit / 2: the partitioner's split, as it was
            assert groups == tuple(tuple(s) for s in held_whole.stages)
    assert over and recovered, (peaks, over, recovered)
