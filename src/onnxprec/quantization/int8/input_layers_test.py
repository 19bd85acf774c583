"""ort-cpu's second try under the guard (issue 24): the layers that read the model input quantized too when they
hold most of the weights and the guard missed without them; never for a CNN's small first Conv; when it misses too,
the first result and its guard line stand."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.errors import AccuracyGuardError
from onnxprec.quantization.int8 import Int8Report, quantize_file
from onnxprec.quantization.int8.guard_fallback_test import _runs, _stem_body


def test_a_small_first_conv_gets_no_second_try(tmp_path: Path) -> None:
    """The stem Conv reads the input and holds 24 of the 4632 weights: the guard refuses without trying it."""
    source = tmp_path / "m.onnx"
    onnx.save(_stem_body(offset=1e4), source)
    with pytest.raises(AccuracyGuardError) as raised:
        quantize_file(source, tmp_path / "q.onnx", calibration_data=_runs())
    report = raised.value.report
    assert isinstance(report, Int8Report)
    assert report.input_layers == [] and [name for name, _ in report.skipped] == ["/stem/Conv"]


@pytest.mark.slow
def test_when_the_second_try_misses_too_the_first_result_stands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 7x7 stem (1176 weights, it reads the input) whose channel 0 is offset by 1e4, then a 1x1 Conv (32 weights)
    that never reads channel 0: any UINT8 range over the stem's output rounds the other channels away, with the stem
    float (the first try) or INT8 (the second): the guard's line is the first try's."""
    rng = np.random.default_rng(0)
    bias = np.zeros(8, np.float32)
    bias[0] = 1e4
    body = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    body[:, 0] = 0
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="/stem/Conv", kernel_shape=[7, 7], pads=[3, 3, 3, 3]),
        helper.make_node("Conv", ["c", "w2"], ["y"], name="/body/Conv", kernel_shape=[1, 1]),
    ]
    weights = {"w1": (rng.standard_normal((8, 3, 7, 7)) * 0.1).astype(np.float32), "b1": bias, "w2": body}
    source = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [tensor_info("x", F, ["N", 3, 16, 16])], [tensor_info("y", F, ["N", 4, 16, 16])],
                         weights), source)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="onnxprec"), pytest.raises(AccuracyGuardError) as raised:
        quantize_file(source, tmp_path / "q.onnx", calibration_data=_runs())
    report = raised.value.report
    assert isinstance(report, Int8Report)
    assert report.input_layers == [] and [name for name, _ in report.skipped] == ["/stem/Conv"]
    assert "second try with the layers that read the model input quantized missed too" in caplog.text


@pytest.mark.slow
def test_the_corpus_melspectrogram_passes_with_its_stft_convs_quantized(tmp_path: Path) -> None:
    """openWakeWord's melspectrogram: its STFT Convs read the audio and hold 97 % of the weights; its one other layer,
    the mel filterbank MatMul before a Log, misses the guard as INT8 and is every layer left in float. The second try
    quantizes the Convs; the guard's result keeps the corpus's 25 dB on the held-out speech."""
    cached = Path.home() / ".cache/onnxprec/corpus/models/openwakeword-melspectrogram"
    if not (cached / "model.onnx").is_file():
        pytest.skip("the corpus cache (openwakeword-melspectrogram) is absent: python -m zoo.corpus build builds it")
    source = tmp_path / "mel.onnx"
    source.write_bytes((cached / "model.onnx").read_bytes())
    report = quantize_file(source, tmp_path / "mel.int8.onnx", calibration_data=cached / "calib")
    assert report.check["passed"] and report.input_layers == ["Conv_2", "Conv_3"]
    assert report.count("static") >= 1 and "reading the model input quantized too" in report.summary
    reference, candidate = create_session(onnx.load(source)), create_session(onnx.load(tmp_path / "mel.int8.onnx"))
    noise = signal = 0.0
    for batch in sorted((cached / "heldout").glob("*.npz")):
        feeds = dict(np.load(batch))
        ref, got = reference.run(feeds)[0].astype(np.float64), candidate.run(feeds)[0].astype(np.float64)
        signal, noise = signal + float(np.sum(ref**2)), noise + float(np.sum((got - ref) ** 2))
    assert 10 * np.log10(signal / noise) >= 25.0
