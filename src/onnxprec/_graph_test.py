"""Graph helpers: traversal into subgraphs, unique value/node/file names, Casts that keep names and types."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

from onnxprec._graph import (
    ORIGINAL_NAME,
    FileNames,
    NameAllocator,
    all_graphs,
    all_values,
    cast_graph_output,
    clone_model,
    insert_cast,
    original_name,
    rename_value,
    unique_name,
)
from onnxprec._testing import run

_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
main (bool c, float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    m = Mul (x, w)
    y = If <
        then_branch = then_g () => (float[2] t) { t = Neg (m) },
        else_branch = else_g () => (float[2] e) { e = Relu (m) }
    > (c)
}
"""


def _model() -> ir.Model:
    return ir.serde.deserialize_model(onnx.parser.parse_model(_MODEL))


def test_all_graphs_and_values_reach_into_if_branches() -> None:
    model = _model()
    assert [g.name for g in all_graphs(model.graph)] == ["main", "then_g", "else_g"]
    assert {v.name for v in all_values(model.graph)} >= {"c", "x", "w", "m", "y", "t", "e"}


# If bodies two deep in the first If's then branch, then a second If: the walk order is depth first.
_NESTED = """
<ir_version: 8, opset_import: ["" : 17]>
main (bool c, bool d, float[2] x) => (float[2] y, float[2] z) {
    y = If <then_branch = outer_then () => (float[2] t) {
        t = If <then_branch = inner_then () => (float[2] a) { a = Neg (x) },
                else_branch = inner_else () => (float[2] b) { b = Abs (x) }> (d)
    }, else_branch = outer_else () => (float[2] e) { e = Relu (x) }> (c)
    z = If <then_branch = second_then () => (float[2] f) { f = Sigmoid (x) },
            else_branch = second_else () => (float[2] g) { g = Tanh (x) }> (d)
}
"""


def test_all_graphs_lists_nested_bodies_in_onnx_irs_subgraphs_order() -> None:
    graph = ir.serde.deserialize_model(onnx.parser.parse_model(_NESTED)).graph
    expected = ["main", "outer_then", "inner_then", "inner_else", "outer_else", "second_then", "second_else"]
    assert [g.name for g in all_graphs(graph)] == expected
    assert list(all_graphs(graph)) == [graph, *graph.subgraphs()]


def test_a_clone_model_changed_in_place_leaves_the_model_as_it_was() -> None:
    model = _model()
    before = ir.serde.serialize_model(model).SerializeToString()
    clone = clone_model(model)
    for value in all_values(clone.graph):  # a dtype set in place (AutoCast's way) and a weight replaced
        if value.dtype == ir.DataType.FLOAT:
            value.dtype = ir.DataType.FLOAT16
    clone.graph.initializers["w"].const_value = ir.tensor(np.array([3.0, 4.0], np.float16))
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_a_sequence_retyped_on_the_clone_keeps_its_element_type_in_the_model() -> None:
    """A sequence's element type is an object of its own: setting the clone's ``dtype`` leaves the model's."""
    model = ir.serde.deserialize_model(
        onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 17]>
        g (float[2] x) => (seq(float[2]) s) { s = SequenceConstruct (x, x) }""")
    )
    clone = clone_model(model)
    clone.graph.outputs[0].dtype = ir.DataType.FLOAT16
    assert clone.graph.outputs[0].type == ir.SequenceType(ir.TensorType(ir.DataType.FLOAT16))
    assert model.graph.outputs[0].type == ir.SequenceType(ir.TensorType(ir.DataType.FLOAT))


def test_unique_names_never_collide_and_fold_case_for_files() -> None:
    used = {"a", "a_1"}
    assert [unique_name("a", used), unique_name("b", used), unique_name("a", used)] == ["a_2", "b", "a_3"]
    folded = {"index"}
    assert [unique_name("Index", folded, fold_case=True), unique_name("INDEX", folded, fold_case=True)] == [
        "Index_1", "INDEX_2",
    ]  # fmt: skip
    names = NameAllocator(_model())
    assert names("m") == "m_1" and names("m") == "m_2" and names("fresh") == "fresh"
    files = FileNames(reserved=("index",))
    assert [files("/a/b:c"), files("/A/B:C"), files("..hidden"), files("-x"), files("index"), files("")] == [
        "_a_b_c", "_A_B_C_1", "hidden", "_x", "index_1", "tensor",
    ]  # fmt: skip
    assert len(files("x" * 300)) == 180


def test_rename_records_the_first_name_only() -> None:
    value = ir.Value(name="first")
    rename_value(value, "second")
    rename_value(value, "third")
    assert value.name == "third" and value.metadata_props[ORIGINAL_NAME] == "first" and original_name(value) == "first"
    assert original_name(ir.Value(name="plain")) == "plain"


def test_cast_graph_output_keeps_the_public_name_and_the_model_runs() -> None:
    model = _model()
    names = NameAllocator(model)
    cast = cast_graph_output(model.graph, 0, ir.DataType.FLOAT16, names)
    assert model.graph.outputs[0].name == "y" and cast.inputs[0].name == "y_pre_cast"
    assert original_name(cast.inputs[0]) == "y"
    insert_cast(model.graph, model.graph.inputs[1], ir.DataType.DOUBLE, names)  # unused: after the inputs
    model.graph.outputs[0].type = ir.TensorType(ir.DataType.FLOAT16)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    (y,) = run(proto, {"c": np.array(True), "x": np.array([1.0, -3.0], np.float32)})
    assert y.dtype == np.float16 and y.tolist() == [-1.0, 6.0]


def test_tensor_attribute_reads_a_constant_value_and_refuses_other_types() -> None:
    import pytest

    from onnxprec._graph import tensor_attribute

    tensor = ir.Tensor(np.array([1.0], np.float32))
    assert tensor_attribute(ir.AttrTensor("value", tensor)) is tensor
    with pytest.raises(TypeError, match="not of type TENSOR"):
        tensor_attribute(ir.AttrFloat32("value_float", 1.0))
