"""The real checks of an emulated choice: :func:`confirm`, on counts and callables only (what a count means is the
caller's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

__all__ = ["MAX_REAL_CHECKS", "Verdict", "confirm"]

MAX_REAL_CHECKS = 3
"""The real checks :func:`confirm` spends on an emulated choice."""


class Verdict(Protocol):
    """What a real check returns: at least whether the target holds (a :class:`Measurement` is one)."""

    @property
    def ok(self) -> bool: ...


V = TypeVar("V", bound=Verdict)


def confirm(
    choice: int,
    count: int,
    check: Callable[[int], V],
    *,
    strategy: Literal["gallop", "bisect"],
    known: V | None = None,
    max_checks: int = MAX_REAL_CHECKS,
) -> tuple[int, V]:
    """Checks an emulated choice for real and, when it misses, moves towards the safe side with real checks.

    ``count`` items are ranked, and ``k`` of them are moved to the safe side (kept in float, kept in FP32, left
    unconverted: the caller's meaning); ``check(k)`` measures that for real, and is assumed to hold more often as
    ``k`` grows, ``count`` being the safest. ``check(choice)`` comes first: if it holds, it is the answer (one real
    check when the emulation is right). After a miss, with ``strategy``:

    - ``"gallop"`` (the answer is expected near the choice, and every item moved costs: INT8 layers kept in float):
      ``k`` doubles (at least one more) until a check holds, then a bisection between the last miss and the hold,
      its midpoints rounded towards the miss.
    - ``"bisect"`` (the choice may be far off: AutoCast's nodes): a bisection between the last miss and the hold
      (``count`` until one is seen), its midpoints rounded towards the safe side; ``count`` itself is checked once
      the bisection reaches it.

    At most ``max_checks`` calls of ``check`` in all.

    Args:
        choice: The emulation's choice, in ``0..count``.
        count: The number of ranked items.
        check: A real check of ``k`` items moved.
        strategy: How to move after a miss, above.
        known: The verdict of ``count`` when it is already known to hold (e.g. the default measured before the
            search): ``count`` is then never checked, and is the answer when nothing fewer held.
        max_checks: The real checks allowed.

    Returns:
        ``k`` and its verdict: the fewest checked that held (or ``count`` with ``known``); if none held, the last
        one checked (the most moved) with its verdict.
    """
    if max_checks < 1 and known is None:
        raise ValueError("confirm needs at least one real check or a known verdict")
    k = min(max(choice, 0), count)
    good: tuple[int, V] | None = None
    last: tuple[int, V] | None = None
    bad: int | None = None  # the most moved that missed
    checks = 0
    while True:
        if k >= count and known is not None:
            good = (count, known)
        else:
            if checks >= max_checks:
                break
            verdict = check(k)
            checks += 1
            last = (k, verdict)
            if verdict.ok:
                good = last
            else:
                bad = k
        if good is not None and (bad is None or good[0] - bad <= 1):
            break  # the choice holds, or the fewest between a miss and a hold is found
        if good is None and k >= count:
            break  # even every item moved misses
        assert bad is not None
        if strategy == "gallop" and good is None:
            k = min(count, max(2 * k, k + 1))
        else:
            top = count if good is None else good[0]
            k = (bad + top) // 2 if strategy == "gallop" else (bad + top + 1) // 2
    result = good or ((count, known) if known is not None else last)
    assert result is not None
    return result
