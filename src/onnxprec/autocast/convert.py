"""Rewrite a classified model: retype the low-precision region, convert initializers, place the fewest casts.

Every step is linear in the size of the graph: decisions and casts are looked up by object, casts are
shared per (tensor, target type, graph), and onnx-ir's linked-list graph makes each insertion O(1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, TYPE_ATTRIBUTES, NameAllocator, all_graphs, dtype_name, make_cast
from onnxprec._tensors import cast_array, converted_tensor
from onnxprec.autocast.classify import Decision

__all__ = ["ConversionStats", "ConvertPrecisionPass", "RemoveRedundantCastsPass"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT
# a -> b is exact when every value of a is representable in b
_WIDENS = {
    (ir.DataType.FLOAT16, ir.DataType.FLOAT),
    (ir.DataType.BFLOAT16, ir.DataType.FLOAT),
    (ir.DataType.FLOAT16, ir.DataType.DOUBLE),
    (ir.DataType.BFLOAT16, ir.DataType.DOUBLE),
    (ir.DataType.FLOAT, ir.DataType.DOUBLE),
}


@dataclass
class ConversionStats:
    """Counts reported after conversion."""

    nodes: int = 0
    low_nodes: int = 0
    casts: int = 0
    initializers_converted: int = 0
    initializers_copied: int = 0
    initializers_cast_at_runtime: int = 0


class ConvertPrecisionPass(ir.passes.InPlacePass):
    """Converts the nodes decided low to ``low`` and inserts one Cast per boundary tensor and direction.

    Args:
        decisions: A decision for every node of the model (subgraphs included).
        low: FLOAT16 or BFLOAT16.
        keep_io_types: Keep FP32 graph inputs and outputs (casts at the boundary) instead of retyping them.
        init_conversion_max_bytes: Initializers larger than this stay FP32 and are cast at run time.
    """

    def __init__(
        self,
        decisions: dict[ir.Node, Decision],
        low: ir.DataType,
        *,
        keep_io_types: bool = False,
        init_conversion_max_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.decisions = decisions
        self.low = low
        self.keep_io_types = keep_io_types
        self.init_conversion_max_bytes = init_conversion_max_bytes
        self.stats = ConversionStats()
        self.created: list[ir.Node] = []

    # -- helpers ------------------------------------------------------------------------------------

    def _wanted(self, node: ir.Node, index: int, value: ir.Value) -> ir.DataType | None:
        """The type ``node`` needs on input ``index``, or None if the value is not an FP32 tensor."""
        if value not in self._fp32:
            return None
        decision = self.decisions.get(node)
        if decision is not None and decision.low and index not in decision.fp32_inputs:
            return self.low
        return _F

    def _cast(self, value: ir.Value, to: ir.DataType, graph: ir.Graph) -> ir.Value:
        key = (value, to, graph)
        cached = self._casts.get(key)
        if cached is not None:
            return cached
        cast = make_cast(value, to, self._names)
        producer = value.producer()
        if producer is not None and producer.graph is graph:
            graph.insert_after(producer, cast)
        else:
            graph.insert_before(next(iter(graph)), cast)
        self._casts[key] = cast.outputs[0]
        self.created.append(cast)
        return cast.outputs[0]

    def _retarget_attributes(self, node: ir.Node) -> None:
        """Rewrites attributes that set an FP32 output type (Cast ``to``, ConstantOfShape ``value``...)."""
        if node.domain not in ("", "ai.onnx"):
            return
        name = TYPE_ATTRIBUTES.get(node.op_type)
        if name is not None and name in node.attributes and node.attributes[name].as_int() == _F:
            node.attributes[name] = ir.AttrInt64(name, self.low)
        elif node.op_type in ("ConstantOfShape", "Constant"):
            self._retarget_constant(node)

    def _retarget_constant(self, node: ir.Node) -> None:
        attrs = node.attributes
        if "value" in attrs:
            tensor = attrs["value"].as_tensor()
            if tensor.dtype == _F:
                attrs["value"] = ir.AttrTensor(
                    "value", ir.Tensor(cast_array(tensor.numpy(), self.low), dtype=self.low, name=tensor.name)
                )
        elif "value_float" in attrs or "value_floats" in attrs:
            name = "value_float" if "value_float" in attrs else "value_floats"
            raw = attrs[name].value
            array = np.asarray(raw, dtype=np.float32)
            del attrs[name]
            attrs["value"] = ir.AttrTensor("value", ir.Tensor(cast_array(array, self.low), dtype=self.low))

    # -- the pass -----------------------------------------------------------------------------------

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._names = NameAllocator(model)
        self._casts: dict[tuple[ir.Value, ir.DataType, ir.Graph], ir.Value] = {}
        graphs = list(all_graphs(model.graph))
        self._fp32 = self._collect_fp32(graphs)
        self._retype(model, graphs)
        for graph in graphs:
            self._convert_initializers(graph)
        for graph in graphs:
            self._insert_casts(graph, is_main=graph is model.graph)
        self.stats.nodes = len(self.decisions)
        self.stats.low_nodes = sum(d.low for d in self.decisions.values())
        return ir.passes.PassResult(model, modified=True)

    def _collect_fp32(self, graphs: list[ir.Graph]) -> set[ir.Value]:
        fp32: set[ir.Value] = set()
        for graph in graphs:
            fp32.update(v for v in graph.inputs if v.dtype == _F)
            fp32.update(v for v in graph.initializers.values() if v.dtype == _F)
            for node in graph:
                fp32.update(v for v in node.outputs if v.dtype == _F)
        return fp32

    def _retype(self, model: ir.Model, graphs: list[ir.Graph]) -> None:
        for graph in graphs:
            for node in graph:
                decision = self.decisions.get(node)
                if decision is None or not decision.low:
                    continue
                for j, out in enumerate(node.outputs):
                    if out in self._fp32 and j not in decision.fp32_outputs:
                        out.dtype = self.low
                self._retarget_attributes(node)
        if not self.keep_io_types:
            for value in model.graph.inputs:
                if value in self._fp32 and not value.is_initializer():
                    value.dtype = self.low

    def _convert_initializers(self, graph: ir.Graph) -> None:
        limit = self.init_conversion_max_bytes
        for init in list(graph.initializers.values()):
            if init not in self._fp32 or init.is_graph_input() or init.const_value is None:
                continue
            uses = list(init.uses())
            wants = {self._wanted(use.node, use.idx, init) for use in uses}
            if init.is_graph_output():
                wants.add(_F)
            if self.low not in wants:
                continue
            if limit is not None and init.const_value.nbytes > limit:
                self.stats.initializers_cast_at_runtime += 1
                continue  # stays FP32: _insert_casts gives its low consumers one shared Cast
            converted = converted_tensor(init.const_value, self.low)
            if wants == {self.low}:
                init.const_value = converted
                init.dtype = self.low
                self.stats.initializers_converted += 1
                continue
            copy = ir.Value(
                name=self._names(f"{init.name}_{dtype_name(self.low)}"),
                type=ir.TensorType(self.low),
                shape=init.shape,
                const_value=converted,
            )
            graph.register_initializer(copy)
            for use in uses:
                if self._wanted(use.node, use.idx, init) == self.low:
                    use.node.replace_input_with(use.idx, copy)
            self.stats.initializers_copied += 1

    def _insert_casts(self, graph: ir.Graph, *, is_main: bool) -> None:
        for node in list(graph):
            for index, value in enumerate(node.inputs):
                if value is None:
                    continue
                wanted = self._wanted(node, index, value)
                if wanted is not None and wanted != value.dtype:
                    node.replace_input_with(index, self._cast(value, wanted, graph))
        io_type = _F if (self.keep_io_types or not is_main) else self.low
        for position, out in enumerate(graph.outputs):
            if out not in self._fp32 or out.dtype == io_type or out.is_graph_input():
                continue
            self._cast_graph_output(graph, position, out, io_type)

    def _cast_graph_output(self, graph: ir.Graph, position: int, out: ir.Value, to: ir.DataType) -> None:
        """Casts a graph output while keeping its public name: the producer's value is renamed instead."""
        public = out.name
        out.name = self._names(f"{public}_pre_cast")
        cast = make_cast(out, to, self._names)
        cast.outputs[0].name = public
        producer = out.producer()
        if producer is not None and producer.graph is graph:
            graph.insert_after(producer, cast)
        else:
            graph.append(cast)
        graph.outputs[position] = cast.outputs[0]
        self.created.append(cast)


class RemoveRedundantCastsPass(ir.passes.InPlacePass):
    """Removes casts that do nothing and shortens exact cast chains; folds casts of constants.

    - ``Cast(to=T)`` of a tensor already of type T is bypassed (a graph output keeps its name).
    - ``Cast(Cast(x: a -> b) -> c)`` reads ``x`` directly when ``a -> b`` is exact (widening).
    - A Cast of an initializer becomes a converted initializer (clamped to the finite range), unless the
      initializer is larger than ``fold_max_bytes`` (``init_conversion_max_bytes``: cast at run time).
    """

    def __init__(self, fold_max_bytes: int | None = None) -> None:
        super().__init__()
        self.fold_max_bytes = fold_max_bytes
        self.removed = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        for graph in all_graphs(model.graph):
            for node in list(graph):
                if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
                    continue
                self._simplify(graph, node)
        return ir.passes.PassResult(model, modified=bool(self.removed))

    def _simplify(self, graph: ir.Graph, node: ir.Node) -> None:
        source = node.inputs[0]
        assert source is not None
        out = node.outputs[0]
        to = ir.DataType(node.attributes["to"].as_int())
        producer = source.producer()
        if producer is not None and producer.op_type == "Cast" and producer.inputs[0] is not None:
            inner = producer.inputs[0]
            if (inner.dtype, source.dtype) in _WIDENS or inner.dtype == source.dtype:
                node.replace_input_with(0, inner)
                if not source.uses() and not source.is_graph_output() and producer.graph is not None:
                    producer.graph.remove(producer, safe=True)
                    self.removed += 1
                source = inner
        if source.dtype == to and not out.is_graph_output():
            out.replace_all_uses_with(source)
            graph.remove(node, safe=True)
            self.removed += 1
        elif (
            source.is_initializer()
            and not source.is_graph_input()
            and source.const_value is not None
            and to in FLOAT_TYPES
            and len(source.uses()) == 1
            and not out.is_graph_output()
            and source.graph is graph
            and (self.fold_max_bytes is None or source.const_value.nbytes <= self.fold_max_bytes)
        ):
            public = out.name
            folded = ir.Value(
                type=ir.TensorType(to),
                shape=out.shape,
                const_value=converted_tensor(source.const_value, to, name=public),
            )
            out.replace_all_uses_with(folded)
            graph.remove(node, safe=True)
            assert source.name is not None
            graph.initializers.pop(source.name)
            folded.name = public
            graph.register_initializer(folded)
            self.removed += 1
