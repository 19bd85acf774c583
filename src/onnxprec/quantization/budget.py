"""Precision per weight under a size budget: candidate precisions, their bytes and estimated loss, and the choice.

Each weight may be stored as INT4 at block 128, 64 or 32, as INT8, or kept in float. A candidate's *estimated loss*
is the relative output error its quantization adds on the calibration data, Hessian-weighted with the ``XᵀX`` of the
layer's input (the statistic GPTQ uses):

    ``loss = tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)``,  ``ΔW = W - Q(W)``,  ``H = XᵀX``

summed over the layers that read the weight (an embedding table, read by a Gather, counts its relative weight error:
every row equally likely). The choice (:func:`allocate`) starts from each weight's smallest candidate and promotes
the weights whose next candidate on their (bytes, loss) lower convex hull removes the most loss per byte, while the
budget allows: the most sensitive bytes first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from onnxprec.quantization.algorithms.rtn import effective_block_size

__all__ = [
    "FLOAT",
    "Allocation",
    "Candidate",
    "Precision",
    "allocate",
    "hessian_energy",
    "hessian_loss",
    "stored_bytes",
]

Key = TypeVar("Key", bound=Hashable)


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


@dataclass(frozen=True)
class Candidate:
    """One precision of one weight: its stored bytes and estimated loss."""

    precision: Precision
    bytes: int
    loss: float


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


def hessian_energy(x: np.ndarray, gram: np.ndarray | None) -> float:
    """``tr(Xᵀ H X)`` of a ``[K, N]`` matrix (``H`` ``[K, K]``; None: the identity)."""
    x = np.asarray(x, np.float32)
    product = x if gram is None else np.asarray(gram, np.float32) @ x
    return float(np.einsum("kn,kn->", product, x, dtype=np.float64))


def hessian_loss(w: np.ndarray, dequantized: np.ndarray, gram: np.ndarray | None, energy: float | None = None) -> float:
    """``tr(ΔWᵀ H ΔW) / tr(Wᵀ H W)`` for ``[K, N]`` weights and ``H`` ``[K, K]`` (None: the identity).

    ``energy``: ``tr(Wᵀ H W)`` when already known (:func:`hessian_energy`), to score several candidates of one weight.
    """
    den = hessian_energy(w, gram) if energy is None else energy
    if den <= 0:
        return 0.0
    diff = np.asarray(w, np.float32) - np.asarray(dequantized, np.float32)
    return max(hessian_energy(diff, gram), 0.0) / den


@dataclass
class Allocation(Generic[Key]):
    """The outcome of :func:`allocate`."""

    choice: dict[Key, Candidate]
    bytes: int
    loss: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    """(bytes, estimated loss) from the smallest configuration through every promotion to the largest."""


def _hull(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The lower convex hull of (bytes, loss), from the fewest bytes on, loss strictly decreasing."""
    points: list[Candidate] = []
    for candidate in sorted(candidates, key=lambda c: (c.bytes, c.loss)):
        if points and candidate.loss >= points[-1].loss:
            continue  # more bytes for no less loss
        if points and candidate.bytes == points[-1].bytes:
            points.pop()
        while len(points) >= 2:
            a, b = points[-2], points[-1]
            # b is above the segment a -> candidate: not on the hull
            if (b.loss - a.loss) * (candidate.bytes - a.bytes) >= (candidate.loss - a.loss) * (b.bytes - a.bytes):
                points.pop()
            else:
                break
        points.append(candidate)
    return points


def allocate(candidates: Mapping[Key, Sequence[Candidate]], budget: int | None) -> Allocation[Key]:
    """The candidate of each key that minimises the summed loss within ``budget`` bytes (greedy on convex hulls).

    Every key starts at its smallest candidate; promotions (to the next hull point of a key) are taken in order of
    loss removed per byte added. With a budget, a promotion that does not fit is skipped and the later ones of that
    key with it; smaller promotions of other keys may still fit. Raises ``ValueError`` when even the smallest
    candidates exceed ``budget``.
    """
    hulls = {key: _hull(options) for key, options in candidates.items() if options}
    level = dict.fromkeys(hulls, 0)
    total = sum(h[0].bytes for h in hulls.values())
    loss = sum(h[0].loss for h in hulls.values())
    if budget is not None and total > budget:
        raise ValueError(f"the smallest configuration takes {total} bytes, above the budget of {budget}")
    order = {key: i for i, key in enumerate(hulls)}
    heap: list[tuple[float, int, Key]] = []

    def push(key: Key) -> None:
        hull, i = hulls[key], level[key]
        if i + 1 < len(hull):
            step, now = hull[i + 1], hull[i]
            slope = (now.loss - step.loss) / max(step.bytes - now.bytes, 1)
            heapq.heappush(heap, (-slope, order[key], key))

    for key in hulls:
        push(key)
    curve = [(total, loss)]
    chosen_total, chosen_loss, chosen = total, loss, {key: h[0] for key, h in hulls.items()}
    blocked: set[Key] = set()
    while heap:
        _, _, key = heapq.heappop(heap)
        hull, i = hulls[key], level[key]
        added = hull[i + 1].bytes - hull[i].bytes
        total += added
        loss -= hull[i].loss - hull[i + 1].loss
        level[key] = i + 1
        curve.append((total, loss))
        if key not in blocked and (budget is None or chosen_total + added <= budget):
            chosen_total += added
            chosen_loss -= hull[i].loss - hull[i + 1].loss
            chosen[key] = hull[i + 1]
        else:
            blocked.add(key)
        push(key)
    return Allocation(chosen, chosen_total, max(chosen_loss, 0.0), curve)
