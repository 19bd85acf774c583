"""TimedSteps: ``with report.step(name):`` stores the block's wall time under its name, nothing when it raises."""

from __future__ import annotations

import dataclasses

import pytest

from onnxprec._report import TimedSteps
from onnxprec.autocast.report import AutoCastReport
from onnxprec.quantization._tool import QuantizationReportBase


@dataclasses.dataclass
class _Report(TimedSteps):
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def test_a_step_stores_its_time_under_its_name_and_a_failed_step_stores_nothing() -> None:
    report = _Report()
    with report.step("classify"):
        pass
    with pytest.raises(ValueError), report.step("convert"):
        raise ValueError("bad")
    assert list(report.seconds) == ["classify"] and report.seconds["classify"] >= 0.0


def test_the_tools_reports_time_their_steps_this_way() -> None:
    assert issubclass(AutoCastReport, TimedSteps) and issubclass(QuantizationReportBase, TimedSteps)
