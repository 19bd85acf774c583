"""INT8 post-training quantization (static QDQ, dynamic INT8, SmoothQuant, bias correction, float fallback).

A drop-in for ModelOpt's ``quantize(quantize_mode="int8")`` (:func:`onnxprec.quantization.quantize`) and, through
:func:`onnxprec.quantization.quantize_static`, for ONNX Runtime's ``quantize_static``. The placement follows the
runtime the model is for (``runtime``: ort-cpu by default, ort-cuda, trt). Each name is imported from its module on
first use, so ``python -m onnxprec.quantization.int8 --help`` stays fast; what another tool (FP8, the
``onnxprec.quantization`` package) uses of INT8 is in ``__all__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.quantization.int8._api import default_output_path, quantize_file, quantize_model
    from onnxprec.quantization.int8._options import CALIBRATION_METHODS, WEIGHT_ROUNDINGS, Int8Options
    from onnxprec.quantization.int8._report import Int8Report
    from onnxprec.quantization.int8.ort_compat import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

_HOMES = {
    "CALIBRATION_METHODS": "onnxprec.quantization.int8._options",
    "Int8Options": "onnxprec.quantization.int8._options",
    "WEIGHT_ROUNDINGS": "onnxprec.quantization.int8._options",
    "Int8Report": "onnxprec.quantization.int8._report",
    "default_output_path": "onnxprec.quantization.int8._api",
    "quantize_file": "onnxprec.quantization.int8._api",
    "quantize_model": "onnxprec.quantization.int8._api",
    "CalibrationMethod": "onnxprec.quantization.int8.ort_compat",
    "QuantFormat": "onnxprec.quantization.int8.ort_compat",
    "QuantType": "onnxprec.quantization.int8.ort_compat",
    "quantize_dynamic": "onnxprec.quantization.int8.ort_compat",
    "quantize_static": "onnxprec.quantization.int8.ort_compat",
}
__all__ = [
    "CALIBRATION_METHODS",
    "WEIGHT_ROUNDINGS",
    "CalibrationMethod",
    "Int8Options",
    "Int8Report",
    "QuantFormat",
    "QuantType",
    "default_output_path",
    "quantize_dynamic",
    "quantize_file",
    "quantize_model",
    "quantize_static",
]


__getattr__, __dir__ = lazy_exports(__name__, __all__, homes=_HOMES)
