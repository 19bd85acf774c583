"""Tensor matching between a model and its conversion: names, recorded names, producers, dropped Casts, QDQ."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._graph import ORIGINAL_NAME
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.debug._common import prepare
from onnxprec.debug.match import match_values

W = {"w": np.eye(4, dtype=np.float32)}


def _reference() -> ir.Model:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Cast", ["a"], ["a32"], name="noop", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["a32", "w"], ["h"], name="mm"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("Sigmoid", ["t"], ["gone"], name="sigmoid"),
        helper.make_node("Add", ["t", "gone"], ["y"], name="add"),
    ]
    return prepare(make_model(nodes, [tensor_info("x", F, [1, 4])], [tensor_info("y", F, [1, 4])], W))


def _candidate() -> ir.Model:
    """Relu renamed (node and tensor), its output quantized (Q/DQ) before the MatMul, the no-op Cast dropped, the
    MatMul output renamed, Tanh's output renamed with a recorded original name, Sigmoid replaced by HardSigmoid."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a_renamed"], name="relu_renamed"),
        helper.make_node("QuantizeLinear", ["a_renamed", "s"], ["a_q"], name="q"),
        helper.make_node("DequantizeLinear", ["a_q", "s"], ["a_dq"], name="dq"),
        helper.make_node("MatMul", ["a_dq", "w"], ["h_new"], name="mm"),
        helper.make_node("Tanh", ["h_new"], ["t_fp16"], name="tanh_fp16"),
        helper.make_node("HardSigmoid", ["t_fp16"], ["hs"], name="hard"),
        helper.make_node("Add", ["t_fp16", "hs"], ["y"], name="add"),
    ]
    proto = make_model(
        nodes, [tensor_info("x", F, [1, 4])], [tensor_info("y", F, [1, 4])], {**W, "s": np.array(0.1, np.float32)}
    )
    model = ir.serde.deserialize_model(proto)
    tanh_out = next(n for n in model.graph if n.name == "tanh_fp16").outputs[0]
    tanh_out.metadata_props[ORIGINAL_NAME] = "t"
    # survives saving: the recorded name is in the ValueInfoProto's metadata_props
    reloaded = onnx.load_from_string(ir.serde.serialize_model(model).SerializeToString())
    return prepare(reloaded)


def test_each_rule_finds_its_tensor() -> None:
    reference = _reference()
    values = {v.name: v for node in reference.graph for v in node.outputs}
    matches = match_values(_candidate(), values.values())
    found = {name: (m.candidate.name if m.candidate is not None else None, m.how) for name, m in
             ((v.name, matches[v]) for v in values.values())}  # fmt: skip
    assert found == {
        # through the reference's Cast and the candidate's Q/DQ, compared as the MatMul sees it (dequantized)
        "a": ("a_dq", "via consumer mm -> consumers' DequantizeLinear"),
        "a32": ("a_dq", "through Cast"),  # the Cast the candidate dropped carries what its input matched
        "h": ("h_new", "producer"),
        "t": ("t_fp16", "original name"),
        "gone": (None, "no candidate tensor"),
        "y": ("y", "name"),
    }


def test_int4_tensors_are_never_matched() -> None:
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant")]
    reference = prepare(
        make_model(
            [helper.make_node("Relu", ["x"], ["q"], name="quant")],
            [tensor_info("x", F, [4])],
            [tensor_info("q", F, [4])],
        )
    )
    candidate = make_model(nodes, [tensor_info("x", F, [4])], [tensor_info("q", TensorProto.INT4, [4])], opset=21)
    candidate.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array(1.0, np.float32), "s"),
            helper.make_tensor("z", TensorProto.INT4, [], [0]),
        ]
    )
    candidate.ir_version = 10
    (match,) = match_values(prepare(candidate), [reference.graph.outputs[0]]).values()
    assert match.candidate is None
