"""The quantization-tool base: what every quantizer (INT4, INT8, the next one) shares, so a tool is its own decisions.

A quantizer is an options dataclass, a pipeline and a report:

- **options**: a subclass of :class:`QuantizationOptions` (a ``@dataclass``) with its ``TOOL`` name and
  ``OUTPUT_SUFFIX``; the settings every quantizer has come from the field factories here (ModelOpt's
  ``calibration_eps``, ``use_external_data_format``, ``nodes_to_exclude``, ``log_level``, and the extras
  ``calibration_batch_size`` and ``sample_tokens``), each tool wording what it does with them; the base checks them;
- **pipeline**: ``quantize_model(source, options) -> (model, report)``, up to (not including) saving;
- **report**: a dataclass on :class:`QuantizationReportBase` (the fields every quantizer fills) with the tool's own
  results, its ``TOOL``, ``summary`` and ``to_json`` (starting with :func:`json_start`): a :class:`QuantizationReport`.

:class:`QuantizationTool` then gives the path-to-path API (``quantize_file``: the output checked before the work,
the log level, the weights quantized while they are written, the output loaded in ONNX Runtime) and
:func:`command_line` the command line (the tool's flags with the shared input/output and common
groups, the report path checked before the work, one summary line). ModelOpt's ``quantize(quantize_mode=...)``
(:mod:`onnxprec.quantization._api`) routes to the tools.

Nothing heavy is imported at module level: the tools' ``_options`` and ``_cli`` modules import this one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from onnxprec import _options, _report
from onnxprec._arg_groups import (
    CommonArgs,
    ModelOptCompat,
    check_log_level,
    file_args,
    providers_option,
    read_args,
    regexes_option,
)
from onnxprec._options import ToolOptions, option, options_or_keywords
from onnxprec._tool import FileRun, ModelTool
from onnxprec.errors import InvalidArgumentError

if TYPE_CHECKING:
    import argparse

    import onnx_ir as ir

    from onnxprec._io import ModelSource, WrittenModel

__all__ = [
    "QuantizationOptions",
    "QuantizationReport",
    "QuantizationReportBase",
    "QuantizationTool",
    "calibration_batch_size_option",
    "calibration_eps_option",
    "check_float_model",
    "check_gptq_damp",
    "check_selection",
    "checked",
    "command_line",
    "external_data_option",
    "gptq_damp_option",
    "json_start",
    "nodes_to_exclude_option",
    "nothing_to_quantize",
    "sample_tokens_option",
    "weight_rounding_option",
]

logger = logging.getLogger(__name__)

EXTRAS = "onnxprec extras"
"""The argparse group of the settings ModelOpt does not have."""

T = TypeVar("T", bound="QuantizationOptions")


# ---------------------------------------------------------------------------------------------------
# Options


def calibration_eps_option() -> Any:
    """ModelOpt's ``calibration_eps``: the ONNX Runtime providers of the calibration runs."""
    return providers_option("calibration", flags=("--providers", "--calibration_eps"))


def external_data_option(
    *, flags: Iterable[str] = ("--external_data", "--use_external_data_format"), doc: str | None = None
) -> Any:
    """ModelOpt's ``use_external_data_format``: the weights in ``<output>.data``.

    Args:
        flags: The spellings.
        doc: The API docstring text when the tool's API says more (e.g. a function that returns a ModelProto).
    """
    return option(
        False,
        flags=flags,
        help="Save the weights in <output>.data beside the model (automatic above 2 GB).",
        doc=doc,
    )


def nodes_to_exclude_option(
    matched: str, more: str = "", *, flags: Iterable[str] = ("-ne", "--nodes_to_exclude")
) -> Any:
    """ModelOpt's ``nodes_to_exclude``: regexes of the nodes kept in float.

    Args:
        matched: What a pattern is matched against, e.g. "the node name and its output names".
        more: The rest of the sentence (what no pattern does, the default), starting with "; ".
        flags: The spellings.
    """
    return regexes_option(f"Regexes of the nodes kept in float, matched against {matched}{more}.", flags=flags)


def calibration_batch_size_option(default: int | None, note: str) -> Any:
    """The runs' batch size along a dynamic batch axis (0 or None: the batches as given).

    Args:
        default: The tool's default.
        note: What else it bounds or changes, with the default, e.g. "bounds memory; default: as given".
    """
    return option(
        default,
        flags=("--calibration_batch_size",),
        group=EXTRAS,
        metavar="N",
        help=f"Split calibration batches along a dynamic batch axis into runs of this many samples ({note}).",
    )


def sample_tokens_option(what: str) -> Any:
    """Token rows sampled per layer input for the tool's decisions (``what``: which inputs, for what)."""
    return option(512, flags=("--sample_tokens",), group=EXTRAS, metavar="N", help=f"Tokens sampled per {what}.")


WEIGHT_ROUNDINGS: tuple[str, ...] = ("auto", "rtn", "gptq")


def weight_rounding_option(how: str, nearest: str) -> Any:
    """How a quantizer that rounds weights with GPTQ rounds them (INT8's and FP8's ``--weight_rounding``).

    Args:
        how: What is rounded to what, e.g. "INT8 weights are rounded".
        nearest: What rtn is, e.g. "to nearest".
    """
    return option(
        "auto",
        choices=WEIGHT_ROUNDINGS,
        group=EXTRAS,
        help=f"How {how}: rtn ({nearest}), gptq (GPTQ on the layer's input Hessian from the calibration data, for "
        "layers whose calibration saw at least as many input rows as the layer has inputs), auto (gptq for Conv "
        "layers, rtn for MatMul/Gemm).",
    )


def gptq_damp_option(default: float | None, default_doc: str, *, group: str | None = None) -> Any:
    """GPTQ's damping, for every quantizer that rounds weights with GPTQ (checked by :func:`check_gptq_damp`).

    Args:
        default: The tool's default.
        default_doc: What the default is and why, e.g. "default: 0.1, which generalizes better from...".
        group: The argparse group (default: the tool's own).
    """
    return option(
        default,
        flags=("--gptq_damp",),
        group=group,
        metavar="FRACTION",
        help="GPTQ's damping: this fraction of the mean of a layer's Hessian diagonal is added to the diagonal before "
        f"the weights are rounded; larger rounds closer to nearest and fits the calibration data less ({default_doc}).",
    )


def check_gptq_damp(damp: float | None) -> None:
    """Raises :class:`InvalidArgumentError` unless ``damp`` (None: the tool's default) is positive: a damping of 0
    leaves a singular Hessian singular (GPTQ's retries multiply the damping); a very large one rounds to nearest."""
    if damp is not None and not damp > 0:
        raise InvalidArgumentError(f"gptq_damp must be > 0, got {damp!r}.")


class QuantizationOptions(ToolOptions):
    """Base of a quantizer's options dataclass: the settings every quantizer has, checked once.

    A subclass is a ``@dataclass`` that sets ``TOOL`` (its name in messages, e.g. ``"INT4"``) and
    ``OUTPUT_SUFFIX`` (``".quant"``: ``<name>.quant.onnx``, as ModelOpt's; ``FORMER_SUFFIX`` names an earlier default,
    which a run that writes the default is warned about), declares the fields below with the factories of this
    module, and calls ``super().__post_init__()`` first in its own ``__post_init__``.
    """

    TOOL: ClassVar[str] = "quantization"
    OUTPUT_SUFFIX: ClassVar[str] = ".quant"
    FORMER_SUFFIX: ClassVar[str | None] = None

    calibration_eps: Sequence[str]
    use_external_data_format: bool
    nodes_to_exclude: Sequence[str] | None
    log_level: str
    calibration_batch_size: int | None
    sample_tokens: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_log_level(self.log_level)
        if self.calibration_batch_size is not None and self.calibration_batch_size < 0:
            raise InvalidArgumentError(f"calibration_batch_size must be >= 0, got {self.calibration_batch_size!r}.")
        if self.sample_tokens < 1:
            raise InvalidArgumentError(f"sample_tokens must be a positive integer, got {self.sample_tokens!r}.")

    @classmethod
    def from_call(cls: type[T], options: T | None, kwargs: Mapping[str, Any], params: Mapping[str, Any] = {}) -> T:
        """The options of an API call: ``options`` as given, or made from the call's keywords (not both).

        Raises:
            InvalidArgumentError: Both were given, an unknown keyword (with the closest field's name), or a bad value.
        """
        return options_or_keywords(cls, options, kwargs, what=cls.TOOL, function="quantize_file", params=params)


@dataclasses.dataclass(kw_only=True)
class QuantizationReportBase(_report.TimedSteps):
    """The fields every quantizer's report has besides its own results (keyword-only: they follow the tool's)."""

    excluded: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(node, pattern or op type) of the layers the options kept in float."""
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """(node, reason) of the candidate layers the tool cannot quantize."""
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    input_path: Path | None = None
    output_path: Path | None = None
    ort_only: dict[str, int] = dataclasses.field(default_factory=dict)
    """The output's nodes that only ONNX Runtime can check, by op; validation loads the output in ONNX Runtime."""
    genai: Any = None
    """The onnxruntime-genai files carried beside the output (:class:`onnxprec._genai.GenaiCarry`), or None."""
    progress: Callable[[], Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    """Called after each weight is quantized while the model is written, when the tool has a progress bar."""
    in_subgraphs: dict[str, int] = dataclasses.field(default_factory=dict)
    """Candidate layers inside If/Loop/Scan bodies, kept float (also in ``skipped``), by the op owning the body."""

    SUBGRAPH_WHY: ClassVar[str] = "the tool quantizes the main graph's layers only"

    def subgraph_text(self) -> str:
        """``12 layers inside If bodies kept float (<why>)``."""
        count = sum(self.in_subgraphs.values())
        kinds = "/".join(sorted(self.in_subgraphs))
        return f"{count} layer{'s' if count != 1 else ''} inside {kinds} bodies kept float ({self.SUBGRAPH_WHY})"

    guard_failure: str | None = None
    """The accuracy guard's one line when the result misses its bound (the model is still written, then
    :class:`~onnxprec.errors.AccuracyGuardError` is raised), else None."""
    check: dict[str, Any] = dataclasses.field(default_factory=dict)
    """How the result was checked against the float model (:func:`checked` says it in the summary): ``random_data``,
    ``guard`` (on, off or warn), ``bound``, ``passed``, ``calibration`` and ``held_out`` (runs, the one-line metric,
    each output's task metric)."""


class QuantizationReport(_report.Report, Protocol):
    """What every quantizer's report has besides :class:`onnxprec._report.Report`."""

    @property
    def layers(self) -> Sequence[Any]:
        """One entry per quantized weight or layer."""
        ...

    seconds: dict[str, float]

    def step(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Times a block into ``seconds[name]`` (:class:`onnxprec._report.TimedSteps`)."""
        ...

    input_path: Path | None
    output_path: Path | None
    ort_only: dict[str, int]
    """The output's nodes that only ONNX Runtime can check, by op (validation loads the output in it)."""
    genai: Any
    """The onnxruntime-genai files carried beside the output (:class:`onnxprec._genai.GenaiCarry`), or None."""
    progress: Callable[[], Any] | None
    """Called after each weight is quantized while the model is written, when the tool has a progress bar."""
    guard_failure: str | None
    """The accuracy guard's one line when the result misses its bound, else None."""


def json_start(report: QuantizationReport) -> dict[str, Any]:
    """The first keys of a quantizer's report JSON: :func:`onnxprec._report.header`, then ``input`` and ``output``."""
    paths = {"input": report.input_path, "output": report.output_path}
    return {**_report.header(report), **{key: None if path is None else str(path) for key, path in paths.items()}}


OptionsT = TypeVar("OptionsT", bound=QuantizationOptions)
ReportT = TypeVar("ReportT", bound=QuantizationReport)


def check_float_model(model: ir.Model) -> None:
    """Raises when the model is quantized already.

    Raises:
        UnsupportedModelError: It has QuantizeLinear, DequantizeLinear, MatMulNBits... nodes.
    """
    from onnxprec._ops import QUANTIZED_OPS
    from onnxprec.errors import UnsupportedModelError

    quantized = sorted({n.op_type for n in model.graph.all_nodes() if n.op_type in QUANTIZED_OPS})
    if quantized:
        raise UnsupportedModelError(
            f"The model is already quantized (it has {', '.join(quantized)} nodes): pass the float model."
        )


def check_selection(
    model: ir.Model,
    patterns: Mapping[str, Sequence[re.Pattern[str]]],
    op_types: Mapping[str, Sequence[str] | None],
    layer_ops: Collection[str],
    names_of: Callable[[ir.Node], Iterable[str]],
) -> None:
    """Warns about each name pattern or op type of the options that selects nothing in ``model``'s main graph
    (:func:`onnxprec._options.check_patterns`: with the closest names, and what a pattern matches instead).

    Args:
        model: The sanitized model (names given).
        patterns: Option -> its compiled patterns, e.g. ``{"nodes_to_exclude": [...]}``.
        op_types: Option -> its op types.
        layer_ops: The op types of the layers the tool quantizes.
        names_of: What a pattern matches of such a node (its name, output names...).
    """
    from onnxprec._options import check_op_types, check_patterns

    names: set[str] = set()
    nodes: set[str] = set()
    others: dict[str, str] = {}
    selected = f"layer this tool quantizes ({', '.join(layer_ops)})"
    for node in model.graph:
        if node.op_type in layer_ops and node.domain in ("", "ai.onnx"):
            names.update(names_of(node))
            nodes.add(str(node.name or ""))
        elif node.name:
            others[str(node.name)] = node.op_type
    for what, compiled in patterns.items():
        check_patterns(compiled, what, names, others, selected, nodes - {""})
    present = {node.op_type for node in model.graph}
    for what, types in op_types.items():
        check_op_types(types, what, present)


def checked(check: Mapping[str, Any]) -> str:
    """The summary phrase of how a result was checked (a report's ``check``, see :mod:`onnxprec.quantization.guard`):
    where, on how many runs, what it kept; e.g. ``checked on calibration data (6 runs): top1 1, held out (2 runs):
    top1 1``."""

    def runs(part: Mapping[str, Any]) -> str:
        count = int(part.get("runs", 0))
        return f"{count} run{'' if count == 1 else 's'}"

    where = "no calibration data: checked on random data" if check.get("random_data") else "checked on calibration data"
    calibration, held = check.get("calibration") or {}, check.get("held_out")
    text = f"{where} ({runs(calibration)}): {calibration.get('metric', '')}".rstrip()
    if held:
        text += f", held out ({runs(held)}): {held['metric']}"
    if check.get("random_data"):
        text += f" ({_report.SYNTHETIC_CHECK})"
    if check.get("guard") == "on" and not check.get("passed"):
        text += f"; misses the accuracy guard's {check.get('bound')}"
    elif check.get("short_of_int8"):  # INT4: within its own bound, under the one INT8's guard holds an embedding to
        text += f"; under INT8's guard bound: {check['short_of_int8']}"
    return text


def nothing_to_quantize(
    layers: str, skipped: str, excluded_by: str | None, reasons: Sequence[tuple[str, str]] = ()
) -> Exception:
    """The error when no layer is left to quantize; each skipped layer and its reason is logged at DEBUG.

    Args:
        layers: The layers the tool quantizes, e.g. "Conv, MatMul or Gemm whose weight is a float32 initializer".
        skipped: How many candidates were skipped, e.g. "3 skipped".
        excluded_by: The options that excluded every candidate, or None when none was excluded.
        reasons: The skipped layers as ``(node name, reason)``; the most frequent reason is named in the message.

    Returns:
        An :class:`~onnxprec.errors.UnsupportedModelError` to raise.
    """
    from onnxprec.errors import UnsupportedModelError

    for name, reason in reasons:
        logger.debug("Skipped '%s': %s", name, reason)
    if reasons:
        skipped += f"; {_most_common(reasons)}"
    hint = f" (all excluded by {excluded_by})" if excluded_by else ""
    return UnsupportedModelError(
        f"Nothing to quantize{hint}: the model has no {layers} ({skipped}; see --log_level DEBUG)."
    )


def _most_common(reasons: Sequence[tuple[str, str]]) -> str:
    """``'Gemm_1' and 2 more: <reason>``: the most frequent reason of ``(node name, reason)`` pairs."""
    reason, count = Counter(reason for _, reason in reasons).most_common(1)[0]
    name = next(n for n, r in reasons if r == reason)
    return f"'{name}'{f' and {count - 1} more' if count > 1 else ''}: {reason}"


def remainder_only(options: Any, skipped: Sequence[tuple[str, str]], excluded: object) -> bool:
    """Whether a run with no layer left goes on and writes the model without Q/DQ, its float remainder converted
    (``options.float_type``), as ModelOpt's FP8 does: only for options whose ``WRITES_REMAINDER`` says so, where a
    placement rule skipped every candidate layer (``skipped``; none ``excluded`` by the user's options nor inside a
    subgraph). One WARNING says how many layers are quantized (none) and why."""
    if not getattr(options, "WRITES_REMAINDER", False) or not skipped or excluded:
        return False
    logger.warning(
        "%s quantizes none of the %d candidate layers (%s): the model is written without Q/DQ, its float remainder "
        "in %s, and judged as any result", options.TOOL, len(skipped), _most_common(skipped), options.float_type,
    )  # fmt: skip
    return True


# ---------------------------------------------------------------------------------------------------
# The path-to-path API


@dataclasses.dataclass(frozen=True)
class QuantizationTool(Generic[OptionsT, ReportT]):
    """A quantizer's path-to-path API from its options class and pipeline.

    A tool whose options have ``genai_provider`` carries the onnxruntime-genai files of the input's folder beside
    the output.

    Args:
        options: The options dataclass.
        pipeline: ``quantize_model(source, options) -> (model, report)``; the model's quantized weights may be lazy
            tensors, computed while the model is written.
        progress: A progress bar over the report's layers while the weights are written (the report's ``progress``
            is called once per weight).
        check_written: Measures the written output against the float model, when the pipeline does not.
        inspect: Called with the written file (before it replaces the output path), the options and the report,
            for what only the written model shows (INT8: the Q/DQ ONNX Runtime leaves unfused).
    """

    options: type[OptionsT]
    pipeline: Callable[[ModelSource, OptionsT], tuple[ir.Model, ReportT]]
    progress: bool = False
    check_written: Callable[[Path, Path, OptionsT, ReportT], bool] | None = None
    """Measures the written output against the float model (``source``, ``written``, options, report) for a tool
    whose pipeline does not (INT8 measures in its pipeline); returns whether it ran the output in ONNX Runtime
    (else the output is loaded in a session of its own, to prove the nodes only ONNX Runtime can check)."""
    inspect: Callable[[Path, OptionsT, ReportT], None] | None = None

    def default_output_path(self, onnx_path: str | Path) -> Path:
        """``<name><OUTPUT_SUFFIX>.onnx`` beside the input."""
        from onnxprec._io import sibling_path

        return sibling_path(onnx_path, self.options.OUTPUT_SUFFIX)

    @property
    def base(self) -> ModelTool[OptionsT, ReportT]:
        """The tool base's path-to-path run (:class:`onnxprec._tool.ModelTool`) with this quantizer's write."""
        return ModelTool(
            self.options,
            self._write,
            suffix=lambda settings: settings.OUTPUT_SUFFIX,
            name=self.options.TOOL,
            function="quantize_file",
            finish=_raise_guard_failure,
        )

    def quantize_file(
        self,
        onnx_path: str | Path,
        output_path: str | Path | None = None,
        *,
        external_data: bool | None = None,
        options: OptionsT | None = None,
        **kwargs: Any,
    ) -> ReportT:
        """Quantizes a model file into a new file, the weights quantized while they are written.

        Args:
            onnx_path: The float model.
            output_path: Where to write; default ``<name><OUTPUT_SUFFIX>.onnx`` beside the input.
            external_data: True: weights in ``<output>.data``; None: as ``use_external_data_format``, else only when
                above 2 GB.
            options: The settings as one object (e.g. built from command-line flags); or pass them as ``kwargs``.
            **kwargs: Any field of the tool's options.

        Returns:
            The report; ``report.to_json()`` is JSON-ready.

        Raises:
            AccuracyGuardError: The result misses the accuracy guard's bound (it is written, for inspection; the
                error carries the report).
            OnnxprecError: A bad argument, model, calibration data or output path; the message says how to fix it.
        """
        settings: OptionsT = self.options.from_call(options, kwargs)
        if output_path is None and settings.FORMER_SUFFIX and Path(onnx_path).exists():  # a bad path gets its one line
            logger.warning(
                "Writing %s: the default output is now <name>%s.onnx, as ModelOpt's (it was <name>%s.onnx); "
                "pass --output_path to choose", self.default_output_path(onnx_path).name, settings.OUTPUT_SUFFIX,
                settings.FORMER_SUFFIX,
            )  # fmt: skip
        return self.base.run_file(onnx_path, output_path, external_data=external_data, options=settings)

    def _write(self, run: FileRun[OptionsT]) -> tuple[ir.Model, ReportT]:
        """The pipeline, then the save: the written model loaded in ONNX Runtime (and measured or inspected when the
        tool asks) before it replaces the output."""
        from onnxprec.validate import load_in_ort, proved_by_run

        settings, source = run.options, run.source_path
        if source is None:
            raise InvalidArgumentError(
                "An output path needs the model as a file: save the in-memory model first, or call the tool's "
                "quantize_model to get the quantized model back."
            )
        model, report = self.pipeline(source, settings)

        def check(written: WrittenModel) -> None:
            # A measurement that ran the output proves what loading it would (a session of the whole output
            # would hold all its weights, where the measurement runs a large one segment by segment).
            if self.check_written is not None and self.check_written(source, written.path, settings, report):
                proved_by_run(report.ort_only)
            else:
                load_in_ort(str(written.path), report.ort_only, providers=list(settings.calibration_eps))
            if self.inspect is not None:
                self.inspect(written.path, settings, report)

        with self._progress(report):
            run.save(
                model,
                report,
                check=check,
                step="quantize+save",
                external_data=settings.use_external_data_format or None,
            )
        logger.info("%s; saved %s", report.summary, run.output, extra=_report.SUMMARY)
        return model, report

    def _progress(self, report: ReportT) -> Any:
        import contextlib

        if not self.progress:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def bar() -> Any:
            from onnxprec._progress import Progress

            with Progress("Quantizing weights", "weight", len(report.layers), leave=True) as shown:
                report.progress = shown.update
                try:
                    yield
                finally:
                    report.progress = None

        return bar()


def _raise_guard_failure(run: FileRun[Any], model: ir.Model, report: QuantizationReport) -> None:
    """Raises when the written result misses the accuracy guard's bound (the model stays written, for inspection).

    Raises:
        AccuracyGuardError: ``report.guard_failure`` is set; the error carries the report.
    """
    if report.guard_failure:
        from onnxprec.errors import AccuracyGuardError

        raise AccuracyGuardError(f"{report.guard_failure}; written for inspection to {run.output}", report)


# ---------------------------------------------------------------------------------------------------
# The command line


def command_line(
    options: type[QuantizationOptions], api: str
) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """A quantizer's ``add_arguments`` and ``run`` for its ``_cli`` module (see :mod:`onnxprec.cli`).

    Args:
        options: The options dataclass: its flags follow the input and output, the common ones last.
        api: The module whose ``quantize_file`` ``run`` calls, imported only then (``--help`` stays fast).
    """

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        files = file_args(f"<name>{options.OUTPUT_SUFFIX}.onnx", input_help="Input float ONNX model.")
        _options.add_arguments(parser, files, options, CommonArgs, ModelOptCompat)

    def run(args: argparse.Namespace) -> int:
        import importlib

        files, common, parsed = read_args(args, options)
        # not dataclasses.replace: it would validate the resolved options again as if the user had given them (the
        # defaults chosen from the model, e.g. INT4's for an LLM, need to know what was left unsaid)
        check_log_level(common.log_level)
        settings = copy.copy(parsed)
        settings.log_level = common.log_level
        outputs = [files.onnx_path, *filter(None, [files.output_path])]
        _report.check_paths({"--report_json": common.report_json}, outputs)
        from onnxprec.errors import AccuracyGuardError

        try:
            report = importlib.import_module(api).quantize_file(files.onnx_path, files.output_path, options=settings)
        except AccuracyGuardError as e:  # the model was written: so is its report
            _report.write_json(common.report_json, e.report.to_json())  # type: ignore[attr-defined]
            raise
        _report.write_json(common.report_json, report.to_json())
        print(f"{report.summary}; saved {report.output_path}")
        return 0

    return add_arguments, run
