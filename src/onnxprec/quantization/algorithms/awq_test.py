"""AWQ-lite (joint scale search over weights sharing an input) and the output-aware clip search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxprec.quantization.algorithms.awq import awq_clip, awq_lite, awq_weight_stat, block_gram
from onnxprec.quantization.algorithms.rtn import QuantGrid, quantize_rtn, reconstruction_error


def _llm_like(t: int, k: int, seed: int) -> np.ndarray:
    """Gaussian tokens with a few outlier channels (x20), like LLM activations."""
    rng = np.random.default_rng(seed)
    gain = np.ones(k, np.float32)
    gain[rng.choice(k, max(1, k // 32), replace=False)] = 20.0
    return (rng.standard_normal((t, k)) * gain).astype(np.float32)


def _weights(k: int, ns: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32) for n in ns]


def test_weight_stat_matches_loop_over_real_k_blocks() -> None:
    # K=80 with block 32: two full blocks and a partial one; two weights of different widths share the input.
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((80, 3)).astype(np.float32), rng.standard_normal((80, 5)).astype(np.float32)]
    weights[1][64:, 2] = 0.0  # an all-zero (partial) block contributes 0
    expected = np.zeros(80)
    for w in weights:
        for k in range(80):
            rows = slice(k // 32 * 32, min(k // 32 * 32 + 32, 80))
            for n in range(w.shape[1]):
                block_max = np.abs(w[rows, n]).max()
                expected[k] += abs(w[k, n]) / block_max if block_max > 0 else 0.0
    expected /= 8
    np.testing.assert_allclose(awq_weight_stat(weights, 32), expected, rtol=1e-5)
    # ModelOpt's reshape(block_size, -1) takes the max over strided rows instead: a different statistic
    w = weights[0][:64]
    strided = np.abs(w) / np.abs(w.reshape(32, -1)).max(axis=0).reshape(2, 3).repeat(32, axis=0)
    assert not np.allclose(strided.mean(axis=1), awq_weight_stat([w], 32), rtol=1e-3)


def _normalised_loss(weights: list[np.ndarray], x: np.ndarray, s: np.ndarray, bs: int, symmetric: bool) -> float:
    total = 0.0
    for w in weights:
        y = x @ w
        y_hat = (x / s) @ quantize_rtn(w * s[:, None], bs, symmetric=symmetric).dequantize()
        total += float(np.sum((y - y_hat) ** 2) / np.sum(y**2))
    return total


@pytest.mark.parametrize("t", [96, 300])  # T < K uses the tokens, T > K their Gram matrix
@pytest.mark.parametrize("symmetric", [True, False])
def test_awq_lite_joint_search_with_outlier_channels(t: int, symmetric: bool) -> None:
    k = 128
    x = _llm_like(t, k, seed=1)
    act = np.abs(_llm_like(2000, k, seed=1)).mean(axis=0)
    weights = _weights(k, [48, 48, 80], seed=2)  # e.g. q, k, v sharing one input
    result = awq_lite(weights, act, x, 32, QuantGrid(symmetric=symmetric))
    assert result.alpha is not None and 0 < result.alpha <= 1
    assert result.loss < 0.6 * result.loss_rtn
    assert result.scales.shape == (k,) and result.scales.dtype == np.float32
    # the reported losses are the definition: sum over weights of ||xW - (x/s) Q(diag(s) W)||^2 / ||xW||^2
    assert result.loss == pytest.approx(_normalised_loss(weights, x, result.scales, 32, symmetric), rel=1e-3)
    assert result.loss_rtn == pytest.approx(_normalised_loss(weights, x, np.ones(k), 32, symmetric), rel=1e-3)
    assert result.loss == min(result.losses)
    # scales are act^a / w_stat^(1-a), normalised by sqrt(max * min): the outlier channels get the largest ones
    assert math.isclose(float(result.scales.max() * result.scales.min()), 1.0, rel_tol=1e-4)
    outliers = act > 5 * np.median(act)
    assert result.scales[outliers].min() > result.scales[~outliers].max()


def test_awq_lite_scores_a_strided_subset_of_wide_weights() -> None:
    """The loss of each candidate is the definition on every ``ceil(N / search_columns)``-th column of each weight
    (narrower weights whole); on these weights the subset chooses the alpha the full search chooses."""
    k = 128
    x = _llm_like(96, k, seed=1)
    act = np.abs(_llm_like(2000, k, seed=1)).mean(axis=0)
    weights = _weights(k, [40, 700], seed=2)
    full = awq_lite(weights, act, x, 32, search_columns=None)
    part = awq_lite(weights, act, x, 32, search_columns=64)
    assert part.alpha == full.alpha and np.array_equal(part.scales, full.scales)
    subset = [weights[0], weights[1][:, ::11]]  # 700 columns -> every 11th (64 of them); 40 stay whole
    assert part.loss == pytest.approx(_normalised_loss(subset, x, part.scales, 32, True), rel=1e-3)
    assert part.loss_rtn == pytest.approx(_normalised_loss(subset, x, np.ones(k), 32, True), rel=1e-3)
    with pytest.raises(ValueError, match="search_columns"):
        awq_lite(weights, act, x, 32, search_columns=0)


def test_awq_lite_never_worse_than_rtn_on_misleading_statistics() -> None:
    # Activation statistics that do not match the sample: every alpha > 0 hurts; RTN must be kept.
    k = 64
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, k)).astype(np.float32)
    act = np.ones(k, np.float32)
    act[:4] = 1e4  # claims outliers the sample does not have
    weights = _weights(k, [32], seed=4)
    result = awq_lite(weights, act, x, 32, alpha_grid=[0.5, 1.0])
    assert result.loss <= result.loss_rtn
    assert result.alpha is None and (result.scales == 1).all() and result.loss == result.loss_rtn
    assert all(loss > result.loss_rtn for loss in result.losses)


def test_awq_lite_validates_shapes() -> None:
    w = np.ones((64, 8), np.float32)
    with pytest.raises(ValueError, match="Shape mismatch"):
        awq_lite([w], np.ones(32), np.ones((10, 64)), 32)
    with pytest.raises(ValueError, match="Shape mismatch"):
        awq_lite([w, np.ones((32, 8))], np.ones(64), np.ones((10, 64)), 32)


def test_block_gram() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 50)).astype(np.float32)
    gram = block_gram(x, 32)
    assert gram.shape == (2, 32, 32)
    np.testing.assert_allclose(gram[0], x[:, :32].T @ x[:, :32], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gram[1, :18, :18], x[:, 32:].T @ x[:, 32:], rtol=1e-5, atol=1e-4)
    assert (gram[1, 18:] == 0).all()


@pytest.mark.parametrize("symmetric", [True, False])
def test_awq_clip_beats_rtn_on_the_sample(symmetric: bool) -> None:
    k, n, bs = 200, 40, 32  # K not a multiple of the block size
    x = _llm_like(256, k, seed=6)
    (w,) = _weights(k, [n], seed=7)
    ratios = awq_clip(w, x, bs, QuantGrid(symmetric=symmetric), chunk_columns=16)
    assert ratios.shape == (math.ceil(k / bs), n) and ratios.min() >= 0.5 and ratios.max() == 1.0
    plain = quantize_rtn(w, bs, symmetric=symmetric)
    clipped = quantize_rtn(w, bs, symmetric=symmetric, clip_ratios=ratios)

    def block_partial(qw: np.ndarray) -> np.ndarray:
        d = np.zeros((7 * bs, n), np.float32)
        d[:k] = w - qw
        xp = np.zeros((256, 7 * bs), np.float32)
        xp[:, :k] = x
        return np.stack([((xp[:, b * bs : (b + 1) * bs] @ d[b * bs : (b + 1) * bs]) ** 2).sum(0) for b in range(7)])

    # guaranteed per (block, column); the full output error (cross-block terms included) drops as well
    assert (block_partial(clipped.dequantize()) <= block_partial(plain.dequantize()) * (1 + 1e-5)).all()
    assert reconstruction_error(w, clipped, x) < 0.95 * reconstruction_error(w, plain, x)
    # and it beats the weight-MSE clip search on the output error it targets
    mse = quantize_rtn(w, bs, symmetric=symmetric, clip_search=True)
    assert reconstruction_error(w, clipped, x) < reconstruction_error(w, mse, x)


def test_awq_clip_chunks_and_scales() -> None:
    k, n = 96, 50
    x = _llm_like(64, k, seed=8)
    (w,) = _weights(k, [n], seed=9)
    one_chunk = awq_clip(w, x, 32, chunk_columns=1000)
    np.testing.assert_array_equal(awq_clip(w, x, 32, chunk_columns=7), one_chunk)
    s = np.random.default_rng(10).uniform(0.5, 2.0, k).astype(np.float32)
    np.testing.assert_array_equal(awq_clip(w * s[:, None], x, 32, awq_scales=s), awq_clip(w * s[:, None], x / s, 32))
    with pytest.raises(ValueError, match="K="):
        awq_clip(w, x[:, :64], 32)
