"""time_alternating: warm-up, rounds, the rotating order; Latencies: statistics and per-round ratios."""

from __future__ import annotations

import pytest

from onnxprec._latency import Latencies, time_alternating


def test_each_runnable_warms_up_then_runs_in_rounds_whose_order_rotates() -> None:
    calls: list[str] = []
    runnables = [lambda name=name: calls.append(name) for name in "abc"]
    latencies = time_alternating(runnables, 3, runs=2, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    assert calls[3:] == [*"aabbcc", *"bbccaa", *"ccaabb"]
    assert [len(times) for times in latencies.rounds] == [3, 3, 3]
    assert all(t >= 0 for times in latencies.rounds for t in times)


def test_an_exception_propagates() -> None:
    def fails() -> None:
        raise RuntimeError("no kernel")

    with pytest.raises(RuntimeError, match="no kernel"):
        time_alternating([fails], 1)


def test_ratios_are_medians_of_each_rounds_ratio_and_stats_are_in_milliseconds() -> None:
    # the machine slows down in round 2 for everyone: per-round ratios stay 0.5, a ratio of medians would not
    latencies = Latencies(((1.0, 4.0, 1.0), (0.5, 2.0, 0.6), (2.0, 8.0, 3.0)))
    assert latencies.ratios() == [1.0, pytest.approx(0.5), pytest.approx(2.0)]
    assert latencies.ratios(reference=1)[0] == pytest.approx(2.0)
    assert latencies.median_ms(1) == pytest.approx(600.0)
    stats = latencies.stats_ms(0)
    assert stats == {"median": 1000.0, "p90": pytest.approx(3400.0), "mean": 2000.0, "min": 1000.0, "runs": 3.0}
