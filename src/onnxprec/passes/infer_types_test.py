"""InferTypesPass: ONNX shape inference plus guessed types for custom ops, subgraphs included."""

from __future__ import annotations

import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._testing import F16, F, make_model, tensor_info
from onnxprec.passes import InferTypesPass


def _value(model: ir.Model, name: str) -> ir.Value:
    return next(v for n in model.graph.all_nodes() for v in n.outputs if v.name == name)


def test_infers_types_and_shapes_then_changes_nothing() -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["c"], to=F16, name="cast"),
        helper.make_node("Shape", ["c"], ["Y"], name="shape"),
    ]
    proto = make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", TensorProto.INT64, [2])])
    model = ir.from_proto(proto)
    infer = InferTypesPass()
    assert infer(model).modified
    assert _value(model, "r").dtype == ir.DataType.FLOAT and _value(model, "r").shape == ir.Shape([2, 3])
    assert _value(model, "c").dtype == ir.DataType.FLOAT16
    assert not infer(model).modified


def test_guesses_custom_op_outputs_from_the_first_float_input() -> None:
    nodes = [
        helper.make_node("Fused", ["I", "X"], ["f"], domain="my.domain", name="fused"),
        helper.make_node("Identity", ["f"], ["Y"], name="id"),
    ]
    inputs = [tensor_info("I", TensorProto.INT64, [2]), tensor_info("X", F16, [2])]
    proto = make_model(nodes, inputs, [tensor_info("Y", F16, [2])], extra_opsets={"my.domain": 1})
    model = ir.from_proto(proto)
    assert InferTypesPass()(model).modified
    assert _value(model, "f").dtype == ir.DataType.FLOAT16
    assert not InferTypesPass()(model).modified


def test_types_values_inside_if_branches() -> None:
    branches = {
        name: helper.make_graph(
            [
                helper.make_node("Fused", ["X"], [f"{out}_f"], domain="my.domain", name=f"fused_{out}"),
                helper.make_node("Neg", [f"{out}_f"], [out], name=f"neg_{out}"),
            ],
            name,
            [],
            [tensor_info(out, F, [2])],
        )
        for name, out in (("then_branch", "t"), ("else_branch", "e"))
    }
    nodes = [helper.make_node("If", ["C"], ["Y"], name="if", **branches)]
    inputs = [tensor_info("X", F, [2]), tensor_info("C", TensorProto.BOOL, [])]
    proto = make_model(nodes, inputs, [tensor_info("Y", F, [2])], extra_opsets={"my.domain": 1})
    model = ir.from_proto(proto)
    assert InferTypesPass()(model).modified
    inner = [v for n in model.graph.all_nodes() if n.op_type == "Fused" for v in n.outputs]
    assert [v.dtype for v in inner] == [ir.DataType.FLOAT, ir.DataType.FLOAT]
    assert not InferTypesPass()(model).modified


def test_sequence_and_optional_types_are_kept_whole() -> None:
    # Issue 9, cause 4: onnx-ir's merge copied only the element type, so seq(tensor(float)) became tensor(float).
    nodes = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=F, name="empty"),
        helper.make_node("SequenceInsert", ["empty", "X"], ["seq"], name="insert"),
        helper.make_node("Optional", ["X"], ["opt"], name="optional"),
        helper.make_node("OptionalGetElement", ["opt"], ["x2"], name="get"),
        helper.make_node("ConcatFromSequence", ["seq"], ["Y"], axis=0, name="concat"),
    ]
    proto = make_model(nodes, [tensor_info("X", F, [2])], [tensor_info("Y", F, None)], opset=18)
    model = ir.from_proto(proto)
    assert InferTypesPass()(model).modified
    seq = _value(model, "seq")
    assert isinstance(seq.type, ir.SequenceType) and seq.dtype == ir.DataType.FLOAT
    assert isinstance(_value(model, "empty").type, ir.SequenceType)
    assert isinstance(_value(model, "opt").type, ir.OptionalType)
    assert isinstance(_value(model, "x2").type, ir.TensorType)
    assert not InferTypesPass()(model).modified
