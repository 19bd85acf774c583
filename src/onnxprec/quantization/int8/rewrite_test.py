"""Rewrites on a layer whose output is a graph output: the output keeps its name, however many terms are added."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._graph import NameAllocator
from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.algorithms.qtypes import UINT8
from onnxprec.quantization.int8.rewrite import add_bias, gather_channels, insert_split


def test_bias_correction_and_outlier_split_on_a_graph_output() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    proto = make_model([helper.make_node("MatMul", ["x", "w"], ["logits"], name="head")],
                       [tensor_info("x", F, [3, 8])], [tensor_info("logits", F, [3, 5])], {"w": w})  # fmt: skip
    model = ir.serde.deserialize_model(proto)
    names = NameAllocator(model)
    node = next(iter(model.graph))
    bias = rng.standard_normal(5).astype(np.float32)
    rows = rng.standard_normal((2, 5)).astype(np.float32)
    add_bias(model.graph, node, bias, names)
    gathered = gather_channels(model.graph, model.graph.inputs[0], np.array([1, 6]), names)
    insert_split(model.graph, node, gathered, rows, names)
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == ["logits"]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    (got,) = run(out, {"x": x})
    assert np.allclose(got, x @ w + bias + x[:, [1, 6]] @ rows, atol=1e-5)


@pytest.mark.parametrize("two_parts", [False, True])
def test_a_pointwise_conv_as_matmul_integer_to_float_computes_the_dequantized_conv(two_parts: bool) -> None:
    """INT32 sums of the UINT8 input and INT8 weight, rescaled to float: the float Conv of the dequantized values;
    with a second INT8 part (the first's rounding error, rounded), the weight is 100 times finer."""
    from onnxprec.quantization.int8.integer_ops import replace_with_matmul_integer_to_float
    from onnxprec.quantization.int8.rewrite import WeightRecipe, insert_qdq

    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 5, 1, 1)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="pw", kernel_shape=[1, 1])
    io = [tensor_info("x", F, [2, 5, 4, 3])], [tensor_info("y", F, [2, 6, 4, 3])]
    proto = make_model([conv], *io, {"w": w, "b": b})
    model = ir.serde.deserialize_model(proto)
    names = NameAllocator(model)
    node = next(iter(model.graph))
    x_scale, x_zero = 0.02, 100
    insert_qdq(model.graph, model.graph.inputs[0], x_scale, x_zero, qtype=UINT8, names=names)
    scales = np.abs(w).reshape(6, -1).max(1) / 127
    recipe = WeightRecipe(node.inputs[1].const_value, 0, scales.astype(np.float32))  # type: ignore[union-attr,arg-type]
    wq = np.clip(np.rint(w.reshape(6, 5) / scales[:, None]), -127, 127) * scales[:, None]
    residual = None
    if two_parts:
        error = w.reshape(6, 5) - wq
        r_scales = np.abs(error).max(1) / 127
        residual = (np.clip(np.rint(error / r_scales[:, None]), -127, 127).astype(np.int8), r_scales)
        wq = wq + residual[0] * r_scales[:, None]
        assert np.abs(wq - w.reshape(6, 5)).max() < 0.01 * np.abs(error).max()
    replace_with_matmul_integer_to_float(model.graph, node, recipe, b.astype(np.float64), names, residual=residual)
    model.opset_imports.setdefault("com.microsoft", 1)
    out = ir.serde.serialize_model(model)
    ops = ["QuantizeLinear", "Transpose", "MatMulIntegerToFloat", "Transpose"]
    if two_parts:
        ops[3:3] = ["MatMulIntegerToFloat", "Add"]
    assert [n.op_type for n in out.graph.node] == ops
    assert [o.name for o in out.graph.output] == ["y"] and "w" not in {i.name for i in out.graph.initializer}
    x = (rng.random((2, 5, 4, 3)) * 4 - 1.5).astype(np.float32)
    (got,) = run(out, {"x": x})
    xq = (np.clip(np.rint(x / x_scale) + x_zero, 0, 255) - x_zero) * x_scale
    expected = np.einsum("oc,nchw->nohw", wq, xq) + b[None, :, None, None]
    assert got.shape == (2, 6, 4, 3) and np.allclose(got, expected, atol=1e-4)
