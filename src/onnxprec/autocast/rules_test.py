"""Every classification rule, on tiny graphs, with the reference run where the rule needs data."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.autocast import AutoCastOptions, convert_model, convert_to_mixed_precision
from onnxprec.autocast.rules import NodeRuleBase, RuleContext, reduction_depth

INF = float("inf")


def _decisions(model: onnx.ModelProto, **kwargs: object) -> dict[str, tuple[bool, str]]:
    """Node name -> (low?, reason) after classification."""
    options = AutoCastOptions(**kwargs)  # type: ignore[arg-type]
    _, report, _ = convert_model(model, options)
    return {n.name: (d.low, d.reason) for n, d in report.decisions.items() if n.name}


def _chain() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["X", "S"], ["m"], name="scale_mul"),
        helper.make_node("Add", ["m", "B"], ["a"], name="bias_add"),
        helper.make_node("Relu", ["a"], ["Y"], name="act_relu"),
    ]
    inits = {"S": np.array([1000.0, 1.0], np.float32), "B": np.array([1.0, 1.0], np.float32)}
    return make_model(nodes, [tensor_info("X", F, [2])], [tensor_info("Y", F, [2])], inits)


def test_name_regex_uses_match_semantics() -> None:
    d = _decisions(_chain(), nodes_to_exclude=["add"], data_max=INF)
    assert d["bias_add"][0] is True  # re.match is anchored at the start: "add" does not match "bias_add"
    d = _decisions(_chain(), nodes_to_exclude=[".*add"], data_max=INF)
    assert d["bias_add"] == (False, "name matches nodes_to_exclude pattern '.*add'")


def test_op_type_exclude_and_include_override() -> None:
    d = _decisions(_chain(), op_types_to_exclude=["Relu", "Add"], op_types_to_include=["Add"], data_max=INF)
    assert d["act_relu"][0] is False
    assert d["bias_add"][0] is True and d["bias_add"][1].startswith("included")
    d = _decisions(_chain(), nodes_to_exclude=[".*"], nodes_to_include=["scale.*"], data_max=INF)
    assert [name for name, (low, _) in d.items() if low] == ["scale_mul"]


@pytest.mark.parametrize(("value", "low"), [(900.0, True), (1100.0, False), (-1100.0, False)])
def test_initializer_range(value: float, low: bool) -> None:
    nodes = [helper.make_node("Mul", ["X", "S"], ["Y"], name="mul")]
    model = make_model(
        nodes, [tensor_info("X", F, [2])], [tensor_info("Y", F, [2])], {"S": np.array([value, 1.0], np.float32)}
    )
    assert _decisions(model, init_max=1000, data_max=INF)["mul"][0] is low


def test_data_range_on_float_outputs_from_reference_run() -> None:
    feeds = {"X": np.array([1.0, 0.5], np.float32)}  # scale_mul output reaches 1000 > 512
    d = _decisions(_chain(), calibration_data=feeds)
    assert d["scale_mul"][0] is False and "reaches 1000" in d["scale_mul"][1]
    assert d["bias_add"][0] is False  # its input is the same tensor
    small = {"X": np.array([0.1, 0.5], np.float32)}
    assert all(low for low, _ in _decisions(_chain(), calibration_data=small).values())


def test_integer_tensors_never_trip_data_max() -> None:
    """ModelOpt regression: shape values and token ids above 512 forced Reshape/Gather to FP32."""
    table = np.arange(2000 * 4, dtype=np.float32).reshape(2000, 4) / 8000
    nodes = [
        helper.make_node("Gather", ["T", "ids"], ["g"], name="embed"),
        helper.make_node("Reshape", ["g", "shape"], ["Y"], name="reshape"),
    ]
    model = make_model(
        nodes,
        [tensor_info("ids", TensorProto.INT64, [1, 3])],
        [tensor_info("Y", F, [1, 12])],
        {"T": table, "shape": np.array([1, 12], np.int64)},
    )
    d = _decisions(model, calibration_data={"ids": np.array([[1500, 1999, 700]], np.int64)})
    assert d["embed"][0] is True and d["reshape"][0] is True


def test_depth_of_reduction_without_reference_run_does_not_crash() -> None:
    """ModelOpt regression: data_max=inf with max_depth_of_reduction raised TypeError."""
    w = np.ones((64, 8), np.float32) / 64
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")]
    model = make_model(nodes, [tensor_info("X", F, ["batch", 64])], [tensor_info("Y", F, ["batch", 8])], {"W": w})
    d = _decisions(model, data_max=INF, max_depth_of_reduction=32)
    assert d["mm"] == (False, "depth of reduction 64 > max_depth_of_reduction 32")
    assert _decisions(model, data_max=INF, max_depth_of_reduction=64)["mm"][0] is True


def _depth(
    node: onnx.NodeProto, shapes: dict[str, list[int]], consts: dict[str, np.ndarray] | None = None, opset: int = 17
) -> int | None:
    inputs = [tensor_info(n, F, s) for n, s in shapes.items()]
    model = make_model([node], inputs, [tensor_info(node.output[0], F, None)], consts, opset=opset)
    ir_model = ir.serde.deserialize_model(model)
    return reduction_depth(next(iter(ir_model.graph)), RuleContext())


def test_reduction_depth_per_op() -> None:
    assert _depth(helper.make_node("MatMul", ["A", "B"], ["Y"]), {"A": [2, 3, 50], "B": [50, 4]}) == 50
    assert _depth(helper.make_node("Gemm", ["A", "B"], ["Y"], transA=1), {"A": [70, 2], "B": [70, 4]}) == 70
    assert _depth(helper.make_node("Conv", ["X", "W"], ["Y"]), {"X": [1, 16, 8, 8], "W": [8, 16, 3, 3]}) == 144
    assert _depth(helper.make_node("Conv", ["X", "W"], ["Y"], group=4), {"X": [1, 16, 8, 8], "W": [16, 4, 3, 3]}) == 36
    assert _depth(helper.make_node("ConvTranspose", ["X", "W"], ["Y"]), {"X": [1, 16, 8, 8], "W": [16, 8, 2, 2]}) == 64
    # axes attribute (opset 13): product of all reduced dims, not each dim alone (ModelOpt ignores it)
    assert (
        _depth(
            helper.make_node("ReduceSum", ["X", "axes"], ["Y"]),
            {"X": [2, 30, 40]},
            {"axes": np.array([1, 2], np.int64)},
        )
        == 1200
    )
    assert _depth(helper.make_node("ReduceMean", ["X"], ["Y"], axes=[1, 2]), {"X": [2, 30, 40]}, opset=13) == 1200
    assert _depth(helper.make_node("ReduceMean", ["X"], ["Y"]), {"X": [2, 3, 4]}, opset=13) == 24
    assert (
        _depth(
            helper.make_node("Einsum", ["A", "B"], ["Y"], equation="bij,bjk->bik"), {"A": [2, 3, 17], "B": [2, 17, 5]}
        )
        == 17
    )
    assert _depth(helper.make_node("Relu", ["X"], ["Y"]), {"X": [4]}) is None


def test_custom_rule_modelopt_style_and_callable() -> None:
    class ExcludeAdd(NodeRuleBase):
        def _check_inner(self, node: onnx.NodeProto) -> bool:
            return node.op_type == "Add"

    d = _decisions(_chain(), custom_rule=ExcludeAdd(), data_max=INF)
    assert d["bias_add"] == (False, "custom rule ExcludeAdd")
    d = _decisions(_chain(), custom_rule=lambda node: "no relu" if node.op_type == "Relu" else None, data_max=INF)
    assert d["act_relu"] == (False, "no relu")


def test_debug_log_names_every_decision_and_info_summary(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="onnxprec"):
        convert_to_mixed_precision(_chain(), nodes_to_exclude=["act.*"], data_max=INF)
    text = caplog.text
    assert "HIGH Relu 'act_relu': name matches nodes_to_exclude pattern 'act.*'" in text
    assert "LOW  Mul 'scale_mul': default" in text
    assert "Converted 2/3 nodes (66.7%) to fp16; 2 casts inserted" in text  # into the FP32 Relu, and out to fp16 Y


def test_unsupported_schema_beats_include() -> None:
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["Y"], name="range")]
    scalars = [tensor_info(n, F, []) for n in ("s", "l", "d")]
    model = make_model(nodes, scalars, [tensor_info("Y", F, None)])
    d = _decisions(model, data_max=INF, op_types_to_include=["Range"])
    assert d["range"][0] is False and "no float16" in d["range"][1]


def test_mask_sentinel_initializers_do_not_trip_init_max() -> None:
    """A finfo.min mask fill is clamped to -65504 (still a mask), so its Where need not stay FP32."""
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    nodes = [
        helper.make_node("Where", ["C", "fill", "X"], ["masked"], name="mask_fill"),
        helper.make_node("Softmax", ["masked"], ["Y"], axis=-1, name="softmax"),
    ]
    model = make_model(
        nodes,
        [tensor_info("C", TensorProto.BOOL, [2, 3]), tensor_info("X", F, [2, 3])],
        [tensor_info("Y", F, [2, 3])],
        {"fill": lowest},
    )
    d = _decisions(model, data_max=INF)
    assert d["mask_fill"] == (True, "default")
    big = make_model(
        nodes,
        [tensor_info("C", TensorProto.BOOL, [2, 3]), tensor_info("X", F, [2, 3])],
        [tensor_info("Y", F, [2, 3])],
        {"fill": np.array(1e6, np.float32)},
    )
    # a real large value still trips (a negative fill into a Softmax is a mask: autocast/masks.py rescales it)
    assert _decisions(big, data_max=INF)["mask_fill"][0] is False
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    from onnxprec._testing import run

    feeds = {"C": np.array([[True, False, False], [False, False, True]]), "X": np.ones((2, 3), np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], atol=1e-3)
