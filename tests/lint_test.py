"""ruff and mypy run as part of the test suite, so CI enforces them with the same command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff is not installed (pip install -e '.[test]')",
)
def test_ruff() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    paths = ["src", "tests", "benchmarks", "experiments", "zoo", "examples"]
    result = subprocess.run([ruff, "check", *paths], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# mypy's incremental cache, shared by every clone (a module whose source hash matches its entry is not checked
# again; mypy's own rule, whatever the path): a fresh clone's run takes ~0.3 CPU s instead of ~17.
MYPY_CACHE = Path(os.environ.get("ONNXPREC_CACHE", Path.home() / ".cache" / "onnxprec")) / "mypy"


@pytest.mark.slow
def test_mypy() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
