"""The cost model against published training runs (``layoutsearch.published``; a check, never a fit).

Targets (the cost-model issue's): every published run predicted to fit its device memory; the mean
absolute step-time error at most 10% and every row within 20%. Rows whose published behaviour involves an
effect the model has no mechanism for are listed in :data:`KNOWN_DEVIATIONS` with the reason and the
measured range their error must stay in (a listed row that comes back inside 20% fails too: remove it),
and are left out of the mean; ``bench/bench_published.py`` prints every row and both means.
"""

from __future__ import annotations

import fnmatch
from functools import cache

import pytest

from layoutsearch.published import RUNS, predict

ROW_TOLERANCE = 0.20
MEAN_TOLERANCE = 0.10

KNOWN_DEVIATIONS: dict[str, tuple[float, float, str]] = {
    "maxtext-64b x16": (-0.24, -0.18, "multi-slice slowdown"),
    "maxtext-64b x32": (-0.29, -0.22, "multi-slice slowdown"),
    "maxtext-128b x32": (-0.24, -0.18, "multi-slice slowdown"),
}
"""Run -> (low, high) of ``predicted / published - 1``, and why. Multi-slice slowdown: MaxText's step time
grows with the number of slices (64B: +19% from 1 to 32 slices) far beyond what the data-center network's
published bandwidth allows even with the gradient all-reduce fully exposed (64B at 32 slices: a 0.34 s bf16
ring all-reduce of each chip's 490 MB gradient shard at 3.1 GB/s, against +2.6 s published); the cost model
hides that all-reduce behind the backward pass and has no mechanism (stragglers, synchronization, DCN
congestion) for the rest."""


@cache
def _predicted() -> dict[str, dict]:
    return {r.name: predict(r) for r in RUNS}


def _known(name: str) -> tuple[float, float, str] | None:
    return next((v for k, v in KNOWN_DEVIATIONS.items() if fnmatch.fnmatch(name, k)), None)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_every_published_run_fits_and_is_predicted_within_tolerance(run):
    p = _predicted()[run.name]
    assert p["fits"], f"{run.name} trained on {run.hardware} but is predicted to need {p['memory_bytes']:.3e} B"
    known = _known(run.name)
    if known is None:
        assert abs(p["error"]) <= ROW_TOLERANCE, f"{run.name}: predicted {p['predicted_step_s']:.2f} s, " \
                                                 f"published {run.published_step_s:.2f} s ({p['error']:+.1%})"
    else:
        low, high, why = known
        assert low <= p["error"] <= high, f"{run.name} ({why}): {p['error']:+.1%} left [{low:+.0%}, {high:+.0%}]"
        assert abs(p["error"]) > ROW_TOLERANCE, f"{run.name} is back within {ROW_TOLERANCE:.0%}: unlist it"


def test_mean_error_over_the_modelled_runs():
    errors = [abs(p["error"]) for name, p in _predicted().items() if _known(name) is None]
    assert len(errors) >= len(RUNS) - len(KNOWN_DEVIATIONS)
    assert sum(errors) / len(errors) <= MEAN_TOLERANCE


def test_every_known_deviation_names_a_run():
    names = [r.name for r in RUNS]
    for pattern in KNOWN_DEVIATIONS:
        assert any(fnmatch.fnmatch(n, pattern) for n in names), pattern


def test_runs_cover_both_sources_and_use_the_published_layouts():
    sources = {r.source for r in RUNS}
    assert len(sources) == 2 and len(RUNS) == 31
    mega = next(r for r in RUNS if r.name == "megatron-145.6b")
    assert (mega.mesh, mega.stage_axis, mega.microbatches) == ("pipe:8,data:24,model:8", "pipe", 96)
    assert next(r for r in RUNS if r.name == "maxtext-32b x4").mesh == "data:4,fsdp:256"


# -- the search against the published layouts ---------------------------------------------------------------------

FAST_SEARCH_ROWS = ("megatron-1.7b", "maxtext-16b x1", "maxtext-128b x1")
"""Rows searched in the default run (seconds each); ``pytest -m slow`` searches every row."""


def _search_is_never_worse(run):
    from layoutsearch.published import search_published

    published = _predicted()[run.name]
    plan = search_published(run)
    assert plan.chosen.fits and plan.memory_bytes <= plan.memory_limit
    assert plan.step_s <= published["predicted_step_s"] * (1 + 1e-6), (
        f"{run.name}: the search's plan ({plan.chosen.rules_text()}, remat {plan.chosen.remat}) is predicted at "
        f"{plan.step_s:.3f} s, the published layout at {published['predicted_step_s']:.3f} s")


@pytest.mark.parametrize("run", [r for r in RUNS if r.name in FAST_SEARCH_ROWS], ids=lambda r: r.name)
def test_the_search_is_never_worse_than_the_published_layout(run):
    _search_is_never_worse(run)


@pytest.mark.slow
@pytest.mark.parametrize("run", [r for r in RUNS if r.name not in FAST_SEARCH_ROWS], ids=lambda r: r.name)
def test_the_search_is_never_worse_than_the_published_layout_on_every_row(run):
    _search_is_never_worse(run)
