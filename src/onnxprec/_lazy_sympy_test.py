"""The CLI's deferred sympy: not loaded by onnx-ir's import, invisible to availability checks, fully working."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onnxprec import _lazy_sympy

PRELUDE = """
import importlib.util, sys
from onnxprec._lazy_sympy import defer_sympy, _DeferredSympy
defer_sympy()
assert isinstance(sys.modules["sympy"], _DeferredSympy), "the stand-in was not installed"
"""

DEFERRED_AND_THEN_REAL = (
    PRELUDE
    + """
import onnx_ir
assert "sympy.core" not in sys.modules, "onnx-ir's import loaded sympy"
from onnx_ir import _symbolic_shapes
assert str(_symbolic_shapes.parse_symbolic_expression("max(a, 2)")) == "Max(2, a)"
import sympy.core
import sympy
assert str(sympy.Symbol("x") + 1) == "x + 1"
print("ok")
"""
)

FIND_SPEC_THEN_IMPORT = (
    PRELUDE
    + """
import onnx_ir
spec = importlib.util.find_spec("sympy")  # raised "ValueError: sympy.__spec__ is None" with the old stand-in
assert spec is not None and spec.name == "sympy" and spec.origin.endswith("__init__.py"), spec
assert "sympy.core" not in sys.modules, "find_spec loaded sympy"
import sympy
assert str(sympy.Symbol("x") * 2) == "2*x"
assert type(sys.modules["sympy"]) is type(sys), "the real sympy did not replace the stand-in"
assert importlib.util.find_spec("sympy.core") is not None
print("ok")
"""
)


def _python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(not _lazy_sympy._onnx_ir_supported(), reason="the stand-in is only for onnx-ir 1.1.x")
@pytest.mark.parametrize("script", [DEFERRED_AND_THEN_REAL, FIND_SPEC_THEN_IMPORT], ids=["deferred", "find_spec"])
def test_sympy_is_deferred_and_then_real(script: str) -> None:
    result = _python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_other_onnx_ir_versions_get_no_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.2.0")
    assert not _lazy_sympy._onnx_ir_supported()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.1.7")
    assert _lazy_sympy._onnx_ir_supported()

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert not _lazy_sympy._onnx_ir_supported()


@pytest.mark.slow
def test_unsupported_version_changes_nothing_in_a_fresh_process() -> None:
    script = (
        "import sys, importlib.metadata\n"
        "importlib.metadata.version = lambda name: '9.0.0'\n"
        "from onnxprec._lazy_sympy import defer_sympy\n"
        "defer_sympy()\n"
        "print('sympy' in sys.modules)\n"
    )
    result = _python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_library_import_does_not_install_the_stand_in() -> None:
    script = (
        "import sys, onnxprec.autocast as a; a.convert_to_mixed_precision; print(type(sys.modules['sympy']).__name__)"
    )
    result = _python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module"
