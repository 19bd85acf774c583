"""Small graph helpers shared by the passes: traversal, unique names, Cast insertion."""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

__all__ = [
    "FLOAT_TYPES",
    "TYPE_ATTRIBUTES",
    "NameAllocator",
    "all_graphs",
    "dtype_name",
    "make_cast",
]

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})

# Ops whose output element type is set by an integer attribute rather than by an input.
TYPE_ATTRIBUTES = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
}

_SHORT = {
    ir.DataType.FLOAT: "fp32",
    ir.DataType.FLOAT16: "fp16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "fp64",
}


def dtype_name(dtype: ir.DataType) -> str:
    """``fp32``/``fp16``/``bf16``/``fp64``; other types by their ONNX name."""
    return _SHORT.get(dtype, dtype.name.lower())


def all_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and every subgraph below it (If/Loop/Scan bodies, recursively), parents first."""
    yield graph
    yield from graph.subgraphs()


class NameAllocator:
    """Hands out value and node names that collide with nothing already in the model."""

    def __init__(self, model: ir.Model) -> None:
        self._values: set[str] = set()
        self._nodes: set[str] = set()
        for graph in all_graphs(model.graph):
            self._values.update(v.name for v in graph.inputs if v.name)
            self._values.update(v.name for v in graph.initializers.values() if v.name)
            for node in graph:
                if node.name:
                    self._nodes.add(node.name)
                self._values.update(v.name for v in node.outputs if v.name)

    @staticmethod
    def _unique(base: str, used: set[str]) -> str:
        name, n = base, 0
        while name in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name)
        return name

    def __call__(self, base: str) -> str:
        """A new value name."""
        return self._unique(base, self._values)

    def node(self, base: str) -> str:
        """A new node name."""
        return self._unique(base, self._nodes)


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
