"""Progress of long loops: a bar on a terminal, otherwise an INFO log line at least every :data:`INTERVAL_S` seconds.

On a terminal (stderr is one) :class:`Progress` draws a tqdm bar that says what it counts (``Reference run: 3/8
batches``). When stderr is not a terminal (a log file, CI, a pipe) a bar would stay silent, so a thread logs the
count instead, every :data:`INTERVAL_S` seconds while the loop runs: a log never goes quiet for longer during a
search, even while one step runs long. A loop that ends sooner logs nothing. Of nested loops (a search and the
layers of one of its steps) only the innermost one running logs.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["INTERVAL_S", "Progress", "progress"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

INTERVAL_S = 10.0
"""Seconds between two progress lines in a log that is not a terminal."""

_ACTIVE: list[Progress] = []  # the open ones, outermost first: only the last logs


class Progress:
    """Counts the steps of a loop: ``with Progress("INT8 sensitivity", "layer", total=12) as shown: shown.update()``.

    Args:
        desc: What runs, e.g. ``"Reference run"``.
        unit: What one step is, singular (``"batch"``): the count is shown as ``3/8 batches``.
        total: The number of steps, when known.
        leave: Keep the finished bar on the terminal.
        count: Where the count comes from when the loop does not call :meth:`update` (e.g. the length of a list of
            steps a search appends to).
    """

    def __init__(
        self,
        desc: str,
        unit: str,
        total: int | None = None,
        *,
        leave: bool = False,
        count: Callable[[], int] | None = None,
    ) -> None:
        self.desc = desc
        self.count = count
        self.unit = unit
        self.total = total
        self.leave = leave
        self.n = 0
        self._bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()

    def __enter__(self) -> Progress:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Progress:
        """Starts the bar (or the log thread); ``with Progress(...)`` calls it."""
        self._start = time.monotonic()
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit=f" {self.unit}", leave=self.leave)
        elif logger.isEnabledFor(logging.INFO):
            _ACTIVE.append(self)
            self._thread = threading.Thread(target=self._log_every_interval, name="onnxprec-progress", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stops the bar or the log thread (again: nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            _ACTIVE.remove(self)
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def set_total(self, total: int) -> None:
        """The number of steps, once known (e.g. after a first pass over the data)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, n: int = 1) -> None:
        """``n`` more steps done."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)

    def line(self) -> str:
        """The count as a log line says it: ``Reference run: 3/8 batches, 21 s``."""
        n = self.count() if self.count is not None else self.n
        done = f"{n}/{self.total}" if self.total is not None else str(n)
        plural = self.unit if (self.total if self.total is not None else n) == 1 else _plural(self.unit)
        return f"{self.desc}: {done} {plural}, {time.monotonic() - self._start:.0f} s"

    def _log_every_interval(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            if _ACTIVE and _ACTIVE[-1] is self:
                logger.info("%s", self.line())


def progress(items: Iterable[T], desc: str, unit: str, total: int | None = None, *, leave: bool = False) -> Iterator[T]:
    """Yields ``items``, counting them with a :class:`Progress` (``total``: ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, unit, total, leave=leave) as shown:
        for item in items:
            yield item
            shown.update()


def _plural(unit: str) -> str:
    return unit + "es" if unit.endswith(("s", "ch", "sh", "x")) else unit + "s"
