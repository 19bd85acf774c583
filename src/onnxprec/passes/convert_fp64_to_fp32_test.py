"""ConvertFp64ToFp32Pass: FP32 inside (clamped, names kept), FP64 at the model's inputs and outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from onnxprec._graph import ORIGINAL_NAME, all_values
from onnxprec._io import load_model, save_model
from onnxprec._testing import make_model, run, tensor_info
from onnxprec.passes import ConvertFp64ToFp32Pass

D = TensorProto.DOUBLE
FLT_MAX = float(np.finfo(np.float32).max)


def _casts(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph.all_nodes() if n.op_type == "Cast"]


def _doubles(model: ir.Model) -> set[ir.Value]:
    return {v for v in all_values(model.graph) if v.dtype == ir.DataType.DOUBLE}


def _model() -> onnx.ModelProto:
    constant = numpy_helper.from_array(np.array([-1e300, 2.0, 0.5]), name="c")
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["m"], name="mul"),
        helper.make_node("Constant", [], ["c"], value=constant, name="const"),
        helper.make_node("Add", ["m", "c"], ["a"], name="add"),
        helper.make_node("Cast", ["a"], ["d"], to=D, name="cast"),
        helper.make_node("Relu", ["d"], ["Y"], name="relu"),
    ]
    w = np.array([1e300, -1e300, -1e-300])
    return make_model(nodes, [tensor_info("X", D, [3])], [tensor_info("Y", D, [3])], {"W": w})


def test_converts_inside_clamped_keeping_names_and_double_io() -> None:
    proto = _model()
    model = ir.from_proto(proto)
    convert = ConvertFp64ToFp32Pass()
    assert convert(model).modified
    graph = model.graph
    w = graph.initializers["W"]
    assert w.dtype == ir.DataType.FLOAT and w.const_value is not None and w.const_value.name == "W"
    got = w.const_value.numpy()
    assert list(got[:2]) == [FLT_MAX, -FLT_MAX] and got[2] == 0 and np.signbit(got[2])
    const = next(n for n in graph if n.name == "const").attributes["value"].as_tensor()
    assert const.dtype == ir.DataType.FLOAT and const.name == "c" and list(const.numpy()) == [-FLT_MAX, 2.0, 0.5]
    assert next(n for n in graph if n.name == "cast").attributes["to"].as_int() == ir.DataType.FLOAT
    assert len(_casts(model)) == 3  # the model's own Cast plus one boundary cast for X and one for Y
    assert _doubles(model) == {*graph.inputs, *graph.outputs}
    assert [v.name for v in graph.inputs] == ["X"] and [v.name for v in graph.outputs] == ["Y"]

    x = np.array([1.0, -1.0, 1.0])
    converted = ir.to_proto(model)
    onnx.checker.check_model(converted, full_check=True)
    np.testing.assert_array_equal(run(converted, {"X": x})[0], [0.0, FLT_MAX, 0.5])

    assert not convert(model).modified
    assert len(_casts(model)) == 3


def test_renamed_output_value_keeps_its_public_name_through_saving(tmp_path: Path) -> None:
    model = ir.from_proto(_model())
    ConvertFp64ToFp32Pass()(model)
    cast = model.graph.outputs[0].producer()
    assert cast is not None and cast.op_type == "Cast"
    pre_cast = cast.inputs[0]
    assert pre_cast is not None and pre_cast.name == "Y_pre_cast"
    assert pre_cast.metadata_props[ORIGINAL_NAME] == "Y"
    path = save_model(model, tmp_path / "fp32.onnx")
    loaded = load_model(path)
    relu = next(n for n in loaded.graph if n.op_type == "Relu")
    assert relu.outputs[0].name == "Y_pre_cast" and relu.outputs[0].metadata_props[ORIGINAL_NAME] == "Y"


def test_loop_state_and_body_are_converted() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond"),
            helper.make_node("Mul", ["s_in", "K"], ["m"], name="body_mul"),
            helper.make_node("Add", ["m", "X"], ["s_out"], name="body_add"),
        ],
        "body",
        [tensor_info("i", TensorProto.INT64, []), tensor_info("cond_in", TensorProto.BOOL, []), tensor_info("s_in", D)],
        [tensor_info("cond_out", TensorProto.BOOL, []), tensor_info("s_out", D)],
    )
    nodes = [
        helper.make_node("Loop", ["N", "", "S0"], ["S"], body=body, name="loop"),
        helper.make_node("Relu", ["S"], ["Y"], name="relu"),
    ]
    inputs = [tensor_info("X", D, [2]), tensor_info("S0", D, [2]), tensor_info("N", TensorProto.INT64, [])]
    proto = make_model(nodes, inputs, [tensor_info("Y", D, [2])], {"K": np.array([0.5, 0.25])})
    model = ir.from_proto(proto)
    convert = ConvertFp64ToFp32Pass()
    assert convert(model).modified
    loop = next(n for n in model.graph if n.op_type == "Loop")
    body_graph = loop.attributes["body"].as_graph()
    assert body_graph.inputs[2].dtype == ir.DataType.FLOAT
    assert _doubles(model) == {*model.graph.inputs[:2], *model.graph.outputs}
    assert len(_casts(model)) == 3  # X, S0 and Y

    feeds = {"X": np.array([1.0, 2.0]), "S0": np.array([0.0, 1.0]), "N": np.array(3)}
    np.testing.assert_allclose(run(ir.to_proto(model), feeds)[0], run(proto, feeds)[0], rtol=1e-6)
    assert not convert(model).modified
