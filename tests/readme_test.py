"""README.md as a newcomer uses it: every command block runs, in order, on the bundled example.

The blocks run in a fresh folder that holds what a clone has (``examples/``, ``README.md``); a block that names a
real model gets a tiny stand-in: ``smollm2/`` is a one-layer onnxruntime-genai folder (``make_genai_folder``),
whose 64-token context takes windows of 32 tokens instead of 256. The set-up blocks make a venv: the first one's
conversion runs here, the second one is CI's own command (checked against ``.ci/run``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import make_genai_folder

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
VENV_PREFIX = "python3 -m venv .venv && "


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(README.read_text())]


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for heading in ("Set up", "Calibration data", "FP16 or BF16", "INT4", "INT8", "Check a result", "Find the layer"):
        assert re.search(rf"^## {heading}", text, re.MULTILINE), heading


def test_set_up_commands_are_the_ones_ci_runs() -> None:
    setup = [code.strip() for lang, code in blocks() if lang == "bash" and code.startswith(VENV_PREFIX)]
    assert len(setup) == 2
    assert setup[1] in (ROOT / ".ci" / "run").read_text()


def _command(code: str) -> str:
    """A bash block as it runs here: this interpreter for ``python`` and the ``onnxprec`` console script."""
    if code.startswith(VENV_PREFIX):  # the first set-up block: its conversion, in this venv
        code = code.rsplit(" && ", 1)[1].replace(".venv/bin/python", "python")
    code = re.sub(r"(^|&& )onnxprec ", rf"\1{sys.executable} -m onnxprec ", code)
    return re.sub(r"(^|&& )python ", rf"\1{sys.executable} ", code)


@pytest.mark.slow
def test_every_command_block_runs(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "README.md").write_text(README.read_text())
    make_genai_folder(tmp_path / "smollm2")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    ran = 0
    for lang, code in blocks():
        if lang == "bash" and "pytest" in code:
            continue  # CI's own command (test_set_up_commands_are_the_ones_ci_runs)
        if lang == "python":
            args = [sys.executable, "-c", code.replace("seq_len=256", "seq_len=32")]
        else:
            args = ["bash", "-euo", "pipefail", "-c", _command(code.strip())]
        result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{code}\n{result.stderr[-3000:]}"
        ran += 1
    assert ran == 8
    calib = np.load(tmp_path / "calib.npz")
    assert list(calib) == ["image"] and calib["image"].shape == (10, 1, 8, 8)
    for name in ("digits_cnn.fp16.onnx", "digits.fp16.onnx", "digits.quant.onnx", "smollm2-int4/model.onnx"):
        onnx.checker.check_model(onnx.load(tmp_path / name))
    int4 = onnx.load(tmp_path / "smollm2-int4" / "model.onnx")
    assert any(node.op_type == "MatMulNBits" for node in int4.graph.node)
    assert (tmp_path / "smollm2-int4" / "genai_config.json").exists()
    assert "<html" in (tmp_path / "compare.html").read_text()[:500].lower()
