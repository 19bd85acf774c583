"""Evaluation: run one or several models side by side on the same data and report task metrics.

Perplexity for causal LMs (with or without KV-cache inputs), top-1/top-5 accuracy against labels, agreement
with a reference model's outputs (top-1 agreement, max abs, relative L2, cosine), latency per batch on the
chosen execution provider and the kernels ONNX Runtime ran (nodes in integer kernels, unfused Q/DQ; from its
profiler), batch by batch in bounded memory; and greedy generation through onnxruntime-genai
(``generate_models``, ``evaluate --generate``). The implementation lives in ``_api`` and is
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxprec._exports import lazy_exports

if TYPE_CHECKING:
    from onnxprec.evaluate._api import EvaluateOptions, EvaluationReport, ModelResult, evaluate_models
    from onnxprec.evaluate._generate import GenerationReport, GenerationResult, generate_models

__all__ = [
    "EvaluateOptions",
    "EvaluationReport",
    "GenerationReport",
    "GenerationResult",
    "ModelResult",
    "evaluate_models",
    "generate_models",
]
_GENERATION = {"GenerationReport", "GenerationResult", "generate_models"}


__getattr__, __dir__ = lazy_exports(
    __name__, __all__, "onnxprec.evaluate._api", dict.fromkeys(_GENERATION, "onnxprec.evaluate._generate")
)
