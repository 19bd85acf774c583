"""k-quant and HQQ block searches: never worse than RTN on their objective, storable parameters, partial blocks."""

from __future__ import annotations

import numpy as np
import pytest

from onnxprec.quantization.algorithms.rtn import QuantGrid, block_params, quantize_levels, quantize_rtn, to_blocks
from onnxprec.quantization.algorithms.search import SEARCHES, hqq_params, kquant_params


def _weight(k: int = 96, n: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[rng.random((k, n)) < 0.01] *= 8  # a few outliers, as in LLM weights
    return w


def _errors(blocks: np.ndarray, s: np.ndarray, z: np.ndarray | None, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Per block and column: squared error weighted by llama.cpp's importance ``rms + |x|``, and absolute error."""
    levels = quantize_levels(blocks, s, z, bits=bits)
    if z is not None:
        levels -= z[:, None, :]
    diff = levels * s[:, None, :] - blocks
    rms = np.sqrt((blocks * blocks).mean(axis=1, keepdims=True))
    return ((rms + np.abs(blocks)) * diff * diff).sum(axis=1), np.abs(diff).sum(axis=1)


@pytest.mark.parametrize(("symmetric", "positive"), [(True, False), (True, True), (False, False)])
def test_kquant_never_worse_than_rtn_and_better_overall(symmetric: bool, positive: bool) -> None:
    blocks = to_blocks(_weight(), 32)
    grid = QuantGrid(symmetric=symmetric, positive_scales=positive)
    rtn = _errors(blocks, *block_params(blocks, grid))[0]
    s, z = kquant_params(blocks, grid)
    found = _errors(blocks, s, z)[0]
    assert (found <= rtn * (1 + 1e-6)).all()
    assert found.sum() < rtn.sum()
    lo, hi = blocks.min(axis=1), blocks.max(axis=1)
    if symmetric:  # the block's largest magnitude is never clipped
        covered = np.maximum(-lo / 8, hi / 7) if positive else np.maximum(-lo, hi) / 8
        assert (np.abs(s) >= covered * (1 - 1e-6)).all()
    else:
        assert z is not None  # covered up to RTN's half step of a rounded zero point
        assert (s * (15.5 - z) >= hi - 1e-5).all() and (s * (z + 0.5) >= -np.minimum(lo, 0) - 1e-5).all()
    if symmetric:
        assert z is None and ((s > 0).all() if positive else (s < 0).any())
    else:
        assert z is not None and (s > 0).all() and np.array_equal(z, np.rint(z)) and z.min() >= 0 and z.max() <= 15


@pytest.mark.parametrize("symmetric", [True, False])
def test_hqq_keeps_the_lowest_mean_absolute_error(symmetric: bool) -> None:
    blocks = to_blocks(_weight(seed=1), 32)
    grid = QuantGrid(symmetric=symmetric)
    rtn = _errors(blocks, *block_params(blocks, grid))[1]
    s, z = hqq_params(blocks, grid)
    found = _errors(blocks, s, z)[1]
    assert (found <= rtn * (1 + 1e-6)).all() and found.sum() < 0.99 * rtn.sum()
    assert (z is None) == symmetric


@pytest.mark.parametrize("search", ["kquant", "hqq"])
def test_padding_of_a_partial_block_does_not_count(search: str) -> None:
    """K = 40 at block 32: the second block has 8 real rows; its parameters are those of a block of 8 rows alone
    (the same rows repeated 4 times fill a block of 32 with the same objective)."""
    w = _weight(k=40, n=16, seed=2)
    partial = quantize_rtn(w, 32, search=SEARCHES[search])
    tail = np.tile(w[32:], (4, 1))
    alone = quantize_rtn(tail, 32, search=SEARCHES[search])
    np.testing.assert_allclose(partial.scales[1], alone.scales[0], rtol=1e-5)


def test_options_are_exclusive() -> None:
    with pytest.raises(ValueError, match="not both"):
        quantize_rtn(_weight(), 32, search=kquant_params, clip_search=True)
