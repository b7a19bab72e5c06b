"""docs/import.md runs as written: its ```python blocks, in order, as one script in a fresh Python process
(its first block sets up the devices before JAX starts, as a reader's script must)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_tutorial import python_blocks

DOC = Path(__file__).resolve().parent.parent / "docs" / "import.md"


def test_import_doc_runs_in_a_fresh_process(tmp_path):
    pytest.importorskip("transformers", reason="transformers<5 (the Hugging Face example) does not install here")
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 7, "docs/import.md lost python blocks"
    script = tmp_path / "import_doc.py"
    script.write_text("\n".join(blocks) + """
assert graph.dims == {"batch": 64, "embed": 128, "mlp": 512}, graph.dims
assert {"vocab", "d_model", "heads", "d_kv", "d_ff"} <= set(hf_graph.dims), hf_graph.dims
assert nnx_graph.dims == {"batch": 32, "embed": 64, "mlp": 256}, nnx_graph.dims
print("ok")
""")
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}  # as a reader starts
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
