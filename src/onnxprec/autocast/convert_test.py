"""Conversion cases on tiny hand-built graphs: casts, initializers, clamping, special ops, subgraphs, I/O."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._graph import ORIGINAL_NAME
from onnxprec._io import load_model, save_model
from onnxprec._testing import F16, F, make_model, run, tensor_info
from onnxprec.autocast import convert_to_mixed_precision
from onnxprec.autocast.classify import classify
from onnxprec.autocast.convert import ConvertPrecisionPass, ConvertPrecisionResult
from onnxprec.autocast.rules import NodeNameRule
from onnxprec.passes import InferTypesPass

RNG = np.random.default_rng(0)
INF = float("inf")


def _check(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def _ops(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["X", "W", "B"], ["g"], name="gemm"),
        helper.make_node("Add", ["g", "B"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["Y"], name="relu"),
    ]
    return make_model(nodes, [tensor_info("X", F, [4, 8])], [tensor_info("Y", F, [4, 8])], {"W": w, "B": b})


@pytest.mark.parametrize("keep_io", [True, False])
def test_full_conversion_io_types_and_numerics(keep_io: bool) -> None:
    model = _mlp()
    out = convert_to_mixed_precision(model, keep_io_types=keep_io, data_max=INF)
    _check(out)
    io_type = F if keep_io else F16
    assert out.graph.input[0].type.tensor_type.elem_type == io_type
    assert out.graph.output[0].type.tensor_type.elem_type == io_type
    assert [i.name for i in out.graph.input] == ["X"] and [o.name for o in out.graph.output] == ["Y"]
    assert len(_ops(out, "Cast")) == (2 if keep_io else 0)
    assert all(i.data_type == F16 for i in out.graph.initializer)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    (ref,) = run(model, {"X": x})
    (got,) = run(out, {"X": x})
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_excluded_middle_node_gets_one_cast_each_way() -> None:
    out = convert_to_mixed_precision(_mlp(), nodes_to_exclude=["add"], data_max=INF, keep_io_types=True)
    _check(out)
    casts = _ops(out, "Cast")
    # X down, g up (into the FP32 Add), a down (into Relu), Y up: 4 boundaries, no more.
    assert len(casts) == 4
    add = next(n for n in out.graph.node if n.name == "add")
    # B is shared by the low Gemm and the high Add: FP32 original kept, one fp16 copy for the Gemm.
    assert _init(out, "B").data_type == F
    assert "B" in add.input
    fp16_copies = [i for i in out.graph.initializer if i.name.startswith("B_") and i.data_type == F16]
    assert len(fp16_copies) == 1


def test_value_with_several_consumers_shares_one_cast() -> None:
    nodes = [
        helper.make_node("Exp", ["X"], ["e"], name="high_exp"),
        helper.make_node("Relu", ["e"], ["r1"], name="r1"),
        helper.make_node("Sigmoid", ["e"], ["r2"], name="r2"),
        helper.make_node("Add", ["r1", "r2"], ["Y"], name="add"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [3])], [tensor_info("Y", F, [3])])
    out = convert_to_mixed_precision(model, nodes_to_exclude=["high_.*"], data_max=INF, keep_io_types=True)
    _check(out)
    down = [c for c in _ops(out, "Cast") if c.input[0] == "e"]
    assert len(down) == 1, "both low consumers of 'e' must read the same Cast"


def test_tied_weight_converted_once_not_per_use() -> None:
    w = RNG.standard_normal((4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", [x, "W"], [y], name=f"mm{i}")
        for i, (x, y) in enumerate([("X", "a"), ("a", "b"), ("b", "Y")])
    ]
    model = make_model(nodes, [tensor_info("X", F, [1, 4])], [tensor_info("Y", F, [1, 4])], {"W": w})
    out = convert_to_mixed_precision(model, data_max=INF)
    assert [i.name for i in out.graph.initializer] == ["W"]
    assert _init(out, "W").data_type == F16


def test_init_conversion_max_bytes_casts_at_runtime_once() -> None:
    w = RNG.standard_normal((16, 16)).astype(np.float32)  # 1024 bytes
    nodes = [
        helper.make_node("MatMul", [x, "W"], [y], name=f"mm{i}")
        for i, (x, y) in enumerate([("X", "a"), ("a", "b"), ("b", "Y")])
    ]
    model = make_model(nodes, [tensor_info("X", F, [1, 16])], [tensor_info("Y", F, [1, 16])], {"W": w})
    out = convert_to_mixed_precision(model, data_max=INF, init_conversion_max_bytes=512)
    _check(out)
    assert _init(out, "W").data_type == F
    assert len([c for c in _ops(out, "Cast") if c.input[0] == "W"]) == 1


def test_clamping_keeps_sign_and_never_makes_inf() -> None:
    values = np.array([1e6, -1e6, -1e-9, 1e-9, 4e-8, -4e-8, 0.5], dtype=np.float32)
    nodes = [helper.make_node("Add", ["X", "C"], ["Y"], name="add")]
    model = make_model(nodes, [tensor_info("X", F, [7])], [tensor_info("Y", F, [7])], {"C": values})
    out = convert_to_mixed_precision(model, data_max=INF, init_max=INF)
    got = numpy_helper.to_array(_init(out, "C"))
    assert got.dtype == np.float16
    assert np.isfinite(got).all()
    assert got[0] == 65504 and got[1] == -65504
    assert np.signbit(got[2]) and got[2] == 0  # tiny negative: negative zero, not +5.96e-8
    assert not np.signbit(got[3]) and got[3] == 0
    assert got[4] == np.float16(5.96e-8) and got[5] == -np.float16(5.96e-8)  # nearest representable, same sign


def test_constant_node_mask_becomes_finite_like_initializers() -> None:
    mask = numpy_helper.from_array(np.array([0.0, -1e9, -1e-9], dtype=np.float32), name="m")
    nodes = [
        helper.make_node("Constant", [], ["mask"], value=mask, name="const"),
        helper.make_node("Add", ["X", "mask"], ["s"], name="add"),
        helper.make_node("Softmax", ["s"], ["Y"], name="softmax"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [3])], [tensor_info("Y", F, [3])])
    out = convert_to_mixed_precision(model, data_max=INF, init_max=INF, keep_io_types=True)
    _check(out)
    x = np.array([0.1, 0.2, 0.3], np.float32)
    (ref,) = run(model, {"X": x})
    (got,) = run(out, {"X": x})
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=1e-3)


def test_cast_to_float_inside_low_region_is_rewritten() -> None:
    nodes = [
        helper.make_node("Cast", ["I"], ["f"], to=F, name="cast_in"),
        helper.make_node("Mul", ["f", "X"], ["Y"], name="mul"),
    ]
    model = make_model(
        nodes, [tensor_info("I", TensorProto.INT64, [3]), tensor_info("X", F, [3])], [tensor_info("Y", F, [3])]
    )
    out = convert_to_mixed_precision(model, data_max=INF)
    _check(out)
    cast = next(n for n in out.graph.node if n.name == "cast_in")
    assert helper.get_attribute_value(cast.attribute[0]) == F16
    assert len(_ops(out, "Cast")) == 1  # no Cast fp32 -> fp16 pair after it


def test_resize_scales_stay_fp32() -> None:
    scales = np.array([1, 1, 2, 2], dtype=np.float32)
    nodes = [helper.make_node("Resize", ["X", "", "S"], ["Y"], mode="nearest", name="resize")]
    model = make_model(nodes, [tensor_info("X", F, [1, 1, 2, 2])], [tensor_info("Y", F, [1, 1, 4, 4])], {"S": scales})
    for kind in ("fp16", "bf16"):
        out = convert_to_mixed_precision(model, low_precision_type=kind, data_max=INF, keep_io_types=True)
        _check(out)
        assert _init(out, "S").data_type == F


def test_bf16_rounds_to_nearest_even_and_upgrades_opset() -> None:
    w = np.array([1.00390625, 1.01171875, -3.0e38, 1e-3], dtype=np.float32)  # ties to even, near-max
    nodes = [helper.make_node("Mul", ["X", "W"], ["Y"], name="mul")]
    model = make_model(nodes, [tensor_info("X", F, [4])], [tensor_info("Y", F, [4])], {"W": w})
    out = convert_to_mixed_precision(model, low_precision_type="bf16", data_max=INF, init_max=INF)
    _check(out)
    assert out.opset_import[0].version == 22
    stored = _init(out, "W")
    assert stored.data_type == TensorProto.BFLOAT16
    got = np.frombuffer(stored.raw_data, dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, w.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize(("opset", "isinf_low"), [(13, False), (20, True)])
def test_isinf_follows_its_schema(opset: int, isinf_low: bool) -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("IsInf", ["r"], ["Y"], name="isinf"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [3])], [tensor_info("Y", TensorProto.BOOL, [3])], opset=opset)
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    isinf = next(n for n in out.graph.node if n.name == "isinf")
    feeds_fp32 = any(c.output[0] == isinf.input[0] for c in _ops(out, "Cast"))
    assert feeds_fp32 is not isinf_low


def test_if_subgraph_nodes_are_converted_and_valid() -> None:
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "W"], ["t"], name="then_mul")], "then", [], [tensor_info("t", F, [3])]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Add", ["a", "W"], ["e"], name="else_add")], "else", [], [tensor_info("e", F, [3])]
    )
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="relu"),
        helper.make_node("If", ["C"], ["o"], then_branch=then_graph, else_branch=else_graph, name="if"),
        helper.make_node("Sigmoid", ["o"], ["Y"], name="sig"),
    ]
    w = np.array([2.0, 3.0, 4.0], np.float32)
    model = make_model(
        nodes, [tensor_info("X", F, [3]), tensor_info("C", TensorProto.BOOL, [])], [tensor_info("Y", F, [3])], {"W": w}
    )
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    for cond in (True, False):
        feeds = {"X": x, "C": np.array(cond)}
        np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], atol=2e-3)
    if_node = next(n for n in out.graph.node if n.op_type == "If")
    branches = {a.name: helper.get_attribute_value(a) for a in if_node.attribute}
    then_ops = [n.op_type for n in branches["then_branch"].node]
    assert "Mul" in then_ops and "Cast" in then_ops  # converted inside, FP32 interface kept


def test_loop_with_float_carried_state_runs() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["s_in", "K"], ["m"], name="body_mul"),
            helper.make_node("Add", ["m", "X"], ["s_out"], name="body_add"),
        ],
        "body",
        [
            tensor_info("i", TensorProto.INT64, []),
            tensor_info("cond_in", TensorProto.BOOL, []),
            tensor_info("s_in", F, [2]),
        ],
        [tensor_info("cond_out", TensorProto.BOOL, []), tensor_info("s_out", F, [2])],
    )
    nodes = [
        helper.make_node("Loop", ["N", "", "S0"], ["S"], body=body, name="loop"),
        helper.make_node("Relu", ["S"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [2]), tensor_info("S0", F, [2]), tensor_info("N", TensorProto.INT64, [])],
        [tensor_info("Y", F, [2])],
        {"K": np.array([0.5, 0.25], np.float32)},
    )
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    feeds = {"X": np.array([1.0, 2.0], np.float32), "S0": np.array([0.0, 1.0], np.float32), "N": np.array(5)}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], rtol=1e-3)


def test_fp64_model_keeps_double_io_and_converts_inside() -> None:
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", TensorProto.DOUBLE, [2])],
        [tensor_info("Y", TensorProto.DOUBLE, [2])],
        {"W": np.array([1.5, -2.0])},
    )
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert _init(out, "W").data_type == F16
    x = np.array([1.0, 3.0])
    np.testing.assert_allclose(run(out, {"X": x})[0], [1.5, 0.0])


def test_contrib_op_converts_by_its_contract_without_tensorrt() -> None:
    nodes = [
        helper.make_node("FusedMatMul", ["X", "W"], ["f"], domain="com.microsoft", alpha=1.0, name="fused"),
        helper.make_node("Relu", ["f"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [2, 2])],
        [tensor_info("Y", F, [2, 2])],
        {"W": np.eye(2, dtype=np.float32)},
        extra_opsets={"com.microsoft": 1},
    )
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    fused = next(n for n in out.graph.node if n.op_type == "FusedMatMul")
    assert fused.domain == "com.microsoft"  # not renamed into a TensorRT plugin domain
    assert _init(out, "W").data_type == F16  # FusedMatMul's contract: A, B and Y share T (float16 allowed)
    x = np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_allclose(run(out, {"X": x})[0], np.maximum(x, 0), atol=1e-3)


def test_custom_op_marked_fp16_by_plugin_precision() -> None:
    nodes = [helper.make_node("MyPlugin", ["X"], ["Y"], domain="my.domain", name="plugin")]
    model = make_model(nodes, [tensor_info("X", F, [2])], [tensor_info("Y", F, [2])], extra_opsets={"my.domain": 1})
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True, trt_plugins_precision=["MyPlugin:fp16"])
    plugin = next(n for n in out.graph.node if n.op_type == "MyPlugin")
    assert any(c.output[0] == plugin.input[0] for c in _ops(out, "Cast"))


def test_graph_output_also_consumed_keeps_name() -> None:
    nodes = [helper.make_node("Relu", ["X"], ["Y1"], name="relu"), helper.make_node("Neg", ["Y1"], ["Y2"], name="neg")]
    model = make_model(nodes, [tensor_info("X", F, [2])], [tensor_info("Y1", F, [2]), tensor_info("Y2", F, [2])])
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    assert [o.name for o in out.graph.output] == ["Y1", "Y2"]
    x = np.array([1.0, -1.0], np.float32)
    for got, ref in zip(run(out, {"X": x}), run(model, {"X": x})):
        np.testing.assert_allclose(got, ref)


def test_data_movement_between_fp32_nodes_stays_fp32_and_compute_between_them_converts() -> None:
    nodes = [
        helper.make_node("Exp", ["X"], ["e"], name="high_exp"),
        helper.make_node("Transpose", ["e"], ["t"], perm=[1, 0], name="transpose"),  # alone between FP32 nodes
        helper.make_node("Log", ["t"], ["l"], name="high_log"),
        helper.make_node("Transpose", ["l"], ["t2"], perm=[1, 0], name="transpose2"),  # beside a low Relu
        helper.make_node("Relu", ["t2"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["Y"], name="high_neg"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [2, 3])])
    out = convert_to_mixed_precision(model, nodes_to_exclude=["high_.*"], data_max=INF, keep_io_types=True)
    _check(out)
    order = [n.op_type for n in out.graph.node]
    assert order == ["Exp", "Transpose", "Log", "Cast", "Transpose", "Relu", "Cast", "Neg"], order
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (ref,) = run(model, {"X": x})
    (got,) = run(out, {"X": x})
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_redundant_user_casts_are_removed() -> None:
    nodes = [
        helper.make_node("Cast", ["X"], ["h"], to=F16, name="to16"),
        helper.make_node("Cast", ["h"], ["f"], to=F, name="to32"),
        helper.make_node("Relu", ["f"], ["Y"], name="relu"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [2])], [tensor_info("Y", F, [2])])
    out = convert_to_mixed_precision(model, data_max=INF)
    _check(out)
    assert _ops(out, "Cast") == []


def test_repeated_calls_are_independent() -> None:
    """No module-level state: a second conversion gives the same model (ModelOpt mutates global tables)."""
    first = convert_to_mixed_precision(_mlp(), nodes_to_exclude=["add"], data_max=INF)
    convert_to_mixed_precision(_mlp(), op_types_to_exclude=["Relu"], data_max=INF, low_precision_type="bf16")
    again = convert_to_mixed_precision(_mlp(), nodes_to_exclude=["add"], data_max=INF)
    assert first.SerializeToString() == again.SerializeToString()


def _fp16_model() -> onnx.ModelProto:
    """An FP16 model with an FP32 island (Softmax between two Casts, as builders leave them) and an Add whose
    input reaches ~1000 (past the default data_max 512)."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["a"], name="mm"),
        helper.make_node("Add", ["a", "B"], ["b"], name="add"),
        helper.make_node("Cast", ["b"], ["b32"], to=F, name="up"),
        helper.make_node("Softmax", ["b32"], ["s32"], axis=-1, name="softmax"),
        helper.make_node("Cast", ["s32"], ["s"], to=F16, name="down"),
        helper.make_node("Mul", ["s", "X"], ["Y"], name="mul"),
    ]
    inits = {
        "W": (rng.standard_normal((16, 16)) * 0.3).astype(np.float16),
        "B": (rng.standard_normal(16) * 1000).astype(np.float16),
    }
    return make_model(nodes, [tensor_info("X", F16, [2, 16])], [tensor_info("Y", F16, [2, 16])], inits, opset=22)


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    values = [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]
    return {v.name: v.type.tensor_type.elem_type for v in values}


def test_fp16_model_to_fp16_keeps_what_it_runs_in_fp16_and_classifies_its_fp32_island() -> None:
    """An FP16 model is no error: nodes already FP16 stay so (the data-range rule does not apply to what the model
    already runs in FP16), its FP32 island is classified like any FP32 node (Softmax of values ~1000 stays FP32),
    the interface is unchanged and the output equals the input model's."""
    model = _fp16_model()
    x = RNG.standard_normal((2, 16)).astype(np.float16)
    for keep_io in (True, False):
        out = convert_to_mixed_precision(model, keep_io_types=keep_io, calibration_data={"X": x})
        _check(out)
        types = _types(out)
        assert types["X"] == types["Y"] == F16 and types["a"] == types["b"] == F16
        assert types["s32"] == F and _init(out, "W").data_type == _init(out, "B").data_type == F16
        np.testing.assert_array_equal(run(out, {"X": x})[0], run(model, {"X": x})[0])
    all_low = make_model([helper.make_node("Relu", ["X"], ["Y"], name="relu")], [tensor_info("X", F16, [2])],
                         [tensor_info("Y", F16, [2])])  # fmt: skip
    out = convert_to_mixed_precision(all_low, data_max=INF)
    assert [n.op_type for n in out.graph.node] == ["Relu"] and _types(out)["Y"] == F16


def test_fp16_model_to_bf16_keeping_what_must_stay_wide() -> None:
    """FP16 -> BF16: the MatMul goes BF16, the Add whose input reaches ~1000 and the Softmax of it stay FP32 (data
    range), FP16 weights of FP32 nodes are widened exactly; keep_io_types keeps the FP16 interface, otherwise it
    becomes BF16. Judged against the FP16 model by onnx.reference (ORT's CPU has no BF16 MatMul)."""
    from onnx.reference import ReferenceEvaluator

    model = _fp16_model()
    x = RNG.standard_normal((2, 16)).astype(np.float16)
    want = run(model, {"X": x})[0].astype(np.float32)
    for keep_io, io_type in ((True, F16), (False, TensorProto.BFLOAT16)):
        out = convert_to_mixed_precision(
            model, low_precision_type="bf16", keep_io_types=keep_io, calibration_data=[{"X": x}]
        )
        _check(out)
        types = _types(out)
        assert types["X"] == types["Y"] == io_type
        assert types["a"] == TensorProto.BFLOAT16 and types["b"] == F and types["s32"] == F
        assert _init(out, "W").data_type == TensorProto.BFLOAT16 and _init(out, "B").data_type == F
        np.testing.assert_array_equal(
            numpy_helper.to_array(_init(out, "B")), numpy_helper.to_array(_init(model, "B")).astype(np.float32)
        )
        feed = x if keep_io else x.astype(ml_dtypes.bfloat16)
        got = np.asarray(ReferenceEvaluator(out).run(None, {"X": feed})[0], np.float32)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2**-6


def test_opset_upgrade_and_requested_opset(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [helper.make_node("ReduceMean", ["X"], ["Y"], axes=[1], keepdims=0, name="mean")]
    model = make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [2])], opset=11, ir_version=6)
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    assert out.opset_import[0].version == 13 and out.ir_version == 7  # raised only as far as needed
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True, opset=19)
    _check(out)
    assert out.opset_import[0].version == 19
    with caplog.at_level("WARNING"):
        out = convert_to_mixed_precision(out, data_max=INF, opset=17)
    assert "lower than the original model's opset" in caplog.text
    assert out.opset_import[0].version == 19
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(run(out, {"X": x})[0], x.mean(1), rtol=1e-3)


def test_layernorm_pattern_over_a_non_trailing_axis_is_not_fused() -> None:
    """ModelOpt fuses this into LayerNormalization(axis=-2), which normalizes the wrong dims (|error| ~ 1)."""
    eps = np.array(1e-5, np.float32)
    two = np.array(2.0, np.float32)
    axes = np.array([-2], np.int64)
    nodes = [
        helper.make_node("ReduceMean", ["X", "axes"], ["mu"], name="rm1"),
        helper.make_node("Sub", ["X", "mu"], ["d"], name="sub"),
        helper.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="rm2"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
        helper.make_node("Div", ["d", "sd"], ["Y"], name="div"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [2, 4, 3])],
        [tensor_info("Y", F, [2, 4, 3])],
        {"axes": axes, "two": two, "eps": eps},
        opset=18,
    )
    out = convert_to_mixed_precision(model, data_max=INF, keep_io_types=True)
    _check(out)
    assert not _ops(out, "LayerNormalization")
    x = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(run(out, {"X": x})[0], run(model, {"X": x})[0], atol=5e-3)


# -- ConvertPrecisionPass on its own ---------------------------------------------------------------------------


def _convert_pass(model: ir.Model, exclude: str | None = None) -> ConvertPrecisionPass:
    rules = [NodeNameRule([re.compile(exclude)])] if exclude else []
    decisions = classify(model, low=ir.DataType.FLOAT16, rules=rules)
    return ConvertPrecisionPass(decisions, ir.DataType.FLOAT16, keep_io_types=True)


def _run_pass(convert: ConvertPrecisionPass, model: ir.Model) -> ConvertPrecisionResult:
    result = convert(model)
    assert isinstance(result, ConvertPrecisionResult)
    return result


def _typed(proto: onnx.ModelProto) -> ir.Model:
    model = ir.from_proto(proto)
    InferTypesPass()(model)
    return model


def test_pass_returns_its_counts_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    model = _typed(_mlp())
    convert = _convert_pass(model, exclude="add")
    result = _run_pass(convert, model)
    assert result.modified
    stats = result.stats
    assert (stats.nodes, stats.low_nodes, stats.casts) == (3, 2, 4)
    assert (stats.initializers_converted, stats.initializers_copied, stats.initializers_cast_at_runtime) == (1, 1, 0)
    assert [c.name for c in result.casts] == [
        "X_cast_to_fp16",
        "g_cast_to_fp32",
        "a_cast_to_fp16",
        "Y_pre_cast_cast_to_fp32",
    ]
    assert not hasattr(convert, "stats") and not hasattr(convert, "created")  # no run state on the pass
    again = _run_pass(convert, model)
    assert not again.modified and again.casts == [] and again.stats.casts == 0
    assert sum(n.op_type == "Cast" for n in model.graph) == 4

    # The FP16 value that Y now casts was renamed; it records Y, and saving keeps the record.
    relu = next(n for n in model.graph if n.name == "relu")
    assert relu.outputs[0].name == "Y_pre_cast" and relu.outputs[0].metadata_props[ORIGINAL_NAME] == "Y"
    loaded = load_model(save_model(model, tmp_path / "fp16.onnx"))
    relu = next(n for n in loaded.graph if n.name == "relu")
    assert relu.outputs[0].metadata_props[ORIGINAL_NAME] == "Y"


def test_pass_places_casts_inside_if_branches() -> None:
    branches = {
        name: helper.make_graph(
            [helper.make_node(op, ["a", "W"], [out], name=f"{out}_{op}")], name, [], [tensor_info(out, F, [3])]
        )
        for name, op, out in (("then_branch", "Mul", "t"), ("else_branch", "Add", "e"))
    }
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="relu"),
        helper.make_node("If", ["C"], ["o"], name="if", **branches),
        helper.make_node("Sigmoid", ["o"], ["Y"], name="sig"),
    ]
    inputs = [tensor_info("X", F, [3]), tensor_info("C", TensorProto.BOOL, [])]
    w = {"W": np.array([2.0, 3.0, 4.0], np.float32)}
    model = _typed(make_model(nodes, inputs, [tensor_info("Y", F, [3])], w))
    convert = _convert_pass(model)
    result = _run_pass(convert, model)
    assert result.modified and result.stats.initializers_converted == 1
    # X down and o down (the If keeps an FP32 interface), Y up; each branch casts its FP16 output up.
    where = sorted((cast.graph.name or "", cast.outputs[0].name or "") for cast in result.casts if cast.graph)
    assert where == [
        ("else_branch", "e"),
        ("test", "X_cast_to_fp16"),
        ("test", "Y"),
        ("test", "o_cast_to_fp16"),
        ("then_branch", "t"),
    ]
    assert not _run_pass(convert, model).modified
