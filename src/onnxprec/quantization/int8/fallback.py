"""Automatic float fallback: the most sensitive INT8 layers go back to float until an accuracy target holds.

The target is AutoCast's (``rel_l2<=0.03``, ``cosine>=0.999``, ``top1>=0.99``, ``max_abs<=...``, or a callback),
checked on the calibration data against the float model's outputs kept from the calibration pass. Each check builds
the INT8 model for real (the decisions applied to a copy of the float model) and runs it in ONNX Runtime with its
fusions, as the user will: what is measured is what is saved.

1. The all-INT8 model is checked; if it meets the target, nothing changes.
2. Sensitivity (the sensitivity engine, :mod:`onnxprec.sensitivity`): with at most :data:`MAX_ISOLATED` layers whose
   checks fit in :data:`ISOLATED_MULTIPLY_ADDS`, how much the output error drops when that layer alone goes back to
   float (:func:`~onnxprec.sensitivity.isolated_gains`: one check per layer; it sees the interactions that the error
   of a layer quantized alone misses); with more, an estimate (:func:`estimated_sensitivity`): the layer's own output
   error on the calibration sample where the channel decisions measured it, else the Hessian-weighted error of its
   INT8 weight (:func:`~onnxprec.sensitivity.hessian_loss` with the ``XᵀX`` the observers collected, unweighted
   without it). With ``max_float_compute``, only the most sensitive layers that fit in that share of the
   multiply-adds (:func:`~onnxprec.sensitivity.within`).
3. How many of the most sensitive layers go back to float (:func:`~onnxprec.sensitivity.fewest`): 1, 2, 4...
   until the target holds, then a bisection in between (about ``2 log2(count)`` checks) finds the fewest that
   meet it. Under the accuracy guard, which may go beyond ``max_float_compute``, all the layers within it are
   checked first; when they miss, so do the most that may go back beyond it (every layer but one) before a
   bisection between them: a guard that misses costs two checks, not a search.
4. When that misses too and an output is judged by regions, each layer's own error (it alone INT8, every other
   layer float: one real check per layer, within the same limits) ranks them again and the same
   search runs on that order (:func:`_alone_first`): a gain measured from the all-INT8 model hides the layers whose
   error the others drown.
5. When every layer but one in float still misses (and the own errors did not rank them, which checks those sets
   already), the one or two layers left quantized break the result alone, which an estimate that counts weight
   error only can rank last: they go first and the same search runs on that order (:func:`_left_first`; two are
   ranked by their own errors first, and one that holds alone goes last).

When every layer is dynamic (ort-cpu's MatMulInteger layers: transformers), steps 2 and 3 run in one emulation session
(:class:`~onnxprec.quantization.int8.emulation.Int8Emulator`, a configuration is a set of boolean inputs, trying one is
a ``session.run`` per batch), their verdicts scaled to the real error of the all-INT8 model
(:class:`~onnxprec.accuracy.ErrorScale`), and the choice is checked for real; if it misses, more layers go back with
real checks (:func:`~onnxprec.accuracy.confirm`, at most :data:`~onnxprec.accuracy.MAX_REAL_CHECKS`). A model whose
quantized layers hold more than :data:`EMULATION_MAX_BYTES` of float weights keeps real checks: the emulation session
holds the float model and the emulated weights in float, where the INT8 sessions of real checks hold a quarter of the
weights. Static layers keep real checks: ONNX Runtime's fused kernels (QLinearConv's requantization) differ from the
Q/DQ arithmetic by as much as one layer's gain, and there an emulated check (both paths of every layer in float) is
slower than a real one. How well the emulation matches, and what it saves: experiments/design_notes.md, "INT8 float
fallback" (``python -m experiments.int8_emulation``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import all_graphs
from onnxprec._progress import progress as counted
from onnxprec._report import timed
from onnxprec._tensors import float32_copy
from onnxprec.accuracy import (
    METRICS,
    AccuracyTarget,
    ErrorScale,
    Measurement,
    ReferenceOutputs,
    confirm,
    measure_outputs,
)
from onnxprec.quantization.algorithms.int8 import dequantize_weight, quantize_weight
from onnxprec.quantization.algorithms.qtypes import QType
from onnxprec.quantization.int8.place import Layer
from onnxprec.sensitivity import bisect_count, fewest, hessian_energy, isolated_gains, rank, within

__all__ = [
    "EMULATION_MAX_BYTES",
    "ISOLATED_MULTIPLY_ADDS",
    "MAX_ISOLATED",
    "NODE_RUN_MULTIPLY_ADDS",
    "SearchWords",
    "emulates",
    "estimated_sensitivity",
    "measure",
    "node_runs",
    "search",
]

logger = logging.getLogger(__name__)

MAX_ISOLATED = 64
ISOLATED_MULTIPLY_ADDS = 2.4e12
"""The work the isolated gains of a target search may take: the layers times the work of one check (every quantized
layer's multiply-adds on the calibration data, plus :data:`NODE_RUN_MULTIPLY_ADDS` per node and batch); beyond it the
proxy ranks the layers (as above :data:`MAX_ISOLATED`). A count, not a clock: the same model, data and flags make the
same choice on any machine and under any load."""
NODE_RUN_MULTIPLY_ADDS = 8e6
"""What one node run on one batch counts as, in multiply-adds, in a check's work (ONNX Runtime's cost per node: a
model of many small layers runs slower per multiply-add than one of a few large ones)."""
EMULATION_MAX_BYTES = 256 * 1024 * 1024
"""The float weight bytes of the quantized layers up to which the target search emulates (a small transformer's fit)."""


def emulates(layers: Sequence[Layer]) -> bool:
    """Whether the target search over ``layers`` runs in the emulation session: every layer dynamic (ONNX Runtime's
    integer kernels compute what Q/DQ does) and their float weights within :data:`EMULATION_MAX_BYTES`."""
    if not all(layer.dynamic for layer in layers):
        return False
    weights = sum(layer.weight.const_value.size * 4 for layer in layers if layer.weight.const_value is not None)
    return weights <= EMULATION_MAX_BYTES


def measure(
    model: ir.Model,
    target: AccuracyTarget,
    calibration: ReferenceOutputs,
    providers: Sequence[str] | None = None,
    optimization: _ort.Optimization = "all",
) -> Measurement:
    """Runs ``model`` (optimized as ONNX Runtime will run it, or at ``optimization``) on every calibration batch
    against the kept outputs."""
    with timed() as clock:
        session = _ort.create_session(model, providers=providers, optimization=optimization, what="the INT8 model",
                                      spinning=False)  # fmt: skip
        measurement = measure_outputs(
            target, calibration, lambda batch: dict(zip(session.output_names, session.run(batch)))
        )
    return dataclasses.replace(measurement, seconds=clock.seconds)


def node_runs(model: ir.Model, batches: int) -> float:
    """A check's work beyond its layers' multiply-adds: the nodes of ``model`` (its subgraphs' included) run on each
    of ``batches`` batches, times :data:`NODE_RUN_MULTIPLY_ADDS`."""
    return NODE_RUN_MULTIPLY_ADDS * batches * sum(len(graph) for graph in all_graphs(model.graph))


def estimated_sensitivity(
    layers: Sequence[Layer],
    measured: Mapping[str, float | None],
    hessians: Mapping[str, np.ndarray],
    qtype: QType | None = None,
) -> dict[str, float]:
    """Each layer's relative squared output error from INT8, estimated without a run (the proxy above
    :data:`MAX_ISOLATED` layers): ``measured`` (the output error on the calibration sample) where given, else
    ``tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)`` of its per-channel weight rounded to ``qtype``'s levels (INT8's by default, FP8's
    for FP8) with ``H`` the ``XᵀX`` of its input (per group for a Conv: its patches') from ``hessians``, or the
    identity where none was collected."""
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
        q, scales = quantize_weight(matrix, axis=1) if qtype is None else qtype.quantize_weight(matrix, axis=1)
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
    return measurement.badness(metric) or 0.0


@dataclasses.dataclass(frozen=True)
class SearchWords:
    """How :func:`search`'s steps and log lines name what it promotes (the float fallback's layers by default; A16W8
    promotes tensors to 16 bits)."""

    item: str = "layer"
    promoted: str = "in float"
    none: str = "every layer INT8"
    budget: str = "--max_float_compute"


def search(
    layers: Sequence[str],
    check: Callable[[Collection[str]], Measurement],
    target: AccuracyTarget,
    proxy: dict[str, float],
    steps: list[dict[str, Any]],
    cost: dict[str, float] | None = None,
    max_float_compute: float = 1.0,
    emulate: Callable[[Collection[str]], Measurement] | None = None,
    release: Callable[[], None] | None = None,
    *,
    miss_level: int = logging.WARNING,
    words: SearchWords | None = None,
    beyond: bool = False,
    isolated_multiply_adds: float | None = None,
    node_work: float = 0.0,
    own_errors: bool = False,
    saved: Callable[[Collection[str]], Measurement] | None = None,
) -> tuple[list[str], Measurement]:
    """The fewest layers to keep in float so that ``check`` meets ``target``.

    Args:
        layers: The quantized layers' names.
        check: Builds and measures the model with the given layers in float (a real check).
        target: The accuracy target.
        proxy: A sensitivity per layer for models with more than :data:`MAX_ISOLATED` layers.
        steps: Each check is appended here (what it tried, real or emulated, its errors and verdict).
        cost: The compute of each layer (multiply-adds).
        max_float_compute: At most this fraction of the layers' compute goes back to float (speed first): when the
            target needs more, the most sensitive layers that fit go back, and a warning says what was reached.
        emulate: Measures a configuration in the emulation session (:class:`~onnxprec.quantization.int8.emulation.
            Int8Emulator`), called only once the all-INT8 model missed: the isolated gains and the bisection run
            there, their verdicts scaled to the real error of the all-INT8 model, and the choice is checked for real
            (if it misses, the search goes on with real checks, :func:`~onnxprec.accuracy.confirm`). None: every check
            is real.
        release: Called once the emulation is no longer needed (before the real checks of its choice): frees its
            session, so that it and the real model's are never held together.
        miss_level: The level of the line that says the target is not met (the accuracy guard says it itself).
        words: What is promoted and how, in the steps and log lines (default: layers in float).
        beyond: When the layers within ``max_float_compute`` miss the target (real checks only), the search goes on
            over every ranked layer, most sensitive first, but never all of them (:func:`_beyond`): the accuracy
            guard's bound before speed, while some layers stay INT8. The largest count of each part is checked
            first (a guard that misses with them needs no search between), then a bisection finds the fewest.
        isolated_multiply_adds: The work the isolated gains may take: the layers times one check's (the sum of
            ``cost`` over ``layers`` plus ``node_work``); more: ``proxy`` ranks the layers when it has them. None: no
            limit.
        node_work: A check's work beyond its layers' multiply-adds (:func:`node_runs`).
        own_errors: With ``beyond``, when that misses too, rank the layers by their own INT8 error and search again
            (:func:`_alone_first`, one real check per layer: only within ``isolated_multiply_adds``): for outputs
            judged by regions (:func:`~onnxprec.quantization.guard.judges_regions`).
        saved: Measures layers in float as the model will be saved, where ``check`` measures it otherwise (INT8's
            float remainder converted to FP16 after the search): a choice that holds is checked so once, and when
            it misses there, more layers go back in the order the search ranked them (:func:`_as_saved`).

    Returns:
        The layers kept in float (most sensitive first) and the final (real) measurement.
    """

    w = words or SearchWords()
    checks = _Checks(check, target, steps, w)
    first = checks.real((), w.none)
    if first.ok or not layers:
        return [], first
    emulated = checks.start_emulation(emulate, first) if emulate is not None else None
    metric = target.bounds[0].metric if target.bounds else "rel_l2"
    work = _Work(len(layers), sum((cost or {}).get(name, 0.0) for name in layers) + node_work, isolated_multiply_adds)
    isolate, own_errors = work.isolates(bool(proxy)), own_errors and work.fits()  # own errors: a check per layer too
    order, ranked = _order(
        layers, checks, first if emulated is None else emulated, metric, proxy, cost, max_float_compute, isolate
    )
    if not order:
        if beyond and checks.scale is None and (chosen := _further(ranked, order, layers, checks, metric,
                                                                   max_float_compute, own_errors)):  # fmt: skip
            return _as_saved(chosen, checks, layers, saved)
        why = f"{w.budget} {max_float_compute:g} allows no {w.item} {w.promoted}" if ranked else (
            "no layer's float form helps")  # fmt: skip
        logger.log(miss_level, "The accuracy target %s is not met (%s) and %s", target, first.summary(), why)
        return [], first
    checked: dict[int, Measurement] = {}

    def holds(count: int) -> bool:
        checked[count] = checks.trial(order[:count], f"{count} most sensitive {w.promoted}")
        return checked[count].ok

    go_beyond = beyond and checks.scale is None
    if go_beyond and len(order) < len(ranked) and not holds(len(order)):  # all within the budget miss
        if chosen := _further(ranked, order, layers, checks, metric, max_float_compute, own_errors):
            return _as_saved(chosen, checks, layers, saved)
        high, go_beyond = len(order), False
    else:
        high = fewest(holds, len(order))
    if checks.scale is not None:  # the emulation's choice, checked for real
        if release is not None:
            release()
        high, best = confirm(
            high, len(order), lambda k: checks.real(order[:k], f"{k} most sensitive {w.promoted}"), strategy="gallop"
        )
    else:
        best = checked.get(high) or checks.real(order[:high], f"{high} most sensitive {w.promoted}")
    further = _further(ranked, order, layers, checks, metric, max_float_compute, own_errors) if (
        not best.ok and go_beyond) else None  # fmt: skip
    if further is not None:
        return _as_saved(further, checks, layers, saved)
    if not best.ok:
        logger.log(
            miss_level,
            "The accuracy target %s is not met (%s) with the %d most sensitive %ss %s, all that %s %g allows",
            target, best.summary(), high, w.item, w.promoted, w.budget, max_float_compute,
        )  # fmt: skip
    return _as_saved((order[:high], best), checks, layers, saved, None if beyond else order)


def _as_saved(
    chosen: tuple[list[str], Measurement],
    checks: _Checks,
    layers: Sequence[str],
    saved: Callable[[Collection[str]], Measurement] | None,
    allowed: Sequence[str] | None = None,
) -> tuple[list[str], Measurement]:
    """The search's choice measured as the model will be saved (``saved``: its float remainder converted to FP16)
    when it held as checked: the rounding of the remainder adds its own error, which can take a task metric that
    held just above its bound below it. When it misses there, the layers the search ranked next (most sensitive
    first, never all: one stays quantized; only those of ``allowed``, the ones within ``max_float_compute``, where
    the search may not go beyond it) go back too, galloping then bisecting (:func:`~onnxprec.accuracy.confirm`);
    the choice is returned unchanged when even the most of them miss (the final check says so)."""
    floats, best = chosen
    if saved is None or not floats or not best.ok:
        return chosen
    w = checks.words
    chosen_set = set(floats)
    rest = [name for name in (checks.ranked if allowed is None else allowed) if name not in chosen_set]
    order = [*floats, *rest][: len(layers) - 1]

    def as_saved(k: int) -> Measurement:
        return checks.record(saved(order[:k]), order[:k], f"{k} most sensitive {w.promoted}", "as saved")

    high, measured = confirm(len(floats), len(order), as_saved, strategy="gallop")
    if not measured.ok:
        return chosen
    if high > len(floats):
        logger.info("%d more %ss %s for the model as saved (its float remainder converted)", high - len(floats),
                    w.item, w.promoted)  # fmt: skip
    return order[:high], measured


def _beyond(
    ranked: Sequence[str],
    within_budget: Sequence[str],
    count: int,
    checks: _Checks,
    max_float_compute: float,
    how: str = "",
    known: Mapping[int, Measurement] | None = None,
) -> tuple[list[str], Measurement] | None:
    """The fewest of the ``ranked`` layers (most sensitive first, at most ``count - 1``: one layer at least stays
    INT8) in float that meet the target, when all the ones ``within_budget`` did not; None when none does. The
    search starts after the first layers the two orders share (those counts missed already); ``known``: the
    measurements of counts already checked."""
    w = checks.words
    order = list(ranked[: max(count - 1, 0)])
    shared = 0
    while shared < min(len(order), len(within_budget)) and order[shared] == within_budget[shared]:
        shared += 1
    if shared >= len(order):
        return None
    how = how or f"beyond {w.budget}"
    if not how.startswith("by "):
        logger.info("The %ss %s within %s %g miss the accuracy guard: more of the most sensitive go back",
                    w.item, w.promoted, w.budget, max_float_compute)  # fmt: skip
    checked: dict[int, Measurement] = dict(known or {})

    def holds(k: int) -> bool:
        if k not in checked:
            checked[k] = checks.real(order[:k], f"{k} most sensitive {w.promoted}, {how}")
        return checked[k].ok

    if not holds(len(order)):  # the most that may go back miss: no count below them is searched
        return None
    high = bisect_count(holds, len(order), shared)
    best = checked[high]
    logger.info("%d %ss %s beyond %s %g for the accuracy guard", high, w.item, w.promoted, w.budget,
                max_float_compute)  # fmt: skip
    return order[:high], best


@dataclasses.dataclass(frozen=True)
class _Work:
    """What one real check per layer costs: ``count`` checks of ``multiply_adds`` each (the quantized layers' on the
    calibration data and the node runs'), against ``budget`` (None: no limit). Counted from the model and the data,
    never timed."""

    count: int
    multiply_adds: float
    budget: float | None

    def fits(self) -> bool:
        """Whether a check per layer is allowed: at most :data:`MAX_ISOLATED` layers, their checks within budget."""
        if self.count > MAX_ISOLATED:
            return False
        return self.budget is None or self.count * self.multiply_adds <= self.budget

    def isolates(self, estimate: bool) -> bool:
        """Whether each layer gets its own check (:func:`~onnxprec.sensitivity.isolated_gains`): :meth:`fits`, or,
        with no estimate to fall back on, at most :data:`MAX_ISOLATED` layers."""
        if self.fits() or (not estimate and self.count <= MAX_ISOLATED):
            return True
        if self.count <= MAX_ISOLATED:
            logger.info("INT8 sensitivity estimated, not measured: %d layers' checks would take %.3g multiply-adds "
                        "(over %.3g)", self.count, self.count * self.multiply_adds, self.budget)  # fmt: skip
        return False


def _further(
    ranked: Sequence[str],
    within_budget: Sequence[str],
    layers: Sequence[str],
    checks: _Checks,
    metric: str,
    max_float_compute: float,
    own_errors: bool,
) -> tuple[list[str], Measurement] | None:
    """Under the guard, when the layers within the budget miss: the ranking by gains beyond it (:func:`_beyond`),
    then, with ``own_errors``, the ranking by each layer's own error (:func:`_alone_first`), else the layers the
    first left quantized first (:func:`_left_first`); None when all miss."""
    chosen = _beyond(ranked, within_budget, len(layers), checks, max_float_compute)
    if chosen is None and own_errors:
        return _alone_first(layers, checks, metric, max_float_compute)
    if chosen is None:  # (the own errors' checks include every 'all but one' set: not after them)
        return _left_first(ranked, layers, checks, metric, max_float_compute)
    return chosen


def _left_first(
    ranked: Sequence[str], layers: Sequence[str], checks: _Checks, metric: str, max_float_compute: float
) -> tuple[list[str], Measurement] | None:
    """When the most layers :func:`_beyond` may send back (all but one) miss, the one or two it left quantized
    break the result on their own (ranked last, or not ranked: an estimate can miss an activation's error): the
    fewest in float with them first (:func:`_beyond` again, one check of the most, then a bisection); None when
    more are left or that misses too. Two left are ranked by their own errors (each alone quantized, every other
    layer in float: one check each): one that misses goes first, one that holds goes last (never in float, and its
    check is the most :func:`_beyond` checks), the worse first in each."""
    w = checks.words
    sent_back = ranked[: max(len(layers) - 1, 0)]  # what _beyond's largest check had in float
    kept = set(sent_back)
    left = [name for name in layers if name not in kept]
    if not left or len(left) > 2 or len(left) >= len(layers):
        return None
    own = {name: _alone(checks, layers, name) for name in left} if len(left) == 2 else {}
    left = sorted(left, key=lambda name: _badness(own[name], metric), reverse=True) if own else left
    alone = {name for name, measured in own.items() if measured.ok}  # each holds with only itself quantized
    first, last = [name for name in left if name not in alone], [name for name in left if name in alone]
    reordered = [*first, *sent_back, *last]
    said = f", {' and '.join(last)} last (each holds alone)" if last else ""
    logger.info("Every %s but %s %s misses: %s first%s", w.item, " and ".join(left), w.promoted,
                ", ".join(first) or "the ranked ones", said)  # fmt: skip
    known = {len(layers) - 1: own[last[-1]]} if last else None  # the largest check: all but the last one
    chosen = _beyond(reordered, (), len(layers), checks, max_float_compute, "by the last ranked first", known)
    if chosen is not None:
        checks.ranked = reordered  # the as-saved check extends the order that chose
    return chosen


def _alone(checks: _Checks, layers: Sequence[str], name: str) -> Measurement:
    """The real check with ``name`` alone quantized (every other of ``layers`` promoted): the error it makes alone."""
    w = checks.words
    return checks.real([n for n in layers if n != name], f"every {w.item} but {name} {w.promoted}")


def _alone_first(
    layers: Sequence[str], checks: _Checks, metric: str, max_float_compute: float
) -> tuple[list[str], Measurement] | None:
    """The fewest layers in float that meet the target, ranked by the error each makes alone in INT8 (every other
    layer in float: one real check per layer), when the ranking by gains missed (:func:`_beyond` found nothing).

    A gain measured from the all-INT8 model hides a layer whose error the others' drown: once the most sensitive
    layer is back in float, the next ones each remove little, while several layers that each add a large error of
    their own stay INT8 (a text detector's early, full-resolution layers). Each layer's own error sees them."""
    w = checks.words
    if len(layers) < 2:  # one layer: none would stay INT8 (the caller keeps the count within MAX_ISOLATED)
        return None
    logger.info("The %ss %s by their gains miss the accuracy guard: each %s's own INT8 error ranks them",
                w.item, w.promoted, w.item)  # fmt: skip
    own = {name: _badness(_alone(checks, layers, name), metric) for name in counted(
        layers, "INT8 error of each layer alone", w.item)}  # fmt: skip
    ranked = checks.ranked = rank(own, layers, positive=True)
    checks.steps.append({"what": f"{w.item}s by their own INT8 error ({metric})", "layers": ranked[:8]})
    return _beyond(ranked, (), len(layers), checks, max_float_compute, f"by own error, beyond {w.budget}")


class _Checks:
    """The search's checks, each recorded in its ``steps``: real ones (the model built and run) and, once
    :meth:`start_emulation` succeeded, emulated ones whose verdicts are scaled to the real all-INT8 error."""

    def __init__(
        self,
        check: Callable[[Collection[str]], Measurement],
        target: AccuracyTarget,
        steps: list[dict[str, Any]],
        words: SearchWords,
    ) -> None:
        self.check, self.target, self.steps, self.words = check, target, steps, words
        self.emulate: Callable[[Collection[str]], Measurement] | None = None
        self.scale: ErrorScale | None = None
        self.ranked: list[str] = []  # the layers most sensitive first, once ranked

    def record(self, measurement: Measurement, floats: Collection[str], what: str, kind: str) -> Measurement:
        self.steps.append({"what": what, "kind": kind, "float_layers": len(floats), "ok": measurement.ok,
                           **{m: measurement.worst(m) for m in METRICS if measurement.worst(m) is not None},
                           "seconds": measurement.seconds})  # fmt: skip
        logger.debug(
            "Target check (%s, %s): %s -> %s",
            what,
            kind,
            measurement.summary(),
            "holds" if measurement.ok else "misses",
        )
        return measurement

    def real(self, floats: Collection[str], what: str) -> Measurement:
        return self.record(self.check(floats), floats, what, "real")

    def trial(self, floats: Collection[str], what: str) -> Measurement:
        """An emulated check once the emulation runs, else a real one."""
        if self.emulate is None or self.scale is None:
            return self.real(floats, what)
        measurement = self.emulate(floats)
        measurement = dataclasses.replace(measurement, ok=self.scale.holds(self.target, measurement))
        return self.record(measurement, floats, what, "emulated")

    def start_emulation(
        self, emulate: Callable[[Collection[str]], Measurement], first: Measurement
    ) -> Measurement | None:
        """The all-INT8 model in the emulation session, its errors scaled to ``first`` (the real ones) from then on;
        None when the session fails (the emulation is an accelerator: without it every check is real, as before)."""
        try:
            emulated = emulate(())
        except Exception as e:
            logger.warning("The INT8 emulation session failed (%s): every target check runs the real model", e)
            return None
        if emulated is None:
            return None
        self.record(emulated, (), self.words.none, "emulated")
        self.emulate, self.scale = emulate, ErrorScale(emulated, first)
        agreement = {m: emulated.worst(m) for m in METRICS if emulated.worst(m) is not None}
        logger.info("INT8 emulation against the real all-INT8 model: %s emulated, %s real",
                    emulated.summary(), first.summary())  # fmt: skip
        self.steps[-1]["real"] = {m: first.worst(m) for m in agreement}
        return emulated


def _order(
    layers: Sequence[str],
    checks: _Checks,
    baseline: Measurement,
    metric: str,
    proxy: Mapping[str, float],
    cost: Mapping[str, float] | None,
    max_float_compute: float,
    isolate: bool,
) -> tuple[list[str], list[str]]:
    """The layers most sensitive first (the gain of each alone in float when ``isolate``, measured from
    ``baseline``, else ``proxy``), and the first of them that fit in ``max_float_compute``."""
    w = checks.words
    if isolate:
        sensitivity = isolated_gains(
            layers, lambda name: _badness(checks.trial({name}, f"{name} alone {w.promoted}"), metric),
            _badness(baseline, metric), squared=metric in ("rel_l2", "max_abs"), progress="INT8 sensitivity",
        )  # fmt: skip
        checks.steps.append({"what": f"gain of each {w.item} alone {w.promoted} ({metric})", "checks": len(layers)})
    else:
        sensitivity = {name: proxy.get(name, 0.0) for name in layers}
    order = ranked = checks.ranked = rank(sensitivity, layers, positive=True)
    checks.steps.append({"what": f"most sensitive {w.item}s", "layers": ranked[:8]})  # the layers that carry the error
    if cost and max_float_compute < 1.0:  # the most sensitive layers that fit in the compute budget, in order
        order = within(order, cost, max_float_compute * (sum(cost.get(name, 0.0) for name in layers) or 1.0))
    return order, ranked


def worst_errors(measurement: Measurement) -> dict[str, float]:
    """The worst value of each metric over the outputs (what the report shows)."""
    return {m: float(v) for m in METRICS if (v := measurement.worst(m)) is not None and math.isfinite(v)}
