"""Attention-mask sentinels: found where they are made, measured past, and given a value the low type can add.

Exporters build attention masks from a huge negative fill (``finfo(float32).min``, ``-inf``, ``-1e9``,
``-10000``): a Constant or initializer, a ``Where(cond, 0, fill)``, ``(1 - mask) * fill``, or a
``ConstantOfShape(fill)``, added to the attention scores right before a Softmax. Left alone, that fill breaks
AutoCast twice:

- the reference run sees ``3.4e38`` in every tensor of the mask, so ``data_max`` keeps the mask, the score
  Adds and the Softmaxes in FP32, with two casts around each of them;
- converted as a weight, the fill clamps to ``-65504`` and ``score + mask`` rounds to ``-inf`` in FP16 as soon
  as the score is below -16; a fully masked row then becomes NaN.

:func:`find_mask_regions` finds the fills (:class:`MaskRegion`), follows them through the ops that only move
or combine masks (Where, Expand, Reshape, Add, Mul...) and accepts a region only when every path ends in a
Softmax. The reference run then measures the tensors of the region past the sentinels (their
``unmasked_absmax``: the range that matters is that of the scores); :meth:`MaskRegion.rewrite` gives the fill a
value of the low type's range that masks just as well and that sums of a score and up to three masks cannot
push to infinity (:func:`low_fill`: -16384 for FP16, -2^126 for BF16); :func:`stats_past_sentinels` lets
``data_max`` see the unmasked range. Fully masked rows stay finite: every entry is about the same large negative
number, so the Softmax is (nearly) uniform, as with PyTorch's ``finfo.min`` fill.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, tensor_attribute
from onnxprec._ops import is_default_domain
from onnxprec._tensors import SENTINEL_MIN, finite_max, release
from onnxprec.observers import TensorStats

__all__ = ["SENTINEL_MIN", "MaskRegion", "find_mask_regions", "low_fill", "stats_past_sentinels"]

logger = logging.getLogger(__name__)

# Other values in a mask constant must be small (0, the kept positions; sometimes a small bias).
_DATA_MAX_IN_MASK = 1e3
# Initializers larger than this are weights, never read here.
_MAX_ELEMENTS = 1 << 22

# Ops that move, broadcast or combine masks: the sentinel comes out of them (input slots that carry data).
_ANY_SLOT = frozenset({"Add", "Mul", "Min", "Max", "Concat"})
_FIRST_SLOT = frozenset(
    {"Sub", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Transpose", "Tile", "Gather"}
    | {"Identity", "Cast", "Trilu", "Pad"}
)
_SINKS = frozenset({"Softmax", "LogSoftmax"})
_NEUTRAL = frozenset({"Shape", "Size"})  # read only the shape


def low_fill(low: ir.DataType) -> float:
    """The mask fill used in ``low``: a power of two, a quarter of the range (FP16: -16384; BF16: -2^126).

    A score of magnitude up to a quarter of the range plus up to three such masks stays finite, and
    ``exp(fill + score - max)`` is exactly 0 for any score that fits the low type's ``data_max``.
    """
    return -float(2.0 ** (math.floor(math.log2(finite_max(low))) - 1))


def _threshold(fill: float) -> float:
    """Values at or below this are sentinels: half the least negative fill (a score cannot move them above)."""
    return -1e30 if math.isinf(fill) else fill / 2


@dataclass
class MaskRegion:
    """The sentinel fills of one attention mask and the tensors that carry them.

    Attributes:
        sources: Initializers holding a fill.
        fills: ConstantOfShape nodes whose value is a fill.
        tainted: The node outputs that carry sentinels (mask tensors, masked scores).
        softmaxes: The Softmax nodes the mask ends in.
        fill: The least negative fill (the one that decides the threshold).
        impure: Why the region is not only a mask (a consumer that is neither a mask op nor a Softmax);
            None for a mask. Impure regions are left as they are.
        rewritten_to: The fill in the converted model, once :meth:`rewrite` changed it.
    """

    sources: list[ir.Value] = field(default_factory=list)
    fills: list[ir.Node] = field(default_factory=list)
    tainted: list[ir.Value] = field(default_factory=list)
    softmaxes: list[ir.Node] = field(default_factory=list)
    fill: float = -math.inf
    impure: str | None = None
    rewritten_to: float | None = None

    @property
    def threshold(self) -> float:
        """Values at or below this are sentinels."""
        return _threshold(self.fill)

    def unmasked_absmax(self, stats: Mapping[str, TensorStats] | None) -> float | None:
        """The largest magnitude past the sentinels over the region's tensors (None when not measured)."""
        if not stats:
            return None
        values = [stats[str(v.name)].unmasked_absmax for v in self.tainted if str(v.name) in stats]
        measured = [v for v in values if v is not None]
        return max(measured, default=0.0) if measured else None

    def rewrite(self, low: ir.DataType, stats: Mapping[str, TensorStats] | None) -> bool:
        """Gives the fills :func:`low_fill` in the FP32 model (before conversion), when they need it and it is safe.

        Needed when the fill does not fit a quarter of the low type's range (``finfo.min``, ``-1e9``, ``-inf``);
        safe when the measured scores past the sentinels stay below a quarter of the new fill (or when nothing
        was measured), so the FP32 parts of the model still mask exactly as before.

        Returns:
            Whether the fills changed.
        """
        new = low_fill(low)
        if self.impure is not None or self.fill >= new / 2:
            return False
        unmasked = self.unmasked_absmax(stats)
        if unmasked is not None and not unmasked < abs(new) / 4:
            logger.info("Mask fill %.4g kept: the scores past it reach %.4g", self.fill, unmasked)
            return False
        threshold = self.threshold
        for value in self.sources:
            assert value.const_value is not None
            array = np.asarray(value.const_value.numpy(), dtype=np.float32)
            value.const_value = ir.tensor(np.where(array <= threshold, np.float32(new), array), name=value.name)
        for node in self.fills:
            tensor = tensor_attribute(node.attributes["value"])
            array = np.where(tensor.numpy() <= threshold, new, tensor.numpy()).astype(np.float32)
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(array, name=tensor.name))
        self.rewritten_to = new
        return True

    def to_json(self) -> dict[str, object]:
        """The region for the report."""
        return {
            "sources": [str(v.name) for v in self.sources] + [str(n.name) for n in self.fills],
            "fill": None if math.isinf(self.fill) else self.fill,
            "tainted": len(self.tainted),
            "softmaxes": [str(n.name) for n in self.softmaxes],
            "impure": self.impure,
            "rewritten_to": self.rewritten_to,
        }


def _sentinel_fill(array: np.ndarray) -> float | None:
    """The least negative sentinel of a mask constant, or None if it is not one."""
    if array.size == 0 or not np.issubdtype(array.dtype, np.floating) or np.isnan(array).any():
        return None
    sentinel = array <= -SENTINEL_MIN
    if not sentinel.any():
        return None
    rest = array[~sentinel]
    if rest.size and float(np.abs(rest).max()) > _DATA_MAX_IN_MASK:
        return None
    return float(array[sentinel].max())


def _initializer_fill(value: ir.Value) -> float | None:
    tensor = value.const_value
    if tensor is None or value.dtype != ir.DataType.FLOAT or tensor.size > _MAX_ELEMENTS:
        return None
    if not value.uses() or any(not _passes(use.node, use.idx) for use in value.uses()):
        return None  # a weight or a bound: not a mask constant (and not read)
    array = tensor.numpy()
    fill = _sentinel_fill(np.asarray(array))
    del array
    release(tensor)
    return fill


def _fill_node(node: ir.Node) -> float | None:
    if node.op_type != "ConstantOfShape" or not is_default_domain(node.domain) or "value" not in node.attributes:
        return None
    tensor = tensor_attribute(node.attributes["value"])
    return _sentinel_fill(np.asarray(tensor.numpy())) if tensor.dtype == ir.DataType.FLOAT else None


def _passes(node: ir.Node, index: int) -> bool:
    """Whether input ``index`` of ``node`` carries a mask through to the node's outputs."""
    if not is_default_domain(node.domain):
        return False
    op = node.op_type
    if op == "Where":
        return index in (1, 2)
    if op == "Cast":
        return index == 0 and ir.DataType(node.attributes["to"].as_int()) in FLOAT_TYPES
    return op in _ANY_SLOT or (op in _FIRST_SLOT and index == 0)


def _taint(starts: Iterable[ir.Value], graph: ir.Graph) -> tuple[list[ir.Value], list[ir.Node], str | None]:
    """Follows sentinels from ``starts``: the tensors that carry them, the Softmaxes they end in, and why the
    flow is not only a mask (None when it is)."""
    tainted: dict[ir.Value, None] = {}
    softmaxes: dict[ir.Node, None] = {}
    impure: str | None = None
    stack = list(starts)
    seen = set(stack)
    while stack:
        value = stack.pop()
        if value.is_graph_output():
            impure = impure or f"'{value.name}' is a graph output"
        for use in value.uses():
            node = use.node
            if node.graph is not graph:
                impure = impure or f"'{node.name}' is in a subgraph"
            elif node.op_type in _SINKS and is_default_domain(node.domain) and use.idx == 0:
                softmaxes[node] = None
            elif node.op_type in _NEUTRAL:
                continue
            elif _passes(node, use.idx):
                for out in node.outputs:
                    if out not in seen:
                        seen.add(out)
                        tainted[out] = None
                        stack.append(out)
            else:
                impure = impure or f"'{node.name}' ({node.op_type}) reads it"
    if not softmaxes:
        impure = impure or "it reaches no Softmax"
    return list(tainted), list(softmaxes), impure


def find_mask_regions(model: ir.Model) -> list[MaskRegion]:
    """The attention masks of the main graph, one region per set of fills whose flows meet.

    Fills are FP32 initializers (Constants are initializers after sanitizing) whose values are 0 or small
    except for negative values of magnitude >= :data:`SENTINEL_MIN`, and ConstantOfShape nodes with such a
    value. Each is followed through mask ops to the Softmaxes; regions whose flows share a tensor are merged.
    """
    graph = model.graph
    found: list[MaskRegion] = []
    for value in graph.initializers.values():
        fill = _initializer_fill(value)
        if fill is not None:
            found.append(MaskRegion(sources=[value], fill=fill))
    for node in graph:
        fill = _fill_node(node)
        if fill is not None:
            found.append(MaskRegion(fills=[node], fill=fill))
    for region in found:
        starts = [*region.sources, *(n.outputs[0] for n in region.fills)]
        region.tainted, region.softmaxes, region.impure = _taint(starts, graph)
        region.tainted = [*(n.outputs[0] for n in region.fills), *region.tainted]
    merged: list[MaskRegion] = []
    for region in found:
        keys = set(region.tainted)
        for other in merged:
            if keys & set(other.tainted):
                other.sources += region.sources
                other.fills += region.fills
                other.tainted += [v for v in region.tainted if v not in set(other.tainted)]
                other.softmaxes += [n for n in region.softmaxes if n not in set(other.softmaxes)]
                other.fill = max(other.fill, region.fill)
                other.impure = other.impure or region.impure
                break
        else:
            merged.append(region)
    for region in merged:
        if region.impure:
            logger.info("Not a pure attention mask (%s): fill %.4g left as it is", region.impure, region.fill)
        else:
            logger.debug(
                "Attention mask: fill %.4g, %d tensors, %d Softmax",
                region.fill,
                len(region.tainted),
                len(region.softmaxes),
            )
    return merged


def sentinel_thresholds(regions: Iterable[MaskRegion]) -> dict[str, float]:
    """Tensor name -> sentinel threshold, for the reference run (pure regions only)."""
    return {str(v.name): r.threshold for r in regions if r.impure is None for v in r.tainted if v.name}


def stats_past_sentinels(
    stats: Mapping[str, TensorStats] | None, regions: Iterable[MaskRegion], low: ir.DataType
) -> dict[str, TensorStats] | None:
    """The statistics ``data_max`` should see: for the tensors of a mask that is safe in ``low`` (rewritten, or
    a fill that fits), the range past the sentinels; every other tensor as measured."""
    if stats is None:
        return None
    result = dict(stats)
    limit = abs(low_fill(low)) / 2
    for region in regions:
        if region.impure is not None or (region.rewritten_to is None and region.fill < -limit):
            continue
        for value in region.tainted:
            current = result.get(str(value.name))
            if current is not None and current.unmasked_absmax is not None:
                result[str(value.name)] = dataclasses.replace(current, absmax=current.unmasked_absmax)
    return result
