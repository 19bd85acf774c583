"""Accuracy, written once for every tool: what the outputs must keep, how it is measured, the real checks that
confirm an emulated choice, and the task metric that follows each output.

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
- **Task metrics** (:class:`TaskMetrics`, :func:`task_metrics`): the metric a user would check, picked per output
  from the float model's graph and the output's shape (argmax agreement for class scores, identical decoded
  strings for CTC sequences, decisions or mask IoU after a Sigmoid, cosine and relative L2 otherwise), summarized in
  one line (:meth:`TaskSummary.describe`) and in JSON.

Importing this package is cheap (numpy only): the options parse targets with it.
"""

from __future__ import annotations

from onnxprec.accuracy._confirm import MAX_REAL_CHECKS, Verdict, confirm
from onnxprec.accuracy._margins import StepMargins
from onnxprec.accuracy._target import (
    METRICS,
    AccuracyTarget,
    Bound,
    Callback,
    ErrorScale,
    Measurement,
    ReferenceOutputs,
    badness,
    measure_outputs,
)
from onnxprec.accuracy._task import (
    Kind,
    OutputKind,
    OutputMetric,
    Producer,
    TaskMetrics,
    TaskSummary,
    batch_size,
    ctc_strings,
    is_state,
    kind_of,
    output_producers,
    task_metrics,
)

__all__ = [
    "MAX_REAL_CHECKS",
    "METRICS",
    "AccuracyTarget",
    "Bound",
    "Callback",
    "ErrorScale",
    "Kind",
    "Measurement",
    "OutputKind",
    "OutputMetric",
    "Producer",
    "ReferenceOutputs",
    "StepMargins",
    "TaskMetrics",
    "TaskSummary",
    "Verdict",
    "badness",
    "batch_size",
    "confirm",
    "ctc_strings",
    "is_state",
    "kind_of",
    "measure_outputs",
    "output_producers",
    "task_metrics",
]
