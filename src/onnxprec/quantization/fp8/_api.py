"""FP8 (E4M3FN) post-training quantization: ModelOpt's ``quantize(quantize_mode="fp8")`` on INT8's pipeline.

INT8's pipeline with FP8 Q/DQ types (:class:`~onnxprec.quantization.fp8.Fp8Options`): the same sanitize, TensorRT
placement (Conv, MatMul and Gemm inputs, residual Adds; ModelOpt's FP8 rules for small and large Convs), one
calibration pass, ranges from INT8's range methods, the accuracy guard and float fallback, AutoCast of the float
remainder to FP16 with the Q/DQ nodes reading and writing it (opset 19). Weights are stored as FP8 levels read through
a per-channel DequantizeLinear (ModelOpt stores FP16 weights behind a QuantizeLinear: docs/tools/fp8.md).
"""

from __future__ import annotations

from onnxprec._io import ModelSource
from onnxprec.quantization._tool import QuantizationTool
from onnxprec.quantization.fp8._options import Fp8Options
from onnxprec.quantization.fp8._report import Fp8Report
from onnxprec.quantization.int8 import quantize_model as _int8_pipeline

__all__ = ["Fp8Options", "Fp8Report", "default_output_path", "quantize_file", "quantize_model"]


def quantize_model(source: ModelSource, options: Fp8Options) -> tuple[object, Fp8Report]:
    """Runs the pipeline up to (not including) saving; the returned model's FP8 weights are lazy tensors."""
    model, report = _int8_pipeline(source, options, Fp8Report)
    assert isinstance(report, Fp8Report)
    return model, report


TOOL: QuantizationTool[Fp8Options, Fp8Report] = QuantizationTool(Fp8Options, quantize_model)  # type: ignore[arg-type]
default_output_path = TOOL.default_output_path
quantize_file = TOOL.quantize_file
