"""The quantizers' default accuracy check and guard: what a result is measured by, and the bound it must keep.

Every quantizer measures its result against the float model on the calibration inputs (and on the held-out runs,
:meth:`onnxprec.calibration_data.CalibrationData.held_out`) and says it in its summary line and report. The metric
follows each float output (:func:`output_kinds`):

- **class scores** (``[N, C]``, ``C >= 2``, not named as an embedding or hidden state): argmax agreement (``top1``);
- **per-step scores** (``[N, T, C]`` written by a Softmax/LogSoftmax or named ``*prob*``/``*ctc*``, a CTC head's
  output, say): per-step argmax agreement (``top1`` over the last axis);
- **anything else** (boxes, maps, embeddings, ``[N, 1]``, and a language model's ``[N, T, vocab]`` logits from a
  MatMul, whose near-tied argmaxes flip at a cosine of 0.9994 in a random-weight test model): cosine similarity (and
  relative L2 in the report).

INT8's guard (:data:`DEFAULT_BOUNDS`) holds the result to argmax agreement >= 0.98 for class scores (the issue's
classification bound: top-1 agreement >= 98 %), per-step agreement >= 0.95 for sequences (a CTC decoder's string
changes with one step), cosine >= 0.99 otherwise (the bound of embeddings; a detector head at cosine 0.63, issue
24's OCR detector, is destroyed, one at 0.999 is not). A model whose outputs are all of the first two kinds is held
to the lower agreement of its kinds, any other to the cosine bound on every output.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from onnxprec.accuracy import AccuracyTarget, Measurement

__all__ = ["DEFAULT_BOUNDS", "KINDS", "describe", "guard_target", "holds", "output_kinds", "to_json"]

KINDS = ("class scores", "per-step scores", "other")
DEFAULT_BOUNDS: dict[str, tuple[str, float]] = {
    "class scores": ("top1", 0.98),
    "per-step scores": ("top1", 0.95),
    "other": ("cosine", 0.99),
}
"""Output kind -> (metric, lowest value) of INT8's default accuracy guard (see the module docstring for why)."""

_NOT_SCORES = re.compile(r"embed|hidden|state|feature|pool|token_embeddings|sentence", re.IGNORECASE)
_STEP_SCORES = re.compile(r"prob|ctc", re.IGNORECASE)
_SOFTMAX = ("Softmax", "LogSoftmax")
_STATE = re.compile(r"present")
"""A decoder's KV cache outputs (``present.N.key``...): state for the next step, judged through the logits."""


def output_kinds(model: ir.Model, outputs: Mapping[str, np.ndarray]) -> dict[str, str]:
    """The kind (:data:`KINDS`) of each float output that is judged (not a decoder's ``present.*`` KV cache), from
    its observed array and the node that writes it."""
    import numpy as np

    producers = {str(v.name): v.producer() for v in model.graph.outputs}
    kinds = {}
    for name, array in outputs.items():
        if not np.issubdtype(np.asarray(array).dtype, np.floating) or _STATE.match(name):
            continue
        producer = producers.get(name)
        op = producer.op_type if producer is not None else ""
        shape = np.shape(array)
        if len(shape) == 2 and shape[-1] >= 2 and not _NOT_SCORES.search(name):
            kinds[name] = "class scores"
        elif len(shape) == 3 and shape[-1] >= 2 and (op in _SOFTMAX or _STEP_SCORES.search(name)):
            kinds[name] = "per-step scores"
        else:
            kinds[name] = "other"
    return kinds


def guard_target(kinds: Mapping[str, str]) -> AccuracyTarget:
    """The default bound for outputs of these kinds, as an accuracy target (see the module docstring).

    Score-only models get ``cosine>=-1,top1>=B``: the always-true cosine bound comes first so that the fallback
    search ranks layers by the smooth cosine, while the verdict is the agreement.
    """
    from onnxprec.accuracy import AccuracyTarget

    scores = [DEFAULT_BOUNDS[k][1] for k in kinds.values() if k != "other"]
    if kinds and len(scores) == len(kinds):
        return AccuracyTarget.parse(f"cosine>=-1,top1>={min(scores):g}")
    return AccuracyTarget.parse(f"cosine>={DEFAULT_BOUNDS['other'][1]:g}")


def holds(measurement: Measurement, kinds: Mapping[str, str]) -> bool:
    """Whether every output keeps its kind's bound (and has no new non-finite value)."""
    for name, errors in measurement.errors.items():
        if name not in kinds:
            continue
        metric, bound = DEFAULT_BOUNDS[kinds[name]]
        value = errors.get(metric)
        if errors.get("nonfinite") or value is None or math.isnan(value) or value < bound:
            return False
    return True


def _metrics(errors: Mapping[str, float], kind: str) -> dict[str, float]:
    shown = ("top1", "cosine") if kind != "other" else ("cosine", "rel_l2")
    return {m: float(errors[m]) for m in shown if errors.get(m) is not None}


def describe(measurement: Measurement, kinds: Mapping[str, str]) -> str:
    """One phrase: each kind's metric, worst over its outputs, e.g. ``top1 0.986 (class scores), cosine 0.9993``."""
    parts = []
    for kind in KINDS:
        names = [n for n in measurement.errors if kinds.get(n) == kind]
        if not names:
            continue
        metric = DEFAULT_BOUNDS[kind][0]
        values = [measurement.errors[n].get(metric) for n in names]
        worst = min((v for v in values if v is not None), default=None)
        if worst is not None:
            label = "top1" if kind == "class scores" else "per-step top1" if kind != "other" else "cosine"
            parts.append(f"{label} {worst:.4g}")
    return ", ".join(parts)


def to_json(measurement: Measurement, kinds: Mapping[str, str], runs: int) -> dict[str, Any]:
    """A measurement for the report: runs, the phrase of :func:`describe`, and per output its kind and metrics."""
    return {
        "runs": runs,
        "metric": describe(measurement, kinds),
        "outputs": {
            name: {"kind": kinds[name], **_metrics(errors, kinds[name])}
            for name, errors in measurement.errors.items()
            if name in kinds
        },
    }
