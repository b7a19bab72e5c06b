"""Plan pictures: step time vs devices per strategy, the pipeline schedule (matplotlib)."""

import pytest

import layoutsearch as ls

pytest.importorskip("matplotlib")

from layoutsearch.plots import plot_plan, scaling  # noqa: E402

G = ls.zoo.gpt(layers=2, d_model=128, heads=4, seq=32, batch=16, vocab=256)


def test_scaling_prices_each_strategy_as_the_data_axis_grows():
    plan = ls.search(G, "data:4,model:2", hardware="h100", remat="none")
    axis, devices, times, fits = scaling(plan)
    assert axis == "data" and devices == [2, 4, 8]
    assert fits["chosen"][-1] is True and set(fits) == set(times)
    assert set(times) == {"chosen"} | {b.name for b in plan.baselines if b.plan is not None}
    assert times["chosen"][-1] == pytest.approx(plan.step_s)  # the full mesh is the plan itself
    dp = next(b.plan for b in plan.baselines if b.name == "data-parallel")
    assert times["data-parallel"][-1] == pytest.approx(dp.step_s)


def test_plot_files(tmp_path):
    plan = ls.search(G, "stage:2,data:2,model:2", hardware="h100", pipeline=2, microbatches=4, remat="none")
    assert plan.chosen.pipelined
    path = tmp_path / "plan.png"
    plot_plan(plan, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ls.LayoutSearchError, match="cannot write plot"):
        plot_plan(plan, tmp_path / "missing" / "plan.png")


def test_strategies_that_do_not_fit_and_lines_that_coincide_are_drawn_as_such(tmp_path):
    from layoutsearch.plots import _same_lines, _title

    plan = ls.search(G, "data:4,model:2", hardware="h100", remat="none", memory_limit="2MiB")
    axis, devices, times, fits = scaling(plan)
    assert fits["chosen"][-1] is True  # the plan fits the search's limit at its own mesh ...
    assert not all(f for fs in fits.values() for f in fs)  # ... and some point of some strategy does not
    groups = _same_lines({"a": [1.0, 2.0], "b": [1.0, 2.0], "c": [1.0, None]})
    assert groups == [["a", "b"], ["c"]]
    assert _title(ls.search(ls.zoo.build("gpt", preset="gpt3-small", layers=1, batch=8, seq=64), "data:8",
                            hardware="h100", top=1)) == "gpt (gpt3-small)"
    plot_plan(plan, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_long_pipeline_schedule_is_drawn_with_its_legend(tmp_path):
    g = ls.zoo.gpt(layers=4, d_model=128, heads=4, seq=32, batch=64, vocab=256)
    plan = ls.search(g, "stage:4,data:2", hardware="h100", pipeline=4, microbatches=16, remat="none", top=1)
    assert plan.chosen.microbatches == 16
    plot_plan(plan, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 20_000
