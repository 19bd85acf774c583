"""INT4 measures its written result against the float model (issue 24: nothing silent) and warns in one line when it
misses the bounds of INT8's guard (INT4 has no float fallback)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.quantization.int4 import quantize_file


def _outlier_blocks() -> onnx.ModelProto:
    """``Y = X @ W`` where each block of 16 input rows of ``W`` has one row 1000x the others: RTN's INT4 scale, set by
    that row, rounds the rest to zero, and inputs that are zero on those rows read only the rest."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    w[::16] *= 1000
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"], name="/mm")]
    return make_model(nodes, [tensor_info("X", F, ["N", 64])], [tensor_info("Y", F, ["N", 32])], {"W": w})


def test_a_broken_result_is_warned_about_with_its_measured_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(_outlier_blocks(), source)
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    x[:, ::16] = 0
    with caplog.at_level(logging.WARNING):
        report = quantize_file(source, tmp_path / "q.onnx", calibration_method="rtn", block_size=16,
                               calibration_data_reader=[{"X": x}])  # fmt: skip
    assert report.check["passed"] is False and report.check["guard"] == "warn"
    (line,) = [r.getMessage() for r in caplog.records if "INT4 result misses the accuracy bound" in r.getMessage()]
    assert line.startswith("INT4 result misses the accuracy bound (Y top1 >= 0.98): Y top-1 agreement ")
    assert line.endswith("on the first calibration batch")
    assert "checked on calibration data (1 run): Y top-1 agreement" in report.summary
    assert report.to_json()["accuracy_check"]["calibration"]["outputs"]["Y"]["kind"] == "classes"


def test_without_data_the_summary_says_the_check_ran_on_random_data(tmp_path: Path) -> None:
    from onnxprec.quantization._testing import mlp

    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_method="rtn", block_size=16)
    assert report.check["random_data"] and "no calibration data: checked on random data (1 run): " in report.summary
