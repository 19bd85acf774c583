"""FP16/BF16 -> FP32 everywhere, the model's inputs and outputs included: an exact widening for classification."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._graph import LOW_FLOAT_TYPES
from onnxprec.passes._retype import retype_floats_to_fp32

__all__ = ["WidenToFp32Pass"]

logger = logging.getLogger(__name__)


class WidenToFp32Pass(ir.passes.InPlacePass):
    """Retypes FP16 and BF16 values, initializers, Cast targets and dtype attributes to FLOAT, subgraphs and the
    model's inputs and outputs included, so that a low-precision or mixed model can be classified and converted
    like an FP32 one (AutoCast). Widening is exact: values, names and graph structure are unchanged, only types;
    weights are converted lazily (when read). Callers that must keep the model's interface record its types first,
    or pass ``keep_io=True``: the main graph's FP16/BF16 inputs and outputs then keep their type behind boundary
    casts, as :class:`~onnxprec.passes.convert_fp64_to_fp32.ConvertFp64ToFp32Pass` does for FP64.
    """

    def __init__(self, keep_io: bool = False) -> None:
        super().__init__()
        self.keep_io = keep_io

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = retype_floats_to_fp32(model, LOW_FLOAT_TYPES, keep_io=self.keep_io)
        if count:
            logger.info("Widened %d FP16/BF16 tensors/attributes to FP32", count)
        return ir.passes.PassResult(model, modified=bool(count))
