"""Small graph helpers shared by the passes: traversal, unique names, renames that remember, Cast insertion."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator, Sequence

import onnx_ir as ir

__all__ = [
    "FLOAT_TYPES",
    "LOW_FLOAT_TYPES",
    "ORIGINAL_NAME",
    "FileNames",
    "NameAllocator",
    "all_graphs",
    "all_values",
    "bodies_of",
    "cast_graph_output",
    "dtype_name",
    "graph_of",
    "insert_after_producer",
    "insert_cast",
    "make_cast",
    "original_name",
    "record_original_name",
    "rename_value",
    "subgraph_nodes",
    "tensor_attribute",
    "tensor_dtype",
    "unique_name",
]

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
# The 16-bit floats AutoCast converts to (and widens back from).
LOW_FLOAT_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})

# Key of ``Value.metadata_props`` holding a renamed tensor's name in the source model. onnx-ir writes it into the
# ValueInfoProto's metadata_props, so a saved model keeps it (compare and dump match tensors through it).
ORIGINAL_NAME = "onnxprec.original_name"

_SHORT = {
    ir.DataType.FLOAT: "fp32",
    ir.DataType.FLOAT16: "fp16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "fp64",
}


def tensor_dtype(value: ir.Value) -> ir.DataType | None:
    """The element type of a tensor value; None for sequences, optionals and maps (``Value.dtype`` looks through
    them: a sequence of FP32 tensors is no FP32 tensor to convert or cast) and for untyped values."""
    return value.dtype if isinstance(value.type, ir.TensorType) else None


def tensor_attribute(attr: ir.Attr) -> ir.TensorProtocol:
    """The tensor of a TENSOR attribute (a Constant's ``value``).

    ``Attr.as_tensor()`` checks the value against onnx-ir's runtime-checkable ``TensorProtocol``, which is slow for
    an LLM's thousands of Constant nodes, each read several times; this reads the tensor directly.

    Raises:
        TypeError: The attribute is not a tensor.
    """
    if attr.type != ir.AttributeType.TENSOR:
        raise TypeError(f"Attribute '{attr.name}' is not of type TENSOR. Actual type: {attr.type}")
    return attr.value


def dtype_name(dtype: ir.DataType) -> str:
    """``fp32``/``fp16``/``bf16``/``fp64``; other types by their ONNX name."""
    return _SHORT.get(dtype, dtype.name.lower())


def all_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and every subgraph below it (If/Loop/Scan bodies, recursively), parents first.

    The order of ``ir.Graph.subgraphs`` (depth first, in node and attribute order, each graph once), found in one
    plain walk over the nodes' attributes instead of onnx-ir's recursive node iterator (a generator step per node:
    a third of the time on a 7k-node graph, and every pass walks it). The subgraphs are listed when the second
    item is asked for, as ``subgraphs`` lists them, so a caller may change the graphs while it iterates.
    """
    yield graph
    found: dict[ir.Graph, None] = {}
    _collect_subgraphs(graph, graph, found)
    yield from list(found)


def bodies_of(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """The graph attributes of ``node`` (an If's two branches, a Loop's or Scan's body), with the attribute name."""
    bodies = []
    for name, attr in node.attributes.items():
        if isinstance(attr, ir.Attr) and attr.type == ir.AttributeType.GRAPH:
            bodies.append((name, attr.as_graph()))
        elif isinstance(attr, ir.Attr) and attr.type == ir.AttributeType.GRAPHS:
            bodies.extend((name, graph) for graph in attr.as_graphs())
    return bodies


def subgraph_nodes(graph: ir.Graph) -> Iterator[tuple[ir.Node, ir.Node]]:
    """Every node inside the If/Loop/Scan bodies below ``graph`` (recursively), with the node that owns its body."""
    for owner in graph:
        for attr in owner.attributes.values():
            if not isinstance(attr, ir.Attr):
                continue
            bodies = [attr.value] if attr.type == ir.AttributeType.GRAPH else []
            bodies += list(attr.value) if attr.type == ir.AttributeType.GRAPHS else []
            for body in bodies:
                for node in body:
                    yield node, owner
                yield from subgraph_nodes(body)


def _collect_subgraphs(graph: ir.Graph, top: ir.Graph, found: dict[ir.Graph, None]) -> None:
    for node in graph:
        for attr in node.attributes.values():
            if not isinstance(attr, ir.Attr):
                continue  # a reference attribute (in a function body)
            if attr.type == ir.AttributeType.GRAPH:
                bodies: Iterable[ir.Graph] = (attr.value,)
            elif attr.type == ir.AttributeType.GRAPHS:
                bodies = attr.value
            else:
                continue
            for body in bodies:
                if body is not top:
                    found.setdefault(body, None)
                _collect_subgraphs(body, top, found)


def all_values(graph: ir.Graph) -> Iterator[ir.Value]:
    """Every value defined in the graph and its subgraphs: graph inputs, initializers and node outputs."""
    for g in all_graphs(graph):
        yield from g.inputs
        yield from g.initializers.values()
        for node in g:
            yield from node.outputs


def clone_model(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose graph a pass may rewire and retype in place without changing ``model``: onnx_ir's
    clone (new graphs, nodes and values), each graph value with a type of its own (a clone's values share their type
    objects with the original's, and setting a value's ``dtype`` changes its type object). Shared with ``model``, so
    not to be changed in place: the weights and Constant attribute tensors (never copied), the values of
    ``model.functions`` (their types too) and the ``meta`` entries (copied shallowly)."""
    clone = model.clone()
    for value in all_values(clone.graph):
        kind = value.type
        if kind is not None:  # a sequence's or an optional's element type is an object of its own too
            value.type = copy.copy(kind) if isinstance(kind, ir.TensorType) else copy.deepcopy(kind)
    return clone


def unique_name(base: str, used: set[str], *, fold_case: bool = False) -> str:
    """``base``, or ``base_<n>`` with the smallest n >= 1 not in ``used``; the result is added to ``used``.

    The one unique-name generator (values, nodes, file names). With ``fold_case``, ``used`` holds lower-case
    names and a name collides with any spelling of it (file names on macOS and Windows).
    """
    name, n = base, 0
    while (name.lower() if fold_case else name) in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name.lower() if fold_case else name)
    return name


_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
_MAX_FILE_STEM = 180


class FileNames:
    """File stems from tensor names: path and other special characters become ``_``, collisions get ``_<n>``.

    Stems never start with a dot (hidden files) or a dash (options), are never empty and stay short enough for
    any file system (long names keep their end, which holds the distinguishing part in exporter names such as
    ``/model/layers.3/mlp/down_proj/MatMul_output_0``). Comparison is case-insensitive, so that two names
    differing only in case do not overwrite each other on macOS or Windows.
    """

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._used = {r.lower() for r in reserved}

    def __call__(self, name: str) -> str:
        stem = _UNSAFE_FILE_CHARS.sub("_", name).lstrip(".") or "tensor"
        if stem[0] == "-":
            stem = "_" + stem[1:]
        if len(stem) > _MAX_FILE_STEM:
            stem = stem[-_MAX_FILE_STEM:].lstrip(".") or "tensor"
        return unique_name(stem, self._used, fold_case=True)


class NameAllocator:
    """Hands out value and node names that collide with nothing already in the model."""

    def __init__(self, model: ir.Model) -> None:
        self._values = {v.name for v in all_values(model.graph) if v.name}
        self._nodes = {node.name for node in model.graph.all_nodes() if node.name}

    def __call__(self, base: str) -> str:
        """A new value name."""
        return unique_name(base, self._values)

    def node(self, base: str) -> str:
        """A new node name."""
        return unique_name(base, self._nodes)


def make_cast(value: ir.Value, to: ir.DataType, names: NameAllocator) -> ir.Node:
    """A new (not yet inserted) ``Cast`` node converting ``value`` to ``to``, output typed and shaped."""
    suffix = f"cast_to_{dtype_name(to)}"
    out = ir.Value(name=names(f"{value.name}_{suffix}"), type=ir.TensorType(to), shape=value.shape)
    return ir.Node(
        "",
        "Cast",
        [value],
        attributes=[ir.AttrInt64("to", to)],
        outputs=[out],
        name=names.node(f"{value.name}_{suffix}"),
    )


def original_name(value: ir.Value) -> str | None:
    """The name ``value`` had in the source model: the recorded :data:`ORIGINAL_NAME`, else its name."""
    return value.metadata_props.get(ORIGINAL_NAME, value.name)


def record_original_name(value: ir.Value, name: str) -> None:
    """Records ``name`` as the name ``value`` had in the source model, unless one is recorded already."""
    value.metadata_props.setdefault(ORIGINAL_NAME, name)


def rename_value(value: ir.Value, name: str) -> None:
    """Renames ``value``, recording its first name under :data:`ORIGINAL_NAME` (an earlier record is kept)."""
    if value.name and value.name != name:
        record_original_name(value, value.name)
    value.name = name


def insert_cast(graph: ir.Graph, value: ir.Value, to: ir.DataType, names: NameAllocator) -> ir.Node:
    """Inserts a Cast of ``value`` to ``to`` into ``graph`` and returns it; consumers are not rewired.

    The Cast goes right after the producer of ``value`` when that is in ``graph``, else (graph inputs,
    initializers, values of an enclosing graph) first in ``graph``.
    """
    cast = make_cast(value, to, names)
    insert_after_producer(graph, value, [cast])
    return cast


def graph_of(value: ir.Value, readers: Iterable[ir.Node] = ()) -> ir.Graph:
    """The graph where nodes that rewrite ``value`` for ``readers`` go: the readers' graph when they share one (an If
    branch that reads a value of the enclosing graph gets its own Q/DQ, beside the layer that reads it), else the
    graph that holds ``value``."""
    graphs = {id(node.graph): node.graph for node in readers if node.graph is not None}
    if len(graphs) == 1:
        return next(iter(graphs.values()))
    producer = value.producer()
    graph = producer.graph if producer is not None else value.graph
    assert graph is not None, f"'{value.name}' belongs to no graph"
    return graph


def insert_after_producer(graph: ir.Graph, value: ir.Value, nodes: Sequence[ir.Node]) -> None:
    """Inserts ``nodes`` right after the producer of ``value`` when that is in ``graph``, else (graph inputs,
    initializers, values of an enclosing graph) first in ``graph``."""
    producer = value.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, nodes)
    elif len(graph):
        graph.insert_before(next(iter(graph)), nodes)
    else:
        graph.extend(nodes)


def cast_graph_output(graph: ir.Graph, position: int, to: ir.DataType, names: NameAllocator) -> ir.Node:
    """Casts ``graph.outputs[position]`` to ``to`` while keeping the output's public name, and returns the Cast.

    The Cast's output takes the public name and the output's place; the value it casts is renamed
    ``<name>_pre_cast`` (see :func:`rename_value`: its ``metadata_props`` record the public name).
    """
    value = graph.outputs[position]
    public = value.name
    rename_value(value, names(f"{public}_pre_cast"))
    cast = make_cast(value, to, names)
    cast.outputs[0].name = public
    producer = value.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, cast)
    else:
        graph.append(cast)
    graph.outputs[position] = cast.outputs[0]
    return cast
