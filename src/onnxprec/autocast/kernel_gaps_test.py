"""BF16 with only the CPU provider (issue 24): ONNX Runtime's CPU provider has BF16 kernels for almost no compute op,
so the file-to-file API refuses in one line naming ``--providers cuda``, or with ``keep_unsupported_fp32`` keeps the
nodes without a kernel in FP32 and writes a model the CPU provider runs; ModelOpt's API converts as ModelOpt does."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import run
from onnxprec.autocast import convert_file, convert_to_mixed_precision
from onnxprec.autocast.report import MOVES_ONLY
from onnxprec.errors import UnsupportedModelError
from onnxprec.quantization._testing import tiny_cnn

X = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)


def _cnn(tmp_path: Path) -> Path:
    path = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), path)
    return path


def test_bf16_with_only_the_cpu_provider_is_refused_in_one_line_naming_cuda(tmp_path: Path) -> None:
    out = tmp_path / "cnn.bf16.onnx"
    with pytest.raises(UnsupportedModelError) as raised:
        convert_file(_cnn(tmp_path), out, low_precision_type="bf16", calibration_data={"x": X})
    message = str(raised.value)
    assert "\n" not in message and "--providers cuda" in message and "--keep_unsupported_fp32" in message
    # every compute op of the CNN lacks a CPU BF16 kernel (ORT 1.32: Conv, Clip, Relu, Add, ReduceMean, Gemm)
    assert re.search(r"no CPU BF16 kernel for \d+ of the \d+ nodes \(.*Conv x3", message), message
    assert not out.exists()


def test_kept_in_fp32_the_result_runs_on_the_cpu_and_the_summary_gives_the_share(tmp_path: Path) -> None:
    source, out = _cnn(tmp_path), tmp_path / "cnn.bf16.onnx"
    report = convert_file(source, out, low_precision_type="bf16", calibration_data={"x": X}, keep_unsupported_fp32=True)
    kept = sum(report.no_kernel.values())
    assert kept >= 6 and report.no_kernel["Conv"] == 3
    assert f"; {kept} kept in FP32 without a bf16 kernel" in report.summary
    assert f"Converted {report.stats.low_nodes}/{report.stats.nodes} nodes" in report.summary
    assert report.to_json()["no_kernel_fp32"] == report.no_kernel
    # the Pad between two FP32 Convs would only move data between casts: it stays FP32 and its casts go
    moved = [node.name for node, decision in report.decisions.items() if decision.reason == MOVES_ONLY]
    assert moved == ["/dw/Pad"] and "; 1 data-movement node left in FP32 between casts;" in report.summary
    assert [n.op_type for n in onnx.load(out).graph.node].count("Cast") == report.stats.casts == 2
    # the output loads and runs on the CPU provider and matches FP32 (what stays BF16 only moves data)
    (expected,) = run(source, {"x": X})
    (actual,) = run(out, {"x": X})
    np.testing.assert_allclose(actual.astype(np.float32), expected, rtol=2e-2, atol=2e-2)


def test_fp16_on_the_cpu_is_not_probed_or_refused(tmp_path: Path) -> None:
    # ONNX Runtime runs an FP16 node without a kernel in FP32 behind casts it inserts itself
    report = convert_file(_cnn(tmp_path), tmp_path / "o.onnx", calibration_data={"x": X})
    assert not report.no_kernel and report.stats.low_nodes == report.stats.nodes
    # nothing silent: the summary says how the result was checked, with the output's task metric
    assert "; checked on calibration data (first run): logits top-1 agreement 100.0% of 2 rows;" in report.summary


def test_modelopts_api_converts_as_modelopt_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        out = convert_to_mixed_precision(tiny_cnn(), low_precision_type="bf16", calibration_data={"x": X})
    assert sum(n.op_type == "Conv" for n in out.graph.node) == 3
    assert any("Numeric check skipped" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.slow
def test_efficientnet_lite0_bf16_on_the_cpu(tmp_path: Path) -> None:
    from onnxprec._testing import shared_path

    found = shared_path("models", "efficientnet_lite0.onnx")
    if found is None:
        pytest.skip("../shared/models/efficientnet_lite0.onnx is absent")
    source = tmp_path / "effnet.onnx"
    source.write_bytes(found.read_bytes())
    with pytest.raises(UnsupportedModelError, match=r"no CPU BF16 kernel for 93 of the 132 nodes"):
        convert_file(source, tmp_path / "refused.onnx", low_precision_type="bf16")
    report = convert_file(source, tmp_path / "kept.onnx", low_precision_type="bf16", keep_unsupported_fp32=True)
    assert sum(report.no_kernel.values()) == 93
    moved = sum(decision.reason == MOVES_ONLY for decision in report.decisions.values())  # the Pads between Convs
    assert report.stats.low_nodes == 23 and moved == 16
    x = np.load(found.with_name("efficientnet_lite0_input.npy"))[:1].astype(np.float32)
    (expected,) = run(source, {"input": x})
    (actual,) = run(tmp_path / "kept.onnx", {"input": x})
    assert np.argmax(actual) == np.argmax(expected)
