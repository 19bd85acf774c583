"""QDQ form: ``DequantizeLinear(q [K, N], scales [n_blocks, N][, zero points], axis=0, block_size) -> MatMul``.

INT4 (signed, symmetric) or UINT4 with UINT4 zero points; INT8/UINT8 for 8-bit layers. Scales have the weight's
float type. The weight's initializers are stored once; each layer that reads it gets its own DequantizeLinear
(ONNX Runtime fuses each DequantizeLinear -> MatMul pair into MatMulNBits when it loads the model). A Gemm keeps
its ``alpha``, ``beta`` and ``C`` and reads the dequantized ``[K, N]`` weight with ``transB=0``. Needs opset 21.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec.quantization.algorithms.rtn import QuantizedWeight, effective_block_size
from onnxprec.quantization.formats.lazy import LazyQuantizedWeight
from onnxprec.quantization.packing import qdq_arrays
from onnxprec.quantization.select import Target

__all__ = ["MIN_OPSET", "rewrite_qdq"]

MIN_OPSET = 21

_LEVEL_TYPES = {
    (4, True): ir.DataType.INT4,
    (4, False): ir.DataType.UINT4,
    (8, True): ir.DataType.INT8,
    (8, False): ir.DataType.UINT8,
}


def rewrite_qdq(graph: ir.Graph, target: Target, weight: LazyQuantizedWeight, names: NameAllocator) -> list[ir.Node]:
    """Replaces ``target``'s float weight with DequantizeLinear nodes reading ``weight``'s lazy initializers.

    Returns:
        The DequantizeLinear nodes, one per layer.
    """
    recipe = weight.recipe
    k, n = target.k, target.n
    block = effective_block_size(k, recipe.block_size)
    n_blocks = math.ceil(k / block)
    level_type = _LEVEL_TYPES[(recipe.bits, recipe.symmetric)]
    float_type = target.dtype
    scale_dtype = float_type.numpy()

    def pack(qw: QuantizedWeight) -> dict[str, np.ndarray]:
        data, scales, zero_points = qdq_arrays(qw, scale_dtype)
        pieces = {"data": data, "scales": scales}
        if zero_points is not None:
            pieces["zero_points"] = zero_points
        return pieces

    keys = ["data", "scales"] + ([] if recipe.symmetric else ["zero_points"])
    weight.set_packer(pack, keys)
    base = target.name
    specs = {
        "data": (level_type, (k, n), f"{base}_q{recipe.bits}"),
        "scales": (float_type, (n_blocks, n), f"{base}_scales"),
        "zero_points": (level_type, (n_blocks, n), f"{base}_zero_points"),
    }
    inputs: list[ir.Value | None] = list(weight.register_pieces(graph, specs, keys, names))
    nodes = []
    for layer in target.layers:
        out = ir.Value(name=names(f"{base}_dequantized"), type=ir.TensorType(float_type), shape=ir.Shape((k, n)))
        dq = ir.Node(
            "",
            "DequantizeLinear",
            inputs,
            attributes=[ir.AttrInt64("axis", 0), ir.AttrInt64("block_size", block)],
            outputs=[out],
            name=names.node(f"{layer.name}/DequantizeLinear"),
        )
        graph.insert_before(layer.node, dq)
        layer.node.replace_input_with(1, out)
        if layer.transposed:
            layer.node.attributes["transB"] = ir.AttrInt64("transB", 0)
        nodes.append(dq)
    return nodes
