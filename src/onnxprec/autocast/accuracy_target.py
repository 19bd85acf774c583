"""The accuracy target of AutoCast's ``--target_accuracy``: what the outputs must keep on the calibration data.

Bounds on every float output (``rel_l2<=1e-3``, ``cosine>=0.9999``, ``top1>=0.999``, ``max_abs<=1e-2``, several
joined by commas) and/or a callback on reference and candidate outputs. Only the specification: the search that
meets it is :mod:`onnxprec.autocast.target`. Imports nothing heavy (the options parse it).
"""

from __future__ import annotations

import contextlib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxprec.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["METRICS", "AccuracyTarget", "Bound", "Callback"]

METRICS = ("rel_l2", "cosine", "top1", "max_abs")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_BOUND = re.compile(r"^\s*(rel_l2|cosine|top1|max_abs)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*$")
Callback = Callable[[dict[str, "np.ndarray"], dict[str, "np.ndarray"]], Any]


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
