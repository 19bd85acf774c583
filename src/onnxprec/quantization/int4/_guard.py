"""INT4's accuracy guard: the result measured against the float model by each output's task metric, and the layers
that miss it kept at 8 bits or in float.

For a model that is not a language model and whose float weights hold at most :data:`MAX_GUARD_BYTES`, the result
(in memory, its weights quantized as it is serialized) and the float model run on every calibration batch (on
synthetic inputs without data: :class:`~onnxprec.calibration_data.CalibrationData`'s random data) and are judged by
:data:`BOUNDS` (INT8's guard bounds, :mod:`onnxprec.quantization.guard`: top-1 agreement >= 0.98 for class scores,
identical CTC strings >= 0.99...; plain float values cosine >= 0.95). When the result misses them, the 4-bit weights
with the largest relative error go to 8 bits, 1, 2, 4... of them and then all, each candidate a new run of the
pipeline; then to float, within :data:`MAX_FLOAT_SHARE` of the quantized weights' float bytes. The first candidate
that keeps the bounds is the result; when none does, the last is, and the report's ``guard_failure`` line makes the
tool raise :class:`~onnxprec.errors.AccuracyGuardError` once it is written (exit 3).

A result that keeps :data:`BOUNDS` but leaves an embedding (a ``[N, D]`` float output judged by cosine: one vector a
sample, as a sentence encoder's pooled output) under INT8's cosine >= 0.99 (:data:`EMBEDDING_BOUND`) is raised to it:
the same search goes on from that result, each candidate adding at most :data:`MAX_RAISE_SHARE` of the float model's
weight bytes; the summary says what the raise kept wider and what it cost. When no candidate within that cost reaches
it, the tool refuses (``guard_failure``, exit 3) with the last candidate within the cost written for inspection.
Hidden states (``[N, T, D]``, a token per row) keep INT4's 0.95.

A language model, or a larger model, keeps the cheap check on the written result (:func:`check_written`: its first
calibration batch, warn only): the guard would hold a second whole-model session and run the pipeline again.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from onnxprec import calibration
from onnxprec._io import ModelSource, load_model
from onnxprec._report import timed
from onnxprec.accuracy import output_producers
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import OnnxprecError
from onnxprec.quantization import guard
from onnxprec.reference import run_reference
from onnxprec.validate import task_check

if TYPE_CHECKING:
    from pathlib import Path

    import onnx_ir as ir

    from onnxprec.accuracy import TaskSummary
    from onnxprec.quantization.int4._options import Int4Options
    from onnxprec.quantization.int4._report import Int4Report

__all__ = [
    "BOUNDS",
    "EMBEDDING_BOUND",
    "MAX_FLOAT_SHARE",
    "MAX_GUARD_BYTES",
    "MAX_RAISE_SHARE",
    "Pipeline",
    "check_written",
    "guarded",
]

logger = logging.getLogger(__name__)

MAX_GUARD_BYTES = 1 << 30
"""Float weight bytes above which the guard does not run (a second whole-model session and pipeline run)."""

MAX_FLOAT_SHARE = 0.25
"""The share of the quantized weights' float bytes the guard may keep in float (INT8's ``max_float_compute``)."""

BOUNDS: dict[str, float] = {**guard.DEFAULT_BOUNDS, "values": 0.95}
"""INT4's bounds: INT8's per output kind (each a task metric: classes, strings, boxes, SNR...), except plain float
outputs (an encoder's embedding, a hidden state), held to cosine >= 0.95 rather than 0.99: four-bit weights round
about 16 times as coarsely as eight-bit ones. The measurement behind it: experiments/design_notes.md, "INT4 accuracy
guard"."""

EMBEDDING_BOUND = guard.DEFAULT_BOUNDS["values"]
"""The cosine an embedding output is raised to (INT8's, issue 24's embedding bound; the module docstring)."""

MAX_RAISE_SHARE = 1 / 16
"""The most bytes the raise to :data:`EMBEDDING_BOUND` may add to the INT4 result, as a share of the float model's
weight bytes: half of the 1/8 of a weight's float bytes that 8 bits add over 4, so the result stays nearer INT4's size
than INT8's."""

Pipeline = Callable[[ModelSource, "Int4Options", Mapping[str, int]], tuple["ir.Model", "Int4Report"]]
"""The INT4 pipeline with each named weight's precision (8 bits, or 0 for float) set."""


_Result = tuple["ir.Model", "Int4Report", guard.Checked]
"""A candidate: the model, its report and its measurement."""


class _CandidateFailed(Exception):
    """A candidate of the fallback that the pipeline could not build (recorded as a failed step)."""


@dataclasses.dataclass
class _Search:
    """The guard's state over one set of data."""

    source: ModelSource
    options: Int4Options
    pipeline: Pipeline
    data: CalibrationData
    kept: guard.BoundedOutputs
    producers: Mapping[str, Any]
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    last: _Result | None = None  # the last candidate built (within max_cost)
    raised: tuple[str, ...] = ()  # the embedding outputs held to EMBEDDING_BOUND
    base: Int4Report | None = None  # the result the cost of a candidate is counted from
    max_cost: float | None = None  # the most bytes a candidate may add to ``base``, or None

    def measure(self, model: ir.Model) -> guard.Checked:
        return guard.measure_task(model, self.kept, self.producers, list(self.options.calibration_eps), bounds=BOUNDS)

    def holds(self, checked: guard.Checked) -> bool:
        """Whether ``checked`` keeps :data:`BOUNDS` and, raising, :data:`EMBEDDING_BOUND` on :attr:`raised`."""
        return checked.ok and not guard.short_of_defaults(checked.summary, BOUNDS, self.raised)

    def embeddings(self) -> tuple[str, ...]:
        """The float outputs that are embeddings (``[N, D]``, D > 1, judged by cosine: module docstring)."""
        first = self.kept.outputs[0] if self.kept.outputs else {}
        return tuple(name for name, array in first.items() if getattr(array, "ndim", 0) == 2 and array.shape[-1] > 1
                     and array.dtype.kind == "f")  # fmt: skip

    def over_cost(self, report: Int4Report) -> str:
        """Why ``report``'s result adds more than :attr:`max_cost` bytes to :attr:`base`'s; empty when it does not."""
        if self.base is None or self.max_cost is None or _cost(self.base, report) <= self.max_cost:
            return ""
        return f"+{_cost(self.base, report) / 1e6:.3g} MB, over the raise's {self.max_cost / 1e6:.3g} MB"

    def candidate(self, precisions: Mapping[str, int]) -> tuple[ir.Model, Int4Report, guard.Checked]:
        options = copy.copy(self.options)  # not dataclasses.replace: the data is read already
        options.calibration_data_reader = None if self.data.random else self.data
        eight = sorted(name for name, bits in precisions.items() if bits == 8)
        floats = sorted(name for name, bits in precisions.items() if bits == 0)
        try:
            model, report = self.pipeline(self.source, options, precisions)
        except OnnxprecError as e:  # e.g. a size budget these precisions cannot meet: the search ends here
            self.steps.append({"8bit": eight, "float": floats, "metric": f"not built: {e}", "ok": False})
            logger.warning("INT4 accuracy guard: %d weights at 8 bits, %d in float: not built (%s)", len(eight),
                           len(floats), e)  # fmt: skip
            raise _CandidateFailed from e
        over = self.over_cost(report)
        if over:
            self.steps.append({"8bit": eight, "float": floats, "metric": f"not measured: {over}", "ok": False})
            logger.info("INT4 accuracy guard: %d weights at 8 bits, %d in float: %s", len(eight), len(floats), over)
            raise _CandidateFailed
        checked = self.measure(model)
        self.last = (model, report, checked)
        self.steps.append({"8bit": eight, "float": floats, "metric": checked.summary.describe(),
                           "ok": self.holds(checked)})  # fmt: skip
        logger.info("INT4 accuracy guard: %d weights at 8 bits, %d in float: %s", len(eight), len(floats),
                    checked.summary.describe())  # fmt: skip
        return model, report, checked


def guarded(source: ModelSource, options: Int4Options, model: ir.Model, report: Int4Report,
            pipeline: Pipeline) -> tuple[ir.Model, Int4Report]:  # fmt: skip
    """The guard on the pipeline's result (the module docstring). Returns the result the guard chose, with its report
    (``check`` with each candidate in its ``steps`` and, when no candidate kept the bounds, ``guard_failure``); a
    guard that cannot read the data again (a one-shot reader) is skipped with a WARNING, leaving the check on the
    written result."""
    with timed() as clock:
        float_model = load_model(source)  # the file again: the pipeline rewrote its copy
        try:
            args = CalibrationArgs(
                options.calibration_data_reader, options.input_shapes, options.calibration_batch_size
            )
            model, report = args.run(
                float_model, lambda data: _guard(source, options, model, report, pipeline, float_model, data)
            )
        except OnnxprecError as e:
            logger.warning("INT4 accuracy guard not run (%s): the written result is checked on one batch", e)
    report.seconds["accuracy guard"] = clock.seconds
    return model, report


def _guard(source: ModelSource, options: Int4Options, model: ir.Model, report: Int4Report, pipeline: Pipeline,
           float_model: ir.Model, data: CalibrationData) -> tuple[ir.Model, Int4Report]:  # fmt: skip
    providers = list(options.calibration_eps)
    kept = guard.BoundedOutputs()
    run_reference(float_model, data, select=(), observers=[kept.observer(float_model, data)], providers=providers,
                  what="the float model")  # fmt: skip
    search = _Search(source, options, pipeline, data, kept, output_producers(float_model))
    checked = search.measure(model)
    first, base = checked, report
    if not checked.ok:
        model, report, checked = _fallback(search, model, report, checked)
    short = guard.short_of_defaults(checked.summary, BOUNDS, search.embeddings()) if checked.ok else ""
    if short:
        model, report, checked = _raise(search, base, (model, report, checked), _weight_bytes(float_model))
    _record(
        report,
        checked,
        data,
        [{"8bit": [], "float": [], "metric": first.summary.describe(), "ok": first.ok}, *search.steps],
        search,
    )
    if short and search.holds(checked):
        report.check["raised"] = _raised(base, report, _weight_bytes(float_model))
    elif short:
        assert search.max_cost is not None
        report.guard_failure = (
            f"INT4 result under INT8's guard bound ({short}): no candidate within the raise's "
            f"+{search.max_cost / 1e6:.3g} MB ({MAX_RAISE_SHARE:.2%} of the float model's weights) reaches it; with "
            f"{_held(search.steps, built=True)}: {checked.summary.describe()}; --layers_8bit or --nodes_to_exclude "
            "keep layers wider, --no_accuracy_guard accepts the result"
        )
    elif not checked.ok:
        where = "synthetic inputs: pass representative inputs (--calibration_data)" if data.random else (
            "calibration data")  # fmt: skip
        report.guard_failure = (
            f"INT4 result misses the accuracy guard ({guard.describe_bounds(checked.summary, bounds=BOUNDS)}): "
            f"{first.summary.describe()} on {where}; with {_held(search.steps)} still {checked.summary.describe()}; "
            "--layers_8bit or --nodes_to_exclude keep layers wider, --no_accuracy_guard accepts the result"
        )
    return model, report


def _fallback(search: _Search, model: ir.Model, report: Int4Report,
              checked: guard.Checked) -> tuple[ir.Model, Int4Report, guard.Checked]:  # fmt: skip
    """The 4-bit weights with the largest relative error to 8 bits (1, 2, 4... then all), then to float within
    :data:`MAX_FLOAT_SHARE`: the first candidate that keeps the bounds, else the last one."""
    four = [entry for entry in report.layers if entry.bits == 4]
    ranked = [e.weight for e in sorted(four, key=lambda e: -float(e.info.get("weight_rel_error", 0.0)))]
    sizes = {e.weight: e.k * e.n for e in four}
    fixed = {e.weight: 8 for e in report.layers if e.bits == 8}  # the pipeline's own 8-bit choices stay
    if search.base is not None:  # raising: the weights the search before kept in float stay there
        fixed.update(dict.fromkeys({e.weight for e in search.base.layers} - {e.weight for e in report.layers}, 0))
    best = (model, report, checked)
    try:
        return _candidates(search, ranked, sizes, fixed, best)
    except _CandidateFailed:
        return search.last or best


def _candidates(
    search: _Search, ranked: list[str], sizes: dict[str, int], fixed: dict[str, int], best: _Result
) -> _Result:
    """The fallback's candidates in order (:func:`_fallback`); the first that keeps the bounds, else the last."""
    for count in _counts(len(ranked)):
        best = search.candidate({**fixed, **dict.fromkeys(ranked[:count], 8)})
        if search.holds(best[2]):
            return best
    budget = MAX_FLOAT_SHARE * sum(sizes.values())
    for count in _counts(len(ranked)):
        if sum(sizes[name] for name in ranked[:count]) > budget:
            break
        best = search.candidate({**fixed, **dict.fromkeys(ranked, 8), **dict.fromkeys(ranked[:count], 0)})
        if search.holds(best[2]):
            return best
    return best


def _raise(search: _Search, base: Int4Report, result: _Result, float_bytes: int) -> _Result:
    """The search again from ``result`` (which keeps :data:`BOUNDS`) with the embeddings held to
    :data:`EMBEDDING_BOUND`, each candidate within :data:`MAX_RAISE_SHARE` of ``float_bytes`` over ``base``: the first
    that holds, else the last built within that cost (``result`` when none is)."""
    model, report, checked = result
    search.raised, search.base, search.max_cost = search.embeddings(), base, MAX_RAISE_SHARE * float_bytes
    search.last = None
    logger.info("INT4 accuracy guard: raising %s to INT8's cosine >= %g within +%.3g MB", ", ".join(search.raised),
                EMBEDDING_BOUND, search.max_cost / 1e6)  # fmt: skip
    return _fallback(search, model, report, checked)


def _stored(report: Int4Report) -> int:
    """The bytes the quantizable weights take in ``report``'s result (quantized, and those the guard kept in float)
    less their float bytes, a constant of the model: only the difference of two results' values means anything."""
    return report.quantized_bytes - report.float_bytes


def _cost(base: Int4Report, report: Int4Report) -> int:
    """The bytes ``report``'s result adds to ``base``'s."""
    return _stored(report) - _stored(base)


def _weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def _raised(base: Int4Report, report: Int4Report, float_bytes: int) -> str:
    """The summary's phrase for a result the guard raised to INT8's cosine bound: what it kept wider, what it cost."""
    eight = sum(1 for e in report.layers if e.bits == 8) - sum(1 for e in base.layers if e.bits == 8)
    floats = len(base.layers) - len(report.layers)
    cost = _cost(base, report)
    return (f"raised to INT8's cosine >= {EMBEDDING_BOUND:g}: the guard kept {eight} weights at 8 bits and "
            f"{floats} in float, +{cost / 1e6:.3g} MB ({cost / float_bytes:.2%} of the float model's "
            f"{float_bytes / 1e6:.3g} MB)")  # fmt: skip


def _counts(total: int) -> list[int]:
    """1, 2, 4... up to ``total``, and ``total``."""
    counts, count = [], 1
    while count < total:
        counts.append(count)
        count *= 2
    return [*counts, total] if total else []


def _held(steps: list[dict[str, Any]], built: bool = False) -> str:
    """The last step's weights at 8 bits and in float (``built``: the last step measured)."""
    if built:
        steps = [step for step in steps if not str(step["metric"]).startswith("not ")]
    last = steps[-1] if steps else {"8bit": [], "float": []}
    return f"{len(last['8bit'])} weights at 8 bits and {len(last['float'])} in float"


def _short_of_int8(summary: TaskSummary) -> dict[str, str]:
    """``short_of_int8`` for a report's ``check`` when an output keeps INT4's bound but not INT8's (an embedding
    between cosine 0.95 and 0.99: :func:`onnxprec.quantization.guard.short_of_defaults`), the summary says it."""
    short = guard.short_of_defaults(summary, BOUNDS)
    if not short:
        return {}
    return {"short_of_int8": f"{short} (INT4 accepts cosine >= {BOUNDS['values']:g}; --layers_8bit keeps layers at "
                             "8 bits)"}  # fmt: skip


def _record(report: Int4Report, checked: guard.Checked, data: CalibrationData, steps: list[dict[str, Any]],
            search: _Search) -> None:  # fmt: skip
    bound = guard.describe_bounds(checked.summary, bounds=BOUNDS)
    if search.raised:
        bound += "; raised: " + ", ".join(f"{name} cosine >= {EMBEDDING_BOUND:g}" for name in search.raised)
    report.check = {
        "random_data": data.random,
        "guard": "on",
        "bound": bound,
        "passed": search.holds(checked),
        "calibration": checked.to_json(),
        "held_out": None,
        "steps": steps,
        **_short_of_int8(checked.summary),
    }


def check_written(source: Path, written: Path, options: Int4Options, report: Int4Report) -> bool:
    """Where the accuracy guard did not measure the result (a language model, a larger model, the guard off): measures
    the written INT4 model against the float one on the first calibration batch (realistic random data without one)
    with each output's task metric; a result that misses INT4's guard bounds (:data:`BOUNDS`) is
    warned about in one line, and so is a measurement that cannot run: the output is written either way. Returns
    whether the output ran."""
    if report.check.get("guard") == "on":  # the accuracy guard measured it, on every batch
        return False
    shapes = calibration.parse_input_shapes(options.input_shapes) or None
    try:
        summary, random = task_check(load_model(source), written, options.calibration_data_reader,
                                     providers=list(options.calibration_eps), input_shapes=shapes,
                                     segment_bytes=options.check_segment_bytes)  # fmt: skip
    except OnnxprecError as e:  # the check is information (a one-shot reader, say, was read by the quantization)
        logger.warning("INT4 result not measured against the float model: %s", e)
        return False
    passed = guard.holds(summary, bounds=BOUNDS)
    report.check = {
        "random_data": random,
        "guard": "warn",
        "bound": guard.describe_bounds(summary, bounds=BOUNDS),
        "passed": passed,
        "calibration": {"runs": 1, "metric": summary.describe(), **summary.to_json()},
        "held_out": None,
        **_short_of_int8(summary),
    }
    if not passed:
        where = "random data" if random else "the first calibration batch"
        logger.warning("INT4 result misses the accuracy bound (%s): %s on %s", report.check["bound"],
                       summary.describe(), where)  # fmt: skip
    return True
