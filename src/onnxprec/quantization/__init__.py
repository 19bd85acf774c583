"""Weight-only quantization (INT4 block-wise, optional INT8) of ONNX MatMul/Gemm weights.

- :mod:`onnxprec.quantization.int4`: the tool (``quantize``, ``quantize_file``,
  ``python -m onnxprec.quantization.int4``);
- :func:`llm_feeds`: calibration/evaluation feeds for causal LMs from token ids or text;
- :mod:`~onnxprec.quantization.algorithms` (RTN, AWQ, GPTQ in numpy), :mod:`~onnxprec.quantization.packing`
  (bit-exact layouts), :mod:`~onnxprec.quantization.select`, :mod:`~onnxprec.quantization.methods`,
  :mod:`~onnxprec.quantization.scaling`, :mod:`~onnxprec.quantization.activation_stats`,
  :mod:`~onnxprec.quantization.formats`.

Attributes are imported on first use, so ``python -m onnxprec.quantization.int4 --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxprec.quantization.llm import llm_feeds, token_windows

__all__ = ["llm_feeds", "token_windows"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("onnxprec.quantization.llm"), name)
    raise AttributeError(f"module 'onnxprec.quantization' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
