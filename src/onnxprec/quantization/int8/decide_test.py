"""INT8 decisions: which layers the calibration statistics keep in float, and why; the attention match (the context's V
found through the heads, and nothing that another node reads)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.observers import Histogram
from onnxprec.quantization._testing import optimized_ops
from onnxprec.quantization.algorithms.ranges import quantization_noise
from onnxprec.quantization.int8 import Int8Report, fold_values, quantize_file
from onnxprec.quantization.int8.api_test import _attention
from onnxprec.quantization.int8.decide import DEPTHWISE_MAX_NOISE


def test_quantization_noise_of_a_uniform_and_a_heavy_tailed_tensor() -> None:
    rng = np.random.default_rng(0)
    uniform = Histogram(2048)
    uniform.add(rng.uniform(0.0, 1.0, 200_000).astype(np.float32))
    # one UINT8 step over [0, 1]: its rounding error has RMS step / sqrt(12), a uniform value RMS 1 / sqrt(3)
    assert quantization_noise(uniform, 0.0, 1.0) == pytest.approx(1 / 255 / math.sqrt(12) * math.sqrt(3), rel=0.05)
    heavy = Histogram(2048)
    heavy.add(rng.lognormal(0.0, 1.5, 200_000).astype(np.float32))  # the range goes to a tail far above the bulk
    assert quantization_noise(heavy, 0.0, heavy.max) > 5 * quantization_noise(uniform, 0.0, 1.0)
    zeros = Histogram(64)
    zeros.add(np.zeros(10, np.float32))
    assert quantization_noise(zeros, 0.0, 0.0) == 0.0


def _stem_depthwise_pointwise(activation: str, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """``Conv (stem, reads the input) -> activation -> depthwise Conv 3x3 -> Conv 1x1``, input ``[N, 3, 16, 16]``."""
    rng = np.random.default_rng(seed)
    c = channels
    inits = {
        "w0": (rng.standard_normal((c, 3, 1, 1)) * 0.5).astype(np.float32),
        "w1": (rng.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32),
        "w2": (rng.standard_normal((c, c, 1, 1)) * 0.4).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="/stem/Conv", kernel_shape=[1, 1]),
        helper.make_node(activation, ["c0"], ["a0"], name="/act"),
        helper.make_node("Conv", ["a0", "w1"], ["c1"], name="/dw/Conv", kernel_shape=[3, 3], pads=[1] * 4, group=c),
        helper.make_node("Conv", ["c1", "w2"], ["y"], name="/pw/Conv", kernel_shape=[1, 1]),
    ]
    return make_model(nodes, [tensor_info("x", F, ["N", 3, 16, 16])], [tensor_info("y", F, ["N", c, 16, 16])], inits)


def _quantized_error(
    activation: str, tmp_path: Path, channels: int = 8, **kwargs: Any
) -> tuple[Int8Report, list[str], float]:
    """The report, the op types ONNX Runtime runs and the output's relative L2 error on unseen inputs."""
    source, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_stem_depthwise_pointwise(activation, channels), source)
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal((2, 3, 16, 16)) * 1.5).astype(np.float32)} for _ in range(3)]
    report = quantize_file(source, out, calibration_data=data, **kwargs)
    x = {"x": (rng.standard_normal((2, 3, 16, 16)) * 1.5).astype(np.float32)}
    (ref,), (got,) = run(source, x), run(out, x)
    return report, optimized_ops(out, tmp_path), float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.slow
def test_a_depthwise_conv_with_a_heavy_tailed_input_stays_float(tmp_path: Path) -> None:
    """After Exp (log-normal: a tail far above the bulk) the depthwise Conv's input would lose more than the bound to
    UINT8 noise: it stays float, the report says why, the pointwise Conv after it is still INT8, and the output is
    closer to the float model's than with the depthwise Conv INT8 too (``nodes_to_quantize`` overrides the rule)."""
    report, ops, error = _quantized_error("Exp", tmp_path)
    entries = {entry.name: entry for entry in report.layers}
    assert entries["/pw/Conv"].mode == "static" and entries["/dw/Conv"].mode == "float"
    assert str(DEPTHWISE_MAX_NOISE) in entries["/dw/Conv"].info["kept_float"]
    assert "1 depthwise kept float" in report.summary
    assert "QLinearConv" not in ops and ops.count("MatMulIntegerToFloat") == 1
    forced, ops, forced_error = _quantized_error("Exp", tmp_path, nodes_to_quantize=["^/(dw|pw)/"])
    assert {entry.name: entry.mode for entry in forced.layers} == {"/dw/Conv": "static", "/pw/Conv": "static"}
    assert ops.count("QLinearConv") == 1
    assert error < forced_error


def test_on_trt_a_depthwise_conv_with_a_heavy_tailed_input_stays_float_too(tmp_path: Path) -> None:
    """The same rule on trt's symmetric INT8 grid (PP-OCR's direction classifier flipped a held-out row with its
    depthwise Convs INT8), whose noise it measures; ``nodes_to_quantize`` overrides it there too."""
    report, _, _ = _quantized_error("Exp", tmp_path, 32, runtime="trt")  # TensorRT's rule: Convs over 16 channels
    entries = {entry.name: entry for entry in report.layers}
    assert entries["/pw/Conv"].mode == "static" and entries["/dw/Conv"].mode == "float"
    assert "to INT8 (>" in entries["/dw/Conv"].info["kept_float"]
    forced, _, _ = _quantized_error("Exp", tmp_path, 32, runtime="trt", nodes_to_quantize=["^/(dw|pw)/"])
    assert not any("kept_float" in entry.info for entry in forced.layers)


def test_a_depthwise_conv_with_a_bounded_input_is_int8(tmp_path: Path) -> None:
    report, ops, error = _quantized_error("Sigmoid", tmp_path)
    assert {entry.name: entry.mode for entry in report.layers} == {"/dw/Conv": "static", "/pw/Conv": "static"}
    assert ops.count("QLinearConv") == 1 and error < 0.02


OCR_CACHE = Path(os.environ.get("ONNXPREC_CACHE", Path.home() / ".cache" / "onnxprec")) / "int8fix"
"""PP-OCRv4's detector and recognizer (rapidocr-onnxruntime 1.4.4) and their inputs, made by
``experiments/int8_ocr.py prepare``."""


def _cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    a, b = reference.reshape(len(reference), -1), candidate.reshape(len(candidate), -1)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.slow
def test_ocr_detector_keeps_its_probability_map(tmp_path: Path) -> None:
    """PP-OCRv4's text detector calibrated on two photos: its 14 depthwise Convs (inputs after hardswish) stay float
    and, by that rule alone, the probability map keeps cosine >= 0.99 on held-out photos (0.98 median, 0.91 worst
    with them INT8). The accuracy guard is off: its float fallback (guard_test's corpus detector test) would send
    more layers back to float, and the cosine would no longer be the rule's."""
    paths = [OCR_CACHE / name for name in ("det.onnx", "det_calib.npz", "det_hold.npz")]
    if not all(path.exists() for path in paths):
        pytest.skip(f"the OCR models and inputs are not in {OCR_CACHE} (experiments/int8_ocr.py prepare, with Pillow)")
    model, calib, hold = paths
    out = tmp_path / "det.int8.onnx"
    report = quantize_file(model, out, calibration_data=str(calib), accuracy_guard=False)
    assert sum(1 for entry in report.layers if "kept_float" in entry.info) == 14
    assert sum(1 for entry in report.layers if entry.mode == "float") == 14
    x = np.load(hold)["x"][:4]
    (ref,), (got,) = run(model, {"x": x}), run(out, {"x": x})
    assert np.median(_cosines(ref, got)) >= 0.99


@pytest.mark.parametrize("also_read", [None, "va", "vt", "mixed", "back"])
def test_attention_values_are_v_unless_a_value_on_the_way_has_another_reader(also_read: str | None) -> None:
    proto = _attention()
    if also_read is not None:
        proto.graph.node.append(onnx.helper.make_node("Identity", [also_read], ["extra"]))
        proto.graph.output.append(onnx.helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    model = ir.serde.deserialize_model(proto)
    ir.passes.common.ShapeInferencePass()(model)
    context = next(node for node in model.graph if node.name == "/attn/merge").outputs[0]
    values = fold_values.attention_values(context, 64)
    assert (values.name if values is not None else None) == ("va" if also_read is None else None)
    assert fold_values.attention_values(context, 60) is None  # 60 is no multiple of the head size 16
