"""RTN, its searches, GPTQ and the output error through an array backend other than numpy.

A strict fake device runs everywhere: its arrays are numpy arrays of their own type whose operations refuse plain
numpy arrays (CuPy refuses host arrays the same way) and whose numpy functions fail (the algorithms must call their
namespace's), so a missed ``np.`` call or a host array mixed into device arithmetic fails here; what it computes is
numpy's, so the results must equal the numpy path's bit for bit. With CuPy and a GPU, the same cases run on CuPy and
must equal numpy's to rounding.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from onnxprec import _array
from onnxprec.quantization.algorithms.awq import awq_lite
from onnxprec.quantization.algorithms.gptq import gptq, hessian_from_tokens
from onnxprec.quantization.algorithms.rtn import QuantGrid, QuantizedWeight, quantize_dequantize, quantize_rtn
from onnxprec.quantization.algorithms.search import SEARCHES
from onnxprec.quantization.methods import GroupStats, QuantConfig, decide_group


class DeviceArray(np.ndarray):
    """An array 'on the fake device': its ufuncs refuse plain numpy arrays, numpy's functions refuse it."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, out: Any = None, **kwargs: Any) -> Any:
        _refuse_host(inputs + (out or ()))
        if out is not None:
            kwargs["out"] = tuple(_host(o) for o in out)
        result = getattr(ufunc, method)(*(_host(x) for x in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _device(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TypeError(f"numpy.{func.__name__} called on a fake device array: call the namespace's")

    def __setitem__(self, key: Any, value: Any) -> None:
        _refuse_host((value,))
        np.ndarray.__setitem__(self.view(np.ndarray), key, _host(value))


def _host(x: Any) -> Any:
    if isinstance(x, DeviceArray):
        return x.view(np.ndarray)
    if isinstance(x, (tuple, list)):
        return type(x)(_host(v) for v in x)
    return x


def _device(x: Any) -> Any:
    if isinstance(x, np.ndarray) and not isinstance(x, DeviceArray):
        return x.view(DeviceArray)
    if isinstance(x, tuple):
        return tuple(_device(v) for v in x)
    return x


def _refuse_host(values: Any) -> None:
    for value in values:
        if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray):
            raise TypeError(f"a host array {value.shape} {value.dtype} mixed into fake device arithmetic")


class FakeDevice:
    """The namespace of :class:`DeviceArray`: numpy's functions on device arrays only; ``asarray`` moves in."""

    def __init__(self, numpy_module: Any = np) -> None:
        self._np = numpy_module
        self.moved_in = 0
        self.moved_out = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._np, name)
        if name == "linalg":
            return FakeDevice(target)
        if not callable(target) or isinstance(target, type):
            return target  # dtypes, constants

        def call(*args: Any, **kwargs: Any) -> Any:
            _refuse_host(args)
            _refuse_host(kwargs.values())
            return _device(target(*_host(args), **{k: _host(v) for k, v in kwargs.items()}))

        return call

    def asarray(self, array: Any, dtype: Any = None) -> DeviceArray:
        if not isinstance(array, DeviceArray) and np.ndim(array):  # scalars are not counted
            self.moved_in += int(np.asarray(array).nbytes)
        return np.array(_host(array), dtype=dtype).view(DeviceArray)

    def to_host(self, array: Any) -> np.ndarray:
        assert isinstance(array, DeviceArray), type(array)
        self.moved_out += int(array.nbytes)
        return np.array(array.view(np.ndarray))


def _fake_backend(memory_limit: int = 1 << 30) -> tuple[_array.ArrayBackend, FakeDevice]:
    device = FakeDevice()
    _array.register_namespace(DeviceArray, device)
    backend = _array.ArrayBackend("fake", device, device=0, memory_limit=memory_limit, to_host=device.to_host)
    return backend, device


def _assert_same(result: QuantizedWeight, reference: QuantizedWeight) -> None:
    for got in (result.q, result.scales, result.zero_points):
        assert got is None or type(got) is np.ndarray
    assert result.q.dtype == reference.q.dtype and result.block_size == reference.block_size
    np.testing.assert_array_equal(result.q, reference.q)
    np.testing.assert_array_equal(result.scales, reference.scales)
    if reference.zero_points is None:
        assert result.zero_points is None
    else:
        assert result.zero_points is not None
        np.testing.assert_array_equal(result.zero_points, reference.zero_points)


def _weight(k: int = 200, n: int = 48, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[:, 3] = 0.0  # a column of empty blocks
    w[5, :] *= 20.0  # outliers
    return w


def _ratios(w: np.ndarray, block_size: int) -> np.ndarray:
    """Fixed clip ratios 0.7..1 per (block, column) of ``w``."""
    shape = (-(-w.shape[0] // block_size), w.shape[1])
    return np.random.default_rng(1).uniform(0.7, 1.0, shape).astype(np.float32)


RTN_CASES: dict[str, Callable[..., QuantizedWeight]] = {
    "rtn": lambda w, **kw: quantize_rtn(w, 64, **kw),
    "rtn_zp": lambda w, **kw: quantize_rtn(w, 64, symmetric=False, **kw),
    "rtn_positive": lambda w, **kw: quantize_rtn(w, 32, positive_scales=True, **kw),
    "rtn_clip": lambda w, **kw: quantize_rtn(w, 64, clip_search=True, **kw),
    "rtn_ratios": lambda w, **kw: quantize_rtn(w, 64, clip_ratios=_ratios(w, 64), **kw),
    "per_channel_int8": lambda w, **kw: quantize_rtn(w, -1, bits=8, **kw),
    "kquant": lambda w, **kw: quantize_rtn(w, 64, search=SEARCHES["kquant"], **kw),
    "kquant_zp": lambda w, **kw: quantize_rtn(w, 64, symmetric=False, search=SEARCHES["kquant"], **kw),
    "kquant_positive": lambda w, **kw: quantize_rtn(w, 32, positive_scales=True, search=SEARCHES["kquant"], **kw),
    "hqq": lambda w, **kw: quantize_rtn(w, 64, search=SEARCHES["hqq"], **kw),
    "hqq_zp": lambda w, **kw: quantize_rtn(w, 64, symmetric=False, search=SEARCHES["hqq"], **kw),
}


@pytest.mark.parametrize("case", list(RTN_CASES))
def test_rtn_and_searches_on_a_fake_device_equal_numpy(case: str) -> None:
    w = _weight()  # K = 200: a partial last block
    backend, device = _fake_backend()
    result = RTN_CASES[case](w, backend=backend)
    _assert_same(result, RTN_CASES[case](w))
    assert device.moved_in >= w.nbytes
    # only levels (one byte each), scales and zero points come back, never float32 weights
    levels = w.size * result.q.itemsize
    params = result.scales.nbytes + (0 if result.zero_points is None else result.zero_points.nbytes)
    assert device.moved_out == levels + params


def test_rtn_chunks_by_the_memory_limit() -> None:
    w = _weight(k=128, n=64)
    backend, device = _fake_backend(memory_limit=4 * 128 * 16 * 12)  # chunks of 16 columns
    _assert_same(quantize_rtn(w, 32, clip_search=True, backend=backend), quantize_rtn(w, 32, clip_search=True))
    assert device.moved_in == w.nbytes


def _tokens(t: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((t, k)) @ (rng.standard_normal((k, k)) / np.sqrt(k))).astype(np.float32)


@pytest.mark.parametrize(
    ("symmetric", "act_order", "block_size", "lazy_batch"),
    [(True, False, 32, 128), (False, False, 32, 16), (True, True, 32, 24), (True, False, -1, 7)],
)
def test_gptq_on_a_fake_device_equals_numpy(symmetric: bool, act_order: bool, block_size: int, lazy_batch: int) -> None:
    x = _tokens(512, 96, seed=1)
    x[:, 7] = 0.0  # a dead input channel
    w = _weight(k=96, n=40, seed=2)
    hessian, n = hessian_from_tokens(x)
    kwargs = {"symmetric": symmetric, "act_order": act_order, "lazy_batch": lazy_batch}
    backend, device = _fake_backend()
    _assert_same(gptq(w, hessian, n, block_size, backend=backend, **kwargs), gptq(w, hessian, n, block_size, **kwargs))
    assert device.moved_in >= hessian.nbytes + w.nbytes


def test_gptq_falls_back_to_numpy_when_it_does_not_fit() -> None:
    x = _tokens(256, 64, seed=3)
    w = _weight(k=64, n=16, seed=4)
    hessian, n = hessian_from_tokens(x)
    backend, device = _fake_backend(memory_limit=64 * 64 * 8)  # not even the factorisation fits
    _assert_same(gptq(w, hessian, n, 32, backend=backend), gptq(w, hessian, n, 32))
    assert device.moved_in == 0 and device.moved_out == 0


def test_decide_group_on_a_fake_device_equals_numpy() -> None:
    x = _tokens(256, 64, seed=5)
    weights = [_weight(k=64, n=24, seed=6), _weight(k=64, n=8, seed=7)]
    hessian, n = hessian_from_tokens(x)
    stats = GroupStats(gram=hessian, tokens=n)
    backend, _ = _fake_backend()
    on_device = decide_group(weights, stats, "gptq", QuantConfig(block_size=32, backend=backend))
    on_host = decide_group(weights, stats, "gptq", QuantConfig(block_size=32))
    for got, expected, w in zip(on_device.recipes, on_host.recipes, weights):
        assert got.backend is backend
        assert got.info["output_rel_error"] == expected.info["output_rel_error"]
        _assert_same(got.quantize(w), expected.quantize(w))


@pytest.mark.parametrize("grid", [QuantGrid(), QuantGrid(4, False), QuantGrid(4, True, True)])
def test_quantize_dequantize_is_rtn_and_back(grid: QuantGrid) -> None:
    w = _weight()
    expected = quantize_rtn(w, 64, symmetric=grid.symmetric, positive_scales=grid.positive_scales).dequantize()
    np.testing.assert_array_equal(quantize_dequantize(w, 64, grid), expected)
    backend, _ = _fake_backend()
    np.testing.assert_array_equal(backend.to_host(quantize_dequantize(backend.from_host(w), 64, grid)), expected)


@pytest.mark.parametrize("tokens", [48, 400])  # fewer tokens than K (tokens used directly), more (Gram)
def test_awq_lite_on_a_fake_device_equals_numpy(tokens: int) -> None:
    x = _tokens(tokens, 128, seed=11) * np.linspace(0.1, 4, 128, dtype=np.float32)
    weights = [_weight(k=128, n=40, seed=12), _weight(k=128, n=24, seed=13)]
    absmean = np.abs(x).mean(axis=0)
    backend, device = _fake_backend(memory_limit=4 * 128 * 16 * 8)  # chunks of 16 columns on the device
    result = awq_lite(weights, absmean, x, 32, backend=backend)
    expected = awq_lite(weights, absmean, x, 32)
    assert result.alpha == expected.alpha and result.alpha is not None
    assert result.losses == expected.losses and result.loss_rtn == expected.loss_rtn
    np.testing.assert_array_equal(result.scales, expected.scales)
    assert type(result.scales) is np.ndarray and device.moved_in >= x.nbytes + sum(w.nbytes for w in weights)


def test_the_fake_device_catches_host_arrays_and_numpy_calls() -> None:
    backend, _ = _fake_backend()
    on_device = backend.from_host(np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="host array"):
        _ = on_device * np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match=r"numpy\.einsum"):
        np.einsum("ij->i", on_device)
    np.testing.assert_array_equal(backend.to_host(backend.xp.einsum("ij->i", on_device)), [2.0, 2.0])


def _gpu_backend() -> _array.ArrayBackend:
    """The CuPy backend on the first GPU; the test is skipped where there is none."""
    backend = _array.backend(["cuda:0"], memory_limit_mb=1024) if importlib.util.find_spec("cupy") else None
    if backend is None or backend.on_host:
        pytest.skip("no CuPy GPU backend (onnxprec[gpu-math] and a CUDA GPU)")
    return backend


@pytest.mark.parametrize("case", list(RTN_CASES))
def test_rtn_and_searches_on_cupy_equal_numpy_to_rounding(case: str) -> None:
    backend = _gpu_backend()
    w = _weight(k=1000, n=300, seed=8)
    result, reference = RTN_CASES[case](w, backend=backend), RTN_CASES[case](w)
    # sums in another order may move a value across a rounding boundary or a search's choice, rarely
    assert (result.q != reference.q).mean() < 1e-3
    np.testing.assert_allclose(result.dequantize(), reference.dequantize(), rtol=0, atol=0.5 * np.abs(w).max())
    err = np.linalg.norm(result.dequantize() - w) / np.linalg.norm(reference.dequantize() - w)
    assert abs(err - 1) < 1e-3


def test_awq_lite_on_cupy_equals_numpy_to_rounding() -> None:
    backend = _gpu_backend()
    x = _tokens(1024, 512, seed=14) * np.linspace(0.1, 4, 512, dtype=np.float32)
    weights = [_weight(k=512, n=384, seed=15), _weight(k=512, n=128, seed=16)]
    absmean = np.abs(x).mean(axis=0)
    result, expected = awq_lite(weights, absmean, x, 128, backend=backend), awq_lite(weights, absmean, x, 128)
    np.testing.assert_allclose(result.losses, expected.losses, rtol=1e-4)
    assert result.alpha == expected.alpha


@pytest.mark.parametrize(("symmetric", "act_order"), [(True, False), (False, False), (True, True)])
def test_gptq_on_cupy_equals_numpy_to_rounding(symmetric: bool, act_order: bool) -> None:
    backend = _gpu_backend()
    x = _tokens(2048, 512, seed=9)
    w = _weight(k=512, n=256, seed=10)
    hessian, n = hessian_from_tokens(x)
    result = gptq(w, hessian, n, 128, symmetric=symmetric, act_order=act_order, backend=backend)
    reference = gptq(w, hessian, n, 128, symmetric=symmetric, act_order=act_order)
    out, out_ref = x @ (result.dequantize() - w), x @ (reference.dequantize() - w)
    assert abs(np.linalg.norm(out) / np.linalg.norm(out_ref) - 1) < 1e-2  # the same output error
    assert (result.q != reference.q).mean() < 0.05  # float32 sums in another order steer a few levels


def test_gram_observer_makes_and_keeps_the_gram_on_the_device() -> None:
    from onnxprec.quantization.activation_stats import Float32GramObserver, device_gram

    batches = [_tokens(24, 32, seed=20 + i).reshape(2, 12, 32) for i in range(3)]
    backend, device = _fake_backend()
    on_device, on_host = Float32GramObserver(["x"], backend), Float32GramObserver(["x"])
    for batch in batches:
        on_device.update("x", batch)
        on_host.update("x", batch)
    gram = on_device.gram["x"]
    assert isinstance(gram, DeviceArray) and gram.dtype == np.float64 and on_device.tokens["x"] == 72
    np.testing.assert_array_equal(backend.to_host(gram), on_host.gram["x"])
    assert device.moved_in == sum(b.nbytes for b in batches)  # only the token rows went there
    # a Gram whose GPTQ would not fit the device is made on the host, as on numpy
    small, _ = _fake_backend(memory_limit=6 * 8 * 32 * 32 - 1)
    assert device_gram(backend, 32) and not device_gram(small, 32) and not device_gram(_array.NUMPY, 32)
    on_host_too = Float32GramObserver(["x"], small)
    on_host_too.update("x", batches[0])
    assert type(on_host_too.gram["x"]) is np.ndarray


@pytest.mark.parametrize(
    ("symmetric", "act_order", "overwrite", "memory_limit"),
    [(True, False, False, 1 << 30), (False, True, True, 1 << 30), (True, True, False, 64 * 64 * 8)],
)
def test_gptq_of_a_device_hessian_equals_numpy(
    symmetric: bool, act_order: bool, overwrite: bool, memory_limit: int
) -> None:
    x = _tokens(256, 64, seed=21)
    x[:, 5] = 0.0  # a dead input channel
    w = _weight(k=64, n=24, seed=22)
    hessian, n = hessian_from_tokens(x)
    kwargs = {"symmetric": symmetric, "act_order": act_order, "lazy_batch": 24}
    backend, _ = _fake_backend(memory_limit)  # the last case: the factorisation does not fit, numpy runs it
    on_device = backend.from_host(hessian)
    result = gptq(w, on_device, n, 32, backend=backend, overwrite_hessian=overwrite, **kwargs)
    _assert_same(result, gptq(w, hessian, n, 32, **kwargs))
    assert overwrite or np.array_equal(backend.to_host(on_device), hessian)  # the caller's Gram is left as it was


@pytest.mark.parametrize("method", ["gptq", "awq_gptq"])
def test_decide_group_with_a_device_gram_equals_numpy(method: str) -> None:
    x = _tokens(256, 64, seed=23) * np.linspace(0.2, 3, 64, dtype=np.float32)
    weights = [_weight(k=64, n=24, seed=24), _weight(k=64, n=8, seed=25)]
    hessian, n = hessian_from_tokens(x)
    sample, absmean = x[:128].astype(np.float16), np.abs(x).mean(axis=0)
    backend, _ = _fake_backend()
    device_stats = GroupStats(absmean=absmean, sample=sample, gram=backend.from_host(hessian), tokens=n)
    host_stats = GroupStats(absmean=absmean, sample=sample, gram=hessian, tokens=n)
    on_device = decide_group(weights, device_stats, method, QuantConfig(block_size=32, backend=backend))
    on_host = decide_group(weights, host_stats, method, QuantConfig(block_size=32))
    assert on_device.alpha == on_host.alpha
    for got, expected, w in zip(on_device.recipes, on_host.recipes, weights):
        assert got.info == expected.info
        _assert_same(got.quantize(w), expected.quantize(w))


@pytest.mark.slow
def test_an_int4_walk_on_a_fake_device_writes_the_numpy_walks_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxprec._testing import tiny_decoder
    from onnxprec.quantization import activation_stats
    from onnxprec.quantization.int4 import quantize

    model = tiny_decoder("gqa", layers=3, heads=8, kv_heads=2, head_size=32, vocab=256, max_positions=64)
    ids = np.random.default_rng(0).integers(3, 250, (3, 12))
    grams: list[type] = []
    term = activation_stats.Float32GramObserver.term

    def spy(self: activation_stats.Float32GramObserver, rows: np.ndarray) -> Any:
        result = term(self, rows)
        grams.append(type(result))
        return result

    monkeypatch.setattr(activation_stats.Float32GramObserver, "term", spy)
    written = {}
    fake, _ = _fake_backend()
    for where in ("numpy", "fake"):
        if where == "fake":  # what a GPU provider's run gets (its ONNX Runtime runs stay on the CPU here)
            monkeypatch.setattr(_array, "backend", lambda providers, memory_limit_mb: fake)
        grams.clear()
        proto = quantize(
            model, calibration_method="awq_gptq", calibration_data_reader={"input_ids": ids}, block_size=32,
            nodes_to_exclude=[], segment_mb=1,
        )  # fmt: skip
        written[where] = {i.name: i.raw_data for i in proto.graph.initializer}
        assert grams and set(grams) == {DeviceArray if where == "fake" else np.ndarray}
    assert written["numpy"] == written["fake"]


def test_a_device_gram_and_awq_gptq_on_cupy_equal_numpy_to_rounding() -> None:
    from onnxprec.quantization.activation_stats import Float32GramObserver

    backend = _gpu_backend()
    x = _tokens(2048, 512, seed=26) * np.linspace(0.2, 3, 512, dtype=np.float32)
    weights = [_weight(k=512, n=256, seed=27), _weight(k=512, n=128, seed=28)]
    observer = Float32GramObserver(["x"], backend)
    for start in range(0, 2048, 256):
        observer.update("x", x[start : start + 256])
    gram = observer.gram["x"]
    assert type(gram) is not np.ndarray  # made and kept on the device
    host_gram, n = hessian_from_tokens(x)
    np.testing.assert_allclose(backend.to_host(gram), host_gram, rtol=1e-4, atol=1e-3 * np.abs(host_gram).max())
    sample, absmean = x[:512].astype(np.float16), np.abs(x).mean(axis=0)
    on_gpu = decide_group(
        weights, GroupStats(absmean, sample, gram, n), "awq_gptq", QuantConfig(block_size=128, backend=backend)
    )
    on_host = decide_group(weights, GroupStats(absmean, sample, host_gram, n), "awq_gptq", QuantConfig(block_size=128))
    assert on_gpu.alpha == on_host.alpha
    for got, expected in zip(on_gpu.recipes, on_host.recipes):
        assert got.info["output_rel_error"] == pytest.approx(expected.info["output_rel_error"], rel=2e-2)
