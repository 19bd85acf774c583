"""The accuracy target: what the outputs must keep, the float outputs kept to check it, a candidate measured
against them, and emulated errors judged in the real unit (:class:`ErrorScale`). Imports numpy only: the options
parse targets with it.
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxprec._report import timed
from onnxprec.errors import InvalidArgumentError
from onnxprec.metrics import ErrorStats

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec.calibration_data import CalibrationData

__all__ = [
    "METRICS",
    "AccuracyTarget",
    "Bound",
    "Callback",
    "ErrorScale",
    "Measurement",
    "ReferenceOutputs",
    "badness",
    "measure_outputs",
]

METRICS = ("rel_l2", "cosine", "top1", "max_abs")
"""The metrics a bound names; ``cosine`` and ``top1`` are better higher, the others lower."""

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
    with timed() as clock:
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
    return Measurement(errors, ok, clock.seconds, callback_ok)


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
# Emulated verdicts


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
