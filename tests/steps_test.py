"""Issue 28: each tool's pipeline steps are listed in one place (its ``STEPS``) and named in its report.

Each tool runs end to end on a tiny MLP (API, file to file); its report's ``seconds`` (preprocess: ``steps``) names
the steps that ran, in the order ``STEPS`` lists them, every step without a condition among them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest

from onnxprec._report import Step
from onnxprec.quantization._testing import mlp

Run = Callable[[Path, Path], tuple[Any, Sequence[Step[Any]]]]


def _autocast(source: Path, output: Path) -> tuple[Any, Sequence[Step[Any]]]:
    from onnxprec.autocast import convert_file
    from onnxprec.autocast.pipeline import STEPS

    return convert_file(source, output), STEPS


def _int4(source: Path, output: Path) -> tuple[Any, Sequence[Step[Any]]]:
    from onnxprec.quantization.int4 import quantize_file
    from onnxprec.quantization.int4._api import STEPS

    return quantize_file(source, output, calibration_method="awq_lite"), STEPS


def _int8(source: Path, output: Path) -> tuple[Any, Sequence[Step[Any]]]:
    from onnxprec.quantization.int8 import quantize_file
    from onnxprec.quantization.int8._api import STEPS

    return quantize_file(source, output, random_calibration_data=True), STEPS


@pytest.mark.parametrize(
    ("tool", "conditional"),
    [(_autocast, "validate"), (_int4, "calibration"), (_int8, "target search")],
    ids=["autocast", "int4", "int8"],
)
def test_the_report_names_the_steps_that_ran_in_their_order(tool: Run, conditional: str, tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(mlp(), source)
    report, steps = tool(source, tmp_path / "out.onnx")
    names = [step.name for step in steps]
    ran = [name for name in report.to_json()["seconds"] if name in names]
    assert ran == sorted(ran, key=names.index)
    assert {step.name for step in steps if step.when is None} <= set(ran)
    assert conditional in ran  # a step whose condition holds here (validate by default, awq_lite, INT8's guard)


def test_preprocess_names_every_listed_step(tmp_path: Path) -> None:
    from onnxprec.preprocess import PreprocessOptions, preprocess_file
    from onnxprec.preprocess._api import STEPS

    source = tmp_path / "m.onnx"
    onnx.save(mlp(), source)
    report = preprocess_file(source, tmp_path / "p.onnx", PreprocessOptions(skip_optimization=True))
    steps = report.to_json()["steps"]
    assert [step["name"] for step in steps] == [name for name, _, _ in STEPS]
    assert [step["name"] for step in steps if step["skipped"] == "skip_optimization"] == [
        "ONNX Runtime optimization (basic)"
    ]
