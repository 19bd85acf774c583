"""The FP8 quantizer's options: INT8's (ModelOpt's names), with FP8's defaults and the settings that apply to it.

Imports nothing heavy, so the command line can print ``--help`` without loading the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from onnxprec._options import option
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import _tool
from onnxprec.quantization.int8 import CALIBRATION_METHODS, Int8Options

if TYPE_CHECKING:
    from onnxprec._ort import Optimization
    from onnxprec.quantization.algorithms.qtypes import QType

__all__ = ["FP8_RUNTIMES", "Fp8Options"]

FP8_RUNTIMES = ("trt", "ort-cuda")
"""The placements FP8 takes: TensorRT's (ONNX Runtime's CPU provider has no FP8 kernels: it runs FP8 Q/DQ only)."""


@dataclass
class Fp8Options(Int8Options):
    """All FP8 settings: INT8's options with FP8 E4M3FN weights (per channel) and activations (per tensor).

    The placement is TensorRT's (``runtime`` trt or ort-cuda), activation ranges are calibrated with INT8's range
    methods (default ``max``: FP8's relative precision has no use for clipping), weights rounded by GPTQ on FP8's
    levels as INT8's are on its own (``weight_rounding``: Convs by default), the float remainder is FP16 unless
    ``high_precision_dtype`` says otherwise.
    The dynamic-INT8 settings (``activations``, ``smoothquant``, ``outlier_channels``, ``float_linear_outputs``,
    ``two_part_weights``) do not apply: every FP8 layer is static; nor do INT8's ``activation_type`` and
    ``max_wide_tensors`` (refused, ignored).
    """

    TITLE = "FP8 options (ModelOpt names)"
    TOOL = "FP8"
    OUTPUT_SUFFIX = ".quant"
    WRITES_REMAINDER: ClassVar[bool] = True
    """As ModelOpt: where TensorRT's FP8 rules keep every layer FP16, the model is written with its FP16 remainder
    and no Q/DQ (exit 0, one WARNING), judged by the guard as any result."""

    calibration_method: str | None = option(
        None,
        choices=CALIBRATION_METHODS,
        help="How activation ranges are calibrated: max (the extremes seen, the default: FP8's levels are relative, "
        "clipping only loses the outliers), entropy, percentile (--percentile), mse (the clip an INT8 grid wants).",
    )
    bias_correction: bool = option(
        False,
        group="onnxprec extras",
        help="Correct each layer's bias for the mean output shift of its FP8 weight on the calibration data (default: "
        "off, as ModelOpt: FP8's relative rounding errors have no mean to cancel).",
    )
    weight_rounding: str = _tool.weight_rounding_option(
        "FP8 weights are rounded to E4M3's levels (each channel's scale that of rounding to nearest)",
        "to nearest, as ModelOpt",
    )
    runtime: str = option(
        "trt",
        choices=FP8_RUNTIMES,
        help="Where the model will run: trt (TensorRT: FP8 Q/DQ on Conv, MatMul and Gemm inputs and on residual Adds, "
        "reading and writing the FP16 remainder) or ort-cuda (the same placement, Casts around the Q/DQ).",
    )

    def __post_init__(self) -> None:
        if self.runtime not in FP8_RUNTIMES:
            raise InvalidArgumentError(
                f"FP8 runs on {' or '.join(FP8_RUNTIMES)} (runtime {self.runtime!r}): ONNX Runtime's CPU provider has "
                "no FP8 kernels; use quantize_mode int8 there."
            )
        if self.activation_type is not None:
            raise InvalidArgumentError(
                f"activation_type {self.activation_type!r} is for INT8 (A16W8): FP8's activations are FP8; drop it."
            )
        super().__post_init__()

    @property
    def method(self) -> str:
        """The calibration method in effect: max unless given."""
        return self.calibration_method or "max"

    @property
    def activation_qtype(self) -> QType:
        """FP8 E4M3FN, per tensor, with room above the calibrated range (:data:`~onnxprec.quantization.algorithms.
        qtypes.FP8_ACTIVATION_HEADROOM`)."""
        from onnxprec.quantization.algorithms.qtypes import FP8_ACTIVATION

        return FP8_ACTIVATION

    @property
    def weight_qtype(self) -> QType:
        """FP8 E4M3FN, per channel."""
        from onnxprec.quantization.algorithms.qtypes import FP8

        return FP8

    @property
    def qdq_opset(self) -> int:
        """19: FP8 QuantizeLinear/DequantizeLinear."""
        return 19

    @property
    def check_optimization(self) -> Optimization:
        """``none``: the result is measured as its Q/DQ graph computes, with no ONNX Runtime CPU rewrites (TensorRT
        runs it; ORT 1.32's ``WeightBiasQuantization`` mis-runs FP8 Convs: docs/tools/fp8.md)."""
        return "none"
