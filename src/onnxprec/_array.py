"""The array namespace the quantization arithmetic runs in: numpy on the host, or CuPy on a CUDA GPU.

:func:`backend` picks it from the ONNX Runtime providers a tool was given: CuPy on the first GPU provider's device
(``cuda[:N]``, ``trt[:N]``) when the ``gpu-math`` extra (CuPy) is installed and that device is visible, numpy
otherwise. An algorithm takes an :class:`ArrayBackend` at its entry point, moves its inputs in with
:meth:`ArrayBackend.from_host` and its results out with :meth:`ArrayBackend.to_host`; in between, every helper calls
the numpy-compatible functions of :func:`namespace` of the arrays it was given, so one body of code runs on both.
On numpy, :meth:`~ArrayBackend.from_host` and :meth:`~ArrayBackend.to_host` are ``np.asarray``: the host path is the
numpy code it always was.

Device memory is bounded: a backend holds at most ``memory_limit`` bytes in CuPy's pool (allocations beyond fail),
and :meth:`ArrayBackend.fits` tells a caller whether a piece of work of a given size may run there.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_GPU_MEMORY_MB",
    "NUMPY",
    "ArrayBackend",
    "backend",
    "gpu_device",
    "namespace",
    "register_namespace",
]

logger = logging.getLogger(__name__)

DEFAULT_GPU_MEMORY_MB = 16384
"""Device memory one quantization run may hold in CuPy's pool by default: GPTQ of a weight with ``K`` rows holds
about five ``K x K`` float64 matrices while it factorises (6.6 GiB for ``K = 14336``); lower it on a smaller card."""

_GPU_PROVIDERS = ("cuda", "trt")

# The namespace of each array type the algorithms may be handed (a backend registers its own when it is made).
_NAMESPACES: dict[type, Any] = {np.ndarray: np}


def register_namespace(array_type: type, xp: Any) -> None:
    """Makes :func:`namespace` answer ``xp`` for arrays of ``array_type`` (a backend's device array type)."""
    _NAMESPACES[array_type] = xp


def namespace(*arrays: object) -> Any:
    """The numpy-compatible module of the first device array among ``arrays`` (numpy when there is none).

    Scalars and arrays of unregistered types count as host values.
    """
    for array in arrays:
        xp = _NAMESPACES.get(type(array))
        if xp is not None and xp is not np:
            return xp
    return np


def gpu_device(providers: Sequence[str] | None) -> int | None:
    """The device id of the first GPU provider in ``providers`` (``cuda``, ``cuda:N``, ``trt``, ``trt:N``), or None."""
    for item in providers or ():
        kind, _, device = str(item).lower().partition(":")
        if kind in _GPU_PROVIDERS:
            return int(device) if device.isdigit() else 0
    return None


class ArrayBackend:
    """Where the arithmetic runs: ``xp`` (numpy or a numpy-compatible device module) and the moves to and from it."""

    def __init__(
        self,
        name: str,
        xp: Any,
        *,
        device: int | None = None,
        memory_limit: int | None = None,
        to_host: Callable[[Any], np.ndarray] | None = None,
        release: Callable[[], None] | None = None,
        linalg_errors: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        """``"numpy"``, ``"cupy"``, or a test backend's name."""
        self.xp = xp
        """The numpy-compatible module of this backend's arrays."""
        self.device = device
        """The GPU's device id, or None on the host."""
        self.memory_limit = memory_limit
        """Bytes of device memory this backend may hold (None on the host: no limit)."""
        self._to_host = to_host
        self._release = release
        self._linalg_errors = linalg_errors

    def __repr__(self) -> str:
        where = "" if self.device is None else f" on device {self.device}, at most {self.memory_limit} bytes"
        return f"ArrayBackend({self.name}{where})"

    @property
    def on_host(self) -> bool:
        """True for numpy."""
        return self.xp is np

    def from_host(self, array: Any, dtype: Any = None) -> Any:
        """``array`` as an array of this backend (``np.asarray`` on numpy: no copy when it already fits)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_host(self, array: Any) -> np.ndarray:
        """``array`` as a numpy array (itself on numpy)."""
        if self._to_host is None:
            return np.asarray(array)
        return self._to_host(array)

    def fits(self, nbytes: int) -> bool:
        """Whether work holding ``nbytes`` of arrays at once may run on this backend (always on the host)."""
        return self.memory_limit is None or nbytes <= self.memory_limit

    def chunk_elements(self, default: int, temporaries: int) -> int:
        """Elements one chunk of float32 work may have when it holds ``temporaries`` arrays of that size at once:
        ``default`` on the host, as many as the memory limit allows (at least ``default``) on a device."""
        if self.memory_limit is None:
            return default
        return max(default, self.memory_limit // (4 * max(temporaries, 1)))

    def cholesky(self, a: Any) -> Any:
        """The lower Cholesky factor of ``a``; raises ``numpy.linalg.LinAlgError`` when ``a`` is not positive
        definite, on every backend (CuPy otherwise returns NaNs)."""
        if self._linalg_errors is None:
            return self.xp.linalg.cholesky(a)
        with self._linalg_errors():
            return self.xp.linalg.cholesky(a)

    def release(self) -> None:
        """Returns the memory this backend's pool holds but no array uses (after each weight, so that the next
        starts from an empty pool); nothing on the host."""
        if self._release is not None:
            self._release()


NUMPY = ArrayBackend("numpy", np)
"""The host backend: numpy, as every algorithm ran before there was a choice."""


@functools.cache
def _cupy_backend(device: int, memory_limit: int) -> ArrayBackend | None:
    """The CuPy backend on ``device`` (one per device and limit: the pool's limit is the last one asked for)."""
    try:
        import cupy  # type: ignore[import-not-found,unused-ignore]
        import cupyx  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        logger.info("CuPy is not installed (pip install 'onnxprec[gpu-math]'): the arithmetic runs in numpy")
        return None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:  # no driver (CUDARuntimeError), or a CUDA library this CuPy build cannot load
        logger.info("CuPy sees no GPU (%s): the arithmetic runs in numpy", error)
        return None
    if device >= count:
        logger.info("GPU %d is not there (%d visible): the arithmetic runs in numpy", device, count)
        return None
    cupy.cuda.Device(device).use()
    pool = cupy.get_default_memory_pool()
    pool.set_limit(size=memory_limit)
    register_namespace(cupy.ndarray, cupy)
    return ArrayBackend(
        "cupy",
        cupy,
        device=device,
        memory_limit=memory_limit,
        to_host=cupy.asnumpy,
        release=pool.free_all_blocks,
        linalg_errors=lambda: cupyx.errstate(linalg="raise"),
    )


def backend(providers: Sequence[str] | None, *, memory_limit_mb: int = DEFAULT_GPU_MEMORY_MB) -> ArrayBackend:
    """The backend for a run on ``providers``: CuPy on the first GPU provider's device when CuPy and that device are
    there, bounded to ``memory_limit_mb`` MiB of device memory; numpy otherwise (also for ``memory_limit_mb <= 0``).
    """
    device = gpu_device(providers)
    if device is None or memory_limit_mb <= 0:
        return NUMPY
    return _cupy_backend(device, memory_limit_mb << 20) or NUMPY
