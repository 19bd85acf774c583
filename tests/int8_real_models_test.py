"""INT8 on EfficientNet-Lite0 with real images (slow; skipped where ../shared/models is absent): calibrated on 4
images, judged on the 3 others."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._ort_profile import profile_kernels
from onnxprec._testing import run, shared_path
from onnxprec.quantization.int8 import quantize_file

pytestmark = pytest.mark.slow


def test_efficientnet_int8_on_images_it_did_not_see(tmp_path: Path) -> None:
    shared = shared_path("models")
    if shared is None or not (shared / "efficientnet_lite0.onnx").is_file():
        pytest.skip("EfficientNet-Lite0 is absent from ../shared/models: real-model INT8 test skipped")
    source = shared / "efficientnet_lite0.onnx"
    images = np.load(shared / "efficientnet_lite0_input.npy")
    out = tmp_path / "q.onnx"
    report = quantize_file(source, out, calibration_data=[{"input": images[i : i + 1]} for i in range(4)])
    # every Conv in INT8 (static) but the first Conv, which reads the float image, and the depthwise Conv after it;
    # the classifier Gemm dynamic
    assert report.count("static") == 47 and report.count("dynamic") == 1
    assert [name for name, _ in report.skipped[:2]] == ["/_conv_stem/Conv", "/_blocks.0/_depthwise_conv/Conv"]
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "input" for n in onnx.load(out).graph.node)
    # ONNX Runtime runs the 31 INT8 expand/depthwise/head Convs as QLinearConv, the 16 project Convs as
    # MatMulIntegerToFloat (their outputs and the residual Adds stay float), the classifier as DynamicQuantizeMatMul;
    # the Q/DQ left: 17 QuantizeLinear where an integer Conv reads a float value, the DequantizeLinear
    # before the pooling
    kernels = profile_kernels(out, {"input": images[4:5]}, runs=1)
    ran = {k.op_type: k.nodes for k in kernels.kernels if k.integer}
    expected = {"QLinearConv": 31, "MatMulIntegerToFloat": 16, "DynamicQuantizeMatMul": 1}
    assert ran == expected and kernels.qdq_nodes == 18, (ran, kernels.qdq_nodes)
    rel, agree = [], 0
    for i in range(4, 7):
        x = {"input": images[i : i + 1]}
        (ref,), (got,) = run(source, x), run(out, x)
        rel.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
        agree += int(ref.argmax() == got.argmax())
    assert agree == 3 and max(rel) < 0.08, rel
