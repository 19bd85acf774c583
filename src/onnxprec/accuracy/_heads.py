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

A YOLOX head (:class:`YoloxHead`) is one output ``[N, A, 5 + K]`` of raw box offsets beside scores: per level a Concat
over channels of 4 box values, then an objectness and ``K`` class scores from Sigmoids (``[N, 5 + K, H, W]``),
flattened, the levels concatenated over anchors and transposed. Its user decodes each anchor of an ``H x W`` level at
stride ``s`` (the power-of-2 stride giving that grid) into a box centred at ``(offset + cell) * s`` of size
``exp(log size) * s``, scores it by objectness times its best class, and keeps those at or above a threshold after
NMS (:data:`YOLOX_THRESHOLDS`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from onnxprec.accuracy._boxes import THRESHOLDS

if TYPE_CHECKING:
    import onnx_ir as ir

logger = logging.getLogger(__name__)

__all__ = [
    "PASS_THROUGH",
    "RESHAPES",
    "Head",
    "Level",
    "SplitHead",
    "YoloxHead",
    "heads",
    "split_heads",
    "tell",
    "through",
    "yolox_heads",
]

YOLOX_THRESHOLDS = (0.3,)
"""The score a YOLOX head's boxes are compared at: 0.3, YOLOX's demo default (a dense image's many boxes near a
second, stricter threshold would each be a coin toss under any quantization)."""
MAX_LOG_SIZE = 10.0
"""The largest log size (in strides) decoded: ``exp`` of more would overflow float32 boxes."""

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
    told: list[str] = field(default_factory=list, compare=False, repr=False)
    """What was logged about this head: one WARNING each per run (every candidate the guard checks shares it)."""

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

    thresholds = THRESHOLDS

    def score_parts(self, width: int) -> tuple[tuple[int, int], ...]:
        """The scores' (start, stop) in :meth:`rows`' ``width`` values per anchor."""
        return ((4, width),)

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


@dataclass(frozen=True)
class YoloxHead:
    """A YOLOX head: output ``name``, ``[N, A, 5 + K]`` raw, and each level's grid ``(height, width)`` and stride, in
    the order of its anchors."""

    name: str
    grids: tuple[tuple[int, int], ...]
    strides: tuple[int, ...]
    told: list[str] = field(default_factory=list, compare=False, repr=False)
    """What was logged about this head: one WARNING each per run (every candidate the guard checks shares it)."""
    thresholds = YOLOX_THRESHOLDS

    @property
    def members(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(h * w for h, w in self.grids)

    @property
    def why(self) -> str:
        levels = ", ".join(f"{h}x{w} at stride {s}" for (h, w), s in zip(self.grids, self.strides))
        return f"YOLOX head decoded to boxes (objectness x class score): {levels}"

    def score_parts(self, width: int) -> tuple[tuple[int, int], ...]:
        """The objectness, then the class scores, in :meth:`rows`' ``width`` values per anchor."""
        return ((4, 5), (5, width))

    def rows(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """``[N, A, 5 + K]``: each anchor's decoded box (centre x, centre y, width, height, in pixels), objectness and
        class scores; None when the output is missing or not of the head's anchors."""
        raw = outputs.get(self.name)
        if raw is None or raw.ndim != 3 or raw.shape[1] != sum(self.sizes) or raw.shape[2] < 6:
            return None
        cells, steps = [], []
        for (height, width), stride in zip(self.grids, self.strides):
            y, x = np.divmod(np.arange(height * width), width)
            cells.append(np.stack([x, y], axis=1))
            steps.append(np.full((height * width, 1), stride))
        cell, step = np.concatenate(cells), np.concatenate(steps)
        values = raw.astype(np.float64)
        centre = (values[..., :2] + cell) * step
        size = np.exp(np.clip(values[..., 2:4], -MAX_LOG_SIZE, MAX_LOG_SIZE)) * step
        return np.concatenate([centre, size, values[..., 4:]], axis=-1).astype(np.float32)


Head = SplitHead | YoloxHead


def tell(head: Head, line: str) -> None:
    """Logs ``line`` as a WARNING, once per run of ``head`` (its ``told``: every candidate checked shares the head)."""
    if line not in head.told:
        head.told.append(line)
        logger.warning("%s", line)


PASS_THROUGH = frozenset({"Identity", "Cast"})
"""The ops an output's meaning passes through unchanged."""
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
"""The ops that only reshape."""
_MOVES = PASS_THROUGH | {"Reshape", "Flatten", "Transpose"}


def through(
    value: ir.Value | None, ops: frozenset[str] = PASS_THROUGH | RESHAPES
) -> tuple[ir.Node | None, bool, bool, bool]:
    """The producer of ``value`` past the ops in ``ops`` (Identity/Cast and reshapes by default), whether a reshape
    came between, whether one merged axes (:attr:`onnxprec.accuracy.Producer.merged`), and whether a Transpose came
    between."""
    reshaped = merged = permuted = False
    node = None if value is None else value.producer()
    while node is not None and node.op_type in ops and node.inputs:
        reshaped |= node.op_type in RESHAPES
        permuted |= node.op_type == "Transpose"
        source = node.inputs[0]
        if source is None:
            break
        if node.op_type in ("Flatten", "Reshape") and source.shape is not None:
            merged |= sum(1 for d in list(source.shape)[1:] if d != 1) >= 2
        node = source.producer()
    return node, reshaped, merged, permuted


def _yolox_level(value: ir.Value | None, classes: int) -> tuple[int, int] | None:
    """The grid ``(height, width)`` of a level: a rank-4 Concat over channels of 4 values (no Sigmoid's), then an
    objectness and ``classes`` scores from Sigmoids, all sizes known; None for anything else."""
    node = through(value, _MOVES)[0]
    if node is None or node.op_type != "Concat" or node.attributes.get_int("axis", 0) not in (1, -3):
        return None
    shape = node.outputs[0].shape
    dims = [d if isinstance(d, int) else -1 for d in shape] if shape is not None and len(shape) == 4 else []
    if not dims or min(dims[1:]) < 1 or dims[1] != 5 + classes:
        return None
    sizes = [None if v is None or v.shape is None or len(v.shape) != 4 else v.shape[1] for v in node.inputs]
    sigmoid = [(p := through(v, PASS_THROUGH)[0]) is not None and p.op_type == "Sigmoid" for v in node.inputs]
    if sizes[:1] == [4] and not sigmoid[0] and all(sigmoid[1:]) and sum(s or 0 for s in sizes) == dims[1]:
        return dims[2], dims[3]
    return None


def yolox_heads(model: ir.Model) -> list[YoloxHead]:
    """The YOLOX heads among ``model``'s outputs: a rank-3 ``[N, A, 5 + K]`` output, sizes known, from a Concat over
    anchors (past reshapes and a Transpose) of levels :func:`_yolox_level` finds, each at the power-of-2 stride that
    gives its grid over the image input (:func:`_image_size`)."""
    image = _image_size(model)
    found = []
    for value in model.graph.outputs:
        dims = [d if isinstance(d, int) else -1 for d in value.shape] if value.shape is not None else []
        node = through(value, _MOVES)[0]
        if image is None or len(dims) != 3 or min(dims[1:]) < 1 or dims[2] < 6:
            continue
        if node is None or node.op_type != "Concat":
            continue
        levels = []
        for source in node.inputs:
            grid = _yolox_level(source, dims[2] - 5)
            stride = None if grid is None else _grid(image, grid[0] * grid[1])
            if grid is None or stride is None or stride[0] != grid:
                break
            levels.append((grid, stride[1]))
        if levels and len(levels) == len(node.inputs) and sum(g[0] * g[1] for g, _ in levels) == dims[1]:
            found.append(YoloxHead(str(value.name), tuple(g for g, _ in levels), tuple(s for _, s in levels)))
    return found


def heads(model: ir.Model, sigmoid: Mapping[str, bool]) -> list[Head]:
    """The detection heads judged by decoded boxes: :func:`split_heads` (``sigmoid`` as it takes) and
    :func:`yolox_heads`."""
    return [*split_heads(model, sigmoid), *yolox_heads(model)]
