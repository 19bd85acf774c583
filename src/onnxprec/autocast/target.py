"""AutoCast by accuracy target (``--target_accuracy``): as many low-precision nodes as the outputs allow.

The user states what the outputs must keep on their calibration data (``rel_l2<=1e-3``, ``cosine>=0.9999``,
``top1>=0.999``, ``max_abs<=1e-2``, several joined by commas, or a callback on reference and candidate outputs).
The reference run keeps the FP32 outputs of every batch (:class:`ReferenceOutputs`). After the default
(magnitude-based) classification:

1. **Candidates** (:func:`_split`): main-graph float nodes whose precision only a measurement decided (the
   default converts them, or ``data_max``/``max_depth_of_reduction`` keeps them in FP32). User excludes and
   includes, schema limits, custom ops, control flow and initializer ranges stay as decided; nodes whose measured
   tensors do not fit the low type (an FP16 overflow) stay FP32; subgraph nodes keep their default decision.
2. **The default, for real**: converted in memory and run on every batch in one session. Its error is what the
   pipeline reports, and it sets the direction: *upward* (it meets the target: convert the candidates it keeps in
   FP32) or *downward* (it misses: keep candidates it converts in FP32).
3. **Upward, all at once**: converting every upward candidate is checked for real first (one session); on LLMs
   whose FP32 islands are only ``data_max`` margins this is the answer.
4. **Otherwise, one emulation session** (:class:`Emulator`): the FP32 model in which every tensor edge that a
   candidate can make low goes through the low type (``Cast`` to low and back) behind a boolean input, exactly where
   the converter rounds (a low node's outputs, and the inputs a low node reads; weights clamped as converted). A
   configuration is a set of feeds: trying one is one ``session.run`` per batch, never a build or a session. Its
   verdicts are scaled to the real error of the default (:class:`~onnxprec.accuracy.ErrorScale`): the emulation
   rounds every low tensor as FP16/BF16 hardware does, while ONNX Runtime's CPU computes many FP16 ops in FP32.
5. **Sensitivity** (the sensitivity engine, :mod:`onnxprec.sensitivity`): a validated structural proxy
   (:func:`~onnxprec.sensitivity.structural`), the number of readers of the node's outputs over its distance to
   the graph outputs. Validated against each node's exact output error (one emulated
   run per node) by ``python -m experiments.target_proxy``: the node's own rounding error is nearly the same for
   every node and ranks poorly; the numbers are in BENCHMARKS.md. Least sensitive first upward, most sensitive
   first downward (:func:`~onnxprec.sensitivity.rank`); a bisection on how many nodes to move
   (:func:`~onnxprec.sensitivity.bisect_count`, ``log2(candidates)`` runs), then greedy steps on chunks
   of the rest within :data:`REFINE_RUNS` and :data:`REFINE_MULTIPLY_ADDS` (:func:`refine_runs`: a count of work, not
   a clock).
6. **Check**: the choice is converted in memory and run for real on every batch; if it misses, the bisection goes
   on with real checks (at most :data:`~onnxprec.accuracy.MAX_REAL_CHECKS`, :func:`onnxprec.accuracy.confirm`).

Sessions: one for the default, one per real check, and at most one emulation session. ``TargetReport.steps``
lists every configuration tried, with its errors, verdict and time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._ops import CONTROL_FLOW_OPS
from onnxprec._progress import Progress
from onnxprec._report import fields_of, timed
from onnxprec._tensors import finite_max
from onnxprec.accuracy import AccuracyTarget, ErrorScale, Measurement, ReferenceOutputs, confirm, measure_outputs
from onnxprec.autocast.classify import Decision, classify
from onnxprec.autocast.emulator import Emulator, float_values
from onnxprec.autocast.rules import DataRangeRule, DepthOfReductionRule, Rule, RuleContext
from onnxprec.errors import UnsupportedModelError
from onnxprec.observers import TensorStats
from onnxprec.sensitivity import bisect_count, multiply_adds, rank, structural
from onnxprec.validate import NumericReport

if TYPE_CHECKING:
    from onnxprec.autocast._options import AutoCastOptions

__all__ = ["Problem", "TargetReport", "search"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT
REFINE_RUNS = 6
"""Greedy steps after the bisection: at most this many emulated runs."""
REFINE_MULTIPLY_ADDS = 2.4e10
"""The work the greedy steps may take in all: an emulated run counts the model's MatMul, Gemm and Conv multiply-adds
plus :data:`EMULATED_NODE_MULTIPLY_ADDS` per node of the emulation model, on every batch (:func:`refine_runs`). A
count, not a clock: the same model, data and flags make the same choice on any machine and under any load."""
EMULATED_NODE_MULTIPLY_ADDS = 1e5
"""What one node run of the emulation model (mostly Casts and small elementwise nodes) on one batch counts as."""


# --------------------------------------------------------------------------------------------------
# Candidates and sensitivities


def _overflows(node: ir.Node, stats: Mapping[str, TensorStats] | None, low: ir.DataType) -> bool:
    """Whether a tensor of ``node`` was measured beyond the low type's range (it cannot be low at all)."""
    if not stats:
        return False
    limit = finite_max(low)
    for value in float_values(node):
        s = stats.get(str(value.name))
        if s is not None and s.size and not s.absmax < limit:
            return True
    return False


@dataclass
class Step:
    """One configuration tried: emulated (its verdict scaled to the measured error of the default) or real."""

    kind: str  # "emulated" or "real"
    what: str
    low_nodes: int  # candidates low
    measurement: Measurement
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return {
            **fields_of(self, "kind", "what", "low_nodes", "ok"),
            "errors": _jsonable(self.measurement.errors),
            "seconds": round(self.measurement.seconds, 3),
        }


def _jsonable(errors: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    return {
        name: {k: (float(v) if v is not None and math.isfinite(v) else None) for k, v in e.items()}
        for name, e in errors.items()
    }


@dataclass
class TargetReport:
    """What the target search did: mode, candidates, each configuration tried, the sensitivities, the result."""

    target: str
    mode: str = ""
    candidates: int = 0
    moved: int = 0
    sensitivity: dict[ir.Node, float] = field(default_factory=dict, repr=False)
    steps: list[Step] = field(default_factory=list, repr=False)
    sessions: int = 0
    runs: int = 0
    default: Measurement | None = None
    final: Measurement | None = None
    reached: bool = False
    seconds: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            **fields_of(self, "target", "mode", "candidates", "moved", "reached", "sessions", "runs"),
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "default": None if self.default is None else _jsonable(self.default.errors),
            "final": None if self.final is None else _jsonable(self.final.errors),
            "steps": [s.to_json() for s in self.steps],
        }


# --------------------------------------------------------------------------------------------------
# The search


@dataclass
class Problem:
    """What the search works on, from the pipeline."""

    model: ir.Model
    decisions: dict[ir.Node, Decision]  # the default classification
    hard: dict[ir.Node, Decision]  # the classification by the rules that are not measurements
    stats: Mapping[str, TensorStats] | None
    reference: ReferenceOutputs
    target: AccuracyTarget
    low: ir.DataType
    keep_io_types: bool
    providers: Sequence[str] | None
    build: Callable[[dict[ir.Node, Decision]], ir.Model]  # converts a clone of the model with these decisions
    included: frozenset[ir.Node] = frozenset()  # nodes the user asked to convert (nodes/op_types_to_include)

    @classmethod
    def of(
        cls,
        model: ir.Model,
        decisions: dict[ir.Node, Decision],
        options: AutoCastOptions,
        rules: Sequence[Rule],
        includes: Sequence[Rule],
        ctx: RuleContext,
        reference: ReferenceOutputs,
        build: Callable[[ir.Model, Mapping[ir.Node, Decision], AutoCastOptions], ir.Model],
    ) -> Problem:
        """The problem of the AutoCast pipeline: its model, classification, rules, statistics and options."""
        assert options.target is not None
        hard_rules = [r for r in rules if not isinstance(r, (DataRangeRule, DepthOfReductionRule))]
        hard = classify(model, low=options.low, rules=hard_rules, includes=includes, ctx=ctx, plugins=options.plugins)
        included = frozenset(n for n in model.graph if any(include(n, ctx) for include in includes))
        return cls(
            model,
            decisions,
            hard,
            ctx.stats,
            reference,
            options.target,
            options.low,
            options.keep_io_types,
            options.providers,
            lambda chosen: build(model, chosen, options),
            included,
        )


def _split(problem: Problem) -> tuple[set[ir.Node], list[ir.Node], list[ir.Node]]:
    """Fixed-low nodes, candidates, and nodes that overflow the low type (kept FP32)."""
    graph = problem.model.graph
    fixed_low: set[ir.Node] = set()
    candidates: list[ir.Node] = []
    overflow: list[ir.Node] = []
    for node in graph:
        decision = problem.decisions[node]
        hard = problem.hard[node]
        movable = (
            hard.low
            and node not in problem.included
            and node.op_type not in CONTROL_FLOW_OPS
            and bool(float_values(node))
        )
        if not movable:
            if decision.low:
                fixed_low.add(node)
            continue
        if not decision.low and _overflows(node, problem.stats, problem.low):
            overflow.append(node)
            continue
        candidates.append(node)
    return fixed_low, candidates, overflow


def search(problem: Problem) -> tuple[dict[ir.Node, Decision], TargetReport, NumericReport]:
    """Finds the classification to convert: the decisions, the report, and the real model's errors (every batch).

    The default classification is measured for real first: that error is what the pipeline reports, and it
    decides the direction. Upward (the default meets the target), converting every candidate it keeps in FP32
    is tried for real first; if that misses, the emulation bisects. Downward, the emulation bisects on the
    number of nodes to keep in FP32. The emulation's verdicts are scaled to the measured error of the default
    (:class:`~onnxprec.accuracy.ErrorScale`); the final choice is checked for real (:func:`_confirm_for_real`).
    """
    report = TargetReport(str(problem.target))
    with timed() as clock, Progress("AutoCast target search", "check", count=lambda: len(report.steps)):
        fixed_low, moving, ranked = _start(problem, report)
        chosen = _move(problem, fixed_low, moving, ranked, report)
    final = report.final
    assert final is not None
    report.reached = final.ok
    report.seconds = clock.seconds
    _log_result(report, final, len(moving))
    return chosen, report, _numeric(final)


def _start(problem: Problem, report: TargetReport) -> tuple[set[ir.Node], list[ir.Node], list[ir.Node]]:
    """Measures the default classification for real and sets the direction: the fixed low nodes, the candidates
    that move, and those ranked by structural sensitivity (least sensitive first upward)."""
    fixed_low, candidates, overflow = _split(problem)
    report.candidates = len(candidates)
    logger.info(
        "Target %s: %d candidate nodes (%d converted by default), %d kept FP32 as they overflow %s",
        report.target,
        len(candidates),
        sum(problem.decisions[n].low for n in candidates),
        len(overflow),
        problem.low.name.lower(),
    )
    report.default = report.final = _run_for_real(problem, problem.decisions, "default classification", report)
    upward = report.default.ok
    report.mode = "upward" if upward else "downward"
    moving = [n for n in candidates if problem.decisions[n].low != upward]
    fixed_low |= {n for n in candidates if problem.decisions[n].low and upward}
    sensitivity = structural(problem.model)
    # Least sensitive first upward; downward, the most sensitive go back to FP32 first.
    ranked = rank(sensitivity, moving, least_first=upward)
    report.sensitivity = {n: sensitivity[n] for n in moving}
    return fixed_low, moving, ranked


def _move(
    problem: Problem, fixed_low: set[ir.Node], moving: list[ir.Node], ranked: list[ir.Node], report: TargetReport
) -> dict[ir.Node, Decision]:
    """The chosen decisions: the default when nothing moves; upward, every candidate low when that meets the
    target for real; else the emulation's bisection, confirmed for real."""
    upward = report.mode == "upward"
    if not moving:
        report.note = "no candidate to move"
        return problem.decisions
    every = _decisions(problem, set(moving), set(moving))
    if upward and _run_for_real(problem, every, "every candidate low", report).ok:
        report.final, report.moved = report.steps[-1].measurement, len(moving)
        return every
    emulator = Emulator(
        problem.model, fixed_low, ranked, problem.low, keep_io_types=problem.keep_io_types, providers=problem.providers
    )
    report.sessions += 1
    try:
        ranked, k, emulated_ok = _bisect(problem, emulator, upward, report)
    finally:
        report.runs += emulator.runs
        emulator.close()
    return _confirm_for_real(problem, ranked, k, emulated_ok, upward, report)


def _log_result(report: TargetReport, final: Measurement, moving: int) -> None:
    logger.log(
        logging.INFO if report.reached else logging.WARNING,
        "Target %s %s (%s): %d of %d candidates moved (%s), %d sessions, %d runs, %.1f s",
        report.target,
        "reached" if report.reached else "NOT reached",
        final.summary(),
        report.moved,
        moving,
        report.mode,
        report.sessions,
        report.runs,
        report.seconds,
    )


def _numeric(final: Measurement) -> NumericReport:
    """The final measurement's errors per output, as AutoCast's numeric report."""
    return NumericReport(
        {
            name: {"max_abs": e["max_abs"], "rel_l2": e["rel_l2"], "cosine": e["cosine"], "finite": e["nonfinite"] == 0}
            for name, e in final.errors.items()
        }
    )


def _run_for_real(problem: Problem, decisions: dict[ir.Node, Decision], what: str, report: TargetReport) -> Measurement:
    """Converts a clone with ``decisions`` and runs it on every batch, in one session."""
    measurement = _measure_real(problem, problem.build(decisions))
    report.sessions += 1
    report.runs += len(problem.reference.outputs)
    low = sum(d.low for d in decisions.values())
    report.steps.append(Step("real", what, low, measurement, measurement.ok))
    _log("real", what, low, measurement, measurement.ok)
    return measurement


def _log(kind: str, what: str, low: int, measurement: Measurement, ok: bool) -> None:
    logger.info("  %-8s %-32s %5d low: %s -> %s", kind, what, low, measurement.summary(), "ok" if ok else "miss")


def _low_indices(ranked: Sequence[ir.Node], k: int, upward: bool) -> set[int]:
    """Candidate indices (into ``ranked``) that are low when ``k`` nodes moved."""
    return set(range(k)) if upward else set(range(k, len(ranked)))


def _bisect(
    problem: Problem, emulator: Emulator, upward: bool, report: TargetReport
) -> tuple[list[ir.Node], int, bool]:
    """How many ranked candidates to move, found in the emulation, then refined by greedy steps.

    Returns:
        The ranking, reordered so that the chosen nodes to move come first; how many to move; and whether that
        met the target in the emulation (False only when even moving every candidate misses).
    """
    ranked = list(emulator.candidates)
    n = len(ranked)
    base = sum(d.low for d in problem.decisions.values())
    sign = 1 if upward else -1
    default = measure_outputs(problem.target, problem.reference, emulator.run(_low_indices(ranked, 0, upward)))
    assert report.default is not None
    scale = ErrorScale(default, report.default)
    report.steps.append(Step("emulated", "default classification", base, default, report.default.ok))
    _log("emulated", "default classification", base, default, report.default.ok)

    def holds(moved: set[int], what: str) -> bool:
        low = moved if upward else set(range(n)) - moved
        measurement = measure_outputs(problem.target, problem.reference, emulator.run(low))
        ok = scale.holds(problem.target, measurement)
        report.steps.append(Step("emulated", what, base + sign * len(moved), measurement, ok))
        _log("emulated", what, base + sign * len(moved), measurement, ok)
        return ok

    verb = "convert" if upward else "keep FP32"
    # downward, every candidate in FP32 is assumed to hold
    good = bisect_count(lambda k: holds(set(range(k)), f"{verb} {k} of {n}"), *((0, n) if upward else (n, 0)))
    # Greedy steps: the ranking is a proxy, so try chunks of the other side too, while runs are cheap.
    moved = set(range(good))
    runs, allowed = 0, refine_runs(problem, emulator.nodes)
    tried: set[frozenset[int]] = set()
    for parts in (4, 8):
        others = sorted(set(range(n)) - moved) if upward else sorted(moved)
        for chunk in np.array_split(np.array(others, dtype=np.int64), parts):
            step = frozenset(chunk.tolist())
            if not step or step in tried or runs >= allowed:
                continue
            tried.add(step)
            trial = moved | step if upward else moved - step
            if holds(trial, f"{'convert' if upward else 'convert back'} {len(step)} more"):
                moved = trial
            runs += 1
    first = sorted(moved)
    emulated_ok = upward or good < n  # downward: some k < n held in the emulation (n itself is not run)
    return [ranked[i] for i in first] + [ranked[i] for i in range(n) if i not in moved], len(first), emulated_ok


def refine_runs(problem: Problem, emulation_nodes: int) -> int:
    """How many greedy steps the search takes after the bisection: :data:`REFINE_RUNS`, fewer where that many
    emulated runs of the model (``emulation_nodes`` nodes, on every calibration batch) exceed
    :data:`REFINE_MULTIPLY_ADDS`. Shapes are the measured ones where the statistics have them."""
    shapes = {name: s.shape for name, s in (problem.stats or {}).items()}
    per_batch = multiply_adds(problem.model.graph, shapes) + EMULATED_NODE_MULTIPLY_ADDS * emulation_nodes
    per_run = per_batch * max(len(problem.reference.outputs), 1)
    return min(REFINE_RUNS, int(REFINE_MULTIPLY_ADDS // max(per_run, 1.0)))


def _confirm_for_real(
    problem: Problem, ranked: list[ir.Node], k: int, emulated_ok: bool, upward: bool, report: TargetReport
) -> dict[ir.Node, Decision]:
    """Checks the emulation's choice (``k`` of ``ranked`` moved) for real, and moves back towards the default
    (upward) or towards FP32 (downward) while it misses (:func:`onnxprec.accuracy.confirm`: at most
    :data:`~onnxprec.accuracy.MAX_REAL_CHECKS` real checks). ``emulated_ok``: whether the choice met the target in
    the emulation."""
    n = len(ranked)
    verb = "convert" if upward else "keep FP32"

    def moved(safe: int) -> int:  # ``safe`` of the ranked candidates on the safe side: unconverted, or kept FP32
        return n - safe if upward else safe

    def decisions(safe: int) -> dict[ir.Node, Decision]:
        if upward and safe == n:
            return problem.decisions
        low = _low_indices(ranked, moved(safe), upward)
        return _decisions(problem, set(ranked), {ranked[i] for i in low})

    def check(safe: int) -> Measurement:
        return _run_for_real(problem, decisions(safe), f"{verb} {moved(safe)} of {n}", report)

    known = report.default if upward else None  # upward, the default (nothing moved) was measured: it holds
    safe, report.final = confirm(n - k if upward else k, n, check, strategy="bisect", known=known)
    report.moved = moved(safe)
    if not report.final.ok:
        kept = "every candidate" if safe == n else f"{safe} of {n} candidates"
        report.note = f"the real model misses the target even with {kept} in FP32"
    elif not emulated_ok:
        report.note = "the emulation found no configuration that meets the target"
    return decisions(safe)


def _measure_real(problem: Problem, converted: ir.Model) -> Measurement:
    """Runs a converted model on every batch, in one session without graph rewrites (as the numeric check).

    Raises:
        UnsupportedModelError: ONNX Runtime cannot run it here (e.g. BF16 kernels missing on the CPU provider).
    """
    try:
        session = _ort.create_session(
            converted,
            providers=problem.providers,
            optimization="none",
            low_memory=True,
            what="the converted model",
            spinning=False,
        )
        return measure_outputs(
            problem.target, problem.reference, lambda batch: dict(zip(session.output_names, session.run(batch)))
        )
    except Exception as e:
        low = problem.low.name.lower()
        raise UnsupportedModelError(
            f"--target_accuracy measures the converted model, and ONNX Runtime cannot run it with providers "
            f"{list(problem.providers or ['cpu'])} ({_ort.first_line(e, 200)}): use a provider with {low} kernels "
            "(--providers cuda:0) or convert without a target."
        ) from e


def _decisions(problem: Problem, movable: set[ir.Node], low: set[ir.Node]) -> dict[ir.Node, Decision]:
    """The default decisions with the ``movable`` nodes low exactly when in ``low`` (reasons say what changed)."""
    decisions = dict(problem.decisions)
    for node in movable:
        current = decisions[node]
        if current.low == (node in low):
            continue
        if node in low:  # the schema's FP32 slots (Resize scales...) from the classification without measurements
            reason = f"target accuracy: converted (default: {current.reason})"
            decisions[node] = dataclasses.replace(problem.hard[node], reason=reason)
        else:
            decisions[node] = Decision(False, f"target accuracy: kept in FP32 (default: {current.reason})")
    return decisions
