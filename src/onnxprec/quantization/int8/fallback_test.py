"""The float fallback above MAX_ISOLATED layers: the sensitivity engine's estimate ranks the layers (static ones
included: their sensitivity is the Hessian-weighted error of their INT8 weight)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec.quantization._testing import tiny_cnn
from onnxprec.quantization.int8 import fallback, quantize_file


@pytest.mark.parametrize("runtime", ["ort-cpu", "trt"])
def test_the_estimate_finds_the_layers_to_keep_in_float_without_a_check_per_layer(
    tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    common = {"calibration_data": data, "runtime": runtime, "nodes_to_quantize": [".*"], "max_float_compute": 1.0}
    plain = quantize_file(source, tmp_path / "plain.onnx", target_accuracy="rel_l2<=1", **common)
    assert plain.count("float") == 0
    strict = plain.accuracy["rel_l2"] / 2
    monkeypatch.setattr(fallback, "MAX_ISOLATED", 0)  # as a model with more layers than one check each allows
    report = quantize_file(source, tmp_path / "q.onnx", target_accuracy=f"rel_l2<={strict:.4g}", **common)
    assert 0 < report.count("float") < len(report.layers)
    assert report.accuracy["rel_l2"] <= float(f"{strict:.4g}")
    assert not any(step["what"].startswith("gain of each layer") for step in report.fallback_steps)
