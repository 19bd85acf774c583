"""Op tables, domains and opsets."""

from __future__ import annotations

import dataclasses

import onnx
import onnx_ir as ir
import pytest

from onnxprec._ops import (
    CONTRIB_FLOAT_CONTRACTS,
    ORT_ONNX_DOMAIN_OPS,
    QUANTIZED_OPS,
    TYPE_ATTRIBUTES,
    FloatContract,
    contrib_float_contract,
    default_opset,
    float_contract_of_schema,
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


def test_contrib_float_contracts_match_onnx_runtime_schemas() -> None:
    """Each contract is what the installed onnxruntime's contrib op schema implies (ORT's own, not ONNX's)."""
    state = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state", reason="onnxruntime is not installed")
    schemas: dict[tuple[str, str], object] = {}
    for schema in sorted(state.get_all_operator_schema(), key=lambda s: s.since_version):
        domain = "" if schema.domain == "ai.onnx" else schema.domain
        if domain == "" and onnx.defs.has(schema.name, schema.since_version, ""):
            continue  # ONNX's own op (LayerNormalization-17, RotaryEmbedding-23): ONNX's schema covers it
        schemas.setdefault((domain, schema.name), schema)
    for key, contract in CONTRIB_FLOAT_CONTRACTS.items():
        schema = schemas[key]
        derived = float_contract_of_schema(
            [p.typeStr for p in schema.inputs],  # type: ignore[attr-defined]
            [p.typeStr for p in schema.outputs],  # type: ignore[attr-defined]
            {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints},  # type: ignore[attr-defined]
        )
        # fp32_inside is what the kernels do, which no schema says.
        assert derived is not None and dataclasses.replace(derived, fp32_inside=contract.fp32_inside) == contract, key


def test_float_contract_of_schema() -> None:
    constraints = {"T": ["tensor(float)", "tensor(float16)"], "U": ["tensor(float)"], "M": ["tensor(int32)"]}
    contract = float_contract_of_schema(["T", "M", "tensor(int64)", "U"], ["T", "U"], constraints)
    assert contract == FloatContract("T--F", "TF", frozenset({"float16"}))
    assert contract.input(7) == "-" and contract.output(1) == "F"
    assert float_contract_of_schema(["T"], ["T"], {"T": ["tensor(float)"]}) is None  # no low type at all


def test_contrib_float_contract_lookup() -> None:
    gqa = ir.Node("com.microsoft", "GroupQueryAttention", [])
    contract = contrib_float_contract(gqa, 1)
    assert contract is not None and contract.input(5) == "-" and contract.input(3) == "T"
    assert contrib_float_contract(_node("SimplifiedLayerNormalization"), 22) == FloatContract(
        "TT", "TF", fp32_inside=True
    )
    assert contrib_float_contract(_node("LayerNormalization"), 16) is not None  # ORT's
    assert contrib_float_contract(_node("LayerNormalization"), 17) is None  # ONNX's: its schema decides
    assert contrib_float_contract(_node("Relu"), 17) is None
