"""Observers: what a tool keeps of the tensors a reference run produces, in bounded memory.

The reference runner (:func:`onnxprec.reference.run_reference`) calls ``observer.update(name, array)`` for
every selected tensor of every calibration batch and drops the array right after. An observer keeps only
what its tool needs:

- :class:`RangeObserver`: running min/max/absmax per tensor (AutoCast's ``data_max``).
- :class:`ChannelAbsMeanObserver`: per-channel mean ``|x|`` over all tokens (AWQ's activation statistic).
- :class:`GramObserver`: ``XᵀX`` over all tokens, float64 (GPTQ's Hessian).
- :class:`TokenSampleObserver`: a bounded, uniform reservoir of token rows (loss evaluation, clip search).
- :class:`FirstBatchObserver`: the arrays of the first batch (validation, dumps).

Every observer's memory is independent of the number of batches.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ChannelAbsMeanObserver",
    "FirstBatchObserver",
    "GramObserver",
    "Observer",
    "RangeObserver",
    "TensorStats",
    "TokenSampleObserver",
    "accumulate",
]


@runtime_checkable
class Observer(Protocol):
    """Anything with ``update(name, array)``; ``names`` (optional) limits which tensors it is given."""

    def update(self, name: str, array: np.ndarray) -> None: ...


class _Filtered:
    """Base of the observers below: ``names=None`` observes every tensor, else only those named."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        self.names = frozenset(names) if names is not None else None

    def wants(self, name: str) -> bool:
        return self.names is None or name in self.names


# --------------------------------------------------------------------------------------------------
# Ranges (AutoCast)


@dataclass
class TensorStats:
    """Running statistics of one tensor over all batches (ModelOpt's ``TensorStats`` fields).

    ``unmasked_absmax`` is set only for tensors observed with a sentinel threshold (see :class:`RangeObserver`):
    the largest magnitude among the values above the threshold, i.e. leaving out attention-mask fills.
    """

    absmax: float
    min: float
    max: float
    shape: tuple[int, ...]
    dtype: np.dtype
    batches: int = 1
    unmasked_absmax: float | None = None

    @classmethod
    def of(cls, array: np.ndarray) -> TensorStats:
        lo, hi = _min_max(array)
        return cls(max(abs(lo), abs(hi)), lo, hi, tuple(array.shape), array.dtype)

    def update(self, array: np.ndarray) -> None:
        self.add(*_min_max(array))

    def add(self, lo: float, hi: float) -> None:
        """Adds one batch's minimum and maximum."""
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.absmax = max(self.absmax, abs(lo), abs(hi))
        self.batches += 1

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return bool(np.issubdtype(self.dtype, np.floating))


def _min_max(array: np.ndarray) -> tuple[float, float]:
    if array.size == 0 or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        return 0.0, 0.0
    if np.issubdtype(array.dtype, np.floating) and np.isnan(array).any():
        return -math.inf, math.inf  # NaN in FP32 already: treat as unbounded
    return float(array.min()), float(array.max())


class RangeObserver(_Filtered):
    """Running :class:`TensorStats` per tensor name (graph inputs included when they are fed to it).

    Args:
        names: The tensors to observe (None: all).
        sentinels: Tensor name -> threshold: values at or below it are masking sentinels (e.g. a
            ``finfo(float32).min`` attention-mask fill), and the tensor's ``unmasked_absmax`` is the largest
            magnitude among the other values. The reference run reduces it inside ONNX Runtime.
    """

    def __init__(self, names: Collection[str] | None = None, sentinels: Mapping[str, float] | None = None) -> None:
        super().__init__(names)
        self.stats: dict[str, TensorStats] = {}
        self.sentinels: dict[str, float] = dict(sentinels or {})

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        array = np.asarray(array)
        current = self.stats.get(name)
        if current is None:
            current = self.stats[name] = TensorStats.of(array)
        else:
            current.update(array)
        threshold = self.sentinels.get(name)
        if threshold is not None:
            kept = np.abs(array[~(array <= threshold)])  # NaN is kept: it is data, not a mask
            value = float(kept.max()) if kept.size else 0.0
            _merge_unmasked(current, math.inf if math.isnan(value) else value)

    def update_range(
        self,
        name: str,
        lo: float,
        hi: float,
        total: float,
        shape: tuple[int, ...],
        dtype: np.dtype,
        unmasked: float | None = None,
    ) -> None:
        """Adds one batch from reductions computed by the runtime: min, max, sum (NaN iff the tensor has NaN),
        and, for tensors with a sentinel threshold, the largest magnitude past the sentinels."""
        if not self.wants(name):
            return
        if math.isnan(total) or math.isnan(lo) or math.isnan(hi):
            lo, hi = -math.inf, math.inf  # NaN in FP32 already: treat as unbounded
        elif math.prod(shape) == 0:
            lo = hi = 0.0
        current = self.stats.get(name)
        if current is None:
            current = self.stats[name] = TensorStats(max(abs(lo), abs(hi)), lo, hi, shape, np.dtype(dtype))
        else:
            current.add(lo, hi)
        if unmasked is not None:
            _merge_unmasked(current, math.inf if math.isnan(total) else unmasked)


def _merge_unmasked(stats: TensorStats, value: float) -> None:
    stats.unmasked_absmax = value if stats.unmasked_absmax is None else max(stats.unmasked_absmax, value)


# --------------------------------------------------------------------------------------------------
# Quantization statistics (INT4)


def _rows(array: np.ndarray) -> np.ndarray:
    """A tensor as token rows ``[tokens, channels]`` (channels = last axis), float32."""
    array = np.asarray(array)
    if array.ndim == 0:
        return array.reshape(1, 1).astype(np.float32)
    return array.reshape(-1, array.shape[-1]).astype(np.float32, copy=False)


class ChannelAbsMeanObserver(_Filtered):
    """Per-channel (last axis) mean of ``|x|`` over every token of every batch."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        super().__init__(names)
        self._sums: dict[str, np.ndarray] = {}
        self.tokens: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array)
        accumulate(self._sums, self.tokens, name, np.abs(rows).sum(axis=0, dtype=np.float64), rows.shape[0])

    def mean(self, name: str) -> np.ndarray:
        """``[channels]`` float32 mean ``|x|``."""
        return (self._sums[name] / max(self.tokens[name], 1)).astype(np.float32)


def accumulate(totals: dict[str, np.ndarray], counts: dict[str, int], name: str, value: np.ndarray, n: int) -> None:
    """Adds one batch's ``value`` (summed over its ``n`` tokens) to ``totals[name]`` and ``n`` to ``counts[name]``."""
    if name in totals:
        totals[name] += value
        counts[name] += n
    else:
        totals[name] = value
        counts[name] = n


class GramObserver(_Filtered):
    """``XᵀX`` (float64, ``[channels, channels]``) and the token count, summed over every batch."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        super().__init__(names)
        self.gram: dict[str, np.ndarray] = {}
        self.tokens: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array).astype(np.float64)
        accumulate(self.gram, self.tokens, name, rows.T @ rows, rows.shape[0])


class TokenSampleObserver(_Filtered):
    """A uniform random sample of at most ``max_tokens`` token rows per tensor (reservoir sampling).

    Rows are the last axis of the tensor. The same seed gives the same sample for the same batches, and
    tensors of the same shape in the same batches get the same token positions (so a layer's input and
    output samples line up).
    """

    def __init__(self, max_tokens: int = 512, names: Collection[str] | None = None, seed: int = 0) -> None:
        super().__init__(names)
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = max_tokens
        self.seed = seed
        self._samples: dict[str, np.ndarray] = {}
        self._seen: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array)
        seen = self._seen.get(name, 0)
        sample = self._samples.get(name)
        if sample is None:
            sample = np.empty((0, rows.shape[1]), dtype=np.float32)
        room = self.max_tokens - sample.shape[0]
        if room > 0:
            take = rows[:room]
            sample = np.concatenate([sample, take])
            rows = rows[room:]
            seen += take.shape[0]
        if rows.shape[0]:
            # Algorithm R, vectorised: row i (global index seen+i) replaces slot j ~ U[0, seen+i] if j < max.
            rng = np.random.default_rng((self.seed, seen))
            slots = (rng.random(rows.shape[0]) * (seen + 1 + np.arange(rows.shape[0]))).astype(np.int64)
            keep = slots < self.max_tokens
            if keep.any():
                sample = sample.copy() if not sample.flags.writeable else sample
                sample[slots[keep]] = rows[keep]  # later rows win on equal slots, as in the sequential algorithm
            seen += rows.shape[0]
        self._samples[name] = sample
        self._seen[name] = seen

    def sample(self, name: str) -> np.ndarray:
        """``[tokens, channels]`` float32 (fewer than ``max_tokens`` rows if fewer were seen)."""
        return self._samples[name]

    def seen(self, name: str) -> int:
        return self._seen.get(name, 0)


class FirstBatchObserver(_Filtered):
    """The arrays of the first batch of each selected tensor."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        super().__init__(names)
        self.arrays: dict[str, np.ndarray] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if self.wants(name) and name not in self.arrays:
            self.arrays[name] = np.array(array, copy=True)  # never pin the runtime's buffers
