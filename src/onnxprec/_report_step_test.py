"""TimedSteps: ``with report.step(name):`` stores the block's wall time under its name, nothing when it raises;
``run_steps`` runs a pipeline's steps so; ``timed`` and ``Timer``, the one stopwatch."""

from __future__ import annotations

import dataclasses

import pytest

from onnxprec._report import Step, TimedSteps, Timer, timed
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


def test_run_steps_runs_each_step_in_order_under_its_name_and_skips_those_whose_when_is_false() -> None:
    report, ran = _Report(), []
    steps = [
        Step("load", lambda state: ran.append(("load", state))),
        Step("target", lambda state: ran.append(("target", state)), when=lambda state: state == "no"),
        Step("convert", lambda state: ran.append(("convert", state))),
    ]
    report.run_steps(steps, "yes")
    assert ran == [("load", "yes"), ("convert", "yes")] and list(report.seconds) == ["load", "convert"]


def test_timed_stops_its_timer_when_the_block_ends_even_when_it_raises() -> None:
    with pytest.raises(ValueError), timed() as timer:
        raise ValueError("bad")
    assert timer.end is not None and timer.seconds == timer.seconds >= 0.0  # stopped: the reading no longer moves
    running = Timer()
    assert running.end is None and running.stop() == running.seconds
