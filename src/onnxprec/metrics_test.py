"""Tests of the metrics against direct numpy formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxprec import metrics


def test_errors_match_the_formulas_and_stream_over_batches() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((6, 5, 7)).astype(np.float32)
    cand = (ref + 0.01 * rng.standard_normal(ref.shape)).astype(np.float16)
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    expected_rel = np.linalg.norm(c - r) / np.linalg.norm(r)
    expected_cos = float((r * c).sum() / (np.linalg.norm(r) * np.linalg.norm(c)))
    assert metrics.rel_l2(ref, cand) == pytest.approx(expected_rel, rel=1e-9)
    assert metrics.cosine(ref, cand) == pytest.approx(expected_cos, rel=1e-12)
    assert metrics.max_abs(ref, cand) == pytest.approx(float(np.abs(c - r).max()))
    agree = float((r.argmax(-1) == c.argmax(-1)).mean())
    assert metrics.top1_agreement(ref, cand) == pytest.approx(agree)
    stream = metrics.ErrorStats(track_top1=True)
    for i in range(0, 6, 2):  # the same numbers batch by batch
        stream.update(ref[i : i + 2], cand[i : i + 2])
    assert stream.rel_l2 == pytest.approx(expected_rel, rel=1e-9)
    assert stream.top1 == pytest.approx(agree)


def test_nonfinite_candidates_are_counted_not_summed() -> None:
    ref = np.ones((2, 3), np.float32)
    cand = ref.copy()
    cand[0, 0] = np.nan
    result = metrics.compare(ref, cand)
    assert result["nonfinite"] == 1 and math.isinf(result["max_abs"])
    assert math.isinf(metrics.rel_l2(ref, cand))


def test_a_reference_inf_the_candidate_lost_is_a_divergence_not_zero_error() -> None:
    """FP32 -inf against a finite candidate (0 here, which the sums used to count as no error) or the reverse, and
    -inf against +inf, diverge without bound; the same non-finite value on both sides is no error."""
    ref = np.array([[-np.inf, 1.0, 2.0, np.nan]], np.float32)
    same = metrics.ErrorStats()
    same.update(ref, ref.copy())
    assert same.mismatched == 0 and same.rel_l2 == 0.0 and same.max_abs == 0.0
    for cand in ([0.0, 1.0, 2.0, np.nan], [np.inf, 1.0, 2.0, np.nan], [-np.inf, -np.inf, 2.0, np.nan]):
        stats = metrics.ErrorStats()
        stats.update(ref, np.array([cand], np.float32))
        assert stats.mismatched == 1 and math.isinf(stats.rel_l2) and math.isinf(stats.max_abs)
    stream = metrics.ErrorStats()
    stream.update(ref[:, 1:3], ref[:, 1:3])
    stream.update(ref[:, :1], np.zeros((1, 1), np.float32))  # a later batch
    assert stream.mismatched == 1 and math.isinf(stream.rel_l2)


def test_perplexity_of_a_uniform_and_a_perfect_model() -> None:
    ids = np.array([[0, 1, 2, 3]])
    uniform = np.zeros((1, 4, 10), np.float32)
    assert metrics.perplexity(uniform, ids) == pytest.approx(10.0)
    perfect = np.full((1, 4, 10), -100.0, np.float32)
    perfect[0, np.arange(3), ids[0, 1:]] = 100.0
    assert metrics.perplexity(perfect, ids) == pytest.approx(1.0)
    mask = np.array([[1, 1, 0, 0]])  # only the first target (ids[1]) counts
    total, count = metrics.nll_sum(uniform, ids, mask)
    assert count == 1 and total == pytest.approx(math.log(10))
    stream = metrics.Perplexity()
    stream.update(uniform, ids)
    stream.update(perfect, ids)
    assert stream.value == pytest.approx(math.exp(3 * math.log(10) / 6))
    with pytest.raises(ValueError, match="do not match"):
        metrics.nll_sum(uniform, ids[:, :3])


def test_nll_sum_in_chunks_of_positions_equals_the_whole_sequence_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    logits = (4 * rng.standard_normal((2, 9, 13))).astype(np.float32)
    ids, mask = rng.integers(0, 13, (2, 9)), rng.integers(0, 2, (2, 9))
    x = logits[:, :-1].astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(x - top).sum(axis=-1)) + top[..., 0] - np.take_along_axis(x, ids[:, 1:, None], -1)[..., 0]
    whole = sum(float(nll[b][mask[b, 1:] > 0].sum()) for b in range(2))
    for chunk in (13, 3 * 13, 1 << 21):  # one position, three, and the whole sequence at a time
        monkeypatch.setattr(metrics, "_NLL_CHUNK", chunk)
        assert metrics.nll_sum(logits, ids, mask) == (whole, int((mask[:, 1:] > 0).sum()))


def test_kl_divergence_matches_numpy_and_streams() -> None:
    rng = np.random.default_rng(1)
    ref = (3 * rng.standard_normal((4, 6, 11))).astype(np.float32)
    cand = (ref + 0.5 * rng.standard_normal(ref.shape)).astype(np.float32)
    p = np.exp(ref.astype(np.float64)) / np.exp(ref.astype(np.float64)).sum(-1, keepdims=True)
    q = np.exp(cand.astype(np.float64)) / np.exp(cand.astype(np.float64)).sum(-1, keepdims=True)
    expected = float((p * np.log(p / q)).sum(-1).mean())
    assert expected > 0.01
    assert metrics.kl_divergence(ref, cand) == pytest.approx(expected, rel=1e-9)
    assert metrics.kl_divergence(ref, ref + 5.0) == pytest.approx(0.0, abs=1e-12)  # a shift changes no probability
    stream = metrics.ErrorStats(track_kl=True)
    for i in range(4):
        stream.update(ref[i : i + 1], cand[i : i + 1])
    assert stream.kl == pytest.approx(expected, rel=1e-9) and stream.as_dict()["kl"] == stream.kl
    assert "kl" not in metrics.compare(ref, cand)


@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_finite_and_nonfinite_parts_give_the_same_sums(bad: float | None) -> None:
    # A part with only finite values is summed in one scratch array, others the general way: the same float64 sums.
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 9)).astype(np.float32)
    cand = ref + rng.standard_normal(ref.shape).astype(np.float32)
    if bad is not None:
        cand[2, 3] = bad
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(c)
    c = np.where(finite, c, 0.0)
    stats = metrics.ErrorStats()
    stats.update(ref, cand)
    assert stats.nonfinite == int((~finite).sum())
    assert stats.max_abs == (float(np.abs(c - r).max()) if bad is None else math.inf)  # inf: a mismatch
    assert (stats._d2, stats._r2, stats._c2, stats._rc) == (
        float(((c - r) * (c - r)).sum()),
        float((r * r).sum()),
        float((c * c).sum()),
        float((r * c).sum()),
    )
