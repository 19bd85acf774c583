"""Hessians of INT8 layers for GPTQ weight rounding: ``XᵀX`` of each layer's input rows, streamed.

A Conv's rows are its input patches (im2col): for a 2-D Conv with ``groups`` groups, group ``g`` reads patches of
``C/groups * kh * kw`` values, and its Hessian is the sum of their outer products over the output positions of every
batch (a depthwise 3x3 Conv has one 9x9 Hessian per channel; a 1x1 Conv one ``C x C``). A MatMul's rows are its
input's tokens. Memory is one ``K x K`` float64 matrix per group, independent of the number of batches.

A tensor's product costs ``rows * groups * K²`` multiply-adds: up to :data:`EXACT_MULTIPLY_ADDS` over the whole
calibration, every row is taken; past it, a uniform sample of :data:`ROWS_PER_INPUT` ``* K`` rows (at least the
rows that cost :data:`EXACT_MULTIPLY_ADDS`), spread evenly over the batches (``batches``, the number of calibration
runs), is gathered (only the sampled patches are formed). A tensor whose batches cannot give GPTQ ``K`` rows in all
(``rows per batch * batches < K``: a 3x3 Conv over 512 channels at 24x24 from 6 images) is not collected: GPTQ
needs at least ``K`` rows and rounds it to nearest without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

__all__ = ["EXACT_MULTIPLY_ADDS", "ROWS_PER_INPUT", "ConvGeometry", "HessianObserver"]

EXACT_MULTIPLY_ADDS = 1 << 30
"""A tensor's ``XᵀX`` multiply-adds over the whole calibration up to which every row is taken."""
ROWS_PER_INPUT = 32
"""Past :data:`EXACT_MULTIPLY_ADDS`, the rows sampled per input of the layer (``K``), over the whole calibration (how
close GPTQ gets to its rounding from the exact Hessian: experiments/design_notes.md, "INT8 speed on large feature
maps")."""
_SEED = 0


@dataclass(frozen=True)
class ConvGeometry:
    """What a 2-D Conv reads of its input: kernel, strides, pads (top, left, bottom, right), dilations, groups."""

    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    groups: int = 1

    @classmethod
    def of(cls, node: ir.Node) -> ConvGeometry | None:
        """The geometry of a 2-D Conv without ``auto_pad`` (None for anything else)."""
        weight = node.inputs[1]
        if weight is None or weight.const_value is None or len(weight.const_value.shape) != 4:
            return None
        attrs = node.attributes
        auto_pad = attrs.get("auto_pad")
        if auto_pad is not None and auto_pad.as_string() not in ("NOTSET", ""):
            return None

        def ints(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
            attr = attrs.get(name)
            return tuple(attr.as_ints()) if attr is not None else default

        shape = tuple(int(d) for d in weight.const_value.shape.numpy())
        groups = attrs.get("group")
        pads = ints("pads", (0, 0, 0, 0))
        return cls(
            (shape[2], shape[3]),
            ints("strides", (1, 1)),  # type: ignore[arg-type]
            (pads[0], pads[1], pads[2], pads[3]),
            ints("dilations", (1, 1)),  # type: ignore[arg-type]
            int(groups.value) if groups is not None else 1,
        )

    def positions(self, shape: tuple[int, ...]) -> int:
        """The output positions (patches per group) of an input of ``shape`` ``[N, C, H, W]``."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilations
        top, left, bottom, right = self.pads
        ho = (shape[2] + top + bottom - (kh - 1) * dh - 1) // sh + 1
        wo = (shape[3] + left + right - (kw - 1) * dw - 1) // sw + 1
        return shape[0] * max(ho, 0) * max(wo, 0)

    def patches(self, x: np.ndarray, take: np.ndarray | None = None) -> np.ndarray:
        """``[groups, rows, C/groups * kh * kw]`` input patches of ``x`` ``[N, C, H, W]`` (float64): every output
        position's, or only those at the flat indices ``take`` into ``[N, Ho, Wo]``."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilations
        top, left, bottom, right = self.pads
        values = np.asarray(x, dtype=np.float64) if take is None else np.asarray(x)
        n, c = values.shape[:2]
        cg = c // self.groups
        if (kh, kw) == (1, 1) and not any(self.pads) and take is None:
            rows = values[:, :, ::sh, ::sw].transpose(0, 2, 3, 1).reshape(-1, self.groups, cg)
            return rows.transpose(1, 0, 2)
        padded = np.pad(values, ((0, 0), (0, 0), (top, bottom), (left, right)))
        span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
        windows = np.lib.stride_tricks.sliding_window_view(padded, span, axis=(2, 3))
        windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, Ho, Wo, kh, kw]
        ho, wo = windows.shape[2:4]
        if take is not None:
            b, i, j = np.unravel_index(take, (n, ho, wo))
            picked = windows[b, :, i, j].astype(np.float64)  # [rows, C, kh, kw]: only the sampled patches are formed
            return picked.reshape(-1, self.groups, cg * kh * kw).transpose(1, 0, 2)
        grouped = windows.reshape(n, self.groups, cg, ho, wo, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
        return grouped.reshape(self.groups, n * ho * wo, cg * kh * kw)


def _gram(rows: np.ndarray) -> np.ndarray:
    """``XᵀX`` per group of ``rows`` ``[groups, rows, K]``: BLAS products of contiguous rows for one group or wide
    rows, einsum for many narrow groups (a depthwise Conv's 9 inputs; einsum's own path for one wide group is tens
    of times slower)."""
    if rows.shape[0] == 1 or rows.shape[2] >= 32:
        rows = np.ascontiguousarray(rows)
        return np.matmul(rows.transpose(0, 2, 1), rows)
    return np.einsum("gtk,gtl->gkl", rows, rows, optimize=True)


def quota(available: int, groups: int, k: int, batches: int | None, rows_per_input: int = ROWS_PER_INPUT) -> int:
    """The rows to take of a batch that has ``available`` rows of ``groups`` groups of ``k`` inputs, out of
    ``batches`` batches like it (module docstring; None: not known, each batch taken as the only one): all of them
    while the whole calibration's product stays within :data:`EXACT_MULTIPLY_ADDS`, else an even share of the
    sampled total; 0 when the batches cannot give ``k`` rows in all."""
    if batches is not None and available * batches < k:
        return 0
    batches = max(batches or 1, 1)
    per_row = max(groups * k * k, 1)
    if available * batches * per_row <= EXACT_MULTIPLY_ADDS:
        return available
    total = max(rows_per_input * k, EXACT_MULTIPLY_ADDS // per_row)
    return min(available, -(-total // batches))


class HessianObserver:
    """``XᵀX`` (float64) of each observed tensor's rows, per group, the number of rows it holds (``sampled``) and the
    number seen (``rows``: every output position or token, what the layer computes on).

    Args:
        geometries: Tensor name -> the Conv geometry its reader applies, or None for a MatMul input (rows along
            the last axis).
        batches: The calibration runs the observer will see (:func:`quota` spreads a tensor's sample over them);
            None: not known.
        rows_per_input: The rows sampled per input of a layer past :data:`EXACT_MULTIPLY_ADDS`.
    """

    def __init__(
        self,
        geometries: Mapping[str, ConvGeometry | None],
        batches: int | None = None,
        rows_per_input: int = ROWS_PER_INPUT,
    ) -> None:
        self.rows_per_input = rows_per_input
        self.geometries = dict(geometries)
        self.names = frozenset(self.geometries)
        self.batches = batches
        self.hessians: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}
        self.sampled: dict[str, int] = {}
        self._runs: dict[str, int] = {}

    def wants(self, name: str) -> bool:
        return name in self.names

    def update(self, name: str, array: np.ndarray) -> None:
        if name not in self.names:
            return
        geometry = self.geometries[name]
        values = np.asarray(array)
        if geometry is None:
            if values.ndim == 0:
                return
            groups, k, available = 1, values.shape[-1], values.size // max(values.shape[-1], 1)
        elif values.ndim == 4 and values.shape[1] % geometry.groups == 0:
            groups = geometry.groups
            k = values.shape[1] // groups * geometry.kernel[0] * geometry.kernel[1]
            available = geometry.positions(values.shape)
        else:
            return
        run = self._runs.get(name, 0)
        self._runs[name] = run + 1
        self.rows[name] = self.rows.get(name, 0) + available
        count = quota(available, groups, k, self.batches, self.rows_per_input)
        if count == 0:
            return
        take = None
        if count < available:
            take = np.sort(np.random.default_rng((_SEED, run)).choice(available, count, replace=False))
        if geometry is None:
            flat = values.reshape(-1, k)
            rows = (flat if take is None else flat[take]).astype(np.float64)[None]
        else:
            rows = geometry.patches(values, take)
        product = _gram(rows)
        if name in self.hessians and self.hessians[name].shape == product.shape:
            self.hessians[name] += product
            self.sampled[name] += rows.shape[1]
        else:
            self.hessians[name], self.sampled[name] = product, rows.shape[1]
