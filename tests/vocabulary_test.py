"""One flag vocabulary: every tool's parser walked against ``_arg_groups.VOCABULARY``; anchors' command lines run."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec import cli
from onnxprec._arg_groups import DEPRECATED, VOCABULARY
from onnxprec.quantization._testing import mlp

ROOT = Path(__file__).resolve().parents[1]


def _parser(words: str) -> argparse.ArgumentParser:
    module, help_text = cli._tool(words)
    parser = cli._parser(f"onnxprec {words}", help_text)
    cli._setup(parser, module, parser.prog)
    return parser


def _flags(words: str) -> dict[str, list[str]]:
    """Each argparse dest of the tool with its spellings (hidden deprecated aliases included)."""
    found: dict[str, list[str]] = {}
    for action in _parser(words)._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            found.setdefault(action.dest, []).extend(action.option_strings)
    return found


TOOLS = [words for words, _, _ in cli.TOOLS]


@pytest.mark.parametrize("words", TOOLS)
def test_every_concept_has_one_spelling(words: str) -> None:
    """A tool that has a setting takes its spellings; any other spelling is an anchor's alias or deprecated."""
    for dest, spellings in _flags(words).items():
        for concept in VOCABULARY:
            if dest in concept.fields:
                missing = set(concept.spellings) - set(spellings)
                assert not missing, f"{words}: {concept.name} ({dest}) lacks {sorted(missing)}"
                stray = set(spellings) - set(concept.spellings) - set(concept.aliases)
                assert not stray, f"{words}: {concept.name} ({dest}) is also spelled {sorted(stray)}"


def test_a_spelling_means_one_thing_in_every_tool() -> None:
    meaning: dict[str, str] = {}
    concept_of = {field: concept.name for concept in VOCABULARY for field in concept.fields}
    for words in TOOLS:
        for dest, spellings in _flags(words).items():
            for spelling in spellings:
                what = concept_of.get(dest, dest.removeprefix("modelopt_"))  # a ModelOpt flag noted, not honoured
                assert meaning.setdefault(spelling, what) == what, f"{spelling} means {meaning[spelling]} and {what}"
    taken = {s for concept in VOCABULARY for s in (*concept.spellings, *concept.aliases)}
    assert len(taken) == sum(len(c.spellings) + len(c.aliases) for c in VOCABULARY), "a spelling in two concepts"
    assert set(DEPRECATED) <= taken


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env_path = str(ROOT / "src")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.slow
def test_anchor_command_lines_run_unchanged(tmp_path: Path) -> None:
    """The issue's ModelOpt 0.47 and ONNX Runtime command lines, word for word, on a tiny MLP with an .npy."""
    onnx.save(mlp(), tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((4, 16, 64)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x)
    lines = [
        "-m onnxprec.autocast --onnx_path m.onnx --low_precision_type fp16 --keep_io_types",
        "-m onnxprec.quantization --onnx_path m.onnx --quantize_mode int8 --calibration_data calib.npy "
        "--calibration_method max --output_path m.quant.onnx",
        "-m onnxprec.quantization --onnx_path m.onnx --quantize_mode int4 --calibration_data calib.npy "
        "--calibration_method awq_lite --output_path m.int4.quant.onnx",
        "-m onnxprec preprocess --input m.onnx --output m.pre.onnx",
        "-m onnxprec.quantization --onnx_path m.onnx --quantize_mode int8 --calibration_data_path calib.npy "
        "--calibration_eps cpu --use_external_data_format --simplify --dq_only --keep_intermediate_files "
        "--disable_mha_qdq --output_path m.q2.onnx --log_file q.log",
    ]
    for line in lines:
        result = _run(*line.split(), cwd=tmp_path)
        assert result.returncode == 0, f"{line}\n{result.stderr[-2000:]}"
        assert "usage:" not in result.stderr
    for name in ("m.fp16.onnx", "m.quant.onnx", "m.int4.quant.onnx", "m.pre.onnx", "m.q2.onnx"):
        onnx.checker.check_model(str(tmp_path / name))
    assert (tmp_path / "m.q2.onnx.data").exists()
    log = (tmp_path / "q.log").read_text()
    assert "--simplify: No effect" in log and "--dq_only: No effect" in log and "saved" not in log.split("\n")[0]


@pytest.mark.slow
def test_deprecated_spellings_warn_in_one_line(tmp_path: Path) -> None:
    onnx.save(mlp(), tmp_path / "m.onnx")
    result = _run("-m", "onnxprec", "compare", "m.onnx", "m.onnx", "--json", "r.json", "--html", "r.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert warnings == [
        "[onnxprec] WARNING: --json is deprecated and will be removed: use --report_json",
        "[onnxprec] WARNING: --html is deprecated and will be removed: use --report_html",
    ]
    assert (tmp_path / "r.json").exists() and (tmp_path / "r.html").exists()
