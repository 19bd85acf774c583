"""AutoCast's options, each declared once: API keyword, command-line flag (ModelOpt's spelling) and help.

This module imports nothing heavy (no onnx, onnx-ir or numpy at import time), so the command line can build
its parser and print ``--help`` without loading the pipeline. ``onnxprec.autocast`` re-exports
:class:`AutoCastOptions`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxprec._arg_groups import (
    calibration_data_option,
    genai_provider_option,
    html_report_option,
    input_shapes_option,
    op_types_option,
    providers_option,
    regexes_option,
)
from onnxprec._options import ToolOptions, compile_patterns, option
from onnxprec.errors import InvalidArgumentError

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxprec.accuracy import AccuracyTarget
    from onnxprec.autocast.classify import PluginPrecision

__all__ = ["LOW_PRECISION_TYPES", "AutoCastOptions"]

LOW_PRECISION_TYPES = ("fp16", "bf16")
_EXTRAS = "onnxprec extras"


@dataclass
class AutoCastOptions(ToolOptions):
    """All AutoCast settings, validated once. Field names, flags and defaults follow ModelOpt's AutoCast.

    After validation, ``exclude_patterns``/``include_patterns`` hold the compiled regexes, ``plugins`` the
    parsed ``trt_plugins_precision`` and ``input_shape_map`` the parsed ``input_shapes``.
    """

    TITLE = "AutoCast options (ModelOpt flags)"

    low_precision_type: str = option(
        "fp16",
        flags=("-t", "--low_precision_type"),
        choices=LOW_PRECISION_TYPES,
        help="Low precision type: fp16 or bf16.",
    )
    nodes_to_exclude: Sequence[str] | None = regexes_option(
        "Regexes of node names to keep in FP32.", flags=("-ne", "--nodes_to_exclude")
    )
    op_types_to_exclude: Sequence[str] | None = op_types_option(
        "Op types to keep in FP32.", flags=("-ope", "--op_types_to_exclude")
    )
    nodes_to_include: Sequence[str] | None = regexes_option(
        "Regexes of node names to convert even if a rule excludes them.", flags=("-ni", "--nodes_to_include")
    )
    op_types_to_include: Sequence[str] | None = op_types_option(
        "Op types to convert even if a rule excludes them.", flags=("-opi", "--op_types_to_include")
    )
    data_max: float = option(
        512,
        help="Keep nodes whose floating-point inputs or outputs exceed this magnitude in the reference run "
        "(inf: no reference run).",
    )
    init_max: float = option(65504, help="Keep nodes with FP32 initializers whose magnitude exceeds this.")
    keep_io_types: bool = option(False, help="Keep FP32 graph inputs and outputs.")
    calibration_data: Any = calibration_data_option("Inputs for the reference run")
    custom_rule: Any = option(
        None,
        api_only=True,
        help="A ``NodeRuleBase``-like object (``check(NodeProto)``) or a callable on ``onnx_ir.Node``; "
        "True or a reason string keeps the node in FP32.",
    )
    init_conversion_max_bytes: int | None = option(
        None, help="Initializers above this many bytes stay FP32 and are cast at run time."
    )
    providers: Sequence[str] = providers_option("the reference run")
    genai_provider: str | None = genai_provider_option()
    trt_plugins: Sequence[str] = option(
        (), nargs="*", metavar="PATH", help="TensorRT plugin libraries (.so); recorded, TensorRT is not needed."
    )
    trt_plugins_precision: Sequence[str] = option(
        (),
        nargs="*",
        metavar="SPEC",
        help="Custom op precisions: op:fp16, op:fp32 or op:[fp16,fp32]:[fp16] (per input, per output).",
    )
    max_depth_of_reduction: int | None = option(
        None, help="Keep nodes that accumulate more terms than this per output element."
    )
    opset: int | None = option(None, help="Target opset (default: at least 13 for fp16, 22 for bf16; never lowered).")
    input_shapes: str | Mapping[str, Sequence[int]] | None = input_shapes_option(group=_EXTRAS)
    target_accuracy: Any = option(
        None,
        group=_EXTRAS,
        metavar="TARGET",
        help="Convert as many nodes as the outputs allow on the calibration data: rel_l2<=1e-3, cosine>=0.9999, "
        "top1>=0.999 or max_abs<=1e-2 (comma-separated for several); the default classification is the start.",
        doc="Convert as many nodes as the outputs allow on the calibration data: ``rel_l2<=1e-3``, "
        "``cosine>=0.9999``, ``top1>=0.999`` or ``max_abs<=1e-2`` (comma-separated for several), or a callable "
        "``(reference, candidate) -> bool`` on dicts of output arrays of one batch; None: the default "
        "classification only.",
    )
    report: str | None = html_report_option(
        "each node's precision and why, its range against data_max, casts, the error against FP32 along the graph, "
        "and the command to reproduce",
        group=_EXTRAS,
    )
    keep_unsupported_fp32: bool = option(
        False,
        group=_EXTRAS,
        help="Keep in FP32 the nodes ONNX Runtime has no low-type kernel for on the chosen --providers instead of "
        "refusing: BF16 with only the CPU provider, whose BF16 kernels are mostly data movement (Transpose, Reshape, "
        "LayerNormalization); the summary gives the share converted. On a GPU provider such nodes stay FP32 always.",
    )
    validate: bool = option(
        True,
        group=_EXTRAS,
        help="Skip the checker, I/O contract and numeric checks of the result.",
        doc="Check the result: ONNX checker with strict type inference, I/O contract, and output error "
        "against FP32 on the reference inputs.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.low_precision_type not in LOW_PRECISION_TYPES:
            raise InvalidArgumentError(
                f"Unsupported low_precision_type '{self.low_precision_type}': use 'fp16' or 'bf16'."
            )
        for name in ("data_max", "init_max"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive number or inf, got {value!r}.")
        if self.max_depth_of_reduction is not None and self.max_depth_of_reduction <= 0:
            raise InvalidArgumentError("max_depth_of_reduction must be a positive integer.")
        if self.init_conversion_max_bytes is not None and self.init_conversion_max_bytes < 0:
            raise InvalidArgumentError("init_conversion_max_bytes must be >= 0.")
        if self.opset is not None:
            import onnx

            newest = onnx.defs.onnx_opset_version()
            if not 1 <= int(self.opset) <= newest:
                raise InvalidArgumentError(f"opset {self.opset} is out of range: this onnx supports up to {newest}.")
        self.exclude_patterns = compile_patterns(self.nodes_to_exclude, "nodes_to_exclude")
        self.include_patterns = compile_patterns(self.nodes_to_include, "nodes_to_include")
        self.plugins = _parse_plugin_precisions(self.trt_plugins_precision)
        self.input_shape_map = _parse_input_shapes(self.input_shapes)
        self.target = _parse_target(self.target_accuracy)
        for plugin in self.trt_plugins:
            if not os.path.isfile(plugin):
                raise InvalidArgumentError(f"TensorRT plugin library '{plugin}' does not exist: check --trt_plugins.")

    @property
    def low(self) -> ir.DataType:
        """The low precision type as an onnx-ir data type."""
        import onnx_ir as ir

        return ir.DataType.FLOAT16 if self.low_precision_type == "fp16" else ir.DataType.BFLOAT16


def _parse_input_shapes(shapes: str | Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    if shapes is None:
        return {}
    from onnxprec import calibration

    return calibration.parse_input_shapes(shapes)


def _parse_target(spec: Any) -> AccuracyTarget | None:
    if spec is None:
        return None
    from onnxprec.accuracy import AccuracyTarget

    return AccuracyTarget.parse(spec)


def _parse_plugin_precisions(items: Sequence[str]) -> dict[str, PluginPrecision]:
    """Parses ``op:fp16`` or ``op:[fp16,fp32]:[fp16]`` (per input, per output)."""
    if not items:
        return {}
    from onnxprec.autocast.classify import PluginPrecision

    plugins = {}
    for item in items:
        m = re.fullmatch(r"([^:]+):(fp16|fp32)", item) or re.fullmatch(r"([^:]+):\[([^\]]*)\]:\[([^\]]*)\]", item)
        if m is None:
            raise InvalidArgumentError(
                f"Invalid --trt_plugins_precision '{item}': write op:fp16, op:fp32 or op:[fp16,fp32]:[fp16]."
            )
        if m.lastindex == 2:
            plugins[m.group(1)] = PluginPrecision(None, None, m.group(2))
            continue
        slots = [tuple(s.strip() for s in g.split(",") if s.strip()) for g in (m.group(2), m.group(3))]
        bad = [s for group in slots for s in group if s not in ("fp16", "fp32")]
        if bad:
            raise InvalidArgumentError(
                f"Invalid precision {bad[0]!r} in --trt_plugins_precision '{item}': use fp16 or fp32."
            )
        plugins[m.group(1)] = PluginPrecision(slots[0], slots[1], "fp16")
    return plugins
