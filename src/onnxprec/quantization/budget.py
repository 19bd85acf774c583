"""The precisions a weight may get under a size budget and their stored bytes in each output format.

Each weight may be stored as INT4 at block 128, 64 or 32, as INT8, or kept in float. Which one each weight gets is
the sensitivity engine's choice (:func:`onnxprec.sensitivity.allocate` on the candidates' bytes and Hessian-weighted
losses, :func:`onnxprec.sensitivity.hessian_loss`): the most sensitive bytes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxprec.quantization.algorithms.rtn import effective_block_size

__all__ = ["FLOAT", "Precision", "stored_bytes"]


@dataclass(frozen=True)
class Precision:
    """How a weight is stored: ``bits`` 4 or 8 with ``block_size`` (-1: per channel), or float (``bits`` 0)."""

    bits: int
    block_size: int = -1

    @property
    def label(self) -> str:
        if self.bits == 0:
            return "float"
        block = "per channel" if self.block_size == -1 else f"block {self.block_size}"
        return f"int{self.bits} {block}"


FLOAT = Precision(0)


def stored_bytes(
    k: int, n: int, itemsize: int, precision: Precision, *, symmetric: bool, output_format: str
) -> tuple[int, int]:
    """(stored bytes, ideal bytes) of a ``[K, N]`` weight at ``precision`` in ``output_format``.

    The ideal size counts ``bits`` per weight, one scale per block (in the weight's float type) and packed zero
    points; MatMulNBits also stores the padding of a partial last block (its block size is a power of two).
    """
    if precision.bits == 0:
        size = k * n * itemsize
        return size, size
    bits = precision.bits
    block = effective_block_size(k, precision.block_size)
    n_blocks = math.ceil(k / block)
    ideal = math.ceil(k * n * bits / 8) + n_blocks * n * itemsize
    if not symmetric:
        ideal += math.ceil(n_blocks * n * bits / 8)
    if output_format == "qdq":
        return ideal, ideal
    if block < 16 or block & (block - 1):  # per channel: MatMulNBits pads K to a power of two
        block = max(16, 1 << (k - 1).bit_length())
    n_blocks = math.ceil(k / block)
    stored = n * n_blocks * block * bits // 8 + n * n_blocks * itemsize
    if not symmetric:
        stored += n * math.ceil(n_blocks * bits / 8)
    return stored, ideal
