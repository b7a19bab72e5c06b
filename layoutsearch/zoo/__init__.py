"""The model zoo: builders of forward graphs by name, with sizes as parameters.

Every builder takes keyword-only sizes (defaults small enough for CPU tests)
and returns a validated :class:`~layoutsearch.ir.Graph` whose ``loss`` is a
scalar and whose ``meta`` holds the model name and every size::

    from layoutsearch import zoo
    g = zoo.gpt(preset="gpt3-175b")                  # or zoo.build("gpt", preset="gpt3-175b")
    g = zoo.build("mtf-ffn", batch=64, io=256, hidden=1024)
    g = zoo.load("mtf-transformer", zoo.parse_overrides(["layers=4", "d_model=128"]))
    g = zoo.load("graphs/moe.json")          # a graph file

Integer parameters are sizes (or 0/1 switches such as ``tie_embeddings``);
``preset``, ``dtype`` and GPT's ``mlp``, ``norm`` and ``position`` are strings
(:data:`STR_PARAMS`), ``dropout`` a number (:data:`FLOAT_PARAMS`). A parameter whose default is ``None`` is derived from the
others (e.g. GPT's ``d_ff`` = 4 · d_model).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.ir import Graph, load_graph
from layoutsearch.ir.dims import MAX_DIM_SIZE, short_repr
from layoutsearch.zoo._blocks import MAX_LAYERS
from layoutsearch.zoo.gpt import DEFAULTS as _GPT_DEFAULTS
from layoutsearch.zoo.gpt import GPT_PRESETS, gpt
from layoutsearch.zoo.mlp import mlp
from layoutsearch.zoo.moe import moe
from layoutsearch.zoo.mtf_ffn import mtf_ffn
from layoutsearch.zoo.transformer import mtf_transformer

JSON_DIR = Path(__file__).resolve().parents[2] / "graphs"
"""Where a checkout keeps the zoo's JSON graph files (each model at default sizes; not part of the installed
package: ``python -m layoutsearch.zoo.export_json`` writes them)."""

STR_PARAMS = frozenset({"preset", "dtype", "mlp", "norm", "position"})
"""Parameters whose values are strings; every other parameter is an integer, except :data:`FLOAT_PARAMS`."""

FLOAT_PARAMS = frozenset({"dropout"})
"""Parameters whose values are numbers (floats; an integer is taken as a float)."""



@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: its name, builder, one-line description and parameters with their defaults."""

    name: str
    builder: Callable[..., Graph] = field(repr=False)
    description: str
    params: dict[str, Any]

    def build(self, **overrides: Any) -> Graph:
        return build(self.name, **overrides)


def _spec(name: str, builder: Callable[..., Graph], params: dict[str, Any] | None = None) -> ModelSpec:
    doc = inspect.getmodule(builder).__doc__ or ""
    first = doc.strip().splitlines()[0].split(": ", 1)[-1].rstrip(".") if doc.strip() else name
    description = first[:1].upper() + first[1:]
    if params is None:
        params = {p.name: p.default for p in inspect.signature(builder).parameters.values()}
    return ModelSpec(name, builder, description, dict(params))


MODELS: dict[str, ModelSpec] = {
    s.name: s for s in (
        _spec("mtf-ffn", mtf_ffn),
        _spec("mtf-transformer", mtf_transformer),
        _spec("gpt", gpt, {"preset": None, **_GPT_DEFAULTS}),
        _spec("moe", moe),
        _spec("mlp", mlp),
    )
}
"""Zoo models by name."""


def list_models() -> list[ModelSpec]:
    """Every zoo model, in registry order."""
    return list(MODELS.values())


def _model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise GraphError(f"unknown model {name!r} (zoo models: {', '.join(MODELS)})")
    return MODELS[name]


def _coerce(model: str, key: str, value: Any) -> Any:
    if key in FLOAT_PARAMS:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise GraphError(f"model {model!r}: {key} must be a number, got {short_repr(value)}") from None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise GraphError(f"model {model!r}: {key} must be a number, got {short_repr(value)}")
        return value
    if key in STR_PARAMS:
        if value is not None and not isinstance(value, str):
            raise GraphError(f"model {model!r}: {key} must be a string, got {short_repr(value)}")
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        text = value
        value = _parse_int(text, lambda: GraphError(f"model {model!r}: {key} must be an integer, got {short_repr(text)}"),
                           f"model {model!r}: {key}")
    if value is not None and not isinstance(value, int):
        raise GraphError(f"model {model!r}: {key} must be an integer, got {short_repr(value)}")
    if value is not None:
        _check_bound(key, value, f"model {model!r}: ")
    return value


def _parse_int(text: str, fail: Callable[[], Exception], what: str) -> int:
    """``int(text)``; ``fail()`` for anything else; GraphError naming ``what`` for too many digits."""
    digits = text.strip().lstrip("+-")
    if len(digits) > 40 and digits.isdigit():
        raise GraphError(f"{what}: an integer of {len(digits):,} digits is out of range: integer parameters are "
                         f"at most 2**40 ({MAX_DIM_SIZE:,})")
    try:
        return int(text)
    except ValueError:
        raise fail() from None


def _check_bound(key: str, value: int, prefix: str) -> None:
    """Integer parameters are sizes (or 0/1 switches): at most :data:`~layoutsearch.ir.dims.MAX_DIM_SIZE`
    in magnitude; ``layers`` at most :data:`MAX_LAYERS`."""
    limit, text = (MAX_LAYERS, f"{MAX_LAYERS:,}") if key == "layers" else (MAX_DIM_SIZE, f"2**40 ({MAX_DIM_SIZE:,})")
    if abs(value) > limit:
        raise GraphError(f"{prefix}{key} must be at most {text}, got {short_repr(value)}")


def build(name: str, /, **overrides: Any) -> Graph:
    """Build zoo model ``name`` with its defaults, replacing the parameters given.

    Raises GraphError for an unknown model, an unknown parameter (listing the
    valid ones), a value of the wrong type or an invalid size.
    """
    spec = _model(name)
    unknown = [k for k in overrides if k not in spec.params]
    if unknown:
        raise GraphError(f"model {name!r} has no parameter {', '.join(repr(k) for k in unknown)} "
                         f"(parameters: {', '.join(spec.params)})")
    kwargs = {k: _coerce(name, k, v) for k, v in overrides.items()}
    return spec.builder(**kwargs)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``["batch=32", "preset=gpt3-175b"]`` into ``{"batch": 32, "preset": "gpt3-175b"}``.

    Values are integers, except for the string parameters (:data:`STR_PARAMS`) and
    the numbers (:data:`FLOAT_PARAMS`, e.g. ``dropout=0.1``). A malformed item, a
    non-integer size, a non-number or a repeated key raises GraphError naming the item.
    """
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str):
            raise GraphError(f"malformed override {short_repr(item)}: expected a string NAME=VALUE, e.g. batch=32")
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier() or not value:
            raise GraphError(f"malformed override {short_repr(item)}: expected NAME=VALUE, e.g. batch=32")
        if key in out:
            raise GraphError(f"override {short_repr(item)}: {key} is given twice")
        if key in STR_PARAMS:
            out[key] = value
            continue
        if key in FLOAT_PARAMS:
            try:
                number = float(value)
            except ValueError:
                raise GraphError(f"override {short_repr(item)}: {key} must be a number, got {short_repr(value)}") from None
            out[key] = number
            continue
        out[key] = _parse_int(
            value, lambda: GraphError(f"override {short_repr(item)}: {key} must be an integer, got {short_repr(value)}"),
            f"override {key}=...")
        _check_bound(key, out[key], f"override {short_repr(item)}: ")
    return out


def load(spec: str, overrides: dict[str, Any] | None = None) -> Graph:
    """A zoo model by name (with ``overrides``) or a JSON graph file by path.

    Overrides apply to zoo models only: giving any with a file raises GraphError.
    """
    if spec in MODELS:
        return build(spec, **(overrides or {}))
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        if overrides:
            raise GraphError(f"{spec!r} is a graph file; size overrides ({', '.join(overrides)}) apply only to "
                             f"zoo models ({', '.join(MODELS)})")
        return load_graph(path)
    raise GraphError(f"unknown model {spec!r}: not a zoo model ({', '.join(MODELS)}) nor a graph file")


__all__ = [
    "FLOAT_PARAMS", "GPT_PRESETS", "JSON_DIR", "MAX_LAYERS", "MODELS", "STR_PARAMS", "ModelSpec", "build", "gpt", "list_models", "load",
    "mlp", "moe", "mtf_ffn", "mtf_transformer", "parse_overrides",
]
