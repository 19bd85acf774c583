"""A static tensor read by a saturating activation only: detected in the graph, its range calibrated for the
activation's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.observers import Histogram
from onnxprec.quantization.algorithms.ranges import activation_range, calibrated_range, scale_zero_point
from onnxprec.quantization.int8 import quantize_file
from onnxprec.quantization.int8.activations import activation_of


def _tail(kind: str) -> list[onnx.NodeProto]:
    """The activation after a Conv's output ``c`` (its result ``a``)."""
    if kind == "silu":
        return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
    if kind == "hardswish":  # written out, as PaddlePaddle exports it
        return [
            helper.make_node("Add", ["c", "three"], ["c3"]),
            helper.make_node("Clip", ["c3", "zero", "six"], ["cl"]),
            helper.make_node("Mul", ["c", "cl"], ["m"]),
            helper.make_node("Div", ["m", "six"], ["a"]),
        ]
    if kind == "relu_and_sigmoid":  # two activations of the same tensor: no single function
        return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Relu", ["c"], ["r"]),
                helper.make_node("Add", ["s", "r"], ["a"])]  # fmt: skip
    return [helper.make_node(kind, ["c"], ["a"])]


def _model(kind: str, channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Conv", ["hr", "w2", "b2"], ["c"], pads=[1, 1, 1, 1]),
        *_tail(kind),
        helper.make_node("Conv", ["a", "w3"], ["y"]),
    ]
    inits = {
        "w1": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3,
        "b1": np.zeros(channels, np.float32),
        "w2": rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.15,
        "b2": np.full(channels, -2.0, np.float32),  # mostly negative: the flat side of the activation
        "w3": rng.standard_normal((channels, channels, 1, 1)).astype(np.float32) * 0.3,
        "three": np.array(3.0, np.float32),
        "zero": np.array(0.0, np.float32),
        "six": np.array(6.0, np.float32),
    }
    return make_model(nodes, [tensor_info("x", F, [2, 3, 12, 12])], [tensor_info("y", F, None)], inits)


@pytest.mark.parametrize(
    ("kind", "at", "expected"),
    [("silu", -6.0, -6.0 / (1 + np.exp(6.0))), ("hardswish", -4.0, 0.0), ("Sigmoid", 0.0, 0.5),
     ("HardSwish", 1.0, 1.0 * (1 / 6 + 0.5)), ("HardSigmoid", 1.0, 0.7), ("relu_and_sigmoid", 0.0, None),
     ("Relu", 0.0, None)],
)  # fmt: skip
def test_the_activation_reading_a_tensor_is_found(kind: str, at: float, expected: float | None) -> None:
    model = ir.serde.deserialize_model(_model(kind))
    conv_output = next(v for node in model.graph for v in node.outputs if v.name == "c")
    function = activation_of(conv_output)
    if expected is None:
        assert function is None
        return
    assert function is not None
    value = float(function(np.array([at], np.float32))[0])
    scale = 6.0 if kind == "hardswish" else 1.0  # the written-out form before its Div by 6
    assert value / scale == pytest.approx(expected, abs=1e-6)


def test_a_silu_input_range_gives_its_levels_to_the_steep_side() -> None:
    rng = np.random.default_rng(0)
    hist = Histogram(bins=2048)
    values = np.concatenate([rng.normal(-3, 3, 200_000), rng.exponential(1.0, 50_000)]).astype(np.float32)
    hist.add(values)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    plain = calibrated_range(hist, "mse")
    lo, hi = activation_range(hist, silu, float(values.min()), float(values.max()))
    assert lo > plain[0] and hi <= float(values.max())

    def error(bounds: tuple[float, float]) -> float:
        scale, zero = scale_zero_point(*bounds, symmetric=False)
        q = (np.clip(np.round(values / scale) + zero, 0, 255) - zero) * scale
        return float(np.mean((silu(q) - silu(values)) ** 2))

    assert error((lo, hi)) < 0.7 * error(plain)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["silu", "hardswish"])
def test_int8_after_a_saturating_activation_is_closer_to_float(kind: str, tmp_path: Path) -> None:
    """End to end through ONNX Runtime: the model with the activation-aware range against the plain MSE range
    (the same model with the activation rewritten to be opaque to the detection: an Identity in front of it)."""
    rng = np.random.default_rng(1)
    data = tmp_path / "calib"
    data.mkdir()
    feeds = [{"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)} for _ in range(4)]
    for i, feed in enumerate(feeds):
        np.savez(data / f"{i:03d}.npz", **feed)
    errors = {}
    for variant in ("aware", "plain"):
        model = _model(kind)
        if variant == "plain":  # an Identity between the Conv and one consumer hides the pattern
            for node in model.graph.node:
                if node.op_type in ("Sigmoid", "Add") and node.input[0] == "c":
                    node.input[0] = "c_id"
            model.graph.node.insert(3, helper.make_node("Identity", ["c"], ["c_id"]))
        source = tmp_path / f"{variant}.onnx"
        onnx.save(model, source)
        quantize_file(source, tmp_path / f"{variant}.int8.onnx", calibration_data=data, accuracy_guard=False)
        reference, candidate = create_session(model), create_session(onnx.load(tmp_path / f"{variant}.int8.onnx"))
        ref = np.concatenate([reference.run(f)[0] for f in feeds])
        got = np.concatenate([candidate.run(f)[0] for f in feeds])
        errors[variant] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert errors["aware"] < errors["plain"], errors
