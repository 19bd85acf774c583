"""AutoCast's public functions (re-exported lazily by ``onnxprec.autocast``), on the tool base.

``convert_model`` runs the pipeline (:data:`onnxprec.autocast.pipeline.STEPS`: load+sanitize, reference, classify,
target, convert, validate) up to saving; ``convert_until_runs`` is the one retry after a kernel gap (a node ONNX
Runtime cannot run in the low type stays FP32 and the model is converted again);
``convert_to_mixed_precision`` takes the same arguments as ModelOpt's and returns an ``onnx.ModelProto``;
``convert_file`` (:data:`TOOL`, a :class:`onnxprec._tool.ModelTool`) streams path to path (weights converted while
they are written; external data on request or above 2 GB) and returns a report.

Its public names are listed once, in ``onnxprec.autocast.__all__``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import onnx
import onnx_ir as ir

from onnxprec._io import PROTOBUF_LIMIT, ModelSource, WrittenModel, sibling_path, to_model_proto
from onnxprec._options import fields_in
from onnxprec._report import SUMMARY
from onnxprec._tool import FileRun, ModelTool
from onnxprec.accuracy import Producer, TaskMetrics, output_producers
from onnxprec.autocast import report_html
from onnxprec.autocast._options import AutoCastOptions
from onnxprec.autocast.kernel_gaps import KernelGap, raise_kernel_gap
from onnxprec.autocast.pipeline import STEPS, Conversion, check_selection
from onnxprec.autocast.report import AutoCastReport, command_line
from onnxprec.autocast.rules import NodeRuleBase as NodeRuleBase  # re-exported by onnxprec.autocast
from onnxprec.errors import UnsupportedModelError
from onnxprec.reference import ReferenceResult
from onnxprec.validate import (
    NumericReport,
    load_in_ort,
    numeric_check,
    prove_by_run,
)

logger = logging.getLogger(__name__)


def default_output_path(onnx_path: str | Path, low_precision_type: str = "fp16") -> Path:
    """``<name>.fp16.onnx`` (or ``.bf16.onnx``) beside the input."""
    return sibling_path(onnx_path, f".{low_precision_type}")


def convert_model(
    source: ModelSource,
    options: AutoCastOptions,
    *,
    fp32_nodes: Mapping[str, str] | None = None,
    refuse_kernel_gaps: bool = False,
) -> tuple[ir.Model, AutoCastReport, ReferenceResult | None]:
    """Runs the pipeline (:data:`STEPS`) up to (not including) saving. The returned model holds lazily converted
    weights.

    ``fp32_nodes`` (:func:`node_keys` key -> reason) stay FP32 whatever the rules say: nodes ONNX Runtime could
    not run in the low type in an earlier attempt (see :func:`convert_until_runs`). ``refuse_kernel_gaps``: BF16 with
    only the CPU provider is refused up front unless ``keep_unsupported_fp32`` (see :func:`keep_kernel_gaps`).
    """
    run = Conversion(source, options, fp32_nodes or {}, refuse_kernel_gaps, AutoCastReport(options.low_precision_type))
    run.report.run_steps(STEPS, run)
    logger.info(run.report.summary, extra=SUMMARY)
    logger.debug("Timings: %s", {k: round(v, 3) for k, v in run.report.seconds.items()})
    return run.model, run.report, run.reference


T = TypeVar("T")


def convert_until_runs(
    source: ModelSource,
    options: AutoCastOptions,
    check: Callable[[ir.Model, AutoCastReport, ReferenceResult | None, Mapping[str, str]], T],
    *,
    refuse_kernel_gaps: bool = False,
) -> T:
    """Converts, then checks the result with ``check(model, report, reference, fp32_nodes)``; where the check finds
    a node ONNX Runtime cannot run in the low type (it raises :class:`KernelGap`, see :func:`raise_kernel_gap`),
    converts again from the source with that node in FP32 too. The one retry loop of both public functions.

    Returns:
        What ``check`` returns for the conversion that passed it.
    """
    fp32_nodes: dict[str, str] = {}
    while True:
        model, report, reference = convert_model(
            source, options, fp32_nodes=fp32_nodes, refuse_kernel_gaps=refuse_kernel_gaps
        )
        if not fp32_nodes:  # the first conversion
            check_selection(report, options)
        try:
            return check(model, report, reference, fp32_nodes)
        except KernelGap as gap:
            fp32_nodes = {**fp32_nodes, gap.key: gap.reason}


def _output_check(
    report: AutoCastReport,
    reference: ReferenceResult | None,
    options: AutoCastOptions,
    source: ModelSource,
    fp32_nodes: Mapping[str, str],
    producers: Mapping[str, Producer | None],
) -> Callable[[WrittenModel], None] | None:
    """What checks the written output before it replaces ``output_path``: the numeric check's run, which also proves
    the nodes only ONNX Runtime can check (or, without a reference run, loading it in ONNX Runtime), with each
    output's task metric (``producers``: the float model's, :func:`onnxprec.accuracy.output_producers`).

    Raises (from the check):
        KernelGap: ONNX Runtime cannot run a node made low: convert again (:func:`convert_until_runs`).
    """
    if not options.validate:
        return None

    def check(written: WrittenModel) -> None:
        if reference is None or report.numeric is not None:  # no reference run, or target mode ran it
            if report.numeric is None:
                load_in_ort(str(written.path), report.ort_only, providers=list(options.providers))
            elif report.numeric.skipped:
                _load_or_refuse(written, report.numeric, options)
            return
        with report.step("numeric check"):
            task = TaskMetrics(producers)
            report.numeric = numeric_check(written, reference, providers=list(options.providers), task=task)
        raise_kernel_gap(report.numeric, report, options, source, fp32_nodes)
        if report.numeric.skipped:
            _load_or_refuse(written, report.numeric, options)
        _log_numeric(report.numeric)
        prove_by_run(report.numeric, report.ort_only)

    return check


def _load_or_refuse(written: WrittenModel, numeric: NumericReport, options: AutoCastOptions) -> None:
    """After a numeric check ONNX Runtime could not run: the output must at least load on the chosen providers, or
    it is not written (a model the chosen provider cannot load never leaves with success).

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the output (a node without a low-type kernel, say).
    """
    from onnxprec._ort import create_session, first_line

    providers = ", ".join(map(str, options.providers))
    try:
        create_session(str(written.path), providers=list(options.providers), optimization="none", low_memory=True)
    except Exception as e:  # ORT raises its own exception types
        node = f" (node '{numeric.failed_node}')" if numeric.failed_node else ""
        raise UnsupportedModelError(
            f"ONNX Runtime cannot load the converted model on {providers}{node}: {first_line(e, 200)}; keep the "
            "node in FP32 with --nodes_to_exclude or --keep_unsupported_fp32, or convert for the provider the model "
            "will run on (--providers cuda)."
        ) from None
    logger.warning("The converted model loads on %s, but its numeric check could not run: %s", providers,
                   numeric.skipped)  # fmt: skip


def _log_numeric(report: NumericReport) -> None:
    if report.skipped:
        # a WARNING where the provider lacks a kernel: ModelOpt's API returns such a model, as ModelOpt does
        logger.log(logging.WARNING if report.no_kernel else logging.INFO, "Numeric check skipped: %s", report.skipped)
        return
    for name, err in report.errors.items():
        level = logging.WARNING if (not err["finite"] or err["rel_l2"] > 0.05) else logging.INFO
        logger.log(
            level,
            "Output '%s' vs FP32: max abs error %.4g, relative L2 error %.4g%s",
            name,
            err["max_abs"],
            err["rel_l2"],
            "" if err["finite"] else " (NON-FINITE VALUES)",
        )


def convert_to_mixed_precision(
    onnx_path: ModelSource,
    low_precision_type: str = "fp16",
    nodes_to_exclude: Sequence[str] | None = None,
    op_types_to_exclude: Sequence[str] | None = None,
    nodes_to_include: Sequence[str] | None = None,
    op_types_to_include: Sequence[str] | None = None,
    data_max: float = 512,
    init_max: float = 65504,
    keep_io_types: bool = False,
    calibration_data: Any = None,
    custom_rule: Any = None,
    init_conversion_max_bytes: int | None = None,
    providers: Sequence[str] = ("cpu",),
    trt_plugins: Sequence[str] = (),
    trt_plugins_precision: Sequence[str] = (),
    max_depth_of_reduction: int | None = None,
    opset: int | None = None,
    *,
    input_shapes: str | Mapping[str, Sequence[int]] | None = None,
    target_accuracy: Any = None,
) -> onnx.ModelProto:
    """Converts an FP32 model to mixed FP32/FP16 (or BF16); ModelOpt AutoCast's signature and defaults.

    Args:
        onnx_path: Path to the FP32 model, or an ``onnx.ModelProto``.
        low_precision_type: Low precision type: fp16 or bf16.
        nodes_to_exclude: Regexes of node names to keep in FP32; matched with re.match, from the start of a name, as
            ModelOpt (write '.*x' to match inside a name); a pattern that matches nothing is warned about, with the
            closest names.
        op_types_to_exclude: Op types to keep in FP32.
        nodes_to_include: Regexes of node names to convert even if a rule excludes them; matched with re.match, from
            the start of a name, as ModelOpt (write '.*x' to match inside a name); a pattern that matches nothing is
            warned about, with the closest names.
        op_types_to_include: Op types to convert even if a rule excludes them.
        data_max: Keep nodes whose floating-point inputs or outputs exceed this magnitude in the reference run (inf: no
            reference run).
        init_max: Keep nodes with FP32 initializers whose magnitude exceeds this.
        keep_io_types: Keep FP32 graph inputs and outputs.
        calibration_data: Inputs for the reference run: a path (an ``.npz`` file, a folder of ``.npz`` files, a
            Polygraphy ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX Runtime
            ``CalibrationDataReader``; None: realistic random data.
        custom_rule: A ``NodeRuleBase``-like object (``check(NodeProto)``) or a callable on ``onnx_ir.Node``; True or a
            reason string keeps the node in FP32.
        init_conversion_max_bytes: Initializers above this many bytes stay FP32 and are cast at run time.
        providers: ONNX Runtime providers for the reference run: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        trt_plugins: TensorRT plugin libraries (.so); recorded, TensorRT is not needed.
        trt_plugins_precision: Custom op precisions: op:fp16, op:fp32 or op:[fp16,fp32]:[fp16] (per input, per output).
        max_depth_of_reduction: Keep nodes that accumulate more terms than this per output element.
        opset: Target opset (default: at least 13 for fp16, 22 for bf16; never lowered).
        input_shapes: Sizes of dynamic inputs for random data: ``"name:1x3x224x224,ids:1x128"`` or a dict of shapes.
        target_accuracy: Convert as many nodes as the outputs allow on the calibration data: ``rel_l2<=1e-3``,
            ``cosine>=0.9999``, ``top1>=0.999`` or ``max_abs<=1e-2`` (comma-separated for several), or a callable
            ``(reference, candidate) -> bool`` on dicts of output arrays of one batch; None: the default classification
            only.

    Returns:
        The converted model.

    Raises:
        OnnxprecError: A bad argument or model; the message says how to fix it.
    """
    # Every parameter but onnx_path is an AutoCastOptions field of the same name, default and doc
    # (onnxprec/_options_test.py checks it); locals() holds exactly the parameters at this point.
    options = AutoCastOptions(**fields_in(AutoCastOptions, locals()))

    def checked(
        model: ir.Model, report: AutoCastReport, reference: ReferenceResult | None, fp32_nodes: Mapping[str, str]
    ) -> onnx.ModelProto:
        proto = to_model_proto(model)
        if proto.ByteSize() >= PROTOBUF_LIMIT:
            return proto
        if reference is None or not options.validate or report.numeric is not None:
            if options.validate and report.numeric is None:
                load_in_ort(proto.SerializeToString(), report.ort_only, providers=list(options.providers))
            return proto
        numeric = numeric_check(proto, reference, providers=list(options.providers))
        raise_kernel_gap(numeric, report, options, onnx_path, fp32_nodes)
        _log_numeric(numeric)
        prove_by_run(numeric, report.ort_only)
        return proto

    return convert_until_runs(onnx_path, options, checked)


def _write(run: FileRun[AutoCastOptions]) -> tuple[ir.Model, AutoCastReport]:
    """Converts and saves; the written output is checked before it replaces the output path, and converted again
    where ONNX Runtime cannot run a node made low (:func:`convert_until_runs`)."""

    def save(
        model: ir.Model, report: AutoCastReport, reference: ReferenceResult | None, fp32_nodes: Mapping[str, str]
    ) -> tuple[ir.Model, AutoCastReport]:
        check = _output_check(report, reference, run.options, run.source, fp32_nodes, output_producers(model))
        run.save(model, report, check=check)
        report.seconds["save"] -= report.seconds.get("numeric check", 0.0)  # timed as a step of its own
        return model, report

    model, report = convert_until_runs(run.source, run.options, save, refuse_kernel_gaps=True)
    logger.info("Saved %s", run.output, extra=SUMMARY)
    return model, report


def _write_html(run: FileRun[AutoCastOptions], model: ir.Model, report: AutoCastReport) -> None:
    """The HTML report, when asked for (``--report_html``)."""
    if run.options.report is not None:
        report.command = command_line(run.options, run.source_path, run.output if run.named_output else None)
        report_html.write_html(run.options.report, report.to_json())
        logger.info("HTML report written to %s", run.options.report)


TOOL: ModelTool[AutoCastOptions, AutoCastReport] = ModelTool(
    AutoCastOptions,
    _write,
    suffix=lambda options: f".{options.low_precision_type}",
    name="AutoCast",
    function="convert_file",
    other_outputs=lambda options: {"--report_html": options.report},
    finish=_write_html,
)
"""AutoCast on the tool base (:class:`onnxprec._tool.ModelTool`): ``convert_file``."""


def convert_file(
    onnx_path: str | Path,
    output_path: str | Path | None = None,
    *,
    external_data: bool | None = None,
    options: AutoCastOptions | None = None,
    **kwargs: Any,
) -> AutoCastReport:
    """Converts a model file to a new file, streaming weights (the path-to-path form for large models).

    Args:
        onnx_path: The FP32 model.
        output_path: Where to write; default ``<name>.fp16.onnx`` / ``<name>.bf16.onnx`` beside the input.
        external_data: True: weights in ``<output>.data``; None: only when above 2 GB.
        options: The settings as one object (e.g. built from command-line flags); or pass them as ``kwargs``.
        **kwargs: Any :class:`AutoCastOptions` field (the arguments of :func:`convert_to_mixed_precision`).

    Returns:
        The report (counts, decisions, numeric check, timings); ``report.to_json()`` is JSON-ready.

    Raises:
        OnnxprecError: A bad argument, model or output path; the message says how to fix it.
    """
    return TOOL.run_file(Path(onnx_path), output_path, external_data=external_data, options=options, **kwargs)
