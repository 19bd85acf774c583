"""Which weights to quantize: MatMul and Gemm nodes whose weight is a 2-D float initializer.

A *layer* is one node (``MatMul(A, W)`` or ``Gemm(A, W, C)`` with ``transA=0``) whose ``W`` is a 2-D float
initializer and whose ``A`` is computed (not an initializer). A *target* is one weight initializer with every
layer that reads it: a weight shared by several layers (tied weights) is quantized once. Layers that read the
same activation ``A`` (q/k/v, gate/up) form an *input group*: AWQ searches one scale vector per group and GPTQ
uses one Hessian per group.

``nodes_to_exclude`` patterns are regular expressions applied with :func:`re.search` to the node's name, its output's
name and its weight's name: ``/lm_head`` excludes ``/model/lm_head/MatMul`` whatever prefix the exporter gave it
(anchor with ``^`` to match a prefix only). Every exclusion is logged with the pattern that caused it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxprec.errors import InvalidArgumentError

__all__ = ["FLOAT_WEIGHT_TYPES", "InputGroup", "Layer", "Selection", "Target", "compile_patterns", "select_layers"]

logger = logging.getLogger(__name__)

# Element types DequantizeLinear (opset 21) and MatMulNBits can produce.
FLOAT_WEIGHT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


@dataclass(eq=False)
class Layer:
    """One MatMul or Gemm node to quantize."""

    node: ir.Node
    weight: ir.Value
    """The initializer ``W``: ``[K, N]``, or ``[N, K]`` for a Gemm with ``transB=1``."""
    input: ir.Value
    """The activation ``A`` ``[..., K]``."""
    transposed: bool = False
    """Gemm with ``transB=1``: the stored weight is ``[N, K]``."""
    order: int = 0
    """Position of the node in the graph."""

    @property
    def name(self) -> str:
        return self.node.name or str(self.node.outputs[0].name)


@dataclass(eq=False)
class Target:
    """One weight initializer to quantize, with every layer that reads it."""

    weight: ir.Value
    layers: list[Layer]
    bits: int = 4
    k: int = 0
    n: int = 0

    @property
    def transposed(self) -> bool:
        return self.layers[0].transposed

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

    targets: list[Target] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    """``(node name, pattern)`` of every layer excluded by ``nodes_to_exclude``."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(node name, reason)`` of MatMul/Gemm nodes that cannot be quantized."""

    @property
    def layers(self) -> list[Layer]:
        return [layer for target in self.targets for layer in target.layers]

    def groups(self) -> list[InputGroup]:
        """Input groups of the selected layers, in graph order of their first layer."""
        by_input: dict[ir.Value, InputGroup] = {}
        for layer in sorted(self.layers, key=lambda item: item.order):
            group = by_input.get(layer.input)
            if group is None:
                by_input[layer.input] = InputGroup(layer.input, [layer])
            else:
                group.layers.append(layer)
        return list(by_input.values())


def compile_patterns(patterns: Sequence[str] | None, what: str) -> list[re.Pattern[str]]:
    """Compiles regexes; a bad one raises :class:`InvalidArgumentError` naming the option."""
    compiled = []
    for pattern in patterns or ():
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise InvalidArgumentError(f"Invalid regular expression '{pattern}' in {what}: {e}.") from None
    return compiled


def _matching_pattern(node: ir.Node, weight: ir.Value, patterns: Sequence[re.Pattern[str]]) -> str | None:
    names = [n for n in (node.name, node.outputs[0].name, weight.name) if n]
    for pattern in patterns:
        if any(pattern.search(name) for name in names):
            return pattern.pattern
    return None


def _candidate(node: ir.Node) -> tuple[Layer | None, str]:
    """The layer of a MatMul/Gemm node, or None and why it cannot be quantized."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm"):
        return None, ""
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None, "missing input"
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


def select_layers(
    model: ir.Model,
    *,
    exclude: Sequence[re.Pattern[str]] = (),
    eight_bit: Sequence[re.Pattern[str]] = (),
) -> Selection:
    """The weights of ``model``'s main graph to quantize.

    Args:
        model: The model.
        exclude: Compiled ``nodes_to_exclude`` patterns (``re.search`` on node, output and weight names).
        eight_bit: Patterns of layers quantized to 8 bits per channel instead (they win over ``exclude``).

    Returns:
        The targets (one per weight), and the excluded and skipped layers with their reasons.
    """
    selection = Selection()
    by_weight: dict[ir.Value, list[Layer]] = {}
    bits_of: dict[ir.Value, int] = {}
    for order, node in enumerate(model.graph):
        layer, reason = _candidate(node)
        if layer is None:
            if reason:
                selection.skipped.append((node.name or node.op_type, reason))
                logger.debug("Not quantizing %s '%s': %s", node.op_type, node.name, reason)
            continue
        layer.order = order
        eight = _matching_pattern(node, layer.weight, eight_bit)
        pattern = None if eight else _matching_pattern(node, layer.weight, exclude)
        if pattern is not None:
            selection.excluded.append((layer.name, pattern))
            logger.info("Excluded %s '%s' (pattern '%s' of nodes_to_exclude)", node.op_type, layer.name, pattern)
            continue
        by_weight.setdefault(layer.weight, []).append(layer)
        if eight:
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
        k, n = (columns, rows) if layers[0].transposed else (rows, columns)
        selection.targets.append(Target(weight, layers, bits_of.get(weight, 4), k, n))
        if len(layers) > 1:
            logger.info("Weight '%s' is shared by %d layers: quantized once", weight.name, len(layers))
    return selection


def _shared_weight_problem(weight: ir.Value, layers: list[Layer]) -> str:
    """Why a weight read by ``layers`` cannot be replaced (empty when it can)."""
    selected = {(layer.node, 1) for layer in layers}
    others = [use for use in weight.uses() if (use.node, use.idx) not in selected]
    if others:
        users = sorted({f"{use.node.op_type} '{use.node.name}'" for use in others})
        return f"it is also read by {', '.join(users[:3])} (quantizing it would duplicate the weight)"
    if weight.is_graph_output():
        return "it is also a graph output"
    if len({layer.transposed for layer in layers}) > 1:
        return "it is read both as [K, N] and transposed"
    return ""
