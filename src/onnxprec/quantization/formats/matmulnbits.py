"""MatMulNBits form: ``com.microsoft::MatMulNBits(A, B, scales[, zero_points])`` replaces each MatMul or Gemm.

Attributes ``K``, ``N``, ``bits``, ``block_size`` and ``accuracy_level`` (4: int8 compute on CPU, the fast path;
0 leaves it unset: float compute). ``B`` is uint8 ``[N, n_blocks, block_size * bits / 8]``, scales ``[N, n_blocks]``
in the weight's float type, zero points uint8 packed along the blocks (see :mod:`onnxprec.quantization.packing`).
A Gemm's ``alpha`` becomes a ``Mul`` and its ``beta * C`` an ``Add`` after the MatMulNBits (its optional bias input
needs a recent ONNX Runtime and a 1-D bias, so the separate Add is used everywhere).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec.quantization.algorithms.rtn import QuantizedWeight, effective_block_size
from onnxprec.quantization.formats.lazy import LazyQuantizedWeight
from onnxprec.quantization.packing import pack_matmulnbits
from onnxprec.quantization.select import Layer, Target

__all__ = ["DOMAIN", "matmulnbits_block", "rewrite_matmulnbits"]

DOMAIN = "com.microsoft"


def matmulnbits_block(k: int, block_size: int) -> int:
    """The ``block_size`` attribute: the block size, or for per-channel (-1) the next power of two >= max(K, 16)."""
    block = effective_block_size(k, block_size)
    if block >= 16 and block & (block - 1) == 0:
        return block
    return max(16, 1 << (k - 1).bit_length())


def _scalar(graph: ir.Graph, value: float, dtype: ir.DataType, names: NameAllocator, base: str) -> ir.Value:
    tensor = ir.Tensor(np.array(value, dtype=dtype.numpy()), dtype=dtype)
    const = ir.Value(name=names(base), type=ir.TensorType(dtype), shape=ir.Shape(()), const_value=tensor)
    graph.register_initializer(const)
    return const


def _gemm_tail(
    graph: ir.Graph, layer: Layer, product: ir.Value, names: NameAllocator, dtype: ir.DataType
) -> tuple[list[ir.Node], ir.Value]:
    """``alpha * product + beta * C`` as Mul/Add nodes after the MatMulNBits of a Gemm."""
    attrs = layer.node.attributes
    alpha = attrs["alpha"].as_float() if "alpha" in attrs else 1.0
    beta = attrs["beta"].as_float() if "beta" in attrs else 1.0
    c = layer.node.inputs[2] if len(layer.node.inputs) > 2 else None
    nodes: list[ir.Node] = []
    out = product

    def add(op: str, a: ir.Value, b: ir.Value, what: str) -> ir.Value:
        result = ir.Value(name=names(f"{layer.name}_{what}"), type=ir.TensorType(dtype))
        nodes.append(ir.Node("", op, [a, b], outputs=[result], name=names.node(f"{layer.name}/{what}")))
        return result

    if alpha != 1.0:
        out = add("Mul", out, _scalar(graph, alpha, dtype, names, f"{layer.name}_alpha"), "alpha")
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = add("Mul", c, _scalar(graph, beta, dtype, names, f"{layer.name}_beta"), "beta")
        out = add("Add", out, c, "bias")
    return nodes, out


def rewrite_matmulnbits(
    graph: ir.Graph,
    target: Target,
    weight: LazyQuantizedWeight,
    names: NameAllocator,
    *,
    accuracy_level: int = 4,
) -> list[ir.Node]:
    """Replaces every layer of ``target`` with a MatMulNBits node reading ``weight``'s lazy initializers.

    Returns:
        The MatMulNBits nodes. The caller adds the ``com.microsoft`` opset import.
    """
    recipe = weight.recipe
    k, n, bits = target.k, target.n, recipe.bits
    block = matmulnbits_block(k, recipe.block_size)
    n_blocks = math.ceil(k / block)
    float_type = target.dtype
    scale_dtype = float_type.numpy()

    def pack(qw: QuantizedWeight) -> dict[str, np.ndarray]:
        b, scales, zero_points = pack_matmulnbits(qw, k, scale_dtype=scale_dtype)
        pieces = {"b": b, "scales": scales}
        if zero_points is not None:
            pieces["zero_points"] = zero_points
        return pieces

    keys = ["b", "scales"] + ([] if recipe.symmetric else ["zero_points"])
    weight.set_packer(pack, keys)
    base = target.name
    specs = {
        "b": (ir.DataType.UINT8, (n, n_blocks, block * bits // 8), f"{base}_Q{bits}"),
        "scales": (float_type, (n, n_blocks), f"{base}_scales"),
        "zero_points": (ir.DataType.UINT8, (n, math.ceil(n_blocks * bits / 8)), f"{base}_zero_points"),
    }
    inputs: list[ir.Value | None] = list(weight.register_pieces(graph, specs, keys, names))
    attributes = [
        ir.AttrInt64("K", k),
        ir.AttrInt64("N", n),
        ir.AttrInt64("bits", bits),
        ir.AttrInt64("block_size", block),
    ]
    if accuracy_level:
        attributes.append(ir.AttrInt64("accuracy_level", accuracy_level))
    nodes = []
    for layer in target.layers:
        old = layer.node
        product = ir.Value(name=names(f"{layer.name}_Q{bits}_output"), type=ir.TensorType(float_type))
        node = ir.Node(
            DOMAIN, "MatMulNBits", [layer.input, *inputs], attributes=attributes, outputs=[product],
            name=names.node(f"{layer.name}_Q{bits}"),
        )  # fmt: skip
        new_nodes = [node]
        out = product
        if old.op_type == "Gemm":
            tail, out = _gemm_tail(graph, layer, product, names, float_type)
            new_nodes += tail
        ir.convenience.replace_nodes_and_values(graph, old, [old], new_nodes, [old.outputs[0]], [out])
        layer.node = node
        nodes.append(node)
    return nodes
