"""Joint search of pipelined plans (stage axis, K, M, remat, inner layout)."""

import pytest

from graphs import build_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.solvers.pipeline_search import microbatch_candidates, search_pipeline
from layoutsearch.solvers.search import InfeasibleError, search

# Activation-heavy: long sequences, few parameters, so remat in a pipeline saves what no layout can.
GPT = build_model("gpt", layers=4, batch=16, seq=256, d_model=128, heads=4, vocab=64, tie_embeddings=0)
MESH = "pipe:4,data:2"


def test_microbatch_candidates_divide_the_batch_up_to_4k():
    assert microbatch_candidates(16, 2) == [1, 2, 4, 8]
    assert microbatch_candidates(12, 4) == [1, 2, 3, 4, 6, 12]


def test_a_limit_only_a_pipeline_meets_gets_a_pipelined_plan():
    with pytest.raises(InfeasibleError) as info:
        search(GPT, MESH, memory_limit=1, hardware="h100")
    smallest = info.value.min_memory  # the least any non-pipelined layout needs
    limit = 0.8 * smallest
    with pytest.raises(InfeasibleError):
        search(GPT, MESH, memory_limit=limit, hardware="h100")
    plan = search_pipeline(GPT, MESH, limit, hardware="h100")
    assert plan.memory_bytes <= limit
    assert plan.report.remat  # keeping only block inputs is what fits
    best = min(c.step_s for c in plan.candidates if c.fits)
    assert plan.step_s == best
    assert {c.stage_axis for c in plan.candidates} == {"pipe", "data"}


def test_fixed_stage_count_and_microbatches_are_honoured():
    plan = search_pipeline(GPT, MESH, hardware="h100", stages=4, microbatches=8)
    assert plan.report.stage_axis == "pipe" and plan.report.num_stages == 4 and plan.report.microbatches == 8
    assert all(c.microbatches == 8 and c.stages == 4 for c in plan.candidates)


def test_impossible_pipeline_requests_are_explained():
    with pytest.raises(LayoutSearchError, match="can carry 3 pipeline stages"):
        search_pipeline(GPT, MESH, hardware="h100", stages=3)
    with pytest.raises(LayoutSearchError, match="no pipelined plan"):
        search_pipeline(GPT, MESH, 1e3, hardware="h100", stages=4)
