"""dump and compare on real trained models with real inputs (slow; skipped where the models are absent).

EfficientNet-Lite0 comes from ../shared/models or from the benchmark zoo cache (``python -m zoo build
efficientnet_lite0``, ``$ONNXPREC_ZOO`` or ``~/.cache/onnxprec/zoo``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import run, shared_path
from onnxprec.autocast import convert_to_mixed_precision
from onnxprec.debug import compare_models, dump_model

pytestmark = pytest.mark.slow


def _efficientnet() -> tuple[Path, dict[str, np.ndarray]]:
    shared = shared_path("models")
    if shared is not None and (shared / "efficientnet_lite0.onnx").is_file():
        return shared / "efficientnet_lite0.onnx", {"input": np.load(shared / "efficientnet_lite0_input.npy")[:2]}
    zoo = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo"))
    if (zoo / "efficientnet_lite0.onnx").is_file():
        with np.load(zoo / "efficientnet_lite0.inputs.npz") as data:
            return zoo / "efficientnet_lite0.onnx", {"input": data["input"][:2]}
    pytest.skip(
        "EfficientNet-Lite0 is absent from ../shared/models and from the zoo cache: real-model tests skipped "
        "(python -m zoo build efficientnet_lite0)"
    )


def test_efficientnet_fp32_vs_autocast_fp16(tmp_path: Path) -> None:
    path, feeds = _efficientnet()
    candidate = tmp_path / "e16.onnx"
    onnx.save(convert_to_mixed_precision(str(path), keep_io_types=True, calibration_data=feeds), candidate)
    report = compare_models(path, candidate, feeds)
    counts = report.counts
    assert counts["unmatched"] == 0 and counts["compared"] == counts["tensors"] > 100
    by_name = sum(1 for r in report.rows if r.match == "name")
    assert by_name >= 0.95 * counts["tensors"], {r.match for r in report.rows}
    assert report.first_divergence is None, report.summary
    assert max(r.rel_l2 for r in report.rows if r.rel_l2 is not None) < 0.02
    (logits,) = report.outputs.values()
    assert logits.rel_l2 is not None and logits.rel_l2 < 0.01 and logits.top1 == 1.0
    assert report.rows[-1].op_type == "Gemm"


def test_efficientnet_dump_float(tmp_path: Path) -> None:
    path, feeds = _efficientnet()
    result = dump_model(path, feeds, dump_float=True, output_dir=str(tmp_path / "dump"))
    inferred = onnx.shape_inference.infer_shapes(onnx.load(path))
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    floats = [out for n in inferred.graph.node for out in n.output if types[out] == onnx.TensorProto.FLOAT]
    assert [e["name"] for e in result.tensors] == floats and len(floats) > 100  # not the int64 pads of the Pads
    assert all(set(e["files"]) == {"float_bin", "float_txt"} for e in result.tensors)
    (expected,) = run(path, feeds)
    entry = result.tensors[-1]
    np.testing.assert_allclose(
        np.fromfile(tmp_path / "dump" / entry["files"]["float_bin"], np.float32).reshape(entry["shape"]),
        expected,
        rtol=1e-5,
        atol=1e-5,
    )


def test_efficientnet_ort_quantize_static_is_judged_by_what_consumers_see(tmp_path: Path) -> None:
    """ONNX Runtime's QDQ quantizer drops each Clip and leaves its output name on the Conv before it: the Clip rows
    are compared as the next node reads them (the DequantizeLinear output), not as the Conv's pre-clip values."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    path, feeds = _efficientnet()
    images = [{"input": feeds["input"][i : i + 1]} for i in range(len(feeds["input"]))]

    class Reader:
        def __init__(self) -> None:
            self.batches = iter(images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantized = tmp_path / "ort_int8.onnx"
    quantize_static(str(path), str(quantized), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)  # fmt: skip
    report = compare_models(path, quantized, feeds)
    rows = {r.node: r for r in report.rows}
    clip = rows["/Clip"]
    assert clip.candidate == "/Clip_output_0_DequantizeLinear_Output", clip.match
    assert clip.rel_l2 is not None and clip.rel_l2 < 0.05 and not clip.diverged
    stem = rows["/_conv_stem/Conv"]  # its values now carry the Clip's name, before the clip
    assert stem.candidate == "/Clip_output_0" and stem.rel_l2 is not None and stem.rel_l2 < 0.03
    clips = [r for r in report.rows if r.op_type == "Clip"]
    assert len(clips) > 20 and all(r.candidate and r.candidate.endswith("_DequantizeLinear_Output") for r in clips)
    # A true divergence (ORT's INT8 accumulates error along the network) points to nodes that ORT quantized.
    model = onnx.load(quantized)
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    reads_quantized = {n.name for n in model.graph.node if any(i in dequantized for i in n.input)}
    assert report.first_divergence is not None and report.exclude_nodes
    assert set(report.exclude_nodes) <= reads_quantized, report.exclude_nodes
    assert report.exclude_pattern is not None and "Clip" not in report.exclude_pattern
