"""MatMulNBits form: ``com.microsoft::MatMulNBits(A, B, scales[, zero_points])`` replaces each MatMul or Gemm.

Attributes ``K``, ``N``, ``bits``, ``block_size`` and ``accuracy_level`` (4: int8 compute on CPU, the fast path;
0 leaves it unset: float compute). ``B`` is uint8 ``[N, n_blocks, block_size * bits / 8]``, scales ``[N, n_blocks]``
in the weight's float type, zero points uint8 packed along the blocks (see :mod:`onnxprec.quantization.packing`).
A Gemm's ``alpha`` becomes a ``Mul`` and its ``beta * C`` an ``Add`` after the MatMulNBits (its optional bias input
needs a recent ONNX Runtime and a 1-D bias, so the separate Add is used everywhere).

An embedding ``Gather`` becomes ``com.microsoft::GatherBlockQuantized(data, ids, scales[, zero_points])`` with
``gather_axis=0``, ``quantize_axis=1``, ``bits`` and ``block_size``: ``data`` is uint8 ``[V, n_blocks * block_size
* bits / 8]``, the MatMulNBits ``B`` of the ``[K=H, N=V]`` weight with its last two axes merged, and scales and zero
points are MatMulNBits's (the same layout). A table tied to an lm_head is stored once: the GatherBlockQuantized
reads ``Reshape(B)`` and the lm_head's scales and zero points, as onnxruntime-genai's builder writes it. When the
hidden size is not a multiple of the block size, the padded rows are cut by a ``Slice``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec.quantization.algorithms.rtn import QuantizedWeight, effective_block_size
from onnxprec.quantization.formats.qdq import first_node, remove_unused_transposes
from onnxprec.quantization.formats.quantized_weight import LazyQuantizedWeight
from onnxprec.quantization.packing import pack_matmulnbits
from onnxprec.quantization.select import Layer, WeightGroup

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
    target: WeightGroup,
    weight: LazyQuantizedWeight,
    names: NameAllocator,
    *,
    accuracy_level: int = 4,
) -> list[ir.Node]:
    """Replaces every layer of ``target`` with a MatMulNBits node reading ``weight``'s lazy initializers.

    Gathers of the weight become GatherBlockQuantized nodes reading the same initializers.

    Returns:
        The MatMulNBits and GatherBlockQuantized nodes. The caller adds the ``com.microsoft`` opset import.
    """
    recipe = weight.recipe
    k, n, bits = target.k, target.n, recipe.bits
    block = matmulnbits_block(k, recipe.block_size)
    n_blocks = math.ceil(k / block)
    float_type = target.dtype
    scale_dtype = float_type.numpy()

    table = not target.matmuls  # only Gathers: B is stored as the [N, K * bits / 8] table they read
    blob = block * bits // 8

    def pack(qw: QuantizedWeight) -> dict[str, np.ndarray]:
        b, scales, zero_points = pack_matmulnbits(qw, k, scale_dtype=scale_dtype)
        pieces = {"b": b.reshape(n, n_blocks * blob) if table else b, "scales": scales}
        if zero_points is not None:
            pieces["zero_points"] = zero_points
        return pieces

    keys = ["b", "scales"] + ([] if recipe.symmetric else ["zero_points"])
    weight.set_packer(pack, keys)
    base = target.name
    specs = {
        "b": (ir.DataType.UINT8, (n, n_blocks * blob) if table else (n, n_blocks, blob), f"{base}_Q{bits}"),
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
    for layer in target.matmuls:
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
    gathers = sorted(target.gathers, key=lambda layer: layer.order)
    if gathers:
        nodes += _rewrite_gathers(graph, target, gathers, inputs, block, bits, names, table=table)
    return nodes


def _int64s(graph: ir.Graph, values: list[int], names: NameAllocator, base: str) -> ir.Value:
    tensor = ir.Tensor(np.array(values, dtype=np.int64))
    const = ir.Value(name=names(base), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape((len(values),)),
                     const_value=tensor)  # fmt: skip
    graph.register_initializer(const)
    return const


def _rewrite_gathers(
    graph: ir.Graph,
    target: WeightGroup,
    gathers: list[Layer],
    inputs: list[ir.Value | None],
    block: int,
    bits: int,
    names: NameAllocator,
    *,
    table: bool,
) -> list[ir.Node]:
    """GatherBlockQuantized nodes (after a Reshape of a shared ``B``; before a Slice of padded rows)."""
    k, n = target.k, target.n
    n_blocks = math.ceil(k / block)
    b, *params = inputs
    assert b is not None
    data = b
    if not table:
        first = first_node(graph, [node for layer in gathers for node in (layer.transpose, layer.node) if node])
        data = ir.Value(name=names(f"{target.name}_table"), type=ir.TensorType(ir.DataType.UINT8),
                        shape=ir.Shape((n, n_blocks * block * bits // 8)))  # fmt: skip
        shape = _int64s(graph, [n, n_blocks * block * bits // 8], names, f"{target.name}_table_shape")
        graph.insert_before(first, ir.Node("", "Reshape", [b, shape], outputs=[data],
                                           name=names.node(f"{gathers[0].name}/Reshape")))  # fmt: skip
    attributes = [
        ir.AttrInt64("bits", bits),
        ir.AttrInt64("block_size", block),
        ir.AttrInt64("gather_axis", 0),
        ir.AttrInt64("quantize_axis", 1),
    ]
    nodes = []
    for layer in gathers:
        old = layer.node
        out = ir.Value(name=names(f"{layer.name}_Q{bits}_output"), type=ir.TensorType(target.dtype))
        node = ir.Node(
            DOMAIN, "GatherBlockQuantized", [data, layer.input, *params], attributes=attributes, outputs=[out],
            name=names.node(f"{layer.name}_Q{bits}"),
        )  # fmt: skip
        new_nodes = [node]
        if n_blocks * block > k:  # padded rows: keep the first K values of each gathered row
            cut = ir.Value(name=names(f"{layer.name}_rows"), type=ir.TensorType(target.dtype))
            bounds = [_int64s(graph, [v], names, f"{target.name}_{what}") for v, what in ((0, "start"), (k, "end"))]
            axis = _int64s(graph, [-1], names, f"{target.name}_axis")
            slice_name = names.node(f"{layer.name}/Slice")
            new_nodes.append(ir.Node("", "Slice", [out, *bounds, axis], outputs=[cut], name=slice_name))
            out = cut
        ir.convenience.replace_nodes_and_values(graph, old, [old], new_nodes, [old.outputs[0]], [out])
        layer.node = node
        nodes.append(node)
    remove_unused_transposes(graph, gathers)
    return nodes
