"""Tests for the strongly typed AutoCast sample: end to end on the CPU (as a subprocess), and its helpers."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys
from types import ModuleType

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxprec import _ort

HERE = pathlib.Path(__file__).resolve().parent
SAMPLE = HERE / "sample.py"


def _load_sample() -> ModuleType:
    """Imports sample.py as a module (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location("strongly_typed_autocast_sample", SAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered.
    spec.loader.exec_module(module)
    return module


sample = _load_sample()


def _run_sample(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SAMPLE), *args], capture_output=True, text=True, timeout=300, check=False
    )


def _stage_section(stdout: str, step: str) -> str:
    """The lines a stage printed, from its ``[step]`` header to the next blank line."""
    match = re.search(rf"^\[{re.escape(step)}\] .*?(?:\n\n|\Z)", stdout, flags=re.MULTILINE | re.DOTALL)
    assert match, f"stage [{step}] missing from the output:\n{stdout}"
    return match.group(0)


@pytest.mark.slow
def test_sample_fp16_end_to_end_on_cpu(tmp_path: pathlib.Path) -> None:
    work = tmp_path / "work"
    result = _run_sample("--working_dir", str(work), "--precision", "fp16")
    output = result.stdout + result.stderr

    assert result.returncode == 0, output
    assert result.stdout.rstrip().endswith("Sample finished successfully."), output
    assert "Traceback" not in output
    for step in ("1", "2", "3a", "3b"):
        assert _stage_section(result.stdout, step).rstrip().endswith("passed"), output
    # Stage 2 classifies all ten committed digits correctly, and the fp16 model agrees with it.
    assert "10/10 labelled images classified correctly" in result.stdout
    assert "predictions identical to FP32: 10/10" in _stage_section(result.stdout, "3b")
    # Stage 4 runs where a GPU stack is installed, else says plainly why it was skipped.
    for step in ("4a", "4b"):
        section = _stage_section(result.stdout, step)
        assert section.rstrip().endswith("passed") or "SKIPPED: " in section, section

    assert set(np.load(work / "inputs.npz")) == {"image"}
    gold = np.load(work / "gold_fp32.npz")
    assert gold["logits"].shape == (10, 10)
    assert list(gold["logits"].argmax(axis=1)) == list(range(10))
    converted = onnx.load(work / "digits_cnn.fp16.onnx")
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16  # keep_io_types=False


@pytest.mark.slow
def test_sample_bf16_on_cpu(tmp_path: pathlib.Path) -> None:
    """BF16 converts; where the CPU provider lacks bf16 kernels, the numeric check is skipped plainly."""
    result = _run_sample("--working_dir", str(tmp_path), "--precision", "bf16")
    output = result.stdout + result.stderr

    assert result.returncode == 0, output
    assert "Sample finished successfully." in result.stdout
    assert "Traceback" not in output
    assert _stage_section(result.stdout, "3a").rstrip().endswith("passed"), output
    section = _stage_section(result.stdout, "3b")
    assert section.rstrip().endswith("passed") or "has no bf16 kernel" in section, section
    converted = onnx.load(tmp_path / "digits_cnn.bf16.onnx")
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16


def test_missing_data_dir_is_a_one_line_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sample's main in this process (what ``python sample.py`` runs, without an interpreter start)."""
    assert sample.main(["--data_dir", str(tmp_path / "nope"), "--working_dir", str(tmp_path / "work")]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        f"error: data folder {tmp_path / 'nope'} does not exist (give one with --data_dir)"
    ]
    assert captured.out == "" and not (tmp_path / "work").exists()


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        sample.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for option in ("--data_dir", "--working_dir", "--precision", "fp16", "bf16"):
        assert option in out


def test_read_pgm_binary_and_ascii(tmp_path: pathlib.Path) -> None:
    pixels, maxval = sample.read_pgm(HERE / "data" / "digit_3.pgm")
    assert (pixels.shape, maxval) == ((8, 8), 16)
    assert int(pixels.max()) <= 16

    ascii_pgm = tmp_path / "a.pgm"
    ascii_pgm.write_text("P2\n# a comment\n3 2\n255\n0 1 2\n253 254 255\n")
    pixels, maxval = sample.read_pgm(ascii_pgm)
    assert maxval == 255
    np.testing.assert_array_equal(pixels, [[0, 1, 2], [253, 254, 255]])

    wide = tmp_path / "w.pgm"
    wide.write_bytes(b"P5 2 1 65535\n" + np.array([1, 65535], dtype=">u2").tobytes())
    np.testing.assert_array_equal(sample.read_pgm(wide)[0], [[1, 65535]])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"P6\n1 1\n255\n\x00\x00\x00", "expected P5 or P2"),
        (b"P5\n2 2\n255\n\x00", "truncated"),
        (b"P5\n2", "truncated header"),
        (b"P5\n1 1\n16\n\x11", "exceed maxval"),
    ],
)
def test_read_pgm_rejects_bad_files(tmp_path: pathlib.Path, content: bytes, message: str) -> None:
    bad = tmp_path / "bad.pgm"
    bad.write_bytes(content)
    with pytest.raises(sample.UsageError, match=message):
        sample.read_pgm(bad)


def test_run_onnxruntime_bf16_io(tmp_path: pathlib.Path) -> None:
    """bfloat16 inputs and outputs work (ONNX Runtime's numpy API has none: onnxprec's Session binds them)."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x32", "x32"], ["sq"]),
            helper.make_node("Cast", ["sq"], ["y"], to=TensorProto.BFLOAT16),
        ],
        "bf16_io",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["batch", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["batch", 3]),
            helper.make_tensor_value_info("sq", TensorProto.FLOAT, ["batch", 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    session = _ort.create_session(model)

    x = np.array([[1.5, -2.0, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
    feeds = sample.cast_feeds({"x": x}, sample.input_dtypes(model))
    assert feeds["x"].dtype == ml_dtypes.bfloat16
    outputs = sample.run_onnxruntime(session, feeds)
    assert outputs["y"].dtype == np.float32 and outputs["sq"].dtype == np.float32
    np.testing.assert_array_equal(outputs["y"], x * x)
    np.testing.assert_array_equal(outputs["sq"], x * x)


def test_compare_with_gold() -> None:
    gold = {"logits": np.array([[1.0, 9.0], [8.0, -2.0]], dtype=np.float32)}
    close = {"logits": gold["logits"] + 0.01}
    lines = sample.compare_with_gold(close, gold, "fp16", "logits")
    assert any("predictions identical to FP32: 2/2" in line for line in lines)

    with pytest.raises(sample.StageError, match="exceeds tolerance"):
        sample.compare_with_gold({"logits": gold["logits"] + 1.0}, gold, "fp16", "logits")
    flipped = {"logits": np.array([[9.0, 1.0], [8.0, -2.0]], dtype=np.float32)}
    with pytest.raises(sample.StageError, match="1 predictions differ from FP32"):
        sample.compare_with_gold(flipped, gold, "bf16", "logits")
    with pytest.raises(sample.StageError, match="not finite"):
        sample.compare_with_gold({"logits": gold["logits"] * np.nan}, gold, "fp16", "logits")


@pytest.mark.parametrize(
    ("message", "op"),
    [
        (
            "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Conv(22) node with "
            "name '/features/features.0/Conv'",
            "Conv(22)",
        ),
        (  # ONNX Runtime 1.31's CUDA provider on a bf16 MaxPool (seen on an H200).
            "[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: /onnxruntime_src/onnxruntime/core/"
            "optimizer/transformer_memcpy.cc:253 bool onnxruntime::TransformerMemcpyImpl::IsNodeCompatibleWith"
            "Provider(const onnxruntime::Node&) const !node_provider_type.empty() was false. Provider type for "
            "MaxPool node with name '/features/features.6/MaxPool' is not set.",
            "MaxPool",
        ),
    ],
)
@pytest.mark.slow
def test_missing_bf16_kernel_is_a_skip(message: str, op: str) -> None:
    with pytest.raises(sample.StageSkipped, match=rf"has no bf16 kernel for {re.escape(op)}"):
        sample._skip_if_no_bf16_kernel(RuntimeError(message), "CUDAExecutionProvider", "bf16")
    # The same gap in an fp16 model, or any other error, is not skipped: the caller reports it as a failure.
    sample._skip_if_no_bf16_kernel(RuntimeError(message), "CUDAExecutionProvider", "fp16")
    sample._skip_if_no_bf16_kernel(RuntimeError("FAIL : something else"), "CUDAExecutionProvider", "bf16")
