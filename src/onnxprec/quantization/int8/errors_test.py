"""Every bad input gives one clear line (an OnnxprecError) and leaves no output file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, OnnxprecError, UnsupportedModelError
from onnxprec.quantization import quantize
from onnxprec.quantization._testing import fails_cleanly, mlp
from onnxprec.quantization.int8 import quantize_file


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(mlp(), path)
    return path


def _fails(tmp_path: Path, error: type[OnnxprecError], match: str, source: Path, **kwargs: object) -> str:
    return fails_cleanly(quantize_file, tmp_path, error, match, source, **kwargs)


def test_unknown_mode_and_options(tmp_path: Path, model_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="Unknown quantize_mode 'int2'"):
        quantize(str(model_path), quantize_mode="int2", output_path=tmp_path / "out.onnx")
    message = "Unknown INT8 option 'calibration_methd'"
    _fails(tmp_path, InvalidArgumentError, message, model_path, calibration_methd="max")
    _fails(tmp_path, InvalidArgumentError, "Unknown INT8 calibration_method", model_path, calibration_method="awq_lite")
    _fails(tmp_path, InvalidArgumentError, "Invalid --target_accuracy", model_path, target_accuracy="rel<=1")
    _fails(tmp_path, InvalidArgumentError, "Unknown runtime", model_path, runtime="tensorrt")
    assert not (tmp_path / "out.onnx").exists()


def test_modelopt_keywords_of_other_names(tmp_path: Path, model_path: Path) -> None:
    """ModelOpt's calibration_shapes is the input_shapes of random calibration data; its calibration_cache_path is
    refused in one line, as is giving both spellings."""
    out = tmp_path / "shapes.onnx"
    report = quantize(str(model_path), output_path=out, calibration_shapes="X:3x5x64", log_level="WARNING",
                      random_calibration_data=True)  # fmt: skip
    assert report.count("dynamic") == 4 and report.calibration["samples"] == 3 and report.calibration["random"]
    with pytest.raises(CalibrationDataError, match="size 65 on axis 2"):  # the shapes reach the random data
        quantize(str(model_path), output_path=tmp_path / "no.onnx", calibration_shapes="X:3x5x65",
                 random_calibration_data=True)  # fmt: skip
    for arguments, message in (
        ({"calibration_cache_path": tmp_path / "cache.json"}, "calibration_cache_path is not supported"),
        ({"calibration_shapes": "X:3x5x64", "input_shapes": "X:1x5x64"}, "Give calibration_shapes or input_shapes"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            quantize(str(model_path), output_path=tmp_path / "no.onnx", **arguments)  # type: ignore[arg-type]
    assert not (tmp_path / "no.onnx").exists()


def test_without_data_int8_is_refused_in_one_line_unless_synthetic_inputs_are_asked_for(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without data INT8 refuses in one line naming --calibration_data and the flag that accepts synthetic inputs;
    with the flag it quantizes, and a WARNING and the summary say the check ran on synthetic inputs and cannot judge
    the task (here a [B, T, 64] feature input: random values, named in the WARNING)."""
    from onnxprec.cli import main

    message = _fails(tmp_path, CalibrationDataError, "--calibration_data", model_path)
    assert (
        message.startswith("No calibration data: INT8's activation ranges") and "--random_calibration_data" in message
    )
    out = tmp_path / "random.onnx"
    argv = ["quantize", "int8", "--onnx_path", str(model_path), "--output_path", str(out)]
    assert main(argv) == 2 and not out.exists()
    assert capsys.readouterr().err.count("error:") == 1
    assert main([*argv, "--random_calibration_data"]) == 0 and out.exists()
    printed = capsys.readouterr()
    assert "no calibration data: checked on random data" in printed.out and "cannot judge the task" in printed.out
    (warning,) = [line for line in printed.err.splitlines() if "No calibration data" in line]
    assert "random values for X, which have no synthetic form" in warning and "cannot judge the task" in warning


def test_empty_calibration_set(tmp_path: Path, model_path: Path) -> None:
    _fails(tmp_path, CalibrationDataError, "holds no batch", model_path, calibration_data=[])


def test_calibration_tensors_of_the_wrong_type_or_shape(tmp_path: Path, model_path: Path) -> None:
    wrong_type = [{"X": np.zeros((1, 4, 64), np.int64)}]
    message = _fails(tmp_path, CalibrationDataError, "X", model_path, calibration_data=wrong_type)
    assert "int64" in message or "type" in message
    wrong_shape = [{"X": np.zeros((1, 4, 65), np.float32)}]
    _fails(tmp_path, CalibrationDataError, "X", model_path, calibration_data=wrong_shape)


def test_a_model_with_nothing_to_quantize(tmp_path: Path) -> None:
    source = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor_info("x", F, [2, 3])],
                         [tensor_info("y", F, [2, 3])]), source)  # fmt: skip
    _fails(tmp_path, UnsupportedModelError, "Nothing to quantize", source)


def test_everything_excluded_and_already_quantized(tmp_path: Path, model_path: Path) -> None:
    message = _fails(tmp_path, UnsupportedModelError, "Nothing to quantize", model_path, nodes_to_exclude=[".*"])
    assert "excluded" in message
    quantized = tmp_path / "q.onnx"
    quantize_file(model_path, quantized, target_accuracy=None, random_calibration_data=True)
    _fails(tmp_path, UnsupportedModelError, "already quantized", quantized)


def test_the_input_is_never_overwritten(tmp_path: Path, model_path: Path) -> None:
    before = model_path.read_bytes()
    with pytest.raises(InvalidArgumentError):
        quantize_file(model_path, model_path)
    assert model_path.read_bytes() == before


def test_the_command_line_gives_one_line_and_exit_code_2(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's bad inputs through ``onnxprec quantize int8``: one ``error:`` line, exit code 2, no output."""
    from onnxprec.cli import main

    relu = tmp_path / "relu.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor_info("x", F, [2, 3])],
                         [tensor_info("y", F, [2, 3])]), relu)  # fmt: skip
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "int64.npz", X=np.zeros((1, 4, 64), np.int64))
    np.savez(tmp_path / "shape.npz", X=np.zeros((1, 4, 65), np.float32))
    cases = {
        "empty": (model_path, ["--calibration_data", str(tmp_path / "empty")]),
        "int64": (model_path, ["--calibration_data", str(tmp_path / "int64.npz")]),
        "shape": (model_path, ["--calibration_data", str(tmp_path / "shape.npz")]),
        "relu": (relu, []),
    }
    for name, (source, extra) in cases.items():
        out = tmp_path / f"{name}.quant.onnx"
        code = main(["quantize", "int8", "--onnx_path", str(source), "--output_path", str(out), *extra])
        err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[onnxprec] INFO")]
        assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (name, err)
        assert not out.exists() and not list(tmp_path.glob(f"*{name}.quant*")), name
