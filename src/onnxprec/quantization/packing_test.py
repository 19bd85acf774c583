"""Bit-exact INT4 layouts, checked against onnx_ir/onnx serialization and ONNX Runtime's kernels."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxprec.quantization.algorithms.rtn import QuantizedWeight, quantize_rtn
from onnxprec.quantization.packing import (
    matmulnbits_attributes,
    pack_matmulnbits,
    qdq_arrays,
    to_ml_dtypes_int4,
    unpack_matmulnbits,
)

K, N = 100, 48  # K is not a multiple of the block sizes
CASES = [(bits, bs, sym) for bits in (4, 8) for bs in (32, 16, -1) for sym in (True, False)]


def _weight(bits: int, bs: int, symmetric: bool) -> QuantizedWeight:
    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    return quantize_rtn(w, bs, symmetric=symmetric, bits=bits)


def _session(model: onnx.ModelProto, optimize: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if optimize:  # DQ -> MatMul is fused into MatMulNBits; keep its compute in fp32 (the default level 4 is int8)
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    else:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], domains: dict[str, int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["T", K])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["T", N])],
        inits,
    )
    opsets = [helper.make_opsetid(domain, version) for domain, version in domains.items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _assert_close_outputs(y: np.ndarray, expected: np.ndarray) -> None:
    assert np.abs(y - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("signed", [True, False])
def test_ml_dtypes_int4_serializes_two_per_byte_low_nibble_first(signed: bool) -> None:
    values = np.array([[-8, 7, 1], [-1, 3, 0], [5, -3, 2]]) if signed else np.array([[0, 15, 1], [14, 3, 0], [5, 9, 2]])
    data = to_ml_dtypes_int4(values, signed)
    assert data.dtype == (ml_dtypes.int4 if signed else ml_dtypes.uint4)
    tensor = ir.Tensor(data, dtype=ir.DataType.INT4 if signed else ir.DataType.UINT4)
    nibbles = [*(values.reshape(-1) & 0xF).tolist(), 0]  # 9 values: the last byte's high nibble is padding
    expected = bytes(lo | (hi << 4) for lo, hi in zip(nibbles[0::2], nibbles[1::2]))
    assert tensor.tobytes() == expected
    proto = ir.serde.serialize_tensor(tensor)
    assert proto.data_type == (onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4)
    np.testing.assert_array_equal(numpy_helper.to_array(proto).astype(np.int8), values)
    with pytest.raises(ValueError, match="range"):
        to_ml_dtypes_int4(values + 8, signed)


def test_matmulnbits_layout_by_hand() -> None:
    q = np.tile(np.arange(-8, 8, dtype=np.int8), 2)[:, None]  # K=32, N=1, symmetric: stored as q + 8 = 0..15
    qw = QuantizedWeight(q=q, scales=np.ones((2, 1), np.float32), zero_points=None, block_size=16)
    packed = pack_matmulnbits(qw)
    assert packed.b.shape == (1, 2, 8) and packed.b.dtype == np.uint8 and packed.zero_points is None
    assert packed.b[0, 0].tolist() == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    zp = np.array([[3], [12], [5]], np.uint8)  # three blocks: zero points packed per column, low nibble first
    qw = QuantizedWeight(
        q=np.zeros((40, 1), np.uint8), scales=np.ones((3, 1), np.float32), zero_points=zp, block_size=16
    )
    packed = pack_matmulnbits(qw, 40)
    assert packed.zero_points is not None and packed.zero_points.tolist() == [[0xC3, 0x05]]
    assert packed.b[0, 2, 4:].tolist() == [0x55] * 4  # padded rows 40..47 hold the zero point: they dequantize to 0
    with pytest.raises(ValueError, match="does not match"):
        pack_matmulnbits(qw, 41)


@pytest.mark.parametrize(("bits", "bs", "symmetric"), CASES)
def test_matmulnbits_round_trip_and_onnxruntime(bits: int, bs: int, symmetric: bool) -> None:
    qw = _weight(bits, bs, symmetric)
    packed = pack_matmulnbits(qw, K)
    attrs: dict[str, Any] = dict(matmulnbits_attributes(qw))
    block = attrs["block_size"]
    assert block == (128 if bs == -1 else bs)  # per-channel K=100 is padded to the next power of two
    n_blocks = -(-K // block)
    assert packed.b.shape == (N, n_blocks, block * bits // 8) and packed.scales.shape == (N, n_blocks)
    if not symmetric:
        assert packed.zero_points is not None
        assert packed.zero_points.shape == (N, -(-n_blocks * bits // 8))

    back = unpack_matmulnbits(packed.b, packed.scales, packed.zero_points, K, bits=bits)
    np.testing.assert_array_equal(back.q, qw.q)
    assert back.q.dtype == qw.q.dtype and back.bits == bits
    np.testing.assert_array_equal(back.dequantize(), qw.dequantize())
    if bs != -1:
        np.testing.assert_array_equal(back.scales, qw.scales)
        if not symmetric:
            np.testing.assert_array_equal(back.zero_points, qw.zero_points)

    inputs = ["X", "B", "S"] + ([] if packed.zero_points is None else ["Z"])
    inits = [numpy_helper.from_array(packed.b, "B"), numpy_helper.from_array(packed.scales, "S")]
    if packed.zero_points is not None:
        inits.append(numpy_helper.from_array(packed.zero_points, "Z"))
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", **attrs)
    model = _model([node], inits, {"": 21, "com.microsoft": 1})
    x = np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)
    (y,) = _session(model, optimize=True).run(None, {"X": x})
    _assert_close_outputs(y, x @ qw.dequantize())


@pytest.mark.parametrize(("bits", "bs", "symmetric"), CASES)
def test_qdq_form_is_valid_and_matches_onnxruntime(bits: int, bs: int, symmetric: bool) -> None:
    qw = _weight(bits, bs, symmetric)
    data, scales, zero_points = qdq_arrays(qw)
    dtype = {
        (4, True): ir.DataType.INT4,
        (4, False): ir.DataType.UINT4,
        (8, True): ir.DataType.INT8,
        (8, False): ir.DataType.UINT8,
    }[(bits, symmetric)]
    inits = [ir.serde.serialize_tensor(ir.Tensor(data, dtype=dtype, name="W")), numpy_helper.from_array(scales, "S")]
    inputs = ["W", "S"]
    if zero_points is not None:
        inits.append(ir.serde.serialize_tensor(ir.Tensor(zero_points, dtype=dtype, name="Z")))
        inputs.append("Z")
    nodes = [
        helper.make_node("DequantizeLinear", inputs, ["Wd"], axis=0, block_size=qw.block_size),
        helper.make_node("MatMul", ["X", "Wd"], ["Y"]),
    ]
    model = _model(nodes, inits, {"": 21})
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(2).standard_normal((5, K)).astype(np.float32)
    for optimize in (False, True):
        (y,) = _session(model, optimize).run(None, {"X": x})
        _assert_close_outputs(y, x @ qw.dequantize())


def test_scale_dtype() -> None:
    qw = _weight(4, 32, True)
    assert pack_matmulnbits(qw, scale_dtype=np.float16).scales.dtype == np.float16
    assert qdq_arrays(qw, ml_dtypes.bfloat16).scales.dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize(("bits", "bs", "symmetric"), [c for c in CASES if c[1] != -1])
def test_gather_block_quantized_reads_the_matmulnbits_layout(bits: int, bs: int, symmetric: bool) -> None:
    """An embedding table [N=48, K=100] is the [K, N] weight's MatMulNBits B with its last axes merged; scales and
    zero points are MatMulNBits's. K=100 is padded to whole blocks, so a gathered row has the padding at its end."""
    qw = _weight(bits, bs, symmetric)
    packed = pack_matmulnbits(qw, K)
    n_blocks = packed.b.shape[1]
    data = packed.b.reshape(N, -1)
    inputs = ["D", "I", "S"] + ([] if packed.zero_points is None else ["Z"])
    inits = [numpy_helper.from_array(data, "D"), numpy_helper.from_array(packed.scales, "S")]
    if packed.zero_points is not None:
        inits.append(numpy_helper.from_array(packed.zero_points, "Z"))
    node = helper.make_node(
        "GatherBlockQuantized", inputs, ["Y"], domain="com.microsoft", bits=bits, block_size=bs, gather_axis=0,
        quantize_axis=1,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("I", onnx.TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [2, 3, n_blocks * bs])], inits,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    ids = np.array([[0, 47, 5], [-1, 20, 0]])
    (y,) = _session(model, optimize=True).run(None, {"I": ids})
    np.testing.assert_array_equal(y[..., :K], qw.dequantize().T[ids])
    np.testing.assert_array_equal(y[..., K:], 0)  # padded values sit on the zero point


@pytest.mark.parametrize(("bits", "bs", "symmetric"), [c for c in CASES if c[1] != -1])
def test_qdq_table_dequantizes_along_axis_1_before_gather(bits: int, bs: int, symmetric: bool) -> None:
    qw = _weight(bits, bs, symmetric)
    data, scales, zero_points = (None if a is None else np.ascontiguousarray(a.T) for a in qdq_arrays(qw))
    assert data is not None and scales is not None
    dtype = {
        4: ir.DataType.INT4 if symmetric else ir.DataType.UINT4,
        8: ir.DataType.INT8 if symmetric else ir.DataType.UINT8,
    }
    inits = [
        ir.serde.serialize_tensor(ir.Tensor(data, dtype=dtype[bits], name="W")),
        numpy_helper.from_array(scales, "S"),
    ]
    inputs = ["W", "S"]
    if zero_points is not None:
        inits.append(ir.serde.serialize_tensor(ir.Tensor(zero_points, dtype=dtype[bits], name="Z")))
        inputs.append("Z")
    nodes = [
        helper.make_node("DequantizeLinear", inputs, ["T"], axis=1, block_size=bs),
        helper.make_node("Gather", ["T", "I"], ["Y"], axis=0),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("I", onnx.TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [4, K])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    ids = np.array([0, 47, 5, -2])
    for optimize in (False, True):
        (y,) = _session(model, optimize).run(None, {"I": ids})
        np.testing.assert_array_equal(y, qw.dequantize().T[ids])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_matmulnbits_packing_in_column_chunks_is_the_same(
    bits: int, symmetric: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An LLM head's levels are widened a chunk of columns at a time (not two int16 copies of the whole weight)
    from onnxprec.quantization import packing

    w = np.random.default_rng(4).standard_normal((96, 1000)).astype(np.float32)
    qw = quantize_rtn(w, 32, symmetric=symmetric, bits=bits)
    whole = pack_matmulnbits(qw)
    monkeypatch.setattr(packing, "_PACK_CHUNK_BYTES", 500)  # 2 columns a chunk
    chunked = pack_matmulnbits(qw)
    for a, b in zip(whole, chunked):
        assert (a is None and b is None) or np.array_equal(a, b)
