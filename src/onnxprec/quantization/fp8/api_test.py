"""The FP8 tool end to end on tiny models: the Q/DQ format (checker, strict shapes, FP8 types), its numerics in ONNX
Runtime against the ONNX reference implementation, ModelOpt's FP8 Conv rules, the entry points and refusals."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from onnxprec._ort import create_session
from onnxprec._testing import run_cli
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import quantize
from onnxprec.quantization._testing import correlated, mlp, tiny_cnn
from onnxprec.quantization.fp8 import Fp8Options, quantize_file

FP8 = onnx.TensorProto.FLOAT8E4M3FN


def _tokens(seed: int, batches: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"X": correlated(32, 64, seed=seed + i, outliers=False).reshape(2, 16, 64)} for i in range(batches)]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The Q/DQ graph as written (no ONNX Runtime rewrites), FP32 out."""
    return np.asarray(create_session(str(path), optimization="none").run(feeds)[0], dtype=np.float32)


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("remainder", ["fp16", "fp32"])
def test_fp8_weights_per_channel_and_activations_per_tensor(tmp_path: Path, mlp_file: Path, remainder: str) -> None:
    out = tmp_path / "fp8.onnx"
    report = quantize_file(mlp_file, out, calibration_data=_tokens(0), high_precision_dtype=remainder)
    assert report.TOOL == "quantize fp8" and report.summary.startswith("FP8 for trt: 4/4 layers quantized")
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producers = _producers(graph)
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 4
    scale_type = onnx.TensorProto.FLOAT16 if remainder == "fp16" else onnx.TensorProto.FLOAT
    for node in matmuls:
        x_dq, w_dq = producers[node.input[0]], producers[node.input[1]]
        assert x_dq.op_type == w_dq.op_type == "DequantizeLinear"
        assert producers[x_dq.input[0]].op_type == "QuantizeLinear"
        assert inits[x_dq.input[1]].dims == [] and inits[x_dq.input[2]].data_type == FP8  # per tensor, FP8
        weight, scales, zeros = (inits[name] for name in w_dq.input)
        assert weight.data_type == FP8 and zeros.data_type == FP8 and scales.data_type == scale_type
        assert list(scales.dims) == [weight.dims[1]] and next(a.i for a in w_dq.attribute if a.name == "axis") == 1
        levels = onnx.numpy_helper.to_array(weight).astype(np.float32)
        top = np.abs(levels).max(axis=0)  # each channel's largest weight within FP8's top binade (aligned)
        assert np.all((top > 224.0) & (top <= 448.0))
    x = _tokens(100, 1)[0]
    float_out = _run(mlp_file, x)
    got = _run(out, x)
    assert _rel(float_out, got) < 0.1  # FP8 keeps 3 mantissa bits: about 3 % per rounding
    if remainder == "fp32":  # (an FP16 remainder's roundings differ between the two and move FP8 roundings)
        golden = ReferenceEvaluator(model).run(None, x)[0].astype(np.float32)  # onnx.reference: the spec's numerics
        assert _rel(golden, got) < 1e-5


def test_modelopts_fp8_conv_rules(tmp_path: Path) -> None:
    """ModelOpt 0.47's FP8 Convs: 16 or fewer input (per group) or output channels stay float, so every depthwise
    Conv; the GEMM with N < 16 too."""
    source, out = tmp_path / "cnn.onnx", tmp_path / "fp8.onnx"
    onnx.save(tiny_cnn(channels=32), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    report = quantize_file(source, out, calibration_data=data, accuracy_guard=False)
    assert [layer.name for layer in report.layers] == ["/project/Conv"] and report.count("static") == 1
    skipped = dict(report.skipped)
    assert skipped["/stem/Conv"].startswith("TensorRT FP8: a Conv of 3 input / 32 output channels")
    assert skipped["/dw/Conv"].startswith("TensorRT FP8: a Conv of 1 input / 32 output channels")
    assert skipped["/fc/Gemm"].startswith("TensorRT: a GEMM with K=32, N=10 (< 16) stays float")
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    assert _rel(_run(source, x), _run(out, x)) < 0.05


def test_conv_weights_rounded_by_gptq_on_fp8_levels(tmp_path: Path) -> None:
    """``weight_rounding`` auto (the default): a Conv's FP8 weights are GPTQ's roundings on the grid rounding to
    nearest has (the same scales), and its output on the calibration data is closer to the float one."""
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(channels=32), source)
    rng = np.random.default_rng(1)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    written = {}
    for rounding in ("auto", "rtn"):
        out = tmp_path / f"{rounding}.onnx"
        report = quantize_file(source, out, calibration_data=data, accuracy_guard=False, weight_rounding=rounding,
                               high_precision_dtype="fp32")  # fmt: skip
        (entry,) = report.layers
        assert entry.name == "/project/Conv" and entry.info["rounding"] == ("gptq" if rounding == "auto" else "rtn")
        model = onnx.load(str(out))
        onnx.checker.check_model(model, full_check=True)
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
        conv = next(n for n in model.graph.node if n.name == "/project/Conv")
        dq = _producers(model.graph)[conv.input[1]]
        written[rounding] = inits[dq.input[0]], inits[dq.input[1]], out
    (gptq, gptq_scales, gptq_file), (rtn, rtn_scales, rtn_file) = written["auto"], written["rtn"]
    assert gptq.dtype == rtn.dtype == ml_dtypes.float8_e4m3fn and np.array_equal(gptq_scales, rtn_scales)
    assert not np.array_equal(gptq.astype(np.float32), rtn.astype(np.float32))
    errors = {}
    for name, path in (("gptq", gptq_file), ("rtn", rtn_file)):
        errors[name] = np.mean([_rel(_run(source, feeds), _run(path, feeds)) for feeds in data])
    assert errors["gptq"] < errors["rtn"]


@pytest.mark.slow
def test_modelopt_entry_point_and_command_line(tmp_path: Path, mlp_file: Path) -> None:
    report = quantize(str(mlp_file), quantize_mode="fp8", calibration_data=_tokens(0), output_path=tmp_path / "a.onnx")
    assert report.TOOL == "quantize fp8" and report.to_json()["tool"] == "quantize fp8"
    data = tmp_path / "data.npz"
    np.savez(data, X=np.concatenate([b["X"] for b in _tokens(0)]))
    result = run_cli("quantize", "fp8", "--onnx_path", str(mlp_file), "--calibration_data_path", str(data),
                     "--output_path", str(tmp_path / "b.onnx"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "FP8 for trt: 4/4 layers quantized" in result.stdout
    same = [n.op_type for n in onnx.load(str(tmp_path / "b.onnx")).graph.node]
    assert same == [n.op_type for n in onnx.load(str(tmp_path / "a.onnx")).graph.node]


def test_refusals_are_one_line(tmp_path: Path, mlp_file: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="ONNX Runtime's CPU provider has no FP8 kernels"):
        Fp8Options(runtime="ort-cpu")
    with pytest.raises(InvalidArgumentError, match="FP8's activations are FP8"):
        Fp8Options(activation_type="int16")
    result = run_cli("quantize", "fp8", "--onnx_path", str(mlp_file), "--runtime", "ort-cpu")
    assert result.returncode == 2 and "invalid choice: 'ort-cpu'" in result.stderr
    result = run_cli("quantize", "fp8", "--onnx_path", str(mlp_file), "--activation_type", "int16")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [result.stderr.strip()]


def test_levels_match_onnx_runtime_quantize_linear(tmp_path: Path, mlp_file: Path) -> None:
    """The FP8 weights written are what ONNX Runtime's QuantizeLinear computes from the float weight and scales."""
    out = tmp_path / "fp8.onnx"
    quantize_file(mlp_file, out, calibration_data=_tokens(0), high_precision_dtype="fp32")
    source = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(mlp_file)).graph.initializer}
    graph = onnx.load(str(out)).graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    producers = _producers(graph)
    node = next(n for n in graph.node if n.name == "/model/layers.0/o_proj/MatMul")
    w_dq = producers[node.input[1]]
    levels, scales = inits[w_dq.input[0]], inits[w_dq.input[1]]
    assert levels.dtype == ml_dtypes.float8_e4m3fn
    q = onnx.helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], axis=1)
    zeros = onnx.helper.make_tensor("z", FP8, [len(scales)], [0] * len(scales))
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(
            [q], "q", [onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, list(levels.shape))],
            [onnx.helper.make_tensor_value_info("q", FP8, list(levels.shape))],
            [onnx.numpy_helper.from_array(scales, "s"), zeros],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 19)],
    )  # fmt: skip
    (expected,) = create_session(proto, optimization="none").run({"w": source["Wo"]})
    assert np.array_equal(expected.view(np.uint8), levels.view(np.uint8))


def test_a_one_shot_reader_serves_the_fp16_remainder_too(tmp_path: Path, mlp_file: Path) -> None:
    """ModelOpt's and ORT's readers are read once: AutoCast's FP16 remainder reuses the data INT8 already read."""

    class Reader:  # ONNX Runtime's CalibrationDataReader protocol
        def __init__(self) -> None:
            self.batches = iter(_tokens(0))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    out = tmp_path / "fp8.onnx"
    report = quantize_file(mlp_file, out, calibration_data=Reader(), high_precision_dtype="fp16")
    assert report.summary.startswith("FP8 for trt: 4/4 layers quantized")
    feeds = _tokens(9, 1)[0]
    assert _rel(_run(mlp_file, feeds), _run(out, feeds)) < 0.1


def test_without_data_fp8_refuses_in_one_line_as_int8_does(tmp_path: Path) -> None:
    from onnxprec.errors import CalibrationDataError

    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    with pytest.raises(CalibrationDataError, match=r"^No calibration data: FP8.s activation ranges .* pass"):
        quantize_file(source, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def _gemv_model() -> onnx.ModelProto:
    """One row a run (a wake-word head): every Gemm is a GEMV, which TensorRT's FP8 rules keep float."""
    rng = np.random.default_rng(3)
    h = onnx.helper
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)
             for name, shape in (("W1", (64, 32)), ("B1", (32,)), ("W2", (32, 1)), ("B2", (1,)))]  # fmt: skip
    nodes = [
        h.make_node("Gemm", ["X", "W1", "B1"], ["h"], name="Gemm_0"),
        h.make_node("Relu", ["h"], ["r"]),
        h.make_node("Gemm", ["r", "W2", "B2"], ["z"], name="Gemm_1"),
        h.make_node("Sigmoid", ["z"], ["Y"]),
    ]
    graph = h.make_graph(nodes, "gemv", [h.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [1, 64])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [1, 1])], inits)  # fmt: skip
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])


def test_every_layer_kept_fp16_by_tensorrts_rules_writes_the_fp16_remainder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As ModelOpt: no layer for FP8 (GEMVs) -> the model written without Q/DQ, its remainder FP16, one WARNING,
    judged by the guard as any result; INT8's TensorRT placement still refuses it."""
    from onnxprec.errors import UnsupportedModelError
    from onnxprec.quantization.int8 import quantize_file as int8_quantize_file

    source, out = tmp_path / "gemv.onnx", tmp_path / "fp8.onnx"
    onnx.save(_gemv_model(), source)
    rng = np.random.default_rng(4)
    data = [{"X": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(16)]
    with caplog.at_level("WARNING"):
        report = quantize_file(source, out, calibration_data=data)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("FP8 quantizes none of the 2 candidate layers ('Gemm_0'")
    assert "TensorRT: a GEMV at batch 1 (an output of 1 or 2 axes, one of them 1) stays float" in warnings[0]
    assert report.summary.startswith("FP8 for trt: 0/0 layers quantized")
    assert "none quantized: the placement rules skipped all 2 candidates" in report.summary
    assert report.check["passed"] and report.check["guard"] == "on" and report.autocast
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops and ops.count("Cast") == 2  # FP32 I/O
    assert {i.data_type for i in model.graph.initializer} == {onnx.TensorProto.FLOAT16}
    for seed in range(3):
        feeds = {"X": np.random.default_rng(10 + seed).standard_normal((1, 64)).astype(np.float32)}
        assert _rel(_run(source, feeds), _run(out, feeds)) < 1e-2
    with pytest.raises(UnsupportedModelError, match=r"Nothing to quantize.*TensorRT: a GEMV"):
        int8_quantize_file(source, tmp_path / "int8.onnx", calibration_data=data, runtime="trt")
    assert not (tmp_path / "int8.onnx").exists()


def test_a_remainder_only_result_that_misses_the_guard_is_refused_not_written_as_the_input(tmp_path: Path) -> None:
    """No layer for FP8 and the FP16 remainder loses the output (weights of 300 + d whose d, below FP16's spacing
    there, is all the output carries): refused by the guard (exit 3), as any result that misses it."""
    from onnxprec.errors import AccuracyGuardError

    rng = np.random.default_rng(5)
    h = onnx.helper
    w = (300 + rng.standard_normal((64, 1)) * 0.05).astype(np.float32)
    nodes = [h.make_node("Gemm", ["X", "W"], ["Y"], name="Gemm_0")]
    graph = h.make_graph(nodes, "cancel", [h.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [1, 64])],
                         [h.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [1, 1])],
                         [onnx.numpy_helper.from_array(w, "W")])  # fmt: skip
    source = tmp_path / "cancel.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), source)
    data = []
    for _ in range(16):
        a = rng.standard_normal((1, 32)).astype(np.float32)
        data.append({"X": np.concatenate([a, -a], axis=1)})  # the 300s cancel
    with pytest.raises(AccuracyGuardError):
        quantize_file(source, tmp_path / "fp8.onnx", calibration_data=data)
    written = onnx.load(str(tmp_path / "fp8.onnx"))  # for inspection: the FP16 remainder, not the input model
    assert {i.name: i.data_type for i in written.graph.initializer}["W"] == onnx.TensorProto.FLOAT16


def test_fp8_keeps_modelopts_fp16_remainder_and_refuses_when_it_misses(tmp_path: Path) -> None:
    """A float MatMul whose weights (300 plus small terms, on inputs whose halves cancel) lose the output in FP16, then
    an FP8 MatMul: refused with FP8's FP16 remainder; with ``high_precision_dtype`` fp32 asked for, it holds."""
    from onnxprec.errors import AccuracyGuardError
    from onnxprec.quantization._testing import cancelling

    source = tmp_path / "m.onnx"
    runs = cancelling(source, (1, 32, 64), scale=1 / 8, opset=13)
    common = {"calibration_data": runs, "nodes_to_exclude": ["cancel"]}
    with pytest.raises(AccuracyGuardError, match="misses the accuracy guard"):
        quantize_file(source, tmp_path / "fp16.onnx", **common)
    report = quantize_file(source, tmp_path / "fp32.onnx", high_precision_dtype="fp32", **common)
    assert report.check["passed"] and report.float_type == "fp32"
    assert report.layers and all(layer.name == "mm" for layer in report.layers)


def _gelu_block() -> onnx.ModelProto:
    """MatMul + bias, a tanh GELU written out (``x + 0.044715 x³`` is an Add of ``x`` and a function of it), MatMul +
    bias, and a residual Add of the block's input."""
    rng = np.random.default_rng(5)
    h = onnx.helper
    inits = [onnx.numpy_helper.from_array(np.asarray(value, np.float32), name) for name, value in (
        ("W1", rng.standard_normal((64, 64)) * 0.15), ("B1", rng.standard_normal(64) * 0.1),
        ("W2", rng.standard_normal((64, 64)) * 0.15), ("B2", rng.standard_normal(64) * 0.1),
        ("c", 0.044715), ("k", 0.7978846), ("one", 1.0), ("half", 0.5))]  # fmt: skip
    nodes = [
        h.make_node("MatMul", ["X", "W1"], ["m1"], name="up/MatMul"),
        h.make_node("Add", ["m1", "B1"], ["x"], name="up/bias"),
        h.make_node("Mul", ["x", "x"], ["x2"], name="gelu/Mul"),
        h.make_node("Mul", ["x2", "x"], ["x3"], name="gelu/Mul_1"),
        h.make_node("Mul", ["x3", "c"], ["cx3"], name="gelu/Mul_2"),
        h.make_node("Add", ["x", "cx3"], ["inner"], name="gelu/Add"),
        h.make_node("Mul", ["inner", "k"], ["scaled"], name="gelu/Mul_3"),
        h.make_node("Tanh", ["scaled"], ["t"], name="gelu/Tanh"),
        h.make_node("Add", ["t", "one"], ["t1"], name="gelu/Add_1"),
        h.make_node("Mul", ["x", "t1"], ["xt"], name="gelu/Mul_4"),
        h.make_node("Mul", ["xt", "half"], ["g"], name="gelu/Mul_5"),
        h.make_node("MatMul", ["g", "W2"], ["m2"], name="down/MatMul"),
        h.make_node("Add", ["m2", "B2"], ["y"], name="down/bias"),
        h.make_node("Add", ["y", "X"], ["Y"], name="residual/Add"),
    ]
    value = onnx.helper.make_tensor_value_info
    graph = h.make_graph(nodes, "gelu", [value("X", onnx.TensorProto.FLOAT, [2, 16, 64])],
                         [value("Y", onnx.TensorProto.FLOAT, [2, 16, 64])], inits)  # fmt: skip
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_the_add_inside_a_tanh_gelu_stays_float_the_residual_add_gets_qdq(tmp_path: Path) -> None:
    """As ModelOpt: ``x + 0.044715 x³`` is part of the activation (no Q/DQ on its inputs, nor on ``x`` for the
    GELU's Muls); the residual Add of the block's output and input reads FP8 Q/DQ on both."""
    source, out = tmp_path / "gelu.onnx", tmp_path / "fp8.onnx"
    onnx.save(_gelu_block(), source)
    data = _tokens(0)
    quantize_file(source, out, calibration_data=data, accuracy_guard=False, high_precision_dtype="fp32")
    graph = onnx.load(str(out)).graph
    producers = _producers(graph)

    def reads_dq(name: str) -> list[bool]:
        node = next(n for n in graph.node if n.name == name)
        return [name_ in producers and producers[name_].op_type == "DequantizeLinear" for name_ in node.input]

    assert reads_dq("gelu/Add") == [False, False] and reads_dq("gelu/Mul") == [False, False]
    assert reads_dq("residual/Add") == [True, True]
    assert reads_dq("up/MatMul") == reads_dq("down/MatMul") == [True, True]
    feeds = _tokens(50, 1)[0]
    assert _rel(_run(source, feeds), _run(out, feeds)) < 0.1
