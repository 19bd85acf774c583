"""Remove layout Transposes (NHWC <-> NCHW) around element-wise regions where that removes more than it adds (exact).

TensorFlow models converted to ONNX, and PyTorch re-exports of them, keep the activations in NHWC and wrap every
Conv in ``Transpose(NHWC->NCHW) -> Conv -> Transpose(NCHW->NHWC)``; the bias, BatchNorm (``Sub/Mul/Add``), ReLU and
residual ``Add`` run in NHWC in between. Quantized, each Transpose sits between a DequantizeLinear and a
QuantizeLinear, runs in float and keeps the Conv from fusing into QLinearConv with its neighbours.

The pass starts from a Transpose with permutation ``P`` and grows a region downwards through element-wise nodes
(unary activations, Cast, and Add/Sub/Mul/Div/Max/Min/Pow/PRelu/Clip/Where whose other inputs are constants or
outputs of Transposes with the same ``P``). The region ends at Transposes that read it (exits) and at any other
reader. Computing the region in the layout before ``P`` is exact: the entry Transposes go, constants are permuted
by ``P``'s inverse (a scalar stays), an exit whose permutation undoes ``P`` goes (any other exit gets the composed
permutation), and each value read outside the region gets one Transpose ``P``. The region is rewritten only when it
removes more Transposes than it inserts; a region that reaches a graph output, or an input of unknown rank that
would need the inverse Transpose, is left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnxprec._ops import is_default_domain

__all__ = ["CancelTransposesPass", "CancelTransposesResult"]

logger = logging.getLogger(__name__)

_ELEMENTWISE = frozenset({
    "Abs", "Add", "Cast", "Ceil", "Clip", "Cos", "Div", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid",
    "HardSwish", "Identity", "LeakyRelu", "Log", "Max", "Min", "Mish", "Mul", "Neg", "Pow", "PRelu", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tanh",
    "ThresholdedRelu", "Where",
})  # fmt: skip


def _perm(node: ir.Node) -> list[int] | None:
    if node.op_type != "Transpose" or not is_default_domain(node.domain):
        return None
    attr = node.attributes.get("perm")
    if attr is not None:
        return list(attr.as_ints())
    shape = node.inputs[0].shape if node.inputs[0] is not None else None
    return None if shape is None else list(range(len(shape)))[::-1]


@dataclass
class _Region:
    """What computing a region in the layout before ``perm`` removes, changes and inserts."""

    perm: list[int]
    entries: list[ir.Node] = field(default_factory=list)
    nodes: list[ir.Node] = field(default_factory=list)
    values: set[ir.Value] = field(default_factory=set)
    exits: list[ir.Node] = field(default_factory=list)
    outside: list[tuple[ir.Node, int, ir.Value]] = field(default_factory=list)  # readers that keep the old layout
    constants: list[tuple[ir.Node, int, np.ndarray]] = field(default_factory=list)
    foreign: list[tuple[ir.Node, int]] = field(default_factory=list)  # inputs that need the inverse Transpose

    @property
    def inverse(self) -> list[int]:
        return [int(i) for i in np.argsort(self.perm)]

    def cancels(self, exit_node: ir.Node) -> bool:
        return [self.perm[q] for q in _perm(exit_node) or []] == list(range(len(self.perm)))

    @property
    def removed(self) -> int:
        return len(self.entries) + sum(self.cancels(node) for node in self.exits)

    @property
    def inserted(self) -> int:
        return len({id(value) for _, _, value in self.outside}) + len(self.foreign)


def _elementwise(node: ir.Node | None) -> bool:
    return (
        node is not None and node.op_type in _ELEMENTWISE and is_default_domain(node.domain) and len(node.outputs) == 1
    )


def _grow(seed: ir.Node, perm: list[int]) -> _Region | None:
    """The region connected to ``seed`` (a Transpose by ``perm``), or None where it cannot be moved.

    The region grows down from every region value through element-wise readers, and up from every element-wise
    region node through the element-wise producers of its inputs (Transposes by ``perm`` become entries there).
    """
    region = _Region(perm)
    rank = len(perm)
    pending: list[ir.Value] = []

    def add(value: ir.Value) -> bool:
        if value not in region.values:
            if value.is_graph_output():
                return False
            region.values.add(value)
            pending.append(value)
        return True

    region.entries.append(seed)
    if not add(seed.outputs[0]):
        return None
    while pending:
        value = pending.pop()
        producer = value.producer()
        if producer is not None and producer in region.nodes:  # up: the node's other inputs
            for source in producer.inputs:
                if source is None or source in region.values or source.const_value is not None:
                    continue
                origin = source.producer()
                if origin is not None and origin not in region.entries and _perm(origin) == perm:
                    region.entries.append(origin)
                elif not _elementwise(origin) or ir.convenience.get_const_tensor(source) is not None:
                    continue
                else:
                    region.nodes.append(origin)  # type: ignore[arg-type]
                if not add(source):
                    return None
        for user, index in value.uses():  # down
            if _perm(user) is not None and user not in region.entries:
                region.exits.append(user)
            elif _elementwise(user):
                if user not in region.nodes:
                    region.nodes.append(user)
                    if not add(user.outputs[0]):
                        return None
            elif user not in region.entries:
                region.outside.append((user, index, value))
    for node in region.nodes:
        for index, read in enumerate(node.inputs):
            if read is None or read in region.values:
                continue
            tensor = ir.convenience.get_const_tensor(read)
            if tensor is not None:
                array = np.asarray(tensor.numpy())
                if array.ndim > rank:
                    return None
                if array.size > 1:
                    full = array.reshape((1,) * (rank - array.ndim) + array.shape)
                    region.constants.append((node, index, np.ascontiguousarray(full.transpose(region.inverse))))
            elif read.shape is None:
                return None  # of unknown rank: how it broadcasts is unknown
            elif any(dim != 1 for dim in read.shape):
                if len(read.shape) != rank:
                    return None
                region.foreign.append((node, index))
    region.exits = list(dict.fromkeys(region.exits))
    return region


def _apply(graph: ir.Graph, region: _Region, tag: int) -> None:
    layout: dict[ir.Value, ir.Value] = {entry.outputs[0]: entry.inputs[0] for entry in region.entries}  # type: ignore[misc]
    for number, (node, index, array) in enumerate(region.constants):
        old = node.inputs[index]
        assert old is not None
        tensor = ir.tensor(array)
        constant = ir.Value(
            name=f"{old.name}_transposed_{tag}_{number}", const_value=tensor, type=ir.TensorType(tensor.dtype)
        )
        graph.register_initializer(constant)
        node.replace_input_with(index, constant)
    for node, index in region.foreign:
        value = node.inputs[index]
        inverse = ir.node("Transpose", [value], {"perm": region.inverse}, name=f"{node.name}/transpose_in_{index}")
        if value is not None and value.dtype is not None:
            inverse.outputs[0].dtype = value.dtype
        graph.insert_before(node, inverse)
        node.replace_input_with(index, inverse.outputs[0])
    back: dict[ir.Value, ir.Value] = {}
    for user, index, value in region.outside:
        if value not in back:
            producer = value.producer()
            assert producer is not None
            restore = ir.node(
                "Transpose", [layout.get(value, value)], {"perm": region.perm}, name=f"{producer.name}/nhwc"
            )
            if value.dtype is not None:
                restore.outputs[0].dtype = value.dtype
            graph.insert_after(producer, restore)
            back[value] = restore.outputs[0]
        user.replace_input_with(index, back[value])
    for entry in region.entries:
        entry.outputs[0].replace_all_uses_with(entry.inputs[0])  # type: ignore[arg-type]
        graph.remove(entry, safe=True)
    for exit_node in region.exits:
        if region.cancels(exit_node):
            exit_node.outputs[0].replace_all_uses_with(exit_node.inputs[0])  # type: ignore[arg-type]
            graph.remove(exit_node, safe=True)
        else:
            exit_node.attributes["perm"] = ir.AttrInt64s("perm", [region.perm[q] for q in _perm(exit_node) or []])
    for node in region.nodes:
        node.outputs[0].shape = None


@dataclass
class CancelTransposesResult(ir.passes.PassResult):
    """The result of :class:`CancelTransposesPass`: Transposes ``removed`` and ``inserted`` (net: the difference)."""

    removed: int = 0
    inserted: int = 0


class CancelTransposesPass(ir.passes.InPlacePass):
    """Computes element-wise regions of the main graph in the layout before their Transposes (see the module)."""

    def call(self, model: ir.Model) -> CancelTransposesResult:
        graph = model.graph
        removed = inserted = regions = 0
        changed = True
        # Each sweep applies every region it finds, going on past the changes (onnx-ir's node list skips removed
        # nodes); a region that a later one made possible waits for the next sweep. Restarting after each region
        # would grow every Transpose again each time: quadratic in the graph.
        while changed:
            changed = False
            for node in graph:
                perm = _perm(node)
                if perm is None or perm == list(range(len(perm))) or any(o.is_graph_output() for o in node.outputs):
                    continue
                region = _grow(node, perm)
                if (
                    region is None
                    or region.inserted >= region.removed
                    or any(e.outputs[0].is_graph_output() for e in region.exits if region.cancels(e))
                ):
                    continue
                removed += region.removed
                inserted += region.inserted
                regions += 1
                _apply(graph, region, regions)
                changed = True
        if regions:
            logger.debug(
                "Moved %d element-wise regions across their layout Transposes: %d Transposes removed, %d inserted",
                regions, removed, inserted,
            )  # fmt: skip
        return CancelTransposesResult(model, modified=bool(regions), removed=removed, inserted=inserted)
