"""Pre-processing for quantization: ONNX Runtime's ``quant_pre_process``, same arguments, at any model size.

Symbolic shape inference, ONNX Runtime's basic graph optimization (constant folding, Conv+BatchNormalization
and other fusions) and ONNX shape inference, plus an optional verified opset upgrade (``opset=``). Unlike ONNX
Runtime's version it handles models above 2 GB, models with contrib ops or If/Loop subgraphs, and a failing
symbolic shape inference; every step logs what it changed. The implementation lives in ``_api`` and is
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.preprocess._api import PreprocessOptions, default_output_path, preprocess_file, quant_pre_process
    from onnxprec.preprocess.report import PreprocessReport, StepReport

__all__ = [
    "PreprocessOptions",
    "PreprocessReport",
    "StepReport",
    "default_output_path",
    "preprocess_file",
    "quant_pre_process",
]


__getattr__, __dir__ = lazy_exports(__name__, __all__, "onnxprec.preprocess._api")
