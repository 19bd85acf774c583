"""Observers: what a tool keeps of the tensors a reference run produces, in bounded memory.

The reference runner (:func:`onnxprec.reference.run_reference`) calls ``observer.update(name, array)`` for
every selected tensor of every calibration batch and drops the array right after. An observer keeps only
what its tool needs:

- :class:`RangeObserver`: running min/max/absmax per tensor (AutoCast's ``data_max``).
- :class:`ChannelAbsMeanObserver`: per-channel mean ``|x|`` over all tokens (AWQ's activation statistic).
- :class:`GramObserver`: ``XᵀX`` over all tokens, float64 (GPTQ's Hessian).
- :class:`TokenSampleObserver`: a bounded, uniform reservoir of token rows (loss evaluation, clip search).
- :class:`FirstBatchObserver`: the arrays of the first batch (validation, dumps).
- :class:`HistogramObserver`: a fixed-size histogram per tensor (INT8 activation ranges).
- :class:`ChannelStatsObserver`: per-channel mean and max ``|x|`` along a chosen axis (SmoothQuant, bias correction).
- :class:`RunSampleObserver`: a reservoir of token rows, each with the per-channel extremes of the run it came from
  (what dynamic INT8 quantization of that run saw).

Every observer's memory is independent of the number of batches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "DEFAULT_BINS",
    "ChannelAbsMeanObserver",
    "ChannelStatsObserver",
    "FirstBatchObserver",
    "GramObserver",
    "Histogram",
    "HistogramObserver",
    "Observer",
    "RangeObserver",
    "RunSampleObserver",
    "TensorStats",
    "TokenSampleObserver",
    "TokenSumObserver",
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


class _Sampling(_Filtered):
    """Base of the observers that keep a uniform random sample of at most ``max_tokens`` token rows per tensor
    (reservoir sampling with ``seed``; ``_seen``: the rows seen so far per tensor)."""

    def __init__(self, max_tokens: int, names: Collection[str] | None, seed: int) -> None:
        super().__init__(names)
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = max_tokens
        self.seed = seed
        self._seen: dict[str, int] = {}


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
        return _is_floating(self.dtype)


@functools.cache
def _is_floating(dtype: np.dtype) -> bool:
    """``np.issubdtype(dtype, np.floating)``, once per dtype (the rules ask it of every tensor of every node)."""
    return bool(np.issubdtype(dtype, np.floating))


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


class TokenSumObserver(_Filtered):
    """Base of the observers that sum one array per batch over every token: ``term`` of the batch's token rows
    ``[tokens, channels]`` (float32) is added to ``totals[name]`` (float64) and the rows to ``tokens[name]``."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        super().__init__(names)
        self.totals: dict[str, np.ndarray] = {}
        self.tokens: dict[str, int] = {}

    def term(self, rows: np.ndarray) -> np.ndarray:
        """The batch's contribution to the sum (float64)."""
        raise NotImplementedError

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array)
        accumulate(self.totals, self.tokens, name, self.term(rows), rows.shape[0])

    def drop(self, name: str) -> None:
        """Forgets ``name``'s sum and count (its statistics were taken)."""
        self.totals.pop(name, None)
        self.tokens.pop(name, None)


class ChannelAbsMeanObserver(TokenSumObserver):
    """Per-channel (last axis) mean of ``|x|`` over every token of every batch."""

    def term(self, rows: np.ndarray) -> np.ndarray:
        return np.abs(rows).sum(axis=0, dtype=np.float64)

    def mean(self, name: str) -> np.ndarray:
        """``[channels]`` float32 mean ``|x|``."""
        return (self.totals[name] / max(self.tokens[name], 1)).astype(np.float32)


def accumulate(totals: dict[str, np.ndarray], counts: dict[str, int], name: str, value: np.ndarray, n: int) -> None:
    """Adds one batch's ``value`` (summed over its ``n`` tokens) to ``totals[name]`` (float64) and ``n`` to
    ``counts[name]``."""
    if name in totals:
        totals[name] += value  # a float32 value is widened as it is added (no float64 copy of it)
        counts[name] += n
    else:
        totals[name] = value.astype(np.float64, copy=False)
        counts[name] = n


class GramObserver(TokenSumObserver):
    """``XᵀX`` (float64, ``[channels, channels]``, in ``gram``) and the token count, summed over every batch."""

    @property
    def gram(self) -> dict[str, np.ndarray]:
        """``XᵀX`` by tensor name."""
        return self.totals

    def term(self, rows: np.ndarray) -> np.ndarray:
        rows = rows.astype(np.float64)
        return rows.T @ rows


def _reservoir(
    sample: np.ndarray, rows: np.ndarray, seen: int, max_tokens: int, seed: int
) -> tuple[np.ndarray, int, np.ndarray]:
    """Adds ``rows`` to a uniform reservoir ``sample`` of at most ``max_tokens`` rows, ``seen`` rows seen so far.

    Returns:
        The sample, the rows seen, and for each added row the slot it went to (-1: not kept).
    """
    where = np.full(rows.shape[0], -1, dtype=np.int64)
    room = max(max_tokens - sample.shape[0], 0)
    take = rows[:room]
    where[: take.shape[0]] = np.arange(sample.shape[0], sample.shape[0] + take.shape[0])
    sample = np.concatenate([sample, take])
    rest = rows[take.shape[0] :]
    seen += take.shape[0]
    if rest.shape[0]:
        # Algorithm R, vectorised: row i (global index seen+i) replaces slot j ~ U[0, seen+i] if j < max.
        rng = np.random.default_rng((seed, seen))
        slots = (rng.random(rest.shape[0]) * (seen + 1 + np.arange(rest.shape[0]))).astype(np.int64)
        keep = slots < max_tokens
        if keep.any():
            sample = sample.copy() if not sample.flags.writeable else sample
            sample[slots[keep]] = rest[keep]  # later rows win on equal slots, as in the sequential algorithm
            where[take.shape[0] + np.flatnonzero(keep)] = slots[keep]
        seen += rest.shape[0]
    return sample, seen, where


class TokenSampleObserver(_Sampling):
    """A uniform random sample of at most ``max_tokens`` token rows per tensor (reservoir sampling).

    Rows are the last axis of the tensor. The same seed gives the same sample for the same batches, and
    tensors of the same shape in the same batches get the same token positions (so a layer's input and
    output samples line up).
    """

    def __init__(
        self,
        max_tokens: int = 512,
        names: Collection[str] | None = None,
        seed: int = 0,
        dtype: np.dtype[Any] | type[np.floating[Any]] = np.float32,
    ) -> None:
        super().__init__(max_tokens, names, seed)
        self._samples: dict[str, np.ndarray] = {}
        self.dtype = np.dtype(dtype)
        """Storage type of the rows (float16 halves the memory of samples that are only scored on); a tensor with a
        value beyond its range is kept in float32 instead (from the batch that shows it on)."""
        self._wide: set[str] = set()  # tensors kept in float32: their values exceed :attr:`dtype`'s range

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array)
        dtype = np.dtype(np.float32) if name in self._wide else self.dtype
        if dtype.itemsize < rows.dtype.itemsize and rows.size and np.abs(rows).max() > np.finfo(dtype).max:
            self._wide.add(name)  # would overflow to inf
            dtype = np.dtype(np.float32)
        if rows.dtype != dtype:
            rows = rows.astype(dtype)
        sample = self._samples.get(name)
        if sample is None:
            sample = np.empty((0, rows.shape[1]), dtype=dtype)
        elif sample.dtype != dtype:
            sample = sample.astype(dtype)
        sample, self._seen[name], _ = _reservoir(sample, rows, self._seen.get(name, 0), self.max_tokens, self.seed)
        self._samples[name] = sample

    def sample(self, name: str) -> np.ndarray:
        """``[tokens, channels]`` of :attr:`dtype`, or float32 beyond its range (fewer than ``max_tokens`` rows if
        fewer were seen)."""
        return self._samples[name]

    def seen(self, name: str) -> int:
        return self._seen.get(name, 0)

    def drop(self, name: str) -> None:
        """Forgets ``name``'s sample (it was taken)."""
        self._samples.pop(name, None)


class FirstBatchObserver(_Filtered):
    """The arrays of the first batch of each selected tensor."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        super().__init__(names)
        self.arrays: dict[str, np.ndarray] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if self.wants(name) and name not in self.arrays:
            self.arrays[name] = np.array(array, copy=True)  # never pin the runtime's buffers


# --------------------------------------------------------------------------------------------------
# INT8 statistics

DEFAULT_BINS = 2048
_TINY = 1e-30


@dataclass
class Histogram:
    """Counts of one tensor's values in ``bins`` equal bins over ``[lo, hi]``, with the exact extremes seen."""

    bins: int = DEFAULT_BINS
    lo: float = 0.0
    hi: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    nonfinite: int = 0
    """Values that were NaN or infinite (left out of the counts)."""

    @property
    def total(self) -> float:
        return float(self.counts.sum()) if self.counts.size else 0.0

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        edges = self.edges
        return (edges[:-1] + edges[1:]) / 2

    def add(self, array: np.ndarray) -> None:
        """Adds one batch of values (any shape, any float type)."""
        values = np.asarray(array).reshape(-1)
        if values.dtype != np.float32 and values.dtype != np.float64:
            values = values.astype(np.float32)
        finite = np.isfinite(values)
        if not finite.all():
            self.nonfinite += int(values.size - finite.sum())
            values = values[finite]
        if values.size == 0:
            return
        lo, hi = float(values.min()), float(values.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        if not self.counts.size:
            self.lo, self.hi = min(lo, 0.0), max(hi, 0.0)
            if self.hi - self.lo <= _TINY:
                self.hi = self.lo + 1.0  # all zeros: any range; the counts sit in the bin of 0
            self.counts = np.zeros(self.bins, dtype=np.float64)
        elif lo < self.lo or hi > self.hi:
            self._widen(min(lo, self.lo), max(hi, self.hi))
        counts, _ = np.histogram(values, bins=self.bins, range=(self.lo, self.hi))
        self.counts += counts

    def _widen(self, lo: float, hi: float) -> None:
        """Re-bins the counts onto ``[lo, hi]`` (wider than the current range), each old bin to its centre's bin."""
        # Widen by a margin so that a slowly growing range is not re-binned (and smeared) on every batch.
        span = hi - lo
        lo = lo - 0.1 * span if lo < self.lo else lo
        hi = hi + 0.1 * span if hi > self.hi else hi
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        centers = self.centers
        counts, _ = np.histogram(centers, bins=self.bins, range=(lo, hi), weights=self.counts)
        self.lo, self.hi, self.counts = lo, hi, counts


class HistogramObserver(_Filtered):
    """A :class:`Histogram` of ``bins`` counts per tensor (memory
    independent of the number of batches; ranges re-binned as they grow)."""

    def __init__(self, names: Collection[str] | None = None, bins: int = 2048) -> None:
        super().__init__(names)
        self.bins = bins
        self.histograms: dict[str, Histogram] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        hist = self.histograms.get(name)
        if hist is None:
            hist = self.histograms[name] = Histogram(self.bins)
        hist.add(np.asarray(array))


class ChannelStatsObserver(_Filtered):
    """Per-channel mean and max ``|x|`` over every other axis of every batch.

    Args:
        axes: Tensor name -> its channel axis (e.g. -1 for a MatMul input, 1 for an NCHW Conv input); only these
            tensors are observed.
    """

    def __init__(self, axes: Mapping[str, int]) -> None:
        super().__init__(axes)
        self.axes = dict(axes)
        self._sums: dict[str, np.ndarray] = {}
        self._absmax: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        values = np.asarray(array)
        if values.ndim == 0:
            values = values.reshape(1, 1)
        rows = np.moveaxis(values, self.axes[name], -1).reshape(-1, values.shape[self.axes[name]])
        rows = rows.astype(np.float32, copy=False)
        total = rows.sum(axis=0, dtype=np.float64)
        top = np.abs(rows).max(axis=0).astype(np.float64) if rows.shape[0] else np.zeros(rows.shape[1])
        if name in self._sums and self._sums[name].shape == total.shape:
            self._sums[name] += total
            np.maximum(self._absmax[name], top, out=self._absmax[name])
            self.counts[name] += rows.shape[0]
        else:
            self._sums[name], self._absmax[name], self.counts[name] = total, top, rows.shape[0]

    def mean(self, name: str) -> np.ndarray:
        """``[channels]`` float64 mean."""
        return self._sums[name] / max(self.counts[name], 1)

    def absmax(self, name: str) -> np.ndarray:
        """``[channels]`` float64 max ``|x|``."""
        return self._absmax[name]


class RunSampleObserver(_Sampling):
    """A uniform sample of at most ``max_tokens`` token rows per tensor, and per-channel min/max of their runs.

    Dynamic quantization (``DynamicQuantizeLinear``) takes its range from the whole tensor of one run; a sampled row
    keeps the index of its run, and the run's per-channel minimum and maximum are kept while a sampled row refers
    to them, so that the range of any per-channel scaling of the tensor (``x * c`` with ``c >= 0``) in that run is
    known exactly: ``[min_j(min_j * c_j), max_j(max_j * c_j)]``.
    """

    def __init__(self, max_tokens: int = 512, names: Collection[str] | None = None, seed: int = 0) -> None:
        super().__init__(max_tokens, names, seed)
        self._rows: dict[str, np.ndarray] = {}
        self._runs_of_rows: dict[str, np.ndarray] = {}
        self._extremes: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
        self._run_count: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        if not self.wants(name):
            return
        rows = _rows(array)
        if rows.shape[0] == 0:
            return
        run = self._run_count.get(name, 0)
        self._run_count[name] = run + 1
        sample = self._rows.get(name, np.empty((0, rows.shape[1]), dtype=np.float32))
        runs = self._runs_of_rows.get(name, np.empty(0, dtype=np.int64))
        if sample.shape[1] != rows.shape[1]:
            return  # a tensor whose width changes between runs has no per-channel statistics
        sample, self._seen[name], where = _reservoir(sample, rows, self._seen.get(name, 0), self.max_tokens, self.seed)
        runs = np.concatenate([runs, np.zeros(sample.shape[0] - runs.shape[0], dtype=np.int64)])
        runs[where[where >= 0]] = run
        self._rows[name], self._runs_of_rows[name] = sample, runs
        extremes = self._extremes.setdefault(name, {})
        if run in runs:
            extremes[run] = (rows.min(axis=0).astype(np.float32), rows.max(axis=0).astype(np.float32))
        for old in [r for r in extremes if r != run and r not in set(runs.tolist())]:
            del extremes[old]

    def has(self, name: str) -> bool:
        """Whether rows of ``name`` were seen."""
        return name in self._rows and self._rows[name].shape[0] > 0

    def sample(self, name: str) -> np.ndarray:
        """``[tokens, channels]`` float32."""
        return self._rows[name]

    def run_extremes(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(run_of_row [tokens], mins [runs, channels], maxs [runs, channels])``: each sampled row's run (an index
        into the two arrays) and the per-channel extremes of those runs."""
        extremes = self._extremes[name]
        order = sorted(extremes)
        index = {run: i for i, run in enumerate(order)}
        mins = np.stack([extremes[r][0] for r in order])
        maxs = np.stack([extremes[r][1] for r in order])
        rows = np.array([index[int(r)] for r in self._runs_of_rows[name]], dtype=np.int64)
        return rows, mins, maxs

    def runs(self, name: str) -> int:
        return self._run_count.get(name, 0)
