"""A float-written Conv input whose channels span very different ranges is equalized per channel before its UINT8
Q/DQ (a Mul, the weight's input channels scaled: exact in float), as Silero VAD's first Conv after its STFT needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.quantization.int8 import decide, quantize_file


def _model(weighted: bool) -> onnx.ModelProto:
    """|x| times per-channel gains 100x apart (a spectrum's magnitudes) -> Conv1d -> Relu -> Conv1d; ``weighted``:
    the first Conv's weights undo the gains (the quiet channels matter as much as the loud ones)."""
    rng = np.random.default_rng(11)
    gains = np.geomspace(0.01, 1.0, 16).astype(np.float32)
    w1 = (rng.standard_normal((16, 16, 3)) * 0.3).astype(np.float32)
    if weighted:
        w1 = (w1 / gains[None, :, None] * 0.05).astype(np.float32)
    nodes = [
        helper.make_node("Abs", ["x"], ["a"], name="abs"),
        helper.make_node("Mul", ["a", "gains"], ["m"], name="gain"),
        helper.make_node("Conv", ["m", "w1"], ["c1"], pads=[1, 1], name="first/Conv"),
        helper.make_node("Relu", ["c1"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1], name="second/Conv"),
    ]
    inits = {
        "gains": gains.reshape(1, 16, 1),
        "w1": w1,
        "w2": (rng.standard_normal((8, 16, 3)) * 0.3).astype(np.float32),
    }
    return make_model(nodes, [tensor_info("x", F, [2, 16, 32])], [tensor_info("y", F, [2, 8, 32])], inits)


def _data(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 16, 32)).astype(np.float32)} for _ in range(n)]


def _error(source: Path, output: Path) -> float:
    errors = []
    for batch in _data(4, seed=5):
        (ref,), (got,) = run(source, batch), run(output, batch)
        errors.append(np.linalg.norm(ref - got) / np.linalg.norm(ref))
    return float(np.max(errors))


@pytest.mark.slow
def test_the_channels_of_a_float_written_conv_input_are_equalized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "gains.onnx"
    onnx.save(_model(weighted=True), source)
    settings = {"calibration_data": _data(8, seed=1), "accuracy_guard": False}
    report = quantize_file(source, tmp_path / "q.onnx", **settings)
    entries = {entry.name: entry for entry in report.layers}
    assert entries["first/Conv"].info["equalized_spread"] == pytest.approx(100.0, rel=0.2)  # the maxima seen
    assert "equalized_spread" not in entries["second/Conv"].info  # its input comes from the quantized region
    model = onnx.load(tmp_path / "q.onnx")
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    producers = {out: node for node in model.graph.node for out in node.output}
    quantize = producers[producers[next(n for n in model.graph.node if n.name == "first/Conv").input[0]].input[0]]
    assert producers[quantize.input[0]].op_type == "Mul"  # x / s, then its QuantizeLinear

    monkeypatch.setattr(decide, "EQUALIZE_MIN_SPREAD", np.inf)
    plain = quantize_file(source, tmp_path / "plain.onnx", **settings)
    assert "equalized_spread" not in {k for entry in plain.layers for k in entry.info}
    equalized, per_tensor = _error(source, tmp_path / "q.onnx"), _error(source, tmp_path / "plain.onnx")
    assert equalized < 0.03 and equalized < per_tensor / 2, (equalized, per_tensor)


def test_quiet_channels_that_carry_little_of_the_output_are_not_equalized(tmp_path: Path) -> None:
    source = tmp_path / "gains.onnx"
    onnx.save(_model(weighted=False), source)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=_data(8, seed=1), accuracy_guard=False)
    assert not any("equalized_spread" in entry.info for entry in report.layers)
    assert _error(source, tmp_path / "q.onnx") < 0.03
