"""QDQ form: ``DequantizeLinear(q [K, N], scales [n_blocks, N][, zero points], axis=0, block_size) -> MatMul``.

INT4 (signed, symmetric) or UINT4 with UINT4 zero points; INT8/UINT8 for 8-bit layers. Scales have the weight's
float type. The weight's initializers are stored once; each layer that reads it gets its own DequantizeLinear
(ONNX Runtime fuses each DequantizeLinear -> MatMul pair into MatMulNBits when it loads the model). A Gemm keeps
its ``alpha``, ``beta`` and ``C`` and reads the dequantized ``[K, N]`` weight with ``transB=0``. Needs opset 21.

An embedding table ``[V, H]`` read only by Gathers is stored as a table, blocks along the hidden axis:
``DequantizeLinear(q [V, H], scales [V, H / block], axis=1, block_size) -> Gather``. A table tied to an lm_head
is stored once in the lm_head's ``[H, V]`` form (so the lm_head's DequantizeLinear -> MatMul still fuses), and the
Gathers read ``Transpose(DequantizeLinear(...))``. ONNX Runtime dequantizes the whole table on each run.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec.quantization.algorithms.rtn import QuantizedWeight, effective_block_size
from onnxprec.quantization.formats.quantized_weight import LazyQuantizedWeight
from onnxprec.quantization.packing import qdq_arrays
from onnxprec.quantization.select import Layer, WeightGroup

__all__ = ["MIN_OPSET", "first_node", "remove_unused_transposes", "rewrite_qdq"]

MIN_OPSET = 21

_LEVEL_TYPES = {
    (4, True): ir.DataType.INT4,
    (4, False): ir.DataType.UINT4,
    (8, True): ir.DataType.INT8,
    (8, False): ir.DataType.UINT8,
}


def rewrite_qdq(
    graph: ir.Graph, target: WeightGroup, weight: LazyQuantizedWeight, names: NameAllocator
) -> list[ir.Node]:
    """Replaces ``target``'s float weight with DequantizeLinear nodes reading ``weight``'s lazy initializers.

    Returns:
        The DequantizeLinear nodes: one per MatMul/Gemm layer, and one shared by the Gathers.
    """
    recipe = weight.recipe
    k, n = target.k, target.n
    block = effective_block_size(k, recipe.block_size)
    n_blocks = math.ceil(k / block)
    level_type = _LEVEL_TYPES[(recipe.bits, recipe.symmetric)]
    float_type = target.dtype
    scale_dtype = float_type.numpy()
    table = not target.matmuls  # stored [N, K], blocks along axis 1

    def pack(qw: QuantizedWeight) -> dict[str, np.ndarray]:
        data, scales, zero_points = qdq_arrays(qw, scale_dtype)
        pieces = {"data": data, "scales": scales}
        if zero_points is not None:
            pieces["zero_points"] = zero_points
        if table:
            pieces = {key: np.ascontiguousarray(array.T) for key, array in pieces.items()}
        return pieces

    keys = ["data", "scales"] + ([] if recipe.symmetric else ["zero_points"])
    weight.set_packer(pack, keys)
    base = target.name
    data_shape, scale_shape = ((n, k), (n, n_blocks)) if table else ((k, n), (n_blocks, n))
    specs = {
        "data": (level_type, data_shape, f"{base}_q{recipe.bits}"),
        "scales": (float_type, scale_shape, f"{base}_scales"),
        "zero_points": (level_type, scale_shape, f"{base}_zero_points"),
    }
    inputs: list[ir.Value | None] = list(weight.register_pieces(graph, specs, keys, names))

    def dequantize(before: ir.Node, what: str) -> ir.Node:
        out = ir.Value(name=names(f"{base}_dequantized"), type=ir.TensorType(float_type), shape=ir.Shape(data_shape))
        dq = ir.Node(
            "",
            "DequantizeLinear",
            inputs,
            attributes=[ir.AttrInt64("axis", 1 if table else 0), ir.AttrInt64("block_size", block)],
            outputs=[out],
            name=names.node(f"{what}/DequantizeLinear"),
        )
        graph.insert_before(before, dq)
        return dq

    nodes = []
    for layer in target.matmuls:
        dq = dequantize(layer.node, layer.name)
        layer.node.replace_input_with(1, dq.outputs[0])
        if layer.transposed:
            layer.node.attributes["transB"] = ir.AttrInt64("transB", 0)
        nodes.append(dq)
    gathers = sorted(target.gathers, key=lambda layer: layer.order)
    if gathers:
        first = first_node(graph, [node for layer in gathers for node in (layer.transpose, layer.node) if node])
        dq = dequantize(first, gathers[0].name)
        nodes.append(dq)
        for layer in gathers:
            if table:
                layer.node.replace_input_with(0, dq.outputs[0])
            else:
                _gather_columns(graph, layer, dq.outputs[0], names)
        remove_unused_transposes(graph, gathers)
    return nodes


def _gather_columns(graph: ir.Graph, layer: Layer, weight: ir.Value, names: NameAllocator) -> None:
    """Makes ``layer`` (a Gather of rows of the table ``[N, K]``) read the columns of ``weight`` ``[K, N]``.

    ``Gather(W, ids, axis=1) -> Transpose`` moves only the gathered values (ONNX Runtime transposes ``ids``'
    rows instead of the whole table).
    Indices of unknown rank read ``Transpose(W)``.
    """
    node = layer.node
    rank = None if layer.input.shape is None else len(layer.input.shape)
    if rank is None:
        rows = ir.Value(name=names(f"{layer.name}_table"), type=weight.type)
        transpose = ir.Node("", "Transpose", [weight], attributes=[ir.AttrInt64s("perm", [1, 0])], outputs=[rows],
                            name=names.node(f"{layer.name}/Transpose"))  # fmt: skip
        graph.insert_before(node, transpose)
        node.replace_input_with(0, rows)
        return
    columns = ir.Value(name=names(f"{layer.name}_columns"), type=weight.type)
    gather = ir.Node("", "Gather", [weight, layer.input], attributes=[ir.AttrInt64("axis", 1)], outputs=[columns],
                     name=names.node(f"{layer.name}_columns"))  # fmt: skip
    out = ir.Value(name=names(f"{layer.name}_rows"), type=weight.type)
    perm = ir.AttrInt64s("perm", [*range(1, rank + 1), 0])
    transpose = ir.Node("", "Transpose", [columns], attributes=[perm], outputs=[out],
                        name=names.node(f"{layer.name}/Transpose"))  # fmt: skip
    ir.convenience.replace_nodes_and_values(graph, node, [node], [gather, transpose], [node.outputs[0]], [out])
    layer.node = gather


def first_node(graph: ir.Graph, nodes: list[ir.Node]) -> ir.Node:
    """The node of ``nodes`` that comes first in ``graph``."""
    wanted = set(nodes)
    return next(node for node in graph if node in wanted)


def remove_unused_transposes(graph: ir.Graph, gathers: list[Layer]) -> None:
    """Removes the Transpose nodes the Gathers read their table through, once nothing reads them."""
    for transpose in {layer.transpose for layer in gathers if layer.transpose is not None}:
        if not transpose.outputs[0].uses() and not transpose.outputs[0].is_graph_output():
            graph.remove(transpose, safe=True)
