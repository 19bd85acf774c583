"""Other float types -> FP32 inside the graph: FP64 (narrowed, clamped; its graph inputs and outputs keep FP64 behind
boundary casts) and FP16/BF16 (widened, exactly; the model's inputs and outputs are retyped too)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._graph import NameAllocator, all_graphs, cast_graph_output, insert_cast
from onnxprec._ops import is_default_domain
from onnxprec.passes._retype import retarget_type_attributes, retype_initializer

__all__ = ["ConvertFp64ToFp32Pass", "WidenToFp32Pass"]

logger = logging.getLogger(__name__)

_D = ir.DataType.DOUBLE
_F = ir.DataType.FLOAT
LOW_FLOATS = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _is_cast(node: ir.Node) -> bool:
    return node.op_type == "Cast" and is_default_domain(node.domain)


def _output_casts(graph: ir.Graph, sources: frozenset[ir.DataType]) -> set[ir.Node]:
    """The Casts FLOAT -> a source type that produce outputs of ``graph``: boundaries already in place."""
    casts = set()
    for out in graph.outputs:
        producer = out.producer()
        if out.dtype in sources and producer is not None and _is_cast(producer):
            source = producer.inputs[0]
            if source is not None and source.dtype == _F:
                casts.add(producer)
    return casts


def _to_fp32(model: ir.Model, sources: frozenset[ir.DataType], *, keep_io: bool) -> int:
    """Retypes the ``sources`` values, initializers, Cast targets and dtype attributes to FLOAT, subgraphs included;
    with ``keep_io`` the main graph's inputs and outputs keep their type behind boundary casts. Returns the count."""
    names = NameAllocator(model)
    main = model.graph
    io_values = {*main.inputs, *main.outputs} if keep_io else set()
    boundaries = _output_casts(main, sources) if keep_io else set()
    count = 0
    for graph in all_graphs(main):
        inputs = graph.inputs if graph is not main or not keep_io else ()  # Loop/Scan state and scan slices
        for value in inputs:
            if value.dtype in sources and not value.is_initializer():
                value.dtype = _F
                count += 1
        for init in list(graph.initializers.values()):
            if init.dtype in sources and init.const_value is not None and init not in io_values:
                retype_initializer(init, _F)
                count += 1
        for node in graph:
            if node not in boundaries:
                count += sum(retarget_type_attributes(node, source, _F) for source in sources)
            for out in node.outputs:
                if out.dtype in sources and out not in io_values:
                    out.dtype = _F
                    count += 1
    if not keep_io:
        return count
    for value in main.inputs:
        uses = [use for use in value.uses() if not _is_cast(use.node)]
        if value.dtype in sources and uses:
            cast = insert_cast(main, value, _F, names)
            for use in uses:
                use.node.replace_input_with(use.idx, cast.outputs[0])
            count += 1
    for position, out in enumerate(main.outputs):
        producer = out.producer()
        dtype = out.dtype
        if dtype in sources and not out.is_graph_input() and producer is not None and producer not in boundaries:
            out.dtype = _F
            cast_graph_output(main, position, dtype, names)
            count += 1
    return count


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
        count = _to_fp32(model, frozenset({_D}), keep_io=True)
        if count:
            logger.info("Converted %d FP64 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))


class WidenToFp32Pass(ir.passes.InPlacePass):
    """Retypes FP16 and BF16 values, initializers, Cast targets and dtype attributes to FLOAT, subgraphs and the
    model's inputs and outputs included, so that a low-precision or mixed model can be classified and converted
    like an FP32 one (AutoCast). Widening is exact: values, names and graph structure are unchanged, only types;
    weights are converted lazily (when read). Callers that must keep the model's interface record its types first.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = _to_fp32(model, LOW_FLOATS, keep_io=False)
        if count:
            logger.info("Widened %d FP16/BF16 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))
