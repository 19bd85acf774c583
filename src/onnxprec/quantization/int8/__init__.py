"""INT8 post-training quantization (static QDQ, dynamic INT8, SmoothQuant, bias correction, float fallback).

A drop-in for ModelOpt's ``quantize(quantize_mode="int8")`` (:func:`onnxprec.quantization.quantize`) and, through
:func:`onnxprec.quantization.quantize_static`, for ONNX Runtime's ``quantize_static``. The placement follows the
runtime the model is for (``runtime``: ort-cpu by default, ort-cuda, trt). Each name is imported from its module on
first use, so ``python -m onnxprec.quantization.int8 --help`` stays fast; what another tool (FP8, the
``onnxprec.quantization`` package) uses of INT8 is in ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "CALIBRATION_METHODS": "_options",
    "Int8Options": "_options",
    "WEIGHT_ROUNDINGS": "_options",
    "Int8Report": "_report",
    "default_output_path": "_api",
    "quantize_file": "_api",
    "quantize_model": "_api",
    "CalibrationMethod": "ort_compat",
    "QuantFormat": "ort_compat",
    "QuantType": "ort_compat",
    "quantize_dynamic": "ort_compat",
    "quantize_static": "ort_compat",
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


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"onnxprec.quantization.int8.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'onnxprec.quantization.int8' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
