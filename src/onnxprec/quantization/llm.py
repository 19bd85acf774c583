"""Calibration (and evaluation) feeds for causal language models, from token ids or text.

The old import path of :func:`onnxprec.llm_inputs.llm_feeds` and :func:`onnxprec.llm_inputs.token_windows`: the
feeds are built by the calibration layer's :class:`onnxprec.llm_inputs.LLMInputs`, which every tool uses.
"""

from __future__ import annotations

from onnxprec.llm_inputs import llm_feeds, token_windows

__all__ = ["llm_feeds", "token_windows"]
