"""The array backend's choice from the providers, and the namespace of arrays."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest

from onnxprec import _array

HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.mark.parametrize(
    ("providers", "device"),
    [
        (None, None),
        (["cpu"], None),
        (["dml"], None),
        (["cuda"], 0),
        (["CUDA:1"], 1),
        (["cpu", "trt:2", "cuda:0"], 2),
    ],
)
def test_gpu_device_is_the_first_gpu_provider(providers: list[str] | None, device: int | None) -> None:
    assert _array.gpu_device(providers) == device


def test_host_providers_and_a_zero_limit_give_numpy() -> None:
    assert _array.backend(["cpu"]) is _array.NUMPY
    assert _array.backend(None) is _array.NUMPY
    assert _array.backend(["cuda"], memory_limit_mb=0) is _array.NUMPY


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the fallback to numpy is not reachable")
def test_a_gpu_provider_without_cupy_gives_numpy() -> None:
    assert _array.backend(["cuda:0"]) is _array.NUMPY


def test_numpy_backend_moves_nothing() -> None:
    backend = _array.NUMPY
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert backend.on_host and backend.device is None
    assert backend.from_host(w) is w
    assert backend.to_host(w) is w
    assert backend.fits(1 << 60)
    assert backend.chunk_elements(1024, 8) == 1024
    lower = backend.cholesky(np.array([[4.0, 2.0], [2.0, 3.0]]))
    np.testing.assert_allclose(lower @ lower.T, [[4.0, 2.0], [2.0, 3.0]])
    with pytest.raises(np.linalg.LinAlgError):
        backend.cholesky(np.array([[1.0, 2.0], [2.0, 1.0]]))


def test_a_limited_backend_sizes_chunks_from_its_limit() -> None:
    backend = _array.ArrayBackend("limited", np, device=0, memory_limit=4 * 1024 * 12)
    assert not backend.fits(4 * 1024 * 12 + 1)
    assert backend.fits(4 * 1024 * 12)
    assert backend.chunk_elements(16, 12) == 1024  # 12 float32 arrays of 1024 elements fill the limit
    assert backend.chunk_elements(4096, 12) == 4096  # never below the host's chunk


class _Marker:
    pass


def test_namespace_follows_the_first_registered_device_array() -> None:
    w = np.zeros(3, np.float32)
    assert _array.namespace(w, 1.0, np.float32(2)) is np
    assert _array.namespace() is np
    fake = object()
    _array.register_namespace(_Marker, fake)
    assert _array.namespace(w, _Marker()) is fake
    assert _array.namespace(_Marker(), w) is fake


def _fake_cupy(devices: int, calls: list[tuple[object, ...]]) -> tuple[types.ModuleType, types.ModuleType]:
    """Modules named cupy and cupyx with just what :func:`_array.backend` touches; ``devices < 0``: no driver."""

    class CUDARuntimeError(RuntimeError):
        pass

    class Pool:
        def set_limit(self, size: int) -> None:
            calls.append(("limit", size))

        def free_all_blocks(self) -> None:
            calls.append(("free",))

    class Device:
        def __init__(self, device: int) -> None:
            self.device = device

        def use(self) -> None:
            calls.append(("use", self.device))

    class ndarray(np.ndarray):  # CuPy's name
        pass

    def device_count() -> int:
        if devices < 0:
            raise CUDARuntimeError("cudaErrorInsufficientDriver")
        return devices

    pool = Pool()
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=device_count, CUDARuntimeError=CUDARuntimeError), Device=Device
    )
    cupy.get_default_memory_pool = lambda: pool  # type: ignore[attr-defined]
    cupy.ndarray = ndarray  # type: ignore[attr-defined]
    cupy.asarray = lambda a, dtype=None: np.array(a, dtype=dtype).view(ndarray)  # type: ignore[attr-defined]
    cupy.asnumpy = lambda a: np.array(a.view(np.ndarray))  # type: ignore[attr-defined]
    cupy.linalg = np.linalg  # type: ignore[attr-defined]
    cupyx = types.ModuleType("cupyx")
    cupyx.errstate = lambda **kw: contextlib.nullcontext()  # type: ignore[attr-defined]
    return cupy, cupyx


@pytest.fixture
def fresh_backends() -> Iterator[None]:
    _array._cupy_backend.cache_clear()
    yield
    _array._cupy_backend.cache_clear()


@pytest.mark.parametrize(("devices", "chosen"), [(2, 1), (1, None), (-1, None)])
@pytest.mark.usefixtures("fresh_backends")
def test_backend_dispatches_to_cupy_when_it_sees_the_device(
    monkeypatch: pytest.MonkeyPatch, devices: int, chosen: int | None
) -> None:
    calls: list[tuple[object, ...]] = []
    cupy, cupyx = _fake_cupy(devices, calls)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    backend = _array.backend(["cpu", "cuda:1"], memory_limit_mb=64)
    if chosen is None:  # device 1 is not there, or there is no driver
        assert backend is _array.NUMPY and calls == []
        return
    assert backend.name == "cupy" and backend.xp is cupy and backend.device == chosen
    assert calls == [("use", 1), ("limit", 64 << 20)] and backend.memory_limit == 64 << 20
    assert _array.backend(["cuda:1"], memory_limit_mb=64) is backend  # one per device and limit
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    on_device = backend.from_host(w)
    assert type(on_device) is cupy.ndarray and _array.namespace(w, on_device) is cupy
    back = backend.to_host(on_device * 2)
    assert type(back) is np.ndarray
    np.testing.assert_array_equal(back, w * 2)
    backend.release()
    assert calls[-1] == ("free",)


@pytest.mark.skipif(not HAS_CUPY, reason="CuPy (onnxprec[gpu-math]) is not installed")
def test_cupy_backend_round_trips_and_reports_indefinite_matrices() -> None:
    import cupy

    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0
    if not count:
        pytest.skip("CuPy sees no GPU")
    backend = _array.backend(["cuda:0"], memory_limit_mb=256)
    assert backend.name == "cupy" and backend.device == 0 and backend.memory_limit == 256 << 20
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    on_device = backend.from_host(w)
    assert _array.namespace(on_device) is cupy
    np.testing.assert_array_equal(backend.to_host(on_device * 2), w * 2)
    with pytest.raises(np.linalg.LinAlgError):
        backend.cholesky(backend.from_host(np.array([[1.0, 2.0], [2.0, 1.0]])))
    backend.release()
