"""Defer importing sympy (a quarter of a second) in command-line processes that never need it.

onnx-ir imports sympy at start-up for symbolic shape expressions, which AutoCast never evaluates. The CLI
(not the library) installs a stand-in module before onnx-ir is imported: the few functions onnx-ir looks
up at import time are returned as deferred callables, and any other attribute access imports the real
sympy and hands over to it, so behaviour is unchanged whenever sympy is actually used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = ["defer_sympy"]

# Names onnx_ir._symbolic_shapes binds at import time (its table of allowed functions).
_DEFERRED_FUNCTIONS = frozenset({"Max", "Min", "floor", "sqrt", "Mod"})


def _real_sympy() -> types.ModuleType:
    stub = sys.modules.get("sympy")
    if isinstance(stub, _DeferredSympy):
        del sys.modules["sympy"]
        module = importlib.import_module("sympy")
        stub.__dict__["_real"] = module
        return module
    return importlib.import_module("sympy")


class _DeferredCall:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(_real_sympy(), self._name)(*args, **kwargs)


class _DeferredSympy(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if name in _DEFERRED_FUNCTIONS:
                return _DeferredCall(name)
            real = _real_sympy()  # anything else (submodule imports via __path__ too) gets the real sympy
        return getattr(real, name)


def defer_sympy() -> None:
    """Installs the stand-in unless sympy or onnx-ir is already imported (then it changes nothing)."""
    if "sympy" in sys.modules or "onnx_ir" in sys.modules:
        return
    if importlib.util.find_spec("sympy") is None:
        return
    sys.modules["sympy"] = _DeferredSympy("sympy")
