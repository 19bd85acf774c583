"""Quantization of ONNX models: INT8 (static/dynamic, for the runtime that runs it) and INT4 weight-only.

- :func:`quantize`: ModelOpt's entry point (``quantize_mode="int8"`` or ``"int4"``;
  ``python -m onnxprec.quantization``);
- :mod:`onnxprec.quantization.int8`: the INT8 tool; :func:`quantize_static`, :func:`quantize_dynamic` and
  :class:`CalibrationMethod` for ONNX Runtime's users;
- :mod:`onnxprec.quantization.int4`: the INT4 tool (``quantize``, ``quantize_file``,
  ``python -m onnxprec.quantization.int4``);
- :func:`llm_feeds`: calibration/evaluation feeds for causal LMs from token ids or text;
- :mod:`~onnxprec.quantization.algorithms` (RTN, AWQ, GPTQ in numpy), :mod:`~onnxprec.quantization.packing`
  (bit-exact layouts), :mod:`~onnxprec.quantization.select`, :mod:`~onnxprec.quantization.methods`,
  :mod:`~onnxprec.quantization.scaling`, :mod:`~onnxprec.quantization.activation_stats`,
  :mod:`~onnxprec.quantization.formats`.

Attributes are imported on first use, so ``python -m onnxprec.quantization.int4 --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.quantization._api import quantize
    from onnxprec.quantization.int8 import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxprec.quantization.llm import llm_feeds, token_windows

_HOMES = {
    "llm_feeds": "onnxprec.quantization.llm",
    "token_windows": "onnxprec.quantization.llm",
    "quantize": "onnxprec.quantization._api",
    "quantize_static": "onnxprec.quantization.int8",
    "quantize_dynamic": "onnxprec.quantization.int8",
    "CalibrationMethod": "onnxprec.quantization.int8",
    "QuantFormat": "onnxprec.quantization.int8",
    "QuantType": "onnxprec.quantization.int8",
}
__all__ = [
    "CalibrationMethod",
    "QuantFormat",
    "QuantType",
    "llm_feeds",
    "quantize",
    "quantize_dynamic",
    "quantize_static",
    "token_windows",
]


__getattr__, __dir__ = lazy_exports(__name__, __all__, homes=_HOMES)
