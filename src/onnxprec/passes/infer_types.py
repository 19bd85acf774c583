"""Fill in value types and shapes with ONNX shape inference (weights stripped, so it works above 2 GB)."""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, all_graphs
from onnxprec._ops import contrib_float_contract, normalized_domain, opsets_by_domain
from onnxprec._protobuf import structure_proto

__all__ = ["InferTypesPass"]

logger = logging.getLogger(__name__)


class InferTypesPass(ir.passes.InPlacePass):
    """Runs ONNX shape inference (non-strict) and guesses the types that it cannot infer.

    Sequence, optional and map types are merged whole (onnx-ir's own pass would turn an untyped
    ``seq(tensor(float))`` into ``tensor(float)``).

    Outputs of custom or contrib ops that ONNX cannot infer get the type of the node's first floating-point
    input, if any (the usual case for plugins such as fused attention or normalization); an ONNX Runtime contrib op
    with a known float contract (:data:`onnxprec._ops.CONTRIB_FLOAT_CONTRACTS`) gives its FP32-only outputs FLOAT
    and the others the type of its first input that follows the node's type. A reference run,
    when one happens, later replaces these guesses with the types ONNX Runtime observed.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = _infer(model)
        guessed = 0
        opsets = opsets_by_domain(model)
        for graph in all_graphs(model.graph):
            for node in graph:
                if all(out.dtype is not None for out in node.outputs):
                    continue
                contract = contrib_float_contract(node, opsets.get(normalized_domain(node.domain), 1))
                follows = [v for i, v in enumerate(node.inputs) if contract is None or contract.input(i) == "T"]
                guess = next((v.dtype for v in follows if v is not None and v.dtype in FLOAT_TYPES), None)
                for j, out in enumerate(node.outputs):
                    if out.dtype is not None:
                        continue
                    code = "T" if contract is None else contract.output(j)
                    dtype = ir.DataType.FLOAT if code == "F" else guess if code == "T" else None
                    if dtype is not None:
                        out.dtype = dtype
                        guessed += 1
                        logger.debug(
                            "Guessed type %s for output '%s' of %s node '%s'", dtype, out.name, node.op_type, node.name
                        )
        if guessed:
            logger.info("Types of %d values could not be inferred and were guessed from their inputs", guessed)
        return ir.passes.PassResult(model, modified=modified or bool(guessed))


def _infer(model: ir.Model) -> bool:
    """ONNX shape inference merged into ``model``; whole types are taken where the kind differs.

    onnx-ir's ``ShapeInferencePass`` merges only element types, so an untyped value that inference finds to be
    ``seq(tensor(float))`` would become ``tensor(float)``; here a sequence, optional or map type is kept whole.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(
            structure_proto(model), check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as e:  # inference is best effort: the model stays as it is
        logger.info("ONNX shape inference failed (%s); types stay as declared", str(e).splitlines()[0][:200])
        return False
    modified = False
    if next(iter(model.graph.subgraphs()), None) is None:
        # No subgraphs: read the main graph's inferred value infos alone (deserializing the whole inferred
        # model, nodes included, took as long as loading the model).
        infos = {p.name: p for p in (*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info)}
        pairs = [
            (value, ir.serde.deserialize_value_info_proto(infos[name], None))
            for name, value in ir.convenience.create_value_mapping(model.graph).items()
            if name in infos
        ]
    else:
        pairs = []
        for graph, inferred_graph in zip(model.graphs(), ir.serde.deserialize_model(inferred).graphs()):
            found = ir.convenience.create_value_mapping(inferred_graph)
            values = ir.convenience.create_value_mapping(graph)
            pairs += [(value, found[name]) for name, value in values.items() if name in found]
    for value, new in pairs:
        if new.shape is not None and value.shape != new.shape:
            value.shape = new.shape
            modified = True
        if new.type is not None and value.type != new.type:
            value.type = new.type
            modified = True
    return modified
