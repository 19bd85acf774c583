"""The Q/DQ element types' numerics against ONNX Runtime's QuantizeLinear/DequantizeLinear and the ONNX reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxprec._ort import create_session
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization.algorithms.qtypes import FP8, FP8_ACTIVATION, INT8, INT16, QTYPES, UINT8, UINT16, qtype

_ONNX = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
         "uint16": TensorProto.UINT16, "fp8": TensorProto.FLOAT8E4M3FN}  # fmt: skip


def _qdq_model(name: str, scale: float, zero_point: int, shape: list[int]) -> onnx.ModelProto:
    zero = helper.make_tensor("z", _ONNX[name], [], [zero_point])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info("q", _ONNX[name], shape),
               helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    graph = helper.make_graph(
        nodes, "qdq", inputs, outputs, [numpy_helper.from_array(np.array(scale, np.float32), "s"), zero]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_levels_and_values_are_onnx_runtimes_and_the_references(name: str) -> None:
    q = qtype(name)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((16, 64)) * 3).astype(np.float32)
    x[0, :4] = [1e4, -1e4, 0.0, 1e-9]  # saturation both ways, zero, a tiny value
    scale, zero_point = q.scale_zero_point(-4.0, 5.0)
    if q.symmetric and not q.is_float:  # QuantizeLinear saturates at -qmax - 1, a level our symmetric grids leave out
        x = np.maximum(x, -q.qmax * scale)
    model = _qdq_model(name, scale, zero_point, [16, 64])
    onnx.checker.check_model(model, full_check=True)
    levels, values = create_session(model, optimization="none").run({"x": x})
    reference = ReferenceEvaluator(model).run(None, {"x": x})
    ours = q.quantize(x, scale, zero_point)
    assert np.array_equal(ours.view(np.uint8), np.asarray(levels).view(np.uint8))
    assert np.array_equal(ours.view(np.uint8), np.asarray(reference[0]).view(np.uint8))
    assert np.array_equal(q.fake(x, scale, zero_point), values)


def test_scales_and_zero_points() -> None:
    assert INT8.scale_zero_point(-2.0, 1.0) == (2.0 / 127, 0)
    assert INT16.scale_zero_point(-2.0, 1.0) == (2.0 / 32767, 0)
    assert FP8.scale_zero_point(-2.0, 1.0) == (2.0 / 448, 0)
    scale, zero = UINT8.scale_zero_point(-1.0, 3.0)
    assert scale == 4.0 / 255 and zero == round(255 / 4)
    scale, zero = UINT16.scale_zero_point(0.5, 3.0)  # the range is widened to hold 0
    assert scale == 3.0 / 65535 and zero == 0
    assert INT8.scale_zero_point(0.0, 0.0) == (1.0, 0)
    assert FP8.bits == 8 and INT16.bits == 16 and FP8.is_float and not INT8.is_float


def test_weights_per_channel_put_each_channels_largest_value_on_the_last_level() -> None:
    w = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    w[:, 3] = 0.0  # a channel of zeros: scale 1
    for q in (INT8, FP8):
        levels, scales = q.quantize_weight(w, axis=1)
        assert scales.shape == (5,) and scales[3] == 1.0
        top = np.abs(levels.astype(np.float32)).max(axis=0)
        if q.is_float:  # aligned: the largest magnitude between 448 / 2 and 448
            assert np.all((np.delete(top, 3) > q.qmax / 2) & (np.delete(top, 3) <= q.qmax)) and top[3] == 0
        else:
            assert np.allclose(np.delete(top, 3), q.qmax) and top[3] == 0
        assert np.abs(q.dequantize(levels, scales[None, :]) - w).max() <= np.abs(w).max() * (
            0.07 if q.is_float else 0.005
        )
    with pytest.raises(InvalidArgumentError, match="weights are symmetric"):
        UINT8.quantize_weight(w, axis=1)


def test_fp8_activations_leave_room_above_the_calibrated_range_on_the_same_relative_levels() -> None:
    """The calibrated maximum goes on 448 / 16: 16 times it still passes, and every value of E4M3's normal range
    rounds to the level it gets without the room, 16 times smaller (a power of 2 moves no rounding boundary)."""
    scale, zero = FP8_ACTIVATION.scale_zero_point(-2.0, 1.0)
    assert (scale, zero) == (2.0 * 16 / 448, 0)
    x = np.linspace(-40.0, 40.0, 4001, dtype=np.float32)
    roomy = FP8_ACTIVATION.fake(x, scale)
    assert roomy.max() == pytest.approx(32.0) and roomy.min() == pytest.approx(-32.0)  # 16 x 2, the largest seen
    plain = FP8.fake(x, FP8.scale_zero_point(-2.0, 1.0)[0])
    normal = (np.abs(x) >= 2.0 * 16 / 448 * 2.0**-6) & (np.abs(x) <= 2.0)  # in range for both, normal with the room
    assert np.array_equal(roomy[normal], plain[normal])
    with pytest.raises(InvalidArgumentError, match="Unknown quantization type 'int4'"):
        qtype("int4")


def test_fp8_weight_scales_are_aligned_for_the_least_rounding_error() -> None:
    """Each channel's scale is the one of the 16 alignments that rounds it best: never worse than the largest
    magnitude on 448, and better over many channels."""
    from onnxprec.quantization.algorithms.qtypes import FP8_ALIGNMENTS

    w = np.random.default_rng(2).standard_normal((64, 3, 3, 3)).astype(np.float32)
    levels, scales = FP8.quantize_weight(w, axis=0)
    plain = (np.abs(w).reshape(64, -1).max(axis=1) / 448).astype(np.float32)
    ratio = scales / plain
    assert np.all([np.isclose(r, FP8_ALIGNMENTS).any() for r in ratio])
    error = np.square(FP8.dequantize(levels, scales.reshape(-1, 1, 1, 1)) - w).reshape(64, -1).sum(axis=1)
    error_plain = np.square(FP8.fake(w, plain.reshape(-1, 1, 1, 1)) - w).reshape(64, -1).sum(axis=1)
    assert np.all(error <= error_plain) and error.sum() < 0.95 * error_plain.sum()


def test_fp8_fake_quantization_is_the_round_trip_through_fp8_bit_for_bit() -> None:
    """FP8's fake quantization rounds in float32: the same bits as converting to FP8 and back, on every FP8 value,
    every midpoint between two of them (ties to even) and the float32 values next to each, subnormals included,
    random bit patterns, and a scale and zero point applied as DequantizeLinear does."""
    values = np.arange(256, dtype=np.uint8).view(FP8.dtype).astype(np.float32)
    values = np.unique(values[np.isfinite(values)])
    midpoints = ((values[1:].astype(np.float64) + values[:-1]) / 2).astype(np.float32)
    ratios = [values, midpoints]
    for points in (values, midpoints):
        ratios += [np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))]
    bits = np.random.default_rng(3).integers(0, 0x43E00001, 200_000, dtype=np.uint32).view(np.float32)
    x = np.clip(np.concatenate([*ratios, bits, -bits]), -448, 448).astype(np.float32)
    for scale in (np.float32(1.0), np.float32(0.0123)):
        expected = FP8.dequantize(FP8.quantize(x * scale, scale), scale)
        assert np.array_equal(FP8.fake(x * scale, scale).view(np.uint32), expected.view(np.uint32))
    channels = np.random.default_rng(4).standard_normal((16, 40)).astype(np.float32)
    scales = np.abs(channels).max(axis=1, keepdims=True) / np.float32(300.0)  # values beyond 448: clipped
    expected = FP8.dequantize(FP8.quantize(channels, scales), scales)
    assert np.array_equal(FP8.fake(channels, scales).view(np.uint32), expected.view(np.uint32))
    assert FP8.fake(np.float32(3.3), np.float32(0.1)) == FP8.dequantize(FP8.quantize(np.float32(3.3), 0.1), 0.1)
