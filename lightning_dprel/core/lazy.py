"""Names a package exports on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Mapping[str, tuple[str, ...]]) -> tuple[list[str], Callable, Callable]:
    """The package's ``__all__``, ``__getattr__`` and ``__dir__`` for ``modules`` (module → the names it exports)."""
    table = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*vars(importlib.import_module(package)), *table])

    return list(table), __getattr__, __dir__
