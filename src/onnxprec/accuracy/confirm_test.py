"""The real checks of an emulated choice (:func:`confirm`) on synthetic checks whose answer is known: one real check
when the emulation is right, galloping or bisection when it misses, never more than the cap, a known safe side."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxprec.accuracy import MAX_REAL_CHECKS, confirm

Strategy = Literal["gallop", "bisect"]


@dataclass(frozen=True)
class Verdict:
    k: int
    ok: bool


class Threshold:
    """A real check that holds from ``threshold`` items moved on, recording every count it was asked."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.calls: list[int] = []

    def __call__(self, k: int) -> Verdict:
        self.calls.append(k)
        return Verdict(k, k >= self.threshold)


@pytest.mark.parametrize("strategy", ["gallop", "bisect"])
def test_an_emulated_choice_that_holds_costs_one_real_check(strategy: Strategy) -> None:
    check = Threshold(3)
    assert confirm(5, 20, check, strategy=strategy) == (5, Verdict(5, True))
    assert check.calls == [5]  # fewer might hold, but the emulation's choice is trusted when it holds


def test_gallop_doubles_after_a_miss_then_bisects_towards_the_miss() -> None:
    check = Threshold(7)
    k, verdict = confirm(2, 40, check, strategy="gallop", max_checks=10)
    assert (k, verdict.ok) == (7, True)
    assert check.calls == [2, 4, 8, 6, 7]  # doubling until a hold, then between the last miss and the hold


def test_bisect_halves_the_way_to_the_safe_side_then_towards_it() -> None:
    check = Threshold(7)
    k, verdict = confirm(2, 40, check, strategy="bisect", max_checks=10)
    assert (k, verdict.ok) == (7, True)
    assert check.calls == [2, 21, 12, 7, 5, 6]  # midpoints rounded up


@pytest.mark.parametrize(
    ("strategy", "calls", "missing"), [("gallop", [2, 4, 8], [2, 4, 8]), ("bisect", [2, 21, 12], [2, 21, 31])]
)
def test_the_real_checks_are_capped(strategy: Strategy, calls: list[int], missing: list[int]) -> None:
    check = Threshold(7)
    k, verdict = confirm(2, 40, check, strategy=strategy)
    assert check.calls == calls and len(calls) == MAX_REAL_CHECKS == 3
    assert (k, verdict.ok) == (calls[-1], True)  # the best found within the cap
    check = Threshold(41)
    k, verdict = confirm(2, 40, check, strategy=strategy)
    assert check.calls == missing and (k, verdict.ok) == (missing[-1], False)  # none held: the last, and it says so


@pytest.mark.parametrize(("strategy", "calls"), [("gallop", [30, 40, 35, 37, 38]), ("bisect", [30, 35, 38, 39, 40])])
def test_every_item_moved_is_the_last_resort(strategy: Strategy, calls: list[int]) -> None:
    check = Threshold(40)
    assert confirm(30, 40, check, strategy=strategy, max_checks=5) == (40, Verdict(40, True))
    assert check.calls == calls
    check = Threshold(41)  # not even all of them
    assert confirm(30, 40, check, strategy=strategy, max_checks=5) == (40, Verdict(40, False))


def test_a_known_safe_side_is_never_checked_and_is_the_fallback() -> None:
    """Upward (AutoCast converting more than its default): the default is measured before the search, so moving
    every ranked item back to it is known to hold."""
    default = Verdict(-1, True)
    check = Threshold(100)
    assert confirm(20, 50, check, strategy="bisect", known=default) == (50, default)
    assert check.calls == [20, 35, 43]  # every one misses: the known default
    check = Threshold(30)
    assert confirm(50, 50, check, strategy="bisect", known=default) == (50, default) and check.calls == []
    k, verdict = confirm(20, 50, check, strategy="bisect", known=default, max_checks=10)
    assert (k, verdict.ok) == (30, True)
    assert check.calls == [20, 35, 28, 32, 30, 29]  # the bisection between the last miss and the hold
    check = Threshold(49)
    assert confirm(48, 50, check, strategy="bisect", known=default) == (49, Verdict(49, True))
    assert check.calls == [48, 49]
    check = Threshold(50)
    assert confirm(48, 50, check, strategy="bisect", known=default) == (50, default)
    assert check.calls == [48, 49]  # 50 is known


@given(
    count=st.integers(0, 300),
    threshold=st.integers(0, 320),
    choice=st.integers(0, 300),
    max_checks=st.integers(1, 12),
    known=st.booleans(),
    strategy=st.sampled_from(["gallop", "bisect"]),
)
def test_confirm_never_claims_a_hold_it_did_not_see(
    count: int, threshold: int, choice: int, max_checks: int, known: bool, strategy: Strategy
) -> None:
    choice = min(choice, count)
    check = Threshold(min(threshold, count) if known else threshold)  # known: the safe end holds
    safe = Verdict(count, True) if known else None
    k, verdict = confirm(choice, count, check, strategy=strategy, known=safe, max_checks=max_checks)
    assert len(check.calls) <= max_checks and 0 <= k <= count
    assert (safe is not None and k == count) or check.calls.count(count) <= 1
    assert verdict.ok == (k >= check.threshold)
    assert verdict is safe or k in check.calls
    if verdict.ok and max_checks >= 2 * math.ceil(math.log2(count + 2)) + 2:
        assert k == max(choice, check.threshold)  # with checks to spare, the fewest that hold above the choice
