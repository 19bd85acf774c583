"""ort-cpu's second try under the guard (issue 24): the layers that read the model input quantized too when they
hold most of the weights and the guard missed without them; never for a CNN's small first Conv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._ort import create_session
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
