"""TensorRT placement's GEMV rule as ModelOpt 0.47 applies it: judged on the output shape at batch 1."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec.quantization.int8.place import batch_one_shapes, place


def _model(batch: int | str) -> ir.Model:
    """Tokens ``X [batch, 8, 64]`` through a MatMul (3-D output), mean-pooled by a Reshape and ReduceMean to
    ``[batch, 64]``, then a classifier Gemm (2-D output: a GEMV at batch 1 when the batch is dynamic)."""
    rng = np.random.default_rng(0)
    h = onnx.helper
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("W", (64, 64)), ("C", (64, 32)), ("B", (32,)))]  # fmt: skip
    inits.append(onnx.numpy_helper.from_array(np.array([-1, 8, 64], np.int64), "shape"))
    nodes = [
        h.make_node("MatMul", ["X", "W"], ["t"], name="tokens"),
        h.make_node("Reshape", ["t", "shape"], ["r"]),
        h.make_node("ReduceMean", ["r"], ["p"], axes=[1], keepdims=0),
        h.make_node("Gemm", ["p", "C", "B"], ["Y"], name="head"),
    ]
    graph = h.make_graph(nodes, "head", [h.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [batch, 8, 64])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [batch, 32])], inits)  # fmt: skip
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]))


def test_batch_one_shapes_set_the_dynamic_batch_to_one_and_follow_it_through_the_graph() -> None:
    model = _model("batch")
    assert batch_one_shapes(model, ["t", "Y"]) == {"t": (1, 8, 64), "Y": (1, 32)}
    assert model.graph.inputs[0].shape == ir.Shape([ir.SymbolicDim("batch"), 8, 64])  # the model is unchanged
    assert batch_one_shapes(_model(4), ["t", "Y"]) == {"t": (4, 8, 64), "Y": (4, 32)}


@pytest.mark.parametrize("fp8", [False, True])
def test_a_classifier_gemm_on_a_dynamic_batch_stays_float_for_tensorrt_as_modelopt_leaves_it(fp8: bool) -> None:
    plan = place(_model("batch"), "trt", fp8=fp8)
    assert [layer.node.name for layer in plan.layers] == ["tokens"]  # a 3-D output is not a GEMV, even of one row
    assert plan.skipped == [("head", "TensorRT: a GEMV (one output row at batch 1) stays float (name it in "
                                      "nodes_to_quantize)")]  # fmt: skip
    static = place(_model(4), "trt", fp8=fp8)  # four rows: a GEMM
    assert [layer.node.name for layer in static.layers] == ["tokens", "head"] and not static.skipped
    cpu = place(_model("batch"), "ort-cpu")  # the rule is TensorRT's
    assert [layer.node.name for layer in cpu.layers] == ["tokens", "head"]
