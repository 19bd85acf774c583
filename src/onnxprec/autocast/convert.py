"""Rewrite a classified model: retype the low-precision region, convert initializers, place the fewest casts.

Every step is linear in the size of the graph: decisions and casts are looked up by object, casts are
shared per (tensor, target type, graph), and onnx-ir's linked-list graph makes each insertion O(1).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxprec._graph import NameAllocator, all_graphs, cast_graph_output, dtype_name, insert_cast, tensor_dtype
from onnxprec._ort import float_to_fp16
from onnxprec._tensors import converted_tensor
from onnxprec.autocast.classify import Decision
from onnxprec.passes._retype import retarget_type_attributes, retype_initializer

__all__ = ["ConversionStats", "ConvertPrecisionPass", "ConvertPrecisionResult"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT


@dataclass
class ConversionStats:
    """Counts reported after conversion."""

    nodes: int = 0
    low_nodes: int = 0
    casts: int = 0
    initializers_converted: int = 0
    initializers_copied: int = 0
    initializers_cast_at_runtime: int = 0


@dataclass
class ConvertPrecisionResult(ir.passes.PassResult):
    """The result of :class:`ConvertPrecisionPass`.

    Attributes:
        stats: The counts of the conversion; ``stats.casts`` is the number of Casts the pass inserted.
        casts: The Cast nodes the pass inserted, in order. A later cleanup may remove some of them (a
            removed node's ``graph`` is None), so count the survivors after it.
    """

    stats: ConversionStats = field(default_factory=ConversionStats)
    casts: list[ir.Node] = field(default_factory=list)


class ConvertPrecisionPass(ir.passes.InPlacePass):
    """Converts the nodes decided low to ``low`` and inserts one Cast per boundary tensor and direction.

    FP32 graph outputs that change type keep their public name on the new Cast; the value the Cast reads
    is renamed ``<name>_pre_cast`` and records the output's name in
    ``metadata_props["onnxprec.original_name"]`` (:data:`onnxprec._graph.ORIGINAL_NAME`), which saving keeps.

    The pass holds only its settings: each call returns a :class:`ConvertPrecisionResult` with its counts
    and casts, and ``modified`` is False when there was nothing to convert (e.g. a second run).

    Args:
        decisions: A decision for every node of the model (subgraphs included).
        low: FLOAT16 or BFLOAT16.
        keep_io_types: Keep FP32 graph inputs and outputs (casts at the boundary) instead of retyping them.
        init_conversion_max_bytes: Initializers larger than this stay FP32 and are cast at run time.
        io_types: With ``keep_io_types``, the type a graph input or output (by name) keeps instead of FP32: the
            original FP16/BF16 interface of a model that was widened to FP32 to be classified.
    """

    def __init__(
        self,
        decisions: dict[ir.Node, Decision],
        low: ir.DataType,
        *,
        keep_io_types: bool = False,
        init_conversion_max_bytes: int | None = None,
        io_types: Mapping[str, ir.DataType] | None = None,
    ) -> None:
        super().__init__()
        self.decisions = decisions
        self.low = low
        self.keep_io_types = keep_io_types
        self.init_conversion_max_bytes = init_conversion_max_bytes
        self.io_types = dict(io_types or {})

    def call(self, model: ir.Model) -> ConvertPrecisionResult:
        return _Conversion(self, model).run()


class _Conversion:
    """One run of :class:`ConvertPrecisionPass` on one model: the state that the pass itself must not hold."""

    def __init__(self, settings: ConvertPrecisionPass, model: ir.Model) -> None:
        self.decisions = settings.decisions
        self.low = settings.low
        self.keep_io_types = settings.keep_io_types
        self.io_types = settings.io_types if settings.keep_io_types else {}
        self.limit = settings.init_conversion_max_bytes
        self.model = model
        self.graphs = list(all_graphs(model.graph))
        self.names = NameAllocator(model)
        self.fp32 = self._collect_fp32()
        self.cast_cache: dict[tuple[ir.Value, ir.DataType, ir.Graph], ir.Value] = {}
        self.result = ConvertPrecisionResult(model, modified=False)
        self.retyped = 0  # values retyped and attributes retargeted

    def run(self) -> ConvertPrecisionResult:
        self._retype()
        for graph in self.graphs:
            self._convert_initializers(graph)
        for graph in self.graphs:
            self._insert_casts(graph, is_main=graph is self.model.graph)
        stats = self.result.stats
        stats.nodes = len(self.decisions)
        stats.low_nodes = sum(d.low for d in self.decisions.values())
        stats.casts = len(self.result.casts)
        self.result.modified = bool(
            self.retyped or stats.initializers_converted or stats.initializers_copied or stats.casts
        )
        return self.result

    def _collect_fp32(self) -> set[ir.Value]:
        fp32: set[ir.Value] = set()
        for graph in self.graphs:
            fp32.update(v for v in graph.inputs if tensor_dtype(v) == _F)
            fp32.update(v for v in graph.initializers.values() if tensor_dtype(v) == _F)
            for node in graph:
                fp32.update(v for v in node.outputs if tensor_dtype(v) == _F)
        return fp32

    def _wanted(self, node: ir.Node, index: int, value: ir.Value) -> ir.DataType | None:
        """The type ``node`` needs on input ``index``, or None if the value is not an FP32 tensor."""
        if value not in self.fp32:
            return None
        decision = self.decisions.get(node)
        if decision is not None and decision.low and index not in decision.fp32_inputs:
            return self.low
        return _F

    def _cast(self, value: ir.Value, to: ir.DataType, graph: ir.Graph) -> ir.Value:
        """The output of the one Cast of ``value`` to ``to`` in ``graph``, inserted on first use."""
        key = (value, to, graph)
        cached = self.cast_cache.get(key)
        if cached is None:
            cast = insert_cast(graph, value, to, self.names)
            self.result.casts.append(cast)
            cached = self.cast_cache[key] = cast.outputs[0]
        return cached

    def _retype(self) -> None:
        for graph in self.graphs:
            for node in graph:
                decision = self.decisions.get(node)
                if decision is None or not decision.low:
                    continue
                for j, out in enumerate(node.outputs):
                    if out in self.fp32 and j not in decision.fp32_outputs:
                        out.dtype = self.low
                        self.retyped += 1
                self.retyped += retarget_type_attributes(node, _F, self.low)
        for value in self.model.graph.inputs:
            if value in self.fp32 and not value.is_initializer():
                kept = self.io_types.get(str(value.name), _F)
                if kept != _F or not self.keep_io_types:
                    value.dtype = kept if self.keep_io_types else self.low
                    self.retyped += 1

    def _convert_initializers(self, graph: ir.Graph) -> None:
        stats = self.result.stats
        for init in list(graph.initializers.values()):
            if init not in self.fp32 or init.is_graph_input() or init.const_value is None:
                continue
            uses = list(init.uses())
            wants = {self._wanted(use.node, use.idx, init) for use in uses}
            if init.is_graph_output():
                wants.add(_F)
            if self.low not in wants:
                continue
            if self.limit is not None and init.const_value.nbytes > self.limit:
                stats.initializers_cast_at_runtime += 1
                continue  # stays FP32: _insert_casts gives its low consumers one shared Cast
            if wants == {self.low}:
                retype_initializer(init, self.low, kernel=float_to_fp16)
                stats.initializers_converted += 1
                continue
            copy = ir.Value(
                name=self.names(f"{init.name}_{dtype_name(self.low)}"),
                type=ir.TensorType(self.low),
                shape=init.shape,
                const_value=converted_tensor(init.const_value, self.low, kernel=float_to_fp16),
            )
            graph.register_initializer(copy)
            for use in uses:
                if self._wanted(use.node, use.idx, init) == self.low:
                    use.node.replace_input_with(use.idx, copy)
            stats.initializers_copied += 1

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
            kept = self.io_types.get(str(out.name), io_type) if is_main else io_type
            if out not in self.fp32 or out.dtype == kept or out.is_graph_input():
                continue
            self.result.casts.append(cast_graph_output(graph, position, kept, self.names))
