"""INT4 weight-only quantization of MatMul/Gemm weights: RTN, AWQ and GPTQ; a drop-in for ModelOpt's ``int4.quantize``.

The pipeline, one step each::

    load -> check -> sanitize -> select layers -> calibrate + decide -> rewrite (QDQ or MatMulNBits)
         -> validate -> save (each weight quantized while it is written)

``quantize`` takes ModelOpt's arguments and returns an ``onnx.ModelProto``; ``quantize_file`` streams path to path
and returns a report. The implementation lives in ``_api`` and is imported on first use, so
``python -m onnxprec.quantization.int4 --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxprec.quantization.int4._api import (
        Int4Options,
        Int4Report,
        default_output_path,
        quantize,
        quantize_file,
        quantize_model,
    )

__all__ = ["Int4Options", "Int4Report", "default_output_path", "quantize", "quantize_file", "quantize_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("onnxprec.quantization.int4._api"), name)
    raise AttributeError(f"module 'onnxprec.quantization.int4' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
