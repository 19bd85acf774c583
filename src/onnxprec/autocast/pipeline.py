"""AutoCast's pipeline: the steps of :func:`onnxprec.autocast.convert_model`, listed once in :data:`STEPS`.

::

    load+sanitize -> reference -> classify -> (target) -> convert -> (validate)

Each step reads and fills one :class:`Conversion` (the model, the reference run, the rules, the decisions) and the
report times it under its name (:meth:`onnxprec._report.TimedSteps.run_steps`). Saving, the numeric check of the
written output and the retry after a kernel gap are the public functions' (:mod:`onnxprec.autocast._api`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import math
from collections.abc import Callable, Mapping

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import (
    InlinePass,
    RemoveUnusedNodesPass,
    TopologicalSortPass,
)

from onnxprec._graph import FLOAT_TYPES, LOW_FLOAT_TYPES, clone_model, tensor_dtype
from onnxprec._io import ModelSource, load_model
from onnxprec._ops import default_opset, is_standard_op, normalized_domain, opsets_by_domain
from onnxprec._options import check_op_types, check_patterns
from onnxprec._report import Step, timed
from onnxprec.accuracy import ReferenceOutputs
from onnxprec.autocast import masks, target
from onnxprec.autocast._options import AutoCastOptions
from onnxprec.autocast.classify import Decision, classify
from onnxprec.autocast.convert import ConvertPrecisionPass, ConvertPrecisionResult
from onnxprec.autocast.kernel_gaps import keep_kernel_gaps, node_keys, warn_cast_shared_kv
from onnxprec.autocast.report import MOVES_ONLY, AutoCastReport, Details, first_sample, layer_errors
from onnxprec.autocast.rules import (
    REDUCING_OPS,
    DataRangeRule,
    DepthOfReductionRule,
    InitializerRangeRule,
    NodeNameRule,
    OpTypeRule,
    Rule,
    RuleContext,
    UserRule,
)
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import InvalidArgumentError, UnsupportedModelError, ValidationError
from onnxprec.observers import Observer, RangeObserver, TensorStats
from onnxprec.passes import (
    ConvertFp64ToFp32Pass,
    InferTypesPass,
    LiftFloatConstantsPass,
    NameNodesPass,
    OpsetUpgradeError,
    RemoveRedundantCastsPass,
    UpgradeOpsetPass,
    WidenMovementIslandsPass,
    WidenMovementIslandsResult,
    WidenToFp32Pass,
    run_passes,
)
from onnxprec.reference import ReferenceResult, run_reference
from onnxprec.validate import (
    IOContract,
    check_io_contract,
    check_structure,
)

logger = logging.getLogger(__name__)

__all__ = ["MIN_OPSET", "STEPS", "Conversion", "check_selection"]

MIN_OPSET = {"fp16": 13, "bf16": 22}


# ---------------------------------------------------------------------------------------------------
# Pipeline steps


def _check_convertible(model: ir.Model) -> None:
    """Refuses models with nothing to convert. Quantized models are converted around their quantization nodes:
    QuantizeLinear keeps its FP32 scale, DequantizeLinear follows its schema (FP16/BF16 output from opset 19),
    QOperator and contrib ops (QLinearConv, MatMulNBits...) stay as they are, integer weights are never touched.
    FP16, BF16 and mixed models are converted too (see :func:`_widen`)."""
    graph = model.graph
    floats = FLOAT_TYPES
    has_float = (
        any(v.dtype in floats for v in (*graph.inputs, *graph.outputs))
        or any(v.dtype in floats for v in graph.initializers.values())
        or any(out.dtype in floats for node in graph.all_nodes() for out in node.outputs)
    )
    if not has_float:
        raise UnsupportedModelError(
            "The model has no floating-point tensors to convert: AutoCast changes float precision only."
        )


@functools.cache
def _onnx_op_types() -> frozenset[str]:
    """The names of every ONNX op, of any opset."""
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())


def _check_op_types(model: ir.Model, options: AutoCastOptions) -> None:
    if not (options.op_types_to_exclude or options.op_types_to_include):
        return
    known = _onnx_op_types() | {n.op_type for n in model.graph.all_nodes()}
    for what, names in (
        ("op_types_to_exclude", options.op_types_to_exclude),
        ("op_types_to_include", options.op_types_to_include),
    ):
        for name in names or ():
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f" Did you mean '{close[0]}'?" if close else ""
                raise InvalidArgumentError(
                    f"Unknown op type '{name}' in {what}: it is neither an ONNX op nor in the model.{hint}"
                )


def check_selection(report: AutoCastReport, options: AutoCastOptions) -> None:
    """Warns about each name pattern or op type of the options that selects no node (with the closest names)."""
    names = {str(node.name): node.op_type for node in report.decisions if node.name}
    for what, patterns in (
        ("nodes_to_exclude", options.exclude_patterns),
        ("nodes_to_include", options.include_patterns),
    ):
        check_patterns(patterns, what, names)
    present = {node.op_type for node in report.decisions}
    for what, types in (("op_types_to_exclude", options.op_types_to_exclude),
                        ("op_types_to_include", options.op_types_to_include)):  # fmt: skip
        check_op_types(types, what, present)


def _target_opset(model: ir.Model, options: AutoCastOptions) -> int:
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    minimum = MIN_OPSET[options.low_precision_type]
    if options.opset is None:
        return max(current, minimum)
    if options.opset < minimum:
        kind = "FP16" if options.low_precision_type == "fp16" else "BF16"
        logger.warning(
            "Opset %d has limited %s support; opset %d or newer is recommended.", options.opset, kind, minimum
        )
    if options.opset < current:
        logger.warning(
            "--opset %d is lower than the original model's opset %d; keeping opset %d.", options.opset, current, current
        )
        return current
    return int(options.opset)


def _sanitize(model: ir.Model, options: AutoCastOptions, opset: int | None = None) -> None:
    steps: list[ir.passes.PassBase] = []
    if model.functions:
        steps.append(InlinePass())
    steps += [
        NameNodesPass(),
        LiftFloatConstantsPass(),
        UpgradeOpsetPass(_target_opset(model, options) if opset is None else opset),
        ConvertFp64ToFp32Pass(),
        RemoveUnusedNodesPass(),
        TopologicalSortPass(),
        InferTypesPass(),
    ]
    run_passes(model, *steps)


def _needs_reference(model: ir.Model, options: AutoCastOptions) -> bool:
    if math.isfinite(options.data_max):
        return True
    if options.max_depth_of_reduction is None:
        return False
    ctx = RuleContext()
    for node in model.graph:
        if node.op_type in REDUCING_OPS:
            values = [v for v in node.inputs[:2] if v is not None]
            if any(ctx.shape(v) is None for v in values):
                return True
    return False


def _reference_run(
    model: ir.Model,
    options: AutoCastOptions,
    sentinels: Mapping[str, float] | None = None,
    keep: ReferenceOutputs | None = None,
) -> ReferenceResult:
    """Range statistics of every float tensor on the calibration data (or realistic random data); tensors of
    attention masks (``sentinels``: name -> threshold) are also measured past their sentinels. ``keep`` holds
    the batches and the FP32 outputs of every batch (for ``target_accuracy``)."""

    def run(batches: CalibrationData) -> ReferenceResult:
        observers: list[Observer] = [RangeObserver(sentinels=sentinels)]
        if keep is not None:
            observers.append(keep.observer(model, batches))
        return run_reference(model, batches, observers=observers, providers=options.providers)

    hold = keep is not None  # the batches are read again by the target search
    return CalibrationArgs(options.calibration_data, options.input_shape_map).run(model, run, keep=hold)


def _fill_types(model: ir.Model, reference: ReferenceResult) -> None:
    """Replaces guessed or missing element types with those ONNX Runtime observed.

    Only outputs of custom ops (whose types :class:`InferTypesPass` guessed) and untyped values: numpy has no
    FP8 or BF16 dtype, so an observed dtype is not the truth about a known type (FP8 arrives as uint8).
    """
    opsets = opsets_by_domain(model)
    for node in model.graph:
        guessed = not is_standard_op(node, opsets.get(normalized_domain(node.domain), 1))
        for out in node.outputs:
            if not guessed and out.dtype is not None:
                continue
            stats = (reference.stats or {}).get(str(out.name))
            if stats is not None:
                observed = ir.DataType.from_numpy(stats.dtype)
                if out.dtype != observed:
                    out.dtype = observed


def _widen(model: ir.Model, low: ir.DataType) -> tuple[dict[str, ir.DataType], frozenset[ir.Node]]:
    """Makes an FP16, BF16 or mixed model an FP32 one to classify and convert like any other (ModelOpt classifies
    every float node too, whatever its type). Widening is exact and keeps every name, so the reference run's
    statistics of the model as given still apply.

    Returns:
        The FP16/BF16 graph inputs and outputs (name -> type), which ``keep_io_types`` keeps in their type, and
        the nodes whose float inputs and outputs are all ``low`` already: they stay low unless the user excludes
        them (the automatic rules do not apply to what the model already runs in that type).
    """
    graph = model.graph
    io_types = {
        str(v.name): dtype for v in (*graph.inputs, *graph.outputs) if (dtype := tensor_dtype(v)) in LOW_FLOAT_TYPES
    }
    already_low = set()
    widen = bool(io_types) or any(v.dtype in LOW_FLOAT_TYPES for v in graph.initializers.values())
    for node in graph.all_nodes():
        floats = {tensor_dtype(v) for v in (*node.inputs, *node.outputs) if v is not None} & FLOAT_TYPES
        widen = widen or bool(floats & LOW_FLOAT_TYPES)
        if floats == {low}:
            already_low.add(node)
    if not widen:
        return {}, frozenset()
    WidenToFp32Pass()(model)
    kind = low.name.lower()
    logger.info(
        "The model has FP16/BF16 tensors: classified as FP32 ones; %d nodes already in %s stay so unless excluded "
        "by name, op type or a custom rule.",
        len(already_low),
        kind,
    )
    return io_types, frozenset(already_low)


class _ExceptNodes:
    """An automatic rule (ranges, depth of reduction) that leaves ``nodes`` alone: the nodes the input model
    already runs in the low type."""

    def __init__(self, rule: Rule, nodes: frozenset[ir.Node]) -> None:
        self.rule = rule
        self.nodes = nodes

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        return None if node in self.nodes else self.rule(node, ctx)


def _rules(options: AutoCastOptions, already_low: frozenset[ir.Node] = frozenset()) -> tuple[list[Rule], list[Rule]]:
    rules: list[Rule] = []
    if options.exclude_patterns:
        rules.append(NodeNameRule(options.exclude_patterns))
    if options.op_types_to_exclude:
        rules.append(OpTypeRule(options.op_types_to_exclude))
    automatic: list[Rule] = []
    if math.isfinite(options.init_max):
        automatic.append(InitializerRangeRule(options.init_max))
    if math.isfinite(options.data_max):
        automatic.append(DataRangeRule(options.data_max, options.low))
    if options.max_depth_of_reduction is not None:
        automatic.append(DepthOfReductionRule(options.max_depth_of_reduction))
    rules += [_ExceptNodes(rule, already_low) if already_low else rule for rule in automatic]
    if options.custom_rule is not None:
        rules.append(UserRule(options.custom_rule))
    includes: list[Rule] = []
    if options.include_patterns:
        includes.append(NodeNameRule(options.include_patterns, "nodes_to_include"))
    if options.op_types_to_include:
        includes.append(OpTypeRule(options.op_types_to_include, "op_types_to_include"))
    return rules, includes


@dataclasses.dataclass
class Conversion:
    """One conversion's state, which the steps of :data:`STEPS` fill in order."""

    source: ModelSource
    options: AutoCastOptions
    fp32_nodes: Mapping[str, str]
    """:func:`node_keys` key -> reason: nodes kept FP32 whatever the rules say (kernel gaps of earlier attempts)."""
    refuse_kernel_gaps: bool
    report: AutoCastReport
    model: ir.Model = dataclasses.field(init=False)
    contract: IOContract = dataclasses.field(init=False)
    mask_regions: list[masks.MaskRegion] = dataclasses.field(default_factory=list)
    keep: ReferenceOutputs | None = None
    """The batches and FP32 outputs kept for the accuracy target's search."""
    reference: ReferenceResult | None = None
    io_types: dict[str, ir.DataType] = dataclasses.field(default_factory=dict)
    rules: list[Rule] = dataclasses.field(default_factory=list)
    includes: list[Rule] = dataclasses.field(default_factory=list)
    ctx: RuleContext = dataclasses.field(default_factory=RuleContext)

    def clone(self, model: ir.Model, decisions: Mapping[ir.Node, Decision], options: AutoCastOptions) -> ir.Model:
        """A converted copy of the classified model with the model's interface types (:func:`_converted_clone`)."""
        return _converted_clone(model, decisions, options, self.io_types)


def _load(run: Conversion) -> None:
    """Loads, checks the model and the options against it, and sanitizes it (at the model's own opset when the
    upgrade fails)."""
    run.model = model = load_model(run.source)
    _check_convertible(model)
    _check_op_types(model, run.options)
    run.contract = IOContract.of(model)
    try:
        _sanitize(model, run.options)
    except OpsetUpgradeError as e:
        if isinstance(run.source, ir.Model):
            raise  # the caller's model was changed in place: it cannot be read again
        run.model = model = load_model(run.source)
        own = default_opset(model)
        logger.warning("%s; converting at the model's own opset %d instead.", str(e).split(";")[0], own)
        _sanitize(model, run.options, opset=own)


def _reference(run: Conversion) -> None:
    """Finds the attention masks and, where a rule or the target needs data, runs the FP32 model on it."""
    run.mask_regions = masks.find_mask_regions(run.model)
    sentinels = masks.sentinel_thresholds(run.mask_regions)
    run.keep = ReferenceOutputs() if run.options.target is not None else None
    if run.keep is not None or _needs_reference(run.model, run.options):
        run.reference = _reference_run(run.model, run.options, sentinels, run.keep)
        _fill_types(run.model, run.reference)
        run.report.reference_batches = run.reference.num_batches


def _classify(run: Conversion) -> None:
    """Decides each node's precision: the rules, the masks' rewrite, the nodes the input already runs low, the
    kernel gaps of earlier attempts and those found up front."""
    model, options, report = run.model, run.options, run.report
    run.io_types, already_low = _widen(model, options.low)
    run.rules, run.includes = _rules(options, already_low)
    stats = run.reference.stats if run.reference else None
    for region in run.mask_regions:
        region.rewrite(options.low, stats)
    report.mask_regions = run.mask_regions
    run.ctx = RuleContext(stats=masks.stats_past_sentinels(stats, run.mask_regions, options.low))
    report.decisions = classify(
        model, low=options.low, rules=run.rules, includes=run.includes, ctx=run.ctx, plugins=options.plugins
    )
    low_name = options.low_precision_type.upper()
    for node in already_low:
        decision = report.decisions.get(node)
        if decision is not None and decision.low and decision.reason == "default":
            report.decisions[node] = dataclasses.replace(decision, reason=f"already {low_name} in the input model")
    if run.fp32_nodes:
        keys = node_keys(report.decisions)
        for node in report.decisions:
            if keys[node] in run.fp32_nodes:
                report.decisions[node] = Decision(False, run.fp32_nodes[keys[node]])
    report.no_kernel = keep_kernel_gaps(model, report.decisions, options, refuse=run.refuse_kernel_gaps)


def _search_target(run: Conversion) -> None:
    """The accuracy target's search: as many nodes low as the outputs allow (:mod:`onnxprec.autocast.target`)."""
    assert run.keep is not None and run.options.target is not None
    report = run.report
    search = target.Problem.of(
        run.model, report.decisions, run.options, run.rules, run.includes, run.ctx, run.keep, run.clone
    )
    report.decisions, report.target_search, report.numeric = target.search(search)
    run.keep.close()  # the spooled batches (on an error, garbage collection removes them)


def _convert_classified(run: Conversion) -> None:
    """Converts the model as decided (the HTML report's details measured first, on a converted copy)."""
    model, options, report = run.model, run.options, run.report
    report.random_data = options.calibration_data is None
    report.settings = {"data_max": options.data_max, "init_max": options.init_max,
                       "keep_io_types": options.keep_io_types}  # fmt: skip
    if options.report is not None:
        stats = run.reference.stats if run.reference else None
        report.details = _details(model, report.decisions, options, run.ctx.stats, stats, run.reference, run.clone)
    converted, widened = _convert(model, report.decisions, options, run.io_types)
    for node in widened:
        report.decisions[node] = Decision(False, MOVES_ONLY)
    warn_cast_shared_kv(model)
    report.stats = converted.stats
    report.stats.casts = sum(1 for cast in converted.casts if cast.graph is not None)  # left after the cleanup
    if report.details is not None:
        report.details.count_casts(converted.casts)


def _validate(run: Conversion) -> None:
    """Checks the interface types and the structure (ONNX Runtime alone judges a model onnx.checker rejects as
    given)."""
    model, report = run.model, run.report
    check_io_contract(model, run.contract.expected(run.options.low, run.options.keep_io_types))
    try:
        report.ort_only = check_structure(model)
    except ValidationError as e:
        if not _checker_rejects_original(run.source):
            raise
        report.ort_only = {"ops of a model onnx.checker rejects": sum(1 for _ in model.graph.all_nodes())}
        logger.warning(
            "onnx.checker rejects the original model too, so it cannot judge the conversion (%s); the result "
            "is checked by ONNX Runtime only.",
            str(e.__cause__ or e).splitlines()[0][:200],
        )


STEPS: tuple[Step[Conversion], ...] = (
    Step("load+sanitize", _load),
    Step("reference", _reference),
    Step("classify", _classify),
    Step("target", _search_target, when=lambda run: run.keep is not None),
    Step("convert", _convert_classified),
    Step("validate", _validate, when=lambda run: run.options.validate),
)
"""AutoCast's pipeline, each step timed in the report under its name."""


def _details(
    model: ir.Model,
    decisions: Mapping[ir.Node, Decision],
    options: AutoCastOptions,
    seen: Mapping[str, TensorStats] | None,
    measured: Mapping[str, TensorStats] | None,
    reference: ReferenceResult | None,
    converted_clone: Callable[[ir.Model, Mapping[ir.Node, Decision], AutoCastOptions], ir.Model],
) -> Details:
    """What the HTML report shows per node; the errors along the graph on the first calibration sample
    (``converted_clone``: :func:`_converted_clone` with the model's interface types)."""
    found = Details.of(model, seen, measured)
    if reference is None:
        found.error_note = "errors along the graph not measured: no reference run (data_max inf)"
        return found
    with timed() as clock:
        converted = converted_clone(model, decisions, options)
        feeds = first_sample(reference.first_feeds)
        found.errors, found.error_note = layer_errors(model, converted, feeds, options.providers)
    logger.info("Errors along the graph: %d tensors (%.1f s)", len(found.errors), clock.seconds)
    return found


def _convert(
    model: ir.Model,
    decisions: Mapping[ir.Node, Decision],
    options: AutoCastOptions,
    io_types: Mapping[str, ir.DataType] | None,
) -> tuple[ConvertPrecisionResult, list[ir.Node]]:
    """Converts the classified model in place: precisions, casts, then the redundant casts, the islands that only
    move data between casts (:class:`WidenMovementIslandsPass`) and unused nodes go. ``io_types``: the FP16/BF16
    inputs and outputs of a widened model (:func:`_widen`), kept with keep_io_types.

    Returns:
        The conversion's result (its low-node count without the islands) and the island nodes returned to FP32.
    """
    convert = ConvertPrecisionPass(
        dict(decisions),
        options.low,
        keep_io_types=options.keep_io_types,
        init_conversion_max_bytes=options.init_conversion_max_bytes,
        io_types=io_types,
    )
    cleanup = RemoveRedundantCastsPass(options.init_conversion_max_bytes)
    converted, _, islands, _ = run_passes(model, convert, cleanup, WidenMovementIslandsPass(), RemoveUnusedNodesPass())
    assert isinstance(converted, ConvertPrecisionResult) and isinstance(islands, WidenMovementIslandsResult)
    converted.stats.low_nodes -= len(islands.widened)
    return converted, islands.widened


def _converted_clone(
    model: ir.Model,
    decisions: Mapping[ir.Node, Decision],
    options: AutoCastOptions,
    io_types: Mapping[str, ir.DataType] | None = None,
) -> ir.Model:
    """A converted copy of the classified model (weights shared until converted); the model is unchanged."""
    clone = clone_model(model)
    nodes = dict(zip(model.graph.all_nodes(), clone.graph.all_nodes()))
    _convert(clone, {nodes[node]: decision for node, decision in decisions.items()}, options, io_types)
    return clone


def _checker_rejects_original(source: ModelSource) -> bool:
    """Whether the user's model fails the same structural check (an ONNX bug, e.g. MVN-13's function body)."""
    if isinstance(source, ir.Model):
        return False  # converted in place: the original is gone
    try:
        check_structure(load_model(source))
    except ValidationError:
        return True
    return False
