"""The float fallback: above MAX_ISOLATED layers the sensitivity engine's estimate ranks the layers (static ones
included: their sensitivity is the Hessian-weighted error of their INT8 weight); with an emulation, its choice is
checked for real and more layers go back while a real check misses."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec.accuracy import MAX_REAL_CHECKS, AccuracyTarget, Measurement
from onnxprec.quantization._testing import tiny_cnn
from onnxprec.quantization.int8 import fallback, quantize_file


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["ort-cpu", "trt"])
def test_the_estimate_finds_the_layers_to_keep_in_float_without_a_check_per_layer(
    tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), source)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    common = {"calibration_data": data, "runtime": runtime, "nodes_to_quantize": [".*"], "max_float_compute": 1.0}
    plain = quantize_file(source, tmp_path / "plain.onnx", target_accuracy="rel_l2<=1", **common)
    assert plain.count("float") == 0
    strict = plain.accuracy["rel_l2"] / 2
    monkeypatch.setattr(fallback, "MAX_ISOLATED", 0)  # as a model with more layers than one check each allows
    report = quantize_file(source, tmp_path / "q.onnx", target_accuracy=f"rel_l2<={strict:.4g}", **common)
    assert 0 < report.count("float") < len(report.layers)
    assert report.accuracy["rel_l2"] <= float(f"{strict:.4g}")
    assert not any(step["what"].startswith("gain of each layer") for step in report.fallback_steps)


def _measured(errors: dict[str, float], target: str) -> tuple[AccuracyTarget, Any]:
    bound = AccuracyTarget.parse(target)

    def measure(floats: Collection[str]) -> Measurement:
        value = float(np.sqrt(sum(e * e for name, e in errors.items() if name not in floats)))
        return Measurement({"y": {"rel_l2": value, "nonfinite": 0}}, bound.bounds[0].holds(value))

    return bound, measure


def test_the_emulated_choice_that_holds_for_real_costs_one_real_check() -> None:
    errors = {f"l{i}": 0.01 * (i + 1) for i in range(8)}  # l7 matters most
    target, real = _measured(errors, "rel_l2<=0.08")
    calls: list[int] = []

    def check(floats: Collection[str]) -> Measurement:
        calls.append(len(floats))
        return real(floats)

    steps: list[dict[str, Any]] = []
    release = lambda: calls.append(-1)  # noqa: E731
    floats, final = fallback.search(list(errors), check, target, {}, steps, emulate=real, release=release)
    assert final.ok and floats == ["l7", "l6", "l5"]  # sqrt(sum of l0..l4 squared) = 0.0742
    assert calls == [0, -1, 3]  # the all-INT8 model, the emulation released, then its choice checked
    assert [s["kind"] for s in steps if "kind" in s].count("emulated") > len(errors)


def test_an_emulated_choice_that_misses_for_real_sends_more_layers_back() -> None:
    errors = {f"l{i}": 0.01 * (i + 1) for i in range(8)}
    target, real = _measured(errors, "rel_l2<=0.08")
    # the emulation sees l7's error four times larger, the rest half as large: after scaling to the real all-INT8
    # error it expects l7 alone to be enough
    _, emulated = _measured({**{k: v / 2 for k, v in errors.items()}, "l7": 0.32}, "rel_l2<=1")
    calls: list[int] = []

    def check(floats: Collection[str]) -> Measurement:
        calls.append(len(floats))
        return real(floats)

    floats, final = fallback.search(list(errors), check, target, {}, [], emulate=emulated)
    assert calls == [0, 1, 2, 4][: 1 + MAX_REAL_CHECKS]  # all-INT8, the emulation's choice, then doubling
    assert final.ok == (MAX_REAL_CHECKS >= 3) and floats[0] == "l7"  # 3 are needed: 4 hold, 2 do not


@pytest.mark.parametrize("spin", [0, 300])
def test_the_proxy_ranks_the_layers_when_their_isolated_checks_would_cost_too_much(spin: int) -> None:
    """Eight layers under MAX_ISOLATED: when the layers times one check's multiply-adds (the sum of ``cost``) fit in
    the budget each is checked alone in float; over it, the proxy ranks them and the search finds the same layers
    without those checks. The choice is counted, not timed: a check that burns CPU (``spin``) changes nothing."""
    errors = {f"l{i}": 0.01 * (i + 1) for i in range(8)}
    target, real = _measured(errors, "rel_l2<=0.08")
    tried: list[int] = []

    def check(floats: Collection[str]) -> Measurement:
        tried.append(len(floats))
        if spin:
            np.linalg.svd(np.ones((spin, spin)))  # CPU time the old clock-based choice would have counted
        return real(floats)

    proxy = {name: e * e for name, e in errors.items()}
    cost = dict.fromkeys(errors, 1e6)  # one check: 8e6 multiply-adds, all eight: 6.4e7
    measured, _ = fallback.search(list(errors), check, target, proxy, [], cost, isolated_multiply_adds=6.4e7)
    assert tried[1 : 1 + len(errors)] == [1] * len(errors)  # each layer alone
    tried.clear()
    steps: list[dict[str, Any]] = []
    estimated, final = fallback.search(list(errors), check, target, proxy, steps, cost, isolated_multiply_adds=6.3e7)
    assert final.ok and estimated == measured == ["l7", "l6", "l5"]
    assert tried == [0, 1, 2, 4, 3]  # the all-INT8 model, then 1, 2, 4 most sensitive and a bisection
    assert not any(step["what"].startswith("gain of each layer") for step in steps)


def test_a_checks_node_work_counts_every_node_on_every_batch() -> None:
    model = ir.serde.deserialize_model(tiny_cnn())
    nodes = sum(1 for _ in model.graph)
    assert fallback.node_runs(model, 3) == fallback.NODE_RUN_MULTIPLY_ADDS * 3 * nodes


def test_a_choice_that_misses_as_saved_sends_the_next_ranked_layers_back() -> None:
    """Checked with an FP32 remainder, 3 layers in float hold; the model as saved (an FP16 remainder, here an extra
    error of 0.04) needs 4: the next ranked one goes back, checked as saved. Holding there, the choice stays."""
    errors = {f"l{i}": 0.01 * (i + 1) for i in range(8)}
    target, real = _measured(errors, "rel_l2<=0.08")
    _, remainder = _measured({**errors, "fp16": 0.04}, "rel_l2<=0.08")  # the remainder's error never goes back
    saved: list[int] = []

    def as_saved(floats: Collection[str]) -> Measurement:
        saved.append(len(floats))
        return remainder(floats)

    steps: list[dict[str, Any]] = []
    floats, final = fallback.search(list(errors), real, target, {}, steps, saved=as_saved)
    assert final.ok and floats == ["l7", "l6", "l5", "l4"]  # with l4 INT8 too: sqrt(0.0055 + 0.0016) = 0.084
    assert saved == [3, 6, 4]  # the search's choice, galloping to twice as many, then bisecting
    assert [s["kind"] for s in steps if "kind" in s].count("as saved") == len(saved)
    assert remainder(floats).ok and not remainder(floats[:3]).ok
    quiet: list[int] = []
    floats, final = fallback.search(list(errors), real, target, {}, [], saved=lambda f: quiet.append(1) or real(f))
    assert final.ok and floats == ["l7", "l6", "l5"] and quiet == [1]  # holding as saved: one check, no change


def test_the_check_as_saved_keeps_within_the_users_float_compute_budget() -> None:
    """With ``max_float_compute`` and no going beyond it, the layers the as-saved check sends back are only those
    within the budget: here none beyond the search's 3, so the choice stays and misses as saved."""
    errors = {f"l{i}": 0.01 * (i + 1) for i in range(8)}
    target, real = _measured(errors, "rel_l2<=0.08")
    _, remainder = _measured({**errors, "fp16": 0.04}, "rel_l2<=0.08")
    cost = dict.fromkeys(errors, 1.0)
    floats, _ = fallback.search(list(errors), real, target, {}, [], cost, 3 / 8, saved=remainder)
    assert floats == ["l7", "l6", "l5"] and not remainder(floats).ok
    floats, _ = fallback.search(list(errors), real, target, {}, [], cost, 3 / 8, saved=remainder, beyond=True)
    assert floats == ["l7", "l6", "l5", "l4"] and remainder(floats).ok  # the guard's search may go beyond it


def test_a_layer_that_breaks_the_result_alone_but_is_ranked_last_goes_first() -> None:
    """The estimate leaves l0 unranked (0: it misses its activation error), yet l0 alone in INT8 misses the target:
    every layer but l0 in float misses, so l0 goes first and the fewest after it are searched."""
    errors = {**{f"l{i}": 0.01 for i in range(1, 8)}, "l0": 0.5}
    target, real = _measured(errors, "rel_l2<=0.05")
    proxy = {f"l{i}": float(i) for i in range(8)}  # l0 least sensitive by the estimate
    steps: list[dict[str, Any]] = []
    floats, final = fallback.search(list(errors), real, target, proxy, steps, dict.fromkeys(errors, 1.0), 0.25,
                                    beyond=True, isolated_multiply_adds=0.0)  # fmt: skip
    assert final.ok and floats[0] == "l0" and len(floats) < len(errors)
    assert real(floats).ok and not real(floats[1:]).ok
    assert any("by the last ranked first" in step["what"] for step in steps if "what" in step)


def test_of_two_layers_left_quantized_the_one_that_breaks_the_result_alone_goes_first() -> None:
    """The estimate leaves quiet and loud unranked; quiet comes first in graph order but only loud breaks the
    result. Every layer but those two in float misses; each one's own error (it alone quantized, the rest in float)
    ranks loud first and quiet last (it holds alone): loud alone in float meets the target and quiet stays
    quantized, where graph order kept both in float. No float set is checked twice."""
    errors = {"quiet": 0.001, "loud": 0.5, **{f"l{i}": 0.01 for i in range(1, 5)}}
    target, measure = _measured(errors, "rel_l2<=0.05")
    tried: list[frozenset[str]] = []

    def real(floats: Collection[str]) -> Measurement:
        tried.append(frozenset(floats))
        return measure(floats)

    proxy = {"quiet": 0.0, "loud": 0.0, **{f"l{i}": float(i) for i in range(1, 5)}}
    floats, final = fallback.search(list(errors), real, target, proxy, [], dict.fromkeys(errors, 1.0), 0.25,
                                    beyond=True, isolated_multiply_adds=0.0)  # fmt: skip
    assert final.ok and floats == ["loud"]
    assert len(set(tried)) == len(tried)


def test_the_estimate_rounds_each_weight_to_the_tools_levels() -> None:
    """The proxy's weight error is that of the format the layers get: FP8's levels for FP8 (relative, about the same
    on every channel), INT8's by default (largest on a channel with an outlier)."""
    import onnx_ir as ir

    from onnxprec.quantization._testing import mlp
    from onnxprec.quantization.algorithms.int8 import dequantize_weight
    from onnxprec.quantization.algorithms.qtypes import FP8
    from onnxprec.quantization.fp8 import Fp8Options
    from onnxprec.quantization.int8.decide import plan_for

    proto = mlp()
    weight = next(i for i in proto.graph.initializer if i.name == "Wo")
    w = onnx.numpy_helper.to_array(weight).copy()
    w[0, 0] = 40 * np.abs(w).max()  # one outlier: INT8 rounds its channel 40 times coarser, FP8 as finely
    weight.CopyFrom(onnx.numpy_helper.from_array(w, "Wo"))
    model = ir.serde.deserialize_model(proto)
    layers = plan_for(model, Fp8Options(calibration_data=[{"X": np.zeros((2, 16, 64), np.float32)}])).layers
    fp8 = fallback.estimated_sensitivity(layers, {}, {}, FP8)
    int8 = fallback.estimated_sensitivity(layers, {}, {})
    (name,) = [layer.name for layer in layers if layer.weight.name == "Wo"]
    q, scales = FP8.quantize_weight(w, axis=1)
    expected = np.sum((w - dequantize_weight(q, scales, axis=1)) ** 2) / np.sum(w**2)
    assert fp8[name] == pytest.approx(expected, rel=1e-4)
    assert int8[name] > 3 * fp8[name]  # 5.7 times here
