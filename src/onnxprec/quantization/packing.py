"""Bit-exact storage layouts of a :class:`~onnxprec.quantization.algorithms.rtn.QuantizedWeight`.

Two forms are produced:

* **QDQ** (opset 21): ``DequantizeLinear(x [K, N] INT4/UINT4, x_scale [n_blocks, N], x_zero_point, axis=0,
  block_size=bs) -> MatMul``. The data are ``ml_dtypes.int4``/``uint4`` arrays, which ``onnx_ir.Tensor`` serializes
  two values per byte, low nibble first (element ``2i`` in bits 0-3, ``2i+1`` in bits 4-7).
* **MatMulNBits** (``com.microsoft``, ONNX Runtime contrib op): ``B`` uint8 ``[N, n_blocks, block_size * bits / 8]``
  holds the **unsigned** levels of column ``n`` (``q + 8`` for symmetric 4-bit weights, whose implicit zero point is
  8; ``q + 128`` for 8 bits), K zero-padded to ``n_blocks * block_size`` with the zero point (padded weights
  dequantize to 0), two 4-bit values per byte, low nibble first; ``scales`` ``[N, n_blocks]``; optional
  ``zero_points`` uint8 ``[N, ceil(n_blocks * bits / 8)]``, packed the same way along the blocks of a column.
  ``block_size`` must be a power of two >= 16: a per-channel weight whose K is not one uses the next power of two.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from onnxprec._tensors import pack_nibbles, unpack_nibbles
from onnxprec.quantization.algorithms.rtn import QuantizedWeight, level_range

__all__ = [
    "MatMulNBitsWeights",
    "QdqWeights",
    "matmulnbits_attributes",
    "matmulnbits_block_size",
    "pack_matmulnbits",
    "pack_nibbles",
    "qdq_arrays",
    "to_ml_dtypes_int4",
    "unpack_matmulnbits",
    "unpack_nibbles",
]

logger = logging.getLogger(__name__)


class MatMulNBitsWeights(NamedTuple):
    """The constant inputs of a ``com.microsoft::MatMulNBits`` node."""

    b: np.ndarray
    """uint8 ``[N, n_blocks, block_size * bits / 8]``."""
    scales: np.ndarray
    """``[N, n_blocks]`` in the requested float dtype."""
    zero_points: np.ndarray | None
    """uint8 ``[N, ceil(n_blocks * bits / 8)]``, or None (implicit zero point ``2^(bits-1)``)."""


class QdqWeights(NamedTuple):
    """The initializers of ``DequantizeLinear(data, scales, zero_points, axis=0, block_size=qw.block_size)``."""

    data: np.ndarray
    """``[K, N]``: ``ml_dtypes.int4``/``uint4`` for 4 bits, int8/uint8 for 8 bits."""
    scales: np.ndarray
    """``[n_blocks, N]`` in the requested float dtype."""
    zero_points: np.ndarray | None
    """Same dtype as ``data``, ``[n_blocks, N]``; None when symmetric (the ONNX default zero point is 0)."""


def to_ml_dtypes_int4(q: np.ndarray, signed: bool) -> np.ndarray:
    """``q`` as ``ml_dtypes.int4`` (values in ``[-8, 7]``) or ``ml_dtypes.uint4`` (``[0, 15]``), checked.

    ``onnx_ir.Tensor(result, dtype=ir.DataType.INT4 / UINT4)`` packs these two per byte, low nibble first.
    """
    lo, hi = level_range(4, signed)
    values = np.asarray(q)
    if values.size and (values.min() < lo or values.max() > hi):
        raise ValueError(f"Values out of the {'int4' if signed else 'uint4'} range [{lo}, {hi}]")
    return values.astype(ml_dtypes.int4 if signed else ml_dtypes.uint4)


def qdq_arrays(qw: QuantizedWeight, scale_dtype: DTypeLike = np.float32) -> QdqWeights:
    """The ``DequantizeLinear`` initializers of ``qw`` (``axis=0``, ``block_size=qw.block_size``, opset >= 21).

    Symmetric weights are signed (INT4/INT8) without a zero point; asymmetric ones unsigned (UINT4/UINT8) with a zero
    point of the same type. Scales are cast to ``scale_dtype`` (the dtype of the MatMul input).
    """
    signed = qw.symmetric
    if qw.bits == 4:
        data = to_ml_dtypes_int4(qw.q, signed)
        zero_points = None if qw.zero_points is None else to_ml_dtypes_int4(qw.zero_points, False)
    else:
        data = qw.q.astype(np.int8 if signed else np.uint8)
        zero_points = None if qw.zero_points is None else qw.zero_points.astype(np.uint8)
    return QdqWeights(data, qw.scales.astype(scale_dtype), zero_points)


def matmulnbits_block_size(qw: QuantizedWeight) -> int:
    """The ``block_size`` attribute of MatMulNBits: ``qw.block_size``, or for a single block whose size is not a power
    of two >= 16 (per-channel), the next power of two >= max(K, 16)."""
    bs = qw.block_size
    if bs >= 16 and bs & (bs - 1) == 0:
        return bs
    if qw.n_blocks != 1:
        raise ValueError(f"MatMulNBits needs a power-of-two block size >= 16, got {bs}")
    return max(16, 1 << (qw.shape[0] - 1).bit_length())


def matmulnbits_attributes(qw: QuantizedWeight) -> dict[str, int]:
    """``K``, ``N``, ``bits`` and ``block_size`` attributes of the MatMulNBits node of ``qw``.

    Add ``accuracy_level`` yourself (4 = int8 compute on CPU, the fast path; unset = fp32 compute).
    """
    k, n = qw.shape
    return {"K": k, "N": n, "bits": qw.bits, "block_size": matmulnbits_block_size(qw)}


# Bytes of int16 levels widened at once while packing MatMulNBits' B.
_PACK_CHUNK_BYTES = 32 << 20


def pack_matmulnbits(
    qw: QuantizedWeight, k: int | None = None, *, scale_dtype: DTypeLike = np.float32
) -> MatMulNBitsWeights:
    """The ``B``, ``scales`` and ``zero_points`` inputs of MatMulNBits for ``qw`` (layout in the module docstring).

    ``k`` (optional) is checked against ``qw``'s K. Use :func:`matmulnbits_attributes` for the node attributes.
    """
    rows, n = qw.shape
    if k is not None and k != rows:
        raise ValueError(f"K={k} does not match the quantized weight's K={rows}")
    bits = qw.bits
    bs = matmulnbits_block_size(qw)
    n_blocks = math.ceil(rows / bs)
    offset = -level_range(bits, True)[0] if qw.symmetric else 0  # 8 (or 128): the implicit zero point
    unsigned = np.empty((n, n_blocks * bs), dtype=np.uint8)
    step = max(1, _PACK_CHUNK_BYTES // (2 * rows))  # columns widened to int16 at once: an LLM head's 151,936 x 1,536
    for start in range(0, n, step):  # levels would otherwise take two int16 copies (0.9 GB) beside their result
        unsigned[start : start + step, :rows] = (qw.q[:, start : start + step].astype(np.int16) + offset).T
    if n_blocks * bs > rows:
        if qw.zero_points is None:
            unsigned[:, rows:] = offset
        else:
            unsigned[:, rows:] = qw.zero_points[-1][:, None]  # the last block's zero point dequantizes to 0
    blocks = unsigned.reshape(n, n_blocks, bs)
    b = pack_nibbles(blocks) if bits == 4 else blocks
    scales = np.ascontiguousarray(qw.scales.T).astype(scale_dtype)
    zero_points = None
    if qw.zero_points is not None:
        zp = np.ascontiguousarray(qw.zero_points.T).astype(np.uint8)  # [N, n_blocks]
        if bits == 4:
            if n_blocks % 2:
                zp = np.concatenate([zp, np.zeros((n, 1), dtype=np.uint8)], axis=1)
            zp = pack_nibbles(zp)
        zero_points = zp
    return MatMulNBitsWeights(np.ascontiguousarray(b), scales, zero_points)


def unpack_matmulnbits(
    b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, *, bits: int = 4
) -> QuantizedWeight:
    """Inverse of :func:`pack_matmulnbits`: a float32-scaled ``QuantizedWeight`` whose ``block_size`` is the
    MatMulNBits block size (for a padded per-channel weight, larger than K: same dequantized values).

    Without ``zero_points`` the weight is symmetric (int8 levels ``u - 2^(bits-1)``); with them, unsigned levels.
    """
    if b.ndim != 3:
        raise ValueError(f"B must be [N, n_blocks, blob], got shape {b.shape}")
    n, n_blocks, blob = b.shape
    bs = blob * 8 // bits
    if n_blocks != math.ceil(k / bs):
        raise ValueError(f"B has {n_blocks} blocks of {bs}, which does not fit K={k}")
    unsigned = (unpack_nibbles(b) if bits == 4 else b.astype(np.uint8)).reshape(n, n_blocks * bs)[:, :k]
    s = np.asarray(scales, dtype=np.float32).reshape(n, n_blocks).T.copy()
    if zero_points is None:
        q = (unsigned.astype(np.int16) + level_range(bits, True)[0]).astype(np.int8).T.copy()
        return QuantizedWeight(q=q, scales=s, zero_points=None, block_size=bs, bits=bits)
    zp = np.asarray(zero_points, dtype=np.uint8).reshape(n, -1)
    if bits == 4:
        zp = unpack_nibbles(zp)
    zp = zp[:, :n_blocks].T.copy()
    return QuantizedWeight(q=unsigned.T.copy(), scales=s, zero_points=zp, block_size=bs, bits=bits)
