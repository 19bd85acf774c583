"""INT8 post-training quantization: the pipeline and its public functions (``onnxprec.quantization.int8``).

The pipeline, one step each::

    load -> check -> sanitize (names, constants, Pad folded into Conv, opset >= 13) -> place (per runtime)
         -> calibrate (one pass: histograms of static tensors, channel statistics, token samples of dynamic inputs,
            the float outputs) -> decide (ranges, outlier split, SmoothQuant, weight scales, bias correction)
         -> build -> [float fallback until the accuracy target holds] -> [AutoCast of the float remainder]
         -> validate -> save (INT8 weights computed while written)

``quantize_file`` writes the model and returns the report (ModelOpt's ``quantize(quantize_mode="int8")`` is
:func:`onnxprec.quantization.quantize`); ``quantize_model`` stops before saving.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection
from typing import Any

import onnx_ir as ir

from onnxprec import _ort, calibration
from onnxprec._graph import NameAllocator, all_graphs
from onnxprec._io import ModelSource, load_model
from onnxprec._ops import default_opset
from onnxprec.calibration_data import CalibrationData, run_on_data
from onnxprec.errors import UnsupportedModelError
from onnxprec.observers import ChannelStatsObserver, HistogramObserver, Observer, RunSampleObserver
from onnxprec.passes import InferTypesPass, LiftFloatConstantsPass, NameNodesPass, UpgradeOpsetPass
from onnxprec.passes.fold_pad_into_conv import FoldPadIntoConvPass
from onnxprec.passes.widen_to_fp32 import WidenToFp32Pass
from onnxprec.quantization._tool import QuantizationTool, check_float_model, nothing_to_quantize
from onnxprec.quantization.activation_stats import pruned_copy, quiet_onnx_ir
from onnxprec.quantization.int8 import fallback
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.decide import Decisions, Statistics, build, decide, plan_for
from onnxprec.quantization.int8.emulation import Int8Emulator
from onnxprec.quantization.int8.fallback import estimated_sensitivity, measure, search, worst_errors
from onnxprec.quantization.int8.grams import ConvGeometry, HessianObserver
from onnxprec.quantization.int8.place import Plan
from onnxprec.quantization.int8.rewrite import fold_casts_into_qdq
from onnxprec.reference import run_reference
from onnxprec.validate import check_structure

__all__ = ["Int8Options", "Int8Report", "default_output_path", "quantize_file", "quantize_model"]

logger = logging.getLogger(__name__)

MIN_OPSET = 13  # per-axis DequantizeLinear
LOW_QDQ_OPSET = 19  # QuantizeLinear/DequantizeLinear on FP16/BF16 values with FP16/BF16 scales
_INT8_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "Cast")


# ---------------------------------------------------------------------------------------------------
# Steps


def _sanitize(model: ir.Model, options: Int8Options) -> None:
    """Names every node, lifts float constants, widens FP16/BF16 to FP32 (the model's inputs and outputs keep their
    type behind Casts; the float remainder is FP32 on ort-cpu, AutoCast's elsewhere), folds zero Pads into Convs,
    raises the opset to 13 (19 where the Q/DQ pairs of --runtime trt will read and write the FP16/BF16 remainder) and
    fills in the element types the placement reads."""
    needed = LOW_QDQ_OPSET if options.runtime == "trt" and options.float_type != "fp32" else MIN_OPSET
    with quiet_onnx_ir():
        NameNodesPass()(model)
        LiftFloatConstantsPass()(model)
        WidenToFp32Pass(keep_io=True)(model)  # an FP16/BF16 model computed in FP32, its inputs and outputs kept
        FoldPadIntoConvPass()(model)
        if default_opset(model) < needed:
            try:
                UpgradeOpsetPass(needed)(model)
            except Exception as e:
                raise UnsupportedModelError(
                    f"INT8 needs opset {needed} (per-channel DequantizeLinear; FP16/BF16 Q/DQ from 19) and the upgrade "
                    f"failed ({str(e).splitlines()[0]}): upgrade the model to opset {needed} or later yourself."
                ) from None
        InferTypesPass()(model)
    model.ir_version = max(model.ir_version, 7)


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
    model: ir.Model, plan: Plan, options: Int8Options, report: Int8Report, keep: Any
) -> tuple[Statistics, CalibrationData | None]:
    """One pass over the calibration data (or realistic random data) with every observer the decisions need."""
    hist, channels, samples, hessians = _observers(plan, options)
    wanted = set(hist.names or ()) | set(channels.axes) | set(samples.names or ())
    held: list[CalibrationData] = []

    def run(data: CalibrationData) -> None:
        observers: list[Observer] = [hist, channels, samples, hessians]
        if keep is not None:
            observers.append(keep.observer(model, data))
            held.append(data)
        result = run_reference(
            model,
            data,
            select=lambda value: str(value.name) in wanted,
            observers=observers,
            providers=list(options.calibration_eps),
        )
        report.calibration.update({"batches": result.num_batches, "samples": data.samples, "random": data.random})

    if options.source is None:
        logger.warning(
            "No calibration data: INT8 ranges and decisions are fitted to realistic random inputs; pass "
            "representative inputs (--calibration_data, API: calibration_data=)."
        )
    shapes = calibration.parse_input_shapes(options.input_shapes)
    run_on_data(
        model, options.source, run, input_shapes=shapes or None, batch_size=options.calibration_batch_size,
        keep=keep is not None,
    )  # fmt: skip
    return Statistics(hist.histograms, channels, samples, hessians), (held[0] if held else None)


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
    through the graph. Written into the output, those shared names steer ONNX Runtime's fusions: in MiniLM every
    residual ``Add -> LayerNormalization`` became ``SkipLayerNormalization``, whose CPU kernel took 4x the time of the
    pair (12 nodes: 1.9 ms of a 6.7 ms INT8 run on one thread of a Xeon; ORT 1.32). A float model whose own
    value_info shares them (MiniLM after ``onnx.shape_inference``) gets the same slow kernels in FP32. Element types
    stay; inputs and outputs keep their shapes.

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


def _copy(model: ir.Model) -> ir.Model:
    return pruned_copy(model, [])


def _apply(
    model: ir.Model, options: Int8Options, decisions: Decisions, float_layers: Collection[str] = ()
) -> tuple[ir.Model, Plan]:
    copy = _copy(model)
    plan = build(copy, options, decisions, float_layers)
    return copy, plan


def quantize_model(source: ModelSource, options: Int8Options) -> tuple[ir.Model, Int8Report]:
    """Runs the pipeline up to (not including) saving; the returned model's INT8 weights are lazy tensors."""
    target = options.target
    report = Int8Report(
        options.runtime, options.method, options.float_type, target=None if target is None else str(target)
    )
    tick = time.perf_counter()
    _ort.resolve_providers(options.calibration_eps)  # an EP that is not installed fails now, not after the work
    model = load_model(source)
    check_float_model(model)
    # ONNX Runtime's CPU provider infers every shape itself: the output declares none in between (the fusions they
    # steer include the slow SkipLayerNormalization); on other runtimes it keeps the ones the input declared
    declared = _declared_shapes(model) if options.runtime != "ort-cpu" else set()
    _sanitize(model, options)
    plan = plan_for(model, options)
    report.excluded, report.skipped = plan.excluded, plan.skipped
    if not plan.layers:
        excluded_by = "nodes_to_exclude or op_types_to_exclude" if plan.excluded else None
        layers = "Conv, MatMul or Gemm whose weight is a float (FP32, FP16, BF16) initializer and input computed"
        raise nothing_to_quantize(layers, f"{len(plan.skipped)} skipped", excluded_by)
    report.seconds["load+place"] = time.perf_counter() - tick
    logger.info(
        "INT8 for %s: %d layers (%d dynamic), %d static tensors", options.runtime, len(plan.layers),
        sum(layer.dynamic for layer in plan.layers), len(plan.static_tensors),
    )  # fmt: skip

    tick = time.perf_counter()
    from onnxprec.autocast.target import ReferenceOutputs

    keep = ReferenceOutputs() if target is not None else None
    stats, data = _calibrate(model, plan, options, report, keep)
    report.seconds["calibration"] = time.perf_counter() - tick
    try:
        tick = time.perf_counter()
        decisions = decide(model, plan, stats, options)
        cost = _costs(plan, stats)
        proxy: dict[str, float] = {}
        if target is not None and len(plan.layers) > fallback.MAX_ISOLATED:
            proxy = estimated_sensitivity(plan.layers, _sample_errors(decisions), stats.hessians.hessians)
        del stats
        report.seconds["decisions"] = time.perf_counter() - tick
        float_layers: list[str] = []
        if target is not None and keep is not None:
            tick = time.perf_counter()
            names = [
                layer.name
                for layer in plan.layers
                if layer.name in decisions.layers and layer.name not in decisions.kept_float
            ]

            def check(floats: Collection[str]) -> Any:
                candidate, _ = _apply(model, options, decisions, floats)
                return measure(candidate, target, keep, list(options.calibration_eps))

            with contextlib.ExitStack() as stack:
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
                emulated = fallback.emulates([layer for layer in plan.layers if layer.name in names])
                float_layers, final = search(
                    names, check, target, proxy, report.fallback_steps, cost, options.max_float_compute,
                    emulate if emulated else None, release,
                )  # fmt: skip
            report.accuracy = worst_errors(final)
            report.seconds["target search"] = time.perf_counter() - tick
    finally:
        if data is not None:
            data.close()
    result, applied = _apply(model, options, decisions, float_layers)
    report.static_tensors = len(applied.static_tensors)
    report.passthrough = [str(node.name) for node in applied.passthrough]
    fallen = set(float_layers)
    for layer in plan.layers:
        entry = decisions.layers[layer.name].entry
        if entry is None:
            continue
        if layer.name in fallen:
            entry.mode = "float"
            entry.info["fallback"] = f"kept in float for {target}"
        elif layer.name in decisions.kept_float:
            entry.mode = "float"
            entry.info["kept_float"] = decisions.kept_float[layer.name]
        report.layers.append(entry)
    if options.float_type != "fp32":
        result = _autocast(result, options, report)
    _forget_inferred_shapes(result, declared)
    report.ort_only = check_structure(result)
    return result, report


def _autocast(model: ir.Model, options: Int8Options, report: Int8Report) -> ir.Model:
    """The float remainder to FP16/BF16 by AutoCast (Q/DQ scales and INT8 weights untouched), as ModelOpt does."""
    from onnxprec.autocast import AutoCastOptions, convert_model

    tick = time.perf_counter()
    settings = AutoCastOptions(
        low_precision_type=options.float_type,
        calibration_data=options.source,
        providers=tuple(options.calibration_eps),
        input_shapes=options.input_shapes,
        # The INT8 nodes keep their FP32 scales and outputs (DequantizeLinear writes FP16 only from opset 19);
        # AutoCast casts at their borders.
        op_types_to_exclude=_INT8_OPS,
        keep_io_types=True,
    )
    converted, autocast_report, _ = convert_model(model, settings)
    if options.runtime == "trt" and default_opset(converted) >= LOW_QDQ_OPSET:
        # not on ort-cuda: ONNX Runtime 1.32's CPU fusions mis-run FP16 Q/DQ (EfficientNet-Lite0, ours and ModelOpt's
        # alike: rel L2 0.19 with graph optimizations off, 3.0 with them on); its Casts keep them apart
        fold_casts_into_qdq(converted.graph, NameAllocator(converted))
    report.autocast = autocast_report.summary
    report.seconds["autocast"] = time.perf_counter() - tick
    return converted


# ---------------------------------------------------------------------------------------------------
# Public functions


TOOL: QuantizationTool[Int8Options, Int8Report] = QuantizationTool(Int8Options, quantize_model)
default_output_path = TOOL.default_output_path
quantize_file = TOOL.quantize_file
