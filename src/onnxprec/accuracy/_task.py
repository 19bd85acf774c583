"""Task metrics that follow each output: what a model's user would check, picked from the float model's graph and
the output's shape, measured on a candidate's outputs against the float model's.

The rules, per output (``C``: the size of the class axis; the producer is the op that writes the output, looked
through ``Identity``, ``Cast``, the ops that only reshape: ``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``, and
``Transpose``, past which a Softmax's axis is not followed):

============  ======================  ==========================================================================
kind          metric                  when
============  ======================  ==========================================================================
labels        ``label_agreement``     an integer, bool or string output (ArgMax, TopK indices, a classifier's
                                      label): the share of elements equal.
classes       ``top1``                ``[N, C]`` (``[C]`` too), ``C >= 2``, from Softmax/LogSoftmax over ``C``; or
                                      ``[N, C]`` logits: from Gemm/MatMul (+Add), or named like scores (``logit``,
                                      ``prob``, ``score``, ``class``...), unless named like an embedding
                                      (``emb``, ``feat``, ``hidden``, ``pool``...) or a regression (``box``...).
                                      The share of rows whose argmax agrees.
sequence      ``string_agreement``    ``[N, T, C]`` or ``[T, N, C]``, ``C >= 2``, from Softmax/LogSoftmax over
                                      ``C`` (a CTC recognizer); or raw scores from Gemm/MatMul (+Add) or named like
                                      scores whose float values show a CTC blank (one class is the argmax of at
                                      least :data:`BLANK_SHARE` of the steps) and ``C <=`` :data:`MAX_ALPHABET`:
                                      the share of sequences whose greedy CTC decoding (argmax per step, repeats
                                      collapsed, the blank dropped) is identical. The blank is the float model's
                                      most frequent argmax; the time axis is the one that is not the batch
                                      (``[T, N, C]`` when axis 1, not axis 0, has the inputs' batch size).
sequence      ``step_agreement``      ``[N, T, C]`` named like logits without a CTC blank (an LM): the share of
                                      steps whose argmax agrees. A ``[N, T, 384]`` hidden state from MatMul is not
                                      one: values.
positions     ``position_agreement``  Softmax/LogSoftmax over another axis (``[N, C, H, W]`` segmentation): the
                                      share of positions whose argmax along that axis agrees.
binary        ``decision_agreement``  from Sigmoid, rank <= 2 (``[N]``, ``[N, 1]``, ``[N, K]`` multi-label): the
                                      share of ``p >= 0.5`` decisions that agree.
regions       ``region_agreement``    from Sigmoid, rank 4 (``[N, C, H, W]``: a text detector's probability map):
                                      the bounding boxes of the connected regions over each threshold of
                                      :data:`~onnxprec.accuracy._boxes.REGION_THRESHOLDS`, matched at IoU >= 0.5
                                      (:func:`~onnxprec.accuracy._boxes.region_counts`), at the worst threshold.
mask          ``mask_iou``            from Sigmoid, rank 3 or over 4 (``[N, A, K]``: a detector's confidences):
                                      IoU of the ``p >= 0.5`` entries (1 when both are empty), or the IoU their
                                      score margins predict (:class:`~onnxprec.accuracy._margins.MaskMargins`),
                                      if lower.
detections    ``box_agreement``       a rank-3 Concat of 4 box values (centre, size) then only scores (Sigmoid/Softmax),
                                      sizes known (a YOLOv8 head's ``[N, 4 + K, A]``), or a GFL head's score and box
                                      distribution outputs, or a YOLOX head's raw ``[N, A, 5 + K]`` (:mod:`onnxprec.
                                      accuracy._heads`; a GFL head's judged under its first score output's name): boxes
                                      (:mod:`onnxprec.accuracy._boxes`), matched, at the worst confidence threshold
                                      (under 60 boxes: or the share their score margins predict, if lower).
values        ``part_cosine``         another Concat of scores beside other values, sizes known: the cosine of its
                                      worst part (the whole one hides the scores behind the other values' magnitude).
signal        ``snr``                 log-scale features (a Log, then only elementwise arithmetic: a log-mel
                                      spectrogram), or a waveform: ``[N, T]`` or ``[N, 1, T]``, ``T >=``
                                      :data:`MIN_SAMPLES`, not from Gemm/MatMul, not a feature map flattened (a
                                      Flatten or Reshape that merges axes) nor named like an embedding, whose float
                                      values move together from one sample to the next as band-limited audio does
                                      (lag-1 autocorrelation >= :data:`MIN_CORRELATION`; a feature vector or logits
                                      do not): the signal-to-noise ratio in dB.
values        ``cosine``              everything else: hidden states, embeddings, ``[N, 1]`` scores or
                                      regressions, boxes, images, audio.
============  ======================  ==========================================================================

Before opset 13 a Softmax normalizes over ``axis`` and every axis after it, flattened: when the graph does not say
the rank, its axis counts as the class axis only if the runtime shape has nothing but ones after it.

A ``[N, 1]`` output is never called top-1 (an argmax over one value always agrees): from Sigmoid it is binary,
otherwise values. A detection head whose float outputs do not decode to boxes (a runtime shape the graph does not
declare) is judged output by output, as if none had been found. A sequence of maps (ZipMap's probabilities) is
skipped. Every float output also gets its relative L2 error and cosine, and the summary the worst of each. The kind
is decided on the first batch's float output: the graph gives the producer, the array its shape.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from onnxprec.accuracy._boxes import MIN_BOXES, ScoreMargins, region_counts, tally
from onnxprec.accuracy._heads import Head, heads, tell, through
from onnxprec.accuracy._margins import MaskMargins, StepMargins, ctc_strings
from onnxprec.metrics import ErrorStats

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "BLANK_SHARE",
    "MAX_ALPHABET",
    "Kind",
    "OutputKind",
    "OutputMetric",
    "Producer",
    "StepMargins",
    "TaskMetrics",
    "TaskSummary",
    "batch_size",
    "ctc_strings",
    "kind_of",
    "output_producers",
    "task_metrics",
]

Kind = Literal[
    "labels", "classes", "sequence", "positions", "binary", "regions", "mask", "detections", "signal", "values"
]

_PROBABILITIES = frozenset({"Softmax", "Sigmoid"})
_DISTRIBUTIONS = frozenset({"Softmax", "LogSoftmax"})
_LINEAR = frozenset({"Gemm", "MatMul", "FusedMatMul"})
_STATE = re.compile(r"present")
logger = logging.getLogger(__name__)


def is_state(name: str) -> bool:
    """Whether output ``name`` is a decoder's ``present.*`` KV cache: state for the next step, measured but not
    judged (the logits judge it) and left out of :meth:`TaskSummary.describe`'s line."""
    return bool(_STATE.match(name))


_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Clip", "Max", "Min", "Neg"})
_SCORES = re.compile(r"logit|prob|score|class|pred", re.IGNORECASE)
_NOT_SCORES = re.compile(r"emb|feat|hidden|pool|vec|encod|latent|repr|proj|box|coord|landmark|offset|regress", re.I)
BLANK_SHARE = 0.3
"""A CTC head's blank is the argmax of most steps (an LM's commonest next token is far rarer): the share of steps
above which raw ``[., ., C]`` scores count as a CTC sequence."""
MIN_SAMPLES = 4096
"""The fewest samples of a waveform output (a quarter second at 16 kHz); an embedding is far shorter."""
MIN_CORRELATION = 0.5
"""The lowest correlation of a waveform's neighbouring samples (its mean removed, over every row of the first batch):
sampled audio is band-limited, so each sample is close to the one before; the units of a feature vector and the
classes of logits have no such order (their correlation is near 0)."""
MAX_ALPHABET = 16384
"""The most classes a CTC alphabet has here (PP-OCRv4's 6625, ddddocr's 8210); an LM's vocabulary is larger."""
_LABELS = {
    "top1": ("top-1 agreement", "rows"),
    "string_agreement": ("identical strings", "sequences"),
    "part_cosine": ("cosine of its worst part", "values"),
    "box_agreement": ("boxes matched", "boxes"),
    "region_agreement": ("regions matched", "regions"),
    "snr": ("SNR", "samples"),
    "step_agreement": ("per-step agreement", "steps"),
    "position_agreement": ("per-position agreement", "positions"),
    "decision_agreement": ("decision agreement", "decisions"),
    "mask_iou": ("mask IoU", "pixels"),
    "label_agreement": ("label agreement", "labels"),
    "cosine": ("cosine", "values"),
}


@dataclass(frozen=True)
class Producer:
    """The op that gives an output its meaning, found in the float model's graph.

    Attributes:
        op: Its type (``Softmax``, ``Sigmoid``, ``Gemm``...; ``MatMul`` for a MatMul followed by a bias ``Add``).
        axis: Softmax/LogSoftmax: the class axis in the output (from the front, or negative from the end when
            reshapes came between); None when it is not one axis of the output (or for other ops).
        flattens: The axis is an opset < 13 Softmax's of an input of unknown rank: it normalizes over every axis
            from ``axis`` on, so it is the class axis only if the runtime shape has ones after it.
        parts: Concat (``axis``: its axis): each input's producer op and size along the axis, when all are known.
        merged: A Flatten or Reshape between it and the output merges axes that are not 1 after the first (a
            feature map flattened to ``[N, C * H * W]``; not a ``[N, 1, T]`` waveform reshaped to ``[N, T]``).
        logged: It is elementwise arithmetic (:data:`_ARITHMETIC`) on a Log's output: features in a log scale (not
            the Log of a Softmax's or Sigmoid's probabilities).
        permuted: A Transpose came between it and the output (a probability map's axes are not NCHW any more).
        head: The detection head the output is one of (:class:`~onnxprec.accuracy._heads.SplitHead`, ``YoloxHead``).
    """

    op: str
    axis: int | None = None
    flattens: bool = False
    parts: tuple[tuple[str, int], ...] = ()
    merged: bool = False
    logged: bool = False
    permuted: bool = False
    head: Head | None = None


def _logged(node: ir.Node) -> bool:
    """Whether ``node`` is elementwise arithmetic on a Log's output (following the first input that is computed)."""
    while node.op_type in _ARITHMETIC:
        computed = [v.producer() for v in node.inputs if v is not None and v.producer() is not None]
        if not computed:
            return False
        node = computed[0]  # type: ignore[assignment]
    if node.op_type != "Log":
        return False
    source = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    return source is None or source.op_type not in _PROBABILITIES  # a log-probability is no feature


def _softmax_axis(node: ir.Node, opset: int, reshaped: bool) -> int | None:
    """The class axis of a Softmax/LogSoftmax's output as seen past the reshapes after it (see :class:`Producer`;
    an opset < 13 Softmax of unknown rank, not reshaped, gives its ``axis`` and :attr:`Producer.flattens`)."""
    source = node.inputs[0] if node.inputs else None
    shape = None if source is None or source.shape is None else list(source.shape)
    rank = None if shape is None else len(shape)
    axis = node.attributes.get_int("axis", -1 if opset >= 13 else 1)
    if axis < 0:
        if rank is None:  # the last axis stays the last past reshapes (a CTC head's [N*T, C] -> [N, T, C])
            return -1 if axis == -1 or not reshaped else None
        axis += rank
    if rank is None:
        return None if reshaped or opset < 13 else axis
    trailing = shape[axis + 1 :] if shape is not None else []
    last = all(d == 1 for d in trailing)  # the axis is the last one that is not 1
    if opset < 13 and not last:
        return None  # before opset 13, Softmax normalizes over every axis from ``axis`` on, flattened
    if reshaped:
        return -1 if last else None
    return axis


def _producer(value: ir.Value, opset: int) -> Producer | None:
    node, reshaped, merged, permuted = through(value)
    if node is None:
        return None
    if node.op_type in _DISTRIBUTIONS and permuted:  # the class axis moved: not followed
        return Producer(node.op_type)
    if node.op_type in _DISTRIBUTIONS:
        axis = _softmax_axis(node, opset, reshaped)
        source = node.inputs[0] if node.inputs else None
        unknown = source is None or source.shape is None
        if axis is None and unknown and opset < 13 and not reshaped:
            return Producer(node.op_type, node.attributes.get_int("axis", 1), flattens=True)
        return Producer(node.op_type, axis)
    if node.op_type == "Concat" and not reshaped:
        return _concat(node)
    if node.op_type == "Add":  # a bias after a MatMul
        for source in node.inputs:
            feeder = None if source is None else source.producer()
            if feeder is not None and feeder.op_type in _LINEAR:
                return Producer(feeder.op_type)
    return Producer(node.op_type, merged=merged, logged=_logged(node), permuted=permuted)


def _concat(node: ir.Node) -> Producer:
    """A Concat with its parts (:attr:`Producer.parts`) when every input's size along its axis is known."""
    axis = node.attributes.get_int("axis", 0)
    parts = []
    for source in node.inputs:
        shape = None if source is None else source.shape
        if source is None or shape is None or not -len(shape) <= axis < len(shape):
            return Producer("Concat", axis)
        size = shape[axis]
        if not isinstance(size, int):
            return Producer("Concat", axis)
        feeder, _, _, _ = through(source)
        parts.append((feeder.op_type if feeder is not None else "none", size))
    return Producer("Concat", axis, parts=tuple(parts))


def output_producers(model: ir.Model) -> dict[str, Producer | None]:
    """Each graph output's :class:`Producer` (None for an output that is a graph input or an initializer)."""
    opset = model.opset_imports.get("", 0)
    producers = {str(value.name): _producer(value, opset) for value in model.graph.outputs}
    transposed = {name: p.op == "Sigmoid" for name, p in producers.items() if p is not None and p.permuted}
    for head in heads(model, transposed):
        for name in head.members:
            producers[name] = dataclasses.replace(producers[name], head=head)  # type: ignore[type-var]
    return producers


@dataclass(frozen=True)
class OutputKind:
    """What an output is and the metric it is judged by (the table in the module docstring)."""

    kind: Kind
    metric: str
    axis: int | None = None
    """The axis of the argmax (classes, sequence, positions)."""
    why: str = ""
    time: int | None = None
    """A decoded sequence's time axis (0 for ``[T, N, C]``, 1 for ``[N, T, C]``)."""
    blank: int | None = None
    """A decoded sequence's blank class."""
    parts: tuple[tuple[int, int, int], ...] = ()
    """``part_cosine``: (axis, start, stop) of each part."""


def kind_of(
    name: str,
    shape: Sequence[int],
    floating: bool,
    producer: Producer | None,
    sample: np.ndarray | None = None,
    batch: int | None = None,
) -> OutputKind:
    """The kind of an output from its name, its (runtime) shape, dtype and producer, by the rules above.

    Args:
        sample: The float model's output (one batch): a sequence's blank and whether raw scores are a CTC head's.
        batch: The inputs' batch size: a sequence's time axis.
    """
    if not floating:
        return OutputKind("labels", "label_agreement", why="not a float output")
    rank = len(shape)
    op = producer.op if producer is not None else "none"
    if producer is not None and producer.head is not None:
        return OutputKind("detections", "box_agreement", why=producer.head.why)
    if producer is not None and op in _DISTRIBUTIONS and producer.axis is not None and rank:
        axis = producer.axis % rank if -rank <= producer.axis < rank else None
        if axis is not None and producer.flattens and any(d != 1 for d in shape[axis + 1 :]):
            axis = None  # normalized over several axes flattened: no one class axis
        if axis is not None and shape[axis] >= 2:
            why = f"{op} over axis {axis} of {list(shape)}"
            if axis == rank - 1 and rank <= 2:
                return OutputKind("classes", "top1", axis, why)
            if axis == rank - 1 and rank == 3:
                return _sequence(shape, sample, batch, why)
            return OutputKind("positions", "position_agreement", axis, why)
    if op == "Sigmoid":
        if rank <= 2:
            return OutputKind("binary", "decision_agreement", why=f"Sigmoid, {list(shape)}")
        if rank == 4 and not (producer is not None and producer.permuted):
            return OutputKind("regions", "region_agreement", why=f"Sigmoid map, {list(shape)}")
        return OutputKind("mask", "mask_iou", why=f"Sigmoid map, {list(shape)}")
    if producer is not None and producer.logged and rank:
        return OutputKind("signal", "snr", why=f"{op} of a Log, {list(shape)}: log-scale features")
    if producer is not None and op == "Concat" and producer.parts and rank:
        parts = _score_parts(producer, shape)
        if parts:
            ops = ", ".join(
                f"{o} [{start}:{stop}]" for o, (_, start, stop) in zip((p[0] for p in producer.parts), parts)
            )
            why = f"Concat of {ops} along axis {parts[0][0]}"
            if _boxes_then_scores(producer, parts, rank):
                return OutputKind("detections", "box_agreement", why=why, parts=parts)
            return OutputKind("values", "part_cosine", why=why, parts=parts)
    scores, not_scores = bool(_SCORES.search(name)), bool(_NOT_SCORES.search(name))
    if rank == 2 and shape[1] >= 2 and (op in _LINEAR or scores) and not not_scores:
        return OutputKind("classes", "top1", 1, f"logits from {op}" if op in _LINEAR else "named like scores")
    if rank == 3 and shape[2] >= 2 and (op in _LINEAR or scores) and not not_scores:
        share = _blank_share(sample)
        if shape[2] <= MAX_ALPHABET and share >= BLANK_SHARE:
            return _sequence(shape, sample, batch, f"{op} scores with a CTC blank ({100 * share:.0f} % of steps)")
        if scores:
            return OutputKind("sequence", "step_agreement", 2, "named like logits")
    waveform = rank in (2, 3) and shape[-1] >= MIN_SAMPLES and all(d == 1 for d in shape[1:-1])
    flattened = producer is not None and producer.merged
    if waveform and op not in _LINEAR and not not_scores and not flattened and _band_limited(sample):
        return OutputKind("signal", "snr", why=f"{op}, {list(shape)}: a waveform")
    return OutputKind("values", "cosine", why=f"{op}, {list(shape)}")


def _band_limited(sample: np.ndarray | None) -> bool:
    """Whether neighbouring values along the last axis correlate by at least :data:`MIN_CORRELATION` (False without
    a sample)."""
    if sample is None or sample.ndim < 1 or sample.shape[-1] < 2:
        return False
    rows = np.asarray(sample, dtype=np.float64).reshape(-1, sample.shape[-1])
    rows = rows - rows.mean(axis=-1, keepdims=True)
    power = float(np.sum(rows * rows))
    return power > 0 and float(np.sum(rows[:, 1:] * rows[:, :-1])) >= MIN_CORRELATION * power


def _boxes_then_scores(producer: Producer, parts: tuple[tuple[int, int, int], ...], rank: int) -> bool:
    """Whether a rank-3 Concat's parts are 4 box values, then scores only."""
    scores = [op in _DISTRIBUTIONS or op == "Sigmoid" for op, _ in producer.parts]
    first = scores.index(True)
    return rank == 3 and parts[first][1] == 4 and all(scores[first:])


def _score_parts(producer: Producer, shape: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """The parts of a Concat of scores beside other values whose sizes add up to the output's (else none)."""
    rank, axis = len(shape), producer.axis if producer.axis is not None else 0
    ops = {op for op, _ in producer.parts}
    if not -rank <= axis < rank or len(ops) < 2 or not ops & ({"Sigmoid"} | _DISTRIBUTIONS):
        return ()
    axis %= rank
    if sum(size for _, size in producer.parts) != shape[axis]:
        return ()
    bounds, start = [], 0
    for _, size in producer.parts:
        bounds.append((axis, start, start + size))
        start += size
    return tuple(bounds)


def _blank_share(sample: np.ndarray | None) -> float:
    """The share of steps whose argmax is the commonest one (0 without a sample)."""
    if sample is None or sample.ndim < 1 or not sample.size:
        return 0.0
    counts = np.bincount(np.argmax(sample, axis=-1).ravel())
    return float(counts.max()) / float(counts.sum())


def _sequence(shape: Sequence[int], sample: np.ndarray | None, batch: int | None, why: str) -> OutputKind:
    """A ``[N, T, C]`` or ``[T, N, C]`` sequence judged by its decoded strings (the module docstring)."""
    time = 0 if batch is not None and shape[1] == batch and shape[0] != batch else 1
    blank = 0
    if sample is not None and sample.size:
        blank = int(np.bincount(np.argmax(sample, axis=-1).ravel()).argmax())
    layout = "[T, N, C]" if time == 0 else "[N, T, C]"
    return OutputKind("sequence", "string_agreement", 2, f"{why}; {layout}, blank {blank}", time, blank)


def batch_size(feeds: Mapping[str, Any]) -> int | None:
    """The batch size of a run: the first axis of its first input that has one."""
    for value in feeds.values():
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    return None


@dataclass(frozen=True)
class OutputMetric:
    """One output's task metric and errors against the float model.

    Attributes:
        value: The metric (a share in [0, 1], or the cosine); None when nothing was compared.
        count: How many rows, steps, positions, decisions, pixels, labels or values were compared.
        rel_l2: Relative L2 error (None for integer outputs).
        cosine: Cosine similarity (None for integer outputs).
        observed: A sequence's share of identical strings (a detection head's of boxes matched) as counted, when
            ``value`` is the lower share the steps' margins predict (:class:`StepMargins`; the boxes' score margins,
            :class:`~onnxprec.accuracy._boxes.ScoreMargins`, when fewer than ``MIN_BOXES`` were seen).
        empty: A sequence whose float strings all decode empty (random inputs a recognizer reads as blanks): the
            agreement says little of real text, and :meth:`describe` says so.
    """

    name: str
    kind: Kind
    metric: str
    value: float | None
    count: int
    rel_l2: float | None
    cosine: float | None
    why: str = ""
    observed: float | None = None
    empty: bool = False

    def describe(self) -> str:
        label, unit = _LABELS[self.metric]
        if self.value is None:
            return f"{self.name} {label} n/a"
        if self.metric in ("cosine", "part_cosine"):
            shown = _cosine_text(self.value)
        elif self.metric == "snr":
            shown = f"{self.value:.1f} dB"
        else:
            shown = f"{self.value:.4f}" if self.metric == "mask_iou" else f"{100 * self.value:.1f}%"
        empty = " (every FP32 string empty: nothing read)" if self.empty else ""
        if self.observed is not None:
            margins = "score" if self.metric in ("box_agreement", "mask_iou") else "step"
            return f"{self.name} {label} {shown} of {self.count} {unit} predicted from {margins} margins " \
                   f"({100 * self.observed:.1f}% seen){empty}"  # fmt: skip
        return f"{self.name} {label} {shown} of {self.count} {unit}{empty}"


def _cosine_text(value: float) -> str:
    """A cosine near 1 as ``1 - 3.2e-07`` (``0.999999`` would read as 1)."""
    if value >= 1:
        return "1"
    return f"1 - {1 - value:.2g}" if value >= 0.9999 else f"{value:.5f}"


def _number(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class TaskSummary:
    """The task metric of every output, and the worst relative L2 and cosine over the float outputs."""

    outputs: tuple[OutputMetric, ...]

    @property
    def worst_rel_l2(self) -> float | None:
        values = [o.rel_l2 for o in self.outputs if o.rel_l2 is not None]
        return max(values) if values else None

    @property
    def worst_cosine(self) -> float | None:
        values = [o.cosine for o in self.outputs if o.cosine is not None]
        return min(values) if values else None

    def describe(self, limit: int = 3) -> str:
        """One line: the task metrics (worst first, at most ``limit``), then the float outputs' worst errors; a
        decoder's KV cache outputs (:func:`is_state`) stay in :meth:`to_json` only, unless nothing else was compared."""
        judged = TaskSummary(tuple(o for o in self.outputs if not is_state(o.name)))
        judged = judged if judged.outputs else self
        tasks = sorted(
            (o for o in judged.outputs if o.metric != "cosine"),
            key=lambda o: (o.value is not None, 0.0 if o.value is None else o.value),
        )
        parts = [o.describe() for o in tasks[:limit]]
        if len(tasks) > limit:
            parts.append(f"{len(tasks) - limit} more")
        rel_l2, cosine = judged.worst_rel_l2, judged.worst_cosine
        if rel_l2 is not None and cosine is not None:
            parts.append(f"float outputs rel L2 <= {rel_l2:.4g}, cosine >= {_cosine_text(cosine)}")
        return "; ".join(parts) or "no output compared"

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": {
                o.name: {
                    "kind": o.kind,
                    "metric": o.metric,
                    "value": _number(o.value),
                    "count": o.count,
                    "rel_l2": _number(o.rel_l2),
                    "cosine": _number(o.cosine),
                    "why": o.why,
                    **({"observed": o.observed} if o.observed is not None else {}),
                    **({"empty": True} if o.empty else {}),
                }
                for o in self.outputs
            },
            "worst_rel_l2": _number(self.worst_rel_l2),
            "worst_cosine": _number(self.worst_cosine),
        }


class TaskMetrics:
    """Streams batches of float and candidate outputs into each output's task metric (:func:`kind_of`, decided on
    the first batch's float output) and errors.

    Args:
        producers: Each output's producer in the float model (:func:`output_producers`); outputs not named here
            are judged by their name and shape alone.
    """

    def __init__(self, producers: Mapping[str, Producer | None]) -> None:
        self.producers = dict(producers)
        self.kinds: dict[str, OutputKind] = {}
        self._errors: dict[str, ErrorStats] = {}
        self._hits: dict[str, float] = {}  # agreeing positions (IoU: intersection)
        self._counts: dict[str, int] = {}  # positions compared (IoU: union)
        self._seen: dict[str, int] = {}
        self._margins: dict[str, StepMargins] = {}
        self._part_errors: dict[tuple[str, int], ErrorStats] = {}
        self._boxes: dict[str, np.ndarray] = {}  # per threshold: [matched, compared]
        self._box_margins: dict[str, ScoreMargins] = {}
        self._mask_margins: dict[str, MaskMargins] = {}
        self._spoken: dict[str, int] = {}  # decoded sequences: the float strings that are not empty
        self._heads = {p.head.name: p.head for p in self.producers.values() if p is not None and p.head is not None}
        self._head_of = {member: head.name for head in self._heads.values() for member in head.members}

    @classmethod
    def of(cls, model: ir.Model) -> TaskMetrics:
        return cls(output_producers(model))

    def update(
        self, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], batch: int | None = None
    ) -> None:
        """Adds one batch: output name -> array, for the float model and the candidate (missing ones skipped);
        ``batch``, the inputs' batch size (:func:`batch_size`), tells a sequence's time axis."""
        decoded = self._decode(reference)
        for name, ref in reference.items():
            if name not in candidate:
                continue
            ref, cand = np.asarray(ref), np.asarray(candidate[name])
            if ref.dtype == object and ref.size and not isinstance(ref.flat[0], (str, bytes)):
                continue  # a sequence of maps (ZipMap's probabilities): no array to compare
            floating = np.issubdtype(ref.dtype, np.floating)
            kind = self.kinds.get(name)
            if kind is None:
                kind = self.kinds[name] = kind_of(name, ref.shape, floating, self.producers.get(name), ref, batch)
            if floating:
                self._errors.setdefault(name, ErrorStats()).update(ref, cand.astype(np.float32))
            for i, (axis, start, stop) in enumerate(kind.parts if ref.shape == cand.shape else ()):
                part = tuple(slice(start, stop) if d == axis else slice(None) for d in range(ref.ndim))
                self._part_errors.setdefault((name, i), ErrorStats()).update(ref[part], cand[part].astype(np.float32))
            if kind.kind == "regions":  # a candidate of another shape finds none of the float regions
                found = region_counts(ref, cand) if ref.shape == cand.shape else region_counts(ref, ref) * [0, 1]
                self._boxes[name] = self._boxes.get(name, 0) + found
            if kind.kind == "detections" and name not in self._head_of:
                scores = tuple((start, stop) for _, start, stop in kind.parts if start >= 4)  # the box is [0:4]
                margins = self._box_margins.setdefault(name, ScoreMargins())
                self._boxes[name] = self._boxes.get(name, 0) + tally(ref, cand, kind.parts[0][0], scores, margins)
            if kind.kind == "mask" and ref.shape == cand.shape:
                self._mask_margins.setdefault(name, MaskMargins()).update_map(ref, cand)
            if kind.time is not None and ref.shape == cand.shape and ref.ndim == 3:
                blank = kind.blank if kind.metric == "string_agreement" else None
                self._margins.setdefault(name, StepMargins(blank)).update(ref, cand, kind.time)
            if kind.metric == "string_agreement" and kind.time is not None and kind.blank is not None and ref.ndim == 3:
                spoken = sum(1 for string in ctc_strings(ref, kind.time, kind.blank) if string)
                self._spoken[name] = self._spoken.get(name, 0) + spoken
            hits, count = _agreement(kind, ref, cand)
            self._hits[name] = self._hits.get(name, 0) + hits
            self._counts[name] = self._counts.get(name, 0) + count
            self._seen[name] = self._seen.get(name, 0) + _positions(kind, ref)
        for name, ref_rows in decoded.items():  # a split head's boxes, decoded from all its outputs
            head, cand_rows = self._heads[name], self._heads[name].rows(candidate)
            cand_rows = ref_rows[:0] if cand_rows is None else cand_rows  # another shape: every float box lost
            margins = self._box_margins.setdefault(name, ScoreMargins(head.thresholds))
            counts = tally(ref_rows, cand_rows, 2, head.score_parts(ref_rows.shape[2]), margins, head.sizes)
            self._boxes[name] = self._boxes.get(name, 0) + counts

    def _decode(self, reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each head's float rows; a head whose float outputs do not decode on the first batch that has them is
        dropped (one WARNING): each of its outputs is judged by its own kind, as if no head had been found. A later
        batch that does not decode is not judged by the head's boxes (one WARNING)."""
        decoded = {name: rows for name, head in self._heads.items() if (rows := head.rows(reference)) is not None}
        for name, head in list(self._heads.items()):
            shapes = ", ".join(f"{m} {list(np.shape(reference[m]))}" for m in head.members if m in reference)
            if name in decoded or not shapes:
                continue
            if any(m in self.kinds for m in head.members):
                tell(head, f"{head.why}: a batch's float outputs ({shapes}) do not decode; its boxes are not judged")
                continue
            del self._heads[name]
            self._head_of = {member: owner for member, owner in self._head_of.items() if owner != name}
            self.producers.update({m: dataclasses.replace(p, head=None) for m in head.members if (
                p := self.producers.get(m)) is not None})  # fmt: skip
            tell(head, f"{head.why}: the float outputs ({shapes}) do not decode; each output is judged alone")
        return decoded

    def summary(self) -> TaskSummary:
        outputs = []
        for name, kind in self.kinds.items():
            if self._head_of.get(name, name) != name:
                continue  # a split head's other outputs: judged with it, their errors in its own
            errors = [self._errors[n] for n in self._heads[name].members if n in self._errors] if (
                name in self._heads) else [self._errors[name]] if name in self._errors else []  # fmt: skip
            rel_l2 = max((e.rel_l2 for e in errors), default=None)
            cosine = min((e.cosine for e in errors), default=None)
            value: float | None
            count = self._seen[name]
            if kind.kind in ("detections", "regions") and name in self._boxes:  # the worst threshold, in boxes
                shares = [float(m) / float(n) if n else 1.0 for m, n in self._boxes[name]]
                worst = int(np.argmin(shares))
                value, count = shares[worst], int(self._boxes[name][worst][1])
            elif kind.kind == "signal":
                value = None if rel_l2 is None else (-20 * math.log10(rel_l2) if rel_l2 > 0 else math.inf)
            elif kind.parts:
                value = min((e.cosine for (n, _), e in self._part_errors.items() if n == name), default=cosine)
            elif kind.kind == "values":
                value = cosine
            elif kind.kind == "mask":
                value = self._hits[name] / self._counts[name] if self._counts[name] else 1.0
            else:
                value = self._hits[name] / self._counts[name] if self._counts[name] else None
            observed = None
            predicted = self._margins[name].predicted() if name in self._margins else None
            if name in self._box_margins and count < MIN_BOXES:  # few boxes seen: their score margins too
                predicted = self._box_margins[name].predicted()
            if name in self._mask_margins:
                predicted = self._mask_margins[name].predicted()
            if value is not None and predicted is not None and predicted < value:
                value, observed = predicted, value
            empty = name in self._spoken and not self._spoken[name]
            outputs.append(OutputMetric(
                name, kind.kind, kind.metric, value, count, rel_l2, cosine, kind.why, observed, empty
            ))  # fmt: skip
        return TaskSummary(tuple(outputs))


def _positions(kind: OutputKind, ref: np.ndarray) -> int:
    """What a batch adds to an output's count: sequences, rows, steps or positions for an argmax, else elements."""
    if kind.time is not None and ref.ndim == 3:
        return int(ref.shape[1 - kind.time])
    if kind.axis is not None and ref.ndim:
        return ref.size // ref.shape[kind.axis]
    return int(ref.size)


def _agreement(kind: OutputKind, ref: np.ndarray, cand: np.ndarray) -> tuple[float, int]:
    """(agreeing, compared) of one batch; for a mask, (intersection, union)."""
    if kind.time is not None and kind.blank is not None and ref.ndim == 3:
        if ref.shape != cand.shape:
            return 0.0, int(ref.shape[1 - kind.time])
        pairs = zip(ctc_strings(ref, kind.time, kind.blank), ctc_strings(cand, kind.time, kind.blank))
        equal = [r == c for r, c in pairs]
        return float(sum(equal)), len(equal)
    if kind.axis is not None and ref.ndim:
        same = np.argmax(ref, axis=kind.axis) == np.argmax(cand, axis=kind.axis)
        return float(same.sum()), int(same.size)
    if kind.kind == "binary":
        same = (ref >= 0.5) == (cand >= 0.5)
        return float(same.sum()), int(same.size)
    if kind.kind == "mask":
        r, c = ref >= 0.5, cand >= 0.5
        return float((r & c).sum()), int((r | c).sum())
    if kind.kind == "labels":
        same = ref == cand if ref.shape == cand.shape else np.zeros(ref.shape, bool)
        return float(same.sum()), int(same.size)
    return 0.0, 0


def task_metrics(
    model: ir.Model,
    references: Iterable[Mapping[str, np.ndarray]],
    candidates: Iterable[Mapping[str, np.ndarray]],
    batches: Iterable[int | None] = (),
) -> TaskSummary:
    """The task metrics of a candidate's outputs against the float ``model``'s, batch by batch (``batches``: each
    batch's inputs' batch size, :func:`batch_size`, which tells a ``[T, N, C]`` sequence's time axis)."""
    metrics = TaskMetrics.of(model)
    sizes = iter(batches)
    for reference, candidate in zip(references, candidates):
        metrics.update(reference, candidate, next(sizes, None))
    return metrics.summary()
