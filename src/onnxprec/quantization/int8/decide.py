"""INT8 decisions from calibration statistics, and the build that applies them to a copy of the float model.

:func:`decide` turns the statistics of one calibration pass into, per static tensor, a scale and zero point; per
dynamic input group, the outlier split and SmoothQuant scales
(:func:`~onnxprec.quantization.algorithms.smoothquant.decide_channels`); per layer, the weight's per-channel scales
and the bias correction. Decisions are keyed by names, so :func:`build` can apply them to any copy of the model,
with any set of layers left in float (the accuracy-target search builds several).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator, all_graphs, graph_of, insert_after_producer
from onnxprec._progress import progress
from onnxprec._tensors import float32_copy
from onnxprec.quantization.algorithms.int8 import (
    bias_correction,
    dequantize_weight,
    gptq_per_channel,
    quantize_weight,
)
from onnxprec.quantization.algorithms.qtypes import QType
from onnxprec.quantization.algorithms.ranges import activation_range, calibrated_range, quantization_noise
from onnxprec.quantization.algorithms.smoothquant import ChannelDecision, RunSample, decide_channels
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import LayerEntry
from onnxprec.quantization.int8.activations import activation_of
from onnxprec.quantization.int8.decisions import Decisions, LayerDecision, Statistics
from onnxprec.quantization.int8.fold_values import fold_into_values
from onnxprec.quantization.int8.integer_ops import (
    MergedLayer,
    bias_add_of,
    insert_dynamic,
    replace_group_with_matmul_integer,
    replace_with_matmul_integer,
    replace_with_matmul_integer_to_float,
)
from onnxprec.quantization.int8.place import Layer, Plan, depthwise, place
from onnxprec.quantization.int8.rewrite import (
    MS_DOMAIN,
    WeightRecipe,
    add_bias,
    add_initializer,
    feeds_a_body,
    fold_smoothing,
    gather_channels,
    insert_qdq,
    insert_split,
    keep_float_readers_float,
    quantize_bias,
    replace_bias,
    replace_weight,
)

__all__ = [
    "DEPTHWISE_MAX_NOISE",
    "Decisions",
    "LayerDecision",
    "Statistics",
    "build",
    "decide",
    "noisy_depthwise",
    "plan_for",
    "takes_int32_bias",
]

logger = logging.getLogger(__name__)

DEPTHWISE_MAX_NOISE = 0.008
"""A depthwise Conv whose input would lose more than this relative RMS error to its UINT8 grid (ort-cpu), or twice it
to a symmetric INT8 grid (trt, ort-cuda: half its levels cover an activation's non-negative output), on the
calibration data stays float (:func:`noisy_depthwise`); the inputs it was set between: experiments/design_notes.md,
"INT8 placement"."""


EQUALIZE_MIN_SPREAD = 16.0
"""ort-cpu: a channel of a float-written Conv input whose largest magnitude is this many times below the input's
largest keeps fewer than 256 / 16 UINT8 levels (:func:`equalized_inputs`)."""
EQUALIZE_MIN_SHARE = 0.02
"""... and when such channels carry at least this share of the Conv's output (``(max|x_c| * ||W[:, c]||)^2``), the
channels are equalized; the shares it was set between: experiments/design_notes.md, "INT8 placement"."""


def plan_for(
    model: ir.Model,
    options: Int8Options,
    extra_excluded: Collection[str] = (),
    calibrated: Collection[tuple[str, str]] | None = None,
    varying: Collection[str] = (),
) -> Plan:
    """The placement with the options' selection, plus ``extra_excluded`` node names kept in float; ``calibrated``
    and ``varying``: the If branches calibration saw (:func:`~onnxprec.quantization.int8.place.place`)."""
    import re

    patterns = [*options.exclude_patterns, *(re.compile(f"^{re.escape(name)}$") for name in extra_excluded)]
    return place(
        model,
        options.runtime,
        activations=options.activations,
        op_types_to_quantize=options.op_types_to_quantize,
        op_types_to_exclude=options.op_types_to_exclude or (),
        nodes_to_quantize=options.include_patterns,
        nodes_to_exclude=patterns,
        float_linear_outputs=options.float_linear_outputs and options.activation_qtype.bits == 8,  # MatMulInteger..
        fp8=options.weight_qtype.is_float,
        calibrated=calibrated,
        varying=varying,
        input_shapes=options.input_shapes,
    )


def _matrix(layer: Layer) -> np.ndarray:
    """The float32 weight as the quantized layer reads it (``[K, N]`` for MatMul/Gemm), mapping released."""
    tensor = layer.weight.const_value
    assert tensor is not None
    return float32_copy(tensor, transposed=layer.transposed)


def _bias(node: ir.Node) -> np.ndarray | None:
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is None or value.const_value is None:
        return None
    return np.asarray(value.const_value.numpy(), dtype=np.float64).reshape(-1)


def _conv_correction(node: ir.Node, mean_x: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """``[M]`` mean output shift of a Conv whose weight changed by ``delta`` ``[M, C/g, ...]``, for input channel
    means ``mean_x`` ``[C]`` (zero padding at the borders ignored)."""
    groups_attr = node.attributes.get("group")
    groups = int(groups_attr.value) if groups_attr is not None else 1
    m, per_group = delta.shape[0], delta.shape[1]
    summed = delta.reshape(m, per_group, -1).sum(axis=2)  # [M, C/g]
    out_per_group = m // groups
    channels = (np.arange(m) // out_per_group)[:, None] * per_group + np.arange(per_group)[None, :]
    return -(summed * mean_x[channels]).sum(axis=1)


def decide(model: ir.Model, plan: Plan, stats: Statistics, options: Int8Options) -> Decisions:
    """Scales of the static tensors, per-group channel decisions and per-layer weight recipes."""
    decisions = Decisions()
    qtype = options.activation_qtype
    ranges: dict[str, tuple[float, float]] = {}
    for value in plan.static_tensors:
        hist = stats.histograms.get(str(value.name))
        if hist is None:
            continue
        lo, hi = calibrated_range(hist, options.method, symmetric=qtype.symmetric, percentile=options.percentile)
        saturating = activation_of(value) if options.method in ("mse", "entropy", "percentile") else None
        if saturating is not None:  # read by a saturating activation only: the range that serves its output
            lo, hi = activation_range(
                hist, saturating, min(hist.min, 0.0), max(hist.max, 0.0), symmetric=qtype.symmetric
            )
        ranges[str(value.name)] = lo, hi
        decisions.tensors[str(value.name)] = qtype.scale_zero_point(lo, hi)
        wide = options.wide_qtype
        if wide is not None:
            decisions.wide[str(value.name)] = wide.scale_zero_point(*calibrated_range(hist, symmetric=wide.symmetric))
            decisions.noise[str(value.name)] = quantization_noise(hist, lo, hi, symmetric=qtype.symmetric)
    if not options.include_patterns and not qtype.is_float and qtype.bits == 8:  # the noise is the 8-bit grid's
        decisions.kept_float = noisy_depthwise(plan, stats, ranges, qtype.symmetric)
    if options.runtime == "ort-cpu" and qtype.bits == 8:
        decisions.equalized = equalized_inputs(plan, stats)
        for layer_name, factors in decisions.equalized.items():
            name = str(next(layer for layer in plan.layers if layer.name == layer_name).activation.name)
            top = float(np.max(stats.channels.absmax(name) / factors))  # every channel's maximum (inputs >= 0)
            decisions.tensors[name] = qtype.scale_zero_point(0.0, top)
    groups = plan.dynamic_groups
    for activation, layers in progress(groups.items(), "INT8 decisions", "input"):
        _decide_group(activation, layers, stats, options, decisions)
    for layer in plan.layers:
        if not layer.dynamic:
            _decide_static(layer, stats, options, decisions)
    return decisions


def equalized_inputs(plan: Plan, stats: Statistics) -> dict[str, np.ndarray]:
    """The static Convs (one group) whose non-negative input, written by a float op and read by that Conv alone, has
    channels that per-tensor UINT8 leaves few levels (:data:`EQUALIZE_MIN_SPREAD`) and that carry a share of the
    output (:data:`EQUALIZE_MIN_SHARE`), with the factors ``s`` that equalize the channels' largest magnitudes.

    The build divides the input by ``s`` per channel before its QuantizeLinear (a Mul) and multiplies the weight's
    input channels by ``s``, which is exact in float; every channel then spans the whole UINT8 grid. Per-tensor
    levels over such an input round its small channels to a few levels or to 0 (the magnitudes of an STFT's
    frequencies, whose maxima lie far apart).
    """
    found = {}
    for layer in plan.layers:
        value, node = layer.activation, layer.node
        name = str(value.name)
        group = node.attributes.get("group")
        if layer.dynamic or node.op_type != "Conv" or (group is not None and int(group.value) != 1):
            continue
        if value not in plan.float_sourced or len(value.uses()) != 1 or value.is_graph_output():
            continue
        hist = stats.histograms.get(name)
        if name not in stats.channels.counts or layer.weight.const_value is None or hist is None or hist.min < 0:
            continue  # non-negative inputs only (magnitudes: after Sqrt, Abs, Relu), until measured more widely
        top = np.asarray(stats.channels.absmax(name), dtype=np.float64)
        live = top[top > 0]
        weight = np.asarray(layer.weight.const_value.numpy(), dtype=np.float64)
        if top.shape[0] != weight.shape[1] or live.size < 2:
            continue
        share = (top * np.sqrt(np.sum(weight**2, axis=(0, *range(2, weight.ndim))))) ** 2
        small = top < top.max() / EQUALIZE_MIN_SPREAD
        if share.sum() <= 0 or share[small].sum() / share.sum() < EQUALIZE_MIN_SHARE:
            continue
        target = float(np.exp(np.mean(np.log(live))))
        found[layer.name] = np.where(top > 0, top / target, 1.0)
    return found


def noisy_depthwise(
    plan: Plan, stats: Statistics, ranges: dict[str, tuple[float, float]], symmetric: bool = False
) -> dict[str, str]:
    """The static depthwise Convs whose input's noise on its grid (UINT8; ``symmetric``: INT8) on the calibration
    data passes :data:`DEPTHWISE_MAX_NOISE`, with the reason each stays float.

    A depthwise Conv has no sum over channels: its INT8 kernel saves little, but it quantizes two tensors (its
    input and output). After an unbounded activation (hardswish, as in PP-OCR's PP-LCNetV3) those tensors are heavy
    tailed: the levels go to a few large values and the bulk keeps a handful of them, whatever the clipping method.
    """
    kept = {}
    for layer in plan.layers:
        name = str(layer.activation.name)
        hist = stats.histograms.get(name)
        if layer.dynamic or not depthwise(layer.node) or hist is None or name not in ranges:
            continue
        noise = quantization_noise(hist, *ranges[name], symmetric=symmetric)
        bound = DEPTHWISE_MAX_NOISE * (2 if symmetric else 1)  # half the levels cover an activation's output
        if noise > bound:
            kept[layer.name] = (
                f"a depthwise Conv whose input '{name}' would lose {noise:.3f} (relative RMS) to "
                f"{'INT8' if symmetric else 'UINT8'} (> {bound:g}): kept float (name it in nodes_to_quantize)"
            )
    return kept


def _entry(layer: Layer, shape: tuple[int, ...]) -> LayerEntry:
    return LayerEntry(layer.name, layer.node.op_type, "dynamic" if layer.dynamic else "static",
                      str(layer.weight.name), list(shape))  # fmt: skip


def _decide_group(
    activation: ir.Value, layers: list[Layer], stats: Statistics, options: Int8Options, decisions: Decisions
) -> None:
    name = str(activation.name)
    weights = [_matrix(layer) for layer in layers]
    k = weights[0].shape[0]
    channel = ChannelDecision()
    wants = options.smoothquant or options.outlier_channels > 0
    if wants and stats.samples.has(name):
        runs, mins, maxs = stats.samples.run_extremes(name)
        sample = RunSample(stats.samples.sample(name), runs, mins, maxs)
        if sample.rows.shape[1] == k and sample.rows.shape[0] >= 2:
            channel = decide_channels(
                sample,
                weights,
                stats.channels.absmax(name),
                split=options.outlier_channels > 0,
                max_split=options.outlier_channels,
                smooth=options.smoothquant,
            )
    decisions.groups[name] = channel
    rows = channel.weight_rows(k)
    factors = channel.factors(k)
    mean_x = stats.channels.mean(name) * factors if name in stats.channels.counts else None
    for layer, weight in zip(layers, weights):
        scaled = weight * rows.astype(np.float32)[:, None]
        q, scales = quantize_weight(scaled, axis=1)
        recipe = WeightRecipe(layer.weight.const_value, 1, scales, transpose=layer.transposed,  # type: ignore[arg-type]
                              rows=None if np.all(rows == 1) else rows)  # fmt: skip
        entry = _entry(layer, weight.shape)
        entry.outlier_channels, entry.alpha = int(channel.split.size), channel.alpha
        entry.info.update({f"sample_error_{k_}": v for k_, v in channel.errors.items()})
        decision = LayerDecision(recipe, True, entry=entry)
        if channel.split.size:
            decision.split_rows = weight[channel.split]
        if options.bias_correction and mean_x is not None:
            decision.bias = bias_correction(mean_x, scaled, dequantize_weight(q, scales, axis=1))
            entry.bias_corrected = True
        decisions.layers[layer.name] = decision
    del weights


def _gptq(weight: np.ndarray, hessian: np.ndarray, conv: bool, damp: float,
          qtype: QType) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """GPTQ levels and scales of a Conv ``[M, C/g, kh, kw]`` (``g`` Hessians) or MatMul ``[K, N]`` weight; FP8's on
    the grid of each channel's round-to-nearest scale (:meth:`QType.quantize_weight`, aligned)."""
    groups, m, fp8 = hessian.shape[0], weight.shape[0 if conv else 1], (qtype if qtype.is_float else None)
    grid = None if fp8 is None else qtype.quantize_weight(weight, axis=0 if conv else 1)[1].reshape(groups, -1)
    if not conv:
        q, scales = gptq_per_channel(weight[None], hessian, damp=damp, scales=grid, qtype=fp8)
        return q[0], scales[0]
    per_group = weight.reshape(groups, m // groups, -1).transpose(0, 2, 1)  # [G, K, M/G]
    q, scales = gptq_per_channel(per_group, hessian, damp=damp, scales=grid, qtype=fp8)
    return q.transpose(0, 2, 1).reshape(weight.shape), scales.reshape(m)


def _decide_static(layer: Layer, stats: Statistics, options: Int8Options, decisions: Decisions) -> None:
    weight = _matrix(layer)
    conv = layer.node.op_type == "Conv"
    gemm = layer.node.op_type == "Gemm"  # stays a Gemm: its weight keeps its stored layout
    axis = 0 if conv else 1
    name = str(layer.activation.name)
    hessian = stats.hessians.hessians.get(name)
    equalized = decisions.equalized.get(layer.name)
    if equalized is not None:  # the layer reads x / s: its weight is W * s, its Hessian that of x / s
        weight = weight * equalized.astype(np.float32).reshape(1, -1, *[1] * (weight.ndim - 2))
        if hessian is not None:
            d = np.repeat(equalized, int(np.prod(weight.shape[2:], dtype=np.int64)))
            hessian = hessian / np.outer(d, d)
    k = hessian.shape[-1] if hessian is not None else 0
    groups_match = hessian is not None and (not conv or hessian.shape[0] * k == weight[0].size * _groups(layer.node))
    entry = _entry(layer, weight.shape)
    qtype = options.weight_qtype
    gptq = qtype.name in ("int8", "fp8") and hessian is not None and groups_match
    if gptq and stats.hessians.sampled[name] >= k:
        q, scales = _gptq(weight, hessian, conv, options.damp, qtype)  # type: ignore[arg-type]
        levels: np.ndarray | None = q.T if gemm and layer.transposed else q
        entry.info["rounding"] = "gptq"
    else:
        q, scales = qtype.quantize_weight(weight, axis=axis)
        levels = None
        entry.info["rounding"] = "rtn"
    source = layer.weight.const_value
    assert source is not None
    recipe = WeightRecipe(source, layer.axis if gemm else axis, scales, transpose=layer.transposed and not gemm,
                          levels=levels, qtype=qtype, inputs=equalized)  # fmt: skip
    decision = LayerDecision(recipe, False, entry=entry)
    if layer.float_output:
        entry.info["output"] = "float (MatMulIntegerToFloat)"
    if layer.float_output and options.two_part_weights and entry.info["rounding"] == "rtn":
        # too few calibration rows for GPTQ: the rounding error goes into a second INT8 part, and the float bias needs
        # no correction
        residual = (weight - dequantize_weight(q, scales, axis=0)).reshape(weight.shape[0], -1)
        residual_q, residual_scales = quantize_weight(residual, axis=0)
        decision.residual = (residual_q, residual_scales)
        decision.bias = _bias(layer.node)
        entry.info["rounding"] = "rtn, two INT8 parts"
        return _store(decisions, layer, decision)
    mean_x = stats.channels.mean(name) if name in stats.channels.counts else None
    if mean_x is not None and equalized is not None:
        mean_x = mean_x / equalized
        entry.info["equalized_spread"] = float(equalized.max() / equalized.min())
    bias = _bias(layer.node)
    if options.bias_correction and mean_x is not None:
        delta = dequantize_weight(q, scales, axis=axis).astype(np.float64) - weight
        if conv and mean_x.shape[0] == weight.shape[1] * _groups(layer.node):
            correction = _conv_correction(layer.node, mean_x, delta)
            bias = correction if bias is None else bias + correction
            entry.bias_corrected = True
        elif not conv and mean_x.shape[0] == weight.shape[0]:
            correction = -(mean_x @ delta)
            if gemm:
                bias = correction if bias is None else bias + correction
            else:
                decision.bias = correction
            entry.bias_corrected = True
    if conv or gemm:
        decision.bias = bias
    _store(decisions, layer, decision)


def _store(decisions: Decisions, layer: Layer, decision: LayerDecision) -> None:
    decisions.layers[layer.name] = decision


def _groups(node: ir.Node) -> int:
    attr = node.attributes.get("group")
    return int(attr.value) if attr is not None else 1


def _mergeable(layers: list[Layer], decisions: Decisions) -> list[MergedLayer]:
    """The group's MatMuls as :class:`MergedLayer` (with the constant ``[N]`` bias Add that alone reads a product, if
    any), if there are two or more and all are MatMuls with ``[K, N]`` weights; else ``[]``."""
    merged = []
    for layer in layers:
        decision = decisions.layers[layer.name]
        if layer.node.op_type != "MatMul" or len(decision.recipe.shape()) != 2:
            return []
        add = bias_add_of(layer.node, decision.recipe.shape()[1])
        merged.append(MergedLayer(layer.node, decision.recipe, add, decision.bias, decision.split_rows))
    return merged if len(merged) > 1 else []


def _equalize(plan: Plan, decisions: Decisions, names: NameAllocator) -> dict[ir.Value, str]:
    """Divides the input of each equalized layer by its factors (a Mul the layer alone reads, which takes the input's
    place among the static tensors). Returns the name of the input each Mul output stands for."""
    renamed = {}
    for layer in plan.layers:
        factors = decisions.equalized.get(layer.name)
        value = layer.activation
        if factors is None or layer.dynamic or value not in plan.static_tensors:
            continue
        graph = graph_of(value, [layer.node])
        assert layer.weight.const_value is not None
        shape = (1, -1, *[1] * (len(layer.weight.const_value.shape) - 2))  # [1, C, 1...] as the Conv's input
        inverse = add_initializer(
            graph, names(f"{layer.name}_equalize"), (1 / factors).astype(np.float32).reshape(shape)
        )
        out = ir.Value(name=names(f"{value.name}_equalized"), type=value.type, shape=value.shape)
        mul = ir.Node("", "Mul", [value, inverse], outputs=[out], name=names.node(f"{layer.name}_equalize"))
        insert_after_producer(graph, value, [mul])
        layer.node.replace_input_with(0, out)
        plan.static_tensors[plan.static_tensors.index(value)] = out
        renamed[out] = str(value.name)
    return renamed


def takes_int32_bias(
    layer: Layer, decision: LayerDecision, params: tuple[float, int] | None, options: Int8Options
) -> bool:
    """Whether the build gives ``layer`` an INT32 bias: on ort-cpu, a static Conv/Gemm with a calibrated input that
    keeps a quantized output (QLinearConv, QGemm); TensorRT takes float biases, MatMulIntegerToFloat a float one."""
    return (
        options.runtime == "ort-cpu"
        and options.activation_qtype.bits == 8  # 16-bit activations: no QLinear kernel, the float bias stays
        and layer.node.op_type in ("Conv", "Gemm")
        and not layer.dynamic
        and not layer.float_output
        and params is not None
        and decision.bias is not None
        and decision.bias.ndim == 1
    )


def build(
    model: ir.Model,
    options: Int8Options,
    decisions: Decisions,
    float_layers: Collection[str] = (),
    *,
    merge_groups: bool = True,
) -> Plan:
    """Applies the decisions to ``model`` (a copy of the sanitized float model), ``float_layers`` left in float.

    The MatMuls of a dynamic group become one layer (:func:`replace_group_with_matmul_integer`) unless
    ``merge_groups`` is False (the same values, layer by layer).

    Returns:
        The placement that was applied.
    """
    plan = plan_for(model, options, [*float_layers, *decisions.kept_float], decisions.calibrated_branches,
                    decisions.varying_branches)  # fmt: skip
    names = NameAllocator(model)
    inputs = {layer.name: str(layer.activation.name) for layer in plan.layers}  # before the rewrites rewire them
    group_names = {id(activation): str(activation.name) for activation in plan.dynamic_groups}  # before any rename
    decisions, folded = fold_into_values(plan, decisions, names)
    static_nodes = {layer.node for layer in plan.layers if not layer.dynamic} | set(plan.passthrough)
    renamed = _equalize(plan, decisions, names)
    graphs = list(all_graphs(model.graph))
    read = [(graph, name) for graph in graphs for name, value in graph.initializers.items() if value.uses()]
    for value in list(plan.static_tensors):
        params = decisions.tensors.get(renamed.get(value, str(value.name)))
        if params is None:
            plan.static_tensors.remove(value)
            continue
        # a float op reads a tensor a float op wrote as it is (a residual stream kept float by MatMulIntegerToFloat)
        static = value in plan.float_sourced
        readers = [node for node, _ in value.uses() if (node in static_nodes or not static) and not feeds_a_body(node)]
        if not readers:
            plan.static_tensors.remove(value)
            continue
        qtype = options.activation_qtype
        if str(value.name) in decisions.widened and options.wide_qtype is not None:
            params, qtype = decisions.wide[str(value.name)], options.wide_qtype
        insert_qdq(graph_of(value, readers), value, params[0], params[1], qtype=qtype, names=names,
                   readers=set(readers).__contains__)  # fmt: skip
    gathered: dict[str, ir.Value] = {}
    dynamic: dict[str, tuple[ir.Value, ir.Value, ir.Value]] = {}
    merged: set[str] = set()
    for activation, layers in plan.dynamic_groups.items():
        layers = [layer for layer in layers if layer.name in decisions.layers]
        if not layers:
            continue
        key = group_names[id(activation)]  # the name before a fold renamed the activation
        channel = decisions.groups.get(key, ChannelDecision())
        k = decisions.layers[layers[0].name].recipe.shape()[0]
        factors = channel.factors(k) if channel.split.size or channel.scales is not None else None
        if key in folded:
            factors = None
        nodes = {layer.node for layer in layers}
        graph = graph_of(activation, nodes)
        own = graph_of(activation)  # a folded factor changes the op that writes the activation
        if factors is not None and not channel.split.size and fold_smoothing(own, activation, factors, nodes, names):
            factors = None
        dynamic[key] = insert_dynamic(graph, activation, names, factors)
        if channel.split.size:
            gathered[key] = gather_channels(graph, activation, channel.split, names)
        group = _mergeable(layers, decisions) if merge_groups else []
        if group:
            replace_group_with_matmul_integer(graph, group, dynamic[key], gathered.get(key), names)
            merged.update(layer.name for layer in layers)
    for layer in plan.layers:
        decision = decisions.layers.get(layer.name)
        if decision is None or layer.name in merged:
            continue
        params = decisions.tensors.get(inputs[layer.name])
        wide_input = inputs[layer.name] in decisions.widened  # a 16-bit input: no QLinear kernel, a float bias
        int32_bias = not wide_input and takes_int32_bias(layer, decision, params, options)
        graph = graph_of(layer.activation, [layer.node])  # the layer's own graph (an If branch's, or the main one)
        if layer.float_output and params is not None and not wide_input:
            replace_with_matmul_integer_to_float(
                graph, layer.node, decision.recipe, decision.bias, names, residual=decision.residual
            )
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            continue
        if layer.dynamic:
            product = replace_with_matmul_integer(
                graph, layer.node, decision.recipe, dynamic[inputs[layer.name]], names
            )
        else:
            recipe = decision.recipe
            if int32_bias:
                recipe = recipe.fitting_bias(decision.bias, params[0])  # type: ignore[arg-type,index]
            product = replace_weight(graph, layer.node, recipe, names)
        if layer.node.op_type in ("Conv", "Gemm") and not layer.dynamic:
            if int32_bias:
                quantize_bias(graph, product, decision.bias, params[0], recipe.scales, names)  # type: ignore[arg-type,index]
            elif decision.bias is not None:
                replace_bias(graph, product, decision.bias, names)
            continue
        if decision.bias is not None:  # first: merged into the bias Add when there is one
            add_bias(graph, product, decision.bias, names)
        if decision.split_rows is not None:
            insert_split(graph, product, gathered[inputs[layer.name]], decision.split_rows, names)
    for graph in graphs:
        keep_float_readers_float(graph, names)
    for graph, name in read:  # weights and biases that nothing reads any more (replaced by their INT8 or merged forms)
        initializer = graph.initializers.get(name)
        if initializer is not None and not initializer.uses() and not initializer.is_graph_output():
            graph.initializers.pop(name)
    return plan
