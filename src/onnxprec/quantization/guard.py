"""The quantizers' default accuracy check and guard: how a result is measured, and the bound it must keep.

Every quantizer measures its result against the float model on the calibration inputs (and on the held-out runs,
:meth:`onnxprec.calibration_data.CalibrationData.held_out`) and says it in its summary line and report, with the
task metric that follows each output (:mod:`onnxprec.accuracy`'s :class:`~onnxprec.accuracy.TaskMetrics`: argmax
agreement for class scores, decoded strings for ``[N, T, C]`` and ``[T, N, C]`` CTC sequences, decision agreement or
regions or mask IoU after a Sigmoid, SNR for waveforms and log-scale features, cosine otherwise).

INT8's guard holds each judged output to its kind's bound (:data:`DEFAULT_BOUNDS`):

- classes and labels: agreement >= 0.98 (issue 24's classification bound: top-1 agreement >= 98 %);
- sequences (a CTC recognizer's ``[N, T, C]`` or ``[T, N, C]`` scores, Softmax or raw): >= 0.993 of the greedily
  decoded strings identical, or predicted so by the margins of the steps whose flip can change a string
  (:class:`onnxprec.accuracy.StepMargins`), on the calibration runs; >= 0.98 on the held-out runs
  (:data:`HELD_OUT_BOUNDS`). Both sit above issue 24's 0.95 of held-out strings by the room a prediction from margins
  needs: on the calibration runs the ranges were fitted to the strings they predict, on held-out runs nothing was
  (the evidence for 0.993: experiments/int8_ctc_margins.py; design_notes.md, "INT8 accuracy guard");
- positions (segmentation) and binary decisions (a VAD's speech probability): agreement >= 0.95 (a decision near 0.5
  flips with any error);
- regions (a text detector's Sigmoid map): >= 0.95 of the regions' boxes matched at the worst threshold (issue 24's
  box bound);
- masks (a detector's Sigmoid confidences): IoU >= 0.9, or predicted so by their score margins when lower
  (:class:`onnxprec.accuracy._margins.MaskMargins`);
- detections (a YOLO head's Concat of 4 box values and scores; a GFL/PicoDet head's score and box-distribution
  outputs, judged together, and a YOLOX head's raw output: :mod:`onnxprec.accuracy._heads`): >= 0.95 of the boxes
  it decodes to matched at the worst of its confidence thresholds (issue 24's box bound); under 60 boxes seen, the
  share their score margins predict when lower (:data:`onnxprec.accuracy._boxes.MIN_BOXES`), each box by its own
  pyramid level's score changes;
- another Concat of scores beside other values: cosine >= 0.99 of each part;
- signals (a vocoder's waveform, log-scale features such as a log-mel spectrogram): SNR >= 25 dB, rel L2 <= 0.056,
  the same bound (issue 24's vocoder and speech-feature bound);
- values (embeddings, boxes, hidden states, audio) and a language model's ``[N, T, vocab]`` logits (named like
  logits, not a Softmax: near-tied argmaxes flip while the cosine stays high): cosine >= 0.99 (issue 24's embedding
  bound).

A decoder's ``present.*`` KV cache outputs are measured but not judged (state for the next step, judged through the
logits): :func:`~onnxprec.accuracy.is_state`; the summary line leaves them out, the report keeps them. The results
that set the bounds: experiments/design_notes.md, "INT8 accuracy guard".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxprec._report import timed
from onnxprec.accuracy import (
    AccuracyTarget,
    Measurement,
    ReferenceOutputs,
    TaskMetrics,
    batch_size,
    is_state,
    kind_of,
    measure_outputs,
)

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec._ort import Optimization
    from onnxprec.accuracy import OutputMetric, Producer, TaskSummary

__all__ = [
    "CHECK_BYTES",
    "DEFAULT_BOUNDS",
    "HELD_OUT_BOUNDS",
    "RANKING",
    "BoundedOutputs",
    "Checked",
    "bound_of",
    "describe_bounds",
    "holds",
    "judges_regions",
    "measure_task",
    "short_of_defaults",
]

DEFAULT_BOUNDS: dict[str, float] = {
    "classes": 0.98,
    "labels": 0.98,
    "sequence": 0.993,
    "positions": 0.95,
    "binary": 0.95,
    "regions": 0.95,
    "mask": 0.90,
    "detections": 0.95,
    "signal": 25.0,
    "values": 0.99,
}
"""Output kind (:data:`onnxprec.accuracy.Kind`) -> the lowest task metric INT8's guard accepts on the calibration runs
(module docstring)."""

HELD_OUT_BOUNDS: dict[str, float] = {**DEFAULT_BOUNDS, "sequence": 0.98}
"""The same on held-out runs, where the bound needs no room for the fit to the calibration runs (module docstring)."""

RANKING = AccuracyTarget.parse("cosine>=-1")
"""The target the float fallback searches with under the guard: it always holds (the guard's verdict replaces it),
and ranks layers by the smooth cosine of the outputs."""

CHECK_BYTES = 256 * 1024 * 1024
"""The float outputs a check keeps (:class:`BoundedOutputs`): an LLM's logits are 50 MB a 256-token window."""


class BoundedOutputs(ReferenceOutputs):
    """The float outputs of the first runs, up to ``budget`` bytes (at least one run): the check measures those runs
    (:func:`~onnxprec.accuracy.measure_outputs` pairs batches with kept outputs)."""

    def __init__(self, budget: int = CHECK_BYTES) -> None:
        super().__init__()
        self.budget = budget
        self.kept_bytes = 0
        self.limit: int | None = None  # runs kept, once the budget is reached
        self._seen: dict[str, int] = {}

    def update(self, name: str, array: Any) -> None:
        if name not in self._names:  # the reference run hands every fetched tensor: only the outputs count
            return
        index = self._seen.get(name, 0)
        self._seen[name] = index + 1
        if self.limit is not None and index >= self.limit:
            return
        size = int(getattr(array, "nbytes", 0))
        if index > 0 and self.kept_bytes + size > self.budget:
            self.limit = index
            del self.outputs[index:]  # the run whose outputs no longer fit, and any after it
            return
        self.kept_bytes += size
        super().update(name, array)


def bound_of(
    output: OutputMetric, held_out: bool = False, bounds: Mapping[str, float] | None = None
) -> tuple[str, float] | None:
    """(metric, lowest value) the guard holds ``output`` to on the calibration runs (``held_out``: on held-out runs;
    ``bounds``: a tool's own bounds per output kind, e.g. INT4's), or None for an output it does not judge."""
    if is_state(output.name):
        return None
    if bounds is None:
        bounds = HELD_OUT_BOUNDS if held_out else DEFAULT_BOUNDS
    if output.kind == "sequence" and output.metric == "step_agreement":  # a language model's logits
        return "cosine", bounds["values"]
    return output.metric, bounds[output.kind]


def holds(summary: TaskSummary, held_out: bool = False, bounds: Mapping[str, float] | None = None) -> bool:
    """Whether every judged output keeps its bound (on held-out runs: ``held_out``; a tool's own ``bounds``; a
    non-finite error never does)."""
    for output in summary.outputs:
        bound = bound_of(output, held_out, bounds)
        if bound is None:
            continue
        metric, lowest = bound
        value = output.cosine if metric == "cosine" else output.value
        if output.rel_l2 is not None and not output.rel_l2 < float("inf"):
            return False
        if value is not None and not value >= lowest:
            return False
    return True


def judges_regions(kept: ReferenceOutputs, producers: Mapping[str, Producer | None]) -> bool:
    """Whether an output is judged by its regions (a text detector's Sigmoid map, on the first kept run): the float
    fallback ranks layers by their own INT8 error once its gains' ranking misses (:func:`onnxprec.quantization.int8.
    fallback.search`'s ``own_errors``). A map cut into regions loses one where the largest error nears a boundary,
    so a layer whose error another's hides in the output's cosine still loses regions."""
    first = kept.outputs[0] if kept.outputs else {}
    return any(
        kind_of(name, value.shape, True, producers.get(name), value).kind == "regions"
        for name, value in first.items()
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)
    )


def describe_bounds(summary: TaskSummary, held_out: bool = False, bounds: Mapping[str, float] | None = None) -> str:
    """The bounds the guard holds the outputs to (on held-out runs: ``held_out``; a tool's own ``bounds``), e.g.
    ``logits top1 >= 0.98``."""
    parts = []
    for output in summary.outputs:
        bound = bound_of(output, held_out, bounds)
        if bound is not None:
            parts.append(f"{output.name} {bound[0]} >= {bound[1]:g}")
    return ", ".join(parts[:4]) + (f" and {len(parts) - 4} more" if len(parts) > 4 else "")


def short_of_defaults(summary: TaskSummary, bounds: Mapping[str, float], names: Collection[str] | None = None) -> str:
    """The outputs (of ``names``, or all) that keep a tool's own ``bounds`` (INT4's cosine >= 0.95 for plain values)
    but not INT8's (:data:`DEFAULT_BOUNDS`: an embedding at cosine >= 0.99), as ``<output> cosine <value> < 0.99``;
    empty when none."""
    parts = []
    for output in summary.outputs:
        if names is not None and output.name not in names:
            continue
        own, default = bound_of(output, bounds=bounds), bound_of(output)
        if own is None or default is None or own[1] >= default[1]:
            continue
        value = output.cosine if default[0] == "cosine" else output.value
        if value is not None and own[1] <= value < default[1]:
            parts.append(f"{output.name} {default[0]} {value:.5g} < {default[1]:g}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Checked:
    """A result measured on one set of runs: the errors (:class:`~onnxprec.accuracy.Measurement`), the task
    metrics, the number of runs, and whether they were held out (:data:`HELD_OUT_BOUNDS`)."""

    measurement: Measurement
    summary: TaskSummary
    runs: int
    held_out: bool = False
    bounds: Mapping[str, float] | None = None

    @property
    def ok(self) -> bool:
        return holds(self.summary, self.held_out, self.bounds)

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "metric": self.summary.describe(), **self.summary.to_json()}


def measure_task(
    model: ir.Model,
    kept: ReferenceOutputs,
    producers: Mapping[str, Producer | None],
    providers: Sequence[str] | None = None,
    target: AccuracyTarget = RANKING,
    optimization: Optimization = "all",
    bounds: Mapping[str, float] | None = None,
) -> Checked:
    """Runs ``model`` (optimized as ONNX Runtime will run it, or at ``optimization``) on every kept batch: its errors
    against ``target`` and its task metrics against the float outputs, in one pass."""
    from onnxprec import _ort

    metrics = TaskMetrics(producers)
    references = iter(kept.outputs)

    def run(batch: dict[str, Any]) -> dict[str, Any]:
        outputs = dict(zip(session.output_names, session.run(batch)))
        metrics.update(next(references), outputs, batch_size(batch))
        return outputs

    with timed() as clock:
        session = _ort.create_session(model, providers=providers, optimization=optimization, what="the quantized model",
                                      spinning=False)  # fmt: skip
        measurement = measure_outputs(target, kept, run)
    measurement = dataclasses.replace(measurement, seconds=clock.seconds)
    return Checked(measurement, metrics.summary(), len(kept.outputs), bounds=bounds)
