"""A package's public names, imported from their home modules on first use (PEP 562's module ``__getattr__``), so
that importing a tool's package (and ``python -m onnxprec.<tool> --help``) loads none of its implementation."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Sequence[str], home: str | None = None, homes: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each of ``names`` comes from the module ``homes`` names
    for it, else from ``home``; any other name is an ``AttributeError``, as for a plain module."""
    homes = dict(homes or {})
    if missing := [name for name in names if name not in homes and home is None]:
        raise ValueError(f"{package}: no home module for {', '.join(missing)}")

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(homes.get(name) or str(home)), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
