"""WidenMovementIslandsPass: data movement between casts from and back to FP32 returns to FP32; compute stays low."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxprec._graph import ORIGINAL_NAME
from onnxprec._testing import BF16, F16, F, make_model, run, tensor_info
from onnxprec.passes import InferTypesPass, WidenMovementIslandsPass, WidenMovementIslandsResult

RNG = np.random.default_rng(0)


def _typed(proto: onnx.ModelProto) -> ir.Model:
    model = ir.from_proto(proto)
    InferTypesPass()(model)
    return model


def _widen(model: ir.Model) -> WidenMovementIslandsResult:
    result = WidenMovementIslandsPass()(model)
    assert isinstance(result, WidenMovementIslandsResult)
    return result


def _ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def _checked(model: ir.Model) -> onnx.ModelProto:
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def test_island_of_data_movement_returns_to_fp32_exactly() -> None:
    # X -> bf16 -> Transpose -> Reshape -> fp32 (graph output Y, its Cast named as cast_graph_output names it),
    # and the Transpose's value read once more, through its own Cast, by an FP32 Relu.
    nodes = [
        helper.make_node("Cast", ["X"], ["x16"], to=BF16, name="down"),
        helper.make_node("Transpose", ["x16"], ["t"], perm=[1, 0], name="transpose"),
        helper.make_node("Shape", ["t"], ["shape_t"], name="shape"),
        helper.make_node("Reshape", ["t", "shape_t"], ["Y_pre_cast"], name="reshape"),
        helper.make_node("Cast", ["Y_pre_cast"], ["Y"], to=F, name="up"),
        helper.make_node("Cast", ["t"], ["t32"], to=F, name="up_t"),
        helper.make_node("Relu", ["t32"], ["Z"], name="relu"),
    ]
    proto = make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [3, 2]), tensor_info("Z", F, [3, 2])])
    model = _typed(proto)
    model.graph.outputs[0].producer().inputs[0].metadata_props[ORIGINAL_NAME] = "Y"  # type: ignore[union-attr]
    result = _widen(model)
    assert result.modified and result.casts_removed == 3
    assert [node.name for node in result.widened] == ["transpose", "reshape"]
    assert _ops(model) == ["Transpose", "Shape", "Reshape", "Relu"]
    out = model.graph.outputs[0]
    assert out.name == "Y" and out.dtype == ir.DataType.FLOAT and ORIGINAL_NAME not in out.metadata_props
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    got = run(_checked(model), {"X": x})
    np.testing.assert_array_equal(got[0], x.T)  # exact: no bf16 rounding left
    np.testing.assert_array_equal(got[1], np.maximum(x.T, 0))
    assert not _widen(model).modified


def test_island_with_a_compute_op_stays_low() -> None:
    nodes = [
        helper.make_node("Cast", ["X"], ["x16"], to=F16, name="down"),
        helper.make_node("Transpose", ["x16"], ["t"], perm=[1, 0], name="transpose"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Cast", ["f"], ["Y"], to=F, name="up"),
    ]
    model = _typed(make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [3, 2])]))
    before = _ops(model)
    assert not _widen(model).modified
    assert _ops(model) == before
    assert all(node.outputs[0].dtype == ir.DataType.FLOAT16 for node in model.graph if node.op_type != "Cast")


def test_weights_stored_low_and_low_graph_io_keep_their_island() -> None:
    # A Gather of an FP16 embedding reads a weight, not a Cast; a low graph input or output is the user's interface.
    table = RNG.standard_normal((5, 4)).astype(np.float16)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["g"], name="embed"),
        helper.make_node("Cast", ["g"], ["Y"], to=F, name="up"),
        helper.make_node("Transpose", ["H"], ["Z"], perm=[1, 0], name="low_io"),
    ]
    inputs = [tensor_info("ids", onnx.TensorProto.INT64, [3]), tensor_info("H", F16, [2, 3])]
    outputs = [tensor_info("Y", F, [3, 4]), tensor_info("Z", F16, [3, 2])]
    model = _typed(make_model(nodes, inputs, outputs, {"E": table}))
    assert not _widen(model).modified
    assert model.graph.initializers["E"].dtype == ir.DataType.FLOAT16


def test_shared_cast_stays_for_its_low_compute_reader_and_constant_fill_widens() -> None:
    nodes = [
        helper.make_node("Cast", ["X"], ["x16"], to=F16, name="down"),
        helper.make_node("Relu", ["x16"], ["r"], name="relu"),  # compute: keeps reading the Cast
        helper.make_node("Unsqueeze", ["x16", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Cast", ["u"], ["U"], to=F, name="up_u"),
        helper.make_node("Cast", ["r"], ["R"], to=F, name="up_r"),
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["zeros"],
            value=helper.make_tensor("v", F16, [1], [1.5]),
            name="fill",
        ),
        helper.make_node("Cast", ["zeros"], ["Z"], to=F, name="up_zeros"),
    ]
    inits = {"axes": np.array([0], dtype=np.int64), "shape": np.array([2], dtype=np.int64)}
    outputs = [tensor_info("U", F, [1, 3]), tensor_info("R", F, [3]), tensor_info("Z", F, [2])]
    model = _typed(make_model(nodes, [tensor_info("X", F, [3])], outputs, inits))
    result = _widen(model)
    assert sorted(node.name for node in result.widened) == ["fill", "unsqueeze"]
    assert result.casts_removed == 2
    assert [node.name for node in model.graph if node.op_type == "Cast"] == ["down", "up_r"]
    relu = next(node for node in model.graph if node.name == "relu")
    assert relu.inputs[0] is not None and relu.inputs[0].name == "x16" and relu.outputs[0].dtype == ir.DataType.FLOAT16
    x = np.array([-1.0, 0.1, 3.3], dtype=np.float32)
    u, _, z = run(_checked(model), {"X": x})
    np.testing.assert_array_equal(u, x[None])
    np.testing.assert_array_equal(z, [1.5, 1.5])
