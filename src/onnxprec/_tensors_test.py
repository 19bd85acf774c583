"""Weight conversion: round to nearest even, clamp keeping the sign, NaN kept, converted only when read."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from onnxprec import _tensors
from onnxprec._tensors import cast_array, converted_tensor, finite_max

# Slices of 64 Ki elements in the tests that cast arrays of a few slices (the product's are 4 Mi).
_SLICE = 1 << 16


def test_finite_max_of_each_float_type() -> None:
    assert finite_max(ir.DataType.FLOAT16) == 65504.0
    assert finite_max(ir.DataType.BFLOAT16) == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert finite_max(ir.DataType.FLOAT) == float(np.finfo(np.float32).max)


def test_cast_clamps_to_the_finite_range_and_keeps_signs_and_nan() -> None:
    x = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 1e-9, -1e-9, 0.1], np.float32)
    y = cast_array(x, ir.DataType.FLOAT16)
    assert y.dtype == np.float16
    assert y[:4].tolist() == [65504.0, -65504.0, 65504.0, -65504.0] and np.isnan(y[4])
    assert np.signbit(y[6]) and not np.signbit(y[5])  # tiny values keep their sign (zero or subnormal)
    assert y[7] == np.float16(0.1)  # round to nearest even, as numpy's astype
    b = cast_array(np.array([3e38, -3e38], np.float64), ir.DataType.FLOAT)
    assert b.dtype == np.float32 and np.all(np.isfinite(b))


def test_cast_of_large_arrays_goes_chunk_by_chunk_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tensors, "_CHUNK_ELEMENTS", _SLICE)
    x = np.random.default_rng(0).standard_normal(3 * _SLICE + 1).astype(np.float32) * 1e5
    assert np.array_equal(cast_array(x, ir.DataType.FLOAT16), np.clip(x, -65504, 65504).astype(np.float16))


def test_cast_of_chunks_without_overflow_equals_astype() -> None:
    x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    x[:8] = [65504.0, -65504.0, 65519.0, 6e-8, -3e-8, 2.9e-8, 1e-45, -0.0]  # the extremes and ties that stay in range
    y = cast_array(x, ir.DataType.FLOAT16)
    assert y.tobytes() == x.astype(np.float16).tobytes()


def test_converted_tensor_converts_only_when_read() -> None:
    reads = []
    source = ir.Tensor(np.array([[1.5, 1e9]], np.float32), name="w")

    class Counting(ir.Tensor):
        def numpy(self) -> np.ndarray:  # type: ignore[override]
            reads.append(1)
            return super().numpy()

    lazy = converted_tensor(Counting(source.numpy(), name="w"), ir.DataType.BFLOAT16)
    assert reads == [] and lazy.dtype == ir.DataType.BFLOAT16 and lazy.shape == ir.Shape((1, 2)) and lazy.name == "w"
    values = lazy.numpy()
    assert reads == [1] and values.dtype == ml_dtypes.bfloat16 and np.all(np.isfinite(values.astype(np.float32)))


def test_a_faster_fp16_kernel_never_changes_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # ONNX Runtime's hardware conversion is used where it gives no inf/NaN (then it is numpy's, bit for bit); slices
    # with out-of-range values, infinities or NaN payloads are converted again the clamping way; the last slice (5
    # elements) is numpy's.
    from onnxprec._ort import float_to_fp16

    monkeypatch.setattr(_tensors, "_CHUNK_ELEMENTS", _SLICE)
    rng = np.random.default_rng(2)
    n = 3 * _SLICE + 5
    normal = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 10, n))).astype(np.float32)
    bits = np.frombuffer(rng.integers(0, 2**32, n, dtype=np.uint32).tobytes(), np.float32)  # NaN payloads, inf, huge
    calls: list[int] = []

    def kernel(source: np.ndarray, out: np.ndarray) -> None:
        calls.append(source.size)
        float_to_fp16(source, out)

    for x in (np.clip(normal, -65504, 65504), normal, bits, bits[1:].reshape(-1, 2)):
        calls.clear()
        with np.errstate(invalid="ignore", over="ignore"):
            expected = cast_array(x, ir.DataType.FLOAT16)
            got = cast_array(x, ir.DataType.FLOAT16, kernel)
        assert calls and got.shape == x.shape and got.tobytes() == expected.tobytes()
    assert cast_array(np.ones(2, np.float64), ir.DataType.FLOAT16, kernel).dtype == np.float16  # not float32: numpy
