"""A16W8: 16-bit activations with INT8 weights, for every static tensor or only where 8 bits cost too much."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnxprec._testing import run_each
from onnxprec.quantization._testing import correlated, mlp
from onnxprec.quantization.int8 import Int8Options, quantize_file

# static activations with outlier channels: 8 bits lose them, 16 keep them (no SmoothQuant, no bias correction)
_COMMON: dict[str, Any] = {"activations": "static", "max_float_compute": 0, "accuracy_guard": False,
                           "smoothquant": False, "bias_correction": False, "log_level": "WARNING"}  # fmt: skip


def _data() -> list[dict[str, np.ndarray]]:
    return [{"X": correlated(32, 64, seed=i).reshape(2, 16, 64)} for i in range(4)]


def _activation_types(path: Path) -> collections.Counter[str]:
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    inits = {i.name: i for i in model.graph.initializer}
    return collections.Counter(
        onnx.TensorProto.DataType.Name(inits[n.input[2]].data_type)
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits
    )


def _rel(source: Path, out: Path, data: list[dict[str, np.ndarray]]) -> float:
    ref, got = (np.concatenate([outputs[0] for outputs in run_each(path, data)]) for path in (source, out))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    return path


@pytest.mark.slow
def test_the_tensors_8_bits_cost_most_go_to_16(tmp_path: Path, source: Path) -> None:
    data = _data()
    eight, mixed = tmp_path / "a8.onnx", tmp_path / "mixed.onnx"
    quantize_file(source, eight, calibration_data=data, **_COMMON)
    report = quantize_file(source, mixed, calibration_data=data, activation_type="int16",
                           target_accuracy="rel_l2<=0.02", max_wide_tensors=1.0, **_COMMON)  # fmt: skip
    assert 0 < len(report.wide_tensors) < report.static_tensors == 3
    assert f"{len(report.wide_tensors)} of 3 static tensors at 16 bits" in report.summary
    types = _activation_types(mixed)
    assert types == {"INT16": len(report.wide_tensors), "UINT8": 3 - len(report.wide_tensors)}
    assert _activation_types(eight) == {"UINT8": 3}
    assert _rel(source, mixed, data) <= 0.02 < _rel(source, eight, data)
    assert report.to_json()["wide_tensors"] == report.wide_tensors


def test_at_most_max_wide_tensors_go_to_16_bits(tmp_path: Path, source: Path) -> None:
    report = quantize_file(source, tmp_path / "one.onnx", calibration_data=_data(), activation_type="uint16",
                           target_accuracy="rel_l2<=0.001", max_wide_tensors=0.34, **_COMMON)  # fmt: skip
    assert len(report.wide_tensors) == 1
    assert _activation_types(tmp_path / "one.onnx") == {"UINT16": 1, "UINT8": 2}


def test_without_a_target_every_static_tensor_is_16_bits(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "all.onnx"
    report = quantize_file(source, out, calibration_data=_data(), activation_type="QInt16", **_COMMON)
    assert report.wide_tensors == [] and _activation_types(out) == {"INT16": 3}
    model = onnx.load(str(out))
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21
    assert Int8Options(activation_type="QUInt16").activation_type == "uint16"  # ONNX Runtime's and Quark's names
