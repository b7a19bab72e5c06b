"""docs/import.md runs: every ```python block, in order, in one namespace."""

from pathlib import Path

from tests.test_tutorial import python_blocks

DOC = Path(__file__).resolve().parent.parent / "docs" / "import.md"


def test_import_doc_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 4, "docs/import.md lost python blocks"
    ns: dict = {"__name__": "import_doc"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[python block {i + 1}]", "exec"), ns)  # noqa: S102 - the page's code
    assert ns["graph"].dims == {"batch": 64, "embed": 128, "mlp": 512}
    assert ns["losses"][-1] < ns["losses"][0]
