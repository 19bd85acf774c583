"""INT8 post-training quantization: the pipeline and its public functions (``onnxprec.quantization.int8``).

The pipeline, one step each::

    load -> check -> sanitize (names, constants, same-type Casts, layout Transposes and per-channel affine chains
         folded, Pad folded into Conv, opset >= 13) -> place (per runtime)
         -> calibrate (one pass: histograms of static tensors, channel statistics, token samples of dynamic inputs,
            the float outputs) -> decide (ranges, outlier split, SmoothQuant, weight scales, bias correction)
         -> build -> [float fallback until the accuracy target holds] -> [AutoCast of the float remainder]
         -> validate -> save (INT8 weights computed while written)

``quantize_file`` writes the model and returns the report (ModelOpt's ``quantize(quantize_mode="int8")`` is
:func:`onnxprec.quantization.quantize`); ``quantize_model`` stops before saving.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from onnxprec import _ort, calibration
from onnxprec._graph import NameAllocator, all_graphs
from onnxprec._io import ModelSource, load_model
from onnxprec._ops import default_opset
from onnxprec._ort_profile import unfused_qdq
from onnxprec._report import Step
from onnxprec.accuracy import ReferenceOutputs, output_producers
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import CalibrationDataError, UnsupportedModelError
from onnxprec.observers import ChannelStatsObserver, HistogramObserver, Observer, RunSampleObserver
from onnxprec.passes import (
    InferTypesPass,
    LiftFloatConstantsPass,
    NameNodesPass,
    RemoveRedundantCastsPass,
    RemoveRedundantCastsResult,
    UpgradeOpsetPass,
)
from onnxprec.passes.cancel_transposes import CancelTransposesPass, CancelTransposesResult
from onnxprec.passes.fold_affine_into_weights import FoldAffineIntoWeightsPass, FoldAffineIntoWeightsResult
from onnxprec.passes.fold_pad_into_conv import FoldPadIntoConvPass
from onnxprec.passes.widen_to_fp32 import WidenToFp32Pass
from onnxprec.quantization import guard
from onnxprec.quantization._tool import (
    QuantizationTool,
    check_float_model,
    check_selection,
    nothing_to_quantize,
    remainder_only,
)
from onnxprec.quantization.activation_stats import quiet_onnx_ir
from onnxprec.quantization.int8 import input_layers
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.accuracy_steps import apply_decisions, check_result, search_float_layers, widen
from onnxprec.quantization.int8.branches import BranchView, branch_view
from onnxprec.quantization.int8.decide import Decisions, Statistics, decide, plan_for
from onnxprec.quantization.int8.fallback import estimated_sensitivity
from onnxprec.quantization.int8.grams import ConvGeometry, HessianObserver
from onnxprec.quantization.int8.place import WEIGHT_OPS, Plan, pattern_names
from onnxprec.quantization.int8.rewrite import fold_casts_into_qdq
from onnxprec.reference import run_reference
from onnxprec.validate import check_structure

if TYPE_CHECKING:
    from onnxprec.accuracy import AccuracyTarget, Producer

__all__ = ["Int8Options", "Int8Report", "default_output_path", "quantize_file", "quantize_model"]

logger = logging.getLogger(__name__)

MAX_UNFUSED_COUNT_BYTES = 1 << 30  # larger outputs: no optimizing session to count the unfused Q/DQ
PREPROCESSED_KEY = "onnx.quant.pre_process"  # the metadata ONNX Runtime's quant_pre_process (our preprocess) writes
LOW_QDQ_OPSET = 19  # QuantizeLinear/DequantizeLinear on FP16/BF16 values with FP16/BF16 scales
_LAYERS = "Conv, MatMul or Gemm whose weight is a float (FP32, FP16, BF16) initializer and input computed"
_INT8_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "Cast")


# ---------------------------------------------------------------------------------------------------
# Steps


def _sanitize(model: ir.Model, options: Int8Options) -> dict[str, int]:
    """Names every node, lifts float constants, widens FP16/BF16 to FP32 (the model's inputs and outputs keep their
    type behind Casts; the float remainder is FP32 on ort-cpu, AutoCast's elsewhere), folds layout Transposes and
    per-channel affine chains into the layers (:func:`_fold_structure`, whose counts it returns), zero Pads into Convs,
    raises the opset to what the Q/DQ nodes need (13; 19 where the Q/DQ pairs of --runtime trt will read and write the
    FP16/BF16 remainder, and for FP8) and fills in the element types the placement reads."""
    needed = options.qdq_opset
    with quiet_onnx_ir():
        NameNodesPass()(model)
        LiftFloatConstantsPass()(model)
        WidenToFp32Pass(keep_io=True)(model)  # an FP16/BF16 model computed in FP32, its inputs and outputs kept
        structure = _fold_structure(model)
        FoldPadIntoConvPass()(model)
        if default_opset(model) < needed:
            try:
                UpgradeOpsetPass(needed)(model)
            except Exception as e:
                raise UnsupportedModelError(
                    f"{options.TOOL} needs opset {needed} (per-channel DequantizeLinear; FP16/BF16 and FP8 Q/DQ from "
                    f"19) and the upgrade failed ({str(e).splitlines()[0]}): upgrade the model to opset {needed} or "
                    "later yourself."
                ) from None
        InferTypesPass()(model)
    model.ir_version = max(model.ir_version, 7)
    return structure


def _fold_structure(model: ir.Model) -> dict[str, int]:
    """Removes what keeps Convs apart once quantized (exact; a TensorFlow export's NHWC Transposes, same-type Casts
    and BatchNorm written as Sub/Mul/Add): float-to-float Casts go, element-wise regions move across their layout
    Transposes where that removes Transposes, and per-channel Add/Sub/Mul/Div fold into the Conv, Gemm or MatMul
    before them. Returns what each step removed."""
    counts = {"casts_removed": 0}
    if any(node.op_type == "Cast" for node in model.graph):
        InferTypesPass()(model)  # the Casts' input types
        casts = RemoveRedundantCastsPass()(model)
        assert isinstance(casts, RemoveRedundantCastsResult)
        counts["casts_removed"] = casts.removed
    transposes = CancelTransposesPass()(model)
    assert isinstance(transposes, CancelTransposesResult)
    counts["transposes_removed"] = transposes.removed - transposes.inserted
    folded = FoldAffineIntoWeightsPass()(model)
    assert isinstance(folded, FoldAffineIntoWeightsResult)
    counts["affine_folded"] = folded.folded
    return counts


def _observers(
    plan: Plan, options: Int8Options
) -> tuple[HistogramObserver, ChannelStatsObserver, RunSampleObserver, HessianObserver]:
    static = [str(v.name) for v in plan.static_tensors]
    axes: dict[str, int] = {}
    geometries: dict[str, ConvGeometry | None] = {}
    for layer in plan.layers:
        name = str(layer.activation.name)
        conv = layer.node.op_type == "Conv"
        axes[name] = 1 if conv else -1
        if options.weight_rounding == "gptq" or (options.weight_rounding == "auto" and conv):
            geometry = ConvGeometry.of(layer.node) if conv else None
            if (geometry is not None or not conv) and geometries.get(name, geometry) == geometry:
                geometries[name] = geometry
    dynamic = [str(v.name) for v in plan.dynamic_groups]
    return (
        HistogramObserver(static),
        ChannelStatsObserver(axes),
        RunSampleObserver(options.sample_tokens, dynamic),
        HessianObserver(geometries),
    )


def _calibrate(
    model: ir.Model, plan: Plan, options: Int8Options, report: Int8Report, keep: ReferenceOutputs
) -> tuple[Statistics, CalibrationData | None, ReferenceOutputs | None, Plan, BranchView | None]:
    """One pass over the calibration data (or realistic random data) with every observer the decisions need, the
    float outputs of each run kept in ``keep``; the held-out runs (the last quarter of 8 or more,
    :meth:`~onnxprec.calibration_data.CalibrationData.held_out`) are only run for their float outputs. A model with
    layers inside If branches runs a copy with the branches the data takes inlined (:func:`branch_view`), and is
    placed again with the layers of the other branches in float.

    Returns:
        The statistics, the data (to close once the outputs are no longer needed), the held-out float outputs, the
        placement and the branches calibration saw (None: no layer inside an If branch).
    """
    held: list[CalibrationData] = []
    held_out: list[ReferenceOutputs] = []
    made: dict[str, Any] = {"plan": plan, "view": None}

    def run(data: CalibrationData) -> None:
        held.append(data)
        # static ranges fit few runs; without the guard (quantize_static, --no_accuracy_guard) every run calibrates,
        # as ONNX Runtime's quantizer does
        calibration, rest = data.held_out(split=bool(plan.static_tensors)) if options.bounded else (data, None)
        observed, placed = model, plan
        if plan.in_branches:
            view = branch_view(model, calibration, lambda node: node.name in _names(plan), options.calibration_eps)
            placed = plan_for(model, options, calibrated=view.calibrated(), varying=view.varying)
            observed, made["view"] = view.model, view
        made["plan"] = placed
        made["observers"] = hist, channels, samples, hessians = _observers(placed, options)
        wanted = set(hist.names or ()) | set(channels.axes) | set(samples.names or ())
        if hessians.names:
            hessians.batches = len(calibration)  # the Hessians' row samples spread over the calibration runs
        observers: list[Observer] = [hist, channels, samples, hessians, keep.observer(observed, calibration)]
        result = run_reference(
            observed,
            calibration,
            select=lambda value: str(value.name) in wanted,
            observers=observers,
            providers=list(options.calibration_eps),
        )
        report.calibration.update(
            {"batches": result.num_batches, "samples": calibration.samples, "random": data.random}
        )
        if rest is not None:
            outputs = guard.BoundedOutputs()
            run_reference(model, rest, select=(), observers=[outputs.observer(model, rest)],
                          providers=list(options.calibration_eps))  # fmt: skip
            held_out.append(outputs)
            report.calibration["held_out_batches"] = rest.batches

    if options.source is None and _fits_activations(plan, options):  # not for weights alone (asked for: the flag)
        logger.warning("%s", _synthetic_warning(model, options))
    CalibrationArgs(options.source, options.input_shapes, options.calibration_batch_size).run(model, run, keep=True)
    hist, channels, samples, hessians = made["observers"]
    stats = Statistics(hist.histograms, channels, samples, hessians)
    return stats, (held[-1] if held else None), (held_out[-1] if held_out else None), made["plan"], made["view"]


def _names(plan: Plan) -> set[str]:
    return {layer.name for layer in plan.layers}


def _fits_activations(plan: Plan, options: Int8Options) -> bool:
    """Whether calibration data decides anything: static ranges, SmoothQuant, outlier channels, bias correction or
    the float fallback."""
    fitted = plan.static_tensors or options.smoothquant or options.outlier_channels or options.bias_correction
    return bool(fitted) or options.target_accuracy is not None


def _refuse_random_data(plan: Plan, options: Int8Options) -> None:
    """Without calibration data, refuses in one line when the data would decide anything (static ranges, SmoothQuant,
    the fallback: :func:`_fits_activations`), unless ``random_calibration_data``: ranges fitted to synthetic inputs
    are not the ranges of real ones, and the accuracy check on the same inputs cannot see it (docs/tools/int8.md,
    "Without calibration data")."""
    if options.source is not None or options.random_calibration_data or not _fits_activations(plan, options):
        return
    raise CalibrationDataError(
        f"No calibration data: {options.TOOL}'s activation ranges would be fitted to synthetic inputs and its "
        "accuracy check could not judge the task on them; pass representative inputs with --calibration_data "
        "(API: calibration_data=), or --random_calibration_data to quantize on synthetic inputs anyway."
    )


def _synthetic_warning(model: ir.Model, options: Int8Options) -> str:
    """The WARNING of a run on synthetic inputs (``random_calibration_data``): what they are, and that the check on
    them cannot judge the task."""
    unlike = calibration.inputs_without_synthetic_form(calibration.input_specs(model))
    inputs = "synthetic images, or random values"
    if unlike:
        names = ", ".join(spec.name for spec in unlike[:3]) + (
            f" and {len(unlike) - 3} more" if len(unlike) > 3 else ""
        )
        inputs = f"random values for {names}, which have no synthetic form"
    return (
        f"No calibration data: {options.TOOL}'s ranges and decisions are fitted to synthetic inputs ({inputs}); the "
        "accuracy check runs on them too and cannot judge the task: measure the result on real inputs (onnxprec "
        "evaluate FLOAT QUANTIZED -d DIR) or pass --calibration_data."
    )


def _costs(plan: Plan, stats: Statistics) -> dict[str, float]:
    """Multiply-adds of each layer on the calibration data: rows (Conv output positions, tokens) times weight size."""
    costs = {}
    for layer in plan.layers:
        name = str(layer.activation.name)
        rows = stats.hessians.rows.get(name) or stats.channels.counts.get(name) or 1
        tensor = layer.weight.const_value
        costs[layer.name] = float(rows) * float(tensor.size if tensor is not None else 1)
    return costs


def _sample_errors(decisions: Decisions) -> dict[str, float | None]:
    """The output error each layer's channel decisions measured on the calibration sample (None: not measured)."""
    return {
        name: d.entry.info.get("sample_error_final") if d.entry is not None else None
        for name, d in decisions.layers.items()
    }


def _declared_shapes(model: ir.Model) -> set[str]:
    """Names of the intermediate values whose shape the model itself declares (its value_info)."""
    return {
        str(node_output.name)
        for graph in all_graphs(model.graph)
        for node in graph
        for node_output in node.outputs
        if node_output.shape is not None
    }


def _forget_inferred_shapes(model: ir.Model, declared: Collection[str]) -> int:
    """Drops the shapes of intermediate values, but those named in ``declared``.

    ONNX shape inference names unknown dimensions ``unk__N`` and shares a name wherever it follows a dimension
    through the graph. Written into the output, those shared names steer ONNX Runtime's fusions: a transformer's
    residual ``Add -> LayerNormalization`` becomes ``SkipLayerNormalization``, whose CPU kernel is slower than the
    pair (experiments/design_notes.md, "INT8 on the CPU"). A float model whose own value_info shares them gets the same
    slow kernels in FP32. Element types stay; inputs and outputs keep their shapes.

    Returns:
        The values whose shape was dropped.
    """
    dropped = 0
    for graph in all_graphs(model.graph):
        outputs = {id(value) for value in graph.outputs}
        for node in graph:
            for value in node.outputs:
                if value.shape is not None and id(value) not in outputs and str(value.name) not in declared:
                    value.shape = None
                    dropped += 1
    logger.debug("Shapes of %d intermediate values left to the runtime's inference", dropped)
    return dropped


@dataclasses.dataclass
class Int8Run:
    """One INT8 run's state, which the steps of :data:`STEPS` fill in order."""

    source: ModelSource
    options: Int8Options
    report: Int8Report
    target: AccuracyTarget | None
    """The user's accuracy target; with none and the guard on, the guard's (set once the outputs are known)."""
    model: ir.Model = dataclasses.field(init=False)
    declared: set[str] = dataclasses.field(default_factory=set)
    """The intermediate shapes the input declares, kept in the output (not on ort-cpu)."""
    plan: Plan = dataclasses.field(init=False)
    branches: BranchView | None = None
    """The If branches calibration saw (None: no layer inside an If branch)."""
    keep: ReferenceOutputs = dataclasses.field(default_factory=guard.BoundedOutputs)
    """The float outputs of the calibration runs: every result is measured against them (nothing silent)."""
    stats: Statistics | None = None
    data: CalibrationData | None = None
    held_out: ReferenceOutputs | None = None
    producers: Mapping[str, Producer | None] = dataclasses.field(default_factory=dict)
    decisions: Decisions = dataclasses.field(init=False)
    cost: dict[str, float] = dataclasses.field(default_factory=dict)
    proxy: dict[str, float] = dataclasses.field(default_factory=dict)
    float_layers: list[str] = dataclasses.field(default_factory=list)
    result: ir.Model = dataclasses.field(init=False)


def _load_and_place(run: Int8Run) -> None:
    """Loads and sanitizes the model and places the Q/DQ for the runtime."""
    options, report = run.options, run.report
    _ort.resolve_providers(options.calibration_eps)  # an EP that is not installed fails now, not after the work
    run.model = model = load_model(run.source)
    check_float_model(model)
    report.preprocessed = PREPROCESSED_KEY in model.metadata_props
    # ONNX Runtime's CPU provider infers every shape itself: the output declares none in between (the fusions they
    # steer include the slow SkipLayerNormalization); on other runtimes it keeps the ones the input declared
    run.declared = _declared_shapes(model) if options.runtime != "ort-cpu" else set()
    report.structure = _sanitize(model, options)
    run.plan = plan = plan_for(model, options)
    check_selection(
        model,
        {"nodes_to_exclude": options.exclude_patterns, "nodes_to_quantize": options.include_patterns},
        {"op_types_to_quantize": options.op_types_to_quantize, "op_types_to_exclude": options.op_types_to_exclude},
        WEIGHT_OPS,
        pattern_names,
    )
    report.excluded, report.skipped = plan.excluded, plan.skipped
    report.in_subgraphs = dict(plan.in_subgraphs)
    if not plan.layers and not remainder_only(options, plan.skipped, plan.excluded or plan.in_subgraphs):
        excluded_by = "nodes_to_exclude or op_types_to_exclude" if plan.excluded else None
        skipped = f"{len(plan.skipped)} skipped"
        if plan.in_subgraphs:
            skipped += f", of which {report.subgraph_text()}"
        raise nothing_to_quantize(_LAYERS, skipped, excluded_by, plan.skipped)


def _calibration(run: Int8Run) -> None:
    """One pass over the data: the statistics, the float outputs (the held-out runs' too) and each output's task."""
    plan, options = run.plan, run.options
    logger.info(
        "%s for %s: %d layers (%d dynamic), %d static tensors", options.TOOL, options.runtime, len(plan.layers),
        sum(layer.dynamic for layer in plan.layers), len(plan.static_tensors),
    )  # fmt: skip
    _refuse_random_data(plan, options)
    run.stats, run.data, run.held_out, run.plan, run.branches = _calibrate(
        run.model, plan, options, run.report, run.keep
    )
    if run.branches is not None:
        _report_branches(run)


def _report_branches(run: Int8Run) -> None:
    """The placement calibration left once it knew the If branches the data takes."""
    plan, report = run.plan, run.report
    report.excluded, report.skipped = plan.excluded, plan.skipped
    report.in_subgraphs = dict(plan.in_subgraphs)
    report.in_branches = plan.in_branches
    if not plan.layers:
        skipped = f"{len(plan.skipped)} skipped, of which {report.subgraph_text()}"
        raise nothing_to_quantize(
            _LAYERS, skipped, "nodes_to_exclude or op_types_to_exclude" if plan.excluded else None, plan.skipped
        )


def _decisions(run: Int8Run) -> None:
    """The decisions from the statistics (ranges, weight rounding, channel fixes), each layer's compute and, for a
    target search over many layers, their estimated sensitivity; the statistics are dropped then."""
    assert run.stats is not None
    run.producers = output_producers(run.model)  # each output's task metric follows the op that writes it
    if run.target is None and run.options.accuracy_guard:
        run.target = guard.RANKING  # the float fallback runs until the guard's verdict holds
    run.decisions = decide(run.model, run.plan, run.stats, run.options)
    if run.branches is not None:  # every build places the layers of the branches calibration saw
        run.decisions.calibrated_branches = frozenset(run.branches.calibrated())
        run.decisions.varying_branches = frozenset(run.branches.varying)
    run.cost = _costs(run.plan, run.stats)
    if run.target is not None:  # above MAX_ISOLATED layers, or where their isolated checks take too long
        run.proxy = estimated_sensitivity(run.plan.layers, _sample_errors(run.decisions), run.stats.hessians.hessians,
                                          run.options.weight_qtype)  # fmt: skip
    run.stats = None


def _widen_step(run: Int8Run) -> None:
    """A16W8: 16 bits where 8 cost the most (:func:`~onnxprec.quantization.int8.accuracy_steps.widen`)."""
    assert run.target is not None
    run.decisions = widen(run.model, run.options, run.plan, run.decisions, run.target, run.producers, run.keep,
                          run.held_out, run.report)  # fmt: skip


def _target_search(run: Int8Run) -> None:
    """The float fallback: the fewest most sensitive layers in float for the target."""
    assert run.target is not None
    options, report, data = run.options, run.report, run.data

    def as_saved(candidate: ir.Model) -> ir.Model:  # as _build writes it: the remainder converted on the data read
        return _autocast(candidate, options, report, data)

    run.float_layers = search_float_layers(run.model, options, run.plan, run.decisions, run.target, run.producers,
                                           run.keep, run.held_out, run.proxy, run.cost, report,
                                           as_saved if options.float_type != "fp32" else None)  # fmt: skip


def _build(run: Int8Run) -> None:
    """The Q/DQ model as decided (the fallback's layers in float), each layer's entry, the float remainder in
    FP16/BF16 when asked, the shapes the runtime infers itself dropped."""
    options, report, decisions = run.options, run.report, run.decisions
    result, applied = apply_decisions(run.model, options, decisions, run.float_layers)
    report.static_tensors = len(applied.static_tensors)
    present = {str(value.name) for value in applied.static_tensors}  # the float fallback may have removed some
    report.wide_tensors = [name for name in report.wide_tensors if name in present]
    report.passthrough = [str(node.name) for node in applied.passthrough]
    fallen = set(run.float_layers)
    for layer in run.plan.layers:
        entry = decisions.layers[layer.name].entry
        if entry is None:
            continue
        if layer.name in fallen:
            entry.mode = "float"
            entry.info["fallback"] = f"kept in float for {report.target or 'the accuracy guard'}"
        elif layer.name in decisions.kept_float:
            entry.mode = "float"
            entry.info["kept_float"] = decisions.kept_float[layer.name]
        report.layers.append(entry)
    if options.float_type != "fp32":
        result = _autocast(result, options, report, run.data)
    _forget_inferred_shapes(result, run.declared)
    report.ort_only = check_structure(result)
    run.result = result


def _accuracy_check(run: Int8Run) -> None:
    """The result measured as it will be saved (see :func:`~onnxprec.quantization.int8.accuracy_steps.check_result`),
    its float remainder as the runtime has it: a result that misses the guard only in FP16/BF16 is refused, not
    rebuilt with an FP32 remainder (``high_precision_dtype="fp32"`` asks for that)."""
    check_result(run.result, run.options, run.producers, run.keep, run.held_out, run.report)


STEPS: tuple[Step[Int8Run], ...] = (
    Step("load+place", _load_and_place),
    Step("calibration", _calibration),
    Step("decisions", _decisions),
    Step("16-bit search", _widen_step, when=lambda run: run.target is not None and run.options.wide_qtype is not None),
    Step("target search", _target_search,
         when=lambda run: run.target is not None and run.options.float_compute > 0),  # 0: no layer in float
    Step("build", _build),
    Step("accuracy check", _accuracy_check),
)  # fmt: skip
"""INT8's pipeline, each step timed in the report under its name."""


def quantize_model(
    source: ModelSource, options: Int8Options, report_type: type[Int8Report] = Int8Report
) -> tuple[ir.Model, Int8Report]:
    """Runs the pipeline (:data:`STEPS`) up to (not including) saving; the returned model's INT8 (FP8) weights are
    lazy tensors.

    Args:
        source: The float model.
        options: The settings (:class:`Int8Options`, or a subclass with other Q/DQ types: FP8's).
        report_type: The report to fill (FP8's says FP8).
    """
    target = options.target
    report = report_type(
        options.runtime, options.method, options.float_type, target=None if target is None else str(target)
    )
    run = Int8Run(source, options, report, target)
    try:
        report.run_steps(STEPS, run)
    finally:
        if run.data is not None:
            run.data.close()
    second = input_layers.second_try(
        run.model, run.plan, options, report, lambda o: quantize_model(run.model, o, report_type)
    )
    return second or (run.result, report)


def _autocast(model: ir.Model, options: Int8Options, report: Int8Report, data: CalibrationData | None) -> ir.Model:
    """The float remainder to FP16/BF16 by AutoCast (Q/DQ scales and INT8 weights untouched), as ModelOpt does, on
    the calibration data already read (a one-shot reader given by the user is spent by then)."""
    from onnxprec.autocast import AutoCastOptions, convert_model

    settings = AutoCastOptions(
        low_precision_type=options.float_type,
        calibration_data=data if data is not None else options.source,
        providers=tuple(options.calibration_eps),
        input_shapes=options.input_shapes,
        # The INT8 nodes keep their FP32 scales and outputs (DequantizeLinear writes FP16 only from opset 19);
        # AutoCast casts at their borders.
        op_types_to_exclude=_INT8_OPS,
        keep_io_types=True,
    )
    with report.step("autocast"):
        converted, autocast_report, _ = convert_model(model, settings)
        if options.runtime == "trt" and default_opset(converted) >= LOW_QDQ_OPSET:
            # not on ort-cuda: ONNX Runtime's CPU fusions mis-run FP16 Q/DQ (ours and ModelOpt's alike, only with
            # graph optimizations on: experiments/design_notes.md); its Casts keep them apart
            fold_casts_into_qdq(converted.graph, NameAllocator(converted))
        report.autocast = autocast_report.summary
    return converted


# ---------------------------------------------------------------------------------------------------
# Public functions


def _count_unfused(path: Path, options: Int8Options, report: Int8Report) -> None:
    """On ort-cpu, the Q/DQ ONNX Runtime leaves unfused in the written model (:func:`_ort_profile.unfused_qdq`)."""
    if options.runtime != "ort-cpu":
        return
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(f"{path.name}*.data"))
    if size > MAX_UNFUSED_COUNT_BYTES:
        logger.debug("Unfused Q/DQ not counted: the output has %d bytes (an optimizing session holds them)", size)
        return
    try:
        with report.step("unfused count"):
            report.unfused = unfused_qdq(path, what="the output")
    except UnsupportedModelError as e:  # the count is information: the output's own checks say what is wrong
        logger.warning("Unfused Q/DQ not counted: %s", e)
        return
    logger.debug("Q/DQ left unfused by ONNX Runtime's CPU provider, by the op beside them: %s", report.unfused)


TOOL: QuantizationTool[Int8Options, Int8Report] = QuantizationTool(Int8Options, quantize_model, inspect=_count_unfused)
default_output_path = TOOL.default_output_path
quantize_file = TOOL.quantize_file
