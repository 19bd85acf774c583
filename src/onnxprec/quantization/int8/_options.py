"""The INT8 quantizer's options, each declared once: API keyword (ModelOpt's names), command-line flag and help.

Imports nothing heavy, so the command line can print ``--help`` without loading the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from onnxprec._arg_groups import (
    calibration_data_option,
    input_shapes_option,
    log_level_option,
    op_types_option,
    regexes_option,
)
from onnxprec._options import compile_patterns, option
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import _tool
from onnxprec.quantization._tool import EXTRAS, WEIGHT_ROUNDINGS

if TYPE_CHECKING:
    from onnxprec._ort import Optimization
    from onnxprec.quantization.algorithms.qtypes import QType

__all__ = [
    "ACTIVATION_MODES",
    "ACTIVATION_TYPES",
    "ACTIVATION_TYPE_ALIASES",
    "CALIBRATION_METHODS",
    "DEFAULT_FLOAT_COMPUTE",
    "GPTQ_DAMP",
    "HIGH_PRECISION_TYPES",
    "RUNTIMES",
    "WEIGHT_ROUNDINGS",
    "WIDE_GPTQ_DAMP",
    "Int8Options",
    "activation_type_name",
]

CALIBRATION_METHODS: tuple[str, ...] = ("max", "entropy", "percentile", "mse")
RUNTIMES = ("ort-cpu", "ort-cuda", "trt")
ACTIVATION_MODES = ("auto", "static", "dynamic")
HIGH_PRECISION_TYPES = ("fp32", "fp16", "bf16")
ACTIVATION_TYPES = ("int8", "uint8", "int16", "uint16")
DEFAULT_FLOAT_COMPUTE = 0.25
"""The share of the quantized layers' multiply-adds the float fallback may send back to float unless
``max_float_compute`` is given (speed first)."""
GPTQ_DAMP = 0.01
"""GPTQ's damping of INT8 Conv weights (a fraction of the Hessian diagonal's mean) unless ``gptq_damp`` is given."""
WIDE_GPTQ_DAMP = 1.0
"""... with a 16-bit ``activation_type`` (the results that set both: docs/tools/fp8.md, "A16W8")."""
ACTIVATION_TYPE_ALIASES = {"qint8": "int8", "quint8": "uint8", "qint16": "int16", "quint16": "uint16"}
"""The anchors' spellings of ``activation_type``: ONNX Runtime's and AMD Quark's ``QuantType`` names (``QInt16``...),
any case."""


def activation_type_name(text: str) -> str:
    """``activation_type`` as onnxprec spells it (:data:`ACTIVATION_TYPE_ALIASES`), e.g. ``QInt16`` -> ``int16``."""
    lowered = str(text).strip().lower()
    return ACTIVATION_TYPE_ALIASES.get(lowered, lowered)


@dataclass
class Int8Options(_tool.QuantizationOptions):
    """All INT8 settings, validated once. The ModelOpt arguments come first, with ModelOpt's names and meanings."""

    TITLE = "INT8 options (ModelOpt names)"
    TOOL = "INT8"
    OUTPUT_SUFFIX = ".quant"
    WRITES_REMAINDER: ClassVar[bool] = False
    """Whether a model whose every candidate layer a placement rule skips is written without Q/DQ (its float
    remainder converted) rather than refused (:func:`onnxprec.quantization._tool.remainder_only`)."""

    calibration_data: Any = calibration_data_option(
        "Calibration inputs",
        flags=("-d", "--calibration_data", "--calibration_data_path"),
        note="the ranges of static activations, SmoothQuant and the accuracy target are fitted to it",
    )
    calibration_method: str | None = option(
        None,
        choices=CALIBRATION_METHODS,
        help="How the ranges of static activations are calibrated: max (the extremes seen), entropy (TensorRT's KL "
        "threshold), percentile (of |x|, --percentile), mse (the clip with the least squared error); dynamic "
        "activations need none (default: mse on every runtime. ModelOpt's default is entropy, which its 128-bin "
        "calibrator brings near the max; a real KL threshold clips transformer and ReLU6 tensors).",
        doc="How the ranges of static activations are calibrated: max (the extremes seen), entropy (TensorRT's KL "
        "threshold), percentile (of |x|, ``percentile``), mse (the clip with the least squared error); dynamic "
        "activations need none. Default: mse on every runtime (ModelOpt's default is entropy, but the 128-bin ONNX "
        "Runtime calibrator it runs lands at the max of most tensors, while a real KL threshold clips transformers' "
        "and ReLU6 tensors).",
    )
    calibration_data_reader: Any = option(
        None,
        api_only=True,
        help="An ONNX Runtime ``CalibrationDataReader`` (or any source ``calibration_data`` takes); give one of the "
        "two.",
    )
    calibration_eps: Sequence[str] = _tool.calibration_eps_option()
    op_types_to_quantize: Sequence[str] | None = op_types_option(
        "Only these op types (Conv, MatMul, Gemm, and the static region's Add, Mul, Concat, pools) (default: "
        "all supported).",
        flags=("-opi", "--op_types_to_include", "--op_types_to_quantize"),
    )
    op_types_to_exclude: Sequence[str] | None = op_types_option(
        "Op types kept in float.", flags=("-ope", "--op_types_to_exclude")
    )
    nodes_to_quantize: Sequence[str] | None = regexes_option(
        "Only nodes whose name or output name matches one of these regexes (default: all, except on "
        "ort-cpu a layer that reads the model's float input, e.g. a CNN's first Conv, which stays float unless named "
        "here).",
        flags=("-ni", "--nodes_to_include", "--nodes_to_quantize"),
    )
    nodes_to_exclude: Sequence[str] | None = _tool.nodes_to_exclude_option("the node name and its output names")
    use_external_data_format: bool = _tool.external_data_option()
    high_precision_dtype: str | None = option(
        None,
        choices=HIGH_PRECISION_TYPES,
        help="Type of what stays in float: fp32, or fp16/bf16 by AutoCast on the float remainder (default: fp32 on "
        "--runtime ort-cpu, where FP16 is slow; fp16 on trt and ort-cuda, as ModelOpt).",
    )
    runtime: str = option(
        "ort-cpu",
        choices=RUNTIMES,
        help="Where the model will run; sets the placement: ort-cpu (ONNX Runtime CPU: QDQ that fuses into QLinear "
        "kernels, dynamic INT8 MatMuls), ort-cuda or trt (TensorRT-style symmetric Q/DQ on Conv, MatMul and Gemm "
        "inputs).",
    )
    log_level: str = log_level_option()
    activations: str = option(
        "auto",
        choices=ACTIVATION_MODES,
        group=EXTRAS,
        help="How MatMul/Gemm activations are quantized: auto (dynamic on ort-cpu, static elsewhere), static "
        "(calibrated ranges) or dynamic (DynamicQuantizeLinear at run time, ort-cpu).",
    )
    activation_type: str | None = option(
        None,
        choices=ACTIVATION_TYPES,
        type=activation_type_name,
        group=EXTRAS,
        help="The type of calibrated (static) activations: int8 (symmetric), uint8 (with zero points), int16 "
        "(symmetric) or uint16: 16-bit activations with INT8 weights (A16W8, opset 21; ONNX Runtime's CPU provider "
        "runs their layers in float between the Q/DQ); with --target_accuracy or the accuracy guard, 16 bits only for "
        "the tensors whose 8 bits cost the most, within --max_wide_tensors, the others 8; ONNX Runtime's and "
        "Quark's QuantType names (QInt16, QUInt16...) are taken too (default: uint8 on --runtime ort-cpu, int8 "
        "elsewhere).",
    )
    max_wide_tensors: float = option(
        0.25,
        group=EXTRAS,
        metavar="FRACTION",
        help="With a 16-bit --activation_type and an accuracy target (or the guard): at most this fraction of the "
        "static activation tensors go to 16 bits, the most sensitive first; 1: every one may.",
    )
    target_accuracy: str | Callable[..., Any] | None = option(
        None,
        group=EXTRAS,
        metavar="SPEC",
        help="What the outputs must keep on the calibration data, AutoCast's syntax (rel_l2<=0.03, cosine>=0.999, "
        "top1>=0.99, max_abs<=0.1, joined by commas); the most sensitive layers go back to float until it holds, "
        "within --max_float_compute (default: none, as ModelOpt: every selected layer stays INT8; a float layer "
        "costs speed that only the user can weigh).",
        doc="What the outputs must keep on the calibration data, AutoCast's syntax (``rel_l2<=0.03``, "
        "``cosine>=0.999``, ``top1>=0.99``, ``max_abs<=0.1``, joined by commas) or a callback on (reference, "
        "candidate) outputs; the most sensitive layers go back to float until it holds, within "
        "``max_float_compute``; None or ``'none'`` (the default, as ModelOpt): every selected layer stays INT8.",
    )
    accuracy_guard: bool = option(
        True,
        group=EXTRAS,
        help="Turn the accuracy guard off (default: on: the result is measured against the float model on the "
        "calibration inputs, and on held-out runs when there are 8 or more (the last quarter); when an output misses "
        "the default bound of its task metric (top-1 agreement >= 0.98 for class scores, identical decoded "
        "strings >= 0.993 (0.98 held out), seen or predicted from the step margins, for a CTC sequence, >= 0.95 of "
        "a Sigmoid map's regions matched, SNR >= 25 dB for a waveform or log-scale features, cosine >= 0.99 "
        "otherwise; docs/tools/int8.md lists them), the most sensitive "
        "layers go back to float within --max_float_compute (beyond its default when needed, never every layer), "
        "until the bound holds on the calibration and the held-out runs; when that is not enough "
        "the model is written for inspection and the command exits with code 3, naming the metric and the layers "
        "that carry the error). Off, the measured accuracy is still printed and recorded.",
        doc="Hold the result to the default bound of each output's task metric (top-1 agreement >= 0.98 for class "
        "scores, identical decoded strings >= 0.993 (0.98 held out), seen or predicted from the step margins, for a "
        "CTC sequence, >= 0.95 of a Sigmoid map's regions matched, SNR >= 25 dB for a waveform or log-scale "
        "features, cosine >= 0.99 otherwise: "
        "``onnxprec.quantization.guard.DEFAULT_BOUNDS``) on the calibration inputs and the "
        "held-out runs: the float fallback runs to meet it on both within ``max_float_compute`` (beyond its default "
        "when needed, never every layer); a result that still misses "
        "it is written for inspection and :class:`~onnxprec.errors.AccuracyGuardError` (carrying the report) is "
        "raised. False: the accuracy is measured and reported only.",
    )
    random_calibration_data: bool = option(
        False,
        group=EXTRAS,
        help="Without --calibration_data, fit the activation ranges and decisions to synthetic inputs (synthetic "
        "images for image inputs, random values for the others) instead of refusing (the default: refuse in one line; "
        "docs/tools/int8.md compares the two on the corpus). The accuracy check then runs on the same synthetic "
        "inputs and cannot judge the task: the summary and a WARNING say so.",
    )
    max_float_compute: float | None = option(
        None,
        group=EXTRAS,
        metavar="FRACTION",
        help="The accuracy target sends at most this fraction of the quantized layers' multiply-adds back to float "
        "(speed first; a target it cannot meet within it is reported with what was reached); 1: no limit (default: "
        "0.25; under the accuracy guard, when the layers within 0.25 miss its bound, more of the most sensitive go "
        "back, never every layer).",
    )
    smoothquant: bool = option(
        True,
        group=EXTRAS,
        help="Turn SmoothQuant off (default: on for dynamic and static MatMul/Gemm layers, alpha searched per input "
        "on held-out calibration tokens, kept only where it helps).",
    )
    outlier_channels: int = option(
        32,
        group=EXTRAS,
        metavar="N",
        help="At most this many input channels per dynamic layer input computed in float (LLM.int8()-style outlier "
        "split, chosen on calibration data, kept only where it helps); 0: none.",
    )
    bias_correction: bool = option(
        True,
        group=EXTRAS,
        help="Turn bias correction off (default: on: each layer's bias cancels the mean output shift of its "
        "quantized weight on the calibration data).",
    )
    float_linear_outputs: bool = option(
        True,
        group=EXTRAS,
        help="Turn off float outputs of pointwise Convs that no activation clips (default: on with --runtime "
        "ort-cpu: such a Conv, a MobileNet's project Conv, runs as MatMulIntegerToFloat, INT8 inputs and a float "
        "output, so the residual stream and its Adds stay float and only the Convs that read it quantize it).",
    )
    two_part_weights: bool = option(
        False,
        group=EXTRAS,
        help="A second INT8 weight part for the float-output pointwise Convs rounded to nearest (default: off): where "
        "the calibration has fewer rows than such a Conv has inputs, too few for GPTQ, the rounding error of its INT8 "
        "weights is itself rounded to INT8 and computed by a second MatMulIntegerToFloat, w = s q + s_r q_r; more "
        "accurate, and slower on CPU).",
    )
    weight_rounding: str = _tool.weight_rounding_option("INT8 weights are rounded", "to nearest")
    gptq_damp: float | None = _tool.gptq_damp_option(
        None,
        "default: 1 with a 16-bit --activation_type, where the weights carry most of the error and a rounding fitted "
        "to the calibration data generalizes worse; 0.01 otherwise",
        group=EXTRAS,
    )
    percentile: float = option(
        99.999, group=EXTRAS, metavar="P", help="The percentile of |x| kept by --calibration_method percentile."
    )
    calibration_batch_size: int | None = _tool.calibration_batch_size_option(
        None, "bounds memory; dynamic ranges are per run; default: as given"
    )
    sample_tokens: int = _tool.sample_tokens_option("dynamic layer input for the SmoothQuant and outlier decisions")
    input_shapes: str | Mapping[str, Sequence[int]] | None = input_shapes_option(
        flags=("--calibration_shapes", "--input_shapes"), group=EXTRAS
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.calibration_method is not None and self.calibration_method not in CALIBRATION_METHODS:
            raise InvalidArgumentError(
                f"Unknown INT8 calibration_method '{self.calibration_method}': use {', '.join(CALIBRATION_METHODS)}."
            )
        if self.activation_type is not None:
            self.activation_type = activation_type_name(self.activation_type)
        if self.activation_type is not None and self.activation_type not in ACTIVATION_TYPES:
            raise InvalidArgumentError(
                f"Unknown activation_type '{self.activation_type}': use {', '.join(ACTIVATION_TYPES)}."
            )
        for name, choices in (
            ("runtime", RUNTIMES),
            ("activations", ACTIVATION_MODES),
            ("weight_rounding", WEIGHT_ROUNDINGS),
        ):
            if getattr(self, name) not in choices:
                raise InvalidArgumentError(f"Unknown {name} '{getattr(self, name)}': use {', '.join(choices)}.")
        if self.high_precision_dtype is not None and self.high_precision_dtype not in HIGH_PRECISION_TYPES:
            raise InvalidArgumentError(
                f"Unknown high_precision_dtype '{self.high_precision_dtype}': use {', '.join(HIGH_PRECISION_TYPES)}."
            )
        if self.activations == "dynamic" and self.runtime != "ort-cpu":
            raise InvalidArgumentError(f"activations='dynamic' is for --runtime ort-cpu, not {self.runtime}.")
        if not 0 <= self.max_wide_tensors <= 1:
            raise InvalidArgumentError(f"max_wide_tensors must be in [0, 1], got {self.max_wide_tensors!r}.")
        if self.max_float_compute is not None and not 0 <= self.max_float_compute <= 1:
            raise InvalidArgumentError(f"max_float_compute must be in [0, 1], got {self.max_float_compute!r}.")
        _tool.check_gptq_damp(self.gptq_damp)
        if not 0 < self.percentile <= 100:
            raise InvalidArgumentError(f"percentile must be in (0, 100], got {self.percentile!r}.")
        if self.outlier_channels < 0:
            raise InvalidArgumentError(f"outlier_channels must be >= 0, got {self.outlier_channels!r}.")
        if self.calibration_data is not None and self.calibration_data_reader is not None:
            raise InvalidArgumentError("Give calibration_data or calibration_data_reader, not both.")
        if isinstance(self.target_accuracy, str) and self.target_accuracy.strip().lower() in ("none", ""):
            self.target_accuracy = None
        self.exclude_patterns = compile_patterns(self.nodes_to_exclude, "nodes_to_exclude")
        self.include_patterns = compile_patterns(self.nodes_to_quantize, "nodes_to_quantize")
        self.target = None
        if self.target_accuracy is not None:
            from onnxprec.accuracy import AccuracyTarget

            self.target = AccuracyTarget.parse(self.target_accuracy)

    def _by_runtime(self, given: str | None, cpu: str, other: str) -> str:
        """``given`` when set, else ``cpu`` on --runtime ort-cpu and ``other`` on the others."""
        if given is not None:
            return given
        return cpu if self.runtime == "ort-cpu" else other

    @property
    def method(self) -> str:
        """The calibration method in effect: mse unless given (see the option's help for why not ModelOpt's entropy)."""
        return self.calibration_method or "mse"

    @property
    def source(self) -> Any:
        """The calibration source given (data or reader)."""
        return self.calibration_data if self.calibration_data is not None else self.calibration_data_reader

    @property
    def float_type(self) -> str:
        """What stays in float: fp32 on ort-cpu, fp16 elsewhere, unless ``high_precision_dtype`` says."""
        return self._by_runtime(self.high_precision_dtype, "fp32", "fp16")

    @property
    def symmetric(self) -> bool:
        """Symmetric INT8 activations (TensorRT) instead of UINT8 with zero points (ONNX Runtime CPU)."""
        return self.runtime != "ort-cpu"

    @property
    def activation_qtype(self) -> QType:
        """The type of calibrated activations (but the tensors :attr:`wide_qtype` promotes): ``activation_type``
        unless activations are mixed, else INT8 (symmetric) on TensorRT and ort-cuda, UINT8 on ort-cpu."""
        from onnxprec.quantization.algorithms.qtypes import INT8, UINT8, qtype

        if self.activation_type is not None and self.wide_qtype is None:
            return qtype(self.activation_type)
        return INT8 if self.symmetric else UINT8

    @property
    def bounded(self) -> bool:
        """The result is held to a bound: the user's ``target_accuracy`` or the accuracy guard's."""
        return self.target_accuracy is not None or self.accuracy_guard

    @property
    def float_compute(self) -> float:
        """The share of the quantized layers' multiply-adds the float fallback sends back to float first:
        ``max_float_compute``, :data:`DEFAULT_FLOAT_COMPUTE` unless given."""
        return DEFAULT_FLOAT_COMPUTE if self.max_float_compute is None else self.max_float_compute

    @property
    def float_compute_extends(self) -> bool:
        """Whether the float fallback may go beyond :attr:`float_compute` when the layers within it miss the bound:
        under the accuracy guard (no ``target_accuracy``) with ``max_float_compute`` not given."""
        return self.max_float_compute is None and self.target_accuracy is None and self.accuracy_guard

    @property
    def wide_qtype(self) -> QType | None:
        """With a 16-bit ``activation_type`` and an accuracy target or the guard: the 16-bit type the most sensitive
        static tensors are promoted to (the others 8 bits); else None (one type for every static tensor)."""
        from onnxprec.quantization.algorithms.qtypes import qtype

        wide = self.activation_type in ("int16", "uint16")
        if not wide or not self.bounded:
            return None
        return qtype(str(self.activation_type))

    @property
    def damp(self) -> float:
        """GPTQ's damping: ``gptq_damp``, else :data:`WIDE_GPTQ_DAMP` with a 16-bit ``activation_type`` and
        :data:`GPTQ_DAMP` otherwise."""
        if self.gptq_damp is not None:
            return self.gptq_damp
        return WIDE_GPTQ_DAMP if self.activation_type in ("int16", "uint16") else GPTQ_DAMP

    @property
    def weight_qtype(self) -> QType:
        """The type of the weights' levels: INT8, per channel."""
        from onnxprec.quantization.algorithms.qtypes import INT8

        return INT8

    @property
    def qdq_opset(self) -> int:
        """The opset the Q/DQ nodes need: 13 (per-axis DequantizeLinear), 19 where the Q/DQ pairs of --runtime trt
        read and write the FP16/BF16 remainder, 21 for 16-bit activations."""
        if self.activation_type in ("int16", "uint16"):
            return 21
        return 19 if self.runtime == "trt" and self.float_type != "fp32" else 13

    @property
    def check_optimization(self) -> Optimization:
        """The ONNX Runtime optimization level the result is measured at: ``all``, as ONNX Runtime will run it."""
        return "all"
