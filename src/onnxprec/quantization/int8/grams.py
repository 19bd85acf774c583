"""Hessians of INT8 layers for GPTQ weight rounding: ``XᵀX`` of each layer's input rows, streamed.

A Conv's rows are its input patches (im2col): for a 2-D Conv with ``groups`` groups, group ``g`` reads patches of
``C/groups * kh * kw`` values, and its Hessian is the sum of their outer products over every output position of every
batch (a depthwise 3x3 Conv has one 9x9 Hessian per channel; a 1x1 Conv one ``C x C``). A MatMul's rows are its
input's tokens. Memory is one ``K x K`` float64 matrix per group, independent of the number of batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

__all__ = ["ConvGeometry", "HessianObserver"]


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

    def patches(self, x: np.ndarray) -> np.ndarray:
        """``[groups, rows, C/groups * kh * kw]`` input patches of ``x`` ``[N, C, H, W]`` (float64)."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilations
        top, left, bottom, right = self.pads
        values = np.asarray(x, dtype=np.float64)
        n, c = values.shape[:2]
        cg = c // self.groups
        if (kh, kw) == (1, 1) and not any(self.pads):
            rows = values[:, :, ::sh, ::sw].transpose(0, 2, 3, 1).reshape(-1, self.groups, cg)
            return rows.transpose(1, 0, 2)
        padded = np.pad(values, ((0, 0), (0, 0), (top, bottom), (left, right)))
        span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
        windows = np.lib.stride_tricks.sliding_window_view(padded, span, axis=(2, 3))
        windows = windows[:, :, ::sh, ::sw, ::dh, ::dw]  # [N, C, Ho, Wo, kh, kw]
        ho, wo = windows.shape[2:4]
        grouped = windows.reshape(n, self.groups, cg, ho, wo, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
        return grouped.reshape(self.groups, n * ho * wo, cg * kh * kw)


class HessianObserver:
    """``XᵀX`` (float64) of each observed tensor's rows, per group, and the number of rows.

    Args:
        geometries: Tensor name -> the Conv geometry its reader applies, or None for a MatMul input (rows along
            the last axis).
    """

    def __init__(self, geometries: Mapping[str, ConvGeometry | None]) -> None:
        self.geometries = dict(geometries)
        self.names = frozenset(self.geometries)
        self.hessians: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}

    def wants(self, name: str) -> bool:
        return name in self.names

    def update(self, name: str, array: np.ndarray) -> None:
        if name not in self.names:
            return
        geometry = self.geometries[name]
        values = np.asarray(array)
        if geometry is None:
            rows = values.reshape(-1, values.shape[-1]).astype(np.float64)[None]
        elif values.ndim == 4 and values.shape[1] % geometry.groups == 0:
            rows = geometry.patches(values)
        else:
            return
        product = np.einsum("gtk,gtl->gkl", rows, rows, optimize=True)
        if name in self.hessians and self.hessians[name].shape == product.shape:
            self.hessians[name] += product
            self.rows[name] += rows.shape[1]
        else:
            self.hessians[name], self.rows[name] = product, rows.shape[1]
