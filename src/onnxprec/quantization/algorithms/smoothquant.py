"""Per-channel decisions for INT8 layers whose activations are quantized dynamically: outlier split and SmoothQuant.

Both act on one *input group*: the layers (MatMul/Gemm with weights ``W_i [K, N_i]``) that read the same activation
``x [T, K]``. They are chosen on a sample of the calibration tokens by simulating what ONNX Runtime computes
(:func:`~onnxprec.quantization.algorithms.int8.fake_dynamic`, each row quantized with its own run's range), and
scored by the relative output error summed over the group's layers.

- **Outlier split** (LLM.int8()'s mixed-precision decomposition, with the channels fixed from calibration data):
  the few input channels with the largest ``max|x_j| * max|W[j, :]|`` are taken out of the quantized product and
  computed in float: ``y = Q(x * m) @ Q(W * m) + x[:, J] @ W[J, :]`` (``m`` zero on ``J``). One outlier channel
  sets the range of a per-tensor dynamic quantization for every other channel, and one outlier weight sets its
  column's scale; the float part costs ``|J| / K`` of the layer (at most ``K / 16`` channels). A larger count in
  :data:`SPLIT_CANDIDATES` is taken only when it lowers the error by :data:`MIN_SPLIT_GAIN`.
- **SmoothQuant** (Xiao et al., 2023): ``x / s`` and ``W * s`` with ``s_j = max|x_j|^a / max|W[j, :]|^(1-a)``,
  ``a`` searched per group on a grid. The channel maxima come from one half of the sampled runs and the error from
  the other (two folds), so the chosen ``a`` is the one that generalizes; a group keeps ``s = 1`` unless smoothing
  lowers that error by :data:`MIN_GAIN`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxprec.quantization.algorithms.int8 import dequantize_weight, fake_dynamic, quantize_weight

__all__ = [
    "DEFAULT_ALPHAS",
    "MIN_GAIN",
    "MIN_SPLIT_GAIN",
    "SPLIT_CANDIDATES",
    "ChannelDecision",
    "RunSample",
    "decide_channels",
    "smooth_scales",
]

logger = logging.getLogger(__name__)

DEFAULT_ALPHAS: tuple[float, ...] = (0.2, 0.35, 0.5, 0.65, 0.8)
SPLIT_CANDIDATES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)
MIN_GAIN = 0.1
"""Smoothing is kept only when it lowers the held-out error by this fraction."""
MIN_SPLIT_GAIN = 0.9
"""A larger split is kept only when it lowers the error tenfold: each split costs three small float ops per layer
(Gather, MatMul, Add), which on few threads cost more than their multiply-adds (experiments/design_notes.md)."""
_SCALE_LIMIT = 1e4


@dataclass
class RunSample:
    """Token rows of one activation and the per-channel extremes of the runs they came from."""

    rows: np.ndarray
    """``[T, K]`` float32."""
    run_of_row: np.ndarray
    """``[T]`` index into ``mins``/``maxs``."""
    mins: np.ndarray
    """``[R, K]`` per-channel minimum of each run."""
    maxs: np.ndarray
    """``[R, K]`` per-channel maximum of each run."""

    def quantized(self, factors: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """``fake_dynamic(x * factors)`` (factors ``>= 0``), each row with its run's range of ``x * factors``."""
        select = slice(None) if rows is None else rows
        lo = (self.mins * factors).min(axis=1)
        hi = (self.maxs * factors).max(axis=1)
        runs = self.run_of_row[select]
        return fake_dynamic(self.rows[select] * factors, lo[runs], hi[runs])


@dataclass
class ChannelDecision:
    """What one input group does before its quantized product."""

    split: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Input channels computed in float (sorted)."""
    scales: np.ndarray | None = None
    """SmoothQuant ``s`` (``x / s``, ``W * s``), or None."""
    alpha: float | None = None
    errors: dict[str, float] = field(default_factory=dict)
    """Relative output error on the sample: ``plain``, ``split``, ``smoothed`` (the kept one is ``final``)."""

    def factors(self, k: int) -> np.ndarray:
        """``[K]`` what ``x`` is multiplied by before quantization: 0 on split channels, ``1 / s`` elsewhere."""
        factors = np.ones(k) if self.scales is None else 1.0 / self.scales
        factors = factors.copy()
        factors[self.split] = 0.0
        return factors

    def weight_rows(self, k: int) -> np.ndarray:
        """``[K]`` what the rows of each quantized weight are multiplied by: 0 on split channels, ``s`` elsewhere."""
        rows = np.ones(k) if self.scales is None else self.scales.copy()
        rows = rows.copy()
        rows[self.split] = 0.0
        return rows


def smooth_scales(absmax_x: np.ndarray, absmax_w: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)``, 1 where a channel is all zeros, clipped."""
    x = np.asarray(absmax_x, dtype=np.float64)
    w = np.asarray(absmax_w, dtype=np.float64)
    live = (x > 0) & (w > 0)
    scales = np.ones_like(x)
    scales[live] = x[live] ** alpha / w[live] ** (1 - alpha)
    return np.clip(scales, 1 / _SCALE_LIMIT, _SCALE_LIMIT)


def _group_error(
    sample: RunSample, weights: Sequence[np.ndarray], refs: Sequence[np.ndarray], factors: np.ndarray,
    rows_scale: np.ndarray, split: np.ndarray, rows: np.ndarray | None = None,
) -> float:  # fmt: skip
    """Mean relative squared output error of the group's layers with this transform (float32 products)."""
    select = slice(None) if rows is None else rows
    xq = sample.quantized(factors, rows).astype(np.float32)
    x = sample.rows[select]
    total = 0.0
    for w, ref in zip(weights, refs):
        q, s = quantize_weight(w * rows_scale.astype(np.float32)[:, None], axis=1)
        y = xq @ dequantize_weight(q, s, axis=1)
        if split.size:
            y += x[:, split] @ w[split]
        reference = ref[select]
        den = float(np.sum(np.square(reference, dtype=np.float64)))
        total += float(np.sum(np.square(reference - y, dtype=np.float64))) / den if den > 0 else 0.0
    return total / max(len(weights), 1)


def decide_channels(
    sample: RunSample,
    weights: Sequence[np.ndarray],
    absmax_x: np.ndarray,
    *,
    split: bool = True,
    max_split: int = 32,
    smooth: bool = True,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> ChannelDecision:
    """The outlier split and SmoothQuant scales of one input group (see the module docstring).

    Args:
        sample: The group's input rows with their runs' extremes.
        weights: The ``[K, N_i]`` float weights of the group's layers.
        absmax_x: ``[K]`` max ``|x_j|`` over all calibration data (the final scales use it).
        split: Try splitting outlier channels.
        max_split: At most this many channels (and at most ``K / 16``).
        smooth: Try SmoothQuant.
        alphas: The SmoothQuant exponents tried.
    """
    k = sample.rows.shape[1]
    ws = [np.asarray(w, dtype=np.float32) for w in weights]
    x = sample.rows.astype(np.float32, copy=False)
    refs = [x @ w for w in ws]
    absmax_w = np.max([np.abs(w).max(axis=1) for w in ws], axis=0)
    ones = np.ones(k)
    decision = ChannelDecision()
    none = np.zeros(0, dtype=np.int64)
    plain = _group_error(sample, ws, refs, ones, ones, none)
    decision.errors["plain"] = plain
    best_error, best_split = plain, none
    if split:
        order = np.argsort(-(np.asarray(absmax_x, dtype=np.float64) * absmax_w), kind="stable")
        for count in SPLIT_CANDIDATES[1:]:
            if count > min(max_split, k // 16):
                break
            chosen = np.sort(order[:count])
            mask = ones.copy()
            mask[chosen] = 0.0
            error = _group_error(sample, ws, refs, mask, mask, chosen)
            if error < best_error * (1 - MIN_SPLIT_GAIN):
                best_error, best_split = error, chosen
        decision.split = best_split
        decision.errors["split"] = best_error
    if smooth:
        alpha, error = _search_alpha(sample, ws, refs, best_split, alphas, absmax_w)
        decision.errors["smoothed"] = error
        if alpha is not None:
            mask = ones.copy()
            mask[best_split] = 0.0
            absmax = np.asarray(absmax_x, dtype=np.float64) * mask
            decision.scales, decision.alpha = smooth_scales(absmax, absmax_w, alpha), alpha
    decision.errors["final"] = _group_error(
        sample, ws, refs, decision.factors(k), decision.weight_rows(k), decision.split
    )
    return decision


def _search_alpha(
    sample: RunSample,
    weights: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
    split: np.ndarray,
    alphas: Sequence[float],
    absmax_w: np.ndarray,
) -> tuple[float | None, float]:
    """The exponent with the least two-fold error (channel maxima from one half of the runs, error on the other),
    or None when no exponent beats no smoothing by :data:`MIN_GAIN`; and that error."""
    k = sample.rows.shape[1]
    mask = np.ones(k)
    mask[split] = 0.0
    runs = sample.run_of_row
    folds = [np.flatnonzero(runs % 2 == parity) for parity in (0, 1)]
    if min(len(f) for f in folds) == 0:  # one run: halves of its rows
        half = len(runs) // 2
        folds = [np.arange(half), np.arange(half, len(runs))]
    if min(len(f) for f in folds) == 0:
        return None, math.inf

    def error(alpha: float | None) -> float:
        total = 0.0
        for fit, held in ((folds[0], folds[1]), (folds[1], folds[0])):
            if alpha is None:
                scales = np.ones(k)
            else:
                absmax_fit = np.abs(sample.rows[fit]).max(axis=0).astype(np.float64) * mask
                scales = smooth_scales(absmax_fit, absmax_w, alpha)
            total += _group_error(sample, weights, refs, mask / scales, mask * scales, split, held)
        return total / 2

    base = error(None)
    best_alpha, best = None, base
    for alpha in alphas:
        value = error(alpha)
        if value < best:
            best_alpha, best = alpha, value
    if best_alpha is None or best > base * (1 - MIN_GAIN):
        return None, base
    return best_alpha, best
