"""FP8 (E4M3FN) post-training quantization for TensorRT: ModelOpt's ``quantize(quantize_mode="fp8")``.

FP8 weights per channel and activations per tensor, placed as INT8's ``--runtime trt`` places INT8 (with ModelOpt's
FP8 rules for Convs), an FP16 remainder. The implementation lives in ``_api``; it is imported on first use, so
``python -m onnxprec.quantization.fp8 --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.quantization.fp8._api import (
        Fp8Options,
        Fp8Report,
        default_output_path,
        quantize_file,
        quantize_model,
    )

__all__ = ["Fp8Options", "Fp8Report", "default_output_path", "quantize_file", "quantize_model"]


__getattr__, __dir__ = lazy_exports(__name__, __all__, "onnxprec.quantization.fp8._api")
