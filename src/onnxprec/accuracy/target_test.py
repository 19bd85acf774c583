"""The accuracy target: parsed, outputs measured against the kept float outputs, emulated errors scaled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxprec.accuracy import AccuracyTarget, Bound, ErrorScale, Measurement, ReferenceOutputs, badness, measure_outputs


@pytest.mark.parametrize(
    ("spec", "bounds"),
    [
        ("rel_l2<=1e-3", (Bound("rel_l2", "<=", 1e-3),)),
        ("cosine>=0.9999, top1>=0.99", (Bound("cosine", ">=", 0.9999), Bound("top1", ">=", 0.99))),
        ("max_abs<1e-2", (Bound("max_abs", "<", 1e-2),)),
    ],
)
def test_targets_parse(spec: str, bounds: tuple[Bound, ...]) -> None:
    target = AccuracyTarget.parse(spec)
    assert target.bounds == bounds
    assert AccuracyTarget.parse(str(target)).bounds == bounds


def test_badness_is_the_distance_from_perfect() -> None:
    assert badness("cosine", 0.999) == pytest.approx(1e-3)
    assert badness("top1", 1.0) == 0.0
    assert badness("rel_l2", 0.02) == 0.02
    assert badness("rel_l2", math.nan) is None and badness("max_abs", None) is None


def test_measure_outputs_compares_every_float_output_on_every_batch() -> None:
    rng = np.random.default_rng(0)
    kept = ReferenceOutputs()
    kept.batches = [{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(3)]
    kept.outputs = [{"y": b["x"] * 2, "ids": np.argmax(b["x"], axis=1)} for b in kept.batches]
    target = AccuracyTarget.parse("rel_l2<=1e-2,top1>=1")
    exact = measure_outputs(target, kept, lambda b: {"y": b["x"] * 2, "ids": np.zeros(4, np.int64)})
    assert exact.ok and set(exact.errors) == {"y"} and exact.worst("rel_l2") == 0.0 and exact.worst("top1") == 1.0
    noisy = measure_outputs(target, kept, lambda b: {"y": b["x"] * 2.1, "ids": np.zeros(4, np.int64)})
    assert not noisy.ok and noisy.worst("rel_l2") == pytest.approx(0.05, rel=1e-5)
    assert noisy.badness("cosine") == pytest.approx(0.0, abs=1e-6)


def test_error_scale_judges_emulated_errors_in_the_real_unit() -> None:
    target = AccuracyTarget.parse("rel_l2<=0.01")
    emulated = Measurement({"y": {"rel_l2": 0.004, "nonfinite": 0}}, True)
    real = Measurement({"y": {"rel_l2": 0.008, "nonfinite": 0}}, True)
    scale = ErrorScale(emulated, real)
    assert scale.factors["y", "rel_l2"] == pytest.approx(2.0)
    assert scale.holds(target, Measurement({"y": {"rel_l2": 0.0045, "nonfinite": 0}}, True))
    assert not scale.holds(target, Measurement({"y": {"rel_l2": 0.0055, "nonfinite": 0}}, True))  # 0.011 real
    assert not scale.holds(target, Measurement({"y": {"rel_l2": 0.0, "nonfinite": 1}}, True))
