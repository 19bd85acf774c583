"""The INT8 tool end to end on tiny models: what ONNX Runtime fuses, accuracy, fallback, placements, entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import run
from onnxprec.quantization import CalibrationMethod, quantize, quantize_static
from onnxprec.quantization._testing import correlated, mlp, optimized_ops, tiny_cnn
from onnxprec.quantization.int8 import quantize_file


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


def _tokens(seed: int, batches: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"X": correlated(32, 64, seed=seed + i).reshape(2, 16, 64)} for i in range(batches)]


def test_transformer_layers_are_dynamic_and_fuse(tmp_path: Path, mlp_file: Path) -> None:
    out = tmp_path / "q.onnx"
    report = quantize_file(mlp_file, out, calibration_data=_tokens(0), target_accuracy=None)
    assert report.count("dynamic") == 4 and report.static_tensors == 0
    ops = optimized_ops(out, tmp_path)
    # the layers that share an input (q and k) are one layer with their weights side by side, and a Split
    assert ops.count("DynamicQuantizeMatMul") == 3 and ops.count("Split") == 1
    assert "DequantizeLinear" not in ops and "MatMulInteger" not in ops and "MatMulIntegerToFloat" not in ops
    x = _tokens(100, 1)[0]
    (ref,), (got,) = run(mlp_file, x), run(out, x)
    assert _rel(ref, got) < 0.05
    data = report.to_json()
    assert data["tool"] == "quantize int8" and data["counts"]["dynamic"] == 4
    assert all(layer["bias_corrected"] for layer in data["layers"])


@pytest.mark.slow
@pytest.mark.parametrize("float_linear_outputs", [True, False])
def test_convolutions_are_static_and_every_conv_fuses(tmp_path: Path, float_linear_outputs: bool) -> None:
    """Convs static (QLinearConv), the classifier Gemm dynamic (its own range each run: a pooled feature of an unseen
    input may exceed the calibrated range) and fused with its bias. By default the project Conv (pointwise, no
    activation after it) is MatMulIntegerToFloat and the residual Add float; without that, QLinearConv and
    QLinearAdd."""
    source, out = tmp_path / "cnn.onnx", tmp_path / "q.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    # nodes_to_quantize ('.*') also quantizes the first Conv, which reads the model input (float by default)
    report = quantize_file(source, out, calibration_data=data, calibration_method="max", target_accuracy=None,
                           nodes_to_quantize=[".*"], float_linear_outputs=float_linear_outputs)  # fmt: skip
    assert report.count("static") == 3 and report.count("dynamic") == 1
    ops = optimized_ops(out, tmp_path)
    assert "Conv" not in ops and "FusedConv" not in ops
    assert "Pad" not in ops and "Clip" not in ops and "Relu" not in ops  # folded and absorbed
    assert ops.count("DynamicQuantizeMatMul") == 1 and "Gemm" not in ops
    if float_linear_outputs:
        assert ops.count("QLinearConv") == 2 and ops.count("MatMulIntegerToFloat") == 1
        assert ops.count("Add") == 1 and "QLinearAdd" not in ops
        # the MatMulIntegerToFloat's Transposes cancel against those of the channels-last QLinearConvs
        assert ops.count("Transpose") == 1
    else:
        assert ops.count("QLinearConv") == 3 and "QLinearAdd" in ops and "Add" not in ops
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got) < 0.05


def _two_blocks(path: Path) -> None:
    """Two inverted-residual blocks: stem Conv 3x3 + Clip, project Conv 1x1, Add; expand Conv 1x1 + Clip, project
    Conv 1x1, Add (the first block's output is the second's residual)."""
    from onnx import helper

    from onnxprec._testing import F, make_model, tensor_info

    rng = np.random.default_rng(3)
    inits = {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
             "w0": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)}  # fmt: skip
    for name, shape in (("p1", (8, 8)), ("e", (16, 8)), ("p2", (8, 16))):
        inits[name] = (rng.standard_normal((*shape, 1, 1)) * 0.4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="/stem/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="/stem/Clip"),
        helper.make_node("Conv", ["a0", "p1"], ["y1"], name="/b1/project/Conv", kernel_shape=[1, 1]),
        helper.make_node("Add", ["y1", "a0"], ["r1"], name="/b1/Add"),
        helper.make_node("Conv", ["r1", "e"], ["ce"], name="/b2/expand/Conv", kernel_shape=[1, 1]),
        helper.make_node("Clip", ["ce", "lo", "hi"], ["ae"], name="/b2/Clip"),
        helper.make_node("Conv", ["ae", "p2"], ["y2"], name="/b2/project/Conv", kernel_shape=[1, 1]),
        helper.make_node("Add", ["y2", "r1"], ["out"], name="/b2/Add"),
    ]
    shape = ["N", 8, "H", "W"]
    onnx.save(make_model(nodes, [tensor_info("x", F, shape)], [tensor_info("out", F, shape)], inits), path)


@pytest.mark.slow
def test_a_pointwise_conv_that_only_an_int8_conv_reads_keeps_a_quantized_output(tmp_path: Path) -> None:
    """A project Conv with no residual Add after it (a single-block stage) is read only by the next Conv, which
    quantizes it either way: it stays QLinearConv (no MatMulIntegerToFloat, no QuantizeLinear of its own); the
    one whose output an Add reads writes float."""
    from onnx import helper

    from onnxprec._testing import F, make_model, tensor_info

    rng = np.random.default_rng(5)
    inits = {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
             "w0": (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)}  # fmt: skip
    for name in ("p1", "e", "p2"):
        inits[name] = (rng.standard_normal((8, 8, 1, 1)) * 0.4).astype(np.float32)
    shape = ["N", 8, "H", "W"]
    source, out = tmp_path / "stage.onnx", tmp_path / "q.onnx"
    data = [{"x": rng.standard_normal((2, 8, 6, 6)).astype(np.float32)} for _ in range(4)]

    def float_outputs(residual: str) -> dict[str, object]:
        """Quantizes the stage whose last Add reads ``residual``; each layer's output kind."""
        nodes = [
            helper.make_node("Conv", ["x", "w0"], ["c0"], name="/stem/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="/stem/Clip"),
            helper.make_node("Conv", ["a0", "p1"], ["y1"], name="/b1/project/Conv", kernel_shape=[1, 1]),
            helper.make_node("Conv", ["y1", "e"], ["ce"], name="/b2/expand/Conv", kernel_shape=[1, 1]),
            helper.make_node("Clip", ["ce", "lo", "hi"], ["ae"], name="/b2/Clip"),
            helper.make_node("Conv", ["ae", "p2"], ["y2"], name="/b2/project/Conv", kernel_shape=[1, 1]),
            helper.make_node("Add", ["y2", residual], ["out"], name="/b2/Add"),
        ]
        onnx.save(make_model(nodes, [tensor_info("x", F, shape)], [tensor_info("out", F, shape)], inits), source)
        report = quantize_file(source, out, calibration_data=data, target_accuracy=None, nodes_to_quantize=[".*"])
        return {layer.name: layer.info.get("output") for layer in report.layers}

    # y1 is read by the expand Conv and by the Add: a float op reads it, so it is float too
    outputs = float_outputs("y1")
    assert outputs["/b2/project/Conv"] == "float (MatMulIntegerToFloat)"
    assert outputs["/b1/project/Conv"] == "float (MatMulIntegerToFloat)"
    outputs = float_outputs("ae")  # now only the expand Conv reads y1
    assert outputs["/b1/project/Conv"] != "float (MatMulIntegerToFloat)"
    assert outputs["/b2/project/Conv"] == "float (MatMulIntegerToFloat)"
    optimized = optimized_ops(out, tmp_path)
    assert optimized.count("MatMulIntegerToFloat") == 1 and optimized.count("QLinearConv") == 3
    x = {"x": rng.standard_normal((2, 8, 6, 6)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got) < 0.03


def test_the_residual_stream_stays_float_between_pointwise_convs(tmp_path: Path) -> None:
    """Each project Conv (pointwise, unclipped) writes float, both residual Adds are float and read float values (no
    DequantizeLinear), and only the expand Conv quantizes the stream it reads."""
    source, out = tmp_path / "blocks.onnx", tmp_path / "q.onnx"
    _two_blocks(source)
    rng = np.random.default_rng(4)
    data = [{"x": rng.standard_normal((2, 8, 6, 6)).astype(np.float32)} for _ in range(4)]
    report = quantize_file(source, out, calibration_data=data, target_accuracy=None, nodes_to_quantize=[".*"])
    assert report.count("static") == 4
    graph = onnx.load(out).graph
    producer = {o: n for n in graph.node for o in n.output}
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and ops.count("Conv") == 2
    second = next(n for n in graph.node if n.name == "/b2/Add")
    assert [producer[i].op_type for i in second.input] == ["Transpose", "Add"]  # float y2, float r1
    expand = next(n for n in graph.node if n.name == "/b2/expand/Conv")
    assert producer[expand.input[0]].op_type == "DequantizeLinear"
    optimized = optimized_ops(out, tmp_path)
    assert optimized.count("QLinearConv") == 2 and optimized.count("MatMulIntegerToFloat") == 2
    x = {"x": rng.standard_normal((2, 8, 6, 6)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got) < 0.03


@pytest.mark.slow
def test_two_int8_parts_for_pointwise_convs_too_few_rows_for_gptq(tmp_path: Path) -> None:
    """Calibrated on one 2x2 image (4 rows, fewer than the project Convs' 8 and 16 inputs): their weights are rounded
    to nearest, and with two_part_weights the rounding error gets a second INT8 part: the weight the two
    MatMulIntegerToFloat compute together is 100 times closer to the float weight, and the bias is the float one (no
    bias correction left to make)."""
    from onnx import numpy_helper

    source = tmp_path / "blocks.onnx"
    _two_blocks(source)
    float_inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(source).graph.initializer}
    rng = np.random.default_rng(5)
    data = [{"x": rng.standard_normal((1, 8, 2, 2)).astype(np.float32)}]
    for two in (False, True):
        out = tmp_path / f"q{int(two)}.onnx"
        report = quantize_file(source, out, calibration_data=data, target_accuracy=None,
                               nodes_to_quantize=[".*project"], two_part_weights=two)  # fmt: skip
        rounding = {e.name: e.info["rounding"] for e in report.layers}
        expected = "rtn, two INT8 parts" if two else "rtn"
        assert rounding == {"/b1/project/Conv": expected, "/b2/project/Conv": expected}
        model = onnx.load(out)
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        matmuls = [n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat"]
        assert len(matmuls) == (4 if two else 2)
        for weight in ("p1", "p2"):
            parts = [n for n in matmuls if n.input[1].startswith(f"{weight}_")]
            computed = sum(inits[n.input[1]].astype(np.float64) * inits[n.input[3]] for n in parts)
            reference = float_inits[weight][:, :, 0, 0].T
            error = np.abs(computed - reference).max() / np.abs(reference).max()
            assert (error < 1e-4) if two else (1e-3 < error < 1e-2), (weight, error)
            # the model has no biases: one INT8 part gets a bias correction, two need none
            bias = inits[next(n for n in parts if len(n.input) > 6).input[6]]
            assert np.all(bias == 0) == two, bias


def test_a_layer_kept_in_float_stays_float_in_onnx_runtime(tmp_path: Path) -> None:
    """ONNX Runtime quantizes the float weight of a Conv between DequantizeLinear and QuantizeLinear to per-tensor
    INT8 by itself (WeightBiasQuantization): an excluded Conv must not look like that."""
    source, out = tmp_path / "cnn.onnx", tmp_path / "q.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(1)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    report = quantize_file(
        source,
        out,
        calibration_data=data,
        nodes_to_exclude=["^/dw/Conv$"],
        target_accuracy=None,
        nodes_to_quantize=[".*"],
    )  # fmt: skip  (the first Conv quantized too)
    assert report.count("static") == 2 and report.excluded == [("/dw/Conv", "^/dw/Conv$")]
    ops = optimized_ops(out, tmp_path)
    # the stem Conv QLinearConv, the project Conv MatMulIntegerToFloat (its output is not clipped)
    assert ops.count("QLinearConv") == 1 and ops.count("MatMulIntegerToFloat") == 1
    assert ops.count("FusedConv") + ops.count("Conv") == 1


@pytest.mark.slow
def test_the_target_sends_the_most_sensitive_layers_back_to_float(tmp_path: Path, mlp_file: Path) -> None:
    plain = quantize_file(mlp_file, tmp_path / "a.onnx", calibration_data=_tokens(0), target_accuracy="rel_l2<=1")
    assert plain.count("float") == 0 and plain.accuracy["rel_l2"] > 1e-4
    strict = f"rel_l2<={plain.accuracy['rel_l2'] / 2:.3g}"
    report = quantize_file(mlp_file, tmp_path / "b.onnx", calibration_data=_tokens(0), target_accuracy=strict,
                           max_float_compute=1.0)  # fmt: skip
    assert 0 < report.count("float") < 4
    assert report.accuracy["rel_l2"] <= plain.accuracy["rel_l2"] / 2
    assert report.fallback_steps[0]["what"] == "every layer INT8"
    assert report.to_json()["counts"]["float"] == report.count("float")


def test_the_target_never_costs_more_than_the_compute_budget(
    tmp_path: Path, mlp_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = quantize_file(mlp_file, tmp_path / "c.onnx", calibration_data=_tokens(0), target_accuracy="rel_l2<=1e-9",
                           max_float_compute=0.3)  # fmt: skip
    total = sum(entry.shape[0] * entry.shape[1] for entry in report.layers)
    kept = sum(entry.shape[0] * entry.shape[1] for entry in report.layers if entry.mode == "float")
    assert 0 < kept <= 0.3 * total  # token counts are equal here: multiply-adds are proportional to weight sizes
    assert "is not met" in caplog.text


def test_tensorrt_placement_is_symmetric_qdq_on_layer_inputs(tmp_path: Path, mlp_file: Path) -> None:
    out = tmp_path / "trt.onnx"
    report = quantize_file(
        mlp_file, out, calibration_data=_tokens(0), runtime="trt", high_precision_dtype="fp32", target_accuracy=None
    )
    assert report.count("static") == 4
    graph = onnx.load(str(out)).graph
    quantize_nodes = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    # X (shared by q and k), r and o; q and kk too, the inputs of the Add (as ModelOpt 0.47 places them)
    assert sorted(n.input[0] for n in quantize_nodes) == ["kk", "o", "q", "r", "xn"]
    inits = {i.name: i for i in graph.initializer}
    for node in quantize_nodes:
        assert onnx.numpy_helper.to_array(inits[node.input[2]]).dtype == np.int8
        assert onnx.numpy_helper.to_array(inits[node.input[2]]) == 0


@pytest.mark.slow
def test_a_float16_remainder_by_autocast(tmp_path: Path, mlp_file: Path) -> None:
    out = tmp_path / "fp16.onnx"
    report = quantize_file(mlp_file, out, calibration_data=_tokens(0), high_precision_dtype="fp16")
    assert report.autocast is not None and report.count("dynamic") == 4
    graph = onnx.load(str(out)).graph
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # inputs and outputs keep FP32
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer)
    x = _tokens(100, 1)[0]
    (ref,), (got,) = run(mlp_file, x), run(out, x)
    assert _rel(ref, got.astype(np.float32)) < 0.06


def test_modelopt_entry_point_and_its_int4_mode(tmp_path: Path, mlp_file: Path) -> None:
    report = quantize(str(mlp_file), quantize_mode="int8", calibration_data=_tokens(0), output_path=tmp_path / "8.onnx")
    assert report.TOOL == "quantize int8" and (tmp_path / "8.onnx").exists()
    report4 = quantize(str(mlp_file), quantize_mode="int4", calibration_method="rtn", output_path=tmp_path / "4.onnx")
    assert report4.TOOL == "quantize int4" and (tmp_path / "4.onnx").exists()


@pytest.mark.slow
def test_quantize_static_takes_onnx_runtime_arguments(tmp_path: Path, mlp_file: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import CalibrationMethod as OrtMethod

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.batches = iter(_tokens(0))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    out = tmp_path / "static.onnx"
    for method in (OrtMethod.Entropy, CalibrationMethod.Percentile):
        report = quantize_static(mlp_file, out, Reader(), per_channel=True, calibrate_method=method)
        assert report.count("static") == 4 and report.count("dynamic") == 0
    assert "QuantizeLinear" in [n.op_type for n in onnx.load(str(out)).graph.node]


def test_quantize_static_has_onnx_runtimes_signature() -> None:
    """Every argument of ONNX Runtime's ``quantize_static``, in its order, with its default (enums by name)."""
    from onnxprec.quantization._testing import parameters

    ort_quantization = pytest.importorskip("onnxruntime.quantization")
    assert parameters(quantize_static) == parameters(ort_quantization.quantize_static)


def test_quantize_static_refusals_and_extra_options(tmp_path: Path, mlp_file: Path) -> None:
    from onnxprec.errors import InvalidArgumentError
    from onnxprec.quantization import QuantFormat, QuantType

    out = tmp_path / "static.onnx"
    refused = {
        "quant_format QOperator is not written": {"quant_format": QuantFormat.QOperator},
        "weight_type QUInt8 is not supported": {"weight_type": QuantType.QUInt8},
        "reduce_range=True": {"reduce_range": True},
        "calibrate_method Distribution is not supported": {"calibrate_method": CalibrationMethod.Distribution},
        "calibration_cache_path is not supported": {"calibration_cache_path": tmp_path / "cache.json"},
    }
    for message, arguments in refused.items():
        with pytest.raises(InvalidArgumentError, match=message):
            quantize_static(mlp_file, out, _tokens(0), **arguments)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="needs calibration_data"):
        quantize_static(mlp_file, out)
    assert not out.exists()
    report = quantize_static(
        onnx.load(str(mlp_file)),  # a ModelProto, as ONNX Runtime takes it
        out,
        _tokens(0),
        calibrate_method=CalibrationMethod.Percentile,
        extra_options={"CalibPercentile": 99.9, "SmoothQuant": False, "BiasCorrection": False, "Unknown": 1},
    )
    data = report.to_json()
    assert data["calibration_method"] == "percentile" and data["counts"]["static"] == 4
    assert not any(layer["bias_corrected"] or layer["smoothquant_alpha"] for layer in data["layers"])
    x = _tokens(100, 1)[0]
    (ref,), (got,) = run(mlp_file, x), run(out, x)
    assert _rel(ref, got) < 0.1


@pytest.mark.slow
def test_quantize_static_writes_qdq_only(tmp_path: Path) -> None:
    """ONNX Runtime's QuantFormat.QDQ: the project Conv stays a QDQ Conv (QLinearConv), no contrib op, where the
    quantizer's default writes MatMulIntegerToFloat (the report says which)."""
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(2)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    report = quantize_static(source, tmp_path / "s.onnx", data, nodes_to_quantize=["/project/Conv"])
    graph = onnx.load(tmp_path / "s.onnx").graph
    assert all(n.domain in ("", "ai.onnx") for n in graph.node) and "output" not in report.layers[0].info
    default = quantize_file(source, tmp_path / "d.onnx", calibration_data=data, nodes_to_quantize=["/project/Conv"])
    assert [n.op_type for n in onnx.load(tmp_path / "d.onnx").graph.node].count("MatMulIntegerToFloat") == 1
    assert default.layers[0].info["output"] == "float (MatMulIntegerToFloat)"


@pytest.mark.slow
def test_ort_cuda_placement_is_tensorrt_style_with_an_fp16_remainder(tmp_path: Path, mlp_file: Path) -> None:
    """--runtime ort-cuda: the TensorRT-style symmetric Q/DQ on layer inputs, the remainder FP16 by AutoCast (as
    ModelOpt), but the Q/DQ nodes themselves in FP32 (ONNX Runtime 1.32 mis-runs FP16 Q/DQ); the interface FP32."""
    out = tmp_path / "cuda.onnx"
    report = quantize_file(mlp_file, out, calibration_data=_tokens(0), runtime="ort-cuda", target_accuracy=None)
    data = report.to_json()
    assert data["runtime"] == "ort-cuda" and data["high_precision_dtype"] == "fp16" and report.autocast is not None
    assert report.count("static") == 4 and report.count("dynamic") == 0
    model = onnx.load(str(out))
    graph = model.graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    quantize_nodes = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert quantize_nodes and all(
        inits[n.input[2]].dtype == np.int8 and not inits[n.input[2]].any() for n in quantize_nodes
    )
    assert all(
        inits[n.input[1]].dtype == np.float32 for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    )
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer)
    assert (
        graph.input[0].type.tensor_type.elem_type
        == graph.output[0].type.tensor_type.elem_type
        == onnx.TensorProto.FLOAT
    )
    x = _tokens(100, 1)[0]
    (ref,), (got,) = run(mlp_file, x), run(out, x)
    assert _rel(ref, got.astype(np.float32)) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["gqa", "concat"])
def test_a_decoder_with_a_kv_cache_is_w8a8_in_integer_kernels(tmp_path: Path, attention: str) -> None:
    """An LLM laid out as onnxruntime-genai's builder writes it (GroupQueryAttention, KV cache inputs), calibrated
    on token ids: every MatMul dynamic INT8, and ONNX Runtime runs each as an integer kernel with no Q/DQ left."""
    from onnxprec._testing import tiny_decoder
    from onnxprec.evaluate import evaluate_models

    source, out = tmp_path / "decoder.onnx", tmp_path / "decoder_int8.onnx"
    onnx.save(tiny_decoder(attention, vocab=64, symbolic_head=attention == "gqa"), source)
    matmuls = sum(n.op_type == "MatMul" for n in onnx.load(str(source)).graph.node)
    ids = np.random.default_rng(0).integers(0, 64, (8, 12)).astype(np.int64)
    np.save(tmp_path / "calibration.npy", ids[:4])
    np.save(tmp_path / "evaluation.npy", ids[4:])
    # a random-weight decoder's logits miss the guard's cosine 0.99 on its calibration windows: the guard is off
    report = quantize_file(source, out, calibration_data=tmp_path / "calibration.npy", accuracy_guard=False)
    assert report.count("dynamic") == matmuls and report.count("float") == 0
    result = evaluate_models([source, out], tmp_path / "evaluation.npy", latency_runs=0, profile_runs=1)
    kernels = result["decoder_int8"].kernels
    assert kernels is not None and kernels.integer_nodes == matmuls and kernels.qdq_nodes == 0
    assert not any(k.op_type == "MatMul" for k in kernels.kernels)
    agreement = result["decoder_int8"].main_agreement
    assert agreement is not None and agreement["cosine"] > 0.99 and agreement["top1"] >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_dump_and_compare_work_on_the_results(tmp_path: Path, model: str) -> None:
    """dump writes the quantized nodes of an INT8 result (dynamic or static), compare matches its tensors to the float
    model's and names the first divergent node, and that pattern in nodes_to_exclude keeps the node float."""
    from onnxprec.debug import compare_models, dump_model

    source, out = tmp_path / f"{model}.onnx", tmp_path / "int8.onnx"
    rng = np.random.default_rng(0)
    if model == "mlp":
        onnx.save(mlp(), source)
        data: list[dict[str, np.ndarray]] = _tokens(0)
    else:
        onnx.save(tiny_cnn(), source)
        data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    selected: dict[str, object] = {} if model == "mlp" else {"nodes_to_quantize": [".*"]}  # the stem Conv too
    quantize_file(source, out, calibration_data=data, target_accuracy=None, **selected)  # type: ignore[arg-type]
    dumped = dump_model(out, data[:1], output_dir=str(tmp_path / "dump"))
    ops = {t["op_type"] for t in dumped.tensors}
    expected = {"DynamicQuantizeLinear", "MatMulInteger"} if model == "mlp" else {"QuantizeLinear", "DequantizeLinear"}
    assert expected <= ops, ops
    for tensor in dumped.tensors:  # each written as raw values of its shape
        raw = (tmp_path / "dump" / tensor["files"]["bin"]).read_bytes()
        assert len(raw) == int(np.prod(tensor["shape"])) * np.dtype(tensor["dtype"]).itemsize, tensor
    report = compare_models(source, out, data[:1], rtol=1e-3)
    (output,) = report.outputs.values()
    (ref,), (got,) = run(source, data[0]), run(out, data[0])
    assert output.rel_l2 == pytest.approx(_rel(ref, got), rel=1e-4)
    pattern, node = report.exclude_pattern, report.first_divergence
    assert pattern is not None and node is not None
    again = quantize_file(source, tmp_path / "again.onnx", calibration_data=data, target_accuracy=None,
                          nodes_to_exclude=[pattern], **selected)  # type: ignore[arg-type]  # fmt: skip
    assert [n for n, _ in again.excluded] == [node]


@pytest.mark.slow  # two processes
def test_command_line(tmp_path: Path, mlp_file: Path) -> None:
    data = tmp_path / "data.npz"
    np.savez(data, X=correlated(32, 64).reshape(2, 16, 64))
    out, report = tmp_path / "cli.onnx", tmp_path / "report.json"
    command = [sys.executable, "-m", "onnxprec.quantization", "--quantize_mode", "int8", "--onnx_path", str(mlp_file),
               "--calibration_data", str(data), "--output_path", str(out), "--report_json", str(report)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "INT8 for ort-cpu" in result.stdout and out.exists() and report.exists()
    bad = subprocess.run([*command[:4], "nvfp4", *command[5:]], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "Unknown quantize_mode 'nvfp4': use int8, fp8, int4" in bad.stderr
    # onnxprec quantize int8 is the same command
    from onnxprec.cli import main

    same = tmp_path / "same.onnx"
    assert main(["quantize", "int8", "--onnx_path", str(mlp_file), "--calibration_data", str(data),
                 "--output_path", str(same), "--log_level", "WARNING"]) == 0  # fmt: skip
    assert [n.op_type for n in onnx.load(str(same)).graph.node] == [n.op_type for n in onnx.load(str(out)).graph.node]


def test_a_dead_channel_keeps_its_bias(tmp_path: Path) -> None:
    """A channel whose weights are ~0 (BatchNorm folding of a dead channel) and whose bias is not: its RTN scale is
    so small that ``bias / (x_scale * w_scale)`` overflows INT32; the scale is raised so that the bias survives."""
    model = tiny_cnn()
    arrays = {t.name: onnx.numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    arrays["w1"][0] = 1e-7
    arrays["b1"][0] = 2.0  # a constant 2 after the Relu, read by the 1x1 conv
    for t in model.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(arrays[t.name], t.name))
    source, out = tmp_path / "cnn.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    quantize_file(source, out, calibration_data=data, target_accuracy=None, nodes_to_quantize=[".*"])
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    levels, scales = stored["/dw/Conv_bias_int32"], stored["/dw/Conv_bias_scales"]
    assert np.abs(levels.astype(np.int64)).max() < 2**31 - 1
    assert abs(float(levels[0]) * float(scales[0]) - 2.0) < 1e-3
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got) < 0.05


@pytest.mark.slow
def test_a_layer_reading_the_model_input_stays_float(tmp_path: Path) -> None:
    """The first Conv reads the float image (through a Pad): quantizing its input to UINT8 adds noise of one input
    step, and a 3-channel Conv gains nothing from INT8 kernels; it stays float unless nodes_to_quantize names it, and
    so does the depthwise Conv that reads its output."""
    source, out = tmp_path / "cnn.onnx", tmp_path / "q.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    report = quantize_file(source, out, calibration_data=data, target_accuracy=None)
    assert report.count("static") == 1 and report.count("dynamic") == 1
    assert [layer.name for layer in report.layers] == ["/project/Conv", "/fc/Gemm"]
    assert ("/stem/Conv", "reads the model input 'x': kept float (name it in nodes_to_quantize)") in report.skipped
    assert ("/dw/Conv", "a depthwise Conv reading the float 'a0': kept float (name it in nodes_to_quantize)") in (
        report.skipped
    )
    model = onnx.load(out)
    stem = next(n for n in model.graph.node if n.name == "/stem/Conv")
    assert stem.input[0] == "x" and stem.input[1] == "w0"  # float input (the Pad folded) and float weight
    assert next(n for n in model.graph.node if n.name == "/dw/Conv").input[:2] == ["a0", "w1"]
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in model.graph.node)
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got) < 0.05
    named = quantize_file(source, tmp_path / "q2.onnx", calibration_data=data, target_accuracy=None,
                          nodes_to_quantize=["^/stem/Conv$"])  # fmt: skip
    assert [layer.name for layer in named.layers] == ["/stem/Conv"] and named.count("static") == 1


def _producer(graph: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    return next((n for n in graph.node if name in n.output), None)


@pytest.mark.slow
@pytest.mark.parametrize("channels", [16, 8])
def test_tensorrt_placement_has_modelopts_shape(tmp_path: Path, channels: int) -> None:
    """--runtime trt writes the Q/DQ graph ModelOpt 0.47's quantize(quantize_mode="int8") writes for the same model
    (checked against it by hand, anchors venv): symmetric per-tensor INT8 activations and per-channel weights on the
    Convs TensorRT's INT8 kernels suit (16+ channels, or ModelOpt's exceptions: a standard Conv with 8k channels
    reading the input or with 16+ on one side, a depthwise 3x3 of 8k channels), the residual Add's other input
    quantized, float biases, the GEMM with K or N < 16 float, an FP16 remainder that the Q/DQ nodes read and write
    directly (no Cast between a DequantizeLinear and its layer, opset 19). With 8 channels ModelOpt leaves the stem
    float too: its Pad hides that the stem reads the model input (we fold the Pad first)."""
    source, out = tmp_path / "cnn.onnx", tmp_path / "trt.onnx"
    onnx.save(tiny_cnn(channels=channels), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    report = quantize_file(source, out, calibration_data=data, runtime="trt", target_accuracy=None)
    quantized = {"/stem/Conv", "/dw/Conv", "/project/Conv"} if channels == 16 else {"/stem/Conv", "/dw/Conv"}
    assert {layer.name for layer in report.layers} == quantized and report.count("static") == len(quantized)
    skipped = dict(report.skipped)
    assert skipped["/fc/Gemm"].startswith(f"TensorRT: a GEMM with K={channels}, N=10 (< 16) stays float")
    if channels == 8:
        assert skipped["/project/Conv"].startswith("TensorRT: a Conv of 8 input / 8 output channels per group")
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    graph = model.graph
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    io = {v.name for v in (*graph.input, *graph.output)}
    assert all(n.input[0] in io or n.output[0] in io for n in graph.node if n.op_type == "Cast")  # I/O casts only
    for node in graph.node:
        dqs = [_producer(graph, v) for v in node.input]
        dqs = [p for p in dqs if p is not None and p.op_type == "DequantizeLinear"]
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if node.name not in quantized:
            # only the residual Add reads a quantized tensor (the one its Conv branch does not write), as ModelOpt
            assert len(dqs) == (1 if node.op_type == "Add" else 0), node.name
            continue
        x_dq, w_dq = _producer(graph, node.input[0]), _producer(graph, node.input[1])
        assert x_dq is not None and w_dq is not None and x_dq.op_type == w_dq.op_type == "DequantizeLinear"
        q = _producer(graph, x_dq.input[0])
        assert q is not None and q.op_type == "QuantizeLinear"
        assert inits[x_dq.input[1]].shape == () and inits[x_dq.input[1]].dtype == np.float16  # per tensor, FP16
        assert inits[x_dq.input[2]].dtype == np.int8 and inits[x_dq.input[2]] == 0  # symmetric
        weight, scales = inits[w_dq.input[0]], inits[w_dq.input[1]]
        axis = next(a.i for a in w_dq.attribute if a.name == "axis")
        assert weight.dtype == np.int8 and axis == 0 and scales.shape == (channels,) and scales.dtype == np.float16
        assert node.input[2] in inits and inits[node.input[2]].dtype == np.float16  # a float bias
    x = {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert _rel(ref, got.astype(np.float32)) < 0.05


def test_an_fp16_model_is_quantized_in_fp32_and_keeps_its_interface(tmp_path: Path) -> None:
    """An FP16 base (the builder's FP16 LLMs): widened to FP32 first (ONNX Runtime's dynamic INT8 kernels read FP32;
    the remainder is FP32 on ort-cpu), its FP16 inputs and outputs kept behind Casts."""
    model = mlp()
    for init in model.graph.initializer:
        init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    source, out = tmp_path / "fp16.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    data = [{"X": x["X"].astype(np.float16)} for x in _tokens(0)]
    report = quantize_file(source, out, calibration_data=data, target_accuracy=None)
    assert report.count("dynamic") == 4
    quantized = onnx.load(str(out))
    assert [v.type.tensor_type.elem_type for v in (*quantized.graph.input, *quantized.graph.output)] == [
        onnx.TensorProto.FLOAT16
    ] * 2
    x = {"X": _tokens(100, 1)[0]["X"].astype(np.float16)}
    (ref,), (got,) = run(source, x), run(out, x)
    assert got.dtype == np.float16 and _rel(ref.astype(np.float32), got.astype(np.float32)) < 0.05


def _shaped(proto: onnx.ModelProto) -> set[str]:
    """Names of the intermediate values whose value_info carries a shape."""
    return {info.name for info in proto.graph.value_info if info.type.tensor_type.HasField("shape")}


@pytest.mark.slow
def test_output_declares_no_intermediate_shapes_on_ort_cpu(tmp_path: Path, mlp_file: Path) -> None:
    """Shape inference's ``unk__N`` names, written out, steer ONNX Runtime's fusions (MiniLM: every residual Add +
    LayerNormalization became a SkipLayerNormalization 4x slower on CPU): on ort-cpu the output declares no shape
    between its inputs and outputs, even where the input did; on trt it keeps the input's own."""
    declared = onnx.load(mlp_file)
    declared.graph.value_info.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, ["B", "T", 96]))
    source = tmp_path / "declared.onnx"
    onnx.save(declared, source)
    out = tmp_path / "q.onnx"
    for model in (mlp_file, source):
        quantize_file(model, out, calibration_data=_tokens(0))
        written = onnx.load(out)
        assert _shaped(written) == set()
        assert all(info.type.tensor_type.HasField("shape") for info in written.graph.output)
        onnx.checker.check_model(written, full_check=True)
    quantize_file(source, out, calibration_data=_tokens(0), runtime="trt", high_precision_dtype="fp32")
    assert "s" in _shaped(onnx.load(out))


@pytest.mark.slow
def test_layers_sharing_an_input_merge_into_one_with_the_same_values(
    tmp_path: Path, mlp_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q and k (one quantized input, outlier channels split off) become one MatMulInteger with [Wq Wk], one bias and
    one outlier product, then a Split: each output is what its own layer computed, and keeps its name."""
    import functools

    from onnxprec.quantization.int8 import accuracy_steps
    from onnxprec.quantization.int8.decide import build

    def tokens(seed: int, batches: int) -> list[dict[str, np.ndarray]]:
        runs = _tokens(seed, batches)
        for run_ in runs:
            run_["X"][..., [3, 17]] *= 60  # two channels far beyond the others: split off to float
        return runs

    merged, separate = tmp_path / "merged.onnx", tmp_path / "separate.onnx"
    report = quantize_file(mlp_file, merged, calibration_data=tokens(0, 4), outlier_channels=4)
    assert any(layer.outlier_channels for layer in report.layers if "q_proj" in layer.name)
    monkeypatch.setattr(accuracy_steps, "build", functools.partial(build, merge_groups=False))
    quantize_file(mlp_file, separate, calibration_data=tokens(0, 4), outlier_channels=4)
    graph = onnx.load(merged).graph
    split = next(n for n in graph.node if n.op_type == "Split")
    assert list(split.output) == ["q", "kk"]
    assert [n.op_type for n in graph.node].count("MatMulInteger") == 3  # [q k], o_proj, lm_head
    assert [n.op_type for n in onnx.load(separate).graph.node].count("MatMulInteger") == 4
    outlier_matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(outlier_matmuls) == len([layer for layer in report.layers if layer.outlier_channels]) - 1
    x = tokens(100, 1)[0]
    (a,), (b,) = run(merged, x), run(separate, x)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_smoothing_folds_into_the_norm_weight_that_only_the_group_reads(
    tmp_path: Path, mlp_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q and k read ``xn = Mul(X, gamma)`` alone: SmoothQuant's ``1/s`` goes into gamma (no Mul before the
    DynamicQuantizeLinear), the same values as the explicit Mul; ``xn`` holds the smoothed values under a new name."""
    from onnxprec.quantization.int8 import decide

    def tokens(seed: int, batches: int) -> list[dict[str, np.ndarray]]:
        runs = [{"X": correlated(32, 64, seed=seed + i, outliers=False).reshape(2, 16, 64)} for i in range(batches)]
        for run_ in runs:
            run_["X"][..., [3, 17]] *= 8
        return runs

    folded, explicit = tmp_path / "folded.onnx", tmp_path / "explicit.onnx"
    report = quantize_file(mlp_file, folded, calibration_data=tokens(0, 4), outlier_channels=0)
    assert any(layer.alpha is not None for layer in report.layers if "q_proj" in layer.name)
    monkeypatch.setattr(decide, "fold_smoothing", lambda *args: False)
    quantize_file(mlp_file, explicit, calibration_data=tokens(0, 4), outlier_channels=0)
    graph, other = onnx.load(folded).graph, onnx.load(explicit).graph
    norm = next(n for n in graph.node if n.name == "/model/norm/Mul")
    assert list(norm.output) != ["xn"] and "xn" not in {i for n in graph.node for i in n.input}
    quantizer = next(n for n in graph.node if n.op_type == "DynamicQuantizeLinear" and n.input[0] == norm.output[0])
    assert quantizer is not None
    muls = [n.op_type for n in graph.node].count("Mul")
    assert [n.op_type for n in other.node].count("Mul") == muls + 1
    x = tokens(100, 1)[0]
    (a,), (b,) = run(folded, x), run(explicit, x)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _attention(seed: int = 0, heads: int = 4, head_size: int = 16) -> onnx.ModelProto:
    """``X -> Q, K, V MatMuls (+ biases) -> heads -> softmax(Q K^T) V -> merged context -> O MatMul``, V with a few
    large output channels (the context's outliers)."""
    k = heads * head_size
    rng = np.random.default_rng(seed)
    inits = {f"W{n}": (rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32) for n in "qkvo"}
    inits["Wv"][:, [5, 40]] *= 12
    inits.update({f"b{n}": rng.standard_normal(k).astype(np.float32) * 0.1 for n in "qkv"})
    inits["split"] = np.array([0, 0, heads, head_size], np.int64)
    inits["merge"] = np.array([0, 0, k], np.int64)
    node = onnx.helper.make_node
    nodes = []
    for n in "qkv":
        nodes += [
            node("MatMul", ["X", f"W{n}"], [f"{n}m"], name=f"/attn/{n}/MatMul"),
            node("Add", [f"b{n}", f"{n}m"], [f"{n}a"], name=f"/attn/{n}/Add"),
            node("Reshape", [f"{n}a", "split"], [f"{n}r"], name=f"/attn/{n}/Reshape"),
            node("Transpose", [f"{n}r"], [f"{n}t"], name=f"/attn/{n}/Transpose",
                 perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]),
        ]  # fmt: skip
    nodes += [
        node("MatMul", ["qt", "kt"], ["scores"], name="/attn/scores"),
        node("Softmax", ["scores"], ["probs"], name="/attn/Softmax", axis=-1),
        node("MatMul", ["probs", "vt"], ["mixed"], name="/attn/mix"),
        node("Transpose", ["mixed"], ["back"], name="/attn/back", perm=[0, 2, 1, 3]),
        node("Reshape", ["back", "merge"], ["context"], name="/attn/merge"),
        node("MatMul", ["context", "Wo"], ["Y"], name="/attn/o/MatMul"),
    ]
    f = onnx.TensorProto.FLOAT
    return onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "attention", [onnx.helper.make_tensor_value_info("X", f, ["B", "S", k])],
                               [onnx.helper.make_tensor_value_info("Y", f, ["B", "S", k])],
                               [onnx.numpy_helper.from_array(v, n) for n, v in inits.items()]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8,
    )  # fmt: skip


@pytest.mark.slow
def test_context_smoothing_folds_into_the_value_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention context's SmoothQuant ``1/s`` goes into V's weight columns and bias (the heads mix tokens, not
    channels): no Mul before the output layer's quantizer, the same outputs as the explicit Mul, the tensors on the
    way renamed."""
    from onnxprec.quantization.int8 import fold_values

    source = tmp_path / "attention.onnx"
    onnx.save(_attention(), source)
    runs = [{"X": correlated(32, 64, seed=i, outliers=False).reshape(2, 16, 64)} for i in range(4)]
    folded, explicit = tmp_path / "folded.onnx", tmp_path / "explicit.onnx"
    report = quantize_file(source, folded, calibration_data=runs, outlier_channels=0)
    assert next(layer.alpha for layer in report.layers if layer.name == "/attn/o/MatMul") is not None
    monkeypatch.setattr(fold_values, "attention_values", lambda *args: None)
    quantize_file(source, explicit, calibration_data=runs, outlier_channels=0)
    graph, other = onnx.load(folded).graph, onnx.load(explicit).graph
    producers = {out: n for n in graph.node for out in n.output}
    quantizer = next(n for n in graph.node if n.op_type == "DynamicQuantizeLinear" and "context" in n.input[0])
    assert producers[quantizer.input[0]].op_type == "Reshape"  # no Mul between the context and its quantizer
    assert "context" not in producers and "vt" not in producers  # renamed: they hold V / s
    assert [n.op_type for n in other.node].count("Mul") == [n.op_type for n in graph.node].count("Mul") + 1
    x = {"X": correlated(32, 64, seed=50, outliers=False).reshape(2, 16, 64)}
    (a,), (b,) = run(folded, x), run(explicit, x)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
