"""classify: schema limits and custom ops first, then the exclude rules, includes over them, subgraphs inherited."""

from __future__ import annotations

import re

import onnx.parser
import onnx_ir as ir

from onnxprec.autocast.classify import Decision, PluginPrecision, classify
from onnxprec.autocast.rules import NodeNameRule, OpTypeRule

_MODEL = """
<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
main (bool c, float[2] x, float[4] roi, float[1,1,2,2] img) => (float[2] y, float[2] q, float[1,1,4,4] big) {
    a = Relu (x)
    b = Sigmoid (a)
    keep = Tanh (b)
    mine = custom.MyOp (keep)
    plug = custom.Plugged (mine)
    q0 = QuantizeLinear (plug, scale)
    q = DequantizeLinear (q0, scale)
    scale = Constant <value = float {0.1}> ()
    big = Resize <mode = "nearest"> (img, roi, sizes_scales)
    sizes_scales = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
    y = If <
        then_branch = then_g () => (float[2] t) { t = Neg (b) },
        else_branch = else_g () => (float[2] e) { e = Abs (b) }
    > (c)
}
"""


def _classify(**kwargs: object) -> dict[str, Decision]:
    model = ir.serde.deserialize_model(onnx.parser.parse_model(_MODEL))
    for i, node in enumerate(model.graph.all_nodes()):
        node.name = node.name or f"{node.op_type}_{i}"
    decisions = classify(model, low=ir.DataType.FLOAT16, **kwargs)  # type: ignore[arg-type]
    return {node.op_type: d for node, d in decisions.items()}


def test_default_converts_and_fixed_limits_keep_fp32() -> None:
    d = _classify(rules=[])
    assert d["Relu"] == Decision(True, "default") and d["Neg"].low and d["Abs"].low  # If branches are classified
    assert not d["If"].low and "control-flow interface" in d["If"].reason
    assert not d["MyOp"].low and d["MyOp"].reason == "custom op custom::MyOp (no ONNX schema)"
    assert not d["QuantizeLinear"].low and "quantization keeps its FP32 input" in d["QuantizeLinear"].reason
    assert d["Resize"].low and d["Resize"].fp32_inputs == frozenset()  # opset 17: roi and scales may be FP16
    assert d["DequantizeLinear"] == Decision(False, "DequantizeLinear-13 has no float16 output type")


def test_rules_exclude_includes_override_and_subgraphs_inherit() -> None:
    excluded = NodeNameRule([re.compile("Sigmoid")])
    by_type = OpTypeRule(["Tanh", "If"])
    d = _classify(rules=[excluded, by_type], includes=[OpTypeRule(["Tanh"], "op_types_to_include")])
    assert d["Sigmoid"] == Decision(False, "name matches nodes_to_exclude pattern 'Sigmoid'")
    assert d["Tanh"].low and d["Tanh"].reason == (
        "included: op type Tanh is in op_types_to_include (overrides: op type Tanh is in op_types_to_exclude)"
    )
    assert not d["Neg"].low and d["Neg"].reason == "enclosing If 'If_10': op type If is in op_types_to_exclude"


def test_plugin_precision_decides_a_custom_op() -> None:
    d = _classify(rules=[], plugins={"Plugged": PluginPrecision(("fp32",), ("fp16",), "fp16")})
    assert d["Plugged"].low and d["Plugged"].fp32_inputs == frozenset({0}) and d["Plugged"].fp32_outputs == frozenset()
    assert not d["MyOp"].low
