"""Which weights to quantize: MatMul, Gemm and Gather (embedding) nodes whose weight is a 2-D float initializer.

A *layer* is one node (``MatMul(A, W)`` or ``Gemm(A, W, C)`` with ``transA=0``) whose ``W`` is a 2-D float
initializer and whose ``A`` is computed (not an initializer), or an embedding lookup ``Gather(E, ids, axis=0)``
whose table ``E`` ``[V, H]`` is a 2-D float initializer (or ``Transpose(W)`` of one, as onnxruntime-genai's builder
writes a tied embedding). Every weight is seen as ``[K, N]`` with blocks along K: a table is ``[N=V, K=H]`` stored
transposed, so its blocks run along the hidden axis and a tied lm_head ``[H, V]`` is the same matrix.

A *target* is one weight with every layer that reads it: a weight shared by several layers is quantized once. A
tied embedding and lm_head are one target when they read one initializer (directly or through a Transpose) or two
initializers of equal content (one the transpose of the other, as torch exports write them): the second copy is
dropped. Layers that read the same activation ``A`` (q/k/v, gate/up) form an *input group*: AWQ searches one scale
vector per group and GPTQ uses one Hessian per group (Gathers have no input group).

``nodes_to_exclude`` patterns are regular expressions applied with :func:`re.match` (from the start, as ModelOpt) to
the node's name, its output's name and its weight's name: ``.*/lm_head`` excludes ``/model/lm_head/MatMul`` whatever
prefix the exporter gave it. Every exclusion is logged with the pattern that caused it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxprec._graph import subgraph_nodes
from onnxprec._options import first_match
from onnxprec._tensors import float32_copy, release

__all__ = ["FLOAT_WEIGHT_TYPES", "InputGroup", "Layer", "Selection", "WeightGroup", "pattern_names", "select_layers"]

logger = logging.getLogger(__name__)

# Element types DequantizeLinear (opset 21) and MatMulNBits can produce.
FLOAT_WEIGHT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


@dataclass(eq=False)
class Layer:
    """One MatMul, Gemm or Gather node to quantize."""

    node: ir.Node
    weight: ir.Value
    """The initializer ``W``: ``[K, N]``, or ``[N, K]`` for a Gemm with ``transB=1`` or a Gather's table."""
    input: ir.Value
    """The activation ``A`` ``[..., K]`` (a Gather's indices)."""
    transposed: bool = False
    """The stored weight is ``[N, K]`` (Gemm ``transB=1``, or a Gather reading its table directly)."""
    order: int = 0
    """Position of the node in the graph."""
    transpose: ir.Node | None = None
    """A Gather whose table is ``Transpose(W)``: that Transpose node (``W`` is then ``[K=H, N=V]``)."""

    @property
    def is_gather(self) -> bool:
        return self.node.op_type == "Gather"

    @property
    def name(self) -> str:
        return self.node.name or str(self.node.outputs[0].name)


READ_BYTES = 64 << 20
"""Float32 bytes of columns :meth:`WeightGroup.read_every` reads at once."""


@dataclass(eq=False)
class WeightGroup:
    """One weight initializer to quantize, with every layer that reads it."""

    weight: ir.Value
    layers: list[Layer]
    bits: int = 4
    k: int = 0
    n: int = 0
    transposed: bool = False
    """``weight`` is stored ``[N, K]``."""
    duplicates: list[ir.Value] = field(default_factory=list)
    """Initializers of equal content (a tied weight's other copy) whose layers now read this weight."""
    block_size: int | None = None
    """The block size chosen for this weight (a size budget's choice); None: the run's."""

    def read(self, columns: slice = slice(None)) -> np.ndarray:
        """The float32 ``[K, N]`` weight, or ``columns`` of it (a copy; the initializer's mapping is released)."""
        tensor = self.weight.const_value
        assert tensor is not None
        return float32_copy(tensor, transposed=self.transposed, columns=columns)

    def read_every(self, stride: int) -> np.ndarray:
        """Every ``stride``-th column of the float32 ``[K, N]`` weight (from the first), read a range of about
        :data:`READ_BYTES` at a time: a wide weight's file pages are never all mapped at once."""
        if stride == 1:
            return self.read()
        step = max(stride, READ_BYTES // (4 * self.k) // stride * stride)  # a multiple of the stride
        parts = [self.read(slice(start, start + step, stride)) for start in range(0, self.n, step)]
        return np.concatenate(parts, axis=1)

    @property
    def gathers(self) -> list[Layer]:
        return [layer for layer in self.layers if layer.is_gather]

    @property
    def matmuls(self) -> list[Layer]:
        return [layer for layer in self.layers if not layer.is_gather]

    @property
    def name(self) -> str:
        return str(self.weight.name)

    @property
    def dtype(self) -> ir.DataType:
        assert self.weight.dtype is not None
        return self.weight.dtype


@dataclass(eq=False)
class InputGroup:
    """Layers that read the same activation (their AWQ scales and GPTQ Hessian are shared)."""

    input: ir.Value
    layers: list[Layer]

    @property
    def k(self) -> int:
        shape = self.layers[0].weight.shape
        assert shape is not None
        return int(shape.numpy()[1 if self.layers[0].transposed else 0])

    @property
    def name(self) -> str:
        return str(self.input.name)


@dataclass
class Selection:
    """The outcome of :func:`select_layers`."""

    targets: list[WeightGroup] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    """``(node name, pattern)`` of every layer excluded by ``nodes_to_exclude``."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(node name, reason)`` of MatMul/Gemm nodes that cannot be quantized."""
    in_subgraphs: dict[str, int] = field(default_factory=dict)
    """Layers inside If/Loop/Scan bodies (kept float, also in ``skipped``), by the op that owns the body."""

    @property
    def layers(self) -> list[Layer]:
        return [layer for target in self.targets for layer in target.layers]

    def groups(self) -> list[InputGroup]:
        """Input groups of the selected layers, in graph order of their first layer."""
        by_input: dict[ir.Value, InputGroup] = {}
        for layer in sorted((la for la in self.layers if not la.is_gather), key=lambda item: item.order):
            group = by_input.get(layer.input)
            if group is None:
                by_input[layer.input] = InputGroup(layer.input, [layer])
            else:
                group.layers.append(layer)
        return list(by_input.values())


def pattern_names(node: ir.Node, weight: ir.Value | None = None) -> list[str]:
    """What ``nodes_to_exclude`` / ``layers_8bit`` match (``re.match``): the node's name, its first output's name and
    its weight's (default: a MatMul's or Gemm's second input, a Gather's table)."""
    if weight is None and len(node.inputs) > 1:
        weight = node.inputs[0 if node.op_type == "Gather" else 1]
    return [str(n) for n in (node.name, node.outputs[0].name, weight.name if weight is not None else None) if n]


def _matching_pattern(node: ir.Node, weight: ir.Value, patterns: Sequence[re.Pattern[str]]) -> str | None:
    return first_match(patterns, pattern_names(node, weight))


def _candidate(node: ir.Node, gather_types: frozenset[ir.DataType]) -> tuple[Layer | None, str]:
    """The layer of a MatMul/Gemm/Gather node, or None and why it cannot be quantized (empty: not a candidate)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm", "Gather"):
        return None, ""
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None, "missing input"
    if node.op_type == "Gather":
        return _gather_candidate(node, gather_types)
    a, w = node.inputs[0], node.inputs[1]
    transposed = False
    if node.op_type == "Gemm":
        attrs = node.attributes
        if "transA" in attrs and attrs["transA"].as_int():
            return None, "Gemm with transA=1 is not supported"
        transposed = bool(attrs["transB"].as_int()) if "transB" in attrs else False
    if not w.is_initializer() or w.const_value is None:
        return None, "the weight is not an initializer"
    if w.is_graph_input():
        return None, "the weight is also a graph input (it can be overridden at run time)"
    if a.is_initializer() or a.const_value is not None:
        return None, "the activation input is an initializer (constant MatMul)"
    if w.dtype not in FLOAT_WEIGHT_TYPES:
        kind = w.dtype.name if w.dtype is not None else "unknown"
        return None, f"the weight is {kind}, not float32/float16/bfloat16"
    shape = w.const_value.shape
    if len(shape) != 2:
        return None, f"the weight has rank {len(shape)}, not 2"
    if shape[0] == 0 or shape[1] == 0:
        return None, "the weight is empty"
    return Layer(node, w, a, transposed), ""


def _gather_candidate(node: ir.Node, gather_types: frozenset[ir.DataType]) -> tuple[Layer | None, str]:
    """An embedding lookup: ``Gather(E, ids, axis=0)`` of a 2-D float table ``E`` (or of ``Transpose(W)``)."""
    table, ids = node.inputs[0], node.inputs[1]
    assert table is not None and ids is not None
    weight, transpose = table, None
    producer = table.producer()
    if producer is not None and producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
        perm = producer.attributes["perm"].as_ints() if "perm" in producer.attributes else None
        source = producer.inputs[0]
        if perm is not None and list(perm) == [1, 0] and source is not None and source.is_initializer():
            weight, transpose = source, producer
    if not weight.is_initializer() or weight.const_value is None:
        return None, ""  # a Gather of computed data (shapes, masks): not an embedding
    if weight.dtype not in FLOAT_WEIGHT_TYPES or len(weight.const_value.shape) != 2:
        return None, ""  # index tables, shape constants
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 0
    if axis not in (0, -2):
        return None, f"Gather along axis {axis}, not along the rows of the table"
    if ids.is_initializer() or ids.const_value is not None:
        return None, "the indices are constant"
    if weight.is_graph_input():
        return None, "the table is also a graph input (it can be overridden at run time)"
    if weight.dtype not in gather_types:
        return None, f"the table is {weight.dtype.name}, which GatherBlockQuantized does not take on CPU"
    rows, hidden = (int(d) for d in weight.const_value.shape.numpy())
    if transpose is not None:
        rows, hidden = hidden, rows
    if hidden < 16 or rows == 0:
        return None, f"the table is [{rows}, {hidden}]: rows shorter than 16 values are not worth a block"
    return Layer(node, weight, ids, transposed=transpose is None, transpose=transpose), ""


def select_layers(
    model: ir.Model,
    *,
    exclude: Sequence[re.Pattern[str]] = (),
    eight_bit: Sequence[re.Pattern[str]] = (),
    gathers: bool = True,
    gather_types: frozenset[ir.DataType] = FLOAT_WEIGHT_TYPES,
) -> Selection:
    """The weights of ``model``'s main graph to quantize.

    Args:
        model: The model.
        exclude: Compiled ``nodes_to_exclude`` patterns (``re.match`` on node, output and weight names).
        eight_bit: Patterns of layers quantized to 8 bits instead (they win over ``exclude``); a weight shared by
            layers of both kinds gets 8 bits.
        gathers: Select embedding Gathers too.
        gather_types: Float types a Gather's table may have (the format's GatherBlockQuantized kernels).

    Returns:
        The targets (one per weight), and the excluded and skipped layers with their reasons.
    """
    selection = Selection()
    by_weight: dict[ir.Value, list[Layer]] = {}
    bits_of: dict[ir.Value, int] = {}
    for order, node in enumerate(model.graph):
        if node.op_type == "Gather" and not gathers:
            continue
        layer, reason = _candidate(node, gather_types)
        if layer is None:
            if reason:
                selection.skipped.append((node.name or node.op_type, reason))
                logger.debug("Not quantizing %s '%s': %s", node.op_type, node.name, reason)
            continue
        layer.order = order
        eight = _matching_pattern(node, layer.weight, eight_bit)
        pattern = None if eight is not None else _matching_pattern(node, layer.weight, exclude)
        if pattern is not None:
            selection.excluded.append((layer.name, pattern))
            logger.info("Excluded %s '%s' (pattern '%s' of nodes_to_exclude)", node.op_type, layer.name, pattern)
            continue
        by_weight.setdefault(layer.weight, []).append(layer)
        if eight is not None:
            bits_of[layer.weight] = 8
            logger.info("%s '%s' gets 8-bit weights (pattern '%s' of layers_8bit)", node.op_type, layer.name, eight)
    for weight, layers in by_weight.items():
        reason = _shared_weight_problem(weight, layers)
        if reason:
            for layer in layers:
                selection.skipped.append((layer.name, reason))
            logger.info("Not quantizing weight '%s': %s", weight.name, reason)
            continue
        rows, columns = (int(d) for d in weight.const_value.shape.numpy())  # type: ignore[union-attr]
        transposed = layers[0].transposed
        k, n = (columns, rows) if transposed else (rows, columns)
        selection.targets.append(WeightGroup(weight, layers, bits_of.get(weight, 4), k, n, transposed))
        if len(layers) > 1:
            logger.info("Weight '%s' is shared by %d layers: quantized once", weight.name, len(layers))
    for node, owner in subgraph_nodes(model.graph):
        if (node.op_type != "Gather" or gathers) and _candidate(node, gather_types)[0] is not None:
            reason = f"inside the {owner.op_type} body of '{owner.name}': kept float (the main graph's layers only)"
            selection.skipped.append((node.name or node.op_type, reason))
            selection.in_subgraphs[owner.op_type] = selection.in_subgraphs.get(owner.op_type, 0) + 1
    _merge_tied_copies(selection)
    return selection


def _layer_uses(layer: Layer) -> set[tuple[ir.Node, int]]:
    """The uses of the layer's weight that the layer accounts for."""
    if layer.transpose is not None:
        return {(layer.transpose, 0)}
    return {(layer.node, 0 if layer.is_gather else 1)}


def _shared_weight_problem(weight: ir.Value, layers: list[Layer]) -> str:
    """Why a weight read by ``layers`` cannot be replaced (empty when it can)."""
    selected = set().union(*(_layer_uses(layer) for layer in layers))
    others = [use for use in weight.uses() if (use.node, use.idx) not in selected]
    gathers = {layer.node for layer in layers}
    for transpose in {layer.transpose for layer in layers if layer.transpose is not None}:
        others += [use for use in transpose.outputs[0].uses() if use.node not in gathers]
        if transpose.outputs[0].is_graph_output():
            return "its Transpose is also a graph output"
    if others:
        users = sorted({f"{use.node.op_type} '{use.node.name}'" for use in others})
        return f"it is also read by {', '.join(users[:3])} (quantizing it would duplicate the weight)"
    if weight.is_graph_output():
        return "it is also a graph output"
    if len({layer.transposed for layer in layers}) > 1:
        return "it is read both as [K, N] and transposed"
    return ""


# Columns compared at once when checking that two initializers hold the same weight.
_COMPARE_COLUMNS = 4096


def _columns(target: WeightGroup, start: int, stop: int) -> np.ndarray:
    """Columns ``start:stop`` of the target's ``[K, N]`` weight (a slice of the mapped initializer)."""
    tensor = target.weight.const_value
    assert tensor is not None
    array = np.asarray(tensor.numpy())
    return array[start:stop].T if target.transposed else array[:, start:stop]


def _fingerprint(target: WeightGroup) -> str:
    """A hash of three of the weight's columns (cheap: the full comparison runs only when these agree)."""
    digest = hashlib.sha1(f"{target.k}x{target.n}:{target.dtype}".encode())
    for column in sorted({0, target.n // 2, target.n - 1}):
        digest.update(np.ascontiguousarray(_columns(target, column, column + 1)).tobytes())
    return digest.hexdigest()


def _same_weight(a: WeightGroup, b: WeightGroup) -> bool:
    """Whether two targets hold equal ``[K, N]`` weights (compared column chunk by column chunk, mapped)."""
    try:
        for start in range(0, a.n, _COMPARE_COLUMNS):
            stop = min(start + _COMPARE_COLUMNS, a.n)
            if not np.array_equal(_columns(a, start, stop), _columns(b, start, stop)):
                return False
        return True
    finally:
        for target in (a, b):
            assert target.weight.const_value is not None
            release(target.weight.const_value)


def _merge_tied_copies(selection: Selection) -> None:
    """Makes an embedding table and an lm_head weight of equal content one target (the table copy is dropped)."""
    tables = [t for t in selection.targets if not t.matmuls]
    heads = [t for t in selection.targets if not t.gathers]
    if not tables or not heads:
        return
    by_print: dict[str, list[WeightGroup]] = {}
    for head in heads:
        if any((head.k, head.n, head.dtype) == (table.k, table.n, table.dtype) for table in tables):
            by_print.setdefault(_fingerprint(head), []).append(head)
    for table in tables:
        candidates = [
            head
            for head in by_print.get(_fingerprint(table), [])
            if (head.k, head.n, head.dtype) == (table.k, table.n, table.dtype) and head in selection.targets
        ]
        match = next((h for h in candidates if _same_weight(h, table)), None)
        if match is None:
            continue
        head = match
        head.layers += table.layers
        head.duplicates.append(table.weight)
        head.bits = max(head.bits, table.bits)
        selection.targets.remove(table)
        logger.info(
            "Weight '%s' and '%s' hold the same matrix (tied embedding and lm_head): stored once",
            head.name, table.name,
        )  # fmt: skip
