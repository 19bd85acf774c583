"""Range reductions inside the runtime: a tensor that only range observers want is reduced to a few scalars in the
graph (min, max, sum, shape) instead of being fetched, so a reference run never copies it out of ONNX Runtime.

:class:`AddRangeReductionsPass` is an onnx-ir pass: the reference run (:func:`onnxprec.reference.run_reference`)
applies it to the model for as long as it takes to serialize it for ONNX Runtime, then takes it out again
(:func:`remove_range_reductions`; cheaper than a clone, which costs as much as deserializing the whole graph), and
hands the scalars to :meth:`onnxprec.observers.RangeObserver.update_range`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator

__all__ = ["AddRangeReductionsPass", "RangeReductionsResult", "remove_range_reductions"]

_F = ir.DataType.FLOAT
_REDUCTIONS = (("ReduceMin", "min"), ("ReduceMax", "max"), ("ReduceSum", "sum"))


@dataclasses.dataclass
class RangeReductionsResult(ir.passes.PassResult):
    """The result of :class:`AddRangeReductionsPass`.

    Attributes:
        reductions: Per reduced tensor, the names of the graph outputs that hold its min, max, sum and shape, and,
            for a tensor with a sentinel threshold, a fifth: its largest magnitude above the threshold.
        nodes: The nodes the pass added (what :func:`remove_range_reductions` takes out).
        outputs: How many graph outputs the pass appended.
    """

    reductions: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    nodes: list[ir.Node] = dataclasses.field(default_factory=list)
    outputs: int = 0


class AddRangeReductionsPass(ir.passes.InPlacePass):
    """Adds min/max/sum/shape graph outputs for main-graph tensors, computed right after each tensor's producer.

    The sum is NaN exactly when the tensor holds a NaN (or both infinities, which min/max show anyway):
    ReduceMin/ReduceMax alone do not propagate NaN reliably. A tensor with a threshold in ``sentinels`` also
    gets the largest magnitude among its elements above the threshold (sentinel values count as 0, NaN stays).
    The reductions follow the producer, so the runtime frees the tensor as early as without them.

    Args:
        names: The tensors to reduce: node outputs of the main graph, by name.
        sentinels: Per tensor name, the threshold at or below which a value is a sentinel (e.g. an attention mask).
    """

    def __init__(self, names: Sequence[str], sentinels: Mapping[str, float] | None = None) -> None:
        super().__init__()
        self.names = list(names)
        self.sentinels = dict(sentinels or {})

    def call(self, model: ir.Model) -> RangeReductionsResult:
        graph = model.graph
        produced = {str(out.name): out for node in graph for out in node.outputs}
        names = NameAllocator(model)
        result = RangeReductionsResult(model, modified=bool(self.names))
        for index, name in enumerate(self.names):
            value = produced[name]
            new = _NewNodes(names, f"__onnxprec_{index}")
            outs = [new.add(op, [value], suffix, shape=ir.Shape([]), keepdims=0) for op, suffix in _REDUCTIONS]
            rank = ir.Shape([len(value.shape) if value.shape is not None else None])
            outs.append(new.add("Shape", [value], "shape", ir.DataType.INT64, rank))
            threshold = self.sentinels.get(name)
            if threshold is not None:  # max(|x| where not x <= threshold)
                limit, zero = new.constant("t", threshold), new.constant("0", 0.0)
                masked = new.add("LessOrEqual", [value, limit], "m", ir.DataType.BOOL)
                kept = new.add("Where", [masked, zero, new.add("Abs", [value], "a")], "k")
                outs.append(new.add("ReduceMax", [kept], "past", shape=ir.Shape([]), keepdims=0))
            producer = value.producer()
            assert producer is not None
            graph.insert_after(producer, new.nodes)
            graph.outputs.extend(outs)
            result.reductions[name] = tuple(str(out.name) for out in outs)
            result.nodes += new.nodes
            result.outputs += len(outs)
        return result


def remove_range_reductions(result: RangeReductionsResult) -> None:
    """Takes what :class:`AddRangeReductionsPass` added out of the model it changed (``result.model``): its graph
    outputs (the last ``result.outputs``) and its nodes; the graph is then as before the pass."""
    graph = result.model.graph
    if result.outputs:
        graph.outputs[len(graph.outputs) - result.outputs :] = []
    graph.remove(result.nodes, safe=True)


class _NewNodes:
    """The nodes that reduce one tensor, their outputs named ``<prefix>_<suffix>`` (made unique)."""

    def __init__(self, names: NameAllocator, prefix: str) -> None:
        self.names = names
        self.prefix = prefix
        self.nodes: list[ir.Node] = []

    def add(
        self,
        op: str,
        inputs: Sequence[ir.Value],
        suffix: str,
        dtype: ir.DataType = _F,
        shape: ir.Shape | None = None,
        **attrs: int,
    ) -> ir.Value:
        out = ir.Value(name=self.names(f"{self.prefix}_{suffix}"), type=ir.TensorType(dtype), shape=shape)
        attributes = [ir.AttrInt64(key, val) for key, val in attrs.items()]
        self.nodes.append(ir.Node("", op, inputs, attributes=attributes, outputs=[out], name=out.name))
        return out

    def constant(self, suffix: str, number: float) -> ir.Value:
        out = ir.Value(name=self.names(f"{self.prefix}_{suffix}"), type=ir.TensorType(_F))
        value = ir.AttrTensor("value", ir.tensor(np.float32(number)))
        self.nodes.append(ir.Node("", "Constant", [], attributes=[value], outputs=[out], name=out.name))
        return out
