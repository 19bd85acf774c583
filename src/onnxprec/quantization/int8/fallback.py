"""Automatic float fallback: the most sensitive INT8 layers go back to float until an accuracy target holds.

The target is AutoCast's (``rel_l2<=0.03``, ``cosine>=0.999``, ``top1>=0.99``, ``max_abs<=...``, or a callback),
checked on the calibration data against the float model's outputs kept from the calibration pass. Each check builds
the INT8 model for real (the decisions applied to a copy of the float model) and runs it in ONNX Runtime with its
fusions, as the user will: what is measured is what is saved.

1. The all-INT8 model is checked; if it meets the target, nothing changes.
2. Sensitivity: with at most :data:`MAX_ISOLATED` layers, how much the output error drops when that layer alone
   goes back to float (one check per layer; it sees the interactions that the error of a layer quantized alone
   misses); with more, the layer's own output error on the calibration sample (a local proxy). Divided by the
   layer's share of the model's multiply-adds: the cheapest error goes back first.
3. How many of the most sensitive layers go back to float: 1, 2, 4... until the target holds, then a bisection
   in between (about ``2 log2(count)`` checks) finds the fewest that meet it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec.autocast.accuracy_target import METRICS, AccuracyTarget
from onnxprec.autocast.target import Measurement, ReferenceOutputs
from onnxprec.metrics import ErrorStats

__all__ = ["MAX_ISOLATED", "measure", "search"]

logger = logging.getLogger(__name__)

MAX_ISOLATED = 64


def measure(
    model: ir.Model, target: AccuracyTarget, calibration: ReferenceOutputs, providers: Sequence[str] | None = None
) -> Measurement:
    """Runs ``model`` (optimized as ONNX Runtime will run it) on every calibration batch against the kept outputs."""
    tick = time.perf_counter()
    session = _ort.create_session(model, providers=providers, optimization="all", what="the INT8 model")
    stats: dict[str, ErrorStats] = {}
    callback_ok = True
    for batch, reference in zip(calibration.batches, calibration.outputs):
        outputs = dict(zip(reference, session.run(batch, list(reference))))
        for name, expected in reference.items():
            if np.issubdtype(expected.dtype, np.floating):
                stats.setdefault(name, ErrorStats(track_top1=target.needs_top1)).update(
                    expected, np.asarray(outputs[name], dtype=np.float32)
                )
        if target.callback is not None and callback_ok:
            callback_ok = bool(target.callback(reference, outputs))
    errors = {name: s.as_dict() for name, s in stats.items()}
    ok = callback_ok and all(
        e["nonfinite"] == 0 and all(b.holds(e.get(b.metric)) for b in target.bounds) for e in errors.values()
    )
    return Measurement(errors, ok, time.perf_counter() - tick, callback_ok)


def _badness(measurement: Measurement, metric: str) -> float:
    value = measurement.worst(metric)
    if value is None:
        return 0.0
    return 1.0 - value if metric in ("cosine", "top1") else value


def _gain(before: float, after: float, metric: str) -> float:
    """What a change gained: in squared error for rel_l2 and max_abs (errors of independent layers add up in
    squares), in the metric itself for cosine and top1 (1 - cosine is already a squared error)."""
    if metric in ("rel_l2", "max_abs"):
        return before * before - after * after
    return before - after


def search(
    layers: Sequence[str],
    check: Callable[[Collection[str]], Measurement],
    target: AccuracyTarget,
    proxy: dict[str, float],
    steps: list[dict[str, Any]],
    cost: dict[str, float] | None = None,
    max_float_compute: float = 1.0,
) -> tuple[list[str], Measurement]:
    """The fewest layers to keep in float so that ``check`` meets ``target``.

    Args:
        layers: The quantized layers' names.
        check: Builds and measures the model with the given layers in float.
        target: The accuracy target.
        proxy: A sensitivity per layer for models with more than :data:`MAX_ISOLATED` layers.
        steps: Each check is appended here (what it tried, its errors and verdict).
        cost: The compute of each layer (multiply-adds).
        max_float_compute: At most this fraction of the layers' compute goes back to float (speed first): when the
            target needs more, the most sensitive layers that fit go back, and a warning says what was reached.

    Returns:
        The layers kept in float (most sensitive first) and the final measurement.
    """

    def run(floats: Collection[str], what: str) -> Measurement:
        measurement = check(floats)
        steps.append({"what": what, "float_layers": len(floats), "ok": measurement.ok,
                      **{m: measurement.worst(m) for m in METRICS if measurement.worst(m) is not None},
                      "seconds": measurement.seconds})  # fmt: skip
        logger.debug(
            "Target check (%s): %s -> %s", what, measurement.summary(), "holds" if measurement.ok else "misses"
        )
        return measurement

    first = run((), "every layer INT8")
    if first.ok or not layers:
        return [], first
    metric = target.bounds[0].metric if target.bounds else "rel_l2"
    from tqdm.auto import tqdm

    if len(layers) <= MAX_ISOLATED:
        base = _badness(first, metric)
        sensitivity = {}
        for name in tqdm(layers, desc="INT8 sensitivity", unit="layer", disable=None, leave=False):
            sensitivity[name] = _gain(base, _badness(check({name}), metric), metric)  # what it gains alone
        steps.append({"what": f"gain of each layer alone in float ({metric})", "checks": len(layers)})
    else:
        sensitivity = {name: proxy.get(name, 0.0) for name in layers}
    order = [name for name in sorted(layers, key=lambda name: -sensitivity[name]) if sensitivity[name] > 0]
    if cost and max_float_compute < 1.0:
        total, used, kept = sum(cost.get(name, 0.0) for name in layers) or 1.0, 0.0, []
        for name in order:  # the most sensitive layers that fit in the compute budget, in order
            if used + cost.get(name, 0.0) <= max_float_compute * total:
                kept.append(name)
                used += cost.get(name, 0.0)
        order = kept
    if not order:
        logger.warning(
            "The accuracy target %s is not met (%s) and no layer's float form helps", target, first.summary()
        )
        return [], first
    # Galloping from the fewest: 1, 2, 4... layers in float until the target holds, then a bisection in between,
    # so a target that a few layers meet is found in a few checks.
    low, high = 0, len(order)  # low misses; high is assumed to hold until checked
    best: Measurement | None = None
    count = 1
    while count < high:
        measurement = run(order[:count], f"{count} most sensitive in float")
        if measurement.ok:
            high, best = count, measurement
            break
        low, count = count, count * 2
    while high - low > 1:
        middle = (low + high) // 2
        measurement = run(order[:middle], f"{middle} most sensitive in float")
        if measurement.ok:
            high, best = middle, measurement
        else:
            low = middle
    if best is None:
        best = run(order[:high], f"{high} most sensitive in float")
    if not best.ok:
        logger.warning(
            "The accuracy target %s is not met (%s) with the %d most sensitive layers in float, all that "
            "--max_float_compute %g allows", target, best.summary(), high, max_float_compute,
        )  # fmt: skip
    return order[:high], best


def worst_errors(measurement: Measurement) -> dict[str, float]:
    """The worst value of each metric over the outputs (what the report shows)."""
    return {m: float(v) for m in METRICS if (v := measurement.worst(m)) is not None and math.isfinite(v)}
