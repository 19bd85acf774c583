"""INT8 post-training quantization: the pipeline and its public functions (``onnxprec.quantization.int8``).

The pipeline, one step each::

    load -> check -> sanitize (names, constants, Pad folded into Conv, opset >= 13) -> place (per runtime)
         -> calibrate (one pass: histograms of static tensors, channel statistics, token samples of dynamic inputs,
            the float outputs) -> decide (ranges, outlier split, SmoothQuant, weight scales, bias correction)
         -> build -> [float fallback until the accuracy target holds] -> [AutoCast of the float remainder]
         -> validate -> save (INT8 weights computed while written)

``quantize`` takes ModelOpt's ``quantize(quantize_mode="int8")`` arguments and writes the model (as ModelOpt does)
and returns the report; ``quantize_model`` stops before saving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnxprec import _ort, calibration
from onnxprec._io import ModelSource, check_output_path, external_data_paths, load_model, save_model
from onnxprec._ops import QUANTIZED_OPS, default_opset
from onnxprec._options import fields_in, log_level_during, options_from_call
from onnxprec.calibration_data import CalibrationData, run_on_data
from onnxprec.errors import InvalidArgumentError, OnnxprecError, UnsupportedModelError
from onnxprec.observers import ChannelStatsObserver, HistogramObserver, Observer, RunSampleObserver
from onnxprec.passes import InferTypesPass, LiftFloatConstantsPass, NameNodesPass, UpgradeOpsetPass
from onnxprec.passes.fold_pad_into_conv import FoldPadIntoConvPass
from onnxprec.quantization.activation_stats import pruned_copy, quiet_onnx_ir
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.decide import Decisions, Statistics, build, decide, plan_for
from onnxprec.quantization.int8.fallback import measure, search, worst_errors
from onnxprec.quantization.int8.grams import ConvGeometry, HessianObserver
from onnxprec.quantization.int8.place import Plan
from onnxprec.reference import run_reference
from onnxprec.validate import check_structure, load_in_ort

__all__ = ["Int8Options", "Int8Report", "default_output_path", "quantize", "quantize_file", "quantize_model"]

logger = logging.getLogger(__name__)

MIN_OPSET = 13  # per-axis DequantizeLinear
_INT8_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "Cast")


def default_output_path(onnx_path: str | Path) -> Path:
    """``<name>.quant.onnx`` beside the input (ModelOpt's default)."""
    path = Path(onnx_path)
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    return path.with_name(f"{stem}.quant.onnx")


# ---------------------------------------------------------------------------------------------------
# Steps


def _check_quantizable(model: ir.Model) -> None:
    quantized = sorted({n.op_type for n in model.graph.all_nodes() if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise UnsupportedModelError(
            f"The model is already quantized (it has {', '.join(quantized)} nodes): pass the float model."
        )


def _sanitize(model: ir.Model) -> None:
    """Names every node, lifts float constants, folds zero Pads into Convs, raises the opset to 13 and fills in the
    element types the placement reads."""
    with quiet_onnx_ir():
        NameNodesPass()(model)
        LiftFloatConstantsPass()(model)
        FoldPadIntoConvPass()(model)
        if default_opset(model) < MIN_OPSET:
            try:
                UpgradeOpsetPass(MIN_OPSET)(model)
            except Exception as e:
                raise UnsupportedModelError(
                    f"INT8 needs opset {MIN_OPSET} (per-channel DequantizeLinear) and the upgrade failed "
                    f"({str(e).splitlines()[0]}): upgrade the model to opset {MIN_OPSET} or later yourself."
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
    _check_quantizable(model)
    _sanitize(model)
    plan = plan_for(model, options)
    report.excluded, report.skipped = plan.excluded, plan.skipped
    if not plan.layers:
        hint = " (all excluded by nodes_to_exclude or op_types_to_exclude)" if plan.excluded else ""
        raise UnsupportedModelError(
            f"Nothing to quantize{hint}: the model has no Conv, MatMul or Gemm whose weight is a float32 initializer "
            f"and whose input is computed ({len(plan.skipped)} skipped; see --log_level DEBUG)."
        )
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
        del stats
        report.seconds["decisions"] = time.perf_counter() - tick
        float_layers: list[str] = []
        if target is not None and keep is not None:
            tick = time.perf_counter()
            names = [layer.name for layer in plan.layers if layer.name in decisions.layers]
            proxy = {
                name: float(d.entry.info.get("sample_error_final", 0.0)) if d.entry is not None else 0.0
                for name, d in decisions.layers.items()
            }

            def check(floats: Collection[str]) -> Any:
                candidate, _ = _apply(model, options, decisions, floats)
                return measure(candidate, target, keep, list(options.calibration_eps))

            float_layers, final = search(
                names, check, target, proxy, report.fallback_steps, cost, options.max_float_compute
            )
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
        report.layers.append(entry)
    if options.float_type != "fp32":
        result = _autocast(result, options, report)
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
    report.autocast = autocast_report.summary
    report.seconds["autocast"] = time.perf_counter() - tick
    return converted


# ---------------------------------------------------------------------------------------------------
# Public functions


def quantize(
    onnx_path: str | Path,
    calibration_data: Any = None,
    calibration_method: str | None = None,
    calibration_data_reader: Any = None,
    calibration_eps: Sequence[str] = ("cpu",),
    op_types_to_quantize: Sequence[str] | None = None,
    op_types_to_exclude: Sequence[str] | None = None,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    output_path: str | Path | None = None,
    log_level: str = "INFO",
    high_precision_dtype: str | None = None,
    **kwargs: Any,
) -> Int8Report:
    """INT8 quantization with ModelOpt's ``quantize(quantize_mode="int8")`` arguments; writes ``output_path``.

    Args:
        onnx_path: Path to the float model.
        calibration_data: Calibration inputs: a path (an ``.npz`` file, a folder of ``.npz`` files, a Polygraphy
            ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX Runtime
            ``CalibrationDataReader``; None: realistic random data; the ranges of static activations, SmoothQuant
            and the accuracy target are fitted to it.
        calibration_method: How the ranges of static activations are calibrated: max (the extremes seen), entropy
            (TensorRT's KL threshold), percentile (of |x|, --percentile), mse (the clip with the least squared
            error) (default: max on --runtime ort-cpu, where entropy clipped EfficientNet-Lite0's ReLU6 and residual
            tensors (rel L2 0.17 against 0.05 on held-out images); entropy elsewhere, as ModelOpt; dynamic
            activations need none).
        calibration_data_reader: An ONNX Runtime ``CalibrationDataReader`` (or any source ``calibration_data``
            takes); give one of the two.
        calibration_eps: ONNX Runtime providers for calibration: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        op_types_to_quantize: Only these op types (Conv, MatMul, Gemm, and the static region's Add, Mul, Concat,
            pools) (default: all supported).
        op_types_to_exclude: Op types kept in float.
        nodes_to_quantize: Only nodes whose name or output name matches one of these regexes (re.search) (default:
            all).
        nodes_to_exclude: Regexes (re.search) of nodes kept in float, matched against the node name and its output
            names.
        use_external_data_format: Save the weights in <output>.data beside the model (automatic above 2 GB).
        output_path: Where to write; default ``<name>.quant.onnx`` beside the input (ModelOpt's).
        log_level: Log level of the ``onnxprec`` logger during the call: DEBUG, INFO, WARNING, ERROR.
        high_precision_dtype: Type of what stays in float: fp32, or fp16/bf16 by AutoCast on the float remainder
            (default: fp32 on --runtime ort-cpu, where FP16 is slow; fp16 on trt and ort-cuda, as ModelOpt).
        **kwargs: Any other :class:`Int8Options` field: ``runtime`` (ort-cpu, ort-cuda, trt), ``activations``,
            ``target_accuracy``, ``smoothquant``, ``outlier_channels``, ``bias_correction``, ``percentile``,
            ``calibration_batch_size``, ``sample_tokens``, ``input_shapes``.

    Returns:
        The report; ``report.to_json()`` is JSON-ready.

    Raises:
        OnnxprecError: A bad argument, model, calibration data or output path; the message says how to fix it.
    """
    params = fields_in(Int8Options, locals())
    options = options_from_call(Int8Options, params, kwargs, "INT8")
    return quantize_file(onnx_path, output_path, options=options)


def quantize_file(
    onnx_path: str | Path,
    output_path: str | Path | None = None,
    *,
    external_data: bool | None = None,
    options: Int8Options | None = None,
    **kwargs: Any,
) -> Int8Report:
    """Quantizes a model file into a new file (INT8 weights computed while it is written).

    Args:
        onnx_path: The float model.
        output_path: Where to write; default ``<name>.quant.onnx`` beside the input.
        external_data: True: weights in ``<output>.data``; None: as ``use_external_data_format``, else only when
            above 2 GB.
        options: The settings as one object (e.g. built from command-line flags); or pass them as ``kwargs``.
        **kwargs: Any :class:`Int8Options` field.

    Raises:
        OnnxprecError: A bad argument, model, calibration data or output path; the message says how to fix it.
    """
    if options is None:
        options = options_from_call(Int8Options, {}, kwargs, "INT8")
    elif kwargs:
        raise InvalidArgumentError(
            f"quantize_file got both options= and {', '.join(sorted(kwargs))}=: pass the settings one way."
        )
    source = Path(onnx_path)
    output = Path(output_path) if output_path is not None else default_output_path(source)
    protected = {source.resolve()} if source.exists() else set()
    check_output_path(output, protected)  # fail before the work, not after
    if external_data is None and options.use_external_data_format:
        external_data = True
    with log_level_during(options.log_level):
        try:
            model, report = quantize_model(source, options)
        except OnnxprecError:
            raise
        report.input_path = source
        protected |= external_data_paths(model)
        tick = time.perf_counter()
        report.output_path = save_model(
            model,
            output,
            external_data=external_data,
            protected=protected,
            check=lambda path: load_in_ort(str(path), report.ort_only, providers=list(options.calibration_eps)),
        )
        report.seconds["save"] = time.perf_counter() - tick
        logger.info("%s; saved %s", report.summary, output)
    return report
