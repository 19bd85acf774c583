"""Automatic float fallback: the most sensitive INT8 layers go back to float until an accuracy target holds.

The target is AutoCast's (``rel_l2<=0.03``, ``cosine>=0.999``, ``top1>=0.99``, ``max_abs<=...``, or a callback),
checked on the calibration data against the float model's outputs kept from the calibration pass. Each check builds
the INT8 model for real (the decisions applied to a copy of the float model) and runs it in ONNX Runtime with its
fusions, as the user will: what is measured is what is saved.

1. The all-INT8 model is checked; if it meets the target, nothing changes.
2. Sensitivity (the sensitivity engine, :mod:`onnxprec.sensitivity`): with at most :data:`MAX_ISOLATED` layers,
   how much the output error drops when that layer alone goes back to float (:func:`~onnxprec.sensitivity.
   isolated_gains`: one check per layer; it sees the interactions that the error of a layer quantized alone
   misses); with more, an estimate (:func:`estimated_sensitivity`): the layer's own output error on the
   calibration sample where the channel decisions measured it, else the Hessian-weighted error of its INT8 weight
   (:func:`~onnxprec.sensitivity.hessian_loss` with the ``XᵀX`` the observers collected, unweighted without it). With
   ``max_float_compute``, only the most sensitive layers that fit in that share of the multiply-adds
   (:func:`~onnxprec.sensitivity.within`).
3. How many of the most sensitive layers go back to float (:func:`~onnxprec.sensitivity.fewest`): 1, 2, 4...
   until the target holds, then a bisection in between (about ``2 log2(count)`` checks) finds the fewest that
   meet it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._tensors import float32_copy
from onnxprec.autocast.accuracy_target import METRICS, AccuracyTarget
from onnxprec.autocast.target import Measurement, ReferenceOutputs
from onnxprec.metrics import ErrorStats
from onnxprec.quantization.algorithms.int8 import dequantize_weight, quantize_weight
from onnxprec.quantization.int8.place import Layer
from onnxprec.sensitivity import fewest, hessian_energy, isolated_gains, rank, within

__all__ = ["MAX_ISOLATED", "estimated_sensitivity", "measure", "search"]

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


def estimated_sensitivity(
    layers: Sequence[Layer], measured: Mapping[str, float | None], hessians: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Each layer's relative squared output error from INT8, estimated without a run (the proxy above
    :data:`MAX_ISOLATED` layers): ``measured`` (the output error on the calibration sample) where given, else
    ``tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)`` of its per-channel INT8 weight with ``H`` the ``XᵀX`` of its input (per group for a
    Conv: its patches') from ``hessians``, or the identity where none was collected."""
    result = {}
    for layer in layers:
        value = measured.get(layer.name)
        if value is not None:
            result[layer.name] = float(value)
            continue
        tensor = layer.weight.const_value
        if tensor is None:
            continue
        conv = layer.node.op_type == "Conv"
        w = float32_copy(tensor, transposed=layer.transposed)  # [K, N]; a Conv's [M, C/g, kh, kw]
        matrix = w.reshape(w.shape[0], -1).T if conv else w  # [K', M] or [K, N]: output channels last
        q, scales = quantize_weight(matrix, axis=1)
        delta = matrix - dequantize_weight(q, scales, axis=1)
        gram = hessians.get(str(layer.activation.name))
        if gram is None or gram.shape[1:] != (matrix.shape[0],) * 2 or matrix.shape[1] % gram.shape[0]:
            gram = None
        groups = 1 if gram is None else gram.shape[0]
        width = matrix.shape[1] // groups
        num = den = 0.0
        for g in range(groups):  # a grouped Conv's output channels g*width.. read the patches of group g
            cols = slice(g * width, (g + 1) * width)
            h = None if gram is None else gram[g]
            num += hessian_energy(delta[:, cols], h)
            den += hessian_energy(matrix[:, cols], h)
        result[layer.name] = max(num, 0.0) / den if den > 0 else 0.0
    return result


def _badness(measurement: Measurement, metric: str) -> float:
    value = measurement.worst(metric)
    if value is None:
        return 0.0
    return 1.0 - value if metric in ("cosine", "top1") else value


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
    if len(layers) <= MAX_ISOLATED:
        sensitivity = isolated_gains(
            layers, lambda name: _badness(check({name}), metric), _badness(first, metric),
            squared=metric in ("rel_l2", "max_abs"), progress="INT8 sensitivity",
        )  # fmt: skip
        steps.append({"what": f"gain of each layer alone in float ({metric})", "checks": len(layers)})
    else:
        sensitivity = {name: proxy.get(name, 0.0) for name in layers}
    order = rank(sensitivity, layers, positive=True)
    if cost and max_float_compute < 1.0:  # the most sensitive layers that fit in the compute budget, in order
        order = within(order, cost, max_float_compute * (sum(cost.get(name, 0.0) for name in layers) or 1.0))
    if not order:
        logger.warning(
            "The accuracy target %s is not met (%s) and no layer's float form helps", target, first.summary()
        )
        return [], first
    checked: dict[int, Measurement] = {}

    def holds(count: int) -> bool:
        checked[count] = run(order[:count], f"{count} most sensitive in float")
        return checked[count].ok

    high = fewest(holds, len(order))
    best = checked.get(high) or run(order[:high], f"{high} most sensitive in float")
    if not best.ok:
        logger.warning(
            "The accuracy target %s is not met (%s) with the %d most sensitive layers in float, all that "
            "--max_float_compute %g allows", target, best.summary(), high, max_float_compute,
        )  # fmt: skip
    return order[:high], best


def worst_errors(measurement: Measurement) -> dict[str, float]:
    """The worst value of each metric over the outputs (what the report shows)."""
    return {m: float(v) for m in METRICS if (v := measurement.worst(m)) is not None and math.isfinite(v)}
