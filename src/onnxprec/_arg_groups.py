"""Options shared by several tools, declared once, as Polygraphy's tools share their argument groups.

An API setting every tool words its own way is a field factory used in each tool's options class (the spelling and
what the tool does with the value are parameters): :func:`calibration_data_option`, :func:`input_shapes_option`,
:func:`providers_option`, :func:`genai_provider_option`, :func:`html_report_option`, :func:`log_level_option`,
:func:`regexes_option`, :func:`op_types_option`.
Each factory returns an :func:`~onnxprec._options.option` field (defaulting to None unless it says otherwise); its
``flags`` are the spellings and its ``group`` the argparse group's title when not the options class's ``TITLE``.
Command-line-only flags are classes of their own that each tool adds (:class:`FileArgs`, :class:`CommonArgs`,
:class:`ModelOptCompat` for the quantizers),
respelled per tool with :func:`onnxprec._options.customize` (:func:`file_args`).

In the base layer, with :mod:`onnxprec._options`: it imports nothing heavy, so ``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from onnxprec._options import ArgGroup, ToolOptions, customize, from_args, option, option_fields

if TYPE_CHECKING:
    import argparse

T = TypeVar("T", bound=ToolOptions)

__all__ = [
    "DEPRECATED",
    "LOG_LEVELS",
    "VOCABULARY",
    "CommonArgs",
    "Concept",
    "FileArgs",
    "ModelOptCompat",
    "calibration_data_option",
    "check_log_level",
    "compat_notes",
    "file_args",
    "genai_provider_option",
    "html_report_option",
    "input_shapes_option",
    "log_level_option",
    "op_types_option",
    "providers_option",
    "read_args",
    "regexes_option",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Concept(NamedTuple):
    """One setting as every tool spells it.

    Attributes:
        name: What it is, e.g. "calibration or evaluation data".
        spellings: The flags every tool that has the setting takes.
        aliases: Other spellings a tool may take as well: the anchors' (ModelOpt's, ONNX Runtime's ``quant_pre_process``
            and ``quantize_static``, Quark's ``dump_model``) and onnxprec's former ones.
        fields: The option fields (argparse dests) that hold it in some tool.
    """

    name: str
    spellings: tuple[str, ...]
    aliases: tuple[str, ...]
    fields: tuple[str, ...]


VOCABULARY: tuple[Concept, ...] = (
    Concept("input model", ("--onnx_path",), ("--input",), ("onnx_path",)),
    Concept("output model", ("--output_path",), ("--output",), ("output_path",)),
    Concept(
        "calibration or evaluation data",
        ("-d", "--calibration_data"),
        ("--calibration_data_path", "--data"),
        ("calibration_data", "calibration_data_reader", "data", "dump_data_reader"),
    ),
    Concept(
        "input shapes",
        ("--input_shapes",),
        ("--calibration_shapes",),
        ("input_shapes", "random_data_reader_input_shape"),
    ),
    Concept("providers", ("--providers",), ("--calibration_eps",), ("providers", "calibration_eps")),
    Concept(
        "external data",
        ("--external_data",),
        ("--use_external_data_format", "--save_as_external_data"),
        ("external_data", "use_external_data_format", "save_as_external_data"),
    ),
    Concept("HTML report", ("--report_html",), ("--report", "--html"), ("report", "html")),
    Concept("JSON report", ("--report_json",), ("--json",), ("report_json",)),
    Concept("log level", ("--log_level",), (), ("log_level",)),
    Concept("log file", ("--log_file",), (), ("log_file",)),
    Concept("nodes to exclude", ("-ne", "--nodes_to_exclude"), (), ("nodes_to_exclude",)),
    Concept(
        "nodes to include",
        ("-ni", "--nodes_to_include"),
        ("--nodes_to_quantize",),
        ("nodes_to_include", "nodes_to_quantize"),
    ),
    Concept("op types to exclude", ("-ope", "--op_types_to_exclude"), (), ("op_types_to_exclude",)),
    # its values take ONNX Runtime's and Quark's QuantType names too (int8._options.ACTIVATION_TYPE_ALIASES)
    Concept("activation type", ("--activation_type",), (), ("activation_type",)),
    Concept(
        "op types to include",
        ("-opi", "--op_types_to_include"),
        ("--op_types_to_quantize",),
        ("op_types_to_include", "op_types_to_quantize"),
    ),
)
"""One spelling per setting across the tools (``tests/vocabulary_test.py`` walks every parser against it; the docs'
migration page shows it)."""

DEPRECATED = {"--report": "--report_html", "--html": "--report_html", "--json": "--report_json"}
"""Former onnxprec spellings: kept for a release, each warned about in one line (``_options.deprecated_alias``)."""


_DATA_FORMATS_HELP = (
    "an .npz file (split along the batch axis: into the model's static batch; an LLM's token windows one a run), "
    "a folder of .npz files (one batch each) or a Polygraphy .json"
)
_DATA_FORMATS_DOC = (
    "a path (an ``.npz`` file, a folder of ``.npz`` files, a Polygraphy ``.json``), a dict of arrays, a list or "
    "iterator of feed dicts, or an ONNX Runtime ``CalibrationDataReader``"
)


def calibration_data_option(
    purpose: str,
    *,
    flags: Iterable[str] = ("-d", "--calibration_data"),
    default: str = "realistic random data",
    note: str = "",
    more_formats: tuple[str, str] | None = None,
    group: str | None = None,
) -> Any:
    """The data option of every tool that runs a model: what sources it accepts is written once, here.

    Args:
        purpose: What the data is for, e.g. "Inputs for the reference run" (the sentence's start).
        flags: The spellings (ModelOpt's ``-d/--calibration_data`` by default).
        default: What the tool uses without data (after "default:" in the help, "None:" in the doc).
        note: A remark appended to the default, e.g. "AWQ and GPTQ need representative data".
        more_formats: A format only this tool reads, as (help text, doc text), e.g. an ``.npy`` of token ids.
    """
    formats_help, formats_doc = _DATA_FORMATS_HELP, _DATA_FORMATS_DOC
    if more_formats is not None:
        formats_help = f"{formats_help.replace(' or ', ', ')}, or {more_formats[0]}"
        formats_doc = f"{more_formats[1]}, {formats_doc}"
    tail = f"; {note}" if note else ""
    return option(
        None,
        flags=flags,
        metavar="PATH",
        group=group,
        help=f"{purpose}: {formats_help} (default: {default}{tail}).",
        doc=f"{purpose}: {formats_doc}; None: {default}{tail}.",
    )


def input_shapes_option(*, flags: Iterable[str] = ("--input_shapes",), group: str | None = None, more: str = "") -> Any:
    """The sizes of dynamic inputs for random data, shared by every tool that makes random inputs.

    Args:
        more: Other forms the API accepts, appended to the doc (e.g. a list of shapes in input order).
    """
    return option(
        None,
        flags=flags,
        group=group,
        metavar="SHAPES",
        help="Sizes of dynamic inputs for random data: name:1x3x224x224,ids:1x128.",
        doc=f'Sizes of dynamic inputs for random data: ``"name:1x3x224x224,ids:1x128"`` or a dict of shapes{more}.',
    )


MATCH_RULE = (
    "matched with re.match, from the start of a name, as ModelOpt (write '.*x' to match inside a name); a pattern "
    "that matches nothing is warned about, with the closest names"
)
"""The one rule by which every tool matches a name pattern, said in the help of every pattern option."""


def regexes_option(help: str, *, flags: Iterable[str] | None = None) -> Any:
    """A list of regular expressions of node or layer names (``--flag REGEX ...``), None when not given; the help
    ends with :data:`MATCH_RULE`.

    Args:
        help: What the regexes select, one sentence.
        flags: The spellings, when not ``--<field name>``.
    """
    text = f"{help.rstrip('.')}; {MATCH_RULE}."
    return option(None, flags=flags, nargs="*", metavar="REGEX", help=text)


def op_types_option(help: str, *, flags: Iterable[str] | None = None) -> Any:
    """A list of op types (``--flag OP ...``), None when not given.

    Args:
        help: What the op types select.
        flags: The spellings, when not ``--<field name>``.
    """
    return option(None, flags=flags, nargs="*", metavar="OP", help=help)


def providers_option(purpose: str, *, flags: Iterable[str] = ("--providers",)) -> Any:
    """The ONNX Runtime execution providers option, shared by every tool that runs a model.

    Args:
        purpose: What the runs are for, e.g. "the reference run" or "calibration".
        flags: The spellings (``--providers`` by default; e.g. ``--calibration_eps`` for a ModelOpt-like tool).

    Returns:
        An :func:`option` field defaulting to ``("cpu",)``.
    """
    return option(
        ("cpu",),
        flags=flags,
        nargs="*",
        metavar="PROVIDER",
        help=f"ONNX Runtime providers for {purpose}, in order of preference: cpu, cuda[:N], trt, dml.",
        doc=f"ONNX Runtime providers for {purpose}: ``cpu``, ``cuda:N``, ``trt``, ``dml``.",
    )


def genai_provider_option() -> Any:
    """The provider written into the ``genai_config.json`` that a tool carries beside its output (``onnxprec._genai``).

    Returns:
        An :func:`option` field defaulting to None (the provider of the input's config).
    """
    return option(
        None,
        flags=("--genai_provider",),
        choices=("cpu", "cuda"),
        help="When the input sits in an onnxruntime-genai folder (genai_config.json), its config and tokenizer files "
        "are copied beside the output; this sets the copied config's provider (cpu: provider_options [], e.g. to "
        "run a CUDA build on the CPU) (default: as in the input's config).",
        doc="When the input sits in an onnxruntime-genai folder (``genai_config.json``), its config and tokenizer "
        "files are copied beside the output; this sets the copied config's provider: ``cpu`` "
        "(``provider_options: []``) or ``cuda``; None: as in the input's config.",
    )


def html_report_option(what: str, *, flags: Iterable[str] = ("--report_html",), group: str | None = None) -> Any:
    """The path of a tool's self-contained HTML report (any browser, no network).

    Args:
        what: What the page shows, e.g. "the table and a plot of the error along the graph".
        flags: The spellings (``--report_html``, beside ``--report_json``).
    """
    return option(
        None,
        flags=flags,
        group=group,
        metavar="PATH",
        help=f"Also write a self-contained HTML report (any browser, no network): {what}.",
        doc=f"Path of a self-contained HTML report ({what}); None: no report.",
    )


@dataclasses.dataclass
class FileArgs(ToolOptions):
    """The input model and the output path of a tool's command line (the API takes them as arguments).

    Tools respell them with :func:`file_args` (e.g. ``--input``/``--output`` for ``preprocess``).
    """

    TITLE = "input and output"

    onnx_path: str = option(metavar="PATH", help="Input ONNX model.")
    output_path: str | None = option(None, metavar="PATH", help="Output model (default: beside the input).")
    external_data: bool = option(
        False, help="Save the weights in <output>.data beside the model (automatic above 2 GB)."
    )


def file_args(
    output_name: str | None,
    *,
    input_help: str = "Input ONNX model.",
    input_flags: Iterable[str] = ("--onnx_path",),
    output_flags: Iterable[str] = ("--output_path",),
    external_data: bool = False,
) -> ArgGroup:
    """:class:`FileArgs` as one tool shows it.

    Args:
        output_name: The default output, e.g. ``"<name>.quant.onnx"``; None: the tool has no output model flag.
        input_help: The input flag's help.
        input_flags: The input's spellings.
        output_flags: The output's spellings.
        external_data: Whether the tool has FileArgs' ``--external_data`` flag (tools whose options declare
            their own external-data setting leave it out).

    Returns:
        The group to pass to :func:`add_arguments`; :func:`from_args` with :class:`FileArgs` reads it back.
    """
    omit = {"external_data"} if not external_data else set()
    output: dict[str, Any] = {"flags": tuple(output_flags)}
    if output_name is None:
        omit.add("output_path")
    else:
        output["help"] = f"Output model (default: {output_name} beside the input)."
    return customize(
        FileArgs,
        omit=omit,
        onnx_path={"flags": tuple(input_flags), "help": input_help},
        output_path=output,
    )


@dataclasses.dataclass
class CommonArgs(ToolOptions):
    """Flags every tool's command line has, declared once (``onnxprec.cli`` configures logging from them)."""

    TITLE = "common"

    log_level: str = option("INFO", choices=LOG_LEVELS, help="Log level; DEBUG also logs why each decision was made.")
    report_json: str | None = option(
        None,
        metavar="PATH",
        help="Also write a JSON report of the run (counts, per-node decisions with reasons, errors, timings).",
    )
    log_file: str | None = option(None, metavar="PATH", help="Also write the log to this file (as ModelOpt's).")


@dataclasses.dataclass
class ModelOptCompat(ToolOptions):
    """ModelOpt's everyday quantization flags that mean nothing here: each is accepted and noted in one line.

    The fields are named ``modelopt_<flag>`` so that they never collide with a tool's own setting (AutoCast's
    ``--trt_plugins`` is honoured); a field's help is the note (:func:`compat_notes`).
    """

    TITLE = "accepted for ModelOpt compatibility (no effect)"

    modelopt_simplify: bool = option(
        False,
        flags=("--simplify",),
        help="No effect: onnxprec does not run onnxsim; `onnxprec preprocess` runs ONNX Runtime's optimizations.",
    )
    modelopt_keep_intermediate_files: bool = option(
        False, flags=("--keep_intermediate_files",), help="No effect: onnxprec writes no intermediate model files."
    )
    modelopt_dq_only: bool = option(
        False,
        flags=("--dq_only",),
        help="No effect: weights are always stored quantized and read through a DequantizeLinear alone.",
    )
    modelopt_disable_mha_qdq: bool = option(
        False,
        flags=("--disable_mha_qdq",),
        help="No effect: attention MatMuls (no constant weight) are never quantized by onnxprec.",
    )
    modelopt_trt_plugins: str | None = option(
        None,
        flags=("--trt_plugins",),
        metavar="PATHS",
        help="No effect: quantization needs no TensorRT plugins (onnxprec builds no engine).",
    )


def compat_notes(args: argparse.Namespace) -> list[str]:
    """One line for each :class:`ModelOptCompat` flag given on the command line."""
    return [f"{spec.flags[0]}: {spec.help}" for f, spec in option_fields(ModelOptCompat) if getattr(args, f.name, None)]


def read_args(args: argparse.Namespace, options: type[T]) -> tuple[FileArgs, CommonArgs, T]:
    """A tool's parsed flags read back: its input and output (:class:`FileArgs`), :class:`CommonArgs`, its options."""
    return from_args(FileArgs, args), from_args(CommonArgs, args), from_args(options, args)


def log_level_option() -> Any:
    """ModelOpt's ``log_level`` keyword: the ``onnxprec`` logger's level during an API call (the command line's
    ``--log_level`` is :class:`CommonArgs`'; checked with :func:`check_log_level`)."""
    return option(
        "INFO", api_only=True, help="Log level of the ``onnxprec`` logger during the call: DEBUG, INFO, WARNING, ERROR."
    )


def check_log_level(level: str) -> None:
    """Raises when ``level`` is not one of :data:`LOG_LEVELS`.

    Raises:
        InvalidArgumentError: An unknown level.
    """
    if level not in LOG_LEVELS:
        from onnxprec.errors import InvalidArgumentError

        raise InvalidArgumentError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {level!r}.")
