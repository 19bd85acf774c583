"""GPTQ: error propagation along the rows of the upper Cholesky factor, RTN equivalence, act_order, dead channels."""

from __future__ import annotations

import numpy as np
import pytest

from onnxprec.quantization.algorithms.gptq import _inverse_cholesky_upper, gptq, hessian_from_tokens
from onnxprec.quantization.algorithms.rtn import block_params, quantize_rtn, reconstruction_error, to_blocks


def _correlated(t: int, k: int, seed: int) -> np.ndarray:
    """Tokens x = z @ M with a random mixing M: strongly correlated input channels."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((k, k)) / np.sqrt(k)
    return (rng.standard_normal((t, k)) @ mixing).astype(np.float32)


def _output_mse(x: np.ndarray, w: np.ndarray, deq: np.ndarray) -> float:
    return float(np.mean((x @ w - x @ deq) ** 2))


@pytest.mark.slow
@pytest.mark.parametrize(("symmetric", "act_order"), [(True, False), (False, False), (True, True)])
def test_gptq_beats_rtn_on_correlated_inputs(symmetric: bool, act_order: bool) -> None:
    x = _correlated(2048, 256, seed=0)
    w = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    hessian, n = hessian_from_tokens(x)
    rtn = quantize_rtn(w, 32, symmetric=symmetric)
    result = gptq(w, hessian, n, 32, symmetric=symmetric, act_order=act_order)
    assert result.block_size == 32 and result.scales.shape == (8, 64) and result.q.dtype == rtn.q.dtype
    assert (result.zero_points is None) == symmetric
    mse_rtn, mse_gptq = _output_mse(x, w, rtn.dequantize()), _output_mse(x, w, result.dequantize())
    assert mse_gptq < 0.9 * mse_rtn
    assert (result.q != rtn.q).mean() > 0.1
    # GPTQ trades weight error for output error
    assert reconstruction_error(w, result) > reconstruction_error(w, rtn)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(("k", "bs", "lazy_batch"), [(256, 32, 128), (100, 32, 16), (100, -1, 7), (96, 64, 24)])
def test_identity_hessian_equals_rtn(symmetric: bool, k: int, bs: int, lazy_batch: int) -> None:
    w = np.random.default_rng(2).standard_normal((k, 24)).astype(np.float32)
    rtn = quantize_rtn(w, bs, symmetric=symmetric)
    result = gptq(w, np.eye(k) * 3.0, 10, bs, symmetric=symmetric, lazy_batch=lazy_batch)
    np.testing.assert_array_equal(result.q, rtn.q)
    np.testing.assert_array_equal(result.scales, rtn.scales)
    if not symmetric:
        np.testing.assert_array_equal(result.zero_points, rtn.zero_points)


def test_diagonal_hessian_with_act_order_equals_rtn() -> None:
    # a non-trivial permutation (descending diag) but nothing to propagate: un-permuting must give RTN back
    rng = np.random.default_rng(3)
    w = rng.standard_normal((100, 16)).astype(np.float32)
    result = gptq(w, np.diag(rng.uniform(1, 5, 100)), 10, 32, act_order=True, lazy_batch=16)
    np.testing.assert_array_equal(result.q, quantize_rtn(w, 32).q)


def test_inverse_cholesky_factor_is_the_textbook_one() -> None:
    # U upper-triangular with U^T U = (H + damp * mean(diag H) * I)^-1, i.e. torch.linalg.cholesky(Hinv, upper=True)
    x = _correlated(300, 48, seed=12).astype(np.float64)
    h = x.T @ x
    damped = h + 0.01 * np.mean(np.diag(h)) * np.eye(48)
    textbook = np.linalg.cholesky(np.linalg.inv(damped)).T
    upper = _inverse_cholesky_upper(h.copy(), 0.01)
    assert (np.tril(upper, -1) == 0).all() and (np.diag(upper) > 0).all()
    np.testing.assert_allclose(upper, textbook, rtol=1e-6, atol=1e-9 * np.abs(textbook).max())
    np.testing.assert_allclose(upper.T @ upper, np.linalg.inv(damped), rtol=1e-6, atol=1e-12)


def test_update_reads_a_row_of_the_upper_factor() -> None:
    # Quantizing row 0 to dq0 moves the other rows by the OBS update -e0 * Hinv[0, 1:] / Hinv[0, 0], e0 = w0 - dq0:
    # row 1 must be quantized from w1 - e0 * Hinv[0, 1] / Hinv[0, 0]. Reading a column of the upper Cholesky factor
    # of Hinv (the anchors' bug) gives zeros: nothing moves and the result is RTN.
    rng = np.random.default_rng(4)
    k = 16
    w = rng.standard_normal((k, 256)).astype(np.float32)
    z = rng.standard_normal((512, k))
    x = z @ rng.standard_normal((k, k))
    x[:, 1] = x[:, 0] + 0.3 * z[:, 1]  # input 1 follows input 0 closely: row 1 can absorb row 0's error
    h = x.T @ x
    result = gptq(w, h, 2, 16, damp=0.0)  # H = 2 * hessian / n = hessian; one block: scales from the original W
    h_inv = np.linalg.inv(h)
    s = block_params(to_blocks(w, 16))[0][0]
    q0 = np.clip(np.rint(w[0] / s), -8, 7)
    w1 = w[1] - (w[0] - q0 * s) * np.float32(h_inv[0, 1] / h_inv[0, 0])
    q1 = np.clip(np.rint(w1 / s), -8, 7)
    rtn = quantize_rtn(w, 16)
    np.testing.assert_array_equal(result.q[0], rtn.q[0])
    assert (np.rint(w1 / s) != np.rint(w[1] / s)).sum() >= 30  # the update matters for these columns...
    assert (result.q[1] != q1).sum() <= 1  # ...and GPTQ applies it (a rounding tie may differ)
    assert (result.q[1] != rtn.q[1]).sum() >= 30
    assert (result.q[2:] != rtn.q[2:]).mean() > 0.1


def test_lazy_batch_size_does_not_change_the_result() -> None:
    x = _correlated(512, 128, seed=5)
    w = np.random.default_rng(6).standard_normal((128, 32)).astype(np.float32)
    hessian, n = hessian_from_tokens(x)
    base = gptq(w, hessian, n, 32, lazy_batch=128)
    for lazy_batch in (1, 5, 32, 1000):  # batches smaller, unaligned with and larger than the blocks
        other = gptq(w, hessian, n, 32, lazy_batch=lazy_batch)
        assert (other.q != base.q).mean() < 1e-3  # float summation order may flip a rare tie
        np.testing.assert_allclose(other.scales, base.scales, rtol=1e-4)


def test_block_scales_come_from_updated_weights_without_act_order_and_originals_with_it() -> None:
    x = _correlated(512, 128, seed=7)
    w = np.random.default_rng(8).standard_normal((128, 16)).astype(np.float32)
    hessian, n = hessian_from_tokens(x)
    rtn = quantize_rtn(w, 32)
    plain = gptq(w, hessian, n, 32)
    np.testing.assert_array_equal(plain.scales[0], rtn.scales[0])  # nothing propagated into block 0 yet
    assert not np.allclose(plain.scales[1:], rtn.scales[1:])
    ordered = gptq(w, hessian, n, 32, act_order=True)
    np.testing.assert_array_equal(ordered.scales, rtn.scales)  # static, per real block of the original order


def test_dead_channels_and_validation() -> None:
    x = _correlated(256, 64, seed=9)
    x[:, [3, 40]] = 0.0  # inputs that are always zero
    w = np.random.default_rng(10).standard_normal((64, 8)).astype(np.float32)
    hessian, n = hessian_from_tokens(x)
    for act_order in (False, True):
        result = gptq(w, hessian, n, 16, act_order=act_order)
        deq = result.dequantize()
        assert np.isfinite(deq).all() and (deq[[3, 40]] == 0).all()
        assert _output_mse(x, w, deq) < _output_mse(x, w, quantize_rtn(w, 16).dequantize())
    with pytest.raises(ValueError, match="hessian must be"):
        gptq(w, hessian[:32, :32], n, 16)
    with pytest.raises(ValueError, match="n_tokens"):
        gptq(w, hessian, 0, 16)


def test_indefinite_hessian_gets_more_damping(caplog: pytest.LogCaptureFixture) -> None:
    w = np.random.default_rng(11).standard_normal((32, 4)).astype(np.float32)
    hessian = np.ones((32, 32))
    hessian[0, 0] = -1.5  # indefinite: 1% damping is not enough
    result = gptq(w, hessian, 1, 16)
    assert np.isfinite(result.dequantize()).all()
    assert "not positive definite" in caplog.text


def test_overwrite_hessian_works_in_place_with_the_same_result() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 64))
    w = rng.standard_normal((64, 24)).astype(np.float32)
    kept = x.T @ x
    copied = gptq(w, kept, 300, 16)
    assert np.array_equal(kept, x.T @ x)  # the caller's Hessian is left as it was
    worked = x.T @ x
    in_place = gptq(w, worked, 300, 16, overwrite_hessian=True)
    assert not np.array_equal(worked, x.T @ x)  # used as the workspace
    assert np.array_equal(copied.q, in_place.q) and np.array_equal(copied.scales, in_place.scales)


def test_a_handed_over_hessian_is_the_work_matrix_and_gives_the_same_result() -> None:
    # A billion-parameter down_proj's K x K float64 Hessian is 642 MB: GPTQ may factorise in the caller's array
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 96)) @ rng.standard_normal((96, 96))
    hessian = x.T @ x
    w = rng.standard_normal((96, 40)).astype(np.float32)
    kept = gptq(w, hessian, 300, 32)
    handed = hessian.copy()
    result = gptq(w, handed, 300, 32, overwrite_hessian=True)
    np.testing.assert_array_equal(result.q, kept.q)
    np.testing.assert_array_equal(result.scales, kept.scales)
    assert not np.array_equal(handed, hessian)  # used as the work matrix
