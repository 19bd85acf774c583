"""Every bad input gives one clear line (an OnnxprecError) and leaves no output file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.errors import (
    CalibrationDataError,
    InvalidArgumentError,
    ModelLoadError,
    OnnxprecError,
    UnsupportedModelError,
)
from onnxprec.quantization._testing import fails_cleanly, mlp, single_matmul
from onnxprec.quantization.int4 import quantize, quantize_file


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(mlp(), path)
    return path


def _fails(tmp_path: Path, error: type[OnnxprecError], match: str, source: Path, **kwargs: object) -> str:
    return fails_cleanly(quantize_file, tmp_path, error, match, source, **kwargs)


@pytest.mark.parametrize("block_size", [48, 8, 0, -2, 100])
def test_block_size_must_be_a_power_of_two_of_at_least_16(tmp_path: Path, model_path: Path, block_size: int) -> None:
    _fails(tmp_path, InvalidArgumentError, "power of two >= 16", model_path, block_size=block_size)


def test_junk_and_missing_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model at all")
    _fails(tmp_path, ModelLoadError, "not", junk, calibration_method="rtn")
    _fails(tmp_path, ModelLoadError, "does not exist", tmp_path / "missing.onnx", calibration_method="rtn")


def test_calibration_data_for_another_model(tmp_path: Path, model_path: Path) -> None:
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, pixel_values=np.zeros((1, 3, 8, 8), np.float32))
    message = _fails(tmp_path, CalibrationDataError, "do not match", model_path, calibration_data_reader=str(wrong))
    assert "pixel_values" in message and "X" in message
    npy = tmp_path / "input.npy"
    np.save(npy, np.zeros((1, 3), np.float32))
    _fails(tmp_path, CalibrationDataError, "has rank 2", model_path, calibration_data_reader=str(npy))  # one input
    _fails(tmp_path, CalibrationDataError, "dtype", model_path, calibration_method="gptq",
           calibration_data_reader=[{"X": np.zeros((1, 2, 64), np.float64)}])  # fmt: skip


def test_already_quantized_model(tmp_path: Path, model_path: Path) -> None:
    once = tmp_path / "once.onnx"
    quantize_file(model_path, once, calibration_method="rtn", block_size=16)
    _fails(tmp_path, UnsupportedModelError, "already quantized", once, calibration_method="rtn")


def test_provider_not_installed(tmp_path: Path, model_path: Path) -> None:
    _fails(tmp_path, InvalidArgumentError, "not available", model_path, calibration_eps=["cuda:0"])
    _fails(tmp_path, InvalidArgumentError, "Unknown provider", model_path, calibration_eps=["tpu"])


def test_nothing_to_quantize(tmp_path: Path) -> None:
    # a non-float weight, a weight that is not an initializer, and everything else excluded
    nodes = [
        helper.make_node("MatMul", ["X", "Wi"], ["a"], name="int_weight"),
        helper.make_node("MatMul", ["X", "Xt"], ["b"], name="activation_weight"),
        helper.make_node("MatMul", ["X", "W"], ["c"], name="/lm_head/MatMul"),
    ]
    model = make_model(
        nodes,
        [tensor_info("X", onnx.TensorProto.INT32, [2, 2]), tensor_info("Xt", onnx.TensorProto.INT32, [2, 2])],
        [tensor_info(n, onnx.TensorProto.INT32, [2, 2]) for n in "ab"],
        {"Wi": np.ones((2, 2), np.int32), "W": np.ones((2, 2), np.int32)},
    )
    path = tmp_path / "ints.onnx"
    onnx.save(model, path)
    _fails(tmp_path, UnsupportedModelError, "Nothing to quantize", path, calibration_method="rtn")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"calibration_method": "awq_magic"}, "Unknown calibration_method 'awq_magic'"),
        ({"output_format": "qoperator"}, "Unknown output_format"),
        ({"nodes_to_exclude": ["("]}, "Invalid regular expression"),
        ({"awqclip_alpha_min": 0}, "awqclip_alpha_min"),
        ({"accuracy_level": 7}, "accuracy_level"),
        ({"block_sise": 32}, "Did you mean 'block_size'"),
    ],
)
def test_bad_options(tmp_path: Path, model_path: Path, kwargs: dict, match: str) -> None:
    _fails(tmp_path, InvalidArgumentError, match, model_path, **kwargs)


def test_output_may_not_overwrite_the_input(tmp_path: Path, model_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        quantize_file(model_path, model_path, calibration_method="rtn")


@pytest.mark.parametrize("call", [lambda m: quantize(m, block_size=48), lambda m: quantize(m, calibration_eps=["dml"])])
def test_api_raises_before_any_work(call: Callable[[onnx.ModelProto], object]) -> None:
    model, _ = single_matmul()
    with pytest.raises(InvalidArgumentError):
        call(model)


def test_random_calibration_warns(caplog: pytest.LogCaptureFixture) -> None:
    model = make_model(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
        [tensor_info("X", F, ["batch", "seq", 32])],
        [tensor_info("Y", F, ["batch", "seq", 16])],
        {"W": np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)},
    )
    with caplog.at_level("WARNING", logger="onnxprec"):
        quantize(model, calibration_method="awq_lite", block_size=16)
    assert "random inputs" in caplog.text and "representative" in caplog.text
