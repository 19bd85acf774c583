"""Turn floating-point Constant nodes into initializers, so they follow the same rules as weights."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, all_graphs, tensor_attribute
from onnxprec._ops import is_default_domain

__all__ = ["LiftFloatConstantsPass"]

logger = logging.getLogger(__name__)


def _float_tensor(node: ir.Node) -> ir.TensorProtocol | None:
    attrs = node.attributes
    if len(attrs) != 1:
        return None
    if "value" in attrs:
        tensor = tensor_attribute(attrs["value"])
        return tensor if tensor.dtype in FLOAT_TYPES else None
    if "value_float" in attrs:
        return ir.Tensor(np.array(attrs["value_float"].as_float(), dtype=np.float32))
    if "value_floats" in attrs:
        return ir.Tensor(np.array(attrs["value_floats"].as_floats(), dtype=np.float32))
    return None


class LiftFloatConstantsPass(ir.passes.InPlacePass):
    """Lifts Constant nodes holding FP16/FP32/FP64/BF16 values into initializers of their graph.

    Their values are then converted, clamped, shared and checked against ``init_max`` exactly like weights
    (ModelOpt treats the two differently: -1e9 in a Constant becomes -inf, in an initializer -65504).
    Integer constants (shapes, axes) stay Constant nodes. Constants that are graph outputs stay too.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = 0
        for graph in all_graphs(model.graph):
            for node in list(graph):
                if node.op_type != "Constant" or not is_default_domain(node.domain):
                    continue
                out = node.outputs[0]
                tensor = _float_tensor(node)
                if tensor is None or out.is_graph_output() or out.name is None:
                    continue
                value = ir.Value(
                    name=None,
                    type=ir.TensorType(tensor.dtype),
                    shape=ir.Shape(tensor.shape.numpy()),
                    const_value=tensor,
                )
                out.replace_all_uses_with(value)
                graph.remove(node, safe=True)
                value.name = out.name
                graph.register_initializer(value)
                count += 1
        if count:
            logger.debug("Lifted %d floating-point Constant nodes to initializers", count)
        return ir.passes.PassResult(model, modified=bool(count))
