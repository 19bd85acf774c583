"""The CLI's deferred sympy: not loaded by onnx-ir's import, fully working once anything needs it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from onnxprec._lazy_sympy import defer_sympy
defer_sympy()
import onnx_ir
assert "sympy.core" not in sys.modules, "onnx-ir's import loaded sympy"
from onnx_ir import _symbolic_shapes
assert str(_symbolic_shapes.parse_symbolic_expression("max(a, 2)")) == "Max(2, a)"
import sympy.core
import sympy
assert str(sympy.Symbol("x") + 1) == "x + 1"
print("ok")
"""


def test_sympy_is_deferred_and_then_real() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_library_import_does_not_install_the_stand_in() -> None:
    script = (
        "import sys, onnxprec.autocast as a; a.convert_to_mixed_precision; print(type(sys.modules['sympy']).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "module"
