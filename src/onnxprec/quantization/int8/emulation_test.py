"""The INT8 emulation session: every switch off is the float model bit for bit, every configuration is the Q/DQ model
(the real build run by ONNX Runtime without fusions), and the search that uses it meets the target for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec._io import load_model
from onnxprec._ort import create_session
from onnxprec.accuracy import MAX_REAL_CHECKS, ReferenceOutputs
from onnxprec.quantization._testing import correlated, mlp, tiny_cnn
from onnxprec.quantization.int8 import _api, quantize_file
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.decide import Decisions, build, decide, plan_for
from onnxprec.quantization.int8.emulation import Int8Emulator
from onnxprec.quantization.int8.place import Plan


def _tokens(seed: int, batches: int = 3) -> list[dict[str, np.ndarray]]:
    return [{"X": correlated(32, 64, seed=seed + i).reshape(2, 16, 64)} for i in range(batches)]


def _images(seed: int, batches: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(batches)]


def _prepared(
    path: Path, data: list[dict[str, np.ndarray]], **kwargs: Any
) -> tuple[ir.Model, Plan, Decisions, Int8Options]:
    """The sanitized model, its placement and decisions, as the pipeline has them before the target search."""
    options = Int8Options(calibration_data=data, nodes_to_quantize=[".*"], **kwargs)
    model = load_model(path)
    _api._sanitize(model, options)
    plan = plan_for(model, options)
    report = Int8Report("ort-cpu", options.method, "fp32")
    stats, data, _, plan, _ = _api._calibrate(model, plan, options, report, ReferenceOutputs())
    if data is not None:
        data.close()
    return model, plan, decide(model, plan, stats, options), options


def _run(model: ir.Model | str, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = create_session(model, optimization="none")
    return session.run(batch)


CASES = {
    "static Convs": (tiny_cnn, _images),
    "dynamic MatMuls (SmoothQuant, outlier channels)": (mlp, _tokens),
}


@pytest.mark.parametrize("case", list(CASES))
def test_switches_off_is_the_float_model_and_on_is_the_qdq_model(tmp_path: Path, case: str) -> None:
    make, inputs = CASES[case]
    source = tmp_path / "model.onnx"
    onnx.save(make(), source)
    data = inputs(0)
    model, plan, decisions, options = _prepared(source, data, outlier_channels=2)
    names = [layer.name for layer in plan.layers]
    assert names
    with Int8Emulator(model, plan, decisions, options, names) as emulator:
        assert set(emulator.switches) == set(names)
        batch = inputs(5, 1)[0]
        float_outputs = _run(model, batch)
        off = emulator.run(names)(batch)
        for name, expected in zip(emulator.outputs, float_outputs):
            np.testing.assert_array_equal(off[name], expected)  # exact: Where picks the float value
        for floats in [[], *([name] for name in names)]:  # every layer INT8, then each alone in float
            real = model.clone()
            build(real, options, decisions, floats, merge_groups=False)  # unfused: Q/DQ and MatMulInteger arithmetic
            emulated = emulator.run(floats)(batch)
            for name, expected, reference in zip(emulator.outputs, _run(real, batch), float_outputs):
                scale = float(np.abs(reference).max())
                assert np.abs(expected - reference).max() > 1e-4 * scale  # INT8 changed it
                np.testing.assert_allclose(emulated[name], expected, rtol=0, atol=2e-6 * scale)  # float rounding


def test_one_switch_changes_only_what_that_layer_reaches(tmp_path: Path) -> None:
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(head=False), source)
    model, plan, decisions, options = _prepared(source, _tokens(0))
    names = [layer.name for layer in plan.layers]
    batch = _tokens(7, 1)[0]
    with Int8Emulator(model, plan, decisions, options, names) as emulator:
        all_int8 = emulator.run(())(batch)
        last_float = emulator.run(names[-1:])(batch)
        one_int8 = emulator.run(names[1:])(batch)  # only the first layer INT8
    float_outputs = dict(zip(emulator.outputs, _run(model, batch)))
    for name, expected in float_outputs.items():
        assert not np.array_equal(all_int8[name], last_float[name])
        assert not np.array_equal(one_int8[name], expected) and not np.array_equal(one_int8[name], all_int8[name])


@pytest.mark.slow
def test_the_search_checks_its_emulated_choice_for_real(tmp_path: Path) -> None:
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    data = _tokens(0, 4)
    common: dict[str, Any] = {"calibration_data": data, "max_float_compute": 1.0}
    plain = quantize_file(source, tmp_path / "plain.onnx", target_accuracy="rel_l2<=1", **common)
    strict = float(f"{plain.accuracy['rel_l2'] / 2:.4g}")
    out = tmp_path / "q.onnx"
    report = quantize_file(source, out, target_accuracy=f"rel_l2<={strict}", **common)
    kinds = [step["kind"] for step in report.fallback_steps if "kind" in step]
    assert kinds[:2] == ["real", "emulated"] and kinds[-1] == "real"  # all-INT8 real, then emulated, then checked
    assert kinds.count("real") <= 1 + MAX_REAL_CHECKS
    assert 0 < report.count("float") < len(report.layers)
    # the saved model meets the target on the calibration data, run as the user runs it
    session, reference = create_session(str(out), optimization="all"), create_session(str(source), optimization="none")
    num = den = 0.0
    for batch in data:
        got, expected = session.run(batch)[0], reference.run(batch)[0]
        num, den = num + float(np.sum((got - expected) ** 2)), den + float(np.sum(expected**2))
    assert np.sqrt(num / den) <= strict * 1.0001
    assert report.accuracy["rel_l2"] <= strict


def test_the_emulation_is_not_built_when_the_all_int8_model_meets_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), source)
    built: list[int] = []
    original = Int8Emulator.__init__

    def counting(self: Int8Emulator, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Int8Emulator, "__init__", counting)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=_images(0), target_accuracy="rel_l2<=1",
                           nodes_to_quantize=[".*"])  # fmt: skip
    assert report.count("float") == 0 and not built
    assert [step["kind"] for step in report.fallback_steps] == ["real"]


@pytest.mark.slow
def test_static_layers_keep_real_checks(tmp_path: Path) -> None:
    source = tmp_path / "cnn.onnx"
    onnx.save(tiny_cnn(), source)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=_images(0), target_accuracy="rel_l2<=1e-6",
                           nodes_to_quantize=[".*"], max_float_compute=1.0)  # fmt: skip
    kinds = {step["kind"] for step in report.fallback_steps if "kind" in step}
    assert kinds == {"real"} and len(report.fallback_steps) > 2


@pytest.mark.slow
def test_layers_over_the_emulation_memory_limit_keep_real_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxprec.quantization.int8 import fallback

    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)
    common: dict[str, Any] = {"calibration_data": _tokens(0, 4), "max_float_compute": 1.0}
    plain = quantize_file(source, tmp_path / "p.onnx", target_accuracy="rel_l2<=1", **common)
    strict = float(f"{plain.accuracy['rel_l2'] / 2:.4g}")
    emulated = quantize_file(source, tmp_path / "e.onnx", target_accuracy=f"rel_l2<={strict}", **common)
    assert "emulated" in {step.get("kind") for step in emulated.fallback_steps}
    monkeypatch.setattr(fallback, "EMULATION_MAX_BYTES", 0)  # the MLP's weights are now "too large" to emulate
    real = quantize_file(source, tmp_path / "r.onnx", target_accuracy=f"rel_l2<={strict}", **common)
    assert {step["kind"] for step in real.fallback_steps if "kind" in step} == {"real"}
    assert real.accuracy["rel_l2"] <= strict


def test_a_failing_emulation_leaves_every_check_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "mlp.onnx"
    onnx.save(mlp(), source)

    def failing(self: Int8Emulator, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no session here")

    monkeypatch.setattr(Int8Emulator, "__init__", failing)
    report = quantize_file(source, tmp_path / "q.onnx", calibration_data=_tokens(0, 4), target_accuracy="rel_l2<=1e-6",
                           max_float_compute=1.0)  # fmt: skip
    assert {step["kind"] for step in report.fallback_steps if "kind" in step} == {"real"}
    assert "emulation session failed (no session here)" in caplog.text
    assert report.count("float") > 0
