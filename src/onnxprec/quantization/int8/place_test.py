"""TensorRT placement's GEMV rule as ModelOpt 0.47 applies it: judged on the output shape at batch 1."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec.quantization.int8.place import batch_one_shapes, place

GEMV = (
    "TensorRT: a GEMV at batch 1 (an output of 1 or 2 axes, one of them 1) stays float (name it in nodes_to_quantize)"
)
h = onnx.helper


def _weights(*shapes: tuple[str, tuple[int, ...]]) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), name) for name, s in shapes]


def _model(batch: int | str, rows: int | str = 8) -> ir.Model:
    """Tokens ``X [batch, rows, 64]`` through a MatMul (3-D output), mean-pooled by a Reshape and ReduceMean to
    ``[batch, 64]``, then a classifier Gemm (2-D output: a GEMV at batch 1 when the batch is dynamic)."""
    inits = _weights(("W", (64, 64)), ("C", (64, 32)), ("B", (32,)))
    inits.append(onnx.numpy_helper.from_array(np.array([0, -1, 64], np.int64), "shape"))
    nodes = [
        h.make_node("MatMul", ["X", "W"], ["t"], name="tokens"),
        h.make_node("Reshape", ["t", "shape"], ["r"]),
        h.make_node("ReduceMean", ["r"], ["p"], axes=[1], keepdims=0),
        h.make_node("Gemm", ["p", "C", "B"], ["Y"], name="head"),
    ]
    graph = h.make_graph(nodes, "head", [h.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [batch, rows, 64])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [batch, 32])], inits)  # fmt: skip
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]))


def test_batch_one_shapes_set_the_dynamic_batch_to_one_and_follow_it_through_the_graph() -> None:
    model = _model("batch")
    assert batch_one_shapes(model, ["t", "Y"]) == {"t": (1, 8, 64), "Y": (1, 32)}
    assert model.graph.inputs[0].shape == ir.Shape([ir.SymbolicDim("batch"), 8, 64])  # the model is unchanged
    assert batch_one_shapes(_model(4), ["t", "Y"]) == {"t": (4, 8, 64), "Y": (4, 32)}
    # other dynamic axes keep the data's sizes (unknown here), as ModelOpt splits the data along the first axis only
    assert batch_one_shapes(_model("batch", "seq"), ["t"]) == {"t": (1, None, 64)}
    # ModelOpt's calibration_shapes: every dynamic axis 1, then the given shapes
    assert batch_one_shapes(_model("batch", "seq"), ["t"], "X:4x16x64") == {"t": (4, 16, 64)}
    assert batch_one_shapes(_model("batch"), ["t"], {"other": [2]}) == {"t": (1, 8, 64)}


@pytest.mark.parametrize("fp8", [False, True])
def test_a_classifier_gemm_on_a_dynamic_batch_stays_float_for_tensorrt_as_modelopt_leaves_it(fp8: bool) -> None:
    plan = place(_model("batch"), "trt", fp8=fp8)
    assert [layer.node.name for layer in plan.layers] == ["tokens"]  # [1, 8, 64] at batch 1: eight rows
    assert plan.skipped == [("head", GEMV)]
    static = place(_model(4), "trt", fp8=fp8)  # four rows: a GEMM
    assert [layer.node.name for layer in static.layers] == ["tokens", "head"] and not static.skipped
    one_row = place(_model("batch", 1), "trt", fp8=fp8)  # [1, 1, 64]: 3 axes, not a GEMV for ModelOpt
    assert [layer.node.name for layer in one_row.layers] == ["tokens"] and one_row.skipped == [("head", GEMV)]
    given = place(_model("batch"), "trt", fp8=fp8, input_shapes="X:4x8x64")  # ModelOpt's calibration_shapes
    assert [layer.node.name for layer in given.layers] == ["tokens", "head"]
    cpu = place(_model("batch"), "ort-cpu")  # the rule is TensorRT's
    assert [layer.node.name for layer in cpu.layers] == ["tokens", "head"]


def test_rows_that_depend_on_an_unknown_axis_are_a_gemm_and_an_unknown_batch_keeps_its_declared_name() -> None:
    """``[batch, seq, 64]`` flattened to ``[-1, 64]`` has unknown rows at batch 1 (quantized); behind an op shape
    inference cannot follow, an output the graph declares ``[batch, 32]`` is 1 row at batch 1 (float)."""
    inits = _weights(("W", (64, 64)), ("C", (64, 32)))
    inits.append(onnx.numpy_helper.from_array(np.array([-1, 64], np.int64), "flat"))
    nodes = [
        h.make_node("Reshape", ["X", "flat"], ["f"]),
        h.make_node("MatMul", ["f", "W"], ["t"], name="flat_tokens"),
        h.make_node("Custom", ["t"], ["c"], domain="com.example"),
        h.make_node("MatMul", ["c", "C"], ["Y"], name="head"),
    ]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["batch", "seq", 64])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["batch", 32])], inits)  # fmt: skip
    opsets = [h.make_opsetid("", 13), h.make_opsetid("com.example", 1)]
    model = ir.from_proto(h.make_model(graph, opset_imports=opsets))
    assert batch_one_shapes(model, ["t", "Y"]) == {"t": (None, 64), "Y": (1, 32)}
    plan = place(model, "trt")
    assert [layer.node.name for layer in plan.layers] == ["flat_tokens"] and plan.skipped == [("head", GEMV)]


def test_a_graph_input_with_an_initializer_keeps_its_rows() -> None:
    """A graph input that has an initializer (a default value) is not data ModelOpt splits: its first axis is not
    set to 1 (ModelOpt runs its 2 rows: a GEMM; here the rows stay unknown, and the head stays quantized)."""
    inits = _weights(("A", (2, 16)), ("C", (16, 32)))
    nodes = [h.make_node("Relu", ["A"], ["a"]), h.make_node("MatMul", ["a", "C"], ["Y"], name="head")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("A", onnx.TensorProto.FLOAT, ["n", 16])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["n", 32])], inits)  # fmt: skip
    model = ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]))
    assert batch_one_shapes(model, ["Y"]) == {"Y": (None, 32)}
    assert [layer.node.name for layer in place(model, "trt").layers] == ["head"]
