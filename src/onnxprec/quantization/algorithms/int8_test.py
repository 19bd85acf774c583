"""INT8 numerics: ranges from streamed histograms, weights, dynamic quantization (against ONNX Runtime), bias
correction, outlier split and SmoothQuant."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.errors import InvalidArgumentError
from onnxprec.observers import Histogram, RunSampleObserver
from onnxprec.quantization.algorithms import int8 as int8_algorithms
from onnxprec.quantization.algorithms.int8 import (
    QMAX,
    bias_correction,
    dequantize_weight,
    fake_dynamic,
    fake_static,
    gptq_per_channel,
    quantize_weight,
)
from onnxprec.quantization.algorithms.qtypes import FP8
from onnxprec.quantization.algorithms.ranges import calibrated_range, scale_zero_point
from onnxprec.quantization.algorithms.smoothquant import RunSample, decide_channels, smooth_scales


def _hist(*batches: np.ndarray) -> Histogram:
    hist = Histogram(bins=1024)
    for batch in batches:
        hist.add(batch)
    return hist


def test_histogram_keeps_every_value_when_the_range_grows_a_million_fold() -> None:
    rng = np.random.default_rng(0)
    small, large = rng.normal(0, 1e-6, 1000), rng.normal(0, 1.0, 1000)
    hist = _hist(small, large, np.array([np.nan, np.inf]))
    assert hist.total == 2000 and hist.nonfinite == 2
    assert hist.min == min(small.min(), large.min()) and hist.max == max(small.max(), large.max())
    for method in ("max", "entropy", "percentile", "mse"):  # ONNX Runtime's entropy fails on this data
        lo, hi = calibrated_range(hist, method)
        assert lo < 0 < hi and hi <= hist.max + 1e-9 and lo >= hist.min - 1e-9


def test_ranges_of_a_gaussian() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000)
    hist = _hist(x)
    lo, hi = calibrated_range(hist, "max")
    assert (lo, hi) == (x.min(), x.max())
    _, p_hi = calibrated_range(hist, "percentile", percentile=99.0)
    assert abs(p_hi - np.percentile(np.abs(x), 99.0)) < 0.02
    for method in ("entropy", "mse"):  # both clip a Gaussian's tails: 8-bit error is dominated by rounding
        m_lo, m_hi = calibrated_range(hist, method, symmetric=True)
        assert m_lo == -m_hi and 2.5 < m_hi < x.max()


def test_entropy_does_not_clip_a_mostly_zero_relu6_tensor() -> None:
    rng = np.random.default_rng(2)
    x = np.clip(rng.normal(0.5, 2.0, 100_000), 0, 6)
    x[:75_000] = 0.0  # 75 % exact zeros, as after ReLU6 in EfficientNet
    lo, hi = calibrated_range(_hist(x), "entropy")
    assert lo == 0.0 and hi > 4.0


def test_range_method_and_percentile_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="Unknown calibration method"):
        calibrated_range(_hist(np.ones(3)), "kl")
    with pytest.raises(InvalidArgumentError, match="percentile"):
        calibrated_range(_hist(np.ones(3)), "percentile", percentile=0)
    assert calibrated_range(Histogram(), "entropy") == (0.0, 0.0)
    assert scale_zero_point(0.0, 0.0, symmetric=False) == (1.0, 0)


@pytest.mark.parametrize("lo, hi", [(-1.0, 3.0), (0.0, 6.0), (-2.0, 0.0)])
def test_zero_is_exact_and_the_range_is_covered(lo: float, hi: float) -> None:
    scale, zero_point = scale_zero_point(lo, hi, symmetric=False)
    assert 0 <= zero_point <= 255
    assert fake_static(np.array([0.0]), scale, zero_point)[0] == 0.0
    ends = fake_static(np.array([lo, hi]), scale, zero_point)
    assert np.allclose(ends, [lo, hi], atol=scale / 2 + 1e-9)


def test_weights_per_channel_along_any_axis() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * np.array([1, 10, 0.1, 0])[:, None, None, None]
    q, scales = quantize_weight(w, axis=0)
    assert q.dtype == np.int8 and np.abs(q).max() <= QMAX and scales.shape == (4,)
    assert scales[3] == 1.0 and not q[3].any()  # a channel of zeros
    back = dequantize_weight(q, scales, axis=0)
    assert np.all(np.abs(back - w) <= scales[:, None, None, None] / 2 + 1e-7)


def test_fake_dynamic_is_what_onnx_runtime_computes() -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((6, 32)) * 3 + 1).astype(np.float32)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    model = make_model(nodes, [tensor_info("x", F, [6, 32])], [tensor_info("y", F, [6, 32])])
    (expected,) = run(model, {"x": x})
    assert np.allclose(fake_dynamic(x), expected, atol=1e-6)
    # rows from two runs, each quantized with its own run's range
    other = x * 10
    lows, highs = [x.min()] * 6 + [other.min()] * 6, [x.max()] * 6 + [other.max()] * 6
    both = fake_dynamic(np.concatenate([x, other]), lows, highs)
    assert np.allclose(both[:6], expected, atol=1e-6) and np.allclose(both[6:], fake_dynamic(other), atol=1e-5)


def test_bias_correction_cancels_the_mean_shift() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((500, 16)) + 3.0  # a large mean, as after GELU or ReLU
    w = rng.standard_normal((16, 8))
    q, s = quantize_weight(w, axis=1)
    wq = dequantize_weight(q, s, axis=1)
    shift = (x @ wq - x @ w).mean(axis=0)
    corrected = (x @ wq + bias_correction(x.mean(axis=0), w, wq) - x @ w).mean(axis=0)
    assert np.abs(corrected).max() < 1e-9 < np.abs(shift).max()


def _sample(x: np.ndarray, runs: int = 4) -> RunSample:
    observer = RunSampleObserver(max_tokens=10_000)
    for piece in np.array_split(x, runs):
        observer.update("x", piece)
    rows, mins, maxs = observer.run_extremes("x")
    return RunSample(observer.sample("x"), rows, mins, maxs)


def test_run_sample_keeps_each_rows_run_extremes() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    x[30:] *= 100
    sample = _sample(x)
    assert sample.rows.shape == (40, 5)
    for row, index in zip(sample.rows, sample.run_of_row):
        piece = np.array_split(x, 4)[index]
        assert np.any(np.all(piece == row, axis=1))
        assert np.array_equal(sample.maxs[index], piece.max(axis=0))
    small = RunSampleObserver(max_tokens=8)
    for piece in np.array_split(x, 4):
        small.update("x", piece)
    runs, mins, _ = small.run_extremes("x")
    assert small.sample("x").shape == (8, 5) and len(mins) == len(set(runs.tolist())) <= 4


def test_outlier_split_takes_the_outlier_channel_and_lowers_the_error() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    x[:, 5] *= 60.0  # one channel sets every run's range
    w = rng.standard_normal((64, 32)).astype(np.float32)
    decision = decide_channels(_sample(x), [w], np.abs(x).max(axis=0), smooth=False)
    assert 5 in decision.split.tolist() and decision.split.size <= 8
    assert decision.errors["final"] < decision.errors["plain"] / 4
    assert decision.factors(64)[5] == 0.0 and decision.weight_rows(64)[5] == 0.0


def test_smoothquant_scales_and_a_search_that_keeps_plain_when_nothing_helps() -> None:
    assert np.allclose(smooth_scales(np.array([4.0, 1.0, 0.0]), np.array([1.0, 4.0, 2.0]), 0.5), [2.0, 0.5, 1.0])
    rng = np.random.default_rng(8)
    x = rng.standard_normal((256, 32)).astype(np.float32)  # no outliers: nothing to smooth or split
    w = rng.standard_normal((32, 16)).astype(np.float32)
    decision = decide_channels(_sample(x), [w], np.abs(x).max(axis=0))
    assert decision.split.size == 0 and decision.scales is None
    assert decision.errors["final"] == pytest.approx(decision.errors["plain"])


def test_smoothquant_helps_channels_of_different_scales() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((512, 64)).astype(np.float32) * np.geomspace(0.05, 20, 64).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    decision = decide_channels(_sample(x, runs=8), [w], np.abs(x).max(axis=0), split=False)
    assert decision.scales is not None and decision.alpha is not None
    assert decision.errors["final"] < 0.9 * decision.errors["plain"]


def test_gptq_rounding_lowers_the_output_error_and_keeps_dead_inputs() -> None:
    rng = np.random.default_rng(10)
    mixing = rng.standard_normal((24, 24))
    x = rng.standard_normal((2000, 24)) @ mixing  # correlated inputs
    x[:, 3] = 0.0  # an input that never fires
    w = rng.standard_normal((2, 24, 6))
    h = np.stack([x.T @ x] * 2)
    q, scales = gptq_per_channel(w, h)
    assert q.dtype == np.int8 and np.abs(q).max() <= QMAX and scales.shape == (2, 6)
    rtn_q, rtn_scales = quantize_weight(w[0], axis=1)
    assert np.allclose(scales[0], rtn_scales)  # GPTQ picks roundings, not scales
    held_out = rng.standard_normal((500, 24)) @ mixing  # other rows of the same distribution
    held_out[:, 3] = 0.0
    for g in range(2):
        ref = held_out @ w[g]
        gptq_error = np.linalg.norm(held_out @ dequantize_weight(q[g], scales[g], axis=1) - ref)
        rtn_error = np.linalg.norm(held_out @ dequantize_weight(*quantize_weight(w[g], axis=1), axis=1) - ref)
        assert gptq_error < 0.8 * rtn_error
    assert np.array_equal(q[0, 3], rtn_q[3])  # the dead input is rounded to nearest, not zeroed


def test_gptq_lazy_blocks_round_as_one_row_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((900, 300)) @ rng.standard_normal((300, 300))
    w = rng.standard_normal((1, 300, 5))
    h = (x.T @ x)[None]
    monkeypatch.setattr(int8_algorithms, "GPTQ_BLOCK", 1)  # every row's error applied before the next is rounded
    single, single_scales = gptq_per_channel(w, h)
    for block in (7, 128, 300):
        monkeypatch.setattr(int8_algorithms, "GPTQ_BLOCK", block)
        q, scales = gptq_per_channel(w, h)
        assert np.array_equal(q, single) and np.array_equal(scales, single_scales)


def test_gptq_on_a_given_grid_keeps_it_and_carries_the_clipped_error_onward() -> None:
    rng = np.random.default_rng(12)
    mixing = rng.standard_normal((32, 32))
    x = rng.standard_normal((3000, 32)) @ mixing
    w = rng.standard_normal((1, 32, 6))
    h = (x.T @ x)[None]
    grid = (np.abs(w).max(axis=1) / QMAX * 0.7).astype(np.float32)  # the largest weights clip
    q, scales = gptq_per_channel(w, h, scales=grid)
    assert np.array_equal(scales, grid) and np.abs(q).max() <= QMAX
    assert (np.abs(q) == QMAX).any()
    rtn = np.clip(np.rint(w[0] / grid[0]), -QMAX, QMAX) * grid[0]
    ref = x @ w[0]
    gptq_error = np.linalg.norm(x @ (q[0] * grid[0]) - ref)
    assert gptq_error < 0.9 * np.linalg.norm(x @ rtn - ref)


def test_gptq_on_fp8_levels_keeps_the_grid_and_lowers_the_held_out_error() -> None:
    rng = np.random.default_rng(13)
    mixing = rng.standard_normal((48, 48))
    x = np.maximum(rng.standard_normal((3000, 48)) @ mixing, 0.0)  # correlated, non-negative (after a ReLU)
    w = rng.standard_normal((48, 8))
    levels, grid = FP8.quantize_weight(w, axis=1)  # round to nearest, each channel's aligned scale
    q, scales = gptq_per_channel(w[None], (x.T @ x)[None], scales=grid[None], qtype=FP8)
    assert q.dtype == FP8.dtype and np.array_equal(scales[0], grid)
    assert np.abs(q.astype(np.float32)).max() <= FP8.qmax
    assert np.array_equal(q[0].astype(np.float32).astype(FP8.dtype), q[0])  # E4M3FN levels, nothing else
    held_out = np.maximum(rng.standard_normal((1000, 48)) @ mixing, 0.0)
    ref = held_out @ w
    gptq_error = np.linalg.norm(held_out @ FP8.dequantize(q[0], grid) - ref)
    rtn_error = np.linalg.norm(held_out @ FP8.dequantize(levels, grid) - ref)
    assert gptq_error < 0.9 * rtn_error  # measured 0.79
