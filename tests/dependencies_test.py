"""The minimum versions in pyproject.toml match what the code uses: the installed onnxscript meets its minimum and has
the rewriter API onnxprec's pattern rules and matches are written against."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path
from typing import Any

import onnx_ir as ir
from onnx import helper
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
    # RewriteRuleClassBase, RewriteRuleSet, MatchResult and _outputs bindings are older. 0.5: a list attribute in a
    # pattern matches onnx-ir 1.x's tuple (the test below; with 0.4.0 and onnx-ir 1.1 INT8's attention-value match
    # and its test in int8/decide_test.py fail: "Attribute perm mismatch: expected [0, 2, 1, 3], got (0, 2, 1, 3)").
    # With onnxscript 0.5.0 itself (pip install --no-deps --target DIR onnxscript==0.5.0, DIR first on PYTHONPATH),
    # this file, the passes' rule tests (fold_pad_into_conv, fold_affine_into_weights), int8/decide_test.py,
    # upgrade_opset_test.py (version_converter.convert_version(fallback=True)) and preprocess_api_test.py pass.
    assert _minimum("onnxscript") == (0, 5)
    assert _version(importlib.metadata.version("onnxscript")) >= _minimum("onnxscript")
    assert "check_nodes_are_removable" in inspect.signature(pattern.PatternBase.match).parameters
    assert "name" in inspect.signature(pattern.RewriteRule).parameters
    assert issubclass(pattern.RewriteRuleClassBase, pattern.PatternBase)
    assert hasattr(pattern.MatchResult(), "bindings")


class _TransposeRelu(pattern.PatternBase):
    def pattern(self, op: Any, x: ir.Value) -> Any:
        return op.Relu(op.Transpose(x, perm=[0, 2, 1, 3], _outputs=["moved"]))


def test_a_list_attribute_in_a_pattern_matches_the_tuple_onnx_ir_reads() -> None:
    # as int8/fold_values's attention-value match (_MergedHeads) writes its Transposes' perm
    x = helper.make_tensor_value_info("x", 1, [1, 2, 3, 4])
    y = helper.make_tensor_value_info("y", 1, None)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), helper.make_node("Relu", ["t"], ["y"])]
    model = ir.serde.deserialize_model(helper.make_model(helper.make_graph(nodes, "g", [x], [y])))
    relu = next(node for node in model.graph if node.op_type == "Relu")
    transpose = next(node for node in model.graph if node.op_type == "Transpose")
    assert isinstance(transpose.attributes["perm"].value, tuple)
    match = _TransposeRelu().match(None, model.graph, relu)  # type: ignore[arg-type]  # the matcher reads no model
    assert match, getattr(match, "reason", "")
    assert match.bindings["x"].name == "x" and match.bindings["moved"].name == "t"
