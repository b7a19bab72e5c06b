"""Plan pictures: step time vs devices per strategy, the pipeline schedule (matplotlib)."""

import pytest

import layoutsearch as ls

pytest.importorskip("matplotlib")

from layoutsearch.plots import plot_plan, scaling  # noqa: E402

G = ls.zoo.gpt(layers=2, d_model=128, heads=4, seq=32, batch=16, vocab=256)


def test_scaling_prices_each_strategy_as_the_data_axis_grows():
    plan = ls.search(G, "data:4,model:2", hardware="h100", remat="none")
    axis, devices, times = scaling(plan)
    assert axis == "data" and devices == [2, 4, 8]
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
