"""Progress: a bar that says what it counts on a terminal; otherwise log lines while a long step runs."""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import helper

from onnxprec import _progress
from onnxprec._io import load_model
from onnxprec._progress import Progress
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.calibration_data import CalibrationData
from onnxprec.reference import run_reference
from onnxprec.sensitivity import isolated_gains


class _Lines(logging.Handler):
    """Collects the progress lines and says when one arrived."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.arrived = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.arrived.set()


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Lines]:
    monkeypatch.setattr(_progress, "INTERVAL_S", 0.01)
    handler = _Lines()
    log = logging.getLogger(_progress.__name__)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_a_log_hears_from_a_long_step_while_it_runs(lines: _Lines) -> None:
    """Not on a terminal (pytest captures stderr): a step that runs long still gets a line, with the count."""
    seen: list[bool] = []

    def badness(item: str) -> float:
        seen.append(lines.arrived.wait(timeout=30))  # the step ends once a progress line was logged
        lines.arrived.clear()
        return 0.5

    gains = isolated_gains(["a", "b"], badness, 1.0, squared=True, progress="INT8 sensitivity")
    assert gains == {"a": 0.75, "b": 0.75} and seen == [True, True]
    assert lines.lines[0].startswith("INT8 sensitivity: 0/2 layers, ")
    assert any(line.startswith("INT8 sensitivity: 1/2 layers, ") for line in lines.lines)


def _heard(lines: _Lines, times: int) -> str:
    """The last of ``times`` more progress lines."""
    for _ in range(times):
        lines.arrived.clear()
        assert lines.arrived.wait(timeout=30)
    return lines.lines[-1]


def test_only_the_innermost_running_loop_logs(lines: _Lines) -> None:
    with Progress("search", "check", count=lambda: 7):
        with Progress("layers", "layer", total=3) as inner:
            inner.update()
            assert _heard(lines, 3).startswith("layers: 1/3 layers, ")
        assert _heard(lines, 2).startswith("search: 7 checks, ")  # the inner loop ended: the search speaks again
    count = len(lines.lines)
    assert not lines.arrived.wait(timeout=0.1) or len(lines.lines) == count  # closed: silent


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_reference_run_bar_counts_batches_of_a_known_total() -> None:
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    model = load_model(make_model([relu], [tensor_info("x", F, [2, 4])], [tensor_info("y", F, [2, 4])]))
    data = CalibrationData([{"x": np.ones((2, 4), np.float32)} for _ in range(3)])
    terminal = _Terminal()
    with contextlib.redirect_stderr(terminal):
        run_reference(model, data, select=())  # the total is known after the first pass over the data
        run_reference(model, data, select=())  # and from the start of the next
    shown = terminal.getvalue()
    assert "0run" not in shown and "?run/s" not in shown
    assert "Reference run: 100%" in shown and "3/3" in shown and " batch/s" in shown
    assert "Reference run:   0%" in shown  # the second run knew its total before its first batch
