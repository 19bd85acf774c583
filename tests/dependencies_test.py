"""The minimum versions in pyproject.toml match what the code uses: the installed onnxscript meets its minimum and has
the rewriter API onnxprec's pattern rules and matches are written against."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

from onnxscript.rewriter import pattern

_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _minimum(package: str) -> tuple[int, ...]:
    match = re.search(rf'"{re.escape(package)}>=([0-9.]+)"', _PYPROJECT.read_text())
    assert match is not None, f"{package} has no minimum version in pyproject.toml"
    return _version(match.group(1))


def test_onnxscript_meets_its_minimum_and_has_the_rewriter_api_used() -> None:
    # 0.4: pattern.PatternBase, a pattern and check without a rewrite, matched at one node (onnxscript#2446);
    # RewriteRuleClassBase, RewriteRuleSet, MatchResult and _outputs bindings are older.
    assert _minimum("onnxscript") == (0, 4)
    assert _version(importlib.metadata.version("onnxscript")) >= _minimum("onnxscript")
    assert "check_nodes_are_removable" in inspect.signature(pattern.PatternBase.match).parameters
    assert "name" in inspect.signature(pattern.RewriteRule).parameters
    assert issubclass(pattern.RewriteRuleClassBase, pattern.PatternBase)
    assert hasattr(pattern.MatchResult(), "bindings")
