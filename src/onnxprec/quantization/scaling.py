"""Dividing a MatMul input by AWQ scales: folded into the parent where that is exact, else an explicit ``Mul``.

AWQ quantizes ``diag(s) W`` and needs ``x / s`` as the input. :func:`apply_input_scales` folds ``1 / s`` into the
op that produces ``x`` when all of these hold:

* ``x`` feeds only the layers of the group, apart from ``Shape``/``Size`` nodes (and is not a graph output);
* the producer is ``Mul(x', c)`` with an initializer ``c`` whose last dim is 1 or K (or a scalar), or a
  ``LayerNormalization`` / ``SimplifiedLayerNormalization`` / ``RMSNormalization`` /
  ``(Skip)(Simplified)LayerNormalization`` (com.microsoft) whose scale (and bias) are initializers: then
  ``y / s = x' * (c / s)``, resp. ``norm * (gamma / s) + beta / s``, exactly;
* those initializers are floats and the producer reads nothing else that is being quantized. A MatMul or Gemm
  producer is never folded into: its weight is (or may be) quantized, and folding ``1 / s`` into a weight that
  is then rounded loses the correction (ModelOpt's silent-loss defect).

A parameter shared with other nodes is copied for this node, never changed in place. Otherwise a
``Mul(x, 1 / s)`` node is inserted that feeds only the group's layers.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec.quantization.select import InputGroup

__all__ = ["apply_input_scales", "foldable_parent"]

logger = logging.getLogger(__name__)

# op (domain, type) -> indices of the per-channel parameters divided by the scales (only output 0 is scaled)
_NORM_PARAMS: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "LayerNormalization"): (1, 2),
    ("", "SimplifiedLayerNormalization"): (1,),
    ("", "RMSNormalization"): (1,),
    ("com.microsoft", "SimplifiedLayerNormalization"): (1,),
    ("com.microsoft", "SkipLayerNormalization"): (2, 3),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (2,),
}
# Consumers that read only the shape of the input: scaling its values changes nothing for them.
_SHAPE_ONLY = frozenset({"Shape", "Size"})
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def _is_param(value: ir.Value | None, k: int) -> bool:
    """A float initializer whose last dim is 1 or ``k`` (or a scalar)."""
    if value is None or not value.is_initializer() or value.is_graph_input() or value.const_value is None:
        return False
    if value.dtype not in _FLOATS:
        return False
    shape = value.const_value.shape
    return len(shape) == 0 or shape[-1] in (1, k)


def foldable_parent(group: InputGroup) -> tuple[ir.Node | None, tuple[int, ...], str]:
    """The node the group's scales can be folded into, the indices of its parameters to divide, and why not."""
    x = group.input
    parent = x.producer()
    if parent is None:
        return None, (), "the input is a graph input"
    if x.is_graph_output():
        return None, (), "the input is also a graph output"
    layer_nodes = {layer.node for layer in group.layers}
    others = [use.node for use in x.uses() if use.node not in layer_nodes or use.idx != 0]
    if any(node.op_type not in _SHAPE_ONLY or node.domain not in ("", "ai.onnx") for node in others):
        return None, (), "the input also feeds other nodes"
    k = group.k
    domain = "" if parent.domain == "ai.onnx" else parent.domain
    if (domain, parent.op_type) == ("", "Mul"):
        params = [i for i in (0, 1) if _is_param(parent.inputs[i], k)]
        if len(params) != 1:
            return None, (), "Mul parent without exactly one per-channel initializer"
        return parent, (params[0],), ""
    indices = _NORM_PARAMS.get((domain, parent.op_type))
    if indices is None:
        return None, (), f"parent {parent.op_type} is not a Mul or a normalization"
    if parent.outputs[0] is not x:
        return None, (), f"the input is not output 0 of {parent.op_type}"
    present = [i for i in indices if i < len(parent.inputs) and parent.inputs[i] is not None]
    if not present or not all(_is_param(parent.inputs[i], k) for i in present):
        return None, (), f"{parent.op_type} parameters are not per-channel initializers"
    return parent, tuple(present), ""


def _divided(value: ir.Value, scales: np.ndarray, k: int) -> np.ndarray:
    """The parameter's values divided by ``scales`` along its last axis, in its own dtype."""
    assert value.const_value is not None
    array = np.asarray(value.const_value.numpy())
    dtype = array.dtype
    result = array.astype(np.float64)
    if result.ndim == 0:
        result = result.reshape(1)
    if result.shape[-1] == 1:
        result = np.broadcast_to(result, (*result.shape[:-1], k))
    return (result / scales.astype(np.float64)).astype(dtype)


def apply_input_scales(graph: ir.Graph, group: InputGroup, scales: np.ndarray, names: NameAllocator) -> str:
    """Makes the group's layers read ``x / scales``; returns how (``"folded into <op> '<name>'"`` or ``"Mul"``)."""
    parent, indices, why = foldable_parent(group)
    k = group.k
    if parent is not None:
        for index in indices:
            param = parent.inputs[index]
            assert param is not None and param.dtype is not None
            array = _divided(param, scales, k)
            tensor = ir.Tensor(array, dtype=param.dtype)
            if len(param.uses()) == 1:
                param.const_value = tensor
                param.shape = ir.Shape(array.shape)
            else:
                copy = ir.Value(
                    name=names(f"{param.name}_awq"), type=param.type, shape=ir.Shape(array.shape), const_value=tensor
                )
                graph.register_initializer(copy)
                parent.replace_input_with(index, copy)
        how = f"folded into {parent.op_type} '{parent.name}'"
        logger.debug("AWQ scales of '%s' %s", group.name, how)
        return how
    x = group.input
    dtype = x.dtype or group.layers[0].weight.dtype or ir.DataType.FLOAT
    inverse = ir.Tensor((1.0 / scales.astype(np.float64)).astype(dtype.numpy()), dtype=dtype)
    const = ir.Value(name=names(f"{x.name}_awq_inv_scale"), type=ir.TensorType(dtype), shape=ir.Shape((k,)))
    const.const_value = inverse
    graph.register_initializer(const)
    out = ir.Value(name=names(f"{x.name}_awq_scaled"), type=ir.TensorType(dtype), shape=x.shape)
    first = min(group.layers, key=lambda layer: layer.order).node
    mul = ir.Node("", "Mul", [x, const], outputs=[out], name=names.node(f"{first.name}/awq_scale"))
    graph.insert_before(first, mul)
    for layer in group.layers:
        layer.node.replace_input_with(0, out)
        layer.input = out
    logger.debug("AWQ scales of '%s' applied with a Mul (%s)", group.name, why)
    return "Mul"
