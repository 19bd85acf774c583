"""INT4 weight-only quantization of MatMul/Gemm weights: RTN, AWQ and GPTQ; a drop-in for ModelOpt's ``int4.quantize``.

The pipeline, one step each::

    load -> check -> sanitize -> select layers -> calibrate + decide -> rewrite (QDQ or MatMulNBits)
         -> validate -> save (each weight quantized while it is written)

``quantize`` takes ModelOpt's arguments and returns an ``onnx.ModelProto``; ``quantize_file`` streams path to path
and returns a report. The implementation lives in ``_api`` and is imported on first use, so
``python -m onnxprec.quantization.int4 --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, __all__, "onnxprec.quantization.int4._api")
