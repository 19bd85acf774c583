"""Op tables, domains and opsets."""

from __future__ import annotations

import onnx_ir as ir

from onnxprec._ops import (
    QUANTIZED_OPS,
    TYPE_ATTRIBUTES,
    default_opset,
    is_default_domain,
    is_standard_op,
    min_ir_version,
    normalized_domain,
    opsets_by_domain,
)


def _node(op_type: str, domain: str = "") -> ir.Node:
    return ir.Node(domain, op_type, [])


def test_standard_ops_exist_at_the_opset() -> None:
    assert is_standard_op(_node("Relu"), 13)
    assert is_standard_op(_node("Relu", "ai.onnx"), 13)
    assert is_standard_op(_node("LabelEncoder", "ai.onnx.ml"), 2)
    assert is_standard_op(_node("LayerNormalization"), 17)
    assert not is_standard_op(_node("LayerNormalization"), 16)  # added in opset 17
    assert not is_standard_op(_node("FusedMatMul", "com.microsoft"), 1)
    assert not is_standard_op(_node("MyPlugin"), 17)


def test_domains_and_opsets() -> None:
    assert is_default_domain("") and is_default_domain("ai.onnx") and not is_default_domain("ai.onnx.ml")
    assert normalized_domain("ai.onnx") == "" and normalized_domain("com.microsoft") == "com.microsoft"
    graph = ir.Graph([], [], nodes=[], opset_imports={"ai.onnx": 15, "com.microsoft": 1})
    model = ir.Model(graph, ir_version=8)
    assert opsets_by_domain(model) == {"ai.onnx": 15, "": 15, "com.microsoft": 1}
    assert default_opset(model) == 15
    assert default_opset(ir.Model(ir.Graph([], [], nodes=[]), ir_version=8)) == 1


def test_tables() -> None:
    assert min_ir_version(13) == 7 and min_ir_version(21) == 10
    assert {"DequantizeLinear", "MatMulNBits", "QLinearConv"} <= QUANTIZED_OPS
    assert TYPE_ATTRIBUTES["Cast"] == "to" and TYPE_ATTRIBUTES["RandomNormal"] == "dtype"
