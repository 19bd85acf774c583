"""INT8 post-training quantization (static QDQ, dynamic INT8, SmoothQuant, bias correction, float fallback).

A drop-in for ModelOpt's ``quantize(quantize_mode="int8")`` (:func:`onnxprec.quantization.quantize`) and, through
:func:`onnxprec.quantization.quantize_static`, for ONNX Runtime's ``quantize_static``. The placement follows the
runtime the model is for (``runtime``: ort-cpu by default, ort-cuda, trt). The implementation lives in ``_api``; it
is imported on first use, so ``python -m onnxprec.quantization.int8 --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxprec.quantization.int8._api import (
        Int8Options,
        Int8Report,
        default_output_path,
        quantize_file,
        quantize_model,
    )

__all__ = ["Int8Options", "Int8Report", "default_output_path", "quantize_file", "quantize_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("onnxprec.quantization.int8._api"), name)
    raise AttributeError(f"module 'onnxprec.quantization.int8' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
