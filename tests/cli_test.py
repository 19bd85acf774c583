"""The command line: ModelOpt's flags, default output path, one clean line for every user error, the JSON report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxprec
from onnxprec import cli
from onnxprec._testing import F, make_model, run, run_cli, tensor_info
from onnxprec.errors import InvalidArgumentError


def _cli(*args: str, module: str = "onnxprec.autocast") -> subprocess.CompletedProcess[str]:
    return run_cli(*args, module=module)  # in this process: same code path, no interpreter start per call


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
        "--no_validate",  # with only the CPU provider BF16 is refused unless written unchecked (or kept FP32)
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
    return {
        "missing": (tmp_path / "nope.onnx", "does not exist"),
        "junk": (junk, "not"),
        "truncated": (truncated, "truncated"),
        "missing external data": (ext, "External data file 'ext.onnx.data'"),
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
        (["--output_path", "{model}"], "would overwrite the input"),
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


# --- --report_json and AutoCastReport.to_json ----------------------------------------------------------


def _check_report_against_model(report: dict[str, object], written: Path, original: Path) -> None:
    """The report's counts and per-node precisions agree with the model written."""
    model = onnx.shape_inference.infer_shapes(onnx.load(written), strict_mode=True)
    counts = report["counts"]
    assert isinstance(counts, dict)
    nodes = list(model.graph.node)
    casts = [n for n in nodes if n.op_type == "Cast"]
    assert len(nodes) == counts["nodes"] + counts["casts"]
    assert len(casts) == counts["casts"]
    low = TensorProto.FLOAT16 if report["low_precision_type"] == "fp16" else TensorProto.BFLOAT16
    assert sum(i.data_type == low for i in model.graph.initializer) == counts["initializers_converted"]
    listed = report["nodes"]
    assert isinstance(listed, list)
    assert len(listed) == counts["nodes"]
    assert sum(n["precision"] != "fp32" for n in listed) == counts["low_nodes"]
    assert {n["name"] for n in listed} == {n.name for n in onnx.load(original).graph.node}
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.output)}
    by_name = {n.name: n for n in nodes}
    for entry in listed:
        assert entry["reason"], entry
        out = types[by_name[entry["name"]].output[0]]
        assert out == (TensorProto.FLOAT if entry["precision"] == "fp32" else low), entry


def test_report_json_lists_every_node_and_matches_the_model(model_path: Path, tmp_path: Path) -> None:
    out, report_path = tmp_path / "out.onnx", tmp_path / "report.json"
    result = _cli(
        "--onnx_path", str(model_path), "--output_path", str(out), "-ne", "relu", "--report_json", str(report_path)
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["tool"] == "autocast" and report["onnxprec_version"] == onnxprec.__version__
    assert (report["input"], report["output"], report["low_precision_type"]) == (str(model_path), str(out), "fp16")
    assert report["counts"] == {
        "nodes": 2,
        "low_nodes": 1,
        "casts": 2,
        "initializers_converted": 1,
        "initializers_copied": 0,
        "initializers_cast_at_runtime": 0,
    }
    relu = next(n for n in report["nodes"] if n["name"] == "relu")
    assert relu["precision"] == "fp32" and "nodes_to_exclude" in relu["reason"]
    assert set(report["seconds"]) >= {"reference", "save"}
    assert report["numeric"]["skipped"] == "" and set(report["numeric"]["outputs"]) == {"Y"}
    _check_report_against_model(report, out, model_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_report_of_the_api_and_of_the_bundled_example(tmp_path: Path) -> None:
    from onnxprec.autocast import convert_file

    example = Path(__file__).resolve().parents[1] / "examples/strongly_typed_autocast/model/digits_cnn.onnx"
    if not example.exists():
        pytest.skip("the bundled example model is absent")
    out = tmp_path / "d.bf16.onnx"
    report = convert_file(example, out, low_precision_type="bf16", keep_io_types=True, keep_unsupported_fp32=True)
    report = report.to_json()
    json.dumps(report, allow_nan=False)  # plain JSON: no NaN/inf, no numpy types
    assert report["output"] == str(out) and report["low_precision_type"] == "bf16"
    _check_report_against_model(report, out, example)


def test_report_without_numeric_check_and_with_a_non_finite_error() -> None:
    from types import SimpleNamespace

    from onnxprec.autocast import AutoCastReport

    report = AutoCastReport("fp16")
    assert report.to_json()["numeric"] is None and report.to_json()["nodes"] == []
    errors = {"y": {"max_abs": float("inf"), "rel_l2": float("nan"), "finite": 0.0}}
    report.numeric = SimpleNamespace(skipped="", errors=errors, task=None)  # a NumericReport's fields
    data = report.to_json()
    json.dumps(data, allow_nan=False)
    assert data["numeric"]["outputs"]["y"] == {"max_abs": None, "rel_l2": None, "finite": False}


@pytest.mark.parametrize(
    ("target", "message"),
    [("{model}", "would overwrite"), ("{tmp}/no/such/dir/r.json", "does not exist")],
)
def test_bad_report_path_fails_before_the_work(tmp_path: Path, model_path: Path, target: str, message: str) -> None:
    before = model_path.read_bytes()
    result = _cli("--onnx_path", str(model_path), "--report_json", target.format(model=model_path, tmp=tmp_path))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "--report_json" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert model_path.read_bytes() == before
    assert not model_path.with_name("model.fp16.onnx").exists()


# --- subcommands, help, start-up --------------------------------------------------------------------------


@pytest.mark.slow
def test_help_shows_an_example_and_imports_nothing_heavy() -> None:
    script = (
        "import sys\n"
        "from onnxprec.cli import {entry}\n"
        "try:\n    {call}\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('onnx', 'onnx_ir', 'numpy', 'onnxruntime', 'sympy') if m in sys.modules)\n"
        "print('heavy:', heavy, file=sys.stderr)\n"
    )
    for entry, call, example in [
        ("tool_main", "tool_main('autocast', ['--help'])", "python -m onnxprec.autocast --onnx_path model.onnx"),
        ("main", "main(['autocast', '--help'])", "onnxprec autocast --onnx_path model.onnx"),
        ("main", "main(['--help'])", "autocast"),
    ]:
        result = subprocess.run(
            [sys.executable, "-c", script.format(entry=entry, call=call)], capture_output=True, text=True, timeout=60
        )
        assert "heavy: []" in result.stderr, (call, result.stderr)
        assert example in result.stdout, (call, result.stdout)


@pytest.mark.slow
def test_python_m_onnxprec_is_the_onnxprec_command() -> None:
    """``python -m onnxprec`` runs onnxprec.cli.main: the same subcommands, help and version."""
    import onnxprec

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "onnxprec", *argv], capture_output=True, text=True, timeout=60)

    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"onnxprec {onnxprec.__version__}", version
    tools = run("--help")
    assert tools.returncode == 0 and all(t in tools.stdout for t in ("autocast", "quantize", "compare")), tools
    bad = run("quantize", "int4", "--onnx_path", "nope.onnx")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "nope.onnx" in bad.stderr, bad


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["onnxprec.autocast"],
        ["onnxprec.quantization.int4"],
        ["onnxprec.quantization.int8"],
        ["onnxprec.quantization"],
        ["onnxprec.quantization", "--quantize_mode", "int4"],
        ["onnxprec.quantization", "--quantize_mode", "fp8"],
        ["onnxprec.quantization.fp8"],
        ["onnxprec.preprocess"],
        ["onnxprec.evaluate"],
        ["onnxprec.debug", "dump"],
        ["onnxprec.debug", "compare"],
    ],
)
def test_python_m_of_every_tool(argv: list[str]) -> None:
    """Each tool's ``__main__`` in a process of its own: help with an example, and a one-line error."""
    helptext = subprocess.run([sys.executable, "-m", *argv, "--help"], capture_output=True, text=True, timeout=60)
    assert helptext.returncode == 0 and "examples:" in helptext.stdout, helptext.stderr
    bad = subprocess.run([sys.executable, "-m", *argv, "--no_such_flag"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_use_standalone_type_inference_is_accepted(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.onnx"
    result = _cli("--onnx_path", str(model_path), "--output_path", str(out), "--use_standalone_type_inference")
    assert result.returncode == 0, result.stderr
    assert out.exists()


def test_a_tool_registers_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nested subcommand ("fake int4") from a ``_cli`` module: flags from its options, errors as one line."""
    (tmp_path / "fake_int4_cli.py").write_text(
        "from dataclasses import dataclass\n"
        "from onnxprec import _options\n"
        "from onnxprec._arg_groups import CommonArgs\n"
        "from onnxprec._options import ToolOptions, from_args, option\n"
        "from onnxprec.errors import InvalidArgumentError\n"
        "DESCRIPTION = 'Fake INT4.'\n"
        "EPILOG = 'example:\\n  {prog} --block_size 64'\n"
        "@dataclass\n"
        "class Int4Options(ToolOptions):\n"
        "    block_size: int = option(128, flags=('--block_size',), help='Weights per scale.')\n"
        "def add_arguments(parser):\n"
        "    _options.add_arguments(parser, Int4Options, CommonArgs)\n"
        "def run(args):\n"
        "    options = from_args(Int4Options, args)\n"
        "    if options.block_size % 2:\n"
        "        raise InvalidArgumentError('block_size must be even: use 32, 64 or 128.')\n"
        "    print('block', options.block_size)\n"
        "    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "TOOLS", (*cli.TOOLS, ("fake int4", "fake_int4_cli", "INT4 weights.")))
    assert cli.main(["fake", "int4", "--block_size", "64"]) == 0
    assert "block 64" in capsys.readouterr().out
    assert cli.main(["fake", "int4", "--block_size", "3"]) == 2
    assert capsys.readouterr().err.strip() == "error: block_size must be even: use 32, 64 or 128."
    with pytest.raises(SystemExit):
        cli.main(["fake", "int4", "--help"])
    assert "onnxprec fake int4 --block_size 64" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = " ".join(capsys.readouterr().out.split())  # as one line, whatever the terminal's width
    assert "fake" in top and "int4 (`onnxprec fake TOOL --help`)." in top  # a group's help names its tools
    assert "quantize INT4 weight-only (int4) or INT8 (int8) quantization" in top and " tools." not in top
    with pytest.raises(SystemExit):
        cli.main(["quantize", "--help"])
    assert "INT4 weight-only (int4) or INT8 (int8) quantization" in capsys.readouterr().out


def test_api_errors_keep_their_cause() -> None:
    from onnxprec.autocast import AutoCastOptions, convert_file

    with pytest.raises(InvalidArgumentError, match=r"Invalid regular expression '\('") as info:
        AutoCastOptions(nodes_to_exclude=["("])
    assert isinstance(info.value.__cause__, re.error)
    with pytest.raises(InvalidArgumentError, match="both options= and data_max="):
        convert_file("m.onnx", options=AutoCastOptions(), data_max=3.0)


@pytest.mark.slow
def test_on_a_terminal_the_summary_shows_once_and_a_log_keeps_it(model_path: Path, tmp_path: Path) -> None:
    """The summary printed on stdout is not logged again on the terminal (stdout and stderr both a terminal); when
    stderr is not a terminal (a log), the summary lines stay in it."""
    fp16, q8 = tmp_path / "model.fp16.onnx", str(tmp_path / "q8.onnx")
    commands = {  # the tool, and words of its summary log lines
        ("Converted 2/2 nodes", "Saved"): ["autocast", "--onnx_path", str(model_path), "--output_path", str(fp16)],
        ("layers quantized",): ["quantize", "int8", "--onnx_path", str(model_path), "--output_path", q8,
                                "--random_calibration_data"],  # tabular input: refused on random data without it
        ("Saved",): ["preprocess", "--input", str(model_path), "--output", str(tmp_path / "pre.onnx")],
        ("Dumped ",): ["dump", "--onnx_path", str(model_path), "--dump_float", "--output_dir", str(tmp_path / "d")],
        ("Compared ",): ["compare", str(model_path), str(fp16)],
        ("(reference): ",): ["evaluate", str(model_path), str(model_path)],
    }  # fmt: skip
    for summary, argv in commands.items():
        shown = run_cli(*argv, terminal=True)
        assert shown.returncode == 0, shown.stderr
        assert all(words not in shown.stderr for words in summary), (argv[0], shown.stderr)
        assert argv[0] == "evaluate" or summary[0] in shown.stdout.replace("saved", "Saved")
        shutil.rmtree(tmp_path / "d", ignore_errors=True)
        logged = run_cli(*argv)  # stderr is a log, not the terminal: it keeps them
        assert logged.returncode == 0 and all(words in logged.stderr for words in summary), (argv[0], logged.stderr)
