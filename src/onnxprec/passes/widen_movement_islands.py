"""Return to FP32 the low-precision islands that only move data between casts from and back to FP32."""

from __future__ import annotations

import dataclasses
import logging

import onnx_ir as ir

from onnxprec._graph import LOW_FLOAT_TYPES, ORIGINAL_NAME, all_graphs, tensor_dtype
from onnxprec._ops import is_default_domain
from onnxprec.passes._retype import retarget_type_attributes

__all__ = ["MOVEMENT_OPS", "WidenMovementIslandsPass", "WidenMovementIslandsResult"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT

MOVEMENT_OPS = frozenset(
    {
        "Concat",
        "ConstantOfShape",
        "DepthToSpace",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "GatherND",
        "Identity",
        "Pad",
        "Reshape",
        "Slice",
        "SpaceToDepth",
        "Split",
        "Squeeze",
        "Tile",
        "Transpose",
        "Unsqueeze",
    }
)
"""Ops that only copy, select or rearrange their float elements (or fill a constant): in FP32 they give exactly
the values they give in FP16/BF16 after a cast, so running them low only adds the casts' rounding."""

_TYPE_READERS = frozenset({"Shape", "Size"})  # read no element: any float type gives the same result


@dataclasses.dataclass
class WidenMovementIslandsResult(ir.passes.PassResult):
    """The result of :class:`WidenMovementIslandsPass`.

    Attributes:
        widened: The nodes the pass returned to FP32, in graph order.
        casts_removed: How many Cast nodes went.
    """

    widened: list[ir.Node] = dataclasses.field(default_factory=list)
    casts_removed: int = 0


def _is_cast(node: ir.Node | None, to: ir.DataType | None = None) -> bool:
    if node is None or node.op_type != "Cast" or not is_default_domain(node.domain):
        return False
    return to is None or node.attributes["to"].as_int() == to


def _is_member(node: ir.Node) -> bool:
    return (
        node.op_type in MOVEMENT_OPS
        and is_default_domain(node.domain)
        and any(tensor_dtype(v) in LOW_FLOAT_TYPES for v in node.outputs)
    )


def _floats(node: ir.Node) -> list[ir.Value]:
    """The float inputs and outputs of ``node``."""
    return [v for v in (*node.inputs, *node.outputs) if v is not None and tensor_dtype(v) in (*LOW_FLOAT_TYPES, _F)]


class _Island:
    """A connected set of movement nodes of one graph, joined by their low-precision values."""

    def __init__(self, graph: ir.Graph, nodes: list[ir.Node]) -> None:
        self.graph = graph
        self.nodes = nodes
        members = set(nodes)
        self.values = {v: None for node in nodes for v in _floats(node)}  # ordered set
        self.entries: list[ir.Value] = []  # outputs of Casts from FP32 that the island reads
        self.exits: list[ir.Node] = []  # the Casts back to FP32 of the island's values
        self.whole = self._bounded(members)

    def _bounded(self, members: set[ir.Node]) -> bool:
        """Whether every float value is low, read from a Cast of FP32 or made inside, and read outside only by a
        Cast to FP32 (or a node that reads its shape) of the same graph."""
        for value in self.values:
            if tensor_dtype(value) not in LOW_FLOAT_TYPES or value.is_graph_output() or value.is_graph_input():
                return False
            if value.producer() not in members:
                if not self._is_entry(value):
                    return False
                self.entries.append(value)
                continue
            named = 0  # Casts back to FP32 that make a graph output: one at most, whose name the value takes
            for use in value.uses():
                reader = use.node
                if reader.graph is not self.graph:
                    return False
                if reader in members or reader.op_type in _TYPE_READERS:
                    continue
                if not _is_cast(reader, _F):
                    return False
                named += reader.outputs[0].is_graph_output()
                self.exits.append(reader)
            if named > 1:
                return False
        return bool(self.entries or self.exits)

    def _is_entry(self, value: ir.Value) -> bool:
        """Whether ``value`` is made by a Cast of an FP32 value in the island's graph."""
        cast = value.producer()
        if cast is None or not _is_cast(cast) or cast.graph is not self.graph:
            return False
        return cast.inputs[0] is not None and tensor_dtype(cast.inputs[0]) == _F

    def widen(self) -> int:
        """Retypes the island to FP32, reads the casts' FP32 sources and drops the casts; returns how many went."""
        removed = 0
        members = set(self.nodes)
        for entry in self.entries:
            cast = entry.producer()
            assert cast is not None and cast.inputs[0] is not None
            for use in list(entry.uses()):
                if use.node in members:
                    use.node.replace_input_with(use.idx, cast.inputs[0])
            if not entry.uses() and not entry.is_graph_output():
                self.graph.remove(cast, safe=True)
                removed += 1
        for node in self.nodes:
            for value in node.outputs:
                low = tensor_dtype(value)
                if low in LOW_FLOAT_TYPES:
                    value.dtype = _F
                    if node.op_type == "ConstantOfShape":
                        retarget_type_attributes(node, low, _F)
        for cast in dict.fromkeys(self.exits):
            self._drop_exit(cast)
            removed += 1
        return removed

    def _drop_exit(self, cast: ir.Node) -> None:
        """Removes a Cast back to FP32; a graph output it made keeps its name and place on the island's value."""
        value, out = cast.inputs[0], cast.outputs[0]
        assert value is not None
        public = out.name if out.is_graph_output() else None
        out.replace_all_uses_with(value, replace_graph_outputs=True)
        self.graph.remove(cast, safe=True)
        if public is not None:
            value.name = public
            if value.metadata_props.get(ORIGINAL_NAME) == public:
                del value.metadata_props[ORIGINAL_NAME]


def _islands(graph: ir.Graph) -> list[_Island]:
    """The connected sets of movement nodes of ``graph`` that have a low-precision output."""
    parent: dict[ir.Node, ir.Node] = {node: node for node in graph if _is_member(node)}

    def root(node: ir.Node) -> ir.Node:
        while parent[node] is not node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in parent:
        for value in node.inputs:
            if value is None or tensor_dtype(value) not in LOW_FLOAT_TYPES:
                continue
            producer = value.producer()
            if producer is not None and producer in parent:
                parent[root(node)] = root(producer)
    groups: dict[ir.Node, list[ir.Node]] = {}
    for node in parent:
        groups.setdefault(root(node), []).append(node)
    return [_Island(graph, nodes) for nodes in groups.values()]


class WidenMovementIslandsPass(ir.passes.InPlacePass):
    """Returns to FP32 every low-precision island that computes nothing, and removes its casts.

    An island is a connected set of nodes of one graph, of the ops in :data:`MOVEMENT_OPS`, joined by FP16 or
    BF16 values. When every float value it reads comes from a Cast of an FP32 value (not a low initializer or
    graph input: a weight stored low is a choice of size) and every value it makes is read outside only by Casts
    back to FP32 (or by Shape/Size), running it in FP32 gives the values the casts would have rounded, exactly:
    its values become FP32 (ConstantOfShape's fill too), its readers read the FP32 sources, and the casts go (a
    Cast that made a graph output leaves the output's name and place to the island's value). Subgraphs are
    visited too; an island never spans two graphs.

    The pass is idempotent: a second run finds no island and reports ``modified=False``.
    """

    def call(self, model: ir.Model) -> WidenMovementIslandsResult:
        result = WidenMovementIslandsResult(model, modified=False)
        for graph in all_graphs(model.graph):
            for island in _islands(graph):
                if island.whole:
                    result.casts_removed += island.widen()
                    result.widened.extend(island.nodes)
        result.modified = bool(result.widened)
        if result.widened:
            logger.debug(
                "Returned %d data-movement nodes to FP32 (%d casts removed)", len(result.widened), result.casts_removed
            )
        return result
