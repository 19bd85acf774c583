"""FoldPadIntoConvPass: exact, and only where a Pad is the Conv's own zero padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.passes.fold_pad_into_conv import FoldPadIntoConvPass, constant_value


def _model(pads: list[int], mode: str = "constant", computed: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "pads": np.array(pads, np.int64)}
    nodes = []
    pads_name = "pads"
    if computed:  # as PyTorch exports F.pad: the pads computed from constants
        inits["half"] = np.array(pads[:4], np.int64)
        inits["rest"] = np.array(pads[4:], np.int64)
        nodes.append(helper.make_node("Concat", ["half", "rest"], ["computed"], axis=0))
        pads_name = "computed"
    nodes += [
        helper.make_node("Pad", ["x", pads_name], ["p"], mode=mode, name="pad"),
        helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 0, 0, 1], name="conv"),
    ]
    return make_model(nodes, [tensor_info("x", F, [1, 3, 9, 9])], [tensor_info("y", F, None)], inits)


@pytest.mark.parametrize("computed", [False, True])
def test_zero_pad_folds_exactly(computed: bool) -> None:
    proto = _model([0, 0, 1, 2, 0, 0, 2, 1], computed=computed)
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype(np.float32)
    (expected,) = run(proto, {"x": x})
    model = ir.serde.deserialize_model(proto)
    assert FoldPadIntoConvPass()(model).modified
    assert [n.op_type for n in model.graph if n.op_type != "Concat"] == ["Conv"]
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert list(conv.attributes["pads"].as_ints()) == [2, 2, 2, 2]
    (got,) = run(ir.serde.serialize_model(model), {"x": x})
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("pads, mode", [([0, 1, 1, 1, 0, 0, 1, 1], "constant"), ([0, 0, 1, 1, 0, 0, 1, 1], "reflect")])
def test_channel_pads_and_other_modes_stay(pads: list[int], mode: str) -> None:
    model = ir.serde.deserialize_model(_model(pads, mode))
    assert not FoldPadIntoConvPass()(model).modified
    assert [n.op_type for n in model.graph] == ["Pad", "Conv"]


def test_constant_value_reads_initializers_and_computed_constants_only() -> None:
    model = ir.serde.deserialize_model(_model([0, 0, 1, 1, 0, 0, 1, 1], computed=True))
    pad = next(n for n in model.graph if n.op_type == "Pad")
    assert constant_value(pad.inputs[1]).tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert constant_value(pad.inputs[0]) is None  # the graph input


def test_a_pad_that_two_convs_read_stays_and_the_folded_conv_keeps_its_name_and_attributes() -> None:
    shared = _model([0, 0, 1, 1, 0, 0, 1, 1])
    shared.graph.node.append(helper.make_node("Conv", ["p", "w"], ["z"], kernel_shape=[3, 3], name="other"))
    shared.graph.output.append(tensor_info("z", F, None))
    model = ir.serde.deserialize_model(shared)
    assert not FoldPadIntoConvPass()(model).modified
    assert [n.op_type for n in model.graph] == ["Pad", "Conv", "Conv"]

    model = ir.serde.deserialize_model(_model([0, 0, 1, 1, 0, 0, 1, 1]))
    FoldPadIntoConvPass()(model)
    (conv,) = model.graph
    assert conv.name == "conv" and list(conv.attributes) == ["kernel_shape", "pads"] and not conv.metadata_props
    assert conv.outputs[0].name == "y"
