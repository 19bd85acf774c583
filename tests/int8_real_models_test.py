"""INT8 on the real models (slow; skipped where ../shared/models is absent): EfficientNet-Lite0 calibrated on 4
images, judged on the 3 others; MiniLM calibrated on rows 0-3, judged on rows 4-7."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._ort_profile import profile_kernels
from onnxprec._testing import run, run_each, shared_path
from onnxprec.quantization.int8 import quantize_file

pytestmark = pytest.mark.slow


def _shared_model(file: str, what: str) -> Path:
    """``../shared/models/file``; the test is skipped when it is absent."""
    shared = shared_path("models")
    if shared is None or not (shared / file).is_file():
        pytest.skip(f"{what} is absent from ../shared/models: real-model INT8 test skipped")
    return shared / file


def test_efficientnet_int8_on_images_it_did_not_see(tmp_path: Path) -> None:
    source = _shared_model("efficientnet_lite0.onnx", "EfficientNet-Lite0")
    shared = source.parent
    images = np.load(shared / "efficientnet_lite0_input.npy")
    out = tmp_path / "q.onnx"
    report = quantize_file(source, out, calibration_data=[{"input": images[i : i + 1]} for i in range(4)])
    # every Conv in INT8 (static) but the first Conv, which reads the float image, and the depthwise Conv after it;
    # the classifier Gemm dynamic
    assert report.count("static") == 47 and report.count("dynamic") == 1
    assert [name for name, _ in report.skipped[:2]] == ["/_conv_stem/Conv", "/_blocks.0/_depthwise_conv/Conv"]
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "input" for n in onnx.load(out).graph.node)
    # ONNX Runtime runs the 33 INT8 expand/depthwise/head Convs and the project Convs that only an INT8 Conv reads
    # (blocks 0 and 15) as QLinearConv, the 14 project Convs before a residual Add as MatMulIntegerToFloat (their
    # outputs and the residual Adds stay float), the classifier as DynamicQuantizeMatMul; the Q/DQ left: 15
    # QuantizeLinear where an integer Conv reads a float value, the DequantizeLinear before the pooling
    kernels = profile_kernels(out, {"input": images[4:5]}, runs=1)
    ran = {k.op_type: k.nodes for k in kernels.kernels if k.integer}
    expected = {"QLinearConv": 33, "MatMulIntegerToFloat": 14, "DynamicQuantizeMatMul": 1}
    assert ran == expected and kernels.qdq_nodes == 16, (ran, kernels.qdq_nodes)
    rel, agree = [], 0
    for i in range(4, 7):
        x = {"input": images[i : i + 1]}
        (ref,), (got,) = run(source, x), run(out, x)
        rel.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
        agree += int(ref.argmax() == got.argmax())
    assert agree == 3 and max(rel) < 0.08, rel


def _fused_ops(path: Path, tmp_path: Path) -> dict[str, int]:
    from collections import Counter

    from onnxprec._ort import create_session

    optimized = tmp_path / f"{path.stem}.optimized.onnx"
    create_session(str(path), optimization="all", optimized_model_path=optimized)
    return dict(Counter(n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node))


def test_minilm_int8_fuses_no_float_op_its_fp32_model_does_not(tmp_path: Path) -> None:
    """ONNX Runtime's fusions of the float remainder are those of the FP32 model: no SkipLayerNormalization (4x
    slower on CPU than Add + LayerNormalization) steered by shapes that our shape inference wrote; the cosine goal
    (>= 0.999 on rows 4-7 calibrated on rows 0-3) holds."""
    source = _shared_model("minilm_l6_v2_bert.onnx", "all-MiniLM-L6-v2")
    inputs = np.load(source.parent / "minilm_l6_v2_bert_inputs.npz")
    out = tmp_path / "q.onnx"
    quantize_file(source, out, calibration_data=[{k: inputs[k][:4] for k in inputs}])
    fp32, int8 = _fused_ops(source, tmp_path), _fused_ops(out, tmp_path)
    assert int8.get("SkipLayerNormalization", 0) <= fp32.get("SkipLayerNormalization", 0), (fp32, int8)
    assert int8.get("LayerNormalization", 0) >= fp32.get("LayerNormalization", 0)
    x = {k: inputs[k][4:] for k in inputs}
    (ref, *_), (got, *_) = run(source, x), run(out, x)
    cosine = float((ref.astype(np.float64) * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cosine >= 0.999, cosine


def test_efficientnet_a16w8_holds_rel_l2_003_on_images_it_did_not_see(tmp_path: Path) -> None:
    """Issue 29's A16W8 goal: calibrated on the 7 images, held-out rel L2 <= 0.03 on 25 others (15 other photos and
    crops, ``~/.cache/onnxprec/int8fix/effnet_hold.npz``, skipped where absent) with at most a quarter of the static
    activation tensors at 16 bits (GPTQ damping 1, the 16-bit default; some layers back in float)."""
    source = _shared_model("efficientnet_lite0.onnx", "EfficientNet-Lite0")
    held_out = Path.home() / ".cache" / "onnxprec" / "int8fix" / "effnet_hold.npz"
    if not held_out.is_file():
        pytest.skip(f"{held_out} is absent: the A16W8 held-out test is skipped")
    images = np.load(source.parent / "efficientnet_lite0_input.npy")
    out = tmp_path / "a16w8.onnx"
    quantize_file(source, out, calibration_data=[{"input": images}], activation_type="uint16",
                  target_accuracy="rel_l2<=0.02")  # fmt: skip
    model = onnx.load(out)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    types = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    wide = types.count(onnx.TensorProto.UINT16)
    assert 0 < wide <= len(types) / 4 and types.count(onnx.TensorProto.UINT8) == len(types) - wide, types
    x = np.load(held_out)["input"]
    images = [{"input": x[i : i + 1]} for i in range(len(x))]
    ref, got = (np.concatenate([outputs[0] for outputs in run_each(path, images)]) for path in (source, out))
    assert float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) <= 0.03
