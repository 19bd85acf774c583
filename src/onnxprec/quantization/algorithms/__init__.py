"""Pure-numpy weight quantization algorithms on ``[K, N]`` MatMul weights: RTN (with clip search), AWQ and GPTQ."""

from __future__ import annotations

from onnxprec.quantization.algorithms.awq import (
    DEFAULT_ALPHA_GRID,
    DEFAULT_AWQ_CLIP_RATIOS,
    AwqResult,
    awq_clip,
    awq_lite,
    awq_weight_stat,
    block_gram,
)
from onnxprec.quantization.algorithms.gptq import gptq, hessian_from_tokens
from onnxprec.quantization.algorithms.rtn import (
    DEFAULT_CLIP_RATIOS,
    DEFAULT_GRID,
    QuantGrid,
    QuantizedWeight,
    block_params,
    effective_block_size,
    quantize_int8_per_channel,
    quantize_rtn,
    reconstruction_error,
)

__all__ = [
    "DEFAULT_ALPHA_GRID",
    "DEFAULT_AWQ_CLIP_RATIOS",
    "DEFAULT_CLIP_RATIOS",
    "DEFAULT_GRID",
    "AwqResult",
    "QuantGrid",
    "QuantizedWeight",
    "awq_clip",
    "awq_lite",
    "awq_weight_stat",
    "block_gram",
    "block_params",
    "effective_block_size",
    "gptq",
    "hessian_from_tokens",
    "quantize_int8_per_channel",
    "quantize_rtn",
    "reconstruction_error",
]
