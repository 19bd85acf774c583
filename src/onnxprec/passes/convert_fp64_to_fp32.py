"""FP64 -> FP32 everywhere inside the graph, keeping FP64 graph inputs and outputs (with boundary casts)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._graph import NameAllocator, all_graphs, cast_graph_output, insert_cast
from onnxprec._ops import is_default_domain
from onnxprec.passes._retype import retarget_type_attributes, retype_initializer

__all__ = ["ConvertFp64ToFp32Pass"]

logger = logging.getLogger(__name__)

_D = ir.DataType.DOUBLE
_F = ir.DataType.FLOAT


def _is_cast(node: ir.Node) -> bool:
    return node.op_type == "Cast" and is_default_domain(node.domain)


def _output_casts(graph: ir.Graph) -> set[ir.Node]:
    """The Casts FLOAT -> DOUBLE that produce FP64 outputs of ``graph``: boundaries already in place."""
    casts = set()
    for out in graph.outputs:
        producer = out.producer()
        if out.dtype == _D and producer is not None and _is_cast(producer):
            source = producer.inputs[0]
            if source is not None and source.dtype == _F:
                casts.add(producer)
    return casts


class ConvertFp64ToFp32Pass(ir.passes.InPlacePass):
    """Retypes DOUBLE values, initializers, Cast targets and dtype attributes to FLOAT, subgraphs included.

    Weights and Constant values are converted lazily and clamped to the finite FP32 range, keeping their
    sign and their name. FP64 graph inputs and outputs of the main graph keep their type (the model's I/O
    contract): a Cast to FP32 follows each such input (consumers that are Casts read it directly), and a
    Cast back to FP64 produces each such output. That output keeps its name; the value it casts is renamed
    ``<name>_pre_cast`` and records the output's name in ``metadata_props["onnxprec.original_name"]``
    (:data:`onnxprec._graph.ORIGINAL_NAME`), which saving keeps.

    The pass is idempotent: a second run finds the boundary casts in place and changes nothing.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = NameAllocator(model)
        main = model.graph
        io_values = {*main.inputs, *main.outputs}
        boundaries = _output_casts(main)
        count = 0
        for graph in all_graphs(main):
            if graph is not main:
                for value in graph.inputs:  # Loop/Scan state and scan slices
                    if value.dtype == _D:
                        value.dtype = _F
                        count += 1
            for init in list(graph.initializers.values()):
                if init.dtype == _D and init.const_value is not None and init not in io_values:
                    retype_initializer(init, _F)
                    count += 1
            for node in graph:
                if node not in boundaries:
                    count += retarget_type_attributes(node, _D, _F)
                for out in node.outputs:
                    if out.dtype == _D and out not in io_values:
                        out.dtype = _F
                        count += 1
        for value in main.inputs:
            uses = [use for use in value.uses() if not _is_cast(use.node)]
            if value.dtype == _D and uses:
                cast = insert_cast(main, value, _F, names)
                for use in uses:
                    use.node.replace_input_with(use.idx, cast.outputs[0])
                count += 1
        for position, out in enumerate(main.outputs):
            producer = out.producer()
            if out.dtype == _D and not out.is_graph_input() and producer is not None and producer not in boundaries:
                out.dtype = _F
                cast_graph_output(main, position, _D, names)
                count += 1
        if count:
            logger.info("Converted %d FP64 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))
