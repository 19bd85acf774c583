"""``python -m onnxprec.quantization.int4`` and ``onnxprec quantize int4``: flags, report, one line per bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import run_cli
from onnxprec.quantization._testing import mlp

MODULE = "onnxprec.quantization.int4"


def _cli(*args: str, module: str = MODULE) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, module=module)  # in this process: same code path, no interpreter start per call


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(mlp(), path)
    return path


def test_help_lists_the_flags() -> None:
    text = _cli("--help").stdout
    for flag in (
        "--onnx_path", "--output_path", "--calibration_method", "--block_size", "--use_zero_point", "--output_format",
        "--accuracy_level", "--calibration_data", "--calibration_eps", "--nodes_to_exclude", "--external_data",
        "--layers_8bit", "--report_json", "--log_level", "awq_lite", "matmulnbits",
    ):  # fmt: skip
        assert flag in text, flag


@pytest.mark.slow
def test_default_output_report_and_console_script(model_path: Path, tmp_path: Path) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, X=np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32))
    report_path = tmp_path / "report.json"
    result = _cli(
        "--onnx_path", str(model_path), "--calibration_method", "awq_lite", "--calibration_data", str(calib),
        "--block_size", "16", "--report_json", str(report_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "model.quant.onnx"  # ModelOpt's default name; the former one is named in a warning
    assert out.exists() and f"saved {out}" in result.stdout
    assert "the default output is now <name>.quant.onnx, as ModelOpt's (it was <name>.int4.onnx)" in result.stderr
    report = json.loads(report_path.read_text())
    assert report["tool"] == "quantize int4" and report["counts"]["weights"] == 3
    assert report["calibration"]["batches"] == 2  # the npz batch of 2 is split into runs of 1
    second = tmp_path / "second.onnx"
    result = _cli(
        "quantize", "int4", "--onnx_path", str(model_path), "--output_path", str(second), "--calibration_method",
        "rtn", "--output_format", "matmulnbits", "--nodes_to_exclude", module="onnxprec.cli",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [n.op_type for n in onnx.load(second).graph.node].count("MatMulNBits") == 4  # lm_head included


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    model = folder / "model.onnx"
    onnx.save(mlp(), model)
    junk = folder / "junk.onnx"
    junk.write_bytes(b"not a model at all")
    np.savez(folder / "wrong.npz", input_ids=np.zeros((1, 4), np.int64))
    np.save(folder / "input.npy", np.zeros((1, 64), np.float32))
    quantized = folder / "quantized.onnx"
    from onnxprec.quantization.int4 import quantize_file

    quantize_file(model, quantized, calibration_method="rtn", log_level="WARNING")
    return {
        "model": model,
        "junk": junk,
        "wrong": folder / "wrong.npz",
        "npy": folder / "input.npy",
        "quantized": quantized,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block_size", "48"], "Invalid block size 48"),
        (["--onnx_path", "{junk}"], "is not a readable ONNX model"),
        (["--calibration_method", "awq_lite", "--calibration_data", "{wrong}"], "do not match the model's inputs"),
        (["--calibration_method", "gptq", "--calibration_data", "{npy}"], "has rank 2 (shape [1, 64])"),
        (["--onnx_path", "{quantized}"], "already quantized"),
        (["--calibration_eps", "cuda:0"], "is not available"),
        (["--output_path", "{tmp}/no/dir/out.onnx"], "does not exist"),
        (["--nodes_to_exclude", "(unclosed"], "Invalid regular expression"),
    ],
)
def test_bad_input_gives_one_line_exit_2_and_no_output(
    tmp_path: Path, bad_inputs: dict[str, Path], args: list[str], message: str
) -> None:
    args = [a.format(tmp=tmp_path, **bad_inputs) for a in args]
    if "--onnx_path" not in args:
        args = ["--onnx_path", str(bad_inputs["model"]), *args]
    if "--output_path" not in args:
        args += ["--output_path", str(tmp_path / "out.onnx")]
    before = sorted(p.name for p in (*tmp_path.iterdir(), *bad_inputs["model"].parent.iterdir()))
    result = _cli(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert message in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    after = sorted(p.name for p in (*tmp_path.iterdir(), *bad_inputs["model"].parent.iterdir()))
    assert after == before  # no output, no stray temporary file


@pytest.mark.slow
def test_the_command_line_applies_the_llm_defaults(tmp_path: Path) -> None:
    """The CLI leaves unsaid what the user left unsaid (it once re-validated its resolved options, so an LLM lost its
    defaults): an LLM without layer options gets MatMulNBits at block 32, its embedding quantized, its head at 8 bits;
    --nodes_to_exclude lm_head gives ModelOpt's default."""
    from onnxprec._testing import tiny_decoder

    src = tmp_path / "lm.onnx"
    onnx.save(tiny_decoder(vocab=64, head_size=16), src)
    for name, extra in (("default", []), ("modelopt", ["--nodes_to_exclude", "lm_head"])):
        out = tmp_path / f"{name}.onnx"
        args = ["quantize", "int4", "--onnx_path", str(src), "--output_path", str(out), "--calibration_method", "rtn"]
        assert run_cli(*args, *extra).returncode == 0
        ops = {n.op_type: n for n in onnx.load(out).graph.node}
        if name == "default":
            assert "GatherBlockQuantized" in ops and "DequantizeLinear" not in ops
            bits = {n.name: {a.name: a.i for a in n.attribute} for n in onnx.load(out).graph.node
                    if n.op_type == "MatMulNBits"}  # fmt: skip
            assert {b["block_size"] for b in bits.values()} == {32}
            assert sorted(b["bits"] for b in bits.values()) == [4, 4, 4, 4, 8]
        else:
            assert "DequantizeLinear" in ops and "GatherBlockQuantized" not in ops and "MatMul" in ops
