"""Methods: aliases, what each needs, compact GPTQ results, and the recipes each decides."""

from __future__ import annotations

import numpy as np
import pytest

from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization._testing import correlated
from onnxprec.quantization.algorithms import gptq, hessian_from_tokens, quantize_rtn
from onnxprec.quantization.methods import METHODS, CompactWeight, GroupStats, QuantConfig, decide_group, method_spec


def test_aliases_and_unknown_names() -> None:
    assert method_spec("rtn_dq")[0] == "rtn" and method_spec("awq_clip_trt")[0] == "awq_clip"
    with pytest.raises(InvalidArgumentError, match=r"Unknown calibration_method 'awq'.*awq_lite"):
        method_spec("awq")
    assert not METHODS["rtn"].needs_data and not METHODS["rtn_clip"].needs_data
    assert METHODS["gptq"].needs_gram and not METHODS["gptq"].needs_sample
    assert METHODS["awq_full"].needs_absmean and METHODS["awq_full"].needs_sample


@pytest.mark.parametrize(("symmetric", "k", "bits"), [(True, 33, 4), (False, 33, 4), (True, 64, 8)])
def test_compact_weight_round_trip(symmetric: bool, k: int, bits: int) -> None:
    w = np.random.default_rng(0).standard_normal((k, 7)).astype(np.float32)
    qw = quantize_rtn(w, 16, symmetric=symmetric, bits=bits)
    compact = CompactWeight.of(qw)
    back = compact.expand()
    np.testing.assert_array_equal(back.q, qw.q)
    assert back.q.dtype == qw.q.dtype
    np.testing.assert_array_equal(back.dequantize(), qw.dequantize())
    if bits == 4:
        assert compact.levels.nbytes == (k * 7 + 1) // 2


def _group(seed: int = 0) -> tuple[list[np.ndarray], GroupStats]:
    rng = np.random.default_rng(seed)
    x = correlated(1024, 64, seed=seed)
    weights = [rng.standard_normal((64, n)).astype(np.float32) for n in (32, 48)]
    gram, tokens = hessian_from_tokens(x)
    return weights, GroupStats(absmean=np.abs(x).mean(0), sample=x[:256], gram=gram, tokens=tokens)


def _output_error(x: np.ndarray, w: np.ndarray, dq: np.ndarray) -> float:
    return float(np.linalg.norm(x @ (w - dq)) / np.linalg.norm(x @ w))


@pytest.mark.parametrize("method", ["awq_lite", "awq_clip", "awq_full", "gptq", "awq_gptq"])
def test_every_method_beats_rtn_on_the_calibration_tokens(method: str) -> None:
    weights, stats = _group()
    config = QuantConfig(block_size=16)
    decision = decide_group(weights, stats, method, config)
    x = stats.sample
    assert x is not None
    for w, recipe in zip(weights, decision.recipes):
        dq = recipe.dequantized(recipe.quantize(w))
        rtn = quantize_rtn(w, 16).dequantize()
        assert _output_error(x, w, dq) < _output_error(x, w, rtn)
        assert recipe.info["output_rel_error"] > 0
    if METHODS[method].awq_scales:
        assert decision.scales is not None and decision.alpha is not None
        assert all(r.awq_scales is decision.scales for r in decision.recipes)  # one vector for the shared input
    if METHODS[method].gptq:
        assert all(r.result is not None for r in decision.recipes)


def test_gptq_recipe_is_the_textbook_gptq_and_awq_gptq_scales_the_hessian() -> None:
    weights, stats = _group(1)
    assert stats.gram is not None
    decision = decide_group(weights, stats, "gptq", QuantConfig(block_size=16))
    expected = gptq(weights[0], stats.gram, stats.tokens, 16, damp=0.1)  # the recipe's default damping
    np.testing.assert_array_equal(decision.recipes[0].quantize(weights[0]).q, expected.q)
    combined = decide_group(weights, stats, "awq_gptq", QuantConfig(block_size=16))
    s = combined.scales
    assert s is not None
    scaled = gptq(weights[0] * s[:, None], stats.gram / np.outer(s, s), stats.tokens, 16, damp=0.1)
    np.testing.assert_array_equal(combined.recipes[0].quantize(weights[0]).q, scaled.q)


def test_awq_not_allowed_keeps_the_weights_unscaled() -> None:
    weights, stats = _group(2)
    decision = decide_group(weights, stats, "awq_lite", QuantConfig(block_size=16), awq_allowed=False)
    assert decision.scales is None and all(r.awq_scales is None for r in decision.recipes)


@pytest.mark.parametrize("method", ["awq_full", "gptq"])
def test_the_reported_output_error_of_a_wide_weight_is_the_whole_weights_on_every_few_columns(method: str) -> None:
    from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS

    rng = np.random.default_rng(3)
    x = correlated(512, 64, seed=3)
    weights = [rng.standard_normal((64, 2 * SEARCH_COLUMNS + 30)).astype(np.float32)]  # every 3rd column
    gram, tokens = hessian_from_tokens(x)
    stats = GroupStats(absmean=np.abs(x).mean(0), sample=x, gram=gram, tokens=tokens)
    (recipe,) = decide_group(weights, stats, method, QuantConfig(block_size=16)).recipes
    w = weights[0]
    dq = recipe.dequantized(recipe.quantize(w))
    expected = _output_error(x, w[:, ::3], dq[:, ::3])
    assert recipe.info["output_rel_error"] == pytest.approx(expected, rel=1e-4)
    assert recipe.info["output_rel_error"] != pytest.approx(_output_error(x, w, dq), rel=1e-6)


def test_spilled_results_and_the_row_wise_scaled_gram_equal_the_in_memory_ones() -> None:
    from onnxprec.quantization.methods import Spill, _scaled_gram

    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 1100))
    gram, scales = x.T @ x, (rng.random(1100) + 0.5).astype(np.float32)
    assert np.array_equal(_scaled_gram(gram, scales), gram / np.outer(scales, scales))  # bit for bit
    spill = Spill()
    for symmetric in (True, False):
        qw = quantize_rtn(rng.standard_normal((96, 40)).astype(np.float32), 32, symmetric=symmetric)
        spilled = CompactWeight.of(qw).spill(spill)
        back = spilled.expand()
        for name in ("q", "scales", "zero_points"):
            a, b = getattr(qw, name), getattr(back, name)
            assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), name
    path = spill.path
    del spill, spilled
    assert not path.exists()  # the file goes with its last weight


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_error_columns_of_a_computed_result_are_those_of_the_whole_weight_bit_for_bit(symmetric: bool) -> None:
    from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS
    from onnxprec.quantization.methods import _error_columns

    rng = np.random.default_rng(4)
    x = correlated(256, 64, seed=4)
    w = rng.standard_normal((64, 2 * SEARCH_COLUMNS + 30)).astype(np.float32)
    gram, tokens = hessian_from_tokens(x)
    stats = GroupStats(absmean=np.abs(x).mean(0), sample=x, gram=gram, tokens=tokens)
    (recipe,) = decide_group([w], stats, "awq_gptq", QuantConfig(block_size=16, symmetric=symmetric)).recipes
    assert recipe.result is not None and recipe.awq_scales is not None
    computed = recipe.quantize(w)
    whole = recipe.dequantized(computed)
    for given in (computed, None):
        part, dq = _error_columns(w, recipe, given)
        assert np.array_equal(part, w[:, ::3]) and np.array_equal(dq, whole[:, ::3]) and dq.flags.c_contiguous


@pytest.mark.parametrize("method", ["gptq", "awq_gptq"])
def test_gptq_decisions_leave_the_callers_weights_as_they_were(method: str) -> None:
    rng = np.random.default_rng(6)
    x = correlated(256, 64, seed=6)
    x[:, 2] = 0.0  # a dead input channel: GPTQ zeroes its row in the weight it works on
    weights = [rng.standard_normal((64, 40)).astype(np.float32)]  # one weight: the joint weight is still a copy
    before = [w.copy() for w in weights]
    gram, tokens = hessian_from_tokens(x)
    stats = GroupStats(absmean=np.abs(x).mean(0), sample=x, gram=gram, tokens=tokens)
    (recipe,) = decide_group(weights, stats, method, QuantConfig(block_size=16)).recipes
    assert np.array_equal(weights[0], before[0]) and recipe.result is not None
    assert np.array_equal(recipe.quantize(weights[0]).q[2], np.zeros(40, np.int8))


@pytest.mark.parametrize(("method", "awq_allowed"), [("rtn", True), ("kquant", True), ("awq_lite", False)])
def test_a_method_without_weight_searches_reads_only_the_error_columns(
    method: str, awq_allowed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx_ir as ir

    from onnxprec.quantization import select
    from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS
    from onnxprec.quantization.methods import read_for
    from onnxprec.quantization.select import WeightGroup

    rng = np.random.default_rng(5)
    x = correlated(256, 64, seed=5)
    w = rng.standard_normal((64, 2 * SEARCH_COLUMNS + 30)).astype(np.float32)
    weight = ir.Value(name="w", const_value=ir.Tensor(w))
    target = WeightGroup(weight, [], k=64, n=w.shape[1])
    stats = GroupStats(absmean=np.abs(x).mean(0), sample=x, tokens=256)
    monkeypatch.setattr(select, "READ_BYTES", 4 * 64 * 100)  # ranges of 99 (a multiple of 3) or 98 columns
    (read,) = read_for([target], method, awq_allowed)
    assert np.array_equal(read, w[:, ::3])  # every 3rd column, read in ranges
    assert np.array_equal(target.read_every(7), w[:, ::7])
    config = QuantConfig(block_size=16)
    (whole,) = decide_group([w], stats, method, config, awq_allowed=awq_allowed).recipes
    (part,) = decide_group([read], stats, method, config, awq_allowed=awq_allowed).recipes
    assert part.info == whole.info and "output_rel_error" in part.info  # the same error, bit for bit
    (read,) = read_for([target], "gptq", awq_allowed)  # GPTQ's result needs the whole weight
    assert read.shape == w.shape


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_wide_gptq_weight_quantized_in_ranges_equals_the_whole(
    symmetric: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx_ir as ir

    from onnxprec.quantization import methods
    from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS
    from onnxprec.quantization.select import WeightGroup

    rng = np.random.default_rng(6)
    x = correlated(256, 64, seed=6)
    w = rng.standard_normal((64, 2 * SEARCH_COLUMNS + 30)).astype(np.float32)
    gram, tokens = hessian_from_tokens(x)
    stats = GroupStats(gram=gram, tokens=tokens)
    config = QuantConfig(block_size=16, symmetric=symmetric)
    (whole,) = decide_group([w], stats, "gptq", config).recipes
    target = WeightGroup(ir.Value(name="w", const_value=ir.Tensor(w)), [], k=64, n=w.shape[1])
    monkeypatch.setattr(methods, "WIDE_BYTES", 4 * 64 * 100)  # ranges of 100 columns
    decision = methods.decide_targets([target], stats, "gptq", config, block_sizes=[16])
    (ranged,) = decision.recipes
    assert ranged.result is not None and whole.result is not None
    a, b = whole.quantize(w), ranged.quantize(w)
    assert np.array_equal(a.q, b.q) and np.array_equal(a.scales, b.scales)
    assert (a.zero_points is None) == symmetric and (b.zero_points is None) == symmetric
    assert symmetric or np.array_equal(a.zero_points, b.zero_points)
    assert ranged.info["output_rel_error"] == pytest.approx(whole.info["output_rel_error"], rel=1e-6)
    monkeypatch.setattr(methods, "WIDE_BYTES", 1 << 30)  # a narrow weight: decide_group on the whole
    (narrow,) = methods.decide_targets([target], stats, "gptq", config, block_sizes=[16]).recipes
    assert narrow.info == whole.info


@pytest.mark.parametrize("method", ["awq_clip", "awq_full"])
def test_a_wide_clip_weight_searched_in_ranges_equals_the_whole(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx_ir as ir

    from onnxprec.quantization import methods
    from onnxprec.quantization.algorithms.awq import SEARCH_COLUMNS
    from onnxprec.quantization.select import WeightGroup

    rng = np.random.default_rng(8)
    x = correlated(256, 64, seed=8)
    w = rng.standard_normal((64, 2 * SEARCH_COLUMNS + 30)).astype(np.float32)
    stats = GroupStats(absmean=np.abs(x).mean(0), sample=x, tokens=256)
    config = QuantConfig(block_size=16)
    (whole,) = decide_group([w], stats, method, config, awq_allowed=False).recipes  # a tied head: no AWQ scales
    target = WeightGroup(ir.Value(name="w", const_value=ir.Tensor(w)), [], k=64, n=w.shape[1])
    monkeypatch.setattr(methods, "WIDE_BYTES", 4 * 64 * 100)  # ranges of 100 columns
    (ranged,) = methods.decide_targets([target], stats, method, config, awq_allowed=False, block_sizes=[16]).recipes
    assert whole.clip_ratios is not None and ranged.clip_ratios is not None
    assert np.array_equal(whole.clip_ratios, ranged.clip_ratios)
    a, b = whole.quantize(w), ranged.quantize(w)
    assert np.array_equal(a.q, b.q) and np.array_equal(a.scales, b.scales)
    assert ranged.info["output_rel_error"] == pytest.approx(whole.info["output_rel_error"], rel=1e-6)


@pytest.mark.parametrize(("symmetric", "bits"), [(True, 4), (False, 4), (True, 8)])
def test_the_columns_of_a_computed_result_are_those_of_the_whole(symmetric: bool, bits: int) -> None:
    from onnxprec.quantization.methods import Recipe, Spill

    rng = np.random.default_rng(7)
    qw = quantize_rtn(rng.standard_normal((48, 40)).astype(np.float32), 16, symmetric=symmetric, bits=bits)
    compact = CompactWeight.of(qw)
    spill = Spill()
    for result in (compact, compact.spill(spill)):
        assert result.sliceable()
        recipe = Recipe("gptq", bits=bits, symmetric=symmetric, block_size=16, result=result)
        for columns in (slice(0, 12), slice(12, 40), slice(38, 40)):
            part = recipe.quantize(qw.q[:, columns].astype(np.float32), columns)
            assert np.array_equal(part.q, qw.q[:, columns]) and part.q.dtype == qw.q.dtype
            assert np.array_equal(part.scales, qw.scales[:, columns])
            assert symmetric or np.array_equal(part.zero_points, qw.zero_points[:, columns])
    odd = CompactWeight.of(quantize_rtn(rng.standard_normal((48, 41)).astype(np.float32), 16, bits=4))
    assert not odd.sliceable()
