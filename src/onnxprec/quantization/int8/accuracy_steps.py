"""The steps of INT8's pipeline that measure models against the accuracy target: the A16W8 search for the static
tensors at 16 bits (:func:`widen`), the float fallback (:func:`search_float_layers`), both on
:func:`~onnxprec.quantization.int8.fallback.search`, and the check of the result as it will be saved
(:func:`check_result`), with the guard's verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from onnxprec._graph import clone_model
from onnxprec._progress import Progress
from onnxprec.accuracy import ReferenceOutputs
from onnxprec.quantization import guard
from onnxprec.quantization.int8 import fallback
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.decide import Decisions, build
from onnxprec.quantization.int8.emulation import Int8Emulator
from onnxprec.quantization.int8.fallback import SearchWords, measure, search, worst_errors
from onnxprec.quantization.int8.place import Plan

if TYPE_CHECKING:
    from onnxprec.accuracy import AccuracyTarget, Measurement, Producer

__all__ = ["apply_decisions", "check_result", "search_float_layers", "widen"]

logger = logging.getLogger(__name__)


def apply_decisions(
    model: ir.Model, options: Int8Options, decisions: Decisions, float_layers: Collection[str] = ()
) -> tuple[ir.Model, Plan]:
    """A copy of ``model`` with the decisions applied (:func:`~onnxprec.quantization.int8.decide.build`),
    ``float_layers`` left in float, and the placement it applied."""
    copy = clone_model(model)  # the weights shared: a build adds initializers and never changes a tensor
    plan = build(copy, options, decisions, float_layers)
    return copy, plan


def _measure(
    candidate: ir.Model,
    options: Int8Options,
    target: AccuracyTarget,
    producers: Mapping[str, Producer | None],
    keep: ReferenceOutputs,
    held_out: ReferenceOutputs | None = None,
) -> Measurement:
    """A candidate of a target search against the kept float outputs: the user's target, or the guard's verdict (the
    task metric of each output: :func:`onnxprec.quantization.guard.holds`). The guard's verdict holds on the
    held-out runs too (measured only once the calibration runs hold), as the final check asks: a choice that fits
    the runs the ranges were fitted to and misses the others is not taken; the errors that rank the layers stay the
    calibration runs'."""
    providers = list(options.calibration_eps)
    if options.target is not None:
        return measure(candidate, target, keep, providers, options.check_optimization)
    checked = guard.measure_task(candidate, keep, producers, providers, target, options.check_optimization)
    ok = checked.ok
    if ok and held_out is not None:
        measured = guard.measure_task(candidate, held_out, producers, providers, target, options.check_optimization)
        ok = dataclasses.replace(measured, held_out=True).ok  # the held-out runs' bounds
    return dataclasses.replace(checked.measurement, ok=ok)


def search_float_layers(
    model: ir.Model,
    options: Int8Options,
    plan: Plan,
    decisions: Decisions,
    target: AccuracyTarget,
    producers: Mapping[str, Producer | None],
    keep: ReferenceOutputs,
    held_out: ReferenceOutputs | None,
    proxy: dict[str, float],
    cost: dict[str, float],
    report: Int8Report,
    as_saved: Callable[[ir.Model], ir.Model] | None = None,
) -> list[str]:
    """The float fallback: the fewest most sensitive layers in float for ``target`` (the user's, or the guard's,
    whose verdict is the task metric of each output: :func:`onnxprec.quantization.guard.holds`), confirmed on the
    candidate as saved where ``as_saved`` converts it (the float remainder to FP16/BF16)."""
    names = [
        layer.name for layer in plan.layers if layer.name in decisions.layers and layer.name not in decisions.kept_float
    ]
    own = options.target is None  # the guard's target: its verdict is per output kind
    steps = report.fallback_steps

    def check(floats: Collection[str]) -> Measurement:
        candidate, _ = apply_decisions(model, options, decisions, floats)
        return _measure(candidate, options, target, producers, keep, held_out)

    def saved(floats: Collection[str]) -> Measurement:
        assert as_saved is not None
        candidate = as_saved(apply_decisions(model, options, decisions, floats)[0])
        return _measure(candidate, options, target, producers, keep, held_out)

    with contextlib.ExitStack() as stack, Progress("INT8 float fallback search", "check", count=lambda: len(steps)):
        emulators: list[Int8Emulator] = []

        def emulate(floats: Collection[str]) -> Any:  # one session, built once the all-INT8 model missed
            if not emulators:
                emulators.append(stack.enter_context(
                    Int8Emulator(model, plan, decisions, options, names, list(options.calibration_eps))
                ))  # fmt: skip
            return emulators[0].measure(floats, target, keep)

        def release() -> None:  # before the real checks: the two sessions are never held together
            stack.close()
            emulators.clear()

        # the emulation where the INT8 kernels compute what Q/DQ does and its memory is small (fallback.py)
        # (its session is of the main graph: not with layers inside If branches)
        emulated = not plan.in_branches and fallback.emulates([layer for layer in plan.layers if layer.name in names])
        float_layers, _ = search(
            names, check, target, proxy, steps, cost, options.float_compute,
            emulate if emulated and not own else None, release, miss_level=logging.INFO if own else logging.WARNING,
            beyond=options.float_compute_extends, own_errors=own and guard.judges_regions(keep, producers),
            isolated_multiply_adds=None if emulated and not own else fallback.ISOLATED_MULTIPLY_ADDS,
            node_work=fallback.node_runs(model, len(keep.outputs)), saved=saved if as_saved is not None else None,
        )  # fmt: skip
    return float_layers


def widen(
    model: ir.Model,
    options: Int8Options,
    plan: Plan,
    decisions: Decisions,
    target: AccuracyTarget,
    producers: Mapping[str, Producer | None],
    keep: ReferenceOutputs,
    held_out: ReferenceOutputs | None,
    report: Int8Report,
) -> Decisions:
    """A16W8: the fewest static tensors at 16 bits (the others 8) for ``target``, the noisiest at 8 bits first
    (:attr:`Decisions.noise`), at most ``max_wide_tensors`` of them; the same search as the float fallback's
    (:func:`~onnxprec.quantization.int8.fallback.search`), over tensors. Returns the decisions with them."""
    names = [str(value.name) for value in plan.static_tensors if str(value.name) in decisions.wide]

    def check(wide: Collection[str]) -> Measurement:
        candidate, _ = apply_decisions(model, options, dataclasses.replace(decisions, widened=frozenset(wide)))
        return _measure(candidate, options, target, producers, keep, held_out)

    steps: list[dict[str, Any]] = []
    words = SearchWords("static tensor", "at 16 bits", "every static tensor at 8 bits", "--max_wide_tensors")
    wide, _ = search(names, check, target, dict(decisions.noise), steps, dict.fromkeys(names, 1.0),
                     options.max_wide_tensors, miss_level=logging.INFO, words=words)  # fmt: skip
    report.wide_tensors = list(wide)
    report.wide_steps = steps
    logger.info("A16W8: %d of %d static tensors at 16 bits", len(wide), len(names))
    return dataclasses.replace(decisions, widened=frozenset(wide))


def check_result(
    result: ir.Model,
    options: Int8Options,
    producers: Mapping[str, Producer | None],
    keep: ReferenceOutputs,
    held_out: ReferenceOutputs | None,
    report: Int8Report,
) -> None:
    """Measures the result as it will be saved on the calibration runs and the held-out ones, records it, and, with
    the guard on, records the guard's one line when the result misses the bound (:class:`AccuracyGuardError` is
    raised once the model is written); with it off, a WARNING says so."""
    providers = list(options.calibration_eps)
    optimization = options.check_optimization
    checked = [guard.measure_task(result, keep, producers, providers, optimization=optimization)]
    if held_out is not None:
        measured = guard.measure_task(result, held_out, producers, providers, optimization=optimization)
        checked.append(dataclasses.replace(measured, held_out=True))
    report.accuracy = worst_errors(checked[0].measurement)
    passed = all(c.ok for c in checked)
    missed = next((c for c in checked if not c.ok), checked[0])
    report.check = {
        "random_data": bool(report.calibration.get("random")),
        "guard": "on" if options.accuracy_guard else "off",
        "bound": guard.describe_bounds(missed.summary, missed.held_out),  # the calibration runs' unless they held
        "passed": passed,
        "calibration": checked[0].to_json(),
        "held_out": checked[1].to_json() if len(checked) > 1 else None,
    }
    if passed:
        return
    line = report.guard_line(checked)
    if options.accuracy_guard:
        report.guard_failure = line
    else:
        logger.warning("%s", line)
