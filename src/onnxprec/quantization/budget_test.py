"""Size-budget arithmetic: stored bytes per format, Hessian-weighted loss, the greedy choice on convex hulls."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxprec.quantization.algorithms.rtn import quantize_rtn
from onnxprec.quantization.budget import FLOAT, Candidate, Precision, allocate, hessian_loss, stored_bytes
from onnxprec.quantization.packing import pack_matmulnbits, qdq_arrays


@pytest.mark.parametrize(("bits", "block", "symmetric"), [(4, 32, True), (4, 64, False), (8, 64, True), (8, -1, True)])
def test_stored_bytes_are_the_packed_arrays(bits: int, block: int, symmetric: bool) -> None:
    w = np.random.default_rng(0).standard_normal((100, 24)).astype(np.float32)  # K=100: a partial last block
    qw = quantize_rtn(w, block, symmetric=symmetric, bits=bits)
    precision = Precision(bits, block)
    packed = pack_matmulnbits(qw, 100)
    mnb = sum(a.nbytes for a in packed if a is not None)
    assert stored_bytes(100, 24, 4, precision, symmetric=symmetric, output_format="matmulnbits")[0] == mnb
    data, scales, zero_points = qdq_arrays(qw)
    zp = 0 if zero_points is None else (zero_points.size * bits + 7) // 8
    qdq = (data.size * bits + 7) // 8 + scales.nbytes + zp
    assert stored_bytes(100, 24, 4, precision, symmetric=symmetric, output_format="qdq")[0] == qdq
    assert stored_bytes(100, 24, 2, FLOAT, symmetric=symmetric, output_format="qdq") == (4800, 4800)


def test_hessian_loss_weights_the_error_by_the_inputs() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    dq = w.copy()
    dq[3] += 0.1  # an error on input channel 3 only
    x = rng.standard_normal((64, 16)).astype(np.float32)
    x[:, 3] *= 10
    loss = hessian_loss(w, dq, x.T.astype(np.float64) @ x)
    expected = float(np.sum((x @ (w - dq)) ** 2) / np.sum((x @ w) ** 2))
    assert loss == pytest.approx(expected, rel=1e-4)
    assert loss > 3 * hessian_loss(w, dq, None)  # the loud channel makes the same weight error cost more


def _c(label: int, size: int, loss: float) -> Candidate:
    return Candidate(Precision(4, 16 << label), size, loss)


def test_allocate_promotes_the_most_loss_per_byte_first_within_the_budget() -> None:
    candidates = {
        "big": [_c(0, 100, 1.0), _c(1, 150, 0.2), _c(2, 300, 0.0)],
        "small": [_c(0, 10, 0.5), _c(1, 20, 0.05)],
        "dull": [_c(0, 50, 0.1), _c(1, 60, 0.099), _c(2, 100, 0.09)],
    }
    smallest = allocate(candidates, 160)
    assert {k: c.bytes for k, c in smallest.choice.items()} == {"big": 100, "small": 10, "dull": 50}
    assert smallest.bytes == 160
    assert allocate(candidates, 170).choice["small"].bytes == 20  # 0.045 a byte beats big's 0.016
    result = allocate(candidates, 225)
    assert {k: c.bytes for k, c in result.choice.items()} == {"big": 150, "small": 20, "dull": 50}
    assert result.loss == pytest.approx(0.2 + 0.05 + 0.1)
    bytes_, losses = zip(*result.curve)
    assert list(bytes_) == sorted(bytes_) and list(losses) == sorted(losses, reverse=True)
    assert result.curve[0] == (160, pytest.approx(1.6)) and result.curve[-1] == (420, pytest.approx(0.14))
    with pytest.raises(ValueError, match="smallest"):
        allocate(candidates, 159)


def test_allocate_is_close_to_the_exhaustive_optimum() -> None:
    rng = np.random.default_rng(2)
    for _ in range(20):
        candidates = {}
        for key in range(4):
            sizes = np.cumsum(rng.integers(5, 40, 4))
            losses = np.sort(rng.random(4))[::-1] * rng.random() * 3
            candidates[key] = [_c(i, int(s), float(v)) for i, (s, v) in enumerate(zip(sizes, losses))]
        budget = int(sum(min(c.bytes for c in options) for options in candidates.values()) + rng.integers(0, 80))
        greedy = allocate(candidates, budget)
        assert greedy.bytes <= budget
        best = min(
            sum(c.loss for c in combo)
            for combo in itertools.product(*candidates.values())
            if sum(c.bytes for c in combo) <= budget
        )
        largest_step = max(a.loss - b.loss for options in candidates.values() for a, b in itertools.pairwise(options))
        assert best - 1e-9 <= greedy.loss <= best + largest_step
