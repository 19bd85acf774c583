"""WidenToFp32Pass: FP16/BF16 -> FP32 exactly, names, nodes and values kept, the interface retyped too."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._graph import all_values
from onnxprec._testing import make_model, run, tensor_info
from onnxprec.passes import WidenToFp32Pass


def test_widen_makes_fp16_and_bf16_fp32_exactly_keeping_names() -> None:
    """FP16/BF16 values, weights, Cast targets and the interface become FP32; names and nodes stay; values exact."""
    w = np.array([65504.0, -1.5, 2.0**-24], np.float16)
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["m"], name="mul"),
        helper.make_node("Cast", ["m"], ["b"], to=TensorProto.BFLOAT16, name="to_bf16"),
        helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT, name="to_fp32"),
        helper.make_node("Relu", ["f"], ["Y"], name="relu"),
    ]
    proto = make_model(nodes, [tensor_info("X", TensorProto.FLOAT16, [3])], [tensor_info("Y", TensorProto.FLOAT, [3])],
                       {"W": w})  # fmt: skip
    model = ir.from_proto(proto)
    assert WidenToFp32Pass()(model).modified
    graph = model.graph
    assert {v.dtype for v in all_values(graph) if v.dtype is not None} == {ir.DataType.FLOAT}
    assert [n.name for n in graph] == ["mul", "to_bf16", "to_fp32", "relu"]
    assert next(n for n in graph if n.name == "to_bf16").attributes["to"].as_int() == ir.DataType.FLOAT
    w32 = graph.initializers["W"].const_value
    assert w32 is not None and list(w32.numpy()) == list(w.astype(np.float32))
    x = np.array([1.0, 2.0, -3.0], np.float32)
    np.testing.assert_array_equal(run(ir.to_proto(model), {"X": x})[0], np.maximum(x * w.astype(np.float32), 0))
    assert not WidenToFp32Pass()(model).modified
