"""Op tables, domains and opsets."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from onnxprec._ops import (
    ORT_ONNX_DOMAIN_OPS,
    QUANTIZED_OPS,
    TYPE_ATTRIBUTES,
    default_opset,
    is_default_domain,
    is_known_onnx_domain_op,
    is_ort_onnx_domain_op,
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


def test_ort_onnx_domain_ops_match_the_installed_onnxruntime() -> None:
    """The table is ORT's kernels in the ONNX domain for ops ONNX lacks at those opsets, each op's opset range."""
    state = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state", reason="onnxruntime is not installed")
    ranges: dict[str, tuple[int, int]] = {}
    for kernel in state.get_all_opkernel_def():
        first, last = kernel.version_range
        if kernel.domain not in ("", "ai.onnx") or onnx.defs.has(kernel.op_name, first, ""):
            continue
        low, high = ranges.get(kernel.op_name, (first, last))
        ranges[kernel.op_name] = (min(low, first), max(high, last))
    assert ranges == ORT_ONNX_DOMAIN_OPS


def test_ort_onnx_domain_ops_are_known_but_not_standard() -> None:
    assert is_ort_onnx_domain_op("SimplifiedLayerNormalization", "", 22)
    assert is_ort_onnx_domain_op("SimplifiedLayerNormalization", "ai.onnx", 13)
    assert not is_standard_op(_node("SimplifiedLayerNormalization"), 22)
    assert is_known_onnx_domain_op("SimplifiedLayerNormalization", "", 22)
    # LayerNormalization is ORT's contrib op up to opset 16 and ONNX's own from opset 17.
    assert is_ort_onnx_domain_op("LayerNormalization", "", 16)
    assert not is_ort_onnx_domain_op("LayerNormalization", "", 17)
    assert is_known_onnx_domain_op("LayerNormalization", "", 17)
    assert is_ort_onnx_domain_op("ThresholdedRelu", "", 9) and not is_ort_onnx_domain_op("ThresholdedRelu", "", 10)
    # Only the ONNX domain: com.microsoft ops have their own domain, and unknown names are no op at all.
    assert not is_ort_onnx_domain_op("SimplifiedLayerNormalization", "com.microsoft", 1)
    assert not is_known_onnx_domain_op("Frobnicate", "", 22)
    assert is_known_onnx_domain_op("Relu", "ai.onnx", 13)
    assert is_known_onnx_domain_op("LabelEncoder", "ai.onnx.ml", 2)
