"""Round-to-nearest (RTN) block-wise quantization of MatMul weights, with an optional per-block clip search.

Conventions shared by every algorithm of this package:

* The weight is the ``B`` input of an ONNX ``MatMul``: ``Y = X @ W`` with ``W`` of shape ``[K, N]`` (``K`` input
  channels, the reduction axis; ``N`` output channels).
* Blocks run **along K**: block ``b`` of column ``n`` is ``W[b*bs : (b+1)*bs, n]``. ``K`` need not be a multiple of
  the block size; the last block is then partial, as in ONNX ``DequantizeLinear`` with ``axis=0, block_size=bs``
  (scales of shape ``[ceil(K/bs), N]``). ``block_size=-1`` means per-channel: one block spanning all of ``K``.
* Every block has one float32 scale ``s > 0`` and, when asymmetric, one integer zero point ``z``; a quantized value
  ``q`` stands for ``(q - z) * s`` (``z = 0`` when symmetric).
* Math is float32 whatever the input dtype (float16, bfloat16, float32, float64).
* The block functions run on the arrays they are given, numpy or a device module's (:func:`onnxprec._array.namespace`);
  :func:`quantize_rtn` moves each chunk of columns to its ``backend`` and the results back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from onnxprec._array import NUMPY, ArrayBackend, namespace
from onnxprec.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_CLIP_RATIOS",
    "DEFAULT_GRID",
    "BlockSearch",
    "QuantGrid",
    "QuantizedWeight",
    "as_float32_matrix",
    "block_params",
    "column_chunk",
    "dequantize_levels",
    "effective_block_size",
    "level_range",
    "nonzero_scales",
    "quantize_dequantize",
    "quantize_int8_per_channel",
    "quantize_levels",
    "quantize_rtn",
    "ratio_grid",
    "reconstruction_error",
    "to_blocks",
]

logger = logging.getLogger(__name__)

BlockSearch = Callable[..., tuple[np.ndarray, "np.ndarray | None"]]
"""``search(blocks [n_blocks, bs, N], grid: QuantGrid, *, valid) -> (scales, zero points)``."""

# Shrink ratios of the block range tried by ``quantize_rtn(clip_search=True)``: 1.0 down to 0.7 in steps of 0.025.
# With 16 levels the MSE-optimal clip of a Gaussian block of 32-128 values lies around 0.8-0.95; 0.7 leaves margin for
# heavy-tailed blocks. 1.0 comes first so a tie keeps the unclipped range (never worse than plain RTN).
DEFAULT_CLIP_RATIOS: tuple[float, ...] = tuple(round(1.0 - 0.025 * i, 3) for i in range(13))

# Columns are processed in chunks of at most this many weight elements (K * columns) to bound temporaries.
_CHUNK_ELEMENTS = 1 << 22
# float32 arrays of a chunk's size that RTN and its searches hold at once (blocks, levels, error terms...).
_CHUNK_TEMPORARIES = 12


def level_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """The integer range of ``bits``-bit levels: ``[-2^(b-1), 2^(b-1)-1]`` if symmetric, else ``[0, 2^b-1]``."""
    if bits not in (4, 8):
        raise InvalidArgumentError(f"Unsupported bit width {bits}: use 4 or 8.")
    if symmetric:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


@dataclass(frozen=True)
class QuantGrid:
    """The integer grid a block is quantized to: the three settings every block-parameter function takes together."""

    bits: int = 4
    """4 or 8."""
    symmetric: bool = True
    """Signed levels without zero points; else unsigned levels with integer zero points."""
    positive_scales: bool = False
    """Symmetric scales always positive (for runtimes that reject negative scales); by default a block may get a
    signed scale (see :func:`block_params`)."""

    @property
    def levels(self) -> tuple[int, int]:
        """``(qmin, qmax)``: see :func:`level_range`."""
        return level_range(self.bits, self.symmetric)


DEFAULT_GRID = QuantGrid()
"""Signed 4-bit levels ``[-8, 7]`` without zero points; a block may get a signed scale."""


@dataclass
class QuantizedWeight:
    """A block-wise quantized ``[K, N]`` weight.

    ``W[k, n] ~= (q[k, n] - zero_points[k // block_size, n]) * scales[k // block_size, n]`` (zero point 0 if None).
    """

    q: np.ndarray
    """int8 ``[K, N]`` in ``[-8, 7]`` (symmetric) or uint8 in ``[0, 15]`` (asymmetric); 8 bits: full int8/uint8."""
    scales: np.ndarray
    """float32 ``[n_blocks, N]``, nonzero (negative where a signed scale put a positive extreme on level -8),
    ``n_blocks = ceil(K / block_size)``."""
    zero_points: np.ndarray | None
    """uint8 ``[n_blocks, N]`` in the level range (``[0, 15]`` for 4 bits), or None when symmetric."""
    block_size: int
    """The effective block size along K (``K`` when quantized per channel)."""
    bits: int = 4

    def __post_init__(self) -> None:
        if self.q.ndim != 2:
            raise ValueError(f"q must be 2-D [K, N], got shape {self.q.shape}")
        k, n = self.q.shape
        expected = (math.ceil(k / self.block_size), n)
        if self.scales.shape != expected:
            raise ValueError(f"scales must have shape {expected}, got {self.scales.shape}")
        if self.zero_points is not None and self.zero_points.shape != expected:
            raise ValueError(f"zero_points must have shape {expected}, got {self.zero_points.shape}")

    @property
    def symmetric(self) -> bool:
        """True when there are no zero points (signed levels)."""
        return self.zero_points is None

    @property
    def shape(self) -> tuple[int, int]:
        """``(K, N)``."""
        k, n = self.q.shape
        return k, n

    @property
    def n_blocks(self) -> int:
        """Number of blocks along K, ``ceil(K / block_size)``."""
        return int(self.scales.shape[0])

    def dequantize(self) -> np.ndarray:
        """The float32 ``[K, N]`` weight ``(q - zero_point) * scale``, block parameters broadcast over their rows."""
        k = self.q.shape[0]
        scales = np.repeat(self.scales.astype(np.float32), self.block_size, axis=0)[:k]
        levels = self.q.astype(np.float32)
        if self.zero_points is not None:
            levels -= np.repeat(self.zero_points.astype(np.float32), self.block_size, axis=0)[:k]
        return levels * scales


def effective_block_size(k: int, block_size: int) -> int:
    """Validates ``block_size`` (a power of two >= 16, or -1 for per-channel) and returns it (``k`` for -1)."""
    if block_size == -1:
        return k
    if block_size < 16 or block_size & (block_size - 1):
        raise InvalidArgumentError(f"Invalid block size {block_size}: use a power of two >= 16, or -1 for per-channel.")
    return block_size


def to_blocks(w: np.ndarray, block_size: int) -> np.ndarray:
    """``[K, N] -> [n_blocks, block_size, N]`` float32; K is zero-padded to a multiple of ``block_size``.

    Returns a view when no padding or conversion is needed (do not write to it).
    """
    k, n = w.shape
    n_blocks = math.ceil(k / block_size)
    xp = namespace(w)
    w = xp.asarray(w, dtype=np.float32)
    if n_blocks * block_size == k:
        return w.reshape(n_blocks, block_size, n)
    padded = xp.zeros((n_blocks * block_size, n), dtype=np.float32)
    padded[:k] = w
    return padded.reshape(n_blocks, block_size, n)


def block_params(
    blocks: np.ndarray, grid: QuantGrid = DEFAULT_GRID, *, ratios: float | np.ndarray = 1.0
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scales and zero points of ``blocks`` ``[..., bs, N]`` (reduced over axis -2), each ``[..., N]`` float32.

    With levels ``[qmin, qmax]`` (``[-8, 7]`` symmetric, ``[0, 15]`` asymmetric for 4 bits), block minimum ``lo`` and
    maximum ``hi``, and shrink ratio ``r`` (``ratios`` broadcasts against ``[..., N]``):

    * symmetric, ``positive_scales``: ``s = r * max(lo / qmin, hi / qmax)`` (= ``max(-lo/8, hi/7)``), the smallest
      positive scale that covers the block (``amax/7``, ModelOpt's, never uses level -8);
    * symmetric (default): also the *signed* scale ``s = r * v / qmin`` of the block's largest-magnitude value
      ``v``, which puts ``v`` exactly on level -8 (negative when ``v > 0``; a step of ``|v|/8`` instead of ``v/7``,
      as ONNX Runtime's RTN), and of the two keeps the one with the lower squared error of the block. They differ
      only where the largest magnitude is positive; the signed one clips ``lo`` at ``-7/8 v``, so neither always wins;
    * asymmetric: ``lo' = r * min(lo, 0)``, ``hi' = r * max(hi, 0)`` (0 stays exactly representable),
      ``s = (hi' - lo') / (qmax - qmin)``, ``z = clip(rint(-lo' / s), qmin, qmax)`` (integer-valued float32).

    A block of zeros gets ``s = 1`` (and ``z = 0``), so it quantizes to 0 and reconstructs exactly.
    """
    qmin, qmax = grid.levels
    xp = namespace(blocks)
    lo = blocks.min(axis=-2)
    hi = blocks.max(axis=-2)
    ratios = xp.asarray(ratios, dtype=np.float32)
    if grid.symmetric:
        scales = nonzero_scales(xp.maximum(lo / np.float32(qmin), hi / np.float32(qmax)) * ratios)
        if grid.positive_scales:
            return scales, None
        signed = nonzero_scales(xp.where(-lo >= hi, lo, hi) / np.float32(qmin) * ratios)
        if not (signed != scales).any():
            return scales, None
        better = _block_sq_error(blocks, signed, grid.bits) < _block_sq_error(blocks, scales, grid.bits)
        return xp.where(better, signed, scales).astype(np.float32), None
    lo = xp.minimum(lo, np.float32(0.0)) * ratios
    hi = xp.maximum(hi, np.float32(0.0)) * ratios
    scales = nonzero_scales((hi - lo) / np.float32(qmax - qmin))
    zero_points = xp.clip(xp.rint(-lo / scales), qmin, qmax).astype(np.float32)
    return scales, zero_points


def nonzero_scales(scales: np.ndarray) -> np.ndarray:
    """``scales`` as float32 with 1 where a block is all zeros (its scale would be 0)."""
    xp = namespace(scales)
    return xp.where(xp.abs(scales) > np.finfo(np.float32).tiny, scales, np.float32(1.0)).astype(np.float32)


def _block_sq_error(blocks: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """Squared reconstruction error per block and column of symmetric quantization with ``scales``."""
    diff = quantize_levels(blocks, scales, None, bits=bits)
    diff *= scales[..., None, :]
    diff = namespace(diff).subtract(blocks, diff, out=diff)  # in place: no second temporary of the blocks' size
    return namespace(diff).einsum("...kn,...kn->...n", diff, diff)


def quantize_levels(
    blocks: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, bits: int = 4
) -> np.ndarray:
    """Integer levels ``clip(rint(w / s) + z, qmin, qmax)`` of ``blocks`` ``[..., bs, N]`` as float32.

    ``scales``/``zero_points`` are ``[..., N]`` (one per block and column). Rounding is half-to-even (``np.rint``).
    """
    qmin, qmax = level_range(bits, zero_points is None)
    xp = namespace(blocks, scales)
    levels = xp.rint(blocks / scales[..., None, :])
    if zero_points is not None:
        levels += zero_points[..., None, :]
    return xp.clip(levels, qmin, qmax, out=levels)


def dequantize_levels(levels: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None) -> np.ndarray:
    """``(levels - z) * s`` for ``levels`` ``[..., bs, N]`` and parameters ``[..., N]``."""
    if zero_points is not None:
        levels = levels - zero_points[..., None, :]
    return levels * scales[..., None, :]


def quantize_dequantize(w: np.ndarray, block_size: int, grid: QuantGrid = DEFAULT_GRID) -> np.ndarray:
    """``[K, N]`` float32 ``w`` after plain RTN and back, on the arrays given (numpy or a device's): the values of
    ``quantize_rtn(w, block_size, ...).dequantize()`` bit for bit, without the integer levels leaving the device."""
    k = w.shape[0]
    blocks = to_blocks(w, effective_block_size(k, block_size))
    s, z = block_params(blocks, grid)
    dq = dequantize_levels(quantize_levels(blocks, s, z, bits=grid.bits), s, z)
    return dq.reshape(-1, dq.shape[-1])[:k]


def as_float32_matrix(w: ArrayLike, name: str = "w") -> np.ndarray:
    array = np.asarray(w)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [K, N] matrix, got shape {array.shape}")
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} has NaN or infinite values; they cannot be quantized")
    return array


def column_chunk(k: int, n: int, chunk_columns: int | None, *, elements: int = _CHUNK_ELEMENTS) -> int:
    """Columns per chunk: ``chunk_columns`` (at most ``n``), or as many as keep ``K * columns`` under ``elements``."""
    if chunk_columns is not None:
        if chunk_columns < 1:
            raise ValueError(f"chunk_columns must be positive, got {chunk_columns}")
        return min(chunk_columns, n)
    return max(1, min(n, elements // max(k, 1)))


def ratio_grid(ratios: Sequence[float] | np.ndarray) -> np.ndarray:
    """The search grid as float32 with 1.0 first (prepended if absent), so ties keep the unclipped range."""
    grid = [float(r) for r in np.asarray(ratios, dtype=np.float64).reshape(-1)]
    if not grid or min(grid) <= 0:
        raise ValueError(f"clip ratios must be positive, got {grid}")
    rest = [r for r in grid if r != 1.0]
    return np.asarray([1.0, *rest], dtype=np.float32)


def _mse_ratio_search(blocks: np.ndarray, ratios: np.ndarray, grid: QuantGrid) -> np.ndarray:
    """Per-(block, column) ratio of ``ratios`` minimising the block's weight MSE; ``blocks`` ``[nb, bs, c]``."""
    xp = namespace(blocks)
    best_err = xp.full(blocks.shape[::2], np.inf, dtype=np.float32)
    best_ratio = xp.ones(blocks.shape[::2], dtype=np.float32)
    for ratio in ratios:
        scales, zero_points = block_params(blocks, grid, ratios=ratio)
        levels = quantize_levels(blocks, scales, zero_points, bits=grid.bits)
        diff = blocks - dequantize_levels(levels, scales, zero_points)
        err = xp.einsum("bkn,bkn->bn", diff, diff)
        better = err < best_err
        best_err = xp.where(better, err, best_err)
        best_ratio = xp.where(better, ratio, best_ratio)
    return best_ratio


def quantize_rtn(
    w: ArrayLike,
    block_size: int,
    *,
    symmetric: bool = True,
    clip_search: bool = False,
    clip_ratios: float | np.ndarray | None = None,
    search_ratios: Sequence[float] | np.ndarray = DEFAULT_CLIP_RATIOS,
    bits: int = 4,
    chunk_columns: int | None = None,
    positive_scales: bool = False,
    search: BlockSearch | None = None,
    backend: ArrayBackend = NUMPY,
) -> QuantizedWeight:
    """Round-to-nearest block-wise quantization of a ``[K, N]`` weight (see :func:`block_params` for the math).

    Args:
        w: the weight, float16/bfloat16/float32/float64 ``[K, N]``.
        block_size: a power of two >= 16 (blocks of rows along K), or -1 for one block per output channel.
        symmetric: signed levels without zero points; else unsigned levels with uint8 zero points.
        clip_search: per (block, column), try every ratio of ``search_ratios`` as the shrink of the block range and
            keep the one with the lowest weight MSE of that block. 1.0 is always tried first, so the result is never
            worse than plain RTN. Cost: ``len(search_ratios)`` quantizations.
        clip_ratios: fixed shrink ratios instead of a search: a scalar or an ``[n_blocks, N]`` array (e.g. from
            :func:`~onnxprec.quantization.algorithms.awq.awq_clip`). Excludes ``clip_search``.
        search_ratios: the grid of ``clip_search``.
        bits: 4 (default) or 8.
        chunk_columns: columns processed at once (temporaries are a few ``K * chunk_columns`` float32 arrays);
            default: about 4 M elements per chunk.
        positive_scales: symmetric scales always positive (for runtimes that reject negative scales); by default
            a block may get a signed scale (see :func:`block_params`).
        search: a function giving the block parameters instead of the block range, called as ``search(blocks,
            QuantGrid(bits, symmetric, positive_scales), valid=K)``
            (:data:`~onnxprec.quantization.algorithms.search.SEARCHES`: k-quant, HQQ). Excludes the clip options.
        backend: where the arithmetic runs (:func:`onnxprec._array.backend`); each chunk of columns goes there as
            float32 and its levels come back as int8/uint8. On a device, a chunk is as large as the backend's
            memory limit allows (unless ``chunk_columns`` says otherwise).
    """
    if clip_search and clip_ratios is not None:
        raise ValueError("Pass either clip_search=True or clip_ratios, not both")
    if search is not None and (clip_search or clip_ratios is not None):
        raise ValueError("Pass either search or a clip option, not both")
    weight = as_float32_matrix(w)
    k, n = weight.shape
    bs = effective_block_size(k, block_size)
    n_blocks = math.ceil(k / bs)
    ratios: np.ndarray | None = None
    if clip_ratios is not None:
        ratios = np.broadcast_to(np.asarray(clip_ratios, dtype=np.float32), (n_blocks, n))
        if not (ratios > 0).all():
            raise ValueError("clip_ratios must be positive")
    ratio_candidates = ratio_grid(search_ratios) if clip_search else None
    grid = QuantGrid(bits, symmetric, positive_scales)
    qmin, _ = grid.levels
    q = np.empty((k, n), dtype=np.int8 if qmin < 0 else np.uint8)
    scales = np.empty((n_blocks, n), dtype=np.float32)
    zero_points = None if symmetric else np.empty((n_blocks, n), dtype=np.uint8)
    step = column_chunk(k, n, chunk_columns, elements=backend.chunk_elements(_CHUNK_ELEMENTS, _CHUNK_TEMPORARIES))
    for start in range(0, n, step):
        cols = slice(start, min(start + step, n))
        blocks = to_blocks(backend.from_host(weight[:, cols]), bs)
        if search is not None:
            s, z = search(blocks, grid, valid=k)
        else:
            if ratio_candidates is not None:
                chunk_ratios: float | np.ndarray = _mse_ratio_search(blocks, ratio_candidates, grid)
            else:
                chunk_ratios = 1.0 if ratios is None else ratios[:, cols]
            s, z = block_params(blocks, grid, ratios=chunk_ratios)
        levels = quantize_levels(blocks, s, z, bits=bits)
        q[:, cols] = backend.to_host(levels.reshape(-1, levels.shape[-1])[:k].astype(q.dtype))
        scales[:, cols] = backend.to_host(s)
        if zero_points is not None and z is not None:
            zero_points[:, cols] = backend.to_host(z.astype(np.uint8))
        del blocks, levels, s, z
    backend.release()
    return QuantizedWeight(q=q, scales=scales, zero_points=zero_points, block_size=bs, bits=bits)


def quantize_int8_per_channel(w: ArrayLike, *, symmetric: bool = True) -> QuantizedWeight:
    """INT8 per-output-channel quantization (e.g. for an lm_head kept at 8 bits): scales ``[1, N]``, all 256 levels.

    Symmetric: ``s = max(-min/128, max/127)`` per column, q int8 in ``[-128, 127]``.
    """
    return quantize_rtn(w, -1, symmetric=symmetric, bits=8)


def reconstruction_error(w: ArrayLike, qw: QuantizedWeight, x: ArrayLike | None = None) -> float:
    """Relative Frobenius error ``||W - Wq|| / ||W||``, or of the outputs ``||X W - X Wq|| / ||X W||`` when ``x``
    (``[T, K]`` tokens) is given. 0 when both numerator and denominator are 0, inf when only the denominator is.
    """
    weight = np.asarray(w).astype(np.float32, copy=False)
    diff = weight - qw.dequantize()
    if x is not None:
        tokens = np.asarray(x).astype(np.float32, copy=False)
        diff = tokens @ diff
        weight = tokens @ weight
    num = float(np.linalg.norm(diff.astype(np.float64)))
    den = float(np.linalg.norm(weight.astype(np.float64)))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
