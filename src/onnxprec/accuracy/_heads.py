"""Detection heads whose boxes span several outputs: a GFL/PicoDet head writes, per level, class scores ``[N, A, K]``
(a Sigmoid, reshaped and transposed from ``[N, K, H, W]``) beside a box distribution ``[N, A, 4 * B]`` (the same
level's raw logits: ``B`` bins per side, a Softmax over them whose expectation is the distance, in strides, from the
cell's centre to each side of the box).

Its user decodes every level's anchors into boxes, keeps those whose best score reaches a threshold and suppresses
overlapping ones across the levels (NMS): the outputs are judged together by those boxes
(:func:`onnxprec.accuracy._boxes.box_counts` on the rows :meth:`SplitHead.rows` writes), not each by itself. A score
map judged alone passes while the boxes it decodes to move: a box lost where its score crosses the threshold is a
few pixels of a map, and its distribution's error shows in no score.

A level is found from the graph: a rank-3 score output from a Sigmoid, transposed, and a rank-3 output with the same
number of anchors ``A`` and ``4 * B`` values (``B >= 2``) from no Sigmoid, transposed. Its grid is the one of the
model's image input (its first rank-4 input with a static height and width) at the power-of-2 stride that gives
``A`` cells (``ceil(H / s) * ceil(W / s)``, as strided convolutions pad). Heads on an image of unknown size are not
found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["Level", "SplitHead", "split_heads"]

MAX_STRIDE_LOG2 = 8
"""The coarsest stride looked for: 2 ** 8 = 256 pixels per cell."""


@dataclass(frozen=True)
class Level:
    """One level of a split head: its score and box-distribution outputs, grid ``(height, width)`` and stride."""

    scores: str
    boxes: str
    grid: tuple[int, int]
    stride: int


@dataclass(frozen=True)
class SplitHead:
    """A detection head whose levels (:class:`Level`) are separate outputs; named by its first score output."""

    levels: tuple[Level, ...]

    @property
    def name(self) -> str:
        return self.levels[0].scores

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(o for level in self.levels for o in (level.scores, level.boxes))

    @property
    def sizes(self) -> tuple[int, ...]:
        """The anchors of each level, in the order :meth:`rows` writes them."""
        return tuple(level.grid[0] * level.grid[1] for level in self.levels)

    @property
    def why(self) -> str:
        strides = ", ".join(f"{level.scores} + {level.boxes} at stride {level.stride}" for level in self.levels)
        return f"GFL head of {len(self.levels)} levels decoded together: {strides}"

    def rows(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """``[N, anchors of every level, 4 + K]``: each anchor's decoded box (centre x, centre y, width, height, in
        pixels) then its class scores, as :func:`~onnxprec.accuracy._boxes.box_counts` reads them; None when an output
        is missing or its shape is not the level's."""
        parts = []
        for level in self.levels:
            scores, dist = outputs.get(level.scores), outputs.get(level.boxes)
            cells = level.grid[0] * level.grid[1]
            if scores is None or dist is None or scores.ndim != 3 or dist.ndim != 3:
                return None
            if scores.shape[1] != cells or dist.shape[:2] != scores.shape[:2] or dist.shape[2] % 4:
                return None
            bins = dist.astype(np.float64).reshape(*dist.shape[:2], 4, -1)
            p = np.exp(bins - bins.max(axis=-1, keepdims=True))
            sides = (p / p.sum(axis=-1, keepdims=True) * np.arange(bins.shape[-1])).sum(axis=-1) * level.stride
            y, x = np.divmod(np.arange(cells), level.grid[1])
            centre = np.stack([(x + 0.5) * level.stride, (y + 0.5) * level.stride], axis=1)[None]
            low, high = centre - sides[..., :2], centre + sides[..., 2:]
            box = np.concatenate([(low + high) / 2, high - low], axis=-1)
            parts.append(np.concatenate([box.astype(np.float32), scores.astype(np.float32)], axis=-1))
        return np.concatenate(parts, axis=1)


def _image_size(model: ir.Model) -> tuple[int, int] | None:
    for value in model.graph.inputs:
        dims = list(value.shape) if value.shape is not None else []
        size = [d for d in dims[2:] if isinstance(d, int) and d > 1]
        if len(dims) == 4 and len(size) == 2:
            return size[0], size[1]
    return None


def _grid(image: tuple[int, int], anchors: int) -> tuple[tuple[int, int], int] | None:
    """(grid, stride) of the power-of-2 stride whose grid over ``image`` has ``anchors`` cells."""
    for k in range(MAX_STRIDE_LOG2 + 1):
        grid = (math.ceil(image[0] / 2**k), math.ceil(image[1] / 2**k))
        if grid[0] * grid[1] == anchors:
            return grid, 2**k
    return None


def split_heads(model: ir.Model, sigmoid: Mapping[str, bool]) -> list[SplitHead]:
    """The split heads among ``model``'s outputs (``sigmoid``: the transposed rank-3 outputs, by name, and whether a
    Sigmoid writes each, as :func:`onnxprec.accuracy.output_producers` finds them); a head needs every level's pair
    unique by anchor count."""
    image = _image_size(model)
    if image is None:
        return []
    scores: dict[int, list[str]] = {}
    boxes: dict[int, list[str]] = {}
    for value in model.graph.outputs:
        name, dims = str(value.name), list(value.shape) if value.shape is not None else []
        known = [d for d in dims[1:] if isinstance(d, int)]
        if name not in sigmoid or len(dims) != 3 or len(known) != 2:
            continue
        anchors, width = known
        if sigmoid[name]:
            scores.setdefault(anchors, []).append(name)
        elif width % 4 == 0 and width >= 8:
            boxes.setdefault(anchors, []).append(name)
    levels = []
    for anchors, names in scores.items():
        found = _grid(image, anchors)
        if found is None or len(names) != 1 or len(boxes.get(anchors, [])) != 1:
            continue
        levels.append(Level(names[0], boxes[anchors][0], found[0], found[1]))
    levels.sort(key=lambda level: level.stride)
    return [SplitHead(tuple(levels))] if levels else []
