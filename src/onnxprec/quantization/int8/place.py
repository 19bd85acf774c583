"""Where INT8 goes: which layers are quantized, how (static or dynamic activations), and which tensors get Q/DQ.

The placement depends on the runtime that will run the model:

- ``ort-cpu`` (ONNX Runtime's CPU provider): ONNX Runtime fuses ``DequantizeLinear -> Conv -> QuantizeLinear`` into
  ``QLinearConv``, ``DynamicQuantizeLinear -> DequantizeLinear -> MatMul`` into ``DynamicQuantizeMatMul``, and the
  QDQ forms of Add, Concat and the pools into their QLinear kernels. Conv layers are static (calibrated activation
  ranges, UINT8 activations and INT8 weights: VNNI's u8*s8). MatMul and Gemm layers with a constant weight are
  dynamic (each run quantizes its own activation range: no calibrated range can be too small, and transformers'
  per-run ranges vary; a Gemm becomes ``DynamicQuantizeMatMul`` with its bias), unless their input is already a
  static tensor (then ``QGemm``). A ``Relu`` or
  ``Clip`` that follows a static layer is absorbed (its output is quantized instead: ONNX Runtime drops it into the
  quantization's own clamp), and Add, Concat, Mul and the pools join the static region only when each of their float
  inputs comes from it, so no DequantizeLinear is left in front of an op ONNX Runtime cannot fuse except where the
  region ends. A static layer that reads the model's own float input (directly or through Pad, Transpose, Reshape...)
  stays float unless ``nodes_to_quantize`` names it: the input's own resolution (an 8-bit image's pixel step) is
  about as fine as a UINT8 grid over its range, so quantizing it adds noise of the size of one input step, which the
  network may amplify, and a first Conv with a few input channels gains nothing from INT8 kernels. So
  does a depthwise Conv that reads the output of a layer kept float (a MobileNet's first depthwise Conv after its
  stem): with no sum over channels its INT8 kernel is no faster than the float one, its input would need a
  QuantizeLinear of its own, and an early layer's error is the one the network amplifies most. A static pointwise
  Conv (1x1, one group, stride 1, no padding) whose output no activation clips and a float op reads (a MobileNet's
  project Conv, the last of a residual branch) writes a float output:
  ``com.microsoft::MatMulIntegerToFloat`` on its UINT8 input and INT8 weights, channels last between Transposes
  that ONNX Runtime cancels against those of its channels-last QLinearConvs. The residual Adds it feeds are float,
  and a tensor written by a float op is read through its Q/DQ only by the static ops (the next expand Conv), the
  float ops read it as it is, so the per-tensor UINT8 rounding of the residual stream does not accumulate from block
  to block. A project Conv read only by INT8 Convs (a single-block stage's) stays QLinearConv: they quantize its
  output either way. The measurements behind each rule: experiments/design_notes.md, "INT8 placement".
- ``trt`` and ``ort-cuda`` (TensorRT-style): symmetric INT8 Q/DQ on the activation and weight inputs of Conv, MatMul
  and Gemm only, as ModelOpt 0.47 places them: per-tensor activations, per-channel weights, float biases, the layers
  TensorRT's INT8 kernels do not suit left float (fewer than 16 channels or K/N, with ModelOpt's exceptions; a GEMV:
  a MatMul or Gemm whose output at batch 1 has fewer than 3 axes, one of them 1, as ModelOpt's check finds it, so a
  classifier head on a dynamic batch), the inputs of an Add fed by a quantized layer (a transformer's residual Add;
  all but one Conv branch, which TensorRT fuses), and on ``trt`` Q/DQ reading and writing the FP16/BF16 remainder
  directly (opset 19), so that a DequantizeLinear feeds its layer with no Cast between; TensorRT chooses its own
  fusions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec._graph import bodies_of, subgraph_nodes
from onnxprec._ops import is_default_domain
from onnxprec._options import first_match
from onnxprec._protobuf import structure_proto
from onnxprec.passes.fold_pad_into_conv import constant_value

__all__ = [
    "RUNTIMES",
    "STATIC_PASSTHROUGH_OPS",
    "WEIGHT_OPS",
    "Layer",
    "Plan",
    "batch_one_shapes",
    "depthwise",
    "pattern_names",
    "place",
]

logger = logging.getLogger(__name__)

RUNTIMES = ("ort-cpu", "ort-cuda", "trt")
WEIGHT_OPS = ("Conv", "MatMul", "Gemm")
STATIC_PASSTHROUGH_OPS = ("Add", "Mul", "Concat", "GlobalAveragePool", "AveragePool", "MaxPool")
"""Ops with a QLinear (or plain INT8) kernel on ONNX Runtime's CPU provider, joined to a static region."""
_ACTIVATIONS = ("Relu", "Clip")
_LAYOUT_OPS = frozenset({"Pad", "Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"})
_FLOAT = frozenset({ir.DataType.FLOAT})


@dataclass(eq=False)
class Layer:
    """One layer with a constant weight that gets INT8 weights."""

    node: ir.Node
    weight: ir.Value
    axis: int
    """The output-channel axis of the stored weight (MatMul 1, Gemm ``transB=1`` 0, Conv 0)."""
    dynamic: bool
    """Its activation is quantized by ``DynamicQuantizeLinear`` at run time (else with a calibrated range)."""
    float_output: bool = False
    """ort-cpu: a static pointwise Conv whose output no activation clips, computed as
    ``com.microsoft::MatMulIntegerToFloat`` (INT8 inputs, INT32 sums, float output): its output stays float."""

    @property
    def name(self) -> str:
        return str(self.node.name)

    @property
    def activation(self) -> ir.Value:
        value = self.node.inputs[0]
        assert value is not None
        return value

    @property
    def transposed(self) -> bool:
        """The stored weight is ``[N, K]`` (a Gemm with ``transB=1``)."""
        return self.node.op_type == "Gemm" and self.axis == 0


@dataclass
class Plan:
    """The placement: layers, the static activation tensors and the static ops without weights."""

    layers: list[Layer] = field(default_factory=list)
    static_tensors: list[ir.Value] = field(default_factory=list)
    passthrough: list[ir.Node] = field(default_factory=list)
    float_sourced: set[ir.Value] = field(default_factory=set)
    """The static tensors written by a float op: only the static ops read them through their Q/DQ, the float ops
    read the float value."""
    excluded: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    in_subgraphs: dict[str, int] = field(default_factory=dict)
    """Layers inside If/Loop/Scan bodies kept float (also in ``skipped``), by the op that owns the body."""
    in_branches: int = 0
    """Layers placed inside If branches (those calibration sees)."""

    @property
    def dynamic_groups(self) -> dict[ir.Value, list[Layer]]:
        """The dynamic layers by the activation they read (one DynamicQuantizeLinear each)."""
        groups: dict[ir.Value, list[Layer]] = {}
        for layer in self.layers:
            if layer.dynamic:
                groups.setdefault(layer.activation, []).append(layer)
        return groups


def _attr(node: ir.Node, name: str, default: float | int) -> float | int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _weight_layer(node: ir.Node) -> tuple[ir.Value | None, int, str]:
    """The node's constant weight and its output-channel axis, or None and why not."""
    if not is_default_domain(node.domain) or node.op_type not in WEIGHT_OPS:
        return None, 0, "not a Conv, MatMul or Gemm"
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None, 0, "missing input"
    activation, weight = node.inputs[0], node.inputs[1]
    if weight.const_value is None:
        return None, 0, "its weight is computed, not an initializer"
    if activation.const_value is not None:
        return None, 0, "its input is a constant"
    if weight.dtype not in _FLOAT or (activation.dtype is not None and activation.dtype not in _FLOAT):
        return None, 0, "not float32"
    shape = weight.const_value.shape
    if node.op_type == "Conv":
        if len(shape) < 3:
            return None, 0, "a Conv weight of rank < 3"
        return weight, 0, ""
    if len(shape) != 2:
        return None, 0, "its weight is not 2-D"
    if node.op_type == "Gemm":
        if _attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0:
            return None, 0, "a Gemm with transA, alpha or beta"
        if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].const_value is None:
            return None, 0, "a Gemm whose C is computed"
        return weight, 0 if _attr(node, "transB", 0) else 1, ""
    return weight, 1, ""


def pattern_names(node: ir.Node) -> list[str]:
    """What ``nodes_to_exclude`` / ``nodes_to_quantize`` match (``re.match``): the node's name and output names."""
    return [str(node.name or ""), *(str(v.name) for v in node.outputs if v.name)]


def _matches(node: ir.Node, patterns: Sequence[re.Pattern[str]]) -> str | None:
    return first_match(patterns, pattern_names(node))


def _through_layout(value: ir.Value | None, found: Callable[[ir.Value], bool]) -> ir.Value | None:
    """The first of ``value`` and the values it re-lays out (through Pad, Transpose, Reshape..., and an If whose
    branches each re-lay out the same value; at most 8 values) for which ``found`` holds; else None."""
    for _ in range(8):
        if value is None:
            return None
        if found(value):
            return value
        producer = value.producer()
        if producer is not None and producer.op_type == "If" and is_default_domain(producer.domain):
            value = _relaid_by_branches(producer, value)
            continue
        if producer is None or producer.op_type not in _LAYOUT_OPS or not is_default_domain(producer.domain):
            return None
        value = producer.inputs[0] if producer.inputs else None
    return None


def _relaid_by_branches(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The value of the enclosing graph that each branch of the If ``node`` only re-lays out into its output
    ``value`` (as Silero VAD v4 squeezes its audio in one branch and passes it on in the other), or None."""
    index = list(node.outputs).index(value)
    sources = set()
    for _, branch in bodies_of(node):
        result = branch.outputs[index] if index < len(branch.outputs) else None
        producer = result.producer() if result is not None else None
        if producer is None or producer.op_type not in _LAYOUT_OPS or not is_default_domain(producer.domain):
            return None
        sources.add(producer.inputs[0] if producer.inputs else None)
    return sources.pop() if len(sources) == 1 else None  # one value of the enclosing graph (a branch's own differ)


def _absorbed_activation(node: ir.Node) -> ir.Node | None:
    """The Relu, or Clip with a constant minimum of 0, that alone reads ``node``'s output."""
    out = node.outputs[0]
    users = list(out.uses())
    if len(users) != 1 or out.is_graph_output():
        return None
    user = users[0].node
    if not is_default_domain(user.domain) or user.op_type not in _ACTIVATIONS:
        return None
    if user.op_type == "Clip":
        low = constant_value(user.inputs[1]) if len(user.inputs) > 1 and user.inputs[1] is not None else None
        high = constant_value(user.inputs[2]) if len(user.inputs) > 2 and user.inputs[2] is not None else None
        if low is None or float(low) != 0.0 or (len(user.inputs) > 2 and user.inputs[2] is not None and high is None):
            return None
    return user


TRT_MIN_DIM = 16
"""TensorRT's INT8 Tensor Core kernels want 16 or more channels (Conv) or K and N (MatMul/Gemm); ModelOpt 0.47 leaves
smaller layers float (``find_nodes_from_convs_to_exclude``, ``find_nodes_from_matmul_to_exclude``), with the INT8
exceptions :func:`_trt_unsupported` copies."""


FP8_MAX_FILTER = 32
"""ModelOpt 0.47 leaves a Conv whose filter has more than this many taps (7x7) float in FP8."""


def _fp8_conv_unsupported(out_channels: int, in_channels: int, kernel: list[int]) -> str | None:
    """ModelOpt 0.47's FP8 rule: a Conv with 16 or fewer input (per group: every depthwise Conv) or output channels,
    or a filter of more than :data:`FP8_MAX_FILTER` taps, stays float (TensorRT's FP16 kernels are faster there)."""
    taps = int(np.prod(kernel)) if kernel else 1
    if out_channels <= TRT_MIN_DIM or in_channels <= TRT_MIN_DIM:
        return f"TensorRT FP8: a Conv of {in_channels} input / {out_channels} output channels per group stays float"
    if taps > FP8_MAX_FILTER:
        return f"TensorRT FP8: a Conv with a filter of {taps} taps (> {FP8_MAX_FILTER}) stays float"
    return None


Dims = tuple[int | None, ...]
_SHAPES_KEY = "onnxprec.batch_one_shapes"


def batch_one_shapes(
    model: ir.Model, names: Collection[str], input_shapes: str | Mapping[str, Sequence[int]] | None = None
) -> dict[str, Dims]:
    """The shapes of the main graph's values ``names`` as ModelOpt 0.47's GEMV check sees them (ONNX shape inference
    on the weight-stripped graph; a value it cannot infer is left out).

    Without ``input_shapes`` ModelOpt runs its first calibration step with each graph input's dynamic dimensions at 1
    (``get_input_shapes``) and splits the data along the first axis only, so the first dimension is 1 and the others
    keep the data's sizes (unknown here). With them (its ``calibration_shapes``) it sets every dynamic dimension to 1,
    then the given shapes. A dimension inference cannot follow is None, unless the graph declares it with the name of
    a graph input's dynamic first dimension (the batch): then it is 1 too.
    """
    from onnxprec.calibration import parse_input_shapes

    wanted = set(names)
    if not wanted:
        return {}
    given = parse_input_shapes(input_shapes)
    proto = structure_proto(model)
    inputs = {v.name for v in model.graph.inputs if not v.is_initializer()}
    batch_names: set[str] = set()
    for info in proto.graph.input:
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
        if info.name not in inputs:
            continue
        shape = given.get(info.name)
        for axis, dim in enumerate(dims):
            if shape is not None and len(shape) == len(dims):
                dim.Clear()
                dim.dim_value = shape[axis]
            elif not dim.HasField("dim_value") and (axis == 0 or given):
                batch_names.update([dim.dim_param] if axis == 0 and dim.dim_param else [])
                dim.Clear()
                dim.dim_value = 1
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # best effort: the graph's own shapes decide instead
        logger.info("TensorRT GEMV rule: shape inference at batch 1 failed (%s)", str(e).splitlines()[0][:200])
        return {}
    declared = {str(o.name): o.shape for n in model.graph for o in n.outputs if o.name in wanted}
    found: dict[str, Dims] = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
        if info.name in wanted and tensor is not None and tensor.HasField("shape"):
            own = declared.get(info.name)
            found[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") else 1 if _named(own, axis, batch_names) else None
                for axis, d in enumerate(tensor.shape.dim)
            )
    return found


def _named(shape: ir.Shape | None, axis: int, names: Collection[str]) -> bool:
    """Whether ``shape`` declares ``axis`` by one of ``names``."""
    dim = shape[axis] if shape is not None and axis < len(shape) else None
    return isinstance(dim, ir.SymbolicDim) and dim.value is not None and dim.value in names


def _gemv(node: ir.Node, at_batch_one: Dims | None) -> bool:
    """ModelOpt 0.47's GEMV rule for a layer with a constant weight: its output at batch 1 has fewer than 3 axes and
    one of them is 1 (a classifier head on a dynamic batch). Without that shape, the same rule on the shape the graph
    declares."""
    if at_batch_one is None:
        shape = node.outputs[0].shape
        at_batch_one = None if shape is None else tuple(d if isinstance(d, int) else None for d in shape)
    return at_batch_one is not None and len(at_batch_one) < 3 and 1 in at_batch_one


def _trt_unsupported(
    node: ir.Node, weight: ir.Value, axis: int, fp8: bool = False, at_batch_one: Dims | None = None
) -> str | None:
    """Why TensorRT runs this layer better in float, as ModelOpt 0.47's INT8 (``fp8``: FP8) placement decides it
    (None: quantized); ``at_batch_one``: the layer's output shape at batch 1 (:func:`batch_one_shapes`)."""
    assert weight.const_value is not None
    shape = [int(d) for d in weight.const_value.shape.numpy()]
    if node.op_type == "Conv" and fp8:
        return _fp8_conv_unsupported(shape[0], shape[1], shape[2:])
    if node.op_type == "Conv":
        out_channels, in_channels, kernel = shape[0], shape[1], shape[2:]
        if out_channels >= TRT_MIN_DIM and in_channels >= TRT_MIN_DIM:
            return None
        group = int(_attr(node, "group", 1))
        first_or_wide = max(out_channels, in_channels) >= TRT_MIN_DIM or any(
            v is not None and v.is_graph_input() for v in node.inputs
        )
        standard = group == 1 and (out_channels % 8 == 0 or in_channels % 8 == 0) and len(set(kernel)) == 1
        if standard and first_or_wide:
            return None
        if group > 1 and out_channels % 8 == 0 and all(k >= 3 for k in kernel):
            return None
        return f"TensorRT: a Conv of {in_channels} input / {out_channels} output channels per group stays float"
    k, n = (shape[1], shape[0]) if axis == 0 else (shape[0], shape[1])
    if k < TRT_MIN_DIM or n < TRT_MIN_DIM:
        return f"TensorRT: a GEMM with K={k}, N={n} (< {TRT_MIN_DIM}) stays float"
    if _gemv(node, at_batch_one):
        return "TensorRT: a GEMV at batch 1 (an output of 1 or 2 axes, one of them 1) stays float"
    return None


def _trt_rules(
    model: ir.Model, nodes: Sequence[ir.Node], fp8: bool, input_shapes: str | Mapping[str, Sequence[int]] | None
) -> Callable[[ir.Node, ir.Value, int], str | None]:
    """:func:`_trt_unsupported` for ``nodes``, each main-graph MatMul/Gemm judged on its output shape at batch 1
    (:func:`batch_one_shapes`: found once per model, names and shapes, and kept in ``model.meta``)."""
    heads = sorted(str(n.outputs[0].name) for n in nodes if n.op_type in ("MatMul", "Gemm") and n.graph is model.graph)
    key = (tuple(heads), repr(input_shapes))
    cached = model.meta.get(_SHAPES_KEY)
    if cached is not None and cached[0] == key:
        shapes = cached[1]
    else:
        shapes = batch_one_shapes(model, heads, input_shapes)
        model.meta[_SHAPES_KEY] = (key, shapes)
        missing = sum(1 for h in heads if h not in shapes)
        open_rows = sum(1 for d in map(shapes.get, heads) if d is not None and len(d) < 3 and None in d and 1 not in d)
        if missing or open_rows:
            logger.info(
                "TensorRT GEMV rule, of %d MatMul/Gemm outputs: %d without a shape at batch 1 (their declared shapes "
                "decide), %d of 1 or 2 axes with an unknown axis (taken as not 1)",
                len(heads),
                missing,
                open_rows,
            )

    def rule(node: ir.Node, weight: ir.Value, axis: int) -> str | None:
        return _trt_unsupported(node, weight, axis, fp8, shapes.get(str(node.outputs[0].name)))

    return rule


def depthwise(node: ir.Node) -> bool:
    """A Conv with one input channel per group."""
    weight = node.inputs[1]
    return (
        node.op_type == "Conv"
        and weight is not None
        and weight.const_value is not None
        and int(weight.const_value.shape.numpy()[1]) == 1
        and int(_attr(node, "group", 1)) > 1
    )


def pointwise(node: ir.Node) -> bool:
    """A Conv that is a matrix product per position: 1x1 kernel, one group, stride 1, no padding, 2-D or more."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type != "Conv" or weight is None or weight.const_value is None:
        return False
    shape = [int(d) for d in weight.const_value.shape.numpy()]
    attrs = node.attributes
    strides = attrs.get("strides")
    pads = attrs.get("pads")
    auto_pad = attrs.get("auto_pad")
    return (
        len(shape) >= 4
        and all(d == 1 for d in shape[2:])
        and int(_attr(node, "group", 1)) == 1
        and (strides is None or all(int(v) == 1 for v in strides.value))
        and (pads is None or all(int(v) == 0 for v in pads.value))
        and (auto_pad is None or auto_pad.value in ("NOTSET", "VALID", b"NOTSET", b"VALID"))
    )


def _read_only_by_layers(value: ir.Value) -> bool:
    """Whether only Conv/MatMul/Gemm nodes read ``value`` (not a graph output): an INT8 reader quantizes it once
    either way, so a float output gains nothing there and costs a QuantizeLinear (and, after a channels-last
    QLinearConv, a Transpose of its input)."""
    uses = list(value.uses())
    layers = all(use.node.op_type in ("Conv", "MatMul", "Gemm") for use in uses)
    return bool(uses) and layers and not value.is_graph_output()


def _kept_float(node: ir.Node, float_outputs: set[ir.Value]) -> str | None:
    """Why a static layer stays float on ort-cpu (None: it is quantized): it reads the model input, or it is a
    depthwise Conv that reads the output of a layer kept float (its INT8 kernel, with no sum over channels, is no
    faster than the float one, and its input would need a QuantizeLinear of its own)."""
    source = _through_layout(node.inputs[0], ir.Value.is_graph_input)
    if source is not None:
        return f"reads the model input '{source.name}'"
    if not depthwise(node):
        return None
    value = _through_layout(node.inputs[0], float_outputs.__contains__)
    if value is None:
        return None
    return f"a depthwise Conv reading the float '{value.name}'"


_LOOP_REASON = (
    "inside the {op} body of '{name}': kept float (a body that runs many times per run has no calibrated ranges; "
    "calibration sees the main graph and the If branches the data takes)"
)
_UNTAKEN_REASON = "inside the {branch} of If '{name}', which the calibration data never takes: kept float (no ranges)"
_VARYING_REASON = (
    "inside the {branch} of If '{name}', whose condition changes from batch to batch on the calibration data: kept "
    "float (calibrate on data that takes one branch)"
)


def _placed_nodes(
    graph: ir.Graph,
    plan: Plan,
    calibrated: Collection[tuple[str, str]] | None,
    varying: Collection[str],
) -> Iterator[ir.Node]:
    """The nodes the placement considers, each If branch calibration sees before its If (``calibrated``: the
    ``(If name, branch)`` pairs; None: every If branch, as placed before calibration); the layers of the other bodies
    go to ``plan.skipped``."""
    for node in graph:
        for attr_name, body in bodies_of(node):
            branch = node.op_type == "If" and is_default_domain(node.domain)
            if branch and (calibrated is None or (str(node.name), attr_name) in calibrated):
                yield from _placed_nodes(body, plan, calibrated, varying)
                continue
            if not branch:
                reason = _LOOP_REASON.format(op=node.op_type, name=node.name)
            elif str(node.name) in varying:
                reason = _VARYING_REASON.format(branch=attr_name, name=node.name)
            else:
                reason = _UNTAKEN_REASON.format(branch=attr_name, name=node.name)
            for inner in [*body, *(n for n, _ in subgraph_nodes(body))]:
                if _weight_layer(inner)[0] is not None:
                    plan.skipped.append((str(inner.name), reason))
                    plan.in_subgraphs[node.op_type] = plan.in_subgraphs.get(node.op_type, 0) + 1
        yield node


def place(
    model: ir.Model,
    runtime: str,
    *,
    activations: str = "auto",
    op_types_to_quantize: Sequence[str] | None = None,
    op_types_to_exclude: Sequence[str] = (),
    nodes_to_quantize: Sequence[re.Pattern[str]] = (),
    nodes_to_exclude: Sequence[re.Pattern[str]] = (),
    float_linear_outputs: bool = True,
    fp8: bool = False,
    calibrated: Collection[tuple[str, str]] | None = None,
    varying: Collection[str] = (),
    input_shapes: str | Mapping[str, Sequence[int]] | None = None,
) -> Plan:
    """The INT8 placement of ``model`` for ``runtime`` (see the module docstring).

    Args:
        model: The float model (names given, constants lifted).
        runtime: ``ort-cpu``, ``ort-cuda`` or ``trt``.
        activations: ``auto`` (ort-cpu: dynamic MatMul/Gemm, static Conv), ``static`` or ``dynamic`` (MatMul/Gemm).
        op_types_to_quantize: Only these op types (None: all supported).
        op_types_to_exclude: Never these op types.
        nodes_to_quantize: Only nodes whose name or output name matches (``re.match``) one of these (empty: all).
        nodes_to_exclude: Never nodes whose name or output name matches (``re.match``) one of these.
        float_linear_outputs: ort-cpu: a static pointwise Conv whose output no activation clips and a float op
            reads (a MobileNet's project Conv before a residual Add) writes a float output by
            ``MatMulIntegerToFloat``, so the residual stream stays float.
        fp8: FP8 on trt/ort-cuda: ModelOpt's FP8 rules for Convs (:func:`_fp8_conv_unsupported`) instead of INT8's.
        calibrated: The If branches whose tensors calibration sees, as ``(If name, branch attribute)``; the layers of
            the others (and of Loop/Scan bodies) stay float. None: every If branch (the placement before the data
            is read).
        varying: The If nodes whose condition changes across the calibration data (the reason their layers stay
            float).
        input_shapes: ModelOpt's ``calibration_shapes``, for the TensorRT GEMV rule (:func:`batch_one_shapes`).
    """
    plan = Plan()
    wanted_types = set(op_types_to_quantize) if op_types_to_quantize else None
    excluded_types = set(op_types_to_exclude)
    cpu = runtime == "ort-cpu"

    def allowed(node: ir.Node) -> bool:
        if wanted_types is not None and node.op_type not in wanted_types:
            return False
        if node.op_type in excluded_types:
            plan.excluded.append((str(node.name), f"op_types_to_exclude {node.op_type}"))
            return False
        pattern = _matches(node, nodes_to_exclude)
        if pattern is not None:
            plan.excluded.append((str(node.name), pattern))
            return False
        return not nodes_to_quantize or _matches(node, nodes_to_quantize) is not None

    float_outputs: set[ir.Value] = set()  # outputs of the layers the two float rules keep in float
    nodes = list(_placed_nodes(model.graph, plan, calibrated, varying))
    trt_rule = None if cpu or nodes_to_quantize else _trt_rules(model, nodes, fp8, input_shapes)
    for node in nodes:
        if node.op_type not in WEIGHT_OPS or not is_default_domain(node.domain):
            continue
        weight, axis, reason = _weight_layer(node)
        if weight is None:
            plan.skipped.append((str(node.name), reason))
            continue
        if not allowed(node):
            continue
        dynamic = node.op_type in ("MatMul", "Gemm") and (activations == "dynamic" or (activations == "auto" and cpu))
        if trt_rule is not None and (unsupported := trt_rule(node, weight, axis)) is not None:
            plan.skipped.append((str(node.name), f"{unsupported} (name it in nodes_to_quantize)"))
            continue
        kept = _kept_float(node, float_outputs) if cpu and not dynamic and not nodes_to_quantize else None
        if kept is not None:
            plan.skipped.append((str(node.name), f"{kept}: kept float (name it in nodes_to_quantize)"))
            float_outputs.add((_absorbed_activation(node) or node).outputs[0])
            continue
        linear = (cpu and float_linear_outputs and not dynamic and pointwise(node)
                  and _absorbed_activation(node) is None and not _read_only_by_layers(node.outputs[0]))  # fmt: skip
        plan.layers.append(Layer(node, weight, axis, dynamic, float_output=linear))
    if cpu:
        _static_region(nodes, plan, allowed)
    else:
        seen: set[ir.Value] = set()
        for layer in plan.layers:
            if layer.activation not in seen:
                seen.add(layer.activation)
                plan.static_tensors.append(layer.activation)
        _residual_adds(nodes, plan, allowed)
    plan.in_branches = sum(1 for layer in plan.layers if layer.node.graph is not model.graph)
    return plan


def _residual_adds(nodes: Sequence[ir.Node], plan: Plan, allowed: Callable[[ir.Node], bool]) -> None:
    """TensorRT-style: the inputs of an Add of two computed tensors, one of them written by a quantized layer (or its
    bias Add), get Q/DQ too, as ModelOpt places them: both for a transformer's residual Add, all but one Conv branch
    where a Conv writes one (TensorRT fuses the Add into that Conv). An Add of ``x`` and a pointwise function of
    ``x`` (:func:`_computed_from`: a tanh GELU's ``x + 0.044715 x³``) is part of an activation, not a residual Add,
    and stays float, as ModelOpt leaves it."""
    layers = {layer.node for layer in plan.layers}
    static = set(plan.static_tensors)

    def writer(value: ir.Value) -> ir.Node | None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Add" and len(producer.inputs) == 2:
            computed = [v for v in producer.inputs if v is not None and v.const_value is None]
            if len(computed) == 1:  # a bias Add
                producer = computed[0].producer()
        return producer if producer in layers else None

    for node in nodes:
        if node.op_type != "Add" or not is_default_domain(node.domain) or not allowed(node):
            continue
        inputs = [v for v in node.inputs if v is not None and v.const_value is None]
        if len(inputs) != 2 or any(v.dtype not in _FLOAT for v in inputs):
            continue
        writers = [writer(v) for v in inputs]
        a, b = inputs
        if all(w is None for w in writers) or _computed_from(a, b, layers) or _computed_from(b, a, layers):
            continue
        fused = next((v for v, w in zip(inputs, writers) if w is not None and w.op_type == "Conv"), None)
        for value in inputs:
            if value is not fused and value not in static:
                static.add(value)
                plan.static_tensors.append(value)


def _computed_from(value: ir.Value, source: ir.Value, layers: Collection[ir.Node], limit: int = 16) -> bool:
    """Whether ``value`` is computed from ``source`` by ops that are not ``layers`` nor Conv, MatMul or Gemm (within
    ``limit`` of them, walking back from ``value``): ``source + value`` is then ``x + f(x)`` with ``f`` pointwise,
    not a residual Add, whose branch passes through a layer."""
    frontier, seen = [value], 0
    while frontier and seen < limit:
        node = frontier.pop().producer()
        if node is None or node in layers or node.op_type in WEIGHT_OPS:
            continue
        seen += 1
        for computed in node.inputs:
            if computed is source:
                return True
            if computed is not None and computed.const_value is None:
                frontier.append(computed)
    return False


def _static_region(nodes: Sequence[ir.Node], plan: Plan, allowed: Callable[[ir.Node], bool]) -> None:
    """ort-cpu: the static tensors of the static layers, the passthrough ops joined to them, absorbed activations."""
    static_nodes = {layer.node for layer in plan.layers if not layer.dynamic}
    float_output = {layer.node for layer in plan.layers if layer.float_output}
    outputs_of: dict[ir.Node, ir.Value | None] = {}
    for node in nodes:
        if node in static_nodes:
            absorbed = _absorbed_activation(node)
            # QLinearConv writes INT8; QGemm and MatMulIntegerToFloat write float, so their outputs stay float
            quantized_output = node.op_type == "Conv" and node not in float_output
            outputs_of[node] = (absorbed or node).outputs[0] if quantized_output else None
    produced = {value: node for node, value in outputs_of.items() if value is not None}
    changed = True
    while changed:  # join passthrough ops whose every float input comes from the static region
        changed = False
        for node in nodes:
            if node in static_nodes or node.op_type not in STATIC_PASSTHROUGH_OPS or not is_default_domain(node.domain):
                continue
            inputs = [v for v in node.inputs if v is not None and v.const_value is None]
            if not inputs or any(v not in produced for v in inputs) or not allowed(node):
                continue
            if any(v.dtype not in _FLOAT for v in (*inputs, *node.outputs)):
                continue
            static_nodes.add(node)
            plan.passthrough.append(node)
            output = (_absorbed_activation(node) or node).outputs[0]
            outputs_of[node] = output
            produced[output] = node
            changed = True
    tensors: list[ir.Value] = []
    seen: set[ir.Value] = set()
    for node in nodes:
        if node not in static_nodes:
            continue
        values = [node.inputs[0]] if node.op_type in WEIGHT_OPS else list(node.inputs)
        for value in [*values, outputs_of[node]]:
            if value is not None and value.const_value is None and value not in seen and value.dtype in _FLOAT:
                seen.add(value)
                tensors.append(value)
    plan.static_tensors = tensors
    plan.float_sourced = {value for value in tensors if value not in produced}
    for layer in plan.layers:  # a MatMul whose input is already a static tensor reads it as it is
        if layer.dynamic and layer.activation in seen:
            layer.dynamic = False
