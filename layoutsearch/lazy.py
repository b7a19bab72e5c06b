"""A package's names imported when first read (PEP 562), so that importing the package imports nothing else:
``layoutsearch --help`` and the commands that need neither JAX, the cost model nor a solver start fast."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its module ``namespace``): each of ``names`` read from
    the module it maps to (imported then, the value kept in ``namespace``), any other name as the submodule of
    that name (as when the package imported its submodules); ``dir()`` lists the namespace and its ``__all__``."""

    def getattr_(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        if name.isidentifier() and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return getattr_, dir_
