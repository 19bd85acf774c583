"""Lazy, clamped dtype conversion of tensors (weights are converted while they are written, one at a time)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx_ir as ir

__all__ = ["SENTINEL", "SENTINEL_MIN", "cast_array", "converted_tensor", "finite_max", "float32_copy", "release"]

SENTINEL = 1e30
"""Magnitudes from here up are masking sentinels (``finfo(float32).min`` fills, infinities), not data."""
SENTINEL_MIN = 1e4
"""A negative fill of at least this magnitude, flowing only into Softmax, is a masking sentinel (AutoCast writes
-16384 for FP16 and -2^126 for BF16)."""

# Convert big tensors in slices so the temporary float32 copy made by clipping stays small.
_CHUNK_ELEMENTS = 1 << 22
# Slices smaller than this are cast by numpy even when a faster kernel is given (a kernel call costs more).
_KERNEL_MIN_ELEMENTS = 1 << 14
_FP16_EXPONENT = np.uint16(0x7C00)

Fp16Kernel = Callable[[np.ndarray, np.ndarray], None]
"""An exact float32 -> float16 conversion into a given array (:func:`onnxprec._ort.float_to_fp16`)."""

_NUMPY = {
    ir.DataType.FLOAT: np.dtype(np.float32),
    ir.DataType.FLOAT16: np.dtype(np.float16),
    ir.DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    ir.DataType.DOUBLE: np.dtype(np.float64),
}


def finite_max(dtype: ir.DataType) -> float:
    """The largest finite value of a floating-point ``dtype``."""
    return float(ml_dtypes.finfo(_NUMPY[dtype]).max)


def cast_array(array: np.ndarray, to: ir.DataType, kernel: Fp16Kernel | None = None) -> np.ndarray:
    """Casts to ``to`` with round-to-nearest-even, clamping out-of-range values to the finite range.

    The sign is always kept: huge values become ``+-max`` (never inf), tiny values round to the nearest
    representable value of the same sign, or to a zero of the same sign. NaN stays NaN; +-inf become +-max.

    ``kernel`` (float32 to FP16 only) converts in its place where its result holds no inf or NaN, which is then
    numpy's bit for bit; a slice where it does is converted again as without it. The result never depends on it.
    """
    target = _NUMPY[to]
    limit = finite_max(to)
    source = np.asarray(array)
    out = np.empty(source.shape, dtype=target)
    flat_in = source.reshape(-1)
    flat_out = out.reshape(-1)
    needs_clamp = np.dtype(source.dtype).itemsize > target.itemsize or source.dtype == np.float16
    if source.dtype != np.float32 or target != np.float16:
        kernel = None
    for start in range(0, flat_in.size, _CHUNK_ELEMENTS):
        part = flat_in[start : start + _CHUNK_ELEMENTS]
        converted = flat_out[start : start + _CHUNK_ELEMENTS]
        if kernel is not None and part.size >= _KERNEL_MIN_ELEMENTS:
            kernel(part, converted)
            if not (np.bitwise_and(converted.view(np.uint16), _FP16_EXPONENT) == _FP16_EXPONENT).any():
                continue  # no inf or NaN: exactly numpy's values
        with np.errstate(over="ignore"):
            converted[...] = part  # the same cast as astype, written in place
        # Out-of-range values (and infinities) became +-inf: redo only those with a clamp; NaN stays NaN. Two
        # reductions of the source say when there are none (NaN fails both tests), cheaper than isinf of the result.
        if needs_clamp and part.size and not (float(part.min()) >= -limit and float(part.max()) <= limit):
            overflow = np.isinf(converted)
            if overflow.any():
                converted[overflow] = np.clip(part[overflow], -limit, limit).astype(target)
    return out


def release(tensor: ir.TensorProtocol) -> None:
    """Unmaps an external tensor so its pages stop counting against resident memory."""
    if isinstance(tensor, ir.ExternalTensor):
        # BufferError: a numpy view of the mapping is still alive; it is unmapped when that view goes.
        with contextlib.suppress(BufferError):
            tensor.release()


def float32_copy(tensor: ir.TensorProtocol, *, transposed: bool = False, columns: slice = slice(None)) -> np.ndarray:
    """A float32 copy of a weight (transposed: ``[K, N]`` from a Gemm's ``[N, K]``), or of ``columns`` of it; an
    external one is unmapped (a weight read in slices of columns is never all in memory).

    The view of the mapping is dropped before :func:`release`: while it lives the mapping cannot be closed, and the
    tensor would keep the whole file mapped with every page read so far resident.
    """
    array = np.asarray(tensor.numpy())
    copy = (array.T if transposed else array)[:, columns].astype(np.float32)
    del array
    release(tensor)
    return copy


def converted_tensor(
    tensor: ir.TensorProtocol, to: ir.DataType, name: str | None = None, kernel: Fp16Kernel | None = None
) -> ir.LazyTensor:
    """A tensor that converts ``tensor`` to ``to`` only when it is read (e.g. while saving); ``kernel``: see
    :func:`cast_array`."""

    def load() -> ir.TensorProtocol:
        result = cast_array(tensor.numpy(), to, kernel)
        release(tensor)
        return ir.Tensor(result, dtype=to)

    return ir.LazyTensor(load, dtype=to, shape=ir.Shape(tensor.shape.numpy()), name=name or tensor.name)


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Packs uint8 values in ``[0, 15]`` along the last axis (even length) two per byte, low nibble first."""
    pairs = values.reshape(*values.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_nibbles`: ``[..., m] -> [..., 2m]`` uint8."""
    out = np.empty((*packed.shape[:-1], packed.shape[-1], 2), dtype=np.uint8)
    out[..., 0] = packed & 0x0F
    out[..., 1] = packed >> 4
    return out.reshape(*packed.shape[:-1], -1)
