"""Evaluation: run one or several models side by side on the same data and report task metrics.

Perplexity for causal LMs (with or without KV-cache inputs), top-1/top-5 accuracy against labels, agreement
with a reference model's outputs (top-1 agreement, max abs, relative L2, cosine), latency per batch on the
chosen execution provider and the kernels ONNX Runtime ran (nodes in integer kernels, unfused Q/DQ; from its
profiler), batch by batch in bounded memory; and greedy generation through onnxruntime-genai
(``generate_models``, ``evaluate --generate``). The implementation lives in ``_api`` and is
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name in _GENERATION:
        return getattr(importlib.import_module("onnxprec.evaluate._generate"), name)
    if name in __all__:
        return getattr(importlib.import_module("onnxprec.evaluate._api"), name)
    raise AttributeError(f"module 'onnxprec.evaluate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
