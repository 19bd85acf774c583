"""Remove casts that do nothing, shorten exact cast chains and fold casts of initializers."""

from __future__ import annotations

import dataclasses
import logging

import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, ORIGINAL_NAME, all_graphs, original_name
from onnxprec._ops import is_default_domain
from onnxprec._tensors import converted_tensor

__all__ = ["RemoveRedundantCastsPass", "RemoveRedundantCastsResult"]

logger = logging.getLogger(__name__)

# a -> b is exact when every value of a is representable in b
_WIDENS = frozenset(
    {
        (ir.DataType.FLOAT16, ir.DataType.FLOAT),
        (ir.DataType.BFLOAT16, ir.DataType.FLOAT),
        (ir.DataType.FLOAT16, ir.DataType.DOUBLE),
        (ir.DataType.BFLOAT16, ir.DataType.DOUBLE),
        (ir.DataType.FLOAT, ir.DataType.DOUBLE),
    }
)


@dataclasses.dataclass
class RemoveRedundantCastsResult(ir.passes.PassResult):
    """The result of :class:`RemoveRedundantCastsPass`.

    Attributes:
        removed: How many Cast nodes the pass removed (a folded Cast counts as removed).
        folded: How many of them were Casts of initializers folded into a converted initializer.
        shortened: How many Casts now read the input of an exact Cast chain instead of its middle.
    """

    removed: int = 0
    folded: int = 0
    shortened: int = 0


class RemoveRedundantCastsPass(ir.passes.InPlacePass):
    """Removes casts that do nothing and shortens exact cast chains; folds casts of initializers.

    In every graph, subgraphs included:

    - ``Cast(to=T)`` of a tensor already of type T is bypassed (a graph output keeps its Cast and name).
    - ``Cast(Cast(x: a -> b) -> c)`` reads ``x`` directly when ``a -> b`` is exact (widening); the inner
      Cast goes when nothing else reads it.
    - A floating-point Cast of an initializer used only by that Cast becomes a converted initializer
      (lazily, clamped to the finite range, sign kept), unless the initializer is larger than
      ``fold_max_bytes``. The new initializer takes the Cast output's name and records the name of the
      initializer it replaces in ``metadata_props["onnxprec.original_name"]``
      (:data:`onnxprec._graph.ORIGINAL_NAME`), which saving keeps.

    The pass is idempotent: a second run finds nothing to remove and reports ``modified=False``.

    Args:
        fold_max_bytes: Initializers larger than this are not folded (AutoCast's
            ``init_conversion_max_bytes``: they are cast at run time); None folds all.
    """

    def __init__(self, fold_max_bytes: int | None = None) -> None:
        super().__init__()
        self.fold_max_bytes = fold_max_bytes

    def call(self, model: ir.Model) -> RemoveRedundantCastsResult:
        result = RemoveRedundantCastsResult(model, modified=False)
        for graph in all_graphs(model.graph):
            for node in list(graph):
                if node.op_type == "Cast" and is_default_domain(node.domain) and node.inputs[0] is not None:
                    self._simplify(graph, node, result)
        result.modified = bool(result.removed or result.shortened)
        if result.removed:
            logger.debug("Removed %d redundant casts (%d folded into initializers)", result.removed, result.folded)
        return result

    def _simplify(self, graph: ir.Graph, node: ir.Node, result: RemoveRedundantCastsResult) -> None:
        source = node.inputs[0]
        assert source is not None
        out = node.outputs[0]
        to = ir.DataType(node.attributes["to"].as_int())
        producer = source.producer()
        if producer is not None and producer.op_type == "Cast" and producer.inputs[0] is not None:
            inner = producer.inputs[0]
            if (inner.dtype, source.dtype) in _WIDENS or inner.dtype == source.dtype:
                node.replace_input_with(0, inner)
                result.shortened += 1
                if not source.uses() and not source.is_graph_output() and producer.graph is not None:
                    producer.graph.remove(producer, safe=True)
                    result.removed += 1
                source = inner
        if source.dtype == to and not out.is_graph_output():
            out.replace_all_uses_with(source)
            graph.remove(node, safe=True)
            result.removed += 1
        elif self._foldable(graph, source, out, to):
            self._fold(graph, node, source, to)
            result.removed += 1
            result.folded += 1

    def _foldable(self, graph: ir.Graph, source: ir.Value, out: ir.Value, to: ir.DataType) -> bool:
        return (
            source.is_initializer()
            and not source.is_graph_input()
            and source.const_value is not None
            and to in FLOAT_TYPES
            and len(source.uses()) == 1
            and not out.is_graph_output()
            and source.graph is graph
            and (self.fold_max_bytes is None or source.const_value.nbytes <= self.fold_max_bytes)
        )

    @staticmethod
    def _fold(graph: ir.Graph, node: ir.Node, source: ir.Value, to: ir.DataType) -> None:
        """Replaces ``Cast(source)`` by a converted copy of the initializer ``source``, which goes."""
        out = node.outputs[0]
        public = out.name
        assert source.const_value is not None and source.name is not None
        folded = ir.Value(
            type=ir.TensorType(to),
            shape=out.shape,
            const_value=converted_tensor(source.const_value, to, name=public),
        )
        replaced = original_name(source)
        if replaced is not None:
            folded.metadata_props[ORIGINAL_NAME] = replaced
        out.replace_all_uses_with(folded)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)
        folded.name = public
        graph.register_initializer(folded)
