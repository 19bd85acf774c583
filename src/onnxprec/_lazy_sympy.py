"""Defer importing sympy (a quarter of a second) in command-line processes that never need it.

onnx-ir 1.1 imports sympy at start-up for symbolic shape expressions, which AutoCast never evaluates. The CLI
(not the library) installs a stand-in module before onnx-ir is imported: the few functions onnx-ir looks up
at import time are returned as deferred callables, and any other attribute access imports the real sympy
and hands over to it, so behaviour is unchanged whenever sympy is actually used.

The stand-in carries sympy's real ``__spec__`` (and ``__loader__``, ``__package__``), so
``importlib.util.find_spec("sympy")`` and other libraries' availability checks keep working without loading
it. It is installed only for the onnx-ir versions it was written for (:data:`_ONNX_IR_VERSIONS`): for any
other version, or when the version is unknown, :func:`defer_sympy` does nothing.
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
# onnx-ir versions whose import-time use of sympy is exactly the above (module-level ``import sympy`` in
# _core and _symbolic_shapes; attribute lookups at import only in _symbolic_shapes._ALLOWED_FUNCTIONS).
_ONNX_IR_VERSIONS = ("1.1.",)


def _real_sympy() -> types.ModuleType:
    stub = sys.modules.get("sympy")
    if isinstance(stub, _DeferredSympy):
        del sys.modules["sympy"]
        try:
            module = importlib.import_module("sympy")
        except BaseException:
            sys.modules.setdefault("sympy", stub)  # leave the process as it was
            raise
        stub.__dict__["_real"] = module
        return module
    return importlib.import_module("sympy")


class _DeferredCall:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(_real_sympy(), self._name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<deferred sympy.{self._name}>"


class _DeferredSympy(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        real = self.__dict__.get("_real")
        if real is None:
            if name in _DEFERRED_FUNCTIONS:
                return _DeferredCall(name)
            real = _real_sympy()  # anything else (submodule imports via __path__ too) gets the real sympy
        return getattr(real, name)


def _onnx_ir_supported() -> bool:
    """True when the installed onnx-ir is a version the stand-in was written for."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("onnx-ir")
    except importlib.metadata.PackageNotFoundError:
        return False
    return version.startswith(_ONNX_IR_VERSIONS)


def defer_sympy() -> None:
    """Installs the stand-in for sympy before onnx-ir is imported.

    Changes nothing when sympy or onnx-ir is already imported, sympy is not installed, or the installed
    onnx-ir is not a version the stand-in was written for.
    """
    if "sympy" in sys.modules or "onnx_ir" in sys.modules:
        return
    spec = importlib.util.find_spec("sympy")
    if spec is None or not _onnx_ir_supported():
        return
    stub = _DeferredSympy("sympy")
    stub.__spec__ = spec
    stub.__loader__ = spec.loader
    stub.__package__ = "sympy"
    sys.modules["sympy"] = stub
