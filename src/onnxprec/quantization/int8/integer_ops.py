"""The INT8 layers that become ONNX Runtime's integer-product kernels (:mod:`rewrite` holds the Q/DQ rewrites).

- a dynamic layer input gets ``[Mul(x, factors)] -> DynamicQuantizeLinear`` shared by the layers of its group
  (``factors``: SmoothQuant's ``1/s``, 0 on the channels split off to float), and each layer becomes
  ``MatMulInteger -> Cast -> Mul(scales)``, as ONNX Runtime's ``quantize_dynamic`` writes it (fused into
  ``DynamicQuantizeMatMul`` / ``MatMulIntegerToFloat``);
- the MatMuls of one dynamic group become one layer with their weights side by side and a ``Split``
  (:func:`replace_group_with_matmul_integer`): one GEMM, one bias and one outlier product for all;
- a static pointwise Conv whose output stays float becomes ``com.microsoft::MatMulIntegerToFloat`` on its UINT8
  input, channels last (:func:`replace_with_matmul_integer_to_float`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator, insert_after_producer
from onnxprec.quantization.int8.rewrite import MS_DOMAIN, WeightRecipe, add_initializer, int8_weight, value_like

__all__ = [
    "MergedLayer",
    "bias_add_of",
    "insert_dynamic",
    "replace_group_with_matmul_integer",
    "replace_with_matmul_integer",
    "replace_with_matmul_integer_to_float",
]


def insert_dynamic(
    graph: ir.Graph, value: ir.Value, names: NameAllocator, factors: np.ndarray | None = None
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``[Mul(value, factors)] -> DynamicQuantizeLinear`` after ``value``'s producer: its UINT8 tensor, scale and
    zero point, read by every layer of the group (:func:`replace_with_matmul_integer`)."""
    base = str(value.name)
    nodes: list[ir.Node] = []
    source = value
    if factors is not None:
        factor_value = add_initializer(graph, names(f"{base}_smooth"), factors.astype(np.float32))
        source = value_like(value, names(f"{base}_smoothed"))
        nodes.append(ir.Node("", "Mul", [value, factor_value], outputs=[source], name=names.node(f"{base}_smooth")))
    quantized = ir.Value(name=names(f"{base}_quantized"))
    scale = ir.Value(name=names(f"{base}_scale"))
    zero = ir.Value(name=names(f"{base}_zero_point"))
    nodes.append(ir.Node("", "DynamicQuantizeLinear", [source], outputs=[quantized, scale, zero],
                         name=names.node(f"{base}_DynamicQ")))  # fmt: skip
    insert_after_producer(graph, value, nodes)
    return quantized, scale, zero


def _integer_product(
    base: str,
    activation: tuple[ir.Value, ir.Value, ir.Value],
    q: ir.Value,
    zeros: ir.Value,
    scales: ir.Value,
    product: ir.Value,
    names: NameAllocator,
) -> list[ir.Node]:
    """``MatMulInteger(x_q, q, x_zp, zeros) -> Cast -> Mul(x_scale * scales)`` writing ``product``."""
    quantized, scale, zero = activation
    combined = ir.Value(name=names(f"{base}_scales"), type=ir.TensorType(ir.DataType.FLOAT))
    accumulated = ir.Value(name=names(f"{base}_int32"), type=ir.TensorType(ir.DataType.INT32))
    converted = ir.Value(name=names(f"{base}_float"), type=ir.TensorType(ir.DataType.FLOAT))
    return [
        ir.Node("", "Mul", [scale, scales], outputs=[combined], name=names.node(f"{base}_scales")),
        ir.Node("", "MatMulInteger", [quantized, q, zero, zeros], outputs=[accumulated],
                name=names.node(f"{base}_MatMulInteger")),
        ir.Node("", "Cast", [accumulated], attributes=[ir.AttrInt64("to", ir.DataType.FLOAT)], outputs=[converted],
                name=names.node(f"{base}_cast")),
        ir.Node("", "Mul", [converted, combined], outputs=[product], name=names.node(f"{base}_rescale")),
    ]  # fmt: skip


def replace_with_matmul_integer(
    graph: ir.Graph,
    node: ir.Node,
    recipe: WeightRecipe,
    activation: tuple[ir.Value, ir.Value, ir.Value],
    names: NameAllocator,
) -> ir.Node:
    """Replaces MatMul (or Gemm) ``node`` by ``MatMulInteger(x_q, q, x_zp, 0) -> Cast -> Mul(x_scale * scales)``
    (``+ C`` for a Gemm), the form ONNX Runtime fuses with the bias Add after it into ``DynamicQuantizeMatMul`` or
    ``MatMulIntegerToFloat`` (a DequantizeLinear -> MatMul form fuses without the bias: one Add more per layer).

    Returns:
        The node that writes the product (before any bias).
    """
    weight = node.inputs[1]
    assert weight is not None
    base = str(weight.name)
    q = int8_weight(graph, recipe, base, names)
    zeros = add_initializer(graph, names(f"{base}_zero_points"), np.zeros(recipe.scales.shape, np.int8))
    scales = add_initializer(graph, names(f"{base}_scales"), recipe.scales.astype(np.float32))
    out = node.outputs[0]
    product = value_like(out, names(f"{node.name}_product"))
    new_nodes = _integer_product(str(node.name), activation, q, zeros, scales, product, names)
    result = product
    bias = node.inputs[2] if node.op_type == "Gemm" and len(node.inputs) > 2 else None
    if bias is not None:
        result = value_like(out, names(f"{node.name}_biased"))
        new_nodes.append(ir.Node("", "Add", [product, bias], outputs=[result], name=names.node(f"{node.name}_bias")))
    ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, [out], [result])
    return new_nodes[3]


def replace_with_matmul_integer_to_float(
    graph: ir.Graph,
    node: ir.Node,
    recipe: WeightRecipe,
    bias: np.ndarray | None,
    names: NameAllocator,
    *,
    residual: tuple[np.ndarray, np.ndarray] | None = None,
) -> ir.Node:
    """Replaces a pointwise Conv ``node`` that reads a per-tensor ``DequantizeLinear`` by
    ``Transpose(x_q, channels last) -> com.microsoft::MatMulIntegerToFloat(x_q, q [C_in, C_out], x_scale, scales,
    x_zp, -, bias) -> Transpose(channels first)``: INT8 inputs and INT32 sums (VNNI's u8*s8), a float output.
    ``residual`` (levels ``[C_out, C_in]``, scales): a second INT8 part of the weight, computed by a second
    MatMulIntegerToFloat on the same input and added.

    ONNX Runtime's CPU provider runs its QLinearConvs channels last and cancels these Transposes against its own.
    The caller adds the ``com.microsoft`` opset import.

    Returns:
        The MatMulIntegerToFloat node.
    """
    dq = node.inputs[0].producer() if node.inputs[0] is not None else None
    assert dq is not None and dq.op_type == "DequantizeLinear" and len(dq.inputs) == 3
    quantized, scale, zero = dq.inputs
    weight = node.inputs[1]
    assert weight is not None and quantized is not None and scale is not None and zero is not None
    base = str(weight.name)
    out_channels, in_channels = recipe.shape()[:2]
    q_name = names(f"{base}_int8")

    def matrix() -> ir.Tensor:
        return ir.Tensor(np.ascontiguousarray(recipe.quantized().reshape(out_channels, in_channels).T), name=q_name)

    lazy = ir.LazyTensor(matrix, dtype=ir.DataType.INT8, shape=ir.Shape((in_channels, out_channels)), name=q_name)
    q = add_initializer(graph, q_name, lazy)
    scales = add_initializer(graph, names(f"{base}_scales"), recipe.scales.astype(np.float32))
    full_bias = np.zeros(out_channels) if bias is None else bias
    bias_value = add_initializer(graph, names(f"{node.name}_bias"), full_bias.astype(np.float32))
    rank = len(recipe.shape())
    out = node.outputs[0]
    last = ir.Value(name=names(f"{quantized.name}_channels_last"), type=ir.TensorType(ir.DataType.UINT8))
    product = ir.Value(name=names(f"{node.name}_channels_last"), type=ir.TensorType(ir.DataType.FLOAT))
    result = value_like(out, names(f"{node.name}_output"))
    matmul = ir.Node(MS_DOMAIN, "MatMulIntegerToFloat", [last, q, scale, scales, zero, None, bias_value],
                     outputs=[product], name=names.node(f"{node.name}_MatMulIntegerToFloat"))  # fmt: skip
    new_nodes = [
        ir.Node("", "Transpose", [quantized], attributes=[ir.AttrInt64s("perm", [0, *range(2, rank), 1])],
                outputs=[last], name=names.node(f"{node.name}_channels_last")),
        matmul,
    ]  # fmt: skip
    if residual is not None:
        levels, residual_scales = residual
        q_r = add_initializer(graph, names(f"{base}_residual_int8"), np.ascontiguousarray(levels.T))
        s_r = add_initializer(graph, names(f"{base}_residual_scales"), residual_scales.astype(np.float32))
        part = ir.Value(name=names(f"{node.name}_residual"), type=ir.TensorType(ir.DataType.FLOAT))
        total = ir.Value(name=names(f"{node.name}_two_parts"), type=ir.TensorType(ir.DataType.FLOAT))
        new_nodes += [
            ir.Node(MS_DOMAIN, "MatMulIntegerToFloat", [last, q_r, scale, s_r, zero], outputs=[part],
                    name=names.node(f"{node.name}_residual_MatMulIntegerToFloat")),
            ir.Node("", "Add", [product, part], outputs=[total], name=names.node(f"{node.name}_two_parts")),
        ]  # fmt: skip
        product = total
    new_nodes.append(
        ir.Node("", "Transpose", [product], attributes=[ir.AttrInt64s("perm", [0, rank - 1, *range(1, rank - 1)])],
                outputs=[result], name=names.node(f"{node.name}_channels_first"))
    )  # fmt: skip
    old_bias = node.inputs[2] if len(node.inputs) > 2 else None
    ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, [out], [result])
    if not dq.outputs[0].uses() and not dq.outputs[0].is_graph_output():
        graph.remove(dq, safe=True)
    for value in (weight, old_bias):
        if value is not None and not value.uses() and value.name in graph.initializers and not value.is_graph_output():
            graph.initializers.pop(str(value.name))
    return matmul


@dataclass
class MergedLayer:
    """One MatMul of a dynamic group merged with the others (:func:`replace_group_with_matmul_integer`)."""

    node: ir.Node
    recipe: WeightRecipe
    bias_add: ir.Node | None
    """The Add of the layer's constant bias that alone reads its product (folded into the merged layer), or None."""
    correction: np.ndarray | None = None
    """Bias correction ``[N]`` to add."""
    split_rows: np.ndarray | None = None
    """``[J, N]`` float rows of the group's split channels."""


def bias_add_of(node: ir.Node, n: int) -> ir.Node | None:
    """The Add that alone reads MatMul ``node``'s output and adds a constant FLOAT ``[n]`` bias, or None."""
    out = node.outputs[0]
    users = list(out.uses())
    if len(users) != 1 or out.is_graph_output() or users[0].node.op_type != "Add":
        return None
    add, index = users[0].node, users[0].idx
    other = add.inputs[1 - index] if len(add.inputs) == 2 else None
    if other is None or other.const_value is None or other.dtype != ir.DataType.FLOAT or other.is_graph_input():
        return None
    return add if tuple(other.const_value.shape) == (n,) else None


def _bias_of(add: ir.Node, product: ir.Value) -> np.ndarray:
    other = add.inputs[1] if add.inputs[0] is product else add.inputs[0]
    assert other is not None and other.const_value is not None
    return np.asarray(other.const_value.numpy(), dtype=np.float32).reshape(-1)


def replace_group_with_matmul_integer(
    graph: ir.Graph,
    layers: list[MergedLayer],
    activation: tuple[ir.Value, ir.Value, ir.Value],
    gathered: ir.Value | None,
    names: NameAllocator,
) -> ir.Node:
    """Replaces the MatMuls of one dynamic group (one quantized input) by a single layer with their weights side by
    side, ``MatMulInteger(x_q, [q_1 .. q_n]) -> Cast -> Mul(x_scale * scales) [-> Add(biases)]
    [-> Add(x[:, J] @ [rows_1 .. rows_n])] -> Split``, each output keeping its layer's name.

    The product of each column is the one its own layer computed (the same quantized input, weights, scales and
    bias). ONNX Runtime fuses the chain before the Split into one ``DynamicQuantizeMatMul`` (with the bias), one
    GEMM with N the sum of the layers' instead of a GEMM, a bias and an outlier product per layer: the attention's Q,
    K and V of a transformer, an MLP's gate and up projections. MLAS splits the work of a GEMM across threads by its
    size, so a small GEMM runs on one thread where the merged one spreads over all of them.

    Returns:
        The Split.
    """
    recipes = [layer.recipe for layer in layers]
    widths = [recipe.shape()[1] for recipe in recipes]
    k = recipes[0].shape()[0]
    first = layers[0].node
    base = str(first.name) + "_merged"
    q_name = names(f"{base}_int8")

    def weight() -> ir.Tensor:
        return ir.Tensor(np.concatenate([recipe.quantized() for recipe in recipes], axis=1), name=q_name)

    q = add_initializer(graph, q_name, ir.LazyTensor(weight, dtype=ir.DataType.INT8, shape=ir.Shape((k, sum(widths))),
                                                     name=q_name))  # fmt: skip
    zeros = add_initializer(graph, names(f"{base}_zero_points"), np.zeros(sum(widths), np.int8))
    all_scales = np.concatenate([recipe.scales for recipe in recipes]).astype(np.float32)
    scales = add_initializer(graph, names(f"{base}_scales"), all_scales)
    product = ir.Value(name=names(f"{base}_product"), type=ir.TensorType(ir.DataType.FLOAT))
    new_nodes = _integer_product(base, activation, q, zeros, scales, product, names)
    result = product
    biases = []
    for layer, width in zip(layers, widths):
        bias = np.zeros(width, np.float32)
        if layer.bias_add is not None:
            bias += _bias_of(layer.bias_add, layer.node.outputs[0])
        if layer.correction is not None:
            bias += layer.correction.astype(np.float32)
        biases.append(bias)
    if any(layer.bias_add is not None or layer.correction is not None for layer in layers):
        bias_value = add_initializer(graph, names(f"{base}_bias"), np.concatenate(biases))
        result = ir.Value(name=names(f"{base}_biased"), type=ir.TensorType(ir.DataType.FLOAT))
        new_nodes.append(ir.Node("", "Add", [product, bias_value], outputs=[result], name=names.node(f"{base}_bias")))
    if gathered is not None and any(layer.split_rows is not None for layer in layers):
        j = next(layer.split_rows for layer in layers if layer.split_rows is not None).shape[0]
        rows = np.concatenate([layer.split_rows if layer.split_rows is not None else np.zeros((j, width), np.float32)
                               for layer, width in zip(layers, widths)], axis=1)  # fmt: skip
        weight_value = add_initializer(graph, names(f"{base}_outlier_rows"), rows.astype(np.float32))
        partial = ir.Value(name=names(f"{base}_outlier_product"), type=ir.TensorType(ir.DataType.FLOAT))
        total = ir.Value(name=names(f"{base}_with_outliers"), type=ir.TensorType(ir.DataType.FLOAT))
        new_nodes += [
            ir.Node("", "MatMul", [gathered, weight_value], outputs=[partial],
                    name=names.node(f"{base}_outlier_MatMul")),
            ir.Node("", "Add", [result, partial], outputs=[total], name=names.node(f"{base}_outlier_Add")),
        ]  # fmt: skip
        result = total
    sizes = add_initializer(graph, names(f"{base}_widths"), np.array(widths, np.int64))
    old_nodes: list[ir.Node] = []
    old_values: list[ir.Value] = []
    for layer in layers:
        old_nodes.append(layer.node)
        if layer.bias_add is not None:
            old_nodes.append(layer.bias_add)
            old_values.append(layer.bias_add.outputs[0])
        else:
            old_values.append(layer.node.outputs[0])
    outputs = [ir.Value(name=names(f"{value.name}_merged")) for value in old_values]
    split = ir.Node("", "Split", [result, sizes], attributes=[ir.AttrInt64("axis", -1)], outputs=outputs,
                    name=names.node(f"{base}_Split"))  # fmt: skip
    new_nodes.append(split)
    position = {id(node): i for i, node in enumerate(graph)}
    earliest = min((layer.node for layer in layers), key=lambda node: position[id(node)])
    ir.convenience.replace_nodes_and_values(graph, earliest, old_nodes, new_nodes, old_values, outputs)
    return split
