"""Calibration-free searches of block scales and zero points that beat plain RTN: k-quant and HQQ.

Both work on blocks ``[n_blocks, block_size, N]`` (see :func:`~onnxprec.quantization.algorithms.rtn.to_blocks`)
and return parameters the output formats can store: float scales (signed when symmetric, as RTN's) and *integer*
zero points, so the result runs on ONNX Runtime's fast MatMulNBits path and as QDQ.

* **k-quant** (llama.cpp's ``make_qkx2_quants`` / ``make_qx_quants``, ONNX Runtime's ``k_quant``): per block, try
  20 step sizes around the range's, round, and fit the scale (and the minimum) to the rounded levels by least
  squares with llama.cpp's importance ``rms(block) + |x|``, never clipping the block's largest magnitude; keep the
  candidate with the lowest weighted error (see :func:`_importance`). With zero points, the fitted minimum is
  rounded to an integer zero point and the scale refitted for it (ONNX Runtime's k_quant rounds without refitting).
* **HQQ** (half-quadratic quantization, Badri & Shaji 2023; ONNX Runtime's ``HQQWeightOnlyQuantizer``): alternate
  rounding with a proximal step on an ``lp`` (p < 1) error, which lets a few outliers keep a large error so the
  rest fit better. ONNX Runtime's HQQ keeps float zero points (a slow MatMulNBits path, and not expressible as
  QDQ); here each step refits the scale (and integer zero point) to the shrunk target by least squares.

Padded rows of a partial last block (``valid`` rows) have no weight in either search. Both run on the arrays they
are given, numpy or a device module's (:func:`onnxprec._array.namespace`).
"""

from __future__ import annotations

import numpy as np

from onnxprec._array import namespace
from onnxprec.quantization.algorithms.rtn import (
    DEFAULT_GRID,
    BlockSearch,
    QuantGrid,
    block_params,
    level_range,
    nonzero_scales,
    quantize_levels,
)

__all__ = ["SEARCHES", "hqq_params", "kquant_params"]


_TINY = np.float32(1e-30)


def _row_mask(blocks: np.ndarray, valid: int | None) -> np.ndarray | None:
    """``[n_blocks, bs, 1]`` 1 for real rows and 0 for the padding of a partial last block (None: no padding)."""
    n_blocks, bs, _ = blocks.shape
    if valid is None or valid >= n_blocks * bs:
        return None
    mask = namespace(blocks).ones((n_blocks * bs, 1), np.float32)
    mask[valid:] = 0
    return mask.reshape(n_blocks, bs, 1)


def _importance(blocks: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """llama.cpp's importance without an imatrix, ``rms(block) + |x|`` (0 on padded rows): large weights count more.

    Plain squared error (uniform importance) shrinks the scales of blocks whose few large weights matter most
    (experiments/design_notes.md, "INT4 methods").
    """
    xp = namespace(blocks)
    count = blocks.shape[1] if mask is None else xp.maximum(mask.sum(axis=1, keepdims=True), 1)
    rms = xp.sqrt(xp.einsum("bkn,bkn->bn", blocks, blocks)[:, None, :] / count)
    weights = rms + xp.abs(blocks)
    return weights if mask is None else weights * mask


def _weighted_error(blocks: np.ndarray, weights: np.ndarray, scales: np.ndarray, zero: np.ndarray | None,
                    bits: int) -> np.ndarray:  # fmt: skip
    xp = namespace(blocks)
    levels = quantize_levels(blocks, scales, zero, bits=bits)
    if zero is not None:
        levels -= zero[:, None, :]
    diff = levels * scales[:, None, :] - blocks
    return xp.einsum("bkn,bkn->bn", weights * diff, diff)


def _fit_symmetric(blocks: np.ndarray, weights: np.ndarray, levels: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """The scale minimising ``sum w (s l - x)^2`` for fixed levels: ``sum w x l / sum w l^2``."""
    xp = namespace(blocks)
    wl = weights * levels
    num = xp.einsum("bkn,bkn->bn", wl, blocks)
    den = xp.einsum("bkn,bkn->bn", wl, levels)
    return xp.where(den > _TINY, num / xp.maximum(den, _TINY), fallback).astype(np.float32)


def _fit_asymmetric(blocks: np.ndarray, weights: np.ndarray, levels: np.ndarray, bits: int,
                    fallback: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Scale and integer zero point for fixed levels: weighted least squares of ``x ~ s l + m`` (``m <= 0``), ``z =
    round(-m / s)``, then the scale refitted for that ``z``."""
    _, qmax = level_range(bits, False)
    xp = namespace(blocks)
    sum_w = weights.sum(axis=1)
    wl = weights * levels
    sum_l = wl.sum(axis=1)
    sum_l2 = xp.einsum("bkn,bkn->bn", wl, levels)
    sum_xl = xp.einsum("bkn,bkn->bn", wl, blocks)
    sum_x = xp.einsum("bkn,bkn->bn", weights, blocks)
    det = sum_w * sum_l2 - sum_l * sum_l
    ok = det > _TINY * xp.maximum(sum_w * sum_l2, _TINY)
    safe = xp.where(ok, det, 1)
    scale = (sum_w * sum_xl - sum_x * sum_l) / safe
    minimum = (sum_l2 * sum_x - sum_l * sum_xl) / safe
    positive_min = minimum > 0  # 0 must stay representable: clamp the minimum, refit the scale alone
    scale = xp.where(positive_min, sum_xl / xp.maximum(sum_l2, _TINY), scale)
    minimum = xp.where(positive_min, 0, minimum)
    ok &= scale > _TINY
    scale = xp.where(ok, scale, fallback[0])
    zero = xp.where(ok, xp.clip(xp.rint(-minimum / xp.where(ok, scale, 1)), 0, qmax), fallback[1])
    shifted = levels - zero[:, None, :]
    ws = weights * shifted
    den = xp.einsum("bkn,bkn->bn", ws, shifted)
    refit = xp.einsum("bkn,bkn->bn", ws, blocks) / xp.maximum(den, _TINY)
    scale = xp.where(ok & (den > _TINY) & (refit > _TINY), refit, scale)
    return nonzero_scales(scale), zero.astype(np.float32)


def kquant_params(
    blocks: np.ndarray, grid: QuantGrid = DEFAULT_GRID, *, valid: int | None = None, steps: int = 20, delta: float = 0.1
) -> tuple[np.ndarray, np.ndarray | None]:
    """k-quant scales (and integer zero points) of ``blocks`` ``[n_blocks, bs, N]``, each ``[n_blocks, N]``.

    Symmetric: step sizes ``v / -(2^(b-1) + delta * i)`` for ``i`` in ``[-steps/2, steps/2]``, ``v`` the block's
    largest-magnitude value (signed: ``v`` lands near level -8; with ``positive_scales``, ``|v| / (2^(b-1) - 1 +
    ...)``), each refitted by least squares to its levels. Asymmetric: inverse steps ``(qmax - 1 + delta * i) /
    (max - min)`` for ``i`` in ``[0, steps]`` (llama.cpp's Q4_K grid). Every candidate is scored by the weighted
    error after requantizing with its fitted parameters; RTN's parameters are the first candidate, so the result
    is never worse than RTN on that weighted error.
    """
    bits, positive_scales = grid.bits, grid.positive_scales
    xp = namespace(blocks)
    mask = _row_mask(blocks, valid)
    weights = _importance(blocks, mask)
    best_s, best_z = block_params(blocks, grid)
    best_err = _weighted_error(blocks, weights, best_s, best_z, bits)
    qmin, qmax = grid.levels
    if grid.symmetric:
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        extreme = xp.where(-lo >= hi, lo, hi)
        # No step below RTN's: the block's largest magnitude stays representable (clipping it costs accuracy).
        if positive_scales:
            floor = xp.maximum(lo / np.float32(qmin), hi / np.float32(qmax))
        else:
            floor = xp.abs(extreme) / np.float32(-qmin)
        for i in range(-(steps // 2), steps // 2 + 1):
            if positive_scales:
                step = nonzero_scales(xp.maximum(-lo, hi) / np.float32(qmax + delta * i))
            else:
                step = nonzero_scales(extreme / np.float32(qmin - delta * i))
            levels = quantize_levels(blocks, step, None, bits=bits)
            scale = nonzero_scales(_fit_symmetric(blocks, weights, levels, step))
            if positive_scales:
                scale = xp.where(scale > 0, scale, step).astype(np.float32)
            scale = (xp.sign(scale) * xp.maximum(xp.abs(scale), floor)).astype(np.float32)
            err = _weighted_error(blocks, weights, scale, None, bits)
            better = err < best_err
            best_err = xp.where(better, err, best_err)
            best_s = xp.where(better, scale, best_s).astype(np.float32)
        return best_s, None
    assert best_z is not None
    lo = xp.minimum(blocks.min(axis=1), 0)
    hi = xp.maximum(blocks.max(axis=1), 0)
    span = hi - lo
    for i in range(steps + 1):
        inverse = np.float32(qmax - 1 + delta * i) / xp.where(span > _TINY, span, 1)
        levels = xp.clip(xp.rint(inverse[:, None, :] * (blocks - lo[:, None, :])), qmin, qmax)
        scale, zero = _fit_asymmetric(blocks, weights, levels, bits, (best_s, best_z))
        err = _weighted_error(blocks, weights, scale, zero, bits)
        tolerance = np.float32(1e-6) * span
        covers = (scale * (qmax - zero) >= hi - tolerance) & (scale * zero >= -lo - tolerance)
        better = (err < best_err) & covers
        best_err = xp.where(better, err, best_err)
        best_s = xp.where(better, scale, best_s).astype(np.float32)
        best_z = xp.where(better, zero, best_z).astype(np.float32)
    return best_s, best_z


def _shrink_lp(x: np.ndarray, beta: float, p: float) -> np.ndarray:
    """The proximal operator of ``|x|^p / beta`` (HQQ's generalized soft threshold)."""
    xp = namespace(x)
    magnitude = xp.abs(x)
    with np.errstate(divide="ignore"):
        threshold = xp.where(magnitude > 0, magnitude ** np.float32(p - 1) / np.float32(beta), 0)
    return xp.sign(x) * xp.maximum(magnitude - threshold, 0)


def hqq_params(
    blocks: np.ndarray,
    grid: QuantGrid = DEFAULT_GRID,
    *,
    valid: int | None = None,
    iterations: int = 20,
    p: float = 0.7,
    beta: float = 10.0,
    kappa: float = 1.01,
) -> tuple[np.ndarray, np.ndarray | None]:
    """HQQ scales (and integer zero points) of ``blocks`` ``[n_blocks, bs, N]``, each ``[n_blocks, N]``.

    Starts from RTN. Each iteration rounds, takes the error ``e = shrink_lp(x - dequantized)`` (HQQ's proximal
    step with ``p``, ``beta``, growing by ``kappa``; ONNX Runtime's defaults), and refits the parameters to the
    target ``x - e`` by least squares. The parameters with the lowest mean absolute error are kept (RTN's
    included), as HQQ does.
    """
    xp = namespace(blocks)
    mask = _row_mask(blocks, valid)
    ones = xp.ones_like(blocks) if mask is None else xp.broadcast_to(mask, blocks.shape).astype(np.float32)
    bits = grid.bits
    scale, zero = block_params(blocks, grid)

    def mean_abs_error(s: np.ndarray, z: np.ndarray | None) -> np.ndarray:
        levels = quantize_levels(blocks, s, z, bits=bits)
        if z is not None:
            levels -= z[:, None, :]
        return xp.einsum("bkn,bkn->bn", ones, xp.abs(levels * s[:, None, :] - blocks))

    best_s, best_z = scale, zero
    best_err = mean_abs_error(scale, zero)
    for _ in range(iterations):
        levels = quantize_levels(blocks, scale, zero, bits=bits)
        shifted = levels if zero is None else levels - zero[:, None, :]
        error = _shrink_lp(blocks - shifted * scale[:, None, :], beta, p)
        target = blocks - error
        if grid.symmetric:
            fitted = nonzero_scales(_fit_symmetric(target, ones, levels, scale))
            scale = xp.where(fitted > 0, fitted, scale).astype(np.float32) if grid.positive_scales else fitted
        else:
            assert zero is not None
            scale, zero = _fit_asymmetric(target, ones, levels, bits, (scale, zero))
        beta *= kappa
        err = mean_abs_error(scale, zero)
        better = err < best_err
        best_err = xp.where(better, err, best_err)
        best_s = xp.where(better, scale, best_s).astype(np.float32)
        if zero is not None and best_z is not None:
            best_z = xp.where(better, zero, best_z).astype(np.float32)
    return best_s, best_z


SEARCHES: dict[str, BlockSearch] = {"kquant": kquant_params, "hqq": hqq_params}
"""The calibration-free block searches by name, for :func:`~onnxprec.quantization.algorithms.rtn.quantize_rtn`'s
``search``."""
