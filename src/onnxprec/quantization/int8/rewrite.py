"""The INT8 graph rewrites: Q/DQ pairs on static tensors, dynamic quantization of layer inputs, INT8 weights.

Every rewrite inserts standard ONNX ops (opset >= 13: per-axis DequantizeLinear) that ONNX Runtime fuses:

- a static tensor ``x`` gets ``QuantizeLinear -> DequantizeLinear`` and every reader reads the DequantizeLinear;
- a weight becomes ``DequantizeLinear(q int8, scales[, zero points 0 for QGemm], axis)``; ``q`` is an
  :class:`onnx_ir.LazyTensor` computed from the memory-mapped float weight while the model is written
  (:class:`WeightRecipe`), or GPTQ's levels;
- a static Conv's or Gemm's float bias becomes ``DequantizeLinear(int32, x_scale * w_scales)`` (what ``QLinearConv``
  and ``QGemm`` need);
- split channels are computed in float beside the quantized product: ``Gather(x, J)`` once per group, then
  ``MatMul(W[J]) -> Add`` per layer;
- the dynamic and integer-product layers are in :mod:`onnxprec.quantization.int8.integer_ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator, insert_after_producer
from onnxprec._ops import is_default_domain, normalized_domain
from onnxprec._tensors import release
from onnxprec.quantization.algorithms.int8 import QMAX
from onnxprec.quantization.algorithms.qtypes import INT8, QType

__all__ = [
    "FP16_TINY",
    "MS_DOMAIN",
    "WeightRecipe",
    "add_bias",
    "add_initializer",
    "fold_casts_into_qdq",
    "fold_smoothing",
    "fp16_scales",
    "gather_channels",
    "insert_qdq",
    "insert_split",
    "int8_weight",
    "int32_bias",
    "keep_float_readers_float",
    "quantize_bias",
    "replace_bias",
    "replace_weight",
    "value_like",
]

MS_DOMAIN = "com.microsoft"


@dataclass
class WeightRecipe:
    """How one float weight becomes INT8 when it is written: optional row factors, then per-channel scales.

    ``matrix`` is the weight as the quantized layer reads it: ``[K, N]`` for MatMul (a Gemm's ``[N, K]`` with
    ``transB=1`` is transposed, since it becomes a MatMul), the stored shape for Conv.
    """

    source: ir.TensorProtocol
    axis: int
    """Output-channel axis of the quantized array."""
    scales: np.ndarray
    transpose: bool = False
    rows: np.ndarray | None = None
    """``[K]`` factors on the input channels (axis 0 of ``[K, N]``), applied before quantization."""
    levels: np.ndarray | None = None
    """INT8 levels decided already (GPTQ rounding); None: rounded to nearest when written."""
    columns: np.ndarray | None = None
    """``[N]`` positive factors on the output channels of a ``[K, N]`` weight (a smoothing folded into the layer's
    output; :attr:`scales` carry them too, so the levels are those of the unscaled weight)."""
    qtype: QType = INT8
    """The levels' type: INT8, or FP8 E4M3FN (``quantize fp8``)."""
    inputs: np.ndarray | None = None
    """``[C]`` factors on a Conv weight's input channels (axis 1): its input equalized per channel."""

    def matrix(self) -> np.ndarray:
        """The float32 weight to quantize (the source's mapping released)."""
        array = np.asarray(self.source.numpy())
        weight = (array.T if self.transpose else array).astype(np.float32)
        del array
        release(self.source)
        if self.rows is not None:
            weight = weight * self.rows.astype(np.float32)[:, None]
        if self.columns is not None:
            weight = weight * self.columns.astype(np.float32)[None, :]
        if self.inputs is not None:
            weight = weight * self.inputs.astype(np.float32).reshape(1, -1, *[1] * (weight.ndim - 2))
        return weight

    def quantized(self, weight: np.ndarray | None = None) -> np.ndarray:
        """The levels with :attr:`scales` (INT8: -127..127; FP8: up to +-448)."""
        if self.levels is not None:
            return self.levels
        w = self.matrix() if weight is None else weight
        shape = [1] * w.ndim
        shape[self.axis] = -1
        return self.qtype.quantize(w, self.scales.reshape(shape))

    def shape(self) -> tuple[int, ...]:
        shape = tuple(int(d) for d in self.source.shape.numpy())
        return shape[::-1] if self.transpose else shape

    def fitting_bias(self, bias: np.ndarray, x_scale: float) -> WeightRecipe:
        """This recipe with the scales of the channels whose INT32 bias (``bias / (x_scale * scale)``) would
        overflow raised until it fits.

        Such channels have weights near zero (a dead channel after BatchNorm folding: weights ~1e-6, bias -5):
        their tiny RTN scale would clamp the bias to a fraction of its value, which changes the output wherever
        the bias is positive. A larger scale rounds their weights (to about zero, as they were) and keeps the bias.
        """
        limit = np.float64(x_scale) * (2**31 - 2**12)
        needed = (np.abs(bias.astype(np.float64)) / limit).astype(np.float32)
        low = self.scales < needed
        if not np.any(low):
            return self
        scales = np.where(low, needed, self.scales).astype(self.scales.dtype)
        levels = self.levels
        if levels is not None:
            weight = np.moveaxis(self.matrix(), self.axis, 0)[low]
            shape = (-1,) + (1,) * (weight.ndim - 1)
            refit = np.clip(np.rint(weight / scales[low].reshape(shape)), -QMAX, QMAX).astype(np.int8)
            levels = np.array(levels, copy=True)
            np.moveaxis(levels, self.axis, 0)[low] = refit
        return replace(self, scales=scales, levels=levels)


def value_like(value: ir.Value, name: str) -> ir.Value:
    """A new value named ``name`` with ``value``'s element type and shape, copied: never shared (a pass that
    changes one value's element type in place, as AutoCast does, would change both)."""
    return ir.Value(
        name=name,
        type=ir.TensorType(value.dtype) if value.dtype is not None else None,
        shape=ir.Shape(value.shape) if value.shape is not None else None,
    )


_IR_TENSORS = (ir.Tensor, ir.LazyTensor, ir.ExternalTensor)


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray | ir.TensorProtocol) -> ir.Value:
    """Registers a new initializer (a numpy array or a tensor) under ``name``."""
    # numpy and onnx_ir's own tensors first: an isinstance against a Protocol checks each of its attributes (slow
    # over the Q/DQ of a model, built once per check of a target search)
    if isinstance(array, (np.ndarray, np.generic)) or not isinstance(array, (*_IR_TENSORS, ir.TensorProtocol)):
        array = np.asarray(array)
        array = ir.Tensor(array if array.flags.c_contiguous else array.copy(order="C"))  # keeps 0-d scalars 0-d
    tensor = array
    shape = ir.Shape(tuple(int(d) for d in tensor.shape.numpy()))
    value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=shape, const_value=tensor)
    graph.register_initializer(value)
    return value


def _scalar(graph: ir.Graph, names: NameAllocator, base: str, value: float | int, dtype: type) -> ir.Value:
    return add_initializer(graph, names(base), np.array(value, dtype=dtype))


def insert_qdq(
    graph: ir.Graph,
    value: ir.Value,
    scale: float,
    zero_point: int,
    *,
    qtype: QType,
    names: NameAllocator,
    readers: Callable[[ir.Node], bool] | None = None,
) -> ir.Value:
    """``QuantizeLinear -> DequantizeLinear`` on ``value`` with levels of ``qtype`` (the zero point's type); every
    node that read ``value`` (``readers``: those for which it holds) reads the result."""
    base = str(value.name)
    scale_value = _scalar(graph, names, f"{base}_scale", scale, np.float32)
    zero = add_initializer(graph, names(f"{base}_zero_point"), qtype.zero(zero_point))
    quantized = ir.Value(name=names(f"{base}_quantized"))
    dequantized = value_like(value, names(f"{base}_dequantized"))
    q = ir.Node("", "QuantizeLinear", [value, scale_value, zero], outputs=[quantized], name=names.node(f"{base}_Q"))
    dq = ir.Node("", "DequantizeLinear", [quantized, scale_value, zero], outputs=[dequantized],
                 name=names.node(f"{base}_DQ"))  # fmt: skip
    users = [(node, index) for node, index in value.uses() if node is not q and (readers is None or readers(node))]
    insert_after_producer(graph, value, [q, dq])
    for node, index in users:
        node.replace_input_with(index, dequantized)
    return dequantized


_PROPAGATED = frozenset({"Transpose", "Reshape", "MaxPool", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather"})
"""Ops ONNX Runtime's ``QDQPropagationTransformer`` moves a DequantizeLinear across."""


def feeds_a_body(node: ir.Node, depth: int = 8) -> bool:
    """Whether ``node`` is an op whose DequantizeLinear input ONNX Runtime's ``QDQPropagationTransformer`` would move
    towards a value that an If/Loop/Scan body reads from its enclosing graph (directly, or through more such ops).

    ONNX Runtime (1.32) aborts the process (``std::vector`` index assertion in ``qdq_propagation.cc``) when that
    propagation reaches such an implicit subgraph input, so these readers read the float value instead.
    """
    if depth == 0 or node.op_type not in _PROPAGATED or not is_default_domain(node.domain):
        return False
    for out in node.outputs:
        for use in out.uses():
            if use.node.graph is not node.graph or feeds_a_body(use.node, depth - 1):
                return True
    return False


def _channels(node: ir.Node) -> int | None:
    """The input channels a float Conv, ConvTranspose or Gemm reads (from its weight), or None."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is None or weight.const_value is None:
        return None
    shape = [int(d) for d in weight.const_value.shape.numpy()]
    if node.op_type == "Conv":
        groups = node.attributes.get("group")
        return shape[1] * (int(groups.value) if groups is not None else 1)
    if node.op_type == "ConvTranspose":
        return shape[0]
    trans_b = node.attributes.get("transB")
    return shape[1] if trans_b is not None and trans_b.value else shape[0]


def keep_float_readers_float(graph: ir.Graph, names: NameAllocator) -> int:
    """Gives every float Conv, ConvTranspose and Gemm that reads a static tensor its own per-channel DequantizeLinear.

    ONNX Runtime's ``WeightBiasQuantization`` quantizes the float weight of such a layer to per-tensor INT8 (and
    fuses it) when its input comes from a per-tensor DequantizeLinear and its output path reaches a
    QuantizeLinear: a layer kept in float (``nodes_to_exclude``, or sent back by the accuracy target) would be
    quantized anyway, per tensor, which is less accurate than ours.
    The same scale repeated per channel (axis 1) computes the same values and is no per-tensor DequantizeLinear.

    Returns:
        The readers given their own DequantizeLinear.
    """
    count = 0
    for node in list(graph):
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(node.inputs) < 2 or node.inputs[0] is None:
            continue
        weight = node.inputs[1]
        dq = node.inputs[0].producer()
        if dq is None or dq.op_type != "DequantizeLinear" or "axis" in dq.attributes or len(dq.inputs) < 3:
            continue
        if weight is not None and weight.producer() is not None and weight.producer().op_type == "DequantizeLinear":  # type: ignore[union-attr]
            continue  # a quantized layer
        scale, zero = dq.inputs[1], dq.inputs[2]
        channels = _channels(node)
        if scale is None or zero is None or scale.const_value is None or zero.const_value is None or not channels:
            continue
        base = str(node.name)
        scales = add_initializer(graph, names(f"{base}_input_scales"),
                                 np.full(channels, scale.const_value.numpy(), np.float32))  # fmt: skip
        zero_array = np.asarray(zero.const_value.numpy())
        zeros = add_initializer(
            graph, names(f"{base}_input_zero_points"), np.full(channels, zero_array, zero_array.dtype)
        )
        out = value_like(node.inputs[0], names(f"{base}_float_input"))
        own = ir.Node("", "DequantizeLinear", [dq.inputs[0], scales, zeros], attributes=[ir.AttrInt64("axis", 1)],
                      outputs=[out], name=names.node(f"{base}_input_DQ"))  # fmt: skip
        graph.insert_before(node, own)
        node.replace_input_with(0, out)
        count += 1
    return count


_NORM_SCALES: dict[tuple[str, str], tuple[int, ...]] = {
    ("", "LayerNormalization"): (1, 2),
    ("", "RMSNormalization"): (1,),
    ("", "SimplifiedLayerNormalization"): (1,),
    (MS_DOMAIN, "SkipLayerNormalization"): (2, 3),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): (2,),
}
"""The per-channel inputs (scale, then bias) of the normalizations whose first output is ``normed * scale + bias``
along the last axis."""


def fold_smoothing(
    graph: ir.Graph, value: ir.Value, factors: np.ndarray, readers: Collection[ir.Node], names: NameAllocator
) -> bool:
    """Folds the per-channel ``factors`` of a dynamic input into the op that writes it, where that is exact: a
    LayerNormalization/RMSNorm-style node's scale and bias (``value`` its first output), or the constant ``[K]`` of a
    Mul (a decomposed norm's weight), and nothing but ``readers`` reads ``value``.

    The folded constants are new initializers (the old ones may be shared). ``value`` then holds the smoothed
    quantity, so it takes a new name (``compare`` matches tensors by name).

    Returns:
        Whether the factors were folded (no Mul needed).
    """
    node = value.producer()
    k = factors.shape[0]
    if node is None or value.is_graph_output() or any(use.node not in readers for use in value.uses()):
        return False
    if node.outputs[0] is not value:
        return False
    if node.op_type == "Mul":
        indices: tuple[int, ...] = tuple(
            i for i, v in enumerate(node.inputs) if v is not None and v.const_value is not None
        )
    else:
        indices = _NORM_SCALES.get((normalized_domain(node.domain), node.op_type), ())
        axis = node.attributes.get("axis")
        if axis is not None and int(axis.value) != -1:
            return False
    constants = [node.inputs[i] if i < len(node.inputs) else None for i in indices]
    if not indices or (node.op_type == "Mul" and len(indices) != 1):
        return False
    for constant in constants:
        if constant is not None and (constant.const_value is None or tuple(constant.const_value.shape) != (k,)):
            return False
    for index, constant in zip(indices, constants):
        if constant is None:
            continue
        assert constant.const_value is not None
        folded = np.asarray(constant.const_value.numpy(), dtype=np.float32) * factors.astype(np.float32)
        node.replace_input_with(index, add_initializer(graph, names(f"{constant.name}_smoothed"), folded))
    value.name = names(f"{value.name}_smoothed")
    return True


def int8_weight(graph: ir.Graph, recipe: WeightRecipe, base: str, names: NameAllocator) -> ir.Value:
    """The INT8 (or FP8, the recipe's type) weight of ``recipe`` as a new initializer named after ``base``: a lazy
    tensor, quantized while the model is written."""
    q_name = names(f"{base}_{recipe.qtype.name}")
    dtype = ir.DataType.FLOAT8E4M3FN if recipe.qtype.is_float else ir.DataType.INT8
    lazy = ir.LazyTensor(lambda: ir.Tensor(recipe.quantized(), name=q_name), dtype=dtype,
                         shape=ir.Shape(recipe.shape()), name=q_name)  # fmt: skip
    return add_initializer(graph, q_name, lazy)


def replace_weight(graph: ir.Graph, node: ir.Node, recipe: WeightRecipe, names: NameAllocator) -> ir.Node:
    """Makes ``node`` (a static Conv, Gemm or MatMul) read ``DequantizeLinear(q, scales, axis)`` as its weight.

    Returns:
        ``node``.
    """
    weight = node.inputs[1]
    assert weight is not None
    base = str(weight.name)
    shape = recipe.shape()
    q = int8_weight(graph, recipe, base, names)
    scales = add_initializer(graph, names(f"{base}_scales"), recipe.scales.astype(np.float32))
    inputs = [q, scales]
    # ONNX Runtime fuses DequantizeLinear -> Gemm into QGemm only with explicit zero points (and a MatMul's
    # DequantizeLinear with them may become MatMulNBits instead); FP8 weights have them as ModelOpt writes them
    if node.op_type == "Gemm" or recipe.qtype.is_float:
        zeros = np.zeros(recipe.scales.shape, np.float32).astype(recipe.qtype.dtype)
        inputs.append(add_initializer(graph, names(f"{base}_zero_points"), zeros))
    dequantized = ir.Value(
        name=names(f"{base}_dequantized"), type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape)
    )
    dq = ir.Node("", "DequantizeLinear", inputs, attributes=[ir.AttrInt64("axis", recipe.axis)],
                 outputs=[dequantized], name=names.node(f"{base}_DQ"))  # fmt: skip
    graph.insert_before(node, dq)
    node.replace_input_with(1, dequantized)
    return node


def add_bias(graph: ir.Graph, node: ir.Node, bias: np.ndarray, names: NameAllocator) -> None:
    """Adds ``bias`` ``[N]`` to the output of MatMul ``node``: into the constant of the Add that alone reads it, else
    with a new Add."""
    out = node.outputs[0]
    users = list(out.uses())
    if len(users) == 1 and not out.is_graph_output() and users[0].node.op_type == "Add":
        add = users[0].node
        other = add.inputs[1 - users[0].idx]
        if (
            other is not None and other.const_value is not None and len(list(other.uses())) == 1
            and other.dtype == ir.DataType.FLOAT and tuple(other.const_value.shape.numpy()) == bias.shape
            and not other.is_graph_input()
        ):  # fmt: skip
            merged = np.asarray(other.const_value.numpy(), dtype=np.float32) + bias.astype(np.float32)
            add.replace_input_with(1 - users[0].idx, add_initializer(graph, names(f"{other.name}_corrected"), merged))
            return
    corrected = value_like(out, names(f"{out.name}_corrected"))
    value = add_initializer(graph, names(f"{node.name}_bias_correction"), bias.astype(np.float32))
    add = ir.Node("", "Add", [out, value], outputs=[corrected], name=names.node(f"{node.name}_bias_correction"))
    _reroute(graph, node, out, add, corrected, names)


def _reroute(
    graph: ir.Graph, node: ir.Node, out: ir.Value, new: ir.Node, result: ir.Value, names: NameAllocator
) -> None:
    """Inserts ``new`` (which reads ``out``) after ``node``; everything else that read ``out`` reads ``result``,
    which takes ``out``'s name: a tensor keeps the name it has in the float model only where it holds the same
    quantity (``compare`` matches tensors by name), the partial sum gets a new one."""
    users = [(user, index) for user, index in out.uses() if user is not new]
    graph.insert_after(node, new)
    for user, index in users:
        user.replace_input_with(index, result)
    name = str(out.name)
    partial = names(f"{name}_partial")
    if out.is_graph_output():
        graph.outputs[list(graph.outputs).index(out)] = result
    out.name, result.name = partial, name


def gather_channels(graph: ir.Graph, x: ir.Value, channels: np.ndarray, names: NameAllocator) -> ir.Value:
    """``Gather(x, channels, axis=-1)`` inserted after ``x``'s producer: the outlier channels of a group, gathered
    once for all its layers."""
    base = str(x.name)
    index = add_initializer(graph, names(f"{base}_outlier_channels"), channels.astype(np.int64))
    gathered = ir.Value(name=names(f"{base}_outliers"))
    gather = ir.Node("", "Gather", [x, index], attributes=[ir.AttrInt64("axis", -1)], outputs=[gathered],
                     name=names.node(f"{base}_outliers"))  # fmt: skip
    insert_after_producer(graph, x, [gather])
    return gathered


def insert_split(graph: ir.Graph, node: ir.Node, gathered: ir.Value, rows: np.ndarray, names: NameAllocator) -> None:
    """Adds ``gathered @ rows`` (the outlier channels' float product) to the output of ``node``."""
    base = str(node.name)
    weight = add_initializer(graph, names(f"{base}_outlier_rows"), rows.astype(np.float32))
    partial = ir.Value(name=names(f"{base}_outlier_product"))
    out = node.outputs[0]
    users = list(out.uses())
    if len(users) == 1 and not out.is_graph_output() and users[0].node.op_type == "Add":
        other = users[0].node.inputs[1 - users[0].idx]
        if other is not None and other.const_value is not None:  # after the bias Add: that one fuses into the layer
            out.name = names(f"{out.name}_without_outliers")  # not the float model's quantity any more
            node, out = users[0].node, users[0].node.outputs[0]
    total = value_like(out, names(f"{out.name}_with_outliers"))
    matmul = ir.Node("", "MatMul", [gathered, weight], outputs=[partial], name=names.node(f"{base}_outlier_MatMul"))
    graph.insert_before(node, [matmul])
    add = ir.Node("", "Add", [out, partial], outputs=[total], name=names.node(f"{base}_outlier_Add"))
    _reroute(graph, node, out, add, total, names)


def replace_bias(graph: ir.Graph, node: ir.Node, bias: np.ndarray, names: NameAllocator) -> None:
    """Makes a Conv or Gemm read ``bias`` (float32, its corrected bias) as input 2; the old bias goes if unread."""
    value = add_initializer(graph, names(f"{node.name}_bias"), bias.astype(np.float32))
    old = node.inputs[2] if len(node.inputs) > 2 else None
    if old is None:
        node.resize_inputs(3)
    node.replace_input_with(2, value)
    if old is not None and not old.uses() and old.name in graph.initializers and not old.is_graph_output():
        graph.initializers.pop(str(old.name))


def int32_bias(bias: np.ndarray, x_scale: float, w_scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float bias as ``QLinearConv`` and ``QGemm`` take it: INT32 levels and their scales ``x_scale * w_scales``."""
    scales = (np.float32(x_scale) * w_scales.astype(np.float32)).astype(np.float32)
    return np.clip(np.rint(bias.astype(np.float64) / scales), -(2**31), 2**31 - 1).astype(np.int32), scales


def quantize_bias(
    graph: ir.Graph, node: ir.Node, bias: np.ndarray, x_scale: float, w_scales: np.ndarray, names: NameAllocator
) -> None:
    """Makes a Conv or Gemm read ``DequantizeLinear(int32 bias, x_scale * w_scales, axis=0)`` as its bias (input 2),
    what ``QLinearConv`` and ``QGemm`` take."""
    levels, scales = int32_bias(bias, x_scale, w_scales)
    base = f"{node.name}_bias"
    q = add_initializer(graph, names(f"{base}_int32"), levels)
    s = add_initializer(graph, names(f"{base}_scales"), scales)
    out = ir.Value(name=names(f"{base}_dequantized"), type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(bias.shape))
    dq = ir.Node("", "DequantizeLinear", [q, s], attributes=[ir.AttrInt64("axis", 0)], outputs=[out],
                 name=names.node(f"{base}_DQ"))  # fmt: skip
    graph.insert_before(node, dq)
    if len(node.inputs) > 2:
        node.replace_input_with(2, out)
    else:
        node.resize_inputs(3)
        node.replace_input_with(2, out)


_LOW = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


FP16_TINY = float(np.finfo(np.float16).smallest_subnormal)
"""The smallest positive FP16 scale (6e-8; ModelOpt raises smaller FP16 initializers to it too)."""


def fp16_scales(scales: np.ndarray) -> np.ndarray:
    """``scales`` as FP16 will hold them, in float32: magnitudes below :data:`FP16_TINY` raised to it (never 0),
    then rounded to FP16."""
    array = np.asarray(scales, dtype=np.float32)
    raised = np.where(np.abs(array) < FP16_TINY, np.copysign(FP16_TINY, array), array)
    return raised.astype(np.float16).astype(np.float32)


def _rescale(
    graph: ir.Graph, node: ir.Node, dtype: ir.DataType, names: NameAllocator, made: dict[tuple[str, int], ir.Value]
) -> None:
    """Makes Q/DQ ``node`` read its constant scale as a ``dtype`` initializer (one per scale, shared by the nodes
    that shared the FP32 one, which goes once unread)."""
    scale = node.inputs[1]
    assert scale is not None and scale.const_value is not None
    key = (str(scale.name), int(dtype))
    if key not in made:
        array = np.asarray(scale.const_value.numpy(), dtype=np.float32)
        if dtype == ir.DataType.FLOAT16:  # a scale below FP16's range would become 0 (a DequantizeLinear of zeros)
            array = fp16_scales(array)
        tensor = ir.Tensor(array.astype(np.float16)) if dtype == ir.DataType.FLOAT16 else ir.tensor(array, dtype=dtype)
        made[key] = add_initializer(graph, names(f"{scale.name}_{dtype.name.lower()}"), tensor)
    node.replace_input_with(1, made[key])
    if not scale.uses() and scale.name in graph.initializers:
        graph.initializers.pop(str(scale.name))


def fold_casts_into_qdq(graph: ir.Graph, names: NameAllocator) -> int:
    """Makes Q/DQ pairs read and write the FP16/BF16 remainder directly (opset >= 19), as ModelOpt writes them.

    AutoCast keeps the INT8 ops in FP32, so it leaves ``Cast(to FP32) -> QuantizeLinear`` and
    ``DequantizeLinear -> Cast(to FP16)`` at their borders; TensorRT fuses a DequantizeLinear into the Conv or MatMul
    it feeds, not across a Cast. Each such Cast goes, and the Q/DQ node takes an FP16/BF16 scale.

    Returns:
        The Casts removed.
    """
    removed = 0
    made: dict[tuple[str, int], ir.Value] = {}
    for node in list(graph):
        if node.op_type == "QuantizeLinear" and len(node.inputs) > 1 and node.inputs[1] is not None:
            source = node.inputs[0]
            cast = source.producer() if source is not None else None
            if cast is None or cast.op_type != "Cast" or node.inputs[1].const_value is None:
                continue
            low = cast.inputs[0]
            if low is None or low.dtype not in _LOW:
                continue
            node.replace_input_with(0, low)
            _rescale(graph, node, low.dtype, names, made)
            if not cast.outputs[0].uses() and not cast.outputs[0].is_graph_output():
                graph.remove(cast, safe=True)
                removed += 1
        elif node.op_type == "DequantizeLinear" and len(node.inputs) > 1 and node.inputs[1] is not None:
            out = node.outputs[0]
            users = list(out.uses())
            casts = {use.node for use in users}
            if not users or out.is_graph_output() or node.inputs[1].const_value is None:
                continue
            if any(c.op_type != "Cast" or c.outputs[0].is_graph_output() for c in casts):
                continue
            targets = {c.outputs[0].dtype for c in casts}
            if len(targets) != 1 or (dtype := targets.pop()) not in _LOW:
                continue
            _rescale(graph, node, dtype, names, made)
            out.dtype = dtype
            for cast in casts:
                ir.convenience.replace_all_uses_with(cast.outputs[0], out)
                graph.remove(cast, safe=True)
                removed += 1
    return removed
