"""FP64 -> FP32 everywhere inside the graph, keeping FP64 graph inputs and outputs (with boundary casts)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec.passes._retype import retype_floats_to_fp32

__all__ = ["ConvertFp64ToFp32Pass"]

logger = logging.getLogger(__name__)


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
        count = retype_floats_to_fp32(model, frozenset({ir.DataType.DOUBLE}), keep_io=True)
        if count:
            logger.info("Converted %d FP64 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))
