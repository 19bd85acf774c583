"""Activation-aware weight quantization (AWQ): per-input-channel scale search (AWQ-lite) and output-aware clip search.

AWQ rewrites ``X @ W`` as ``(X / s) @ (diag(s) W)``: input channels with large activations get larger weights, hence a
finer relative quantization grid, and the graph divides the input by ``s`` (a ``Mul`` node or a folded parent).
Statistics come from a streaming observer: the mean ``|x|`` per input channel over all calibration tokens, and a
sample of tokens ``x_sample`` ``[T, K]`` to measure output errors on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from onnxprec._array import NUMPY, ArrayBackend, namespace
from onnxprec.quantization.algorithms.rtn import (
    DEFAULT_GRID,
    QuantGrid,
    as_float32_matrix,
    block_params,
    column_chunk,
    dequantize_levels,
    effective_block_size,
    quantize_dequantize,
    quantize_levels,
    ratio_grid,
    to_blocks,
)

__all__ = [
    "DEFAULT_ALPHA_GRID",
    "DEFAULT_AWQ_CLIP_RATIOS",
    "SEARCH_COLUMNS",
    "AwqResult",
    "awq_clip",
    "awq_lite",
    "awq_weight_stat",
    "block_gram",
]

logger = logging.getLogger(__name__)

# Exponents searched by awq_lite: 0, 0.1, ..., 1 (ModelOpt's grid).
DEFAULT_ALPHA_GRID: tuple[float, ...] = tuple(i / 10 for i in range(11))
# Clip ratios searched by awq_clip: 1.0 down to 0.5 in steps of 0.05 (ModelOpt's grid).
DEFAULT_AWQ_CLIP_RATIOS: tuple[float, ...] = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))

SEARCH_COLUMNS = 512
"""Output columns per weight that :func:`awq_lite` scores its candidates on, by default."""

_SCALE_MIN = 1e-4
_SCALE_MAX = 1e4
# Temporaries hold at most about this many float32 elements per chunk of columns.
_CHUNK_ELEMENTS = 1 << 22
# float32 arrays of a chunk's size that awq_lite's loss holds at once (the scaled chunk, blocks, levels, error).
_LOSS_TEMPORARIES = 8


@dataclass(frozen=True)
class AwqResult:
    """The outcome of :func:`awq_lite`.

    Quantize ``diag(scales) @ W`` for every weight and divide their shared input by ``scales``.
    """

    scales: np.ndarray
    """float32 ``[K]``, in ``[1e-4, 1e4]`` before normalisation; all ones when plain RTN won."""
    alpha: float | None
    """The chosen exponent, or None when no alpha beat plain RTN (``scales`` = 1)."""
    loss: float
    """Sum over weights of the normalised output error of the chosen scales (see :func:`awq_lite`)."""
    loss_rtn: float
    """The same loss for plain RTN (``s = 1``); ``loss <= loss_rtn`` always."""
    losses: tuple[float, ...] = ()
    """The loss of every alpha of the grid, in grid order."""


def awq_weight_stat(weights: Sequence[ArrayLike], block_size: int) -> np.ndarray:
    """Per-input-channel weight statistic ``[K]`` of AWQ-lite, float32.

    ``stat[k] = mean over the columns n of all weights of |W[k, n]| / max(|W[j, n]| for j in the K block of k)``:
    the block max is over the **real** block of consecutive rows that contains ``k`` (the last one partial), the
    mean over the concatenated output columns of the weights that share the input. A column whose block is all zeros
    contributes 0.
    """
    if not weights:
        raise ValueError("awq_weight_stat needs at least one weight")
    k = np.asarray(weights[0]).shape[0]
    bs = effective_block_size(k, block_size)
    total = np.zeros(k, dtype=np.float64)
    columns = 0
    for w in weights:
        weight = as_float32_matrix(w)
        if weight.shape[0] != k:
            raise ValueError(f"Weights sharing one input must have the same K, got {weight.shape[0]} and {k}")
        n = weight.shape[1]
        step = column_chunk(k, n, None)
        for start in range(0, n, step):
            blocks = np.abs(to_blocks(weight[:, start : start + step], bs))
            block_max = blocks.max(axis=1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(block_max > 0, blocks / block_max, np.float32(0.0))
            total += ratio.sum(axis=2).reshape(-1)[:k]
        columns += n
    return (total / columns).astype(np.float32)


def _awq_scales(act_absmean: np.ndarray, w_stat: np.ndarray, alpha: float) -> np.ndarray:
    """``s = act^alpha / w_stat^(1-alpha)``, clipped to ``[1e-4, 1e4]`` and divided by ``sqrt(max(s) * min(s))``."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scales = np.power(act_absmean, alpha) / np.power(w_stat, 1.0 - alpha)
    scales = np.clip(np.nan_to_num(scales, nan=1.0, posinf=_SCALE_MAX), _SCALE_MIN, _SCALE_MAX)
    return (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)


class _OutputError:
    """Squared output error ``||x @ E||^2`` of a weight error ``E`` ``[K, c]`` over the token sample ``x``.

    Uses the tokens directly when ``T <= K`` (cost ``T*K*c``), else the Gram matrix ``G = x^T x`` and
    ``sum((G @ E) * E)`` (cost ``K*K*c``), whichever is cheaper.
    """

    def __init__(self, x: np.ndarray) -> None:
        t, k = x.shape
        self.xp = namespace(x)
        self.x: np.ndarray | None = x if t <= k else None
        self.gram: np.ndarray | None = None if t <= k else (x.T @ x).astype(np.float32)

    def __call__(self, e: np.ndarray) -> float:
        if self.x is not None:
            y = self.x @ e
            return float(self.xp.einsum("tn,tn->", y, y, dtype=np.float64))
        assert self.gram is not None
        return float(self.xp.einsum("kn,kn->", self.gram @ e, e, dtype=np.float64))


def _strided_columns(w: np.ndarray, count: int) -> np.ndarray:
    """Every ``ceil(N / count)``-th column of ``w`` (all of them when ``N <= count``)."""
    n = w.shape[1]
    return w if n <= count else np.ascontiguousarray(w[:, :: -(-n // count)])


def awq_lite(
    weights: Sequence[ArrayLike],
    act_absmean: ArrayLike,
    x_sample: ArrayLike,
    block_size: int,
    grid: QuantGrid = DEFAULT_GRID,
    *,
    alpha_grid: Sequence[float] | np.ndarray = DEFAULT_ALPHA_GRID,
    backend: ArrayBackend = NUMPY,
    search_columns: int | None = SEARCH_COLUMNS,
) -> AwqResult:
    """AWQ-lite: one scale vector ``s`` ``[K]`` for all ``weights`` ``[K, N_j]`` that share the input ``x``.

    For every ``alpha`` of ``alpha_grid``, ``s = act_absmean^alpha / w_stat^(1-alpha)`` (:func:`awq_weight_stat`,
    clipped to ``[1e-4, 1e4]``, normalised by ``sqrt(max*min)``), and the loss is the joint normalised output MSE

        ``sum_j ||x W_j - (x / s) Q(diag(s) W_j)||^2 / ||x W_j||^2``

    with ``Q`` block-wise RTN and ``x = x_sample``, summed over at most ``search_columns`` output columns of each
    weight (every ``ceil(N_j / search_columns)``-th; None: all of them). ``s`` scales input channels, so each column
    scores every candidate alike: a strided subset ranks them as the whole weight does, at a fraction of the cost
    (the search's cost grows with ``K * N``, and it is most of AWQ-lite's time on a billion-parameter model).
    Plain RTN (``s = 1``) is scored too and wins ties, so the returned loss is never above ``loss_rtn``.
    Temporaries are bounded: the weights are processed in chunks of columns (``min(T, K) * chunk`` floats), never
    ``[alphas, T, N]`` at once.

    Args:
        weights: the weights that read the same input (q/k/v, gate/up), same K.
        act_absmean: mean ``|x|`` per input channel over all calibration tokens, ``[K]``.
        x_sample: tokens ``[T, K]`` the loss is measured on.
        block_size: as in :func:`~onnxprec.quantization.algorithms.rtn.quantize_rtn`.
        grid: the integer grid of the search's quantizer (use the one of the final quantization).
        alpha_grid: exponents to try.
        backend: where the losses are computed (:func:`onnxprec._array.backend`): the weights and the tokens go
            there once, each alpha's scales then; on a device the chunks of columns are as large as its memory
            limit allows.
        search_columns: output columns per weight the loss is measured on (None: all); the weight statistic
            uses every column.
    """
    if not weights:
        raise ValueError("awq_lite needs at least one weight")
    if search_columns is not None and search_columns < 1:
        raise ValueError(f"search_columns must be positive, got {search_columns}")
    mats = [as_float32_matrix(w, "weight") for w in weights]
    k = mats[0].shape[0]
    act = np.asarray(act_absmean, dtype=np.float32).reshape(-1)
    x = as_float32_matrix(x_sample, "x_sample")
    if act.shape != (k,) or x.shape[1] != k or any(m.shape[0] != k for m in mats):
        raise ValueError(
            f"Shape mismatch: weights K={[m.shape[0] for m in mats]}, act_absmean {act.shape}, x_sample {x.shape}"
        )
    if x.shape[0] == 0:
        raise ValueError("x_sample has no tokens")
    w_stat = awq_weight_stat(mats, block_size)
    if search_columns is not None:
        mats = [_strided_columns(m, search_columns) for m in mats]
    metric = _OutputError(backend.from_host(x))
    step = max(1, backend.chunk_elements(_CHUNK_ELEMENTS, _LOSS_TEMPORARIES) // max(k, min(x.shape)))
    mats = [backend.from_host(m) for m in mats]

    def weight_loss(w: np.ndarray, scales: np.ndarray | None) -> float:
        """||x E||^2 with E = W - Q(diag(s) W) / s, the error in the original basis: x E = xW - (x/s) Q(diag(s)W)."""
        total = 0.0
        for start in range(0, w.shape[1], step):
            chunk = w[:, start : start + step]
            scaled = chunk if scales is None else chunk * scales[:, None]
            dq = quantize_dequantize(scaled, block_size, grid)
            total += metric(chunk - (dq if scales is None else dq / scales[:, None]))
        return total

    norms = []
    for w in mats:
        norm = sum(metric(w[:, start : start + step]) for start in range(0, w.shape[1], step))
        norms.append(norm if norm > 0 else 1.0)

    def loss(scales: np.ndarray | None) -> float:
        return sum(weight_loss(w, scales) / norm for w, norm in zip(mats, norms))

    loss_rtn = loss(None)
    best_loss, best_alpha, best_scales = loss_rtn, None, np.ones(k, dtype=np.float32)
    losses = []
    for alpha in np.asarray(alpha_grid, dtype=np.float64).reshape(-1):
        scales = _awq_scales(act, w_stat, float(alpha))
        value = loss(backend.from_host(scales))
        losses.append(value)
        if value < best_loss:
            best_loss, best_alpha, best_scales = value, float(alpha), scales
    logger.debug("awq_lite: alpha=%s loss=%.6g (rtn %.6g)", best_alpha, best_loss, loss_rtn)
    return AwqResult(best_scales, best_alpha, best_loss, loss_rtn, tuple(losses))


def block_gram(x_sample: ArrayLike, block_size: int) -> np.ndarray:
    """Block-diagonal of ``x^T x``: ``[n_blocks, bs, bs]`` float32, ``G[b] = x[:, blk_b]^T x[:, blk_b]``.

    K is zero-padded to a multiple of the block size (padded rows and columns of the last block are 0).
    """
    x = as_float32_matrix(x_sample, "x_sample")
    t, k = x.shape
    bs = effective_block_size(k, block_size)
    n_blocks = math.ceil(k / bs)
    padded = np.zeros((t, n_blocks * bs), dtype=np.float32)
    padded[:, :k] = x
    xb = padded.reshape(t, n_blocks, bs).transpose(1, 0, 2)  # [nb, T, bs]
    return np.matmul(xb.transpose(0, 2, 1), xb)


def awq_clip(
    w_scaled: ArrayLike,
    x_sample: ArrayLike,
    block_size: int,
    grid: QuantGrid = DEFAULT_GRID,
    *,
    ratios: Sequence[float] | np.ndarray = DEFAULT_AWQ_CLIP_RATIOS,
    chunk_columns: int = 256,
    awq_scales: ArrayLike | None = None,
) -> np.ndarray:
    """Per-(block, output column) clip ratios ``[n_blocks, N]`` minimising the block-partial output error.

    For block ``b`` (rows ``blk``) and column ``n``, ratio ``r`` of ``ratios`` (1.0 is always tried first and wins
    ties) scores ``sum_t (x_t[blk] . (w[blk, n] - Q_r(w[blk, n])))^2 = d^T G_b d`` with ``d`` the block's weight
    error and ``G_b = x[:, blk]^T x[:, blk]`` (:func:`block_gram`). ``Q_r`` is RTN with the block range shrunk by
    ``r`` (see :func:`~onnxprec.quantization.algorithms.rtn.block_params`). Quantize with
    ``quantize_rtn(w_scaled, block_size, clip_ratios=result)``.

    ``w_scaled`` is the weight after AWQ scaling (``diag(s) W``) and ``x_sample`` the matching inputs ``x / s``; or
    pass the unscaled tokens and ``awq_scales=s`` to have them divided here. ``grid`` is the integer grid of the
    final quantization.
    The sum over blocks of the partial errors is never above RTN's; the full output error (which adds cross-block
    terms) usually is lower as well.

    Memory: the Gram takes ``4 * K_pad * bs`` bytes (plus one padded copy of ``x_sample`` while it is built); each
    chunk then holds about five float32 ``[K_pad, chunk_columns]`` temporaries, ``~20 * K_pad * chunk_columns``
    bytes, independent of the number of tokens (``K_pad`` = K rounded up to a multiple of the block size).
    """
    weight = as_float32_matrix(w_scaled, "w_scaled")
    k, n = weight.shape
    bs = effective_block_size(k, block_size)
    x = as_float32_matrix(x_sample, "x_sample")
    if awq_scales is not None:
        x = x / np.asarray(awq_scales, dtype=np.float32).reshape(1, -1)
    if x.shape[1] != k:
        raise ValueError(f"x_sample has K={x.shape[1]}, w_scaled has K={k}")
    gram = block_gram(x, block_size)
    candidates = ratio_grid(ratios)
    n_blocks = math.ceil(k / bs)
    result = np.empty((n_blocks, n), dtype=np.float32)
    step = column_chunk(k, n, chunk_columns)
    for start in range(0, n, step):
        blocks = to_blocks(weight[:, start : start + step], bs)  # [nb, bs, c]
        best_err = np.full((n_blocks, blocks.shape[2]), np.inf, dtype=np.float32)
        best = np.ones_like(best_err)
        for ratio in candidates:
            scales, zero_points = block_params(blocks, grid, ratios=ratio)
            levels = quantize_levels(blocks, scales, zero_points, bits=grid.bits)
            diff = blocks - dequantize_levels(levels, scales, zero_points)
            err = np.einsum("bkn,bkn->bn", np.matmul(gram, diff), diff)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best = np.where(better, ratio, best)
        result[:, start : start + step] = best
    return result
