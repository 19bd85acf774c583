"""Tests of the observers against direct numpy computations over all batches at once."""

from __future__ import annotations

import numpy as np
import pytest

from onnxprec.observers import (
    ChannelAbsMeanObserver,
    FirstBatchObserver,
    GramObserver,
    RangeObserver,
    TokenSampleObserver,
)


def _batches(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 5, 8)).astype(np.float32) * (i + 1) for i in range(4)]


def test_streamed_statistics_equal_the_statistics_of_all_tokens() -> None:
    batches = _batches()
    rows = np.concatenate([b.reshape(-1, 8) for b in batches]).astype(np.float64)
    absmean, gram, ranges = ChannelAbsMeanObserver(), GramObserver(), RangeObserver()
    for b in batches:
        for observer in (absmean, gram, ranges):
            observer.update("x", b)
    np.testing.assert_allclose(absmean.mean("x"), np.abs(rows).mean(0), rtol=1e-6)
    np.testing.assert_allclose(gram.gram["x"], rows.T @ rows, rtol=1e-10)
    assert gram.tokens["x"] == absmean.tokens["x"] == 40
    stats = ranges.stats["x"]
    assert (stats.min, stats.max, stats.batches) == (rows.min(), rows.max(), 4)


def test_observers_ignore_names_they_were_not_given() -> None:
    observer = ChannelAbsMeanObserver(names={"a"})
    observer.update("b", np.ones((2, 3), np.float32))
    observer.update("a", np.ones((2, 3), np.float32))
    assert set(observer.tokens) == {"a"}
    first = FirstBatchObserver()
    first.update("a", np.zeros(2))
    first.update("a", np.ones(2))
    np.testing.assert_array_equal(first.arrays["a"], np.zeros(2))


@pytest.mark.slow
def test_token_reservoir_is_bounded_uniform_and_aligned() -> None:
    observer = TokenSampleObserver(max_tokens=16, seed=3)
    tokens = []
    for i in range(50):  # 50 batches of 4 tokens; token value = its global index
        batch = np.arange(4 * i, 4 * i + 4, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
        tokens.append(batch)
        observer.update("x", batch)
        observer.update("y", 2 * batch)
    sample = observer.sample("x")
    assert sample.shape == (16, 3) and observer.seen("x") == 200
    assert len(set(sample[:, 0].tolist())) == 16  # no duplicates
    assert sample[:, 0].max() > 100  # later tokens get in (not just the first 16)
    np.testing.assert_array_equal(observer.sample("y"), 2 * sample)  # same positions for same-shaped tensors
    # Uniformity: over many seeds, each token is kept with probability 16/200.
    hits = np.zeros(200)
    for seed in range(200):
        obs = TokenSampleObserver(max_tokens=16, seed=seed)
        for batch in tokens:
            obs.update("x", batch)
        hits[obs.sample("x")[:, 0].astype(int)] += 1
    first, last = hits[:100].sum(), hits[100:].sum()
    assert abs(first - last) / (first + last) < 0.1
    with pytest.raises(ValueError, match="positive"):
        TokenSampleObserver(max_tokens=0)


def test_a_float16_sample_of_values_beyond_float16_keeps_them_in_float32() -> None:
    """Regression: INT4's samples are float16 (activation_stats.SAMPLE_DTYPE); an activation past 65504 became inf
    and AWQ failed with a traceback ("x_sample has NaN or infinite values")."""
    observer = TokenSampleObserver(max_tokens=8, names=["big", "small"], dtype=np.float16)
    rng = np.random.default_rng(0)
    small = rng.standard_normal((1, 4, 3)).astype(np.float32)
    observer.update("big", small)  # in range: stored as float16 so far
    big = small.copy()
    big[0, 0, 0] = 1e5
    observer.update("big", big)
    observer.update("small", small)
    assert observer.sample("big").dtype == np.float32 and np.isfinite(observer.sample("big")).all()
    assert observer.sample("big").max() == np.float32(1e5) and observer.sample("big").shape == (8, 3)
    assert observer.sample("small").dtype == np.float16
    np.testing.assert_array_equal(observer.sample("small"), small.reshape(-1, 3).astype(np.float16))
