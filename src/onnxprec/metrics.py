"""Output metrics, each written once: errors against a reference, agreement, and perplexity.

The one-shot functions (:func:`max_abs`, :func:`rel_l2`, :func:`cosine`, :func:`top1_agreement`,
:func:`perplexity`) are thin wrappers over streaming accumulators (:class:`ErrorStats`, :class:`Perplexity`)
that add batches one at a time, so large outputs and many batches never sit in memory together. All sums are
in float64; non-finite candidate values are counted and excluded from the sums. A place where one side is finite
and the other not (an FP32 -inf the candidate lost, or an overflow), or where both are non-finite but differ (-inf
against +inf), is a divergence of unbounded size: ``mismatched`` counts them, and max_abs and rel_l2 are then inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "ErrorStats",
    "Perplexity",
    "compare",
    "cosine",
    "kl_divergence",
    "max_abs",
    "nll_sum",
    "perplexity",
    "rel_l2",
    "top1_agreement",
]

_PART_ELEMENTS = 1 << 22  # ~4M values (32 MiB in float64) per step


@dataclass
class ErrorStats:
    """Streaming error statistics of a candidate output against its reference, batch by batch.

    Args:
        track_top1: Also count argmax agreement along the last axis (classifier or LM logits).
        track_kl: Also average the KL divergence ``KL(softmax(reference) || softmax(candidate))`` of the rows along
            the last axis (logits; in nats per row, as ModelOpt reports for LLMs).
    """

    track_top1: bool = False
    track_kl: bool = False
    max_abs: float = 0.0
    nonfinite: int = 0
    mismatched: int = 0
    count: int = 0
    _d2: float = 0.0
    _r2: float = 0.0
    _c2: float = 0.0
    _rc: float = 0.0
    _agree: int = 0
    _rows: int = 0
    _kl: float = 0.0
    _kl_rows: int = 0

    def update(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        """Adds one batch (any float dtypes, same shape)."""
        ref = np.asarray(reference)
        cand = np.asarray(candidate)
        if ref.shape != cand.shape:
            raise ValueError(f"reference shape {ref.shape} and candidate shape {cand.shape} differ")
        if ref.size == 0:
            return  # an empty tensor (a zero-length axis, e.g. an empty past's slice): nothing to compare
        last = ref.shape[-1] if ref.ndim else 1
        ref = ref.reshape(-1, last)
        cand = cand.reshape(-1, last)
        parts = max(1, ref.size // _PART_ELEMENTS)
        for r, c in zip(np.array_split(ref, parts), np.array_split(cand, parts)):
            r64 = r.astype(np.float64)
            c64 = c.astype(np.float64)
            if not self._add_finite(r64, c64):
                finite = np.isfinite(c64)
                ref_finite = np.isfinite(r64)
                self.nonfinite += int(finite.size - finite.sum())
                if not (finite.all() and ref_finite.all()):
                    with np.errstate(invalid="ignore"):
                        same = (c64 == r64) | (np.isnan(c64) & np.isnan(r64))
                    self.mismatched += int(((finite != ref_finite) | (~finite & ~ref_finite & ~same)).sum())
                c64 = np.where(finite, c64, 0.0)
                r64 = np.where(ref_finite, r64, 0.0)
                d = c64 - r64
                if d.size:
                    self.max_abs = max(self.max_abs, float(np.abs(d).max()))
                if self.mismatched:
                    self.max_abs = math.inf
                self._d2 += float((d * d).sum())
                self._r2 += float((r64 * r64).sum())
                self._c2 += float((c64 * c64).sum())
                self._rc += float((r64 * c64).sum())
            if self.track_top1 and r.shape[0]:
                self._agree += int((r64.argmax(-1) == c64.argmax(-1)).sum())
                self._rows += r.shape[0]
            if self.track_kl and r.shape[0]:
                log_p, log_q = _log_softmax(r64), _log_softmax(c64)
                self._kl += float((np.exp(log_p) * (log_p - log_q)).sum())
                self._kl_rows += r.shape[0]
        self.count += ref.size

    def _add_finite(self, r64: np.ndarray, c64: np.ndarray) -> bool:
        """The sums of one part when both sides are finite (False, nothing added, otherwise): the same float64
        products and sums as the general case, in one scratch array (float32-range squares cannot overflow float64,
        so a finite sum of squares proves every value finite)."""
        with np.errstate(over="ignore"):  # an overflow goes the general way, which warns as before
            scratch = np.multiply(r64, r64)
            r2 = float(scratch.sum())
            np.multiply(c64, c64, out=scratch)
            c2 = float(scratch.sum())
        if not (math.isfinite(r2) and math.isfinite(c2)):
            return False
        np.multiply(r64, c64, out=scratch)
        rc = float(scratch.sum())
        np.subtract(c64, r64, out=scratch)
        if scratch.size:
            self.max_abs = max(self.max_abs, float(scratch.max()), -float(scratch.min()))
        np.multiply(scratch, scratch, out=scratch)
        self._d2 += float(scratch.sum())
        self._r2 += r2
        self._c2 += c2
        self._rc += rc
        return True

    @property
    def rel_l2(self) -> float:
        """``||cand - ref|| / ||ref||`` (``||cand - ref||`` when the reference is all zeros); inf when finite and
        non-finite values do not match (``mismatched``)."""
        if self.mismatched:
            return math.inf
        return math.sqrt(self._d2) / math.sqrt(self._r2) if self._r2 > 0 else math.sqrt(self._d2)

    @property
    def cosine(self) -> float:
        """Cosine similarity of the flattened outputs (1.0 when both are all zeros)."""
        if self._r2 == 0 and self._c2 == 0:
            return 1.0
        return self._rc / math.sqrt(self._r2 * self._c2) if self._r2 > 0 and self._c2 > 0 else 0.0

    @property
    def top1(self) -> float | None:
        """Fraction of rows whose argmax agrees (None unless ``track_top1`` was asked for)."""
        return self._agree / self._rows if self._rows else None

    @property
    def kl(self) -> float | None:
        """Mean KL divergence of the candidate's softmax from the reference's, per row (None unless ``track_kl``)."""
        return self._kl / self._kl_rows if self._kl_rows else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "cosine": self.cosine,
            "nonfinite": self.nonfinite,
        }
        if self.top1 is not None:
            out["top1"] = self.top1
        if self.kl is not None:
            out["kl"] = self.kl
        return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Log-softmax of the rows of ``x`` ``[rows, classes]`` (float64)."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare(reference: np.ndarray, candidate: np.ndarray, *, top1: bool = False, kl: bool = False) -> dict[str, Any]:
    """max_abs, rel_l2, cosine, nonfinite (and top1, kl) of one candidate output against its reference."""
    stats = ErrorStats(track_top1=top1, track_kl=kl)
    stats.update(reference, candidate)
    return stats.as_dict()


def max_abs(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Largest absolute difference (non-finite candidate values excluded; see :class:`ErrorStats`)."""
    return float(compare(reference, candidate)["max_abs"])


def rel_l2(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Relative L2 error ``||cand - ref|| / ||ref||``; inf when the candidate has non-finite values."""
    result = compare(reference, candidate)
    return math.inf if result["nonfinite"] else float(result["rel_l2"])


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Cosine similarity of the flattened outputs."""
    return float(compare(reference, candidate)["cosine"])


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Fraction of rows (all axes but the last) whose argmax over the last axis agrees."""
    value = compare(reference, candidate, top1=True)["top1"]
    return float(value) if value is not None else 1.0


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean KL divergence ``KL(softmax(reference) || softmax(candidate))`` of the rows (all axes but the last) of
    two logits arrays, in nats."""
    value = compare(reference, candidate, kl=True)["kl"]
    return float(value) if value is not None else 0.0


_NLL_CHUNK = 1 << 21
"""The most float64 values :func:`nll_sum` holds at once (16 MiB: a few dozen positions of an LLM's vocabulary)."""


def nll_sum(logits: np.ndarray, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> tuple[float, int]:
    """(sum of next-token negative log-likelihoods, predicted tokens): ``logits[:, :-1]`` predict ``ids[:, 1:]``.

    Args:
        logits: ``[B, S, V]`` (any float dtype).
        ids: ``[B, S]`` token ids.
        attention_mask: ``[B, S]``; positions whose target is masked (0) are not counted.

    Stable log-softmax in float64, a few positions at a time (at most :data:`_NLL_CHUNK` values) to bound memory.
    """
    logits = np.asarray(logits)
    ids = np.asarray(ids)
    if logits.ndim != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(f"logits {logits.shape} and ids {ids.shape} do not match as [B,S,V] and [B,S]")
    total, count = 0.0, 0
    rows = max(1, _NLL_CHUNK // max(logits.shape[2], 1))
    for b in range(logits.shape[0]):
        target = ids[b, 1:]
        keep = np.ones(target.shape, dtype=bool) if attention_mask is None else np.asarray(attention_mask)[b, 1:] > 0
        nll = np.empty(target.shape, dtype=np.float64)
        for start in range(0, target.shape[0], rows):
            stop = min(start + rows, target.shape[0])
            x = logits[b, start:stop].astype(np.float64)
            picked = x[np.arange(stop - start), target[start:stop]]
            top = x.max(axis=-1, keepdims=True)
            np.exp(np.subtract(x, top, out=x), out=x)
            nll[start:stop] = np.log(x.sum(axis=-1)) + top[:, 0] - picked
        total += float(nll[keep].sum())
        count += int(keep.sum())
    return total, count


@dataclass
class Perplexity:
    """Streaming perplexity over token windows: add each batch's logits and ids, then read :attr:`value`."""

    nll: float = 0.0
    tokens: int = 0

    def update(self, logits: np.ndarray, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> None:
        total, count = nll_sum(logits, ids, attention_mask)
        self.nll += total
        self.tokens += count

    @property
    def value(self) -> float:
        """``exp(mean NLL)``; inf for a hopeless model (never an OverflowError), nan with no tokens."""
        if not self.tokens:
            return math.nan
        mean = self.nll / self.tokens
        return math.exp(mean) if mean < 700 else math.inf


def perplexity(logits: np.ndarray, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> float:
    """``exp(mean next-token cross-entropy)`` of ``logits`` [B, S, V] against ``ids`` [B, S]."""
    accumulator = Perplexity()
    accumulator.update(logits, ids, attention_mask)
    return accumulator.value
