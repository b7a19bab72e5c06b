"""What one MaxText version has: its config keys, mesh axes, logical-name vocabulary, model files and the
logical names its layers give each tensor, read from that version's own files.

:func:`maxtext_version` loads a version: the checked-in table ``layoutsearch/data/maxtext-VERSION.json``
(generated from the real files by ``python -m layoutsearch.maxtext.tables``; its ``source`` says from
what), with ``base.yml``'s keys, mesh axes and rules read afresh from MaxText itself when this interpreter
imports that same version. :data:`SUPPORTED` lists the versions with a table; :func:`default_version` is
the installed MaxText's, else the newest supported."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata, resources
from typing import Any

from layoutsearch.errors import LayoutError

SUPPORTED = ("0.2.5",)
"""MaxText versions with a checked-in table (``layoutsearch/data/maxtext-VERSION.json``)."""

PIPELINE_OUTSIDE_BATCH = ("stage", "data", "fsdp", "fsdp_transpose", "expert")
"""What MaxText 0.2.5 sets the rule of ``activation_embed_and_logits_batch`` (the batch of the embeddings and
logits, outside the pipeline's stages) to whenever it pipelines, whatever the config says
(``configs/types.py``: "always prioritize the 'stage' axis for sharding when pipelining"); it also moves the
``stage`` mesh axis before ``data``."""


@dataclass(frozen=True)
class MaxTextVersion:
    """One MaxText version's vocabulary (see the module docstring). ``tensors``: decoder block ->
    ``params`` (path -> logical names per dim), ``activations`` (constraint site -> logical names) and
    ``logits``; ``models``: model name -> its model file's shape keys and rules."""

    version: str
    source: str
    keys: frozenset[str]
    mesh_axes: tuple[str, ...]
    logical_axis_rules: tuple[tuple[str, tuple[str, ...]], ...]
    defaults: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def logical_names(self) -> tuple[str, ...]:
        """Every logical name of the base rules, in their order (each once)."""
        return tuple(dict.fromkeys(name for name, _ in self.logical_axis_rules))

    def parallelism_key(self, axis: str, kind: str = "ici") -> str:
        """The key sizing MaxText mesh axis ``axis`` within (``ici``) or across (``dcn``) slices
        (``stage``: ``*_pipeline_parallelism``)."""
        if axis not in self.mesh_axes:
            raise LayoutError(f"{axis!r} is not a mesh axis of MaxText {self.version} "
                              f"(its mesh axes: {', '.join(self.mesh_axes)})")
        if kind not in ("ici", "dcn"):
            raise LayoutError(f"parallelism kind must be 'ici' or 'dcn', got {kind!r}")
        return f"{kind}_{'pipeline' if axis == 'stage' else axis}_parallelism"


def _axes(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def installed_version() -> str | None:
    """The version of the MaxText this interpreter imports, or None."""
    try:
        return metadata.version("maxtext")
    except metadata.PackageNotFoundError:
        return None


def default_version() -> str:
    """The installed MaxText's version when a table supports it, else the newest supported version."""
    v = installed_version()
    return v if v in SUPPORTED else SUPPORTED[-1]


@cache
def maxtext_version(version: str | None = None) -> MaxTextVersion:
    """The tables of MaxText ``version`` (default :func:`default_version`); LayoutError if unsupported."""
    version = version or default_version()
    if version not in SUPPORTED:
        raise LayoutError(f"unsupported MaxText version {version!r} (supported: {', '.join(SUPPORTED)}; a table for "
                          "another version is made by python -m layoutsearch.maxtext.tables with it installed)")
    text = resources.files("layoutsearch").joinpath(f"data/maxtext-{version}.json").read_text(encoding="utf-8")
    table = json.loads(text)
    base = _installed_base(version)
    source = table["source"]
    if base is not None:
        table.update({k: base[k] for k in ("mesh_axes", "logical_axis_rules")})
        table["keys"] = sorted(base)
        source = f"the installed MaxText {version}'s configs/base.yml (tensor names: {source})"
    return MaxTextVersion(
        version=table["maxtext_version"], source=source, keys=frozenset(table["keys"]),
        mesh_axes=tuple(table["mesh_axes"]),
        logical_axis_rules=tuple((str(r[0]), _axes(r[1])) for r in table["logical_axis_rules"]),
        defaults=table.get("defaults", {}), models=table.get("models", {}), tensors=table.get("tensors", {}))


def _installed_base(version: str) -> dict[str, Any] | None:
    """``base.yml`` of the MaxText this interpreter imports, when it is ``version`` (else None)."""
    if installed_version() != version:
        return None
    try:
        import yaml

        root = resources.files("maxtext").joinpath("configs/base.yml")
        return yaml.safe_load(root.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - an unreadable install falls back to the checked-in table
        return None
