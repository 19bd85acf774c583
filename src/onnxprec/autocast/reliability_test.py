"""Issue 9 (AutoCast reliability): one regression test per cause, each on a hand-built graph.

The causes were found by sweeping the ONNX backend node tests (``python -m experiments.node_sweep``); each test
here builds the smallest graph that failed, converts it with ``keep_io_types`` (unless said otherwise) and checks
that the result is valid, runs, and stays close to FP32, or that the refusal is one clear line.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from onnxprec import calibration, calibration_data
from onnxprec._testing import F16, F, make_model, run, tensor_info
from onnxprec.autocast import AutoCastOptions, convert_model, convert_to_mixed_precision
from onnxprec.autocast.rules import DataRangeRule, RuleContext
from onnxprec.errors import CalibrationDataError
from onnxprec.observers import TensorStats

I64 = TensorProto.INT64
RNG = np.random.default_rng(0)


def _check(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """The full checker, where it accepts the original (it wants a shape on every graph output)."""
    try:
        onnx.checker.check_model(original, full_check=True)
    except Exception:  # ValidationError or InferenceError
        onnx.checker.check_model(model)
        return
    onnx.checker.check_model(model, full_check=True)


def _convert(model: onnx.ModelProto, **kwargs: object) -> onnx.ModelProto:
    kwargs.setdefault("keep_io_types", True)
    out = convert_to_mixed_precision(model, **kwargs)  # type: ignore[arg-type]
    _check(out, model)
    return out


def _close(model: onnx.ModelProto, converted: onnx.ModelProto, feeds: dict, tol: float = 1e-2) -> None:
    for want, got in zip(run(model, feeds), run(converted, feeds)):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


def _ops(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def _low_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the main-graph nodes (Casts left out) that read or write an FP16 tensor."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    types |= {i.name: i.data_type for i in inferred.graph.initializer}
    return {
        n.name
        for n in inferred.graph.node
        if n.op_type != "Cast" and any(types.get(v) == F16 for v in (*n.input, *n.output))
    }


# 1. ConstantOfShape without `value` (every inlined ONNX Attention function has one)


def test_constant_of_shape_without_value_is_retyped_with_its_output() -> None:
    nodes = [
        helper.make_node("Shape", ["X"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["zeros"], name="zeros"),
        helper.make_node("Add", ["X", "zeros"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["Y"], name="relu"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [2, 3])])
    out = _convert(model)
    (fill,) = _ops(out, "ConstantOfShape")
    value = next(a for a in fill.attribute if a.name == "value")
    assert value.t.data_type == F16
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    _close(model, out, {"X": x})


# 2. A static size-0 dimension is a size, not a dynamic dim


def test_static_size_zero_dims_are_kept_in_random_data() -> None:
    nodes = [
        helper.make_node("ReduceSum", ["X", "axes"], ["r"], keepdims=1, name="reduce"),
        helper.make_node("Relu", ["r"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [2, 0, 3]), tensor_info("axes", I64, [0])],
        [tensor_info("Y", F, [1, 1, 1])],
        opset=18,
    )
    feeds = calibration.random_feeds(ir.from_proto(model))
    assert feeds["X"].shape == (2, 0, 3) and feeds["axes"].shape == (0,)
    _convert(model)


# 3. Random data: another seed per attempt, op contracts, ModelOpt's "dynamic dims = 1", unnamed dims


def test_random_attempts_differ_and_a_static_model_gets_no_input_shapes_advice() -> None:
    nodes = [helper.make_node("Relu", ["X"], ["Y"], name="relu")]
    model = ir.from_proto(make_model(nodes, [tensor_info("X", F, [2, 3])], [tensor_info("Y", F, [2, 3])]))
    seen: list[np.ndarray] = []

    def run_fails(batches: object) -> None:
        seen.append(next(iter(batches))["X"])  # type: ignore[call-overload]
        raise CalibrationDataError("no")

    with pytest.raises(CalibrationDataError) as info:
        calibration_data.run_on_data(model, None, run_fails)
    assert len(seen) == calibration_data.RANDOM_ATTEMPTS
    assert len({a.tobytes() for a in seen}) == len(seen)  # every attempt has its own values
    assert "--input_shapes" not in str(info.value) and "--calibration_data" in str(info.value)
    dynamic = ir.from_proto(make_model(nodes, [tensor_info("X", F, ["n", None])], [tensor_info("Y", F, None)]))
    assert calibration.random_feeds(dynamic, attempt=1)["X"].shape == (1, 1)  # ModelOpt's sizes
    with pytest.raises(CalibrationDataError, match="--input_shapes"):
        calibration_data.run_on_data(dynamic, None, run_fails)


def test_parameter_inputs_get_values_their_op_accepts() -> None:
    """Shapes, axes, scales, thresholds, depths and domains, all fed as graph inputs."""
    nodes = [
        helper.make_node("Reshape", ["X", "shape"], ["r"], name="reshape"),
        helper.make_node("Slice", ["X", "starts", "ends", "axes", "steps"], ["s"], name="slice"),
        helper.make_node("Resize", ["img", "", "scales"], ["z"], mode="linear", name="resize"),
        helper.make_node("OneHot", ["idx", "depth", "values"], ["o"], axis=1, name="onehot"),
        helper.make_node("Log", ["pos"], ["l"], name="log"),
        helper.make_node("Acos", ["unit"], ["c"], name="acos"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["nms"], name="nms"),
        helper.make_node("Split", ["X", "split"], ["p0", "p1"], axis=1, name="split"),
        helper.make_node("ReduceSum", ["r", "raxes"], ["Y"], keepdims=0, name="reduce"),
    ]
    inputs = [
        tensor_info("X", F, [2, 6]),
        tensor_info("shape", I64, [3]),
        tensor_info("starts", I64, [2]),
        tensor_info("ends", I64, [2]),
        tensor_info("axes", I64, [2]),
        tensor_info("steps", I64, [2]),
        tensor_info("img", F, [1, 1, 4, 4]),
        tensor_info("scales", F, [4]),
        tensor_info("idx", I64, [3]),
        tensor_info("depth", I64, []),
        tensor_info("values", F, [2]),
        tensor_info("pos", F, [5]),
        tensor_info("unit", F, [5]),
        tensor_info("boxes", F, [1, 4, 4]),
        tensor_info("scores", F, [1, 1, 4]),
        tensor_info("max_out", I64, [1]),
        tensor_info("iou", F, [1]),
        tensor_info("score_min", F, [1]),
        tensor_info("split", I64, [2]),
        tensor_info("raxes", I64, [1]),
    ]
    ranks = {"Y": 2, "s": 2, "z": 4, "o": 2, "l": 1, "c": 1, "nms": 2, "p0": 2, "p1": 2}
    outputs = [tensor_info(o, F if o != "nms" else I64, [f"{o}{i}" for i in range(r)]) for o, r in ranks.items()]
    model = make_model(nodes, inputs, outputs, opset=18)
    feeds = calibration.random_feeds(ir.from_proto(model))
    assert list(feeds["shape"]) == [1, 1, -1] and sorted(feeds["axes"]) == [0, 1] and list(feeds["steps"]) == [1, 1]
    assert (feeds["scales"] > 0).all() and 0 <= feeds["iou"][0] <= 1 and feeds["depth"] > 0
    assert (feeds["pos"] > 0).all() and (np.abs(feeds["unit"]) < 1).all() and feeds["split"].sum() == 6
    run(model, feeds)  # the FP32 model runs on them
    out = _convert(model)
    assert {"log", "acos"} <= _low_nodes(out)  # in-domain data: no NaN counted as "above data_max"


@pytest.mark.slow
def test_unnamed_dim_sizes_are_searched_before_giving_up() -> None:
    """Width is dynamic and named; the height has no name and must be 32 for the MatMul: random data finds it."""
    w = RNG.standard_normal((32, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["X"], ["t"], perm=[0, 1, 3, 2], name="transpose"),
        helper.make_node("MatMul", ["t", "W"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["Y"], name="relu"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [1, 3, None, "width"])], [tensor_info("Y", F, None)], {"W": w})
    _, report, reference = convert_model(model, AutoCastOptions(keep_io_types=True))
    assert reference is not None and reference.first_feeds["X"].shape[2] == 32
    assert report.stats.low_nodes == 3 and report.stats.casts == 2


# 4. Sequence and optional values keep their types; no Cast on a sequence or optional I/O


def test_sequences_and_optionals_keep_their_types() -> None:
    seq = helper.make_tensor_sequence_value_info("S", F, None)
    opt = helper.make_value_info("O", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [3])))
    nodes = [
        helper.make_node("SequenceAt", ["S", "zero"], ["a"], name="at"),
        helper.make_node("OptionalGetElement", ["O"], ["b"], name="get"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Relu", ["c"], ["Y"], name="relu"),
        helper.make_node("SequenceInsert", ["S", "Y"], ["S2"], name="insert"),
        helper.make_node("Identity", ["O"], ["O2"], name="identity"),
    ]
    outputs = [
        tensor_info("Y", F, [3]),
        helper.make_tensor_sequence_value_info("S2", F, None),
        helper.make_value_info("O2", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [3]))),
    ]
    model = make_model(nodes, [seq, opt], outputs, {"zero": np.array(0, np.int64)}, opset=18)
    feeds = {"S": [RNG.standard_normal(3).astype(np.float32)], "O": RNG.standard_normal(3).astype(np.float32)}
    for keep_io in (True, False):
        out = _convert(model, keep_io_types=keep_io, calibration_data=feeds)
        assert out.graph.input[0].type == model.graph.input[0].type  # seq(tensor(float)), never FP16
        assert out.graph.input[1].type == model.graph.input[1].type
        assert [o.type for o in out.graph.output[1:]] == [o.type for o in model.graph.output[1:]]
        assert not any(n.input[0] in ("S", "O") for n in _ops(out, "Cast"))
        assert "add" in _low_nodes(out)
        _close(model, out, feeds)
    _convert(model)  # and random data makes sequences and optionals too


# 5. Quantized models: converted around their quantization nodes; INT4 weights left alone


@pytest.mark.parametrize("opset", [13, 21])
def test_qdq_model_is_converted_around_its_quantization_nodes(opset: int) -> None:
    w = RNG.standard_normal((8, 4)).astype(np.float32)
    scale = np.float32(0.02)
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "s", "zp"], ["q"], name="quant"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"], name="dequant"),
        helper.make_node("MatMul", ["d", "W"], ["Y"], name="matmul"),
    ]
    inits = {"W": w, "s": scale, "zp": np.int8(0)}
    model = make_model(nodes, [tensor_info("X", F, [2, 8])], [tensor_info("Y", F, [2, 4])], inits, opset=opset)
    out = _convert(model)
    (quant,) = _ops(out, "QuantizeLinear")
    scales = {i.name: i.data_type for i in out.graph.initializer}
    assert scales[quant.input[1]] == F  # quantization keeps its FP32 scale
    (dequant,) = _ops(out, "DequantizeLinear")
    assert scales[dequant.input[1]] == (F16 if opset >= 19 else F)  # DQ's scale follows its output type
    assert "matmul" in _low_nodes(out)
    x = np.abs(RNG.standard_normal((2, 8))).astype(np.float32)
    _close(model, out, {"X": x}, tol=2e-2)


def test_int4_weights_of_a_quantized_llm_are_left_alone() -> None:
    """DequantizeLinear(INT4, blocked) -> MatMul and com.microsoft MatMulNBits: weights stay as they are."""
    k, n, block = 32, 8, 16
    q = RNG.integers(-8, 8, size=(k, n)).astype(np.int8)
    scales = (np.abs(RNG.standard_normal((k // block, n))) * 0.1 + 0.01).astype(np.float32)
    int4 = helper.make_tensor("Wq", TensorProto.INT4, [k, n], q.reshape(-1).tolist())
    packed = RNG.integers(0, 256, size=(n, k // 32, 16)).astype(np.uint8)
    nodes = [
        helper.make_node("DequantizeLinear", ["Wq", "Ws"], ["W"], axis=0, block_size=block, name="dq"),
        helper.make_node("MatMul", ["X", "W"], ["h"], name="matmul"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node(
            "MatMulNBits",
            ["X", "B", "S2"],
            ["nb"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=32,
            name="nbits",
        ),
        helper.make_node("Add", ["r", "nb"], ["Y"], name="add"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [2, k])],
        [tensor_info("Y", F, [2, n])],
        {"Ws": scales, "B": packed, "S2": np.full(n, 0.05, np.float32)},
        opset=21,
        extra_opsets={"com.microsoft": 1},
        ir_version=10,
    )
    model.graph.initializer.append(int4)
    out = convert_to_mixed_precision(model, keep_io_types=True)
    inits = {i.name: i for i in out.graph.initializer}
    assert inits["Wq"].data_type == TensorProto.INT4 and inits["Wq"].raw_data == int4.raw_data
    # MatMulNBits goes FP16 by its contract: the packed weights stay uint8, the scales follow A (T1).
    assert inits["B"].data_type == TensorProto.UINT8 and inits["S2"].data_type == F16
    assert {"matmul", "nbits"} <= _low_nodes(out)
    x = RNG.standard_normal((2, k)).astype(np.float32)
    _close(model, out, {"X": x}, tol=3e-2)


# 6. BitCast, FP8 outputs, ai.onnx.ml-only models, MVN, EyeLike, sequences of different shapes, BF16/FP8 inputs


def test_bitcast_input_keeps_its_bit_width() -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("BitCast", ["r"], ["Y"], to=TensorProto.INT32, name="bitcast"),
    ]
    model = make_model(nodes, [tensor_info("X", F, [4])], [tensor_info("Y", TensorProto.INT32, [4])], opset=26)
    out = _convert(model)
    x = RNG.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(run(out, {"X": x})[0], run(model, {"X": x})[0])


def test_float8_output_keeps_its_type() -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["Y"], to=TensorProto.FLOAT8E4M3FN, name="cast"),
    ]
    outputs = [tensor_info("Y", TensorProto.FLOAT8E4M3FN, [4])]
    model = make_model(nodes, [tensor_info("X", F, [4])], outputs, opset=21, ir_version=10)
    out = _convert(model)
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT8E4M3FN


@pytest.mark.parametrize("keep_io", [True, False])
def test_ai_onnx_ml_only_model_is_not_upgraded_through_a_domain_it_does_not_import(keep_io: bool) -> None:
    nodes = [helper.make_node("Binarizer", ["X"], ["Y"], domain="ai.onnx.ml", threshold=0.5, name="binarizer")]
    graph = helper.make_graph(nodes, "ml", [tensor_info("X", F, [3])], [tensor_info("Y", F, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    out = _convert(model, keep_io_types=keep_io)
    x = np.array([0.2, 0.7, 1.5], np.float32)
    np.testing.assert_array_equal(np.asarray(run(out, {"X": x})[0], np.float32), [0, 1, 1])


def test_mvn_and_eyelike_stay_fp32_and_the_model_runs() -> None:
    nodes = [
        helper.make_node("MeanVarianceNormalization", ["X"], ["m"], name="mvn"),
        helper.make_node("EyeLike", ["E"], ["eye"], name="eye"),
        helper.make_node("MatMul", ["E", "eye"], ["e2"], name="matmul"),
        helper.make_node("Relu", ["m"], ["Y"], name="relu"),
    ]
    inputs = [tensor_info("X", F, [2, 3, 2, 2]), tensor_info("E", F, [3, 3])]
    model = make_model(nodes, inputs, [tensor_info("Y", F, [2, 3, 2, 2]), tensor_info("e2", F, [3, 3])], opset=13)
    out = convert_to_mixed_precision(model, keep_io_types=True)
    low = _low_nodes(out)
    assert "relu" in low and "matmul" in low and not {"mvn", "eye"} & low
    feeds = {"X": RNG.standard_normal((2, 3, 2, 2)).astype(np.float32), "E": np.eye(3, dtype=np.float32)}
    _close(model, out, feeds)


def test_training_mode_batchnorm_stays_fp32() -> None:
    """ONNX Runtime's FP16 kernel gets the running statistics of a training-mode BatchNormalization wrong (12%)."""
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "s", "b", "m", "v"], ["Y", "M", "V"], training_mode=1, name="bn"),
    ]
    stats = {k: np.full(3, value, np.float32) for k, value in (("s", 1.0), ("b", 0.0), ("m", 0.5), ("v", 1.0))}
    outputs = [tensor_info("Y", F, [2, 3, 4]), tensor_info("M", F, [3]), tensor_info("V", F, [3])]
    model = make_model(nodes, [tensor_info("X", F, [2, 3, 4])], outputs, stats, opset=15)
    feeds = {"X": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    out = _convert(model, calibration_data=feeds)
    assert _low_nodes(out) == {"relu"}
    _close(model, out, feeds)


def test_sequence_of_tensors_of_different_shapes_in_the_reference_run() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["X", "split"], ["parts"], axis=0, name="split"),
        helper.make_node("SequenceAt", ["parts", "one"], ["second"], name="at"),
        helper.make_node("Relu", ["second"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [3, 2]), tensor_info("split", I64, [2])],
        [tensor_info("Y", F, None), helper.make_tensor_sequence_value_info("parts", F, None)],
        {"one": np.array(1, np.int64)},
    )
    feeds = {"X": RNG.standard_normal((3, 2)).astype(np.float32), "split": np.array([1, 2], np.int64)}
    out = _convert(model, calibration_data=feeds)
    got, want = run(out, feeds), run(model, feeds)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), want[0], rtol=1e-2, atol=1e-2)
    assert [p.shape for p in got[1]] == [(1, 2), (2, 2)]


@pytest.mark.parametrize("dtype", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN])
def test_random_data_for_bf16_and_fp8_inputs(dtype: int) -> None:
    nodes = [
        helper.make_node("Cast", ["X"], ["x"], to=F, name="cast"),
        helper.make_node("Relu", ["x"], ["Y"], name="relu"),
    ]
    model = make_model(nodes, [tensor_info("X", dtype, [4])], [tensor_info("Y", F, [4])], opset=21)
    feeds = calibration.random_feeds(ir.from_proto(model))
    assert feeds["X"].dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn))
    _convert(model)


# 7. The I/O contract is the user's original model: an opset upgrade never changes the interface


def test_scan8_model_keeps_its_batch_axis() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Add", ["sum_in", "next"], ["sum_out"], name="add"),
            helper.make_node("Identity", ["sum_out"], ["scan_out"], name="identity"),
        ],
        "scan_body",
        [tensor_info("sum_in", F, [2]), tensor_info("next", F, [2])],
        [tensor_info("sum_out", F, [2]), tensor_info("scan_out", F, [2])],
    )
    node = helper.make_node("Scan", ["", "initial", "x"], ["y", "z"], num_scan_inputs=1, body=body, name="scan")
    inputs = [tensor_info("initial", F, [1, 2]), tensor_info("x", F, [1, 3, 2])]
    model = make_model([node], inputs, [tensor_info("y", F, [1, 2]), tensor_info("z", F, [1, 3, 2])], opset=8)
    model.ir_version = 3
    out = _convert(model)
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in out.graph.input] == [[1, 2], [1, 3, 2]]
    feeds = {"initial": np.zeros((1, 2), np.float32), "x": RNG.standard_normal((1, 3, 2)).astype(np.float32)}
    _close(model, out, feeds)


# 8. Body tensors are not measured: body nodes stay FP32 when their values could overflow


def test_if_body_whose_exp_overflows_fp16_on_the_calibration_data_stays_fp32() -> None:
    """The If's own output stays small (the branch scales it down): only a body tensor reaches 1e5."""
    then_branch = helper.make_graph(
        [helper.make_node("Exp", ["X"], ["e"], name="exp"), helper.make_node("Mul", ["e", "k"], ["t"], name="scale")],
        "then",
        [],
        [tensor_info("t", F, [4])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["f"], name="id")], "else", [], [tensor_info("f", F, [4])]
    )
    nodes = [
        helper.make_node("If", ["C"], ["i"], then_branch=then_branch, else_branch=else_branch, name="if"),
        helper.make_node("Relu", ["i"], ["Y"], name="relu"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", F, [4]), tensor_info("C", TensorProto.BOOL, [])],
        [tensor_info("Y", F, [4])],
        {"k": np.float32(1e-3)},
    )
    feeds = {"X": np.array([11.0, 11.5, 2.0, -1.0], np.float32), "C": np.array(True)}  # exp(11.5) ~ 1e5
    out = _convert(model, calibration_data=feeds)
    branch = next(
        a.g for a in onnx.shape_inference.infer_shapes(out).graph.node[0].attribute if a.name == "then_branch"
    )
    types = {v.name: v.type.tensor_type.elem_type for v in branch.value_info}
    exp = next(n for n in branch.node if n.op_type == "Exp")
    assert types[exp.output[0]] == F  # ONNX Runtime on CPU would hide an FP16 Exp (it runs it in FP32); GPUs not
    _close(model, out, feeds)


# 9. Random masks include padding; an unmeasured tensor is not "in range"


def test_unmeasured_float_tensors_are_not_in_range() -> None:
    x, y = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT)), ir.Value(name="y")
    node = ir.Node("", "Exp", [x], outputs=[y])
    y.type = ir.TensorType(ir.DataType.FLOAT)
    ir.Node("", "Relu", [y])  # y is read; an output nothing reads is never measured and never decides
    rule = DataRangeRule(512)
    stats = {"x": TensorStats(1.0, -1.0, 1.0, (4,), np.dtype(np.float32))}
    assert "was not measured" in (rule(node, RuleContext(stats=stats)) or "")
    stats["y"] = TensorStats(2.7, 0.3, 2.7, (4,), np.dtype(np.float32))
    assert rule(node, RuleContext(stats=stats)) is None


def test_padding_masks_are_measured_and_masked_rows_stay_finite() -> None:
    """A -1e9 additive mask built from an integer mask: random masks with padding keep it out of FP16."""
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["m"], to=F, name="cast"),
        helper.make_node("Sub", ["one", "m"], ["inv"], name="invert"),
        helper.make_node("Mul", ["inv", "fill"], ["bias"], name="fill"),
        helper.make_node("Unsqueeze", ["bias", "ax"], ["b3"], name="unsqueeze"),
        helper.make_node("MatMul", ["X", "Xt"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "b3"], ["masked"], name="add_mask"),
        helper.make_node("Softmax", ["masked"], ["Y"], axis=-1, name="softmax"),
    ]
    inputs = [
        tensor_info("attention_mask", I64, ["batch", "seq"]),
        tensor_info("X", F, ["batch", "seq", "seq"]),
        tensor_info("Xt", F, ["batch", "seq", "seq"]),
    ]
    inits = {"one": np.float32(1), "fill": np.float32(-1e9), "ax": np.array([1], np.int64)}
    model = make_model(nodes, inputs, [tensor_info("Y", F, ["batch", "seq", "seq"])], inits)
    out = _convert(model)
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], np.int64)  # the second row is fully masked
    feeds = {"attention_mask": mask, **{k: RNG.standard_normal((2, 4, 4)).astype(np.float32) for k in ("X", "Xt")}}
    got = np.asarray(run(out, feeds)[0], np.float32)
    assert np.isfinite(got).all()  # a fully masked row is no NaN; its values are arbitrary (FP32's too)
    np.testing.assert_allclose(got[0], run(model, feeds)[0][0], rtol=1e-2, atol=1e-2)


# 10. A missing ORT FP16 kernel keeps that node in FP32 (with a warning); no false NON-FINITE warning


def test_node_without_an_fp16_kernel_is_converted_again_in_fp32(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("ScatterND", ["r", "idx", "U"], ["Y"], reduction="add", name="scatter"),
    ]
    inputs = [tensor_info("X", F, [4, 3]), tensor_info("U", F, [2, 3])]
    model = make_model(nodes, inputs, [tensor_info("Y", F, [4, 3])], {"idx": np.array([[0], [2]], np.int64)})
    before = model.SerializeToString()
    with caplog.at_level(logging.WARNING):
        out = _convert(model)
    assert model.SerializeToString() == before  # converted again from the untouched source
    assert any("ScatterND node 'scatter'" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "scatter" not in _low_nodes(out) and "relu" in _low_nodes(out)
    feeds = {"X": RNG.standard_normal((4, 3)).astype(np.float32), "U": RNG.standard_normal((2, 3)).astype(np.float32)}
    _close(model, out, feeds)


def test_no_non_finite_warning_when_fp32_itself_gives_nan(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [helper.make_node("Sqrt", ["X"], ["s"], name="sqrt"), helper.make_node("Relu", ["s"], ["Y"], name="relu")]
    model = make_model(nodes, [tensor_info("X", F, [4])], [tensor_info("Y", F, [4])])
    feeds = {"X": np.array([-1.0, 4.0, 9.0, 0.25], np.float32)}  # sqrt(-1) is NaN in FP32 already
    with caplog.at_level(logging.INFO):
        _convert(model, calibration_data=feeds)
    assert not any("NON-FINITE" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("low", "providers", "retried"), [("fp16", ["cpu"], True), ("bf16", ["cpu"], False),
                                                           ("bf16", ["cuda"], True)])  # fmt: skip
def test_a_kernel_gap_is_worked_around_where_the_check_ran(low: str, providers: list[str], retried: bool) -> None:
    # ORT 1.31 on CUDA, for LFM2-MoE in BF16: no provider has a BF16 Reciprocal, which it says as "Provider type for
    # Reciprocal node with name 'N' is not set". BF16 gaps are worked around on GPU providers only (on the CPU
    # nearly every BF16 op has no kernel, and BF16 models are meant for GPUs).
    from onnxprec.autocast.classify import Decision
    from onnxprec.autocast.kernel_gaps import KernelGap, raise_kernel_gap
    from onnxprec.validate import NumericReport, _no_kernel

    error = (
        "Exception during initialization: transformer_memcpy.cc:253 ... Provider type for Reciprocal node with name "
        "'/router/Reciprocal' is not set."
    )
    assert _no_kernel(error)
    node = ir.Node("", "Reciprocal", [ir.Value(name="x")], name="/router/Reciprocal")
    report = type("Report", (), {"decisions": {node: Decision(low=True, reason="default")}})()
    numeric = NumericReport(skipped=f"ONNX Runtime could not run the converted model: {error}", failed_node=node.name)
    options = AutoCastOptions(low_precision_type=low, providers=providers)
    gaps = []
    try:
        raise_kernel_gap(numeric, report, options, "model.onnx", {})  # type: ignore[arg-type]
    except KernelGap as gap:
        gaps.append((gap.key, gap.reason))
    assert gaps == ([("/router/Reciprocal", f"ONNX Runtime cannot run Reciprocal in {low.upper()} here")]
                    if retried else [])  # fmt: skip


def test_the_node_orts_message_names_is_read_past_our_first_line() -> None:
    # ORT 1.31 on CUDA names the node only after a long first line; our error keeps the first line and chains ORT's.
    from onnxprec.validate import _chain_text, _no_kernel

    ort_error = RuntimeError(
        "[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: transformer_memcpy.cc:253 bool f()\n"
        "Provider type for Reciprocal node with name '/moe/router/sigmoid/Reciprocal' is not set."
    )
    try:
        try:
            raise ort_error
        except RuntimeError as e:
            raise CalibrationDataError("ONNX Runtime cannot load the converted model: [ONNXRuntimeError] : 1") from e
    except CalibrationDataError as ours:
        text = _chain_text(ours)
    assert "'/moe/router/sigmoid/Reciprocal'" in text and _no_kernel(text)


def test_an_unnamed_node_ort_cannot_run_is_kept_in_fp32_by_its_op_and_rank() -> None:
    # ORT names an unnamed node '' ("Provider type for Less node with name '' is not set", LFM2-MoE in BF16 on CUDA):
    # the only unnamed Less that went low is that node, and its key survives converting again from the file.
    from onnxprec.autocast.classify import Decision
    from onnxprec.autocast.kernel_gaps import KernelGap, node_keys, raise_kernel_gap
    from onnxprec.validate import NumericReport

    less = ir.Node("", "Less", [ir.Value(name="a"), ir.Value(name="b")])
    named = ir.Node("", "Less", [ir.Value(name="c"), ir.Value(name="d")], name="kept")
    report = type("Report", (), {"decisions": {named: Decision(low=True, reason=""), less: Decision(True, "")}})()
    numeric = NumericReport(skipped="cannot load", failed_node="", failed_op="Less")
    options = AutoCastOptions(low_precision_type="bf16", providers=["cuda"])
    with pytest.raises(KernelGap) as gap:
        raise_kernel_gap(numeric, report, options, "model.onnx", {})  # type: ignore[arg-type]
    assert gap.value.key == "<unnamed Less #1>" == node_keys([named, less])[less]


def test_convert_file_refuses_an_unknown_keyword_in_one_line(tmp_path: Path) -> None:
    # As the quantizers do: an unknown keyword names the tool and the closest option instead of a raw TypeError,
    # and nothing is written.
    from onnxprec.autocast import convert_file
    from onnxprec.errors import InvalidArgumentError

    message = "Unknown AutoCast option 'keep_io_type'. Did you mean 'keep_io_types'?"
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        convert_file(tmp_path / "m.onnx", tmp_path / "out.onnx", keep_io_type=True)
    assert not (tmp_path / "out.onnx").exists()
