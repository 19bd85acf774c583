"""Checks that onnxruntime's CUDA provider runs: one MatMul session on CUDAExecutionProvider, compared with numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

graph = helper.make_graph(
    [helper.make_node("MatMul", ["a", "b"], ["c"])], "check",
    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [64, 64]),
     helper.make_tensor_value_info("b", TensorProto.FLOAT, [64, 64])],
    [helper.make_tensor_value_info("c", TensorProto.FLOAT, [64, 64])],
)  # fmt: skip
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
a, b = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)
(c,) = session.run(None, {"a": a, "b": b})
error = float(np.abs(c - a @ b).max())
print("onnxruntime", ort.__version__, "onnx", onnx.__version__, session.get_providers(), "max error", error)
assert session.get_providers()[0] == "CUDAExecutionProvider"
