"""Activation ranges for static INT8 quantization, from a streamed histogram: max, percentile, entropy and MSE.

A :class:`Histogram` holds the counts of one tensor's values over ``[lo, hi]`` in a fixed number of bins, with the
exact minimum and maximum seen. Batches are added one at a time; when a batch falls outside the current range the
counts are re-binned onto a wider range (each old bin's count moves to the new bin holding its centre), so memory
stays ``bins`` counts per tensor whatever the number of batches, and no ratio of ranges can fail (ONNX Runtime's
entropy calibrator raises "Too many bins for data range" when a later batch is much wider than the first).

:func:`calibrated_range` turns a histogram into the ``[lo, hi]`` the quantizer covers:

- ``max``: the extremes seen;
- ``percentile``: the ``p``-th percentile of ``|x|`` on each side that has values (ONNX Runtime: 99.999);
- ``entropy``: TensorRT's KL-divergence threshold on ``|x|`` (the threshold whose 128 or 255 quantized levels keep
  the distribution closest to the float one), with the bin of exact zeros left out (a post-ReLU tensor that is
  mostly zeros would otherwise get a threshold that clips most of its other values);
- ``mse``: the clipping of the range that minimizes the expected squared quantization error of the histogram.

:func:`quantization_noise` is the relative error a range leaves on the histogram's values.
:func:`scale_zero_point` gives the INT8 scale and zero point of a range: asymmetric UINT8 (ONNX Runtime's CPU
kernels) or symmetric INT8 (TensorRT). Every range holds 0, so zero is exact (padding, ReLU).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnxprec.errors import InvalidArgumentError
from onnxprec.observers import DEFAULT_BINS, Histogram

__all__ = [
    "DEFAULT_BINS",
    "DEFAULT_PERCENTILE",
    "RANGE_METHODS",
    "Histogram",
    "calibrated_range",
    "quantization_noise",
    "scale_zero_point",
]

DEFAULT_PERCENTILE = 99.999
RANGE_METHODS = ("max", "entropy", "percentile", "mse")
_TINY = 1e-30  # as observers._TINY


def calibrated_range(
    hist: Histogram, method: str = "max", *, symmetric: bool = False, percentile: float = DEFAULT_PERCENTILE
) -> tuple[float, float]:
    """The ``[lo, hi]`` (with ``lo <= 0 <= hi``) that a quantizer of ``hist``'s tensor should cover.

    Args:
        hist: The tensor's histogram.
        method: ``max``, ``percentile``, ``entropy`` or ``mse``.
        symmetric: The levels are symmetric around 0 (INT8 with zero point 0): the methods clip ``|x|``.
        percentile: The percentile of ``|x|`` kept by ``percentile`` (e.g. 99.999).

    Raises:
        InvalidArgumentError: An unknown method or a percentile outside (0, 100].
    """
    if method not in RANGE_METHODS:
        raise InvalidArgumentError(f"Unknown calibration method '{method}': use {', '.join(RANGE_METHODS)}.")
    if not 0 < percentile <= 100:
        raise InvalidArgumentError(f"percentile must be in (0, 100], got {percentile!r}.")
    if not hist.counts.size or hist.total <= 0:
        return 0.0, 0.0
    lo, hi = min(hist.min, 0.0), max(hist.max, 0.0)
    if symmetric:
        lo, hi = -max(-lo, hi), max(-lo, hi)
    if method == "max" or hi - lo <= _TINY:
        return lo, hi
    if method == "percentile":
        return _percentile(hist, percentile, lo, hi)
    if method == "entropy":
        threshold = _entropy_threshold(hist, levels=127 if symmetric or hist.min < 0 else 255)
        return max(lo, -threshold), min(hi, threshold)
    return _mse(hist, lo, hi, symmetric)


def _magnitudes(hist: Histogram) -> tuple[np.ndarray, np.ndarray]:
    """``|x|`` as a histogram: counts over ``bins`` bins of ``[0, max |x|]``."""
    top = max(abs(hist.lo), abs(hist.hi))
    counts, edges = np.histogram(np.abs(hist.centers), bins=hist.bins, range=(0.0, top), weights=hist.counts)
    return counts, edges


def _percentile(hist: Histogram, percentile: float, lo: float, hi: float) -> tuple[float, float]:
    counts, edges = _magnitudes(hist)
    cumulative = np.cumsum(counts)
    index = int(np.searchsorted(cumulative, cumulative[-1] * percentile / 100.0))
    threshold = float(edges[min(index + 1, len(edges) - 1)])
    return max(lo, -threshold), min(hi, threshold)


def _entropy_threshold(hist: Histogram, levels: int) -> float:
    """TensorRT's entropy calibration on ``|x|``: the clip threshold minimizing KL(P || Q) over ``levels`` bins."""
    counts, edges = _magnitudes(hist)
    # Exact zeros (ReLU, padding) are represented whatever the threshold: leave them out, or a tensor that is
    # mostly zeros gets a threshold that clips most of its non-zero values.
    counts = counts.copy()
    counts[0] = 0.0
    bins = len(counts)
    if bins <= levels or counts.sum() <= 0:
        return float(edges[-1])
    best_kl, best = math.inf, bins
    starts = range(levels, bins + 1, max(1, (bins - levels) // 256))
    for stop in starts:
        reference = counts[:stop].copy()
        reference[stop - 1] += counts[stop:].sum()  # outliers clipped into the last bin
        if reference.sum() <= 0:
            continue
        # Merge the stop bins into ``levels`` quantized bins, then spread each back over its non-empty bins.
        groups = np.minimum((np.arange(stop) * levels) // stop, levels - 1)
        nonzero = counts[:stop] > 0
        merged = np.bincount(groups, weights=counts[:stop], minlength=levels)
        filled = np.bincount(groups, weights=nonzero.astype(np.float64), minlength=levels)
        spread = np.where(nonzero, merged[groups] / np.maximum(filled[groups], 1), 0.0)
        kl = _kl(reference, spread)
        if kl < best_kl:
            best_kl, best = kl, stop
    return float(edges[best])


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q_total = q.sum()
    if q_total <= 0:
        return math.inf
    q = q / q_total
    mask = p > 0
    if np.any(q[mask] <= 0):
        # A value that P holds and Q cannot represent: smooth Q instead of an infinite divergence.
        q = q + 1e-4 * (p > 0)
        q = q / q.sum()
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def _squared_error(centers: np.ndarray, counts: np.ndarray, lo: float, hi: float, symmetric: bool) -> float:
    """The summed squared error of quantizing values ``centers`` (each ``counts`` times) over ``[lo, hi]``."""
    scale, zero_point = scale_zero_point(lo, hi, symmetric=symmetric)
    qmin, qmax = (-127, 127) if symmetric else (0, 255)
    q = np.clip(np.round(centers / scale) + zero_point, qmin, qmax)
    return float(np.sum(counts * ((q - zero_point) * scale - centers) ** 2))


def _mse(hist: Histogram, lo: float, hi: float, symmetric: bool) -> tuple[float, float]:
    """The shrink of ``[lo, hi]`` (one ratio for both ends) with the least expected squared error."""
    centers, counts = hist.centers, hist.counts
    keep = counts > 0
    centers, counts = centers[keep], counts[keep]
    best_error, best = math.inf, (lo, hi)
    for ratio in np.linspace(1.0, 0.2, 81):
        a, b = lo * ratio, hi * ratio
        error = _squared_error(centers, counts, a, b, symmetric)
        if error < best_error * (1 - 1e-9):
            best_error, best = error, (a, b)
    return best


def activation_range(
    hist: Histogram, activation: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, *, symmetric: bool = False
) -> tuple[float, float]:
    """The ``[lo, hi]`` within the given one whose quantization changes ``activation(x)`` least (expected squared
    error after the activation): the upper end shrunk first, then the lower end on its own. A saturating activation
    (SiLU, HardSwish, Sigmoid) lets the flat side shrink far, giving its levels to the steep side."""
    centers, counts = hist.centers, hist.counts
    keep = counts > 0
    centers, counts = centers[keep], counts[keep]
    target = activation(centers)

    def error(a: float, b: float) -> float:
        scale, zero_point = scale_zero_point(a, b, symmetric=symmetric)
        qmin, qmax = (-127, 127) if symmetric else (0, 255)
        q = (np.clip(np.round(centers / scale) + zero_point, qmin, qmax) - zero_point) * scale
        return float(np.sum(counts * (activation(q) - target) ** 2))

    best_error, best = error(lo, hi), (lo, hi)
    for ratio in np.linspace(1.0, 0.2, 81):
        candidate = (lo * ratio, hi * ratio) if symmetric else (lo, hi * ratio)
        value = error(*candidate)
        if value < best_error * (1 - 1e-9):
            best_error, best = value, candidate
    if not symmetric:
        top = best[1]
        for ratio in np.linspace(1.0, 0.02, 99):
            value = error(lo * ratio, top)
            if value < best_error * (1 - 1e-9):
                best_error, best = value, (lo * ratio, top)
    return best


def quantization_noise(hist: Histogram, lo: float, hi: float, *, symmetric: bool = False) -> float:
    """The relative RMS error ``sqrt(E[(Q(x) - x)^2] / E[x^2])`` of quantizing ``hist``'s tensor over ``[lo, hi]``
    (0 for a tensor of zeros).

    A heavy-tailed tensor (a few values far above the typical one, as after an unbounded activation) spends most
    of its 256 levels on the tail and keeps few for the bulk: its noise is high whatever the clipping method.
    """
    centers, counts = hist.centers, hist.counts
    power = float(np.sum(counts * centers**2))
    if power <= _TINY or hi - lo <= _TINY:
        return 0.0
    return math.sqrt(_squared_error(centers, counts, lo, hi, symmetric) / power)


def scale_zero_point(lo: float, hi: float, *, symmetric: bool) -> tuple[float, int]:
    """The INT8 scale and zero point covering ``[lo, hi]``.

    Symmetric: INT8 levels -127..127, zero point 0, ``scale = max(|lo|, |hi|) / 127``. Asymmetric: UINT8 levels
    0..255, ``scale = (hi - lo) / 255`` and the zero point that puts 0 exactly on a level. A range of zero width
    gets scale 1 (every value is 0).
    """
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        top = max(-lo, hi)
        return (top / 127.0 if top > _TINY else 1.0), 0
    if hi - lo <= _TINY:
        return 1.0, 0
    scale = (hi - lo) / 255.0
    zero_point = int(np.clip(round(-lo / scale), 0, 255))
    return scale, zero_point
