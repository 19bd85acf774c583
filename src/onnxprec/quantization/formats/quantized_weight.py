"""A weight quantized on first read: its format's initializers are :class:`onnx_ir.LazyTensor` pieces of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping

import numpy as np
import onnx_ir as ir

from onnxprec._tensors import release
from onnxprec.quantization.algorithms.rtn import QuantizedWeight
from onnxprec.quantization.methods import Recipe

__all__ = ["LazyQuantizedWeight", "Packer"]

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
        on_done: Called once with the float32 ``[K, N]`` weight, its quantized form and the seconds it took.
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
        """Quantizes the weight now (the report callback runs on the first call)."""
        tick = time.perf_counter()
        w = self.weight()
        self.release()
        qw = self.recipe.quantize(w)
        if self._on_done is not None:
            self._on_done(w, qw, time.perf_counter() - tick)
            self._on_done = None
        return qw

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
