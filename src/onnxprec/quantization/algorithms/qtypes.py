"""The element types of a QuantizeLinear/DequantizeLinear pair, and their numerics in numpy.

A :class:`QType` is one grid: INT8 (symmetric, levels -127..127), UINT8 (asymmetric, 0..255, with a zero point),
INT16 (symmetric, -32767..32767), UINT16 (asymmetric, 0..65535) or FP8 E4M3FN (symmetric, the 256 FP8 values up to
448, no zero point other than 0). Each gives the scale and zero point covering a calibrated range, the levels of a
tensor (what ``QuantizeLinear`` computes, saturating, as ONNX specifies it) and their dequantized values.

The symmetric integer grids leave out the most negative level (-128, -32768), so that a negated scale is exact; a
``QuantizeLinear`` at run time saturates there, one level further, for values below the calibrated range.
FP8 levels are rounded to nearest even by ``ml_dtypes`` after clipping to +-448 (ONNX's ``saturate=1``):
``QuantizeLinear(x, s) = float8e4m3fn(clip(x / s, -448, 448))``, which ONNX Runtime's CPU kernel and the reference
implementation compute bit for bit (``qtypes_test``).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from onnxprec.errors import InvalidArgumentError

__all__ = [
    "FP8",
    "FP8_ACTIVATION",
    "FP8_ACTIVATION_HEADROOM",
    "FP8_ALIGNMENTS",
    "INT8",
    "INT16",
    "QTYPES",
    "UINT8",
    "UINT16",
    "QType",
    "qtype",
]

_TINY = 1e-30  # as ranges._TINY


@dataclass(frozen=True)
class QType:
    """One Q/DQ element type.

    Attributes:
        name: ``int8``, ``uint8``, ``int16``, ``uint16`` or ``fp8``.
        dtype: The numpy (or ``ml_dtypes``) type of the levels and the zero point.
        qmin: The lowest level used (symmetric INT8 and INT16 leave out the most negative one).
        qmax: The highest level.
        symmetric: The zero point is always 0.
        headroom: A symmetric range's largest magnitude goes on ``qmax / headroom``, leaving levels above it for
            values beyond the calibrated range (FP8 activations: :data:`FP8_ACTIVATION_HEADROOM`); 1 for the others.
    """

    name: str
    dtype: np.dtype
    qmin: float
    qmax: float
    symmetric: bool
    headroom: float = 1.0

    @property
    def is_float(self) -> bool:
        """FP8: levels are floating-point values, not integers."""
        return self.name == "fp8"

    @property
    def bits(self) -> int:
        return self.dtype.itemsize * 8

    def scale_zero_point(self, lo: float, hi: float) -> tuple[float, int]:
        """The scale and zero point whose levels cover ``[lo, hi]`` (widened to hold 0, so zero is exact).

        Symmetric: ``scale = max(|lo|, |hi|) * headroom / qmax``, zero point 0. Asymmetric: ``scale = (hi - lo) /
        (qmax - qmin)`` and the zero point that puts 0 on a level. A range of zero width gets scale 1.
        """
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
        if self.symmetric:
            top = max(-lo, hi)
            return (top * self.headroom / self.qmax if top > _TINY else 1.0), 0
        if hi - lo <= _TINY:
            return 1.0, int(self.qmin)
        scale = (hi - lo) / (self.qmax - self.qmin)
        zero_point = int(np.clip(round(self.qmin - lo / scale), self.qmin, self.qmax))
        return scale, zero_point

    def quantize(self, x: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | float = 0) -> np.ndarray:
        """``QuantizeLinear``: the levels of ``x`` (``scale`` and ``zero_point`` broadcast against it)."""
        ratio = np.asarray(x, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
        if self.is_float:
            return np.clip(ratio, self.qmin, self.qmax).astype(self.dtype)
        return np.clip(np.rint(ratio) + np.asarray(zero_point, dtype=np.float32), self.qmin, self.qmax).astype(
            self.dtype
        )

    def dequantize(
        self, levels: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | float = 0
    ) -> np.ndarray:
        """``DequantizeLinear`` of ``levels`` (float32)."""
        shifted = levels.astype(np.float32) - np.asarray(zero_point, dtype=np.float32)
        return (shifted * np.asarray(scale, dtype=np.float32)).astype(np.float32)

    def fake(self, x: np.ndarray, scale: float, zero_point: int = 0) -> np.ndarray:
        """``DequantizeLinear(QuantizeLinear(x))`` with one scale and zero point; FP8's levels are rounded in float32
        (:func:`_round_e4m3fn`, the values ``ml_dtypes`` gives, without converting to FP8 and back; a NaN keeps its
        payload where the round trip gives the canonical NaN)."""
        levels = np.asarray(x, dtype=np.float32) / np.asarray(scale, dtype=np.float32) if self.is_float else None
        if levels is None or levels.ndim == 0:
            return self.dequantize(self.quantize(x, scale, zero_point), scale, zero_point)
        levels = _round_e4m3fn(np.clip(levels, self.qmin, self.qmax, out=levels))
        if np.any(zero_point):  # subtracting a zero point of 0 changes no value
            levels = levels - np.asarray(zero_point, dtype=np.float32)  # a zero point may broadcast wider
        levels *= np.asarray(scale, dtype=np.float32)
        return levels

    def quantize_weight(self, w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel symmetric levels along ``axis`` (the output channels): ``(levels, scales float32)``, each
        channel's largest magnitude on ``qmax`` (FP8: on ``qmax / f``, with ``f`` the one of :data:`FP8_ALIGNMENTS`
        that rounds the channel with the least squared error); a channel of zeros gets scale 1."""
        if not self.symmetric:
            raise InvalidArgumentError(f"{self.name} weights are not supported: weights are symmetric (int8, fp8).")
        weight = np.asarray(w, dtype=np.float32)
        axis = axis % weight.ndim
        others = tuple(i for i in range(weight.ndim) if i != axis)
        top = np.abs(weight).max(axis=others) if others else np.abs(weight)
        scales = (top / self.qmax).astype(np.float32)
        scales[scales <= 0] = 1.0
        shape = [1] * weight.ndim
        shape[axis] = -1
        if self.is_float and others:
            scales = self._aligned(weight, scales, shape, others)
        return self.quantize(weight, scales.reshape(shape)), scales

    def _aligned(self, weight: np.ndarray, scales: np.ndarray, shape: list[int], others: tuple[int, ...]) -> np.ndarray:
        """Each channel's scale times the factor of :data:`FP8_ALIGNMENTS` whose levels round it with the least
        squared error (ties: the smallest factor)."""
        best, errors = scales, None
        for factor in FP8_ALIGNMENTS:
            candidate = (scales * np.float32(factor)).astype(np.float32)
            error = self.fake(weight, candidate.reshape(shape))
            error -= weight
            error = np.square(error, out=error).sum(axis=others)
            if errors is None:
                best, errors = candidate, error
                continue
            better = error < errors
            best, errors = np.where(better, candidate, best), np.where(better, error, errors)
        return best.astype(np.float32)

    def zero(self, zero_point: int = 0) -> np.ndarray:
        """The zero point as a 0-d array of :attr:`dtype`."""
        return np.array(zero_point, dtype=np.float32).astype(self.dtype)


def _round_e4m3fn(values: np.ndarray) -> np.ndarray:
    """``values`` (float32, within +-448) rounded to the nearest FP8 E4M3FN value, ties to even, in place: each
    value scaled by a power of 2 to its binade's level spacing (``2**(e - 4)``, or ``2**-9`` below the normal
    range), rounded to an integer, scaled back; every step exact but the rounding, so the result is the float32
    value of ``values.astype(float8_e4m3fn)``."""
    _, exponent = np.frexp(values)
    np.maximum(exponent, -5, out=exponent)
    np.subtract(4, exponent, out=exponent)
    np.ldexp(values, exponent, out=values)
    np.rint(values, out=values)
    np.negative(exponent, out=exponent)
    return np.ldexp(values, exponent, out=values)


INT8 = QType("int8", np.dtype(np.int8), -127, 127, True)
UINT8 = QType("uint8", np.dtype(np.uint8), 0, 255, False)
INT16 = QType("int16", np.dtype(np.int16), -32767, 32767, True)
UINT16 = QType("uint16", np.dtype(np.uint16), 0, 65535, False)
FP8 = QType("fp8", np.dtype(ml_dtypes.float8_e4m3fn), -448.0, 448.0, True)
FP8_ALIGNMENTS = tuple(2.0 ** (k / 16) for k in range(16))
"""Factors an FP8 weight channel's scale is tried at (``[1, 2)``: the largest magnitude stays representable, nothing
is clipped): E4M3's levels are 8 to a binade, so where a channel's values fall between them depends on the scale,
and the best of 16 alignments rounds the channel with less error than the largest magnitude on 448 alone
(measured: docs/tools/fp8.md, "Weight alignment")."""
FP8_ACTIVATION_HEADROOM = 16.0
"""FP8 activations' calibrated maximum goes on 448 / 16 = 28: inputs up to 16 times the largest seen in calibration
pass unclipped. A power of 2, so every value in E4M3's normal range rounds to the same relative level as without
the room; only the 4 lowest of its 15 binades (below 1/1792 of the maximum) become coarser subnormals. ModelOpt's
int8-to-fp8 conversion leaves 12.4 times (``scale = amax * 448 / 127**2``); the held-out results that set it:
docs/tools/fp8.md, "Activation headroom"."""
FP8_ACTIVATION = QType("fp8", FP8.dtype, FP8.qmin, FP8.qmax, True, FP8_ACTIVATION_HEADROOM)
QTYPES = {q.name: q for q in (INT8, UINT8, INT16, UINT16, FP8)}


def qtype(name: str) -> QType:
    """The :class:`QType` named ``name``.

    Raises:
        InvalidArgumentError: An unknown name.
    """
    found = QTYPES.get(name)
    if found is None:
        raise InvalidArgumentError(f"Unknown quantization type {name!r}: use {', '.join(QTYPES)}.")
    return found
