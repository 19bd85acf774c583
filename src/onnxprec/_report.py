"""One report layer: what every tool's report is, and how the command line checks and writes it.

Every tool's report (AutoCast, INT4, preprocess, evaluate, dump, compare) implements :class:`Report`: the tool's
name, a one-line ``summary`` and ``to_json()``, whose first keys come from :func:`header` (``tool``,
``onnxprec_version``, ``summary``). The command line checks every path it will write before the work
(:func:`check_paths`, through the one output-path check :func:`onnxprec._io.check_output_path`) and writes the JSON
with :func:`write_json` (``--report_json``, one flag per tool).

A tool logs its summary (and the path it saved) at INFO with ``extra=SUMMARY``; the command line prints the summary
on stdout, so when stdout and stderr are one terminal its log leaves those lines out (:class:`PrintedSummaryFilter`)
and the user reads the summary once. A ``--log_file`` keeps them.

Nothing heavy is imported at module level: the tools' ``_cli`` modules import this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

__all__ = [
    "SUMMARY",
    "SYNTHETIC_CHECK",
    "PrintedSummaryFilter",
    "Report",
    "Step",
    "TimedSteps",
    "Timer",
    "add_seconds",
    "check_paths",
    "fields_of",
    "header",
    "json_number",
    "timed",
    "write_json",
]

logger = logging.getLogger("onnxprec")

SUMMARY: Mapping[str, Any] = {"onnxprec_summary": True}
"""``extra=`` of a log line the command line also prints on stdout: a tool's summary, the path it saved."""


SYNTHETIC_CHECK = "synthetic inputs: the distance from FP32 on them; it cannot judge the task on real data"
"""What a summary adds to a check that ran on random data (no calibration data given)."""


class PrintedSummaryFilter(logging.Filter):
    """Drops the log lines logged with ``extra=SUMMARY`` (for a handler that writes to the terminal stdout is on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "onnxprec_summary", False)


@runtime_checkable
class Report(Protocol):
    """A tool's report: ``TOOL`` (its command, e.g. ``"quantize int4"``), a summary line and its JSON."""

    TOOL: ClassVar[str]

    @property
    def summary(self) -> str:
        """One line: what the run did (what the command line prints)."""
        ...

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data, starting with :func:`header` (what ``--report_json`` writes)."""
        ...


S = TypeVar("S")


class Timer:
    """A stopwatch, started when made: ``seconds`` is the wall time since, until :meth:`stop` (the one timer of the
    tools' logs and reports: no hand-written timing pairs)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.end: float | None = None

    @property
    def seconds(self) -> float:
        """Seconds from the start to the stop, or to now while it runs."""
        return (time.perf_counter() if self.end is None else self.end) - self.start

    def stop(self) -> float:
        """Stops the watch (once) and returns its seconds."""
        if self.end is None:
            self.end = time.perf_counter()
        return self.seconds


@contextlib.contextmanager
def timed() -> Iterator[Timer]:
    """Times the block: the :class:`Timer` it gives holds the block's wall time once the block ends (also when it
    raises)."""
    timer = Timer()
    try:
        yield timer
    finally:
        timer.stop()


def add_seconds(seconds: dict[str, float], name: str, spent: float) -> None:
    """Adds ``spent`` to ``seconds[name]`` (from 0): the one accumulation of a part of a run timed in several places
    (each layer's output errors, each pass's statistics, each group's decision)."""
    seconds[name] = seconds.get(name, 0.0) + spent


@dataclasses.dataclass(frozen=True)
class Step(Generic[S]):
    """A named step of a tool's pipeline: ``run(state)``, skipped when ``when(state)`` is false.

    A pipeline is a tuple of steps over one state object (the model, what the steps found so far), run in order by
    :meth:`TimedSteps.run_steps`, which times each under its name.
    """

    name: str
    run: Callable[[S], object]
    when: Callable[[S], bool] | None = None


class TimedSteps:
    """A report whose ``seconds`` holds the wall time of each named step of its tool's pipeline, measured by
    ``with report.step("classify"):`` or :meth:`run_steps` (no hand-written timing pairs)."""

    seconds: dict[str, float]

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Times the block and stores its wall time in ``seconds[name]`` (nothing when the block raises)."""
        with timed() as timer:
            yield
        self.seconds[name] = timer.seconds

    def run_steps(self, steps: Iterable[Step[S]], state: S) -> None:
        """Runs a pipeline's steps in order on ``state``, each timed as :meth:`step` under its name."""
        for step in steps:
            if step.when is None or step.when(state):
                with self.step(step.name):
                    step.run(state)


def header(report: Report) -> dict[str, Any]:
    """The keys every report's JSON starts with: ``tool``, ``onnxprec_version`` and ``summary``."""
    from onnxprec import __version__

    return {"tool": report.TOOL, "onnxprec_version": __version__, "summary": report.summary}


def fields_of(item: object, *names: str) -> dict[str, Any]:
    """``{name: item.name}`` for each of ``names``, in that order: the keys of a ``to_json`` that copy an attribute
    as it is (the others, renamed or converted, follow by hand)."""
    return {name: getattr(item, name) for name in names}


def json_number(value: Any) -> Any:
    """A value as strict JSON wants it: numpy scalars as Python numbers, floats rounded to 6 decimals, NaN and inf as
    None (dicts converted item by item; anything else unchanged)."""
    import math

    import numpy as np

    if isinstance(value, dict):
        return {key: json_number(item) for key, item in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return round(number, 6) if math.isfinite(number) else None
    return value


def check_paths(paths: Mapping[str, str | os.PathLike | None], protected: Iterable[str | os.PathLike]) -> None:
    """Fails before the work when a report cannot be written or would overwrite an input.

    Args:
        paths: ``{flag: path}`` of the files the command will write (None: not asked for).
        protected: The inputs (models, data, labels) and outputs that a report must not overwrite.

    Raises:
        InvalidArgumentError: A path would overwrite a protected file, or its folder is missing or not writable.
    """
    from onnxprec._io import check_output_path

    kept = list(protected)
    for flag, path in paths.items():
        if path is not None:
            check_output_path(path, kept, flag=flag, data_file=False)


def write_json(path: str | os.PathLike | None, data: Mapping[str, Any]) -> None:
    """Writes a report as JSON (atomically, strict JSON: no NaN) when a path was given."""
    if path is None:
        return
    import json

    from onnxprec._io import write_atomically

    write_atomically(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    logger.info("Report written to %s", path)
