"""Name tables that the method packages fill (privacy units, mechanisms), and the discovery that completes them.

Each package under ``lightning_dprel.methods`` registers its own units and mechanisms when it is imported, so adding
a method edits no core file and no central import list. A :class:`MethodRegistry` answers a name it does not hold yet
(a ledger loaded from a checkpoint in a fresh process) by importing every method package, found with :mod:`pkgutil`,
once: the core names no method.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, MutableMapping
from typing import TypeVar

__all__ = ["METHODS_PACKAGE", "import_methods", "MethodRegistry"]

V = TypeVar("V")

#: The namespace whose sub-packages are the methods (one package per method).
METHODS_PACKAGE = "lightning_dprel.methods"

_done = False
_running = False
_failed: dict[str, str] = {}


def import_methods() -> dict[str, str]:
    """Import every method package once (each registers its units and mechanisms); returns those that failed to import.

    A package whose import raises ``ImportError`` (a missing optional dependency) is skipped and named in the result, so
    one broken method does not hide another's names. A call made while discovery runs returns at once (no recursion).
    """
    global _done, _running
    if _done or _running:
        return dict(_failed)
    _running = True
    try:
        root = importlib.import_module(METHODS_PACKAGE)
        for info in pkgutil.iter_modules(root.__path__, f"{METHODS_PACKAGE}."):
            if info.ispkg:
                try:
                    importlib.import_module(info.name)
                except ImportError as err:
                    _failed[info.name] = f"{type(err).__name__}: {err}"
        _done = True
    finally:
        _running = False
    return dict(_failed)


class MethodRegistry(MutableMapping[str, V]):
    """A name → value table that method packages fill on import; a miss or a full listing first runs :func:`import_methods`.

    Registration goes through :meth:`peek` (no discovery), so a package registering its names never imports the others.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, V] = {}

    def peek(self, name: str) -> V | None:
        """The value registered under ``name`` now, else None (no discovery)."""
        return self._items.get(name)

    def _complete(self) -> None:
        import_methods()

    def __contains__(self, name: object) -> bool:
        if name in self._items:
            return True
        self._complete()
        return name in self._items

    def __getitem__(self, name: str) -> V:
        if name not in self._items:
            self._complete()
        return self._items[name]

    def __setitem__(self, name: str, value: V) -> None:
        self._items[name] = value

    def __delitem__(self, name: str) -> None:
        del self._items[name]

    def __iter__(self) -> Iterator[str]:
        self._complete()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._complete()
        return len(self._items)

    def failures(self) -> str:
        """For an error message on an unknown name: "" or the method packages that failed to import (and why)."""
        failed = import_methods()
        return f" (method packages that failed to import: {failed})" if failed else ""

    def __repr__(self) -> str:
        return f"MethodRegistry({self.what!r}, {sorted(self._items)})"
