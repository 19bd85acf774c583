"""The command line: ModelOpt's flags, default output path, and one clean line for every user error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxprec._testing import F, make_model, run, tensor_info


def _cli(*args: str, module: str = "onnxprec.autocast") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["Y"], name="relu"),
    ]
    path = tmp_path / "model.onnx"
    onnx.save(
        make_model(nodes, [tensor_info("X", F, ["batch", 4])], [tensor_info("Y", F, ["batch", 4])], {"W": w}), path
    )
    return path


def test_default_output_path_and_numerics(model_path: Path) -> None:
    result = _cli("--onnx_path", str(model_path), "--keep_io_types")
    assert result.returncode == 0, result.stderr
    out = model_path.with_name("model.fp16.onnx")
    assert out.exists()
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run(out, {"X": x})[0], run(model_path, {"X": x})[0], rtol=1e-2, atol=1e-2)
    assert "Converted 2/2 nodes (100.0%) to fp16" in result.stderr


def test_bf16_and_console_script_subcommand(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.onnx"
    result = _cli(
        "autocast",
        "--onnx_path",
        str(model_path),
        "--output_path",
        str(out),
        "-t",
        "bf16",
        "--data_max",
        "inf",
        module="onnxprec.cli",
    )
    assert result.returncode == 0, result.stderr
    model = onnx.load(out)
    assert model.opset_import[0].version == 22
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16


def test_help_lists_modelopt_flags() -> None:
    text = _cli("--help").stdout
    for flag in (
        "--onnx_path",
        "--output_path",
        "--low_precision_type",
        "--calibration_data",
        "--nodes_to_exclude",
        "--op_types_to_exclude",
        "-ni",
        "-opi",
        "--data_max",
        "--init_max",
        "--init_conversion_max_bytes",
        "--max_depth_of_reduction",
        "--keep_io_types",
        "--log_level",
        "--providers",
        "--trt_plugins",
        "--trt_plugins_precision",
        "--opset",
        "--input_shapes",
    ):
        assert flag in text


def _bad_files(tmp_path: Path, model_path: Path) -> dict[str, tuple[Path, str]]:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model at all")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model_path.read_bytes()[:60])
    # external data: the data file is missing
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "W")
    ext_model = make_model(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], [tensor_info("X", F, [1, 64])], [tensor_info("Y", F, [1, 64])]
    )
    ext_model.graph.initializer.append(w)
    ext = tmp_path / "ext.onnx"
    onnx.save(ext_model, ext, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").unlink()
    quant = tmp_path / "quant.onnx"
    qnodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["d"]), helper.make_node("Add", ["X", "d"], ["Y"])]
    onnx.save(
        make_model(
            qnodes,
            [tensor_info("X", F, [2])],
            [tensor_info("Y", F, [2])],
            {"q": np.array([1, 2], np.int8), "s": np.array(0.1, np.float32)},
        ),
        quant,
    )
    return {
        "missing": (tmp_path / "nope.onnx", "does not exist"),
        "junk": (junk, "not"),
        "truncated": (truncated, "truncated"),
        "missing external data": (ext, "External data file 'ext.onnx.data'"),
        "already quantized": (quant, "already quantized"),
    }


def test_bad_model_files_give_one_line_and_no_output(tmp_path: Path, model_path: Path) -> None:
    for label, (path, message) in _bad_files(tmp_path, model_path).items():
        out = tmp_path / f"{label}.out.onnx"
        result = _cli("--onnx_path", str(path), "--output_path", str(out))
        assert result.returncode == 2, (label, result.stderr)
        assert "Traceback" not in result.stderr, label
        assert message in result.stderr, (label, result.stderr)
        assert not out.exists(), label
        assert len(result.stderr.strip().splitlines()) == 1, (label, result.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes_to_exclude", "(unclosed"], "Invalid regular expression '(unclosed'"),
        (["--op_types_to_exclude", "Cnov"], "Unknown op type 'Cnov'"),
        (["--calibration_data", "{inputs}"], "do not match the model's inputs"),
        (["--output_path", "{model}"], "would overwrite the input model"),
        (["--output_path", "{tmp}/no/such/dir/out.onnx"], "does not exist"),
        (["--providers", "tpu"], "Unknown provider 'tpu'"),
        (["--trt_plugins_precision", "Op:int3"], "Invalid --trt_plugins_precision"),
        (["--input_shapes", "X=1x4"], "Invalid --input_shapes"),
    ],
)
def test_bad_flags(tmp_path: Path, model_path: Path, args: list[str], message: str) -> None:
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, wrong_name=np.ones((1, 4), np.float32))
    args = [a.format(inputs=inputs, model=model_path, tmp=tmp_path) for a in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _cli("--onnx_path", str(model_path), *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial or stray output
