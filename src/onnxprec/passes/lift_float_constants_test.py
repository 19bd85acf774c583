"""LiftFloatConstantsPass: float Constant nodes become initializers of their own graph; others stay."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.passes import LiftFloatConstantsPass


def _constant(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name=name), name=name)


def _array(value: ir.Value) -> np.ndarray:
    assert value.const_value is not None
    return value.const_value.numpy()


def test_lifts_float_constants_only_and_once() -> None:
    nodes = [
        _constant("w", np.array([1.5, -2.0], np.float32)),
        helper.make_node("Constant", [], ["s"], value_float=0.5, name="s"),
        _constant("shape", np.array([2], np.int64)),
        _constant("out_const", np.array([3.0, 4.0], np.float32)),
        helper.make_node("Mul", ["X", "w"], ["m"], name="mul"),
        helper.make_node("Mul", ["m", "s"], ["r"], name="scale"),
        helper.make_node("Reshape", ["r", "shape"], ["Y"], name="reshape"),
    ]
    outputs = [tensor_info("Y", F, [2]), tensor_info("out_const", F, [2])]
    model = ir.from_proto(make_model(nodes, [tensor_info("X", F, [2])], outputs))
    lift = LiftFloatConstantsPass()
    assert lift(model).modified
    inits = model.graph.initializers
    assert sorted(inits) == ["s", "w"]
    assert [inits[name].dtype for name in ("s", "w")] == [ir.DataType.FLOAT, ir.DataType.FLOAT]
    np.testing.assert_array_equal(_array(inits["w"]), [1.5, -2.0])
    np.testing.assert_array_equal(_array(inits["s"]), 0.5)
    mul = next(n for n in model.graph if n.name == "mul")
    assert mul.inputs[1] is inits["w"]
    # The INT64 shape and the Constant that is a graph output stay nodes.
    assert sorted(str(n.name) for n in model.graph if n.op_type == "Constant") == ["out_const", "shape"]
    assert not lift(model).modified


def test_lifts_into_the_branch_that_holds_the_constant() -> None:
    then_graph = helper.make_graph(
        [_constant("k", np.array([2.0, 3.0], np.float32)), helper.make_node("Mul", ["X", "k"], ["t"], name="mul")],
        "then",
        [],
        [tensor_info("t", F, [2])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["e"], name="neg")], "else", [], [tensor_info("e", F, [2])]
    )
    nodes = [helper.make_node("If", ["C"], ["Y"], then_branch=then_graph, else_branch=else_graph, name="if")]
    inputs = [tensor_info("X", F, [2]), tensor_info("C", TensorProto.BOOL, [])]
    model = ir.from_proto(make_model(nodes, inputs, [tensor_info("Y", F, [2])]))
    assert LiftFloatConstantsPass()(model).modified
    branch = next(iter(model.graph)).attributes["then_branch"].as_graph()
    assert list(branch.initializers) == ["k"] and not model.graph.initializers
    assert [n.op_type for n in branch] == ["Mul"]
    assert not LiftFloatConstantsPass()(model).modified
