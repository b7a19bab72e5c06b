"""Golden regression of the cost model: any changed prediction fails with a readable diff.

Regenerate after an intended change: ``.venv/bin/python tests/regen_golden.py``
(see its docstring), then review and commit ``tests/golden/costs.json``.
"""

import json

import pytest
from regen_golden import GOLDEN_PATH, PLANS_PATH, compute_golden, compute_plans, diff_golden


@pytest.mark.parametrize(("path", "compute", "what"), [(GOLDEN_PATH, compute_golden, "cost-model predictions"),
                                                       (PLANS_PATH, compute_plans, "search results")],
                         ids=["costs", "plans"])
def test_golden_predictions_and_plans_are_unchanged(path, compute, what):
    assert path.exists(), "no golden file: run .venv/bin/python tests/regen_golden.py"
    changes = diff_golden(json.loads(path.read_text()), compute())
    if changes:
        shown = "\n  ".join(changes[:60])
        more = f"\n  ... and {len(changes) - 60} more" if len(changes) > 60 else ""
        pytest.fail(f"{len(changes)} {what} changed (case: field: golden -> now):\n  {shown}{more}\n"
                    "If the change is intended, run `.venv/bin/python tests/regen_golden.py` and commit "
                    f"tests/golden/{path.name}.", pytrace=False)


def test_golden_searches_choose_remat_accumulation_and_pipelines():
    found = [c["found"] for c in json.loads(PLANS_PATH.read_text())["cases"].values()]
    assert len({f["chosen"]["remat"] for f in found}) > 1
    assert any(f["chosen"]["microbatches"] > 1 and f["chosen"]["stage_axis"] is None for f in found)
    assert any(f["chosen"]["stage_axis"] is not None for f in found)
    assert any(f["runner_ups"] for f in found) and all(f["baselines"] for f in found)


def test_golden_covers_every_zoo_model_with_several_meshes_and_layouts():
    from layoutsearch.zoo import MODELS

    cases = json.loads(GOLDEN_PATH.read_text())["cases"].values()
    for model in MODELS:
        mine = [c for c in cases if c["model"] == model]
        assert len({c["mesh"] for c in mine}) >= 2, model
        assert len({c["layout"] for c in mine}) >= 3, model


def test_diff_names_the_case_the_field_and_both_values():
    old = {"cases": {"gpt data:8 data": {"predicted": {"step_s": 1.0, "bytes_by_kind": {"all-reduce": 8}}}}}
    new = {"cases": {"gpt data:8 data": {"predicted": {"step_s": 1.5, "bytes_by_kind": {"all-reduce": 8}}},
                     "extra": {}}}
    lines = diff_golden(old, new)
    assert "gpt data:8 data: predicted.step_s: 1.0 -> 1.5 (+50.000%)" in lines
    assert "extra: new case (not in the golden file)" in lines
    assert diff_golden(old, old) == []
    tiny = {"cases": {"c": {"predicted": {"step_s": 1.0 + 1e-12}}}}
    assert diff_golden({"cases": {"c": {"predicted": {"step_s": 1.0}}}}, tiny) == []
