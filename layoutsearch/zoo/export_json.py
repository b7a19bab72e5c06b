"""Write every zoo model at its default sizes as a JSON graph file.

Run ``python -m layoutsearch.zoo.export_json [OUT_DIR]`` (default: ``graphs``);
the files are ``<model>.json``, e.g. ``graphs/mtf-ffn.json`` (the checkout's ``graphs/`` folder).
"""

from __future__ import annotations

import sys
from pathlib import Path

from layoutsearch.ir import save_graph
from layoutsearch.zoo import JSON_DIR, build, list_models


def export(out_dir: Path = JSON_DIR) -> list[Path]:
    """Save each model at default sizes under ``out_dir``; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in list_models():
        path = out_dir / f"{spec.name}.json"
        save_graph(build(spec.name), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m layoutsearch.zoo.export_json [OUT_DIR]", file=sys.stderr)
        return 2
    for path in export(Path(args[0]) if args else JSON_DIR):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
