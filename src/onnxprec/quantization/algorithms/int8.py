"""INT8 weights and the numerics of INT8 layers, in numpy: what ONNX Runtime's kernels compute, for decisions.

- :func:`quantize_weight`: per-output-channel symmetric INT8 (levels -127..127, zero point 0), along any axis
  (``[K, N]`` MatMul weights per column, ``[M, C, kh, kw]`` Conv weights per output channel).
- :func:`fake_dynamic`: ``DynamicQuantizeLinear`` then dequantization (UINT8, asymmetric, the range of each run),
  with the run ranges given, so that a sample of token rows drawn from many runs is quantized as each run was.
- :func:`fake_static`: QuantizeLinear then DequantizeLinear with a fixed scale and zero point.
- :func:`bias_correction`: the bias that cancels the mean output shift a quantized weight causes,
  ``-E[x] @ (Wq - W)`` (Nagel et al., "Data-Free Quantization", section 4.2, with the measured mean of ``x``).
- :func:`gptq_per_channel`: GPTQ rounding (Frantar et al., 2023) of per-channel INT8 weights, batched over groups:
  a grouped Conv is thousands of tiny problems (a depthwise 3x3 Conv: one 9-input problem per channel) that the
  block-wise :func:`~onnxprec.quantization.algorithms.gptq.gptq` would solve one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from onnxprec.quantization.algorithms.qtypes import QType

__all__ = [
    "QMAX",
    "bias_correction",
    "dequantize_weight",
    "fake_dynamic",
    "fake_static",
    "gptq_per_channel",
    "quantize_weight",
]

QMAX = 127
"""Symmetric INT8 weights use -127..127: no -128, so that a negated scale is exact and VNNI's u8*s8 pairs cannot
saturate."""


def quantize_weight(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric INT8 along ``axis`` (the output channels): ``(q int8, scales float32 [channels])``.

    A channel of zeros gets scale 1 (its levels are all 0).
    """
    weight = np.asarray(w, dtype=np.float32)
    axis = axis % weight.ndim
    others = tuple(i for i in range(weight.ndim) if i != axis)
    top = np.abs(weight).max(axis=others) if others else np.abs(weight)
    scales = (top / QMAX).astype(np.float32)
    scales[scales <= 0] = 1.0
    shape = [1] * weight.ndim
    shape[axis] = -1
    q = np.clip(np.rint(weight / scales.reshape(shape)), -QMAX, QMAX).astype(np.int8)
    return q, scales


def dequantize_weight(q: np.ndarray, scales: np.ndarray, axis: int) -> np.ndarray:
    """``q * scales`` broadcast along ``axis`` (float32)."""
    shape = [1] * q.ndim
    shape[axis % q.ndim] = -1
    return q.astype(np.float32) * np.asarray(scales, dtype=np.float32).reshape(shape)


def fake_dynamic(
    x: np.ndarray, lo: np.ndarray | float | None = None, hi: np.ndarray | float | None = None
) -> np.ndarray:
    """``DequantizeLinear(DynamicQuantizeLinear(x))`` for rows of ``x`` ``[T, K]`` (float64 out).

    Args:
        x: Token rows.
        lo, hi: The minimum and maximum of the run each row came from (``[T]``), or one range for all rows; None:
            the range of ``x`` itself (one run).
    """
    values = np.asarray(x, dtype=np.float64)
    low = np.minimum(values.min() if lo is None else np.asarray(lo, dtype=np.float64), 0.0)
    high = np.maximum(values.max() if hi is None else np.asarray(hi, dtype=np.float64), 0.0)
    scale = (high - low) / 255.0
    scale = np.where(scale > 0, scale, 1.0)
    zero_point = np.clip(np.rint(-low / scale), 0, 255)
    if np.ndim(scale):
        scale, zero_point = scale[:, None], zero_point[:, None]
    q = np.clip(np.rint(values / scale) + zero_point, 0, 255)
    return (q - zero_point) * scale


def fake_static(x: np.ndarray, scale: float, zero_point: int, *, symmetric: bool = False) -> np.ndarray:
    """``DequantizeLinear(QuantizeLinear(x, scale, zero_point))`` (UINT8, or INT8 -127..127 when symmetric)."""
    qmin, qmax = (-QMAX, QMAX) if symmetric else (0, 255)
    q = np.clip(np.rint(np.asarray(x, dtype=np.float64) / scale) + zero_point, qmin, qmax)
    return (q - zero_point) * scale


def bias_correction(mean_x: np.ndarray, w: np.ndarray, w_dequantized: np.ndarray) -> np.ndarray:
    """The ``[N]`` bias to add to a MatMul's output so that its mean over the data is unchanged by quantization.

    Args:
        mean_x: ``[K]`` mean of the layer's input over the calibration data.
        w: ``[K, N]`` float weight.
        w_dequantized: ``[K, N]`` quantized weight, dequantized.
    """
    delta = np.asarray(w_dequantized, dtype=np.float64) - np.asarray(w, dtype=np.float64)
    return -(np.asarray(mean_x, dtype=np.float64) @ delta)


GPTQ_BLOCK = 128
"""Input rows rounded one by one before the rows after them are updated in one product (GPTQ's lazy batch updates)."""


def gptq_per_channel(
    w: np.ndarray,
    hessian: np.ndarray,
    *,
    damp: float = 0.01,
    scales: np.ndarray | None = None,
    qtype: QType | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ with per-output-channel symmetric INT8 (or FP8) scales, for ``G`` independent problems at once.

    Args:
        w: ``[G, K, N]`` float weights (``Y_g = X_g @ W_g``).
        hessian: ``[G, K, K]`` ``X_gᵀ X_g`` summed over the calibration rows.
        damp: Added to the diagonal, as a fraction of its mean (per group).
        scales: ``[G, N]`` the grid of each column; None: RTN's (``max|W| / 127`` per column). A finer grid clips
            the largest weights, and their clipping error is pushed onto the rows not yet rounded as any other.
        qtype: The levels rounded to: None for INT8's -127..127; a float one (FP8 E4M3FN) rounds to its levels
            (:meth:`QType.quantize`), with ``scales`` given.

    Returns:
        ``(q [G, K, N] int8 in -127..127 or qtype's levels, scales [G, N] float32)``: GPTQ only chooses the
        roundings, each input row's error pushed onto the rows not yet rounded. An input that never fired (zero
        diagonal) keeps its weights, rounded to nearest: calibration data that misses a channel says nothing about it.
    """
    weight = np.array(w, dtype=np.float64)
    h = np.array(hessian, dtype=np.float64)
    k = weight.shape[1]
    if scales is None:
        scales = np.abs(weight).max(axis=1) / QMAX  # [G, N]
        scales[scales <= 0] = 1.0
    scales = np.asarray(scales, dtype=np.float64)
    diagonal = np.einsum("gii->gi", h)
    mean = np.maximum(diagonal.mean(axis=1, keepdims=True), 1e-12)
    dead = diagonal <= 0
    diagonal = np.where(dead, mean, diagonal) + damp * mean
    index = np.arange(k)
    h[:, index, index] = diagonal
    inverse = np.linalg.inv(h)
    upper = np.linalg.cholesky(inverse).transpose(0, 2, 1)  # U with Uᵀ U = H⁻¹
    q = np.empty(weight.shape, dtype=np.int8 if qtype is None else qtype.dtype)
    for start in range(0, k, GPTQ_BLOCK):  # GPTQ's lazy batches: the rows after a block get its errors at once
        stop = min(start + GPTQ_BLOCK, k)
        block = weight[:, start:stop, :]
        errors = np.empty(block.shape, dtype=np.float64)
        for i in range(stop - start):
            row = start + i
            if qtype is None:
                levels = np.clip(np.rint(block[:, i, :] / scales), -QMAX, QMAX)
                q[:, row, :] = levels
            else:
                q[:, row, :] = qtype.quantize(block[:, i, :], scales)
                levels = q[:, row, :].astype(np.float64)
            errors[:, i, :] = (block[:, i, :] - levels * scales) / upper[:, row, row][:, None]
            block[:, i + 1 :, :] -= upper[:, row, row + 1 : stop][:, :, None] * errors[:, i, None, :]
        if stop < k:
            weight[:, stop:, :] -= np.matmul(upper[:, start:stop, stop:].transpose(0, 2, 1), errors)
    return q, scales.astype(np.float32)
