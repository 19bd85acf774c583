"""``gptq_damp``: GPTQ's damping of the Conv weights' rounding, from fitting the calibration data to nearest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxprec._testing import F, make_model, run_each, tensor_info
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization.algorithms.int8 import quantize_weight
from onnxprec.quantization.int8 import Int8Options, quantize_file
from onnxprec.quantization.int8._options import GPTQ_DAMP, WIDE_GPTQ_DAMP

# 16-bit activations: the output error is the weights' rounding (nothing else fitted to the data)
_COMMON: dict[str, Any] = {"activation_type": "int16", "accuracy_guard": False, "smoothquant": False,
                           "bias_correction": False, "nodes_to_quantize": [".*"], "log_level": "WARNING"}  # fmt: skip


def _conv(path: Path) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 16, 1, 1)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="/pw/Conv", kernel_shape=[1, 1])
    onnx.save(make_model([node], [tensor_info("x", F, ["N", 16, 6, 6])], [tensor_info("y", F, ["N", 8, 6, 6])],
                         {"w": weight}), path)  # fmt: skip


def _data() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    mixing = rng.standard_normal((16, 16))  # correlated channels: GPTQ's error feedback has something to use
    return [{"x": (rng.standard_normal((2, 6, 6, 16)) @ mixing).transpose(0, 3, 1, 2).astype(np.float32)}
            for _ in range(3)]  # fmt: skip


def _levels(path: Path) -> np.ndarray:
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    return next(a for a in inits.values() if a.dtype == np.int8 and a.shape == (8, 16, 1, 1))


def test_more_damping_rounds_nearer_and_fits_the_calibration_data_less(tmp_path: Path) -> None:
    source = tmp_path / "conv.onnx"
    _conv(source)
    data = _data()
    errors, levels = {}, {}
    for damp in (0.01, 1e6):
        out = tmp_path / f"q{damp}.onnx"
        report = quantize_file(source, out, calibration_data=data, gptq_damp=damp, **_COMMON)
        assert [e.info["rounding"] for e in report.layers] == ["gptq"]
        levels[damp] = _levels(out)
        ref, got = (np.concatenate([outputs[0] for outputs in run_each(path, data)]) for path in (source, out))
        errors[damp] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    rtn, _ = quantize_weight(numpy_helper.to_array(onnx.load(source).graph.initializer[0]), axis=0)
    assert np.array_equal(levels[1e6], rtn)  # a Hessian that is all damping is rounding to nearest
    assert not np.array_equal(levels[0.01], rtn)
    assert errors[0.01] < 0.8 * errors[1e6]  # ONNX Runtime's outputs on the calibration data


def test_gptq_damp_must_be_positive() -> None:
    with pytest.raises(InvalidArgumentError, match="gptq_damp must be > 0"):
        Int8Options(gptq_damp=0.0)


def test_the_default_damping_follows_the_activation_bits() -> None:
    assert Int8Options().damp == GPTQ_DAMP == 0.01
    assert Int8Options(activation_type="QInt16").damp == Int8Options(activation_type="uint16").damp == WIDE_GPTQ_DAMP
    assert Int8Options(activation_type="int16", gptq_damp=0.1).damp == 0.1
