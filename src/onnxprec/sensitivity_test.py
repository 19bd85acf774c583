"""The sensitivity engine: Hessian-weighted loss, the structural proxy, real-run calibration, and the searches
(greedy choice on convex hulls under a byte budget, ranking, cost cap, galloping and bisection on a count)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir
import pytest

from onnxprec.sensitivity import (
    Candidate,
    allocate,
    bisect_count,
    calibrate,
    fewest,
    hessian_loss,
    isolated_gains,
    multiply_adds,
    rank,
    structural,
    within,
)


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
    return Candidate(16 << label, size, loss)


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


@pytest.mark.parametrize("answer", [1, 2, 3, 5, 8, 13, 40, 64])
def test_fewest_finds_the_smallest_count_that_holds_in_few_checks(answer: int) -> None:
    asked: list[int] = []

    def holds(count: int) -> bool:
        asked.append(count)
        return count >= answer

    assert fewest(holds, 64) == answer
    assert 64 not in asked  # the whole count is assumed to hold, never checked
    assert len(asked) <= 2 * max(answer - 1, 1).bit_length() + 1
    gallop = [1 << i for i in range(7) if 1 << i < 64 and (i == 0 or 1 << (i - 1) < answer)]
    assert asked[: len(gallop)] == gallop  # 1, 2, 4... up to the first that holds, then a bisection


def test_fewest_returns_the_whole_count_when_nothing_less_holds() -> None:
    assert fewest(lambda count: False, 7) == 7
    assert fewest(lambda count: True, 0) == 0


@pytest.mark.parametrize(("good", "bad"), [(0, 50), (50, 0)])
def test_bisect_count_stops_next_to_the_boundary_on_the_good_side(good: int, bad: int) -> None:
    boundary = 17
    holds = (lambda k: k <= boundary) if good < bad else (lambda k: k >= boundary)
    asked: list[int] = []

    def counted(k: int) -> bool:
        asked.append(k)
        return holds(k)

    assert bisect_count(counted, good, bad) == boundary
    assert len(asked) <= 6 and good not in asked and bad not in asked


def test_rank_orders_by_sensitivity_keeping_ties_in_order_and_within_fits_the_cost() -> None:
    sensitivity = {"a": 0.5, "b": 2.0, "c": 0.5, "d": 0.0, "e": -1.0}
    assert rank(sensitivity) == ["b", "a", "c", "d", "e"]
    assert rank(sensitivity, least_first=True) == ["e", "d", "a", "c", "b"]
    assert rank(sensitivity, ["c", "a", "d", "b"], positive=True) == ["b", "c", "a"]
    assert within(["b", "a", "c"], {"b": 5.0, "a": 4.0, "c": 1.0}, 6.0) == ["b", "c"]  # a does not fit, c still does


def test_isolated_gains_measure_what_each_item_removes() -> None:
    errors = {"x": 0.3, "y": 0.5}
    squared = isolated_gains(["x", "y"], errors.__getitem__, 0.6, squared=True)
    assert squared == pytest.approx({"x": 0.36 - 0.09, "y": 0.36 - 0.25})
    assert isolated_gains(["x", "y"], errors.__getitem__, 0.6, squared=False) == pytest.approx({"x": 0.3, "y": 0.1})


def test_calibrate_scales_each_set_by_its_measured_over_estimated_loss() -> None:
    estimates = {"q": 1.0, "k": 3.0, "head": 2.0}
    probes = calibrate([["q", "k"], ["head"]], lambda items: sum(estimates[i] for i in items),
                       lambda items: 8.0 if "head" in items else 2.0)  # fmt: skip
    assert [p.items for p in probes] == [("q", "k"), ("head",)]
    assert [p.gain for p in probes] == pytest.approx([0.5, 4.0])


def test_structural_ranks_a_residual_stream_near_the_output_highest() -> None:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4]))
    a = ir.node("Relu", [x], name="a")  # two readers, three nodes from the output
    b = ir.node("Neg", [a.outputs[0]], name="b")
    c = ir.node("Add", [a.outputs[0], b.outputs[0]], name="c")
    d = ir.node("Relu", [c.outputs[0]], name="d")  # writes the output
    d.outputs[0].name = "y"
    graph = ir.Graph([x], [d.outputs[0]], nodes=[a, b, c, d], opset_imports={"": 21})
    score = structural(ir.Model(graph, ir_version=10))
    assert score == pytest.approx({a: 2 / 4, b: 1 / 3, c: 1 / 2, d: 1.0})


def test_multiply_adds_count_each_output_element_times_its_reduction() -> None:
    def value(name: str, shape: list[int | str]) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))

    x, w, k = value("x", [1, 3, 8, 8]), value("w", [16, 3, 3, 3]), value("k", [16, 10])
    conv = ir.node("Conv", [x, w], name="conv", attributes={"group": 1})
    conv.outputs[0].name, conv.outputs[0].shape = "c", ir.Shape([1, 16, 6, 6])
    flat = ir.node("Flatten", [conv.outputs[0]], name="flat")  # counts nothing
    flat.outputs[0].name = "f"
    gemm = ir.node("Gemm", [value("g", [2, 16]), k], name="gemm")
    gemm.outputs[0].name, gemm.outputs[0].shape = "y", ir.Shape([2, 10])
    gemm_t = ir.node("Gemm", [value("g2", [2, 16]), value("kt", [10, 16])], name="gemm_t", attributes={"transB": 1})
    gemm_t.outputs[0].name = "yt"  # its shape is unknown unless measured
    matmul = ir.node("MatMul", [value("a", ["n", 4, 5]), value("b", [5, 7])], name="matmul")
    matmul.outputs[0].name, matmul.outputs[0].shape = "m", ir.Shape(["n", 4, 7])  # symbolic: measured below
    graph = ir.Graph([x], [flat.outputs[0]], nodes=[conv, flat, gemm, gemm_t, matmul], opset_imports={"": 21})
    conv_work, gemm_work = 16 * 6 * 6 * 3 * 3 * 3, 2 * 10 * 16
    assert multiply_adds(graph, {}) == conv_work + gemm_work
    assert multiply_adds(graph, {"yt": (2, 10), "m": (3, 4, 7)}) == conv_work + 2 * gemm_work + 3 * 4 * 7 * 5
