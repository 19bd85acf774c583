"""onnxprec._ort_profile: the kernels ONNX Runtime ran, on tiny hand-built QDQ, dynamic and float graphs."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._ort import import_onnxruntime
from onnxprec._ort_profile import (
    INTEGER_KERNELS,
    QDQ_KERNELS,
    KernelProfile,
    is_integer_kernel,
    profile_kernels,
    read_profile,
)
from onnxprec._testing import F, dynamic_int8_matmuls, make_model, qdq_conv, tensor_info

RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)


def _by_op(profile: KernelProfile) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for kernel in profile.kernels:
        counts[kernel.op_type] += kernel.nodes
    return dict(counts)


def test_qdq_conv_runs_as_one_qlinearconv() -> None:
    model = qdq_conv(W)
    onnx.checker.check_model(model, full_check=True)
    profile = profile_kernels(model, {"x": X}, runs=3)
    ops = _by_op(profile)
    transposes = ops.pop("Transpose", 0)  # ORT's CPU provider may run the QLinearConv in NHWC between two
    assert transposes in (0, 2)
    assert ops == {"QLinearConv": 1, "QuantizeLinear": 1, "DequantizeLinear": 1}
    assert profile.runs == 3 and profile.nodes == 3 + transposes
    assert profile.integer_nodes == 1 and profile.qdq_nodes == 2
    assert all(k.provider == "CPUExecutionProvider" for k in profile.kernels)
    assert profile.integer_share is not None and profile.qdq_share is not None
    assert 0 < profile.integer_share < 1 and 0 < profile.qdq_share < 1
    assert profile.integer_share + profile.qdq_share <= 1 + 1e-9
    # Without ORT's optimizations nothing is fused: every Q and DQ runs, the Conv in float.
    plain = profile_kernels(model, {"x": X}, runs=1, optimization="none")
    assert _by_op(plain) == {"QuantizeLinear": 2, "DequantizeLinear": 3, "Conv": 1}
    assert plain.integer_nodes == 0 and plain.integer_share == 0.0 and plain.qdq_nodes == 5


def test_dynamic_matmul_runs_as_dynamic_quantize_matmul() -> None:
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    profile = profile_kernels(dynamic_int8_matmuls(1), {"x": x}, runs=2)
    assert _by_op(profile) == {"DynamicQuantizeMatMul": 1}
    assert profile.integer_nodes == profile.nodes == 1 and profile.qdq_nodes == 0
    assert profile.integer_share == 1.0 and profile.qdq_share == 0.0
    # One quantized activation read by two MatMuls: quantized once, each MatMul fused to MatMulIntegerToFloat.
    shared = profile_kernels(dynamic_int8_matmuls(2), {"x": x}, runs=2)
    assert _by_op(shared) == {"MatMulIntegerToFloat": 2, "DynamicQuantizeLinear": 1}
    assert shared.integer_nodes == 2 and shared.qdq_nodes == 1 and shared.nodes == 3


def test_float_model_has_no_integer_kernel() -> None:
    model = make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        [tensor_info("x", F, [1, 3, 8, 8])],
        [tensor_info("y", F, [1, 4, 8, 8])],
        {"w": W},
    )
    profile = profile_kernels(model, {"x": X}, runs=2)
    assert profile.integer_nodes == 0 and profile.qdq_nodes == 0 and profile.integer_share == 0.0
    assert profile.nodes >= 1 and "Conv" in _by_op(profile)  # maybe with NCHWc reorders, or fused with the Relu


def test_warm_up_runs_are_dropped_and_time_is_per_run() -> None:
    def node(name: str, op: str, ts: int, dur: int) -> dict[str, object]:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": op, "provider": "CPUExecutionProvider"}}  # fmt: skip

    def run_event(ts: int, dur: int) -> dict[str, object]:
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    events = [
        node("a", "QLinearConv", 10, 500), node("b", "DequantizeLinear", 20, 300), run_event(5, 400),
        {**node("a", "QLinearConv", 109, 1), "name": "a_fence_before"},  # not a kernel's time (older ORT builds)
        node("a", "QLinearConv", 110, 30), node("b", "DequantizeLinear", 120, 10), run_event(105, 40),
        node("a", "QLinearConv", 210, 50), node("b", "DequantizeLinear", 220, 10), run_event(205, 40),
    ]  # fmt: skip
    profile = read_profile(events, warmup=1)
    assert profile.runs == 2 and profile.nodes == 2
    assert [(k.op_type, k.nodes, k.microseconds) for k in profile.kernels] == [
        ("QLinearConv", 1, 40.0),
        ("DequantizeLinear", 1, 10.0),
    ]
    assert profile.integer_share == pytest.approx(0.8) and profile.qdq_share == pytest.approx(0.2)
    assert read_profile(events, warmup=3).nodes == 0
    assert read_profile(events).kernels[0].microseconds == pytest.approx(580 / 3)


def test_integer_kernel_names_are_onnxruntime_ops() -> None:
    state = import_onnxruntime().capi.onnxruntime_pybind11_state
    names = {schema.name for schema in state.get_all_operator_schema()}
    assert names >= INTEGER_KERNELS | QDQ_KERNELS
    for name in names:
        if name.startswith("QLinear") or name.endswith(("Integer", "IntegerToFloat")) or "NBits" in name:
            assert is_integer_kernel(name), name
    assert not any(is_integer_kernel(op) for op in ("Conv", "MatMul", "QuantizeLinear", "QuickGelu", "Gemm"))
