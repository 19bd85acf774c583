"""Accuracy targets, written once for every tool: what the outputs must keep, how it is measured, and the real checks
that confirm an emulated choice.

- **The target** (:class:`AccuracyTarget`): bounds on every float output (``rel_l2<=1e-3``, ``cosine>=0.9999``,
  ``top1>=0.999``, ``max_abs<=1e-2``, several joined by commas) and/or a callback on reference and candidate outputs.
  AutoCast's and INT8's ``--target_accuracy`` parse it.
- **Measurement** (:func:`measure_outputs`): a candidate run on every calibration batch against the float outputs
  kept from the reference run (:class:`ReferenceOutputs`), each float output's errors and whether the target holds
  (:class:`Measurement`).
- **Emulated verdicts** (:class:`ErrorScale`): an emulation session's errors scaled to the real error of one
  configuration measured both ways, each metric by its distance from perfect (:func:`badness`).
- **The real checks** (:func:`confirm`): an emulated choice checked for real, then galloping or bisection towards
  the safe side, at most :data:`MAX_REAL_CHECKS` real checks. It works on counts and callables only: what a count
  means (layers in float, nodes kept FP32) is the tool's.

Importing this module is cheap (numpy only): the options parse targets with it.
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np

from onnxprec.errors import InvalidArgumentError
from onnxprec.metrics import ErrorStats

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec.calibration_data import CalibrationData

__all__ = [
    "MAX_REAL_CHECKS",
    "METRICS",
    "AccuracyTarget",
    "Bound",
    "Callback",
    "ErrorScale",
    "Measurement",
    "ReferenceOutputs",
    "Verdict",
    "badness",
    "confirm",
    "measure_outputs",
]

METRICS = ("rel_l2", "cosine", "top1", "max_abs")
"""The metrics a bound names; ``cosine`` and ``top1`` are better higher, the others lower."""
MAX_REAL_CHECKS = 3
"""The real checks :func:`confirm` spends on an emulated choice."""

_HIGHER_IS_BETTER = ("cosine", "top1")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_BOUND = re.compile(r"^\s*(rel_l2|cosine|top1|max_abs)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*$")
Callback = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], Any]

# --------------------------------------------------------------------------------------------------
# The target


@dataclass(frozen=True)
class Bound:
    """One condition on every float output: ``metric op value`` (e.g. ``rel_l2 <= 1e-3``)."""

    metric: str
    op: str
    value: float

    def holds(self, measured: float | None) -> bool:
        return measured is not None and not math.isnan(measured) and _OPS[self.op](measured, self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True)
class AccuracyTarget:
    """What the outputs must keep: bounds on every float output, and/or a callback.

    The callback gets ``(reference, candidate)``, two dicts of output name -> array for one calibration batch,
    and returns whether the candidate is good enough (True/False, or a number: nonzero is good); the target
    holds when it holds on every batch.
    """

    bounds: tuple[Bound, ...] = ()
    callback: Callback | None = None

    @classmethod
    def parse(cls, spec: str | Callback | AccuracyTarget) -> AccuracyTarget:
        """From ``"rel_l2<=1e-3,top1>=0.99"``, a callable, or a target.

        Raises:
            InvalidArgumentError: A malformed bound, with the accepted forms.
        """
        if isinstance(spec, AccuracyTarget):
            return spec
        if callable(spec):
            return cls(callback=spec)
        bounds = []
        for part in str(spec).split(","):
            m = _BOUND.match(part)
            value = None
            if m:
                with contextlib.suppress(ValueError):
                    value = float(m.group(3))
            if m is None or value is None or math.isnan(value):
                raise InvalidArgumentError(
                    f"Invalid --target_accuracy '{part.strip()}': write METRIC<=VALUE or METRIC>=VALUE with METRIC "
                    "one of rel_l2, cosine, top1, max_abs (e.g. rel_l2<=1e-3 or cosine>=0.9999,top1>=0.99)."
                )
            bounds.append(Bound(m.group(1), m.group(2), value))
        return cls(tuple(bounds))

    @property
    def needs_top1(self) -> bool:
        return any(b.metric == "top1" for b in self.bounds)

    def __str__(self) -> str:
        parts = [str(b) for b in self.bounds]
        if self.callback is not None:
            parts.append(f"callback {getattr(self.callback, '__name__', 'target')}")
        return ",".join(parts)


def badness(metric: str, value: float | None) -> float | None:
    """A metric's distance from perfect (``1 - value`` for cosine and top1, the value for the others); None for a
    missing or NaN value."""
    if value is None or math.isnan(value):
        return None
    return 1 - value if metric in _HIGHER_IS_BETTER else value


# --------------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Measurement:
    """The outputs of one configuration against the float model on every calibration batch.

    Attributes:
        errors: Output name -> max_abs, rel_l2, cosine, nonfinite (and top1).
        ok: Whether the target holds.
        seconds: Time of the run(s).
        callback_ok: Whether the target's callback held on every batch (True without one).
    """

    errors: dict[str, dict[str, float]]
    ok: bool
    seconds: float = 0.0
    callback_ok: bool = True

    def worst(self, metric: str) -> float | None:
        """The worst value of ``metric`` over the outputs (the lowest cosine or top1, the highest of the others)."""
        values = [e[metric] for e in self.errors.values() if e.get(metric) is not None]
        if not values:
            return None
        return min(values) if metric in _HIGHER_IS_BETTER else max(values)

    def badness(self, metric: str) -> float | None:
        """The worst output's distance from perfect in ``metric`` (:func:`badness`)."""
        return badness(metric, self.worst(metric))

    def summary(self) -> str:
        return ", ".join(f"{m} {self.worst(m):.4g}" for m in METRICS if self.worst(m) is not None)


def measure_outputs(
    target: AccuracyTarget,
    kept: ReferenceOutputs,
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
) -> Measurement:
    """Runs every batch and compares the float outputs with the kept float ones."""
    tick = time.perf_counter()
    stats: dict[str, ErrorStats] = {}
    callback_ok = True
    for batch, reference in zip(kept.batches, kept.outputs):
        outputs = run(batch)
        for name, expected in reference.items():
            if not np.issubdtype(expected.dtype, np.floating):
                continue
            stats.setdefault(name, ErrorStats(track_top1=target.needs_top1)).update(
                expected, np.asarray(outputs[name], dtype=np.float32)
            )
        if target.callback is not None and callback_ok:
            callback_ok = bool(target.callback(reference, {k: np.asarray(v) for k, v in outputs.items()}))
        del outputs
    errors = {name: s.as_dict() for name, s in stats.items()}
    ok = callback_ok and all(
        e["nonfinite"] == 0 and all(b.holds(e.get(b.metric)) for b in target.bounds) for e in errors.values()
    )
    return Measurement(errors, ok, time.perf_counter() - tick, callback_ok)


class ReferenceOutputs:
    """The calibration batches and the float outputs of each, kept from the reference run.

    :meth:`observer` keeps the run's :class:`~onnxprec.calibration_data.CalibrationData` (read again for each
    trial; a one-shot source is spooled to disk, never held in memory) and is given to the reference run, which
    hands it the graph outputs of every batch in order; :meth:`close` removes the spooled batches.
    """

    def __init__(self) -> None:
        self.batches: Iterable[dict[str, np.ndarray]] = []
        self.outputs: list[dict[str, np.ndarray]] = []
        self._names: frozenset[str] = frozenset()
        self._count: dict[str, int] = {}

    def close(self) -> None:
        from onnxprec.calibration_data import CalibrationData

        if isinstance(self.batches, CalibrationData):
            self.batches.close()

    def observer(self, model: ir.Model, batches: CalibrationData) -> ReferenceOutputs:
        self.batches = batches
        self._names = frozenset(str(v.name) for v in model.graph.outputs)
        return self

    # the observer interface of the reference runner
    def wants(self, name: str) -> bool:
        return name in self._names

    def update(self, name: str, array: np.ndarray) -> None:
        if name not in self._names:
            return
        index = self._count.get(name, 0)
        self._count[name] = index + 1
        while len(self.outputs) <= index:
            self.outputs.append({})
        self.outputs[index][name] = np.array(array, copy=True)


# --------------------------------------------------------------------------------------------------
# Emulated verdicts and their real checks


class ErrorScale:
    """Scales emulated errors to measured ones: each output's and metric's distance from perfect (rel_l2,
    max_abs, 1 - cosine, 1 - top1) times the ratio one configuration shows, measured over emulated (clamped to
    [1/16, 16]).

    An emulation rounds where the real model does, but not always as its kernels do (ONNX Runtime's CPU computes
    many FP16 ops in FP32; fused integer kernels requantize their own way), so the two errors differ by a factor.
    """

    def __init__(self, emulated: Measurement, real: Measurement) -> None:
        self.factors: dict[tuple[str, str], float] = {}
        for name, errors in emulated.errors.items():
            for metric in METRICS:
                e, r = badness(metric, errors.get(metric)), badness(metric, real.errors.get(name, {}).get(metric))
                if e is not None and r is not None and e > 0 and r > 0:
                    self.factors[name, metric] = min(16.0, max(1 / 16, r / e))

    def holds(self, target: AccuracyTarget, measurement: Measurement) -> bool:
        """Whether ``target`` holds on an emulated measurement, its errors scaled."""
        if not measurement.callback_ok:
            return False
        for name, errors in measurement.errors.items():
            if errors["nonfinite"]:
                return False
            for bound in target.bounds:
                bad = badness(bound.metric, errors.get(bound.metric))
                if bad is None:
                    return False
                scaled = bad * self.factors.get((name, bound.metric), 1.0)
                if not bound.holds(1 - scaled if bound.metric in _HIGHER_IS_BETTER else scaled):
                    return False
        return True


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
