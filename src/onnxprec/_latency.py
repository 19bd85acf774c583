"""Latency of several runnables timed in alternation: the one timer of evaluate, the benchmarks and the experiments.

Timing one model after another lets the machine's load drift between them; :func:`time_alternating` times them in
rounds instead, every runnable once per round (``runs`` calls in a row), the order rotating by one each round so
that none always runs first, after untimed warm-up calls. :class:`Latencies` keeps each round's time per call and
reads medians, percentiles and per-round ratios to a reference from it: a ratio taken within each round cancels the
load that the round's runnables shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Latencies", "time_alternating"]


@dataclass(frozen=True)
class Latencies:
    """Seconds per call of each timed runnable (in the order given), one value per round: the round's mean."""

    rounds: tuple[tuple[float, ...], ...]

    def median_ms(self, index: int) -> float:
        """The median over the rounds of runnable ``index``'s time per call, in milliseconds."""
        return float(np.median(self.rounds[index])) * 1000.0

    def stats_ms(self, index: int) -> dict[str, float]:
        """``median``, ``p90``, ``mean`` and ``min`` of runnable ``index``'s time per call over the rounds in
        milliseconds, and ``runs`` (the number of rounds)."""
        ms = np.asarray(self.rounds[index]) * 1000.0
        return {
            "median": float(np.median(ms)),
            "p90": float(np.percentile(ms, 90)),
            "mean": float(ms.mean()),
            "min": float(ms.min()),
            "runs": float(ms.size),
        }

    def ratios(self, reference: int = 0) -> list[float]:
        """Each runnable's median over the rounds of its time divided by ``reference``'s in the same round (1.0 for
        the reference itself)."""
        base = np.asarray(self.rounds[reference])
        return [float(np.median(np.asarray(times) / base)) for times in self.rounds]


def time_alternating(
    runnables: Sequence[Callable[[], object]], rounds: int, *, runs: int = 1, warmup: int = 2
) -> Latencies:
    """Times ``runnables`` in alternation: ``warmup`` untimed calls of each, then ``rounds`` rounds in which each
    runs ``runs`` times in a row (timed together, divided by ``runs``), the order rotating by one each round.

    An exception from a runnable propagates (nothing is caught).
    """
    for runnable in runnables:
        for _ in range(warmup):
            runnable()
    times: list[list[float]] = [[] for _ in runnables]
    count = len(runnables)
    for round_ in range(rounds):
        for index in [(round_ + i) % count for i in range(count)]:
            tick = time.perf_counter()
            for _ in range(runs):
                runnables[index]()
            times[index].append((time.perf_counter() - tick) / runs)
    return Latencies(tuple(tuple(t) for t in times))
