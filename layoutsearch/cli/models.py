"""``layoutsearch models``: the model zoo with each model's parameters and defaults."""

from __future__ import annotations

import argparse
from typing import Any

from layoutsearch.cli.common import Result, command, table


def add(sub: Any) -> None:
    command(sub, "models", run, "list the model zoo with each model's parameters and defaults", render=render)


def run(args: argparse.Namespace) -> Result:
    from layoutsearch.zoo import list_models

    return {"models": [{"name": m.name, "description": m.description, "params": dict(m.params)}
                       for m in list_models()]}


def render(result: Result, args: argparse.Namespace) -> list[Any]:
    from layoutsearch.zoo import STR_PARAMS

    def value(k: str, v: Any) -> Any:  # None: no preset, or a size derived from the others
        return v if v is not None else "none" if k in STR_PARAMS else "auto"

    rows = [[m["name"], m["description"], " ".join(f"{k}={value(k, v)}" for k, v in m["params"].items())]
            for m in result["models"]]
    return [table(["model", "description", "parameters (defaults; change with --set KEY=VALUE)"], rows)]
