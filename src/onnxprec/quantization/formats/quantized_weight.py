"""A weight quantized on first read: its format's initializers are :class:`onnx_ir.LazyTensor` pieces of it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import numpy as np
import onnx_ir as ir

from onnxprec._report import timed
from onnxprec._tensors import float32_copy, release
from onnxprec.quantization.algorithms.rtn import QuantizedWeight
from onnxprec.quantization.methods import Recipe

__all__ = ["CHUNK_BYTES", "LazyQuantizedWeight", "Packer"]

CHUNK_BYTES = 64 * 1024 * 1024
"""Float32 bytes of the columns of a large weight read and quantized at once."""

Packer = Callable[[QuantizedWeight], dict[str, np.ndarray]]
"""Splits a quantized weight into a format's initializer arrays, by key."""


class LazyQuantizedWeight:
    """One float weight and its :class:`~onnxprec.quantization.methods.Recipe`, quantized when a piece is read.

    The format (:func:`~onnxprec.quantization.formats.rewrite_qdq`, ...) sets a packer and asks for one
    :class:`onnx_ir.LazyTensor` per initializer. Reading the first piece reads the float weight (memory-mapped),
    quantizes it, packs every piece and unmaps the weight; the pieces are kept until each has been read once, then
    dropped. Writing a model therefore holds one weight's pieces at a time when its pieces are written together.

    Args:
        source: The float weight, ``[K, N]`` (or ``[N, K]`` when ``transposed``).
        recipe: How to quantize it.
        transposed: The source is ``[N, K]`` (Gemm ``transB=1``).
        on_done: Called with the float32 ``[K, N]`` weight, its quantized form and the seconds it took; once, or once
            per chunk of columns (:meth:`quantize`) with that chunk's columns.
    """

    def __init__(
        self,
        source: ir.TensorProtocol,
        recipe: Recipe,
        *,
        transposed: bool = False,
        on_done: Callable[[np.ndarray, QuantizedWeight, float], None] | None = None,
    ) -> None:
        self.source = source
        self.recipe = recipe
        self.transposed = transposed
        self._on_done = on_done
        self._packer: Packer | None = None
        self._keys: frozenset[str] = frozenset()
        self._pieces: dict[str, np.ndarray] | None = None
        self._taken: set[str] = set()

    def weight(self) -> np.ndarray:
        """The float32 ``[K, N]`` weight (read from the source; the caller should :meth:`release`)."""
        array = np.asarray(self.source.numpy())
        if self.transposed:
            array = array.T
        return array.astype(np.float32)

    def release(self) -> None:
        release(self.source)

    def quantize(self) -> QuantizedWeight:
        """Quantizes the weight now (the report callback runs on the first call).

        A weight in an external file with more than :data:`CHUNK_BYTES` of float32 values is read, quantized and
        reported in chunks of columns, its mapping released after each: the float32 copies held are one chunk's, and
        the result is the same as at once (every method quantizes each output column on its own).
        """
        on_done, self._on_done = self._on_done, None
        k, n = self.shape
        step = max(1, CHUNK_BYTES // (4 * k))
        result = self.recipe.result
        if result is not None:  # a computed result is read back a range of even bounds at a time
            step = max(2, step // 2 * 2)
        whole = result is not None and not result.sliceable()
        if n <= step or whole or not isinstance(self.source, ir.ExternalTensor):
            with timed() as clock:
                w = self.weight()
                self.release()
                qw = self.recipe.quantize(w)
            if on_done is not None:
                on_done(w, qw, clock.seconds)
            return qw
        q = scales = zero_points = None
        block_size, bits = k, self.recipe.bits
        for start in range(0, n, step):
            with timed() as clock:
                columns = slice(start, min(start + step, n))
                w = self._columns(columns)
                part = self.recipe.quantize(w, columns)
                if q is None:
                    q = np.empty((k, n), part.q.dtype)
                    scales = np.empty((part.scales.shape[0], n), part.scales.dtype)
                    if part.zero_points is not None:
                        zero_points = np.empty((part.zero_points.shape[0], n), part.zero_points.dtype)
                assert scales is not None
                q[:, columns], scales[:, columns], block_size = part.q, part.scales, part.block_size
                if zero_points is not None and part.zero_points is not None:
                    zero_points[:, columns] = part.zero_points
            if on_done is not None:
                on_done(w, part, clock.seconds)
            del w, part
        assert q is not None and scales is not None
        return QuantizedWeight(q, scales, zero_points, block_size, bits)

    @property
    def shape(self) -> tuple[int, int]:
        """``(K, N)``."""
        rows, columns = self.source.shape.numpy()
        return (columns, rows) if self.transposed else (rows, columns)

    def _columns(self, columns: slice) -> np.ndarray:
        """A float32 copy of ``columns`` of the ``[K, N]`` weight; the source's mapping is released."""
        return float32_copy(self.source, transposed=self.transposed, columns=columns)

    def set_packer(self, packer: Packer, keys: Collection[str]) -> None:
        self._packer = packer
        self._keys = frozenset(keys)

    def _take(self, key: str, dtype: ir.DataType) -> ir.TensorProtocol:
        if self._pieces is None:
            assert self._packer is not None
            self._pieces = self._packer(self.quantize())
            self._taken = set()
        array = self._pieces[key]
        self._taken.add(key)
        if self._taken >= self._keys:
            self._pieces = None
        return ir.Tensor(array, dtype=dtype)

    def piece(self, key: str, dtype: ir.DataType, shape: tuple[int, ...], name: str) -> ir.LazyTensor:
        """The initializer ``key`` of the packer's output, computed on first read."""
        if key not in self._keys:
            raise KeyError(f"unknown piece '{key}' (the packer makes {sorted(self._keys)})")
        return ir.LazyTensor(lambda: self._take(key, dtype), dtype=dtype, shape=ir.Shape(shape), name=name)

    def register_pieces(
        self,
        graph: ir.Graph,
        specs: Mapping[str, tuple[ir.DataType, tuple[int, ...], str]],
        keys: list[str],
        unique_name: Callable[[str], str],
    ) -> list[ir.Value]:
        """Registers the pieces ``keys`` as initializers of ``graph`` (``specs``: key -> dtype, shape, base name)."""
        values = []
        for key in keys:
            dtype, shape, base = specs[key]
            name = unique_name(base)
            value = ir.Value(
                name=name,
                type=ir.TensorType(dtype),
                shape=ir.Shape(shape),
                const_value=self.piece(key, dtype, shape, name),
            )
            graph.register_initializer(value)
            values.append(value)
        return values
