"""docs/tutorial.md runs: every ```python block, in order, in one namespace, in a temporary directory.

The blocks carry their own asserts (loss goes down, identical losses after reloading the plan, the plan
no slower than the hand-written layout and the baselines that fit); this test adds what the prose
claims about the namespace they leave behind.
"""

import re
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def test_fence_extraction():
    text = "a\n```python\nx = 1\n```\n```\nnot python\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


def test_tutorial_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(TUTORIAL.read_text(encoding="utf-8"))
    assert len(blocks) >= 10, "docs/tutorial.md lost its python blocks"
    ns: dict = {"__name__": "tutorial"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{TUTORIAL.name}[python block {i + 1}]", "exec")
        exec(code, ns)  # noqa: S102 - the tutorial's own code

    assert (tmp_path / "my-mlp.json").is_file() and (tmp_path / "plan.json").is_file()
    plan, graph = ns["plan"], ns["graph"]
    assert plan.layout.check(graph) is plan.layout
    assert ns["report"].fits and plan.chosen.fits
    assert len(ns["losses"]) == 20 and ns["losses"] == ns["losses2"]
    for fmt in ("flax_rules", "nnx_rules", "maxtext", "specs"):
        assert ns[fmt].strip()
    assert "logical_axis_rules" in ns["flax_rules"] and "remat_policy" in ns["maxtext"]
