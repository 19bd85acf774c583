"""Fill in value types and shapes with ONNX shape inference (weights stripped, so it works above 2 GB)."""

from __future__ import annotations

import logging

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from onnxprec._graph import FLOAT_TYPES, all_graphs

__all__ = ["InferTypesPass"]

logger = logging.getLogger(__name__)


class InferTypesPass(ir.passes.InPlacePass):
    """Runs ONNX shape inference (non-strict) and guesses the types that it cannot infer.

    Outputs of custom or contrib ops that ONNX cannot infer get the type of the node's first floating-point
    input, if any (the usual case for plugins such as fused attention or normalization). A reference run,
    when one happens, later replaces these guesses with the types ONNX Runtime observed.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
        guessed = 0
        for graph in all_graphs(model.graph):
            for node in graph:
                if all(out.dtype is not None for out in node.outputs):
                    continue
                guess = next((v.dtype for v in node.inputs if v is not None and v.dtype in FLOAT_TYPES), None)
                if guess is None:
                    continue
                for out in node.outputs:
                    if out.dtype is None:
                        out.dtype = guess
                        guessed += 1
                        logger.debug(
                            "Guessed type %s for output '%s' of %s node '%s'", guess, out.name, node.op_type, node.name
                        )
        if guessed:
            logger.info("Types of %d values could not be inferred and were guessed from their inputs", guessed)
        return ir.passes.PassResult(model, modified=result.modified or bool(guessed))
