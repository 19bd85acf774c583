"""Tests of the emulation pass and session: switches off is the FP32 model, on rounds where the converter would."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec.autocast.emulator import EmulateRoundingPass, EmulationResult, Emulator

_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8] x) => (float[2, 8] y) <float[8] w = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 70000.0}> {
    a = Mul(x, w)
    y = Relu(a)
}
"""


def _round(array: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return array.astype(np.float16).astype(np.float32)  # activations overflow to inf, as FP16 does


def test_switches_off_is_the_model_and_on_rounds_every_edge_of_the_low_nodes() -> None:
    model = ir.from_onnx_text(_MODEL)
    before = ir.serde.serialize_model(model).SerializeToString()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32) * 3
    emulator = Emulator(model, set(), list(model.graph), ir.DataType.FLOAT16, keep_io_types=True)
    try:
        assert ir.serde.serialize_model(model).SerializeToString() == before
        exact = emulator.run([])({"x": x})["y"]
        rounded = emulator.run([0, 1])({"x": x})["y"]
    finally:
        emulator.close()
    w = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 70000.0], np.float32)
    np.testing.assert_array_equal(exact, np.maximum(x * w, 0))
    np.testing.assert_array_equal(rounded, _round(np.maximum(_round(_round(x) * _round(np.clip(w, -65504, 65504))), 0)))


def test_the_pass_makes_a_valid_model_with_one_switch_per_set_of_candidates() -> None:
    model = ir.from_onnx_text(_MODEL)
    mul, relu = list(model.graph)
    result = EmulateRoundingPass({mul}, [relu], ir.DataType.FLOAT16, keep_io_types=True)(model)
    assert isinstance(result, EmulationResult)
    assert result.switches == [frozenset({0})]  # the Mul is low anyway: only the Relu's output edge is switched
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    session = _ort.create_session(proto.SerializeToString(), optimization="none")
    x = np.ones((2, 8), np.float32)
    fetch = list(result.fetch.values())
    outputs = session.run({"x": x, EmulateRoundingPass.SWITCH.format(0): np.array(False)}, fetch)
    assert len(outputs) == 1 and outputs[0].shape == (2, 8)
