"""NameNodesPass: unique node and value names across graphs; renamed values remember their old names."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from onnx import TensorProto, helper

from onnxprec._graph import ORIGINAL_NAME
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.passes import NameNodesPass

_F = ir.DataType.FLOAT


def _value(name: str) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(_F), shape=ir.Shape([2]))


def test_unnamed_nodes_get_op_type_names_unique_across_branches() -> None:
    branches = {
        name: helper.make_graph([helper.make_node("Relu", ["X"], [out])], name, [], [tensor_info(out, F, [2])])
        for name, out in (("then_branch", "t"), ("else_branch", "e"))
    }
    nodes = [
        helper.make_node("Relu", ["X"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("If", ["C"], ["Y"], **branches),
    ]
    inputs = [tensor_info("X", F, [2]), tensor_info("C", TensorProto.BOOL, [])]
    model = ir.from_proto(make_model(nodes, inputs, [tensor_info("Y", F, [2])]))
    name = NameNodesPass()
    assert name(model).modified
    assert [n.name for n in model.graph.all_nodes()] == ["Relu", "Relu_1", "If", "Relu_2", "Relu_3"]
    assert not name(model).modified


def test_duplicate_value_names_are_fixed_and_the_old_name_survives_saving(tmp_path: Path) -> None:
    x, cond = _value("X"), ir.Value(name="C", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    first = ir.Node("", "Relu", [x], outputs=[_value("v")], name="first")
    second = ir.Node("", "Neg", [first.outputs[0]], outputs=[_value("v")], name="second")
    branches = []
    for branch in ("then_branch", "else_branch"):
        inner = ir.Node("", "Abs", [second.outputs[0]], outputs=[_value("v")], name=f"abs_{branch}")
        branches.append(ir.AttrGraph(branch, ir.Graph([], inner.outputs, nodes=[inner], name=branch)))
    if_node = ir.Node("", "If", [cond], attributes=branches, outputs=[_value("Y")], name="if")
    graph = ir.Graph([x, cond], if_node.outputs, nodes=[first, second, if_node], opset_imports={"": 17})
    model = ir.Model(graph, ir_version=10)
    assert NameNodesPass()(model).modified
    outputs = [n.outputs[0] for n in model.graph.all_nodes() if n.op_type != "If"]
    assert len({v.name for v in outputs}) == 4
    assert outputs[0].name == "v" and ORIGINAL_NAME not in outputs[0].metadata_props
    assert [v.metadata_props[ORIGINAL_NAME] for v in outputs[1:]] == ["v", "v", "v"]
    assert not NameNodesPass()(model).modified

    ir.save(model, tmp_path / "named.onnx")
    loaded = ir.load(tmp_path / "named.onnx")
    renamed = {n.outputs[0].name: n.outputs[0].metadata_props.get(ORIGINAL_NAME) for n in loaded.graph.all_nodes()}
    assert renamed == {v.name: v.metadata_props.get(ORIGINAL_NAME) for v in [*outputs, if_node.outputs[0]]}
