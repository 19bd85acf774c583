"""The INT8 emulation session of the float fallback: every set of layers kept in float is a set of boolean inputs.

:class:`Int8Emulator` builds, once, the float model with every quantization of the all-INT8 build behind a switch:

- each static tensor's ``QuantizeLinear -> DequantizeLinear`` (its calibrated range), one ``Where`` per reader, so
  that a configuration can quantize it for the readers the real build would (all of them, or only the static ops
  where a float op wrote it);
- each layer's INT8 twin: the same op with the decided INT8 weight, dequantized (GPTQ levels, the INT32-bias scale
  fit, a second INT8 part and bias correction included), reading the layer's input as the float op does (a static
  layer) or through ``[Mul(1/s)] -> DynamicQuantizeLinear -> DequantizeLinear`` (a dynamic one, SmoothQuant factors
  included; its outlier channels added back in float), and ``Where(switch, twin, float)`` in place of its output.

A configuration (the layers kept in float) sets the switches as the real build places it (:func:`~onnxprec.
quantization.int8.decide.plan_for` with those layers excluded, milliseconds); trying it is one ``session.run`` per
calibration batch, never a build or a session. With every switch off the outputs are the float model's, bit for
bit; with the all-INT8 configuration they are the Q/DQ model's up to float rounding. Not emulated: the fused
integer kernels' own arithmetic (requantization); the search
(:func:`onnxprec.quantization.int8.fallback.search`) scales its verdicts to the real error of the all-INT8 model
(:class:`~onnxprec.accuracy.ErrorScale`) and checks its choice for real.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Sequence

import numpy as np
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._graph import NameAllocator
from onnxprec._report import timed
from onnxprec.accuracy import AccuracyTarget, Measurement, ReferenceOutputs, measure_outputs
from onnxprec.quantization.algorithms.smoothquant import ChannelDecision
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8.decide import Decisions, LayerDecision, plan_for, takes_int32_bias
from onnxprec.quantization.int8.place import Layer, Plan
from onnxprec.quantization.int8.rewrite import add_initializer, int32_bias

__all__ = ["Int8Emulator", "emulated_layer"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT


def emulated_layer(
    layer: Layer, decision: LayerDecision, decisions: Decisions, options: Int8Options
) -> tuple[np.ndarray, np.ndarray | None]:
    """The layer's INT8 weight dequantized, in the layout the float node reads (a Gemm's stored layout), and the bias
    a static Conv/Gemm reads (its INT32 levels dequantized on ort-cpu, as QLinearConv and QGemm take it; None for
    the others, whose bias correction is added to the product)."""
    recipe = decision.recipe
    params = decisions.tensors.get(str(layer.activation.name))
    node = layer.node
    static_bias = node.op_type in ("Conv", "Gemm") and not layer.dynamic and decision.bias is not None
    bias = decision.bias.astype(np.float32) if static_bias and decision.bias is not None else None
    if takes_int32_bias(layer, decision, params, options):
        assert params is not None and decision.bias is not None
        recipe = recipe.fitting_bias(decision.bias, params[0])  # as the build does before its INT32 bias
        levels, scales = int32_bias(decision.bias, params[0], recipe.scales)
        bias = (levels * scales).astype(np.float32)
    quantized = recipe.quantized().astype(np.float32)
    shape = [1] * quantized.ndim
    shape[recipe.axis] = -1
    weight = quantized * recipe.scales.astype(np.float32).reshape(shape)
    if decision.residual is not None:
        residual_q, residual_scales = decision.residual
        second = residual_q.astype(np.float32) * residual_scales.astype(np.float32)[:, None]
        weight = weight + second.reshape(weight.shape)
    return np.ascontiguousarray(weight.T if recipe.transpose else weight, dtype=np.float32), bias


class Int8Emulator:
    """The float model with a switchable emulated INT8 twin per layer; one ORT session for every configuration.

    Args:
        model: The sanitized float model (unchanged: a clone is rewritten).
        plan: Its placement (the layers, by node name).
        decisions: The INT8 decisions (not those of a build: SmoothQuant scales stay on the layer's input).
        options: The INT8 options.
        layers: The names of the layers that get a switch (the others stay float).
        providers: ONNX Runtime providers.
    """

    SWITCH = "__onnxprec_int8_{}"
    EDGE = "__onnxprec_int8_qdq_{}"

    def __init__(
        self,
        model: ir.Model,
        plan: Plan,
        decisions: Decisions,
        options: Int8Options,
        layers: Sequence[str],
        providers: Sequence[str] | None = None,
    ) -> None:
        self.layers = list(layers)
        self.model, self.options, self.decisions = model, options, decisions
        with timed() as clock:
            clone = self._emulation_model(plan)
            self._stack = contextlib.ExitStack()
            payload, folder = self._stack.enter_context(_ort.ort_model(clone))
            del clone
            self.session = _ort.create_session(
                payload, providers=providers, optimization="basic", external_data_folder=folder,
                what="the INT8 emulation model", spinning=False,
            )  # fmt: skip
        self.runs = 0
        logger.info(
            "INT8 emulation session: %d switchable layers, %d quantized tensor reads (%.1f s)",
            len(self.switches),
            len(self.edges),
            clock.seconds,
        )

    def _emulation_model(self, plan: Plan) -> ir.Model:
        """A clone of the model with a quantized twin of every layer, chosen by its switch input (``switches``), and
        the static tensors' quantized reads (``edges``)."""
        model, options, decisions = self.model, self.options, self.decisions
        clone = model.clone()
        graph = clone.graph
        nodes = {str(node.name): node for node in graph}
        names = NameAllocator(clone)
        self.edges: dict[tuple[str, str, int], str] = {}  # (static tensor, reader node, input slot) -> switch
        for value in plan.static_tensors:
            params = decisions.tensors.get(str(value.name))
            twin = _clone_value(graph, nodes, value)
            if params is None or twin is None:
                continue
            self._quantize_tensor(graph, twin, params, names)
        by_name = {layer.name: layer for layer in plan.layers}
        dynamic_inputs: dict[str, ir.Value] = {}  # activation name -> its dynamic quantization (shared)
        self.switches: dict[str, str] = {}
        for index, name in enumerate(self.layers):
            layer, decision, node = by_name.get(name), decisions.layers.get(name), nodes.get(name)
            if layer is None or decision is None or node is None or node.inputs[0] is None:
                continue
            x = node.inputs[0]
            if layer.dynamic:
                key = str(layer.activation.name)
                if key not in dynamic_inputs:
                    dynamic_inputs[key] = self._dynamic_input(graph, node, layer, decisions, names)
                x = dynamic_inputs[key]
            switch = ir.Value(name=self.SWITCH.format(index), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
            self._twin(graph, node, layer, decision, decisions, options, x, switch, names)
            graph.inputs.append(switch)
            self.switches[name] = str(switch.name)
        graph.sort()
        self.outputs = [str(v.name) for v in graph.outputs]
        return clone

    def close(self) -> None:
        """Releases the session and the temporary files."""
        self.session = None  # type: ignore[assignment]
        self._stack.close()

    def __enter__(self) -> Int8Emulator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def feeds(self, floats: Collection[str]) -> dict[str, np.ndarray]:
        """The switch inputs of a configuration: the layers ``floats`` in float, the quantized tensors those the real
        build quantizes then (the placement with ``floats`` excluded)."""
        chosen = set(floats)
        plan = plan_for(self.model, self.options, chosen)
        static = {str(v.name) for v in plan.static_tensors if str(v.name) in self.decisions.tensors}
        sourced = {str(v.name) for v in plan.float_sourced}
        static_nodes = {layer.name for layer in plan.layers if not layer.dynamic}
        static_nodes |= {str(node.name) for node in plan.passthrough}
        feeds = {
            switch: np.array(tensor in static and (tensor not in sourced or reader in static_nodes))
            for (tensor, reader, _), switch in self.edges.items()
        }
        placed = {layer.name for layer in plan.layers}
        feeds.update({switch: np.array(name in placed) for name, switch in self.switches.items()})
        return feeds

    def run(self, floats: Collection[str]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """A function running one batch with the layers ``floats`` in float, every other switchable one INT8."""
        switches = self.feeds(floats)

        def one(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.runs += 1
            return dict(zip(self.outputs, self.session.run({**batch, **switches}, self.outputs)))

        return one

    def measure(self, floats: Collection[str], target: AccuracyTarget, reference: ReferenceOutputs) -> Measurement:
        """The emulated model with ``floats`` in float against the kept float outputs, every calibration batch."""
        return measure_outputs(target, reference, self.run(floats))

    # -----------------------------------------------------------------------------------------------
    # The rewrite

    def _quantize_tensor(
        self, graph: ir.Graph, value: ir.Value, params: tuple[float, int], names: NameAllocator
    ) -> None:
        """``QuantizeLinear -> DequantizeLinear`` of a static tensor, and a ``Where`` per reader (main graph)."""
        base = str(value.name)
        readers = [(node, slot) for node, slot in value.uses() if node.graph is graph]
        if not readers:
            return
        scale = add_initializer(graph, names(f"{base}__emu_scale"), np.array(params[0], dtype=np.float32))
        zero = add_initializer(graph, names(f"{base}__emu_zero"), self.options.activation_qtype.zero(params[1]))
        q = ir.Value(name=names(f"{base}__emu_q"))
        dq = ir.Value(name=names(f"{base}__emu_dq"), type=ir.TensorType(_F))
        new = [
            ir.Node("", "QuantizeLinear", [value, scale, zero], outputs=[q]),
            ir.Node("", "DequantizeLinear", [q, scale, zero], outputs=[dq]),
        ]
        for node, slot in readers:
            switch = ir.Value(name=self.EDGE.format(len(self.edges)), type=ir.TensorType(ir.DataType.BOOL),
                              shape=ir.Shape([]))  # fmt: skip
            graph.inputs.append(switch)
            self.edges[base, str(node.name), slot] = str(switch.name)
            read = ir.Value(name=names(f"{base}__emu_read"), type=ir.TensorType(_F))
            new.append(ir.Node("", "Where", [switch, dq, value], outputs=[read]))
            node.replace_input_with(slot, read)
        graph.extend(new)  # sorted at the end

    @staticmethod
    def _dynamic_input(
        graph: ir.Graph, node: ir.Node, layer: Layer, decisions: Decisions, names: NameAllocator
    ) -> ir.Value:
        """A dynamic layer's input as its INT8 kernel reads it: ``[Mul(1/s)] -> DynamicQuantizeLinear``,
        dequantized."""
        x = node.inputs[0]
        assert x is not None
        base = str(layer.activation.name)
        new: list[ir.Node] = []
        channel = decisions.groups.get(base, ChannelDecision())
        source = x
        if channel.split.size or channel.scales is not None:
            factors = channel.factors(decisions.layers[layer.name].recipe.shape()[0]).astype(np.float32)
            source = ir.Value(name=names(f"{base}__emu_smoothed"), type=ir.TensorType(_F))
            factor_value = add_initializer(graph, names(f"{base}__emu_smooth"), factors)
            new.append(ir.Node("", "Mul", [x, factor_value], outputs=[source]))
        q, scale, zero = (ir.Value(name=names(f"{base}__emu_{s}")) for s in ("q", "scale", "zero"))
        new.append(ir.Node("", "DynamicQuantizeLinear", [source], outputs=[q, scale, zero]))
        out = ir.Value(name=names(f"{base}__emu_dq"), type=ir.TensorType(_F))
        new.append(ir.Node("", "DequantizeLinear", [q, scale, zero], outputs=[out]))
        graph.insert_before(node, new)
        return out

    @staticmethod
    def _twin(
        graph: ir.Graph,
        node: ir.Node,
        layer: Layer,
        decision: LayerDecision,
        decisions: Decisions,
        options: Int8Options,
        x: ir.Value,
        switch: ir.Value,
        names: NameAllocator,
    ) -> None:
        """The layer's INT8 twin reading ``x``, and ``Where(switch, twin, float)`` in place of its output."""
        base = str(node.name)
        array, bias_array = emulated_layer(layer, decision, decisions, options)
        weight = add_initializer(graph, names(f"{base}__emu_weight"), array)
        inputs: list[ir.Value | None] = [x, weight, *node.inputs[2:]]
        add: np.ndarray | None = None
        if bias_array is not None:  # a static Conv/Gemm's new bias
            inputs = [x, weight, add_initializer(graph, names(f"{base}__emu_bias"), bias_array)]
        elif decision.bias is not None:  # a correction added to the product
            add = decision.bias.astype(np.float32)
        product = ir.Value(name=names(f"{base}__emu_product"), type=ir.TensorType(_F))
        new = [ir.Node(node.domain, node.op_type, inputs, attributes=list(node.attributes.values()),
                       outputs=[product])]  # fmt: skip
        if add is not None:
            corrected = ir.Value(name=names(f"{base}__emu_corrected"), type=ir.TensorType(_F))
            value = add_initializer(graph, names(f"{base}__emu_correction"), add)
            new.append(ir.Node("", "Add", [product, value], outputs=[corrected]))
            product = corrected
        channel = decisions.groups.get(str(layer.activation.name))
        if layer.dynamic and decision.split_rows is not None and channel is not None and channel.split.size:
            source = node.inputs[0]
            assert source is not None
            index = add_initializer(graph, names(f"{base}__emu_outliers"), channel.split.astype(np.int64))
            rows = add_initializer(graph, names(f"{base}__emu_outlier_rows"), decision.split_rows.astype(np.float32))
            gathered, partial, total = (
                ir.Value(name=names(f"{base}__emu_{s}"), type=ir.TensorType(_F))
                for s in ("gathered", "outlier_product", "with_outliers")
            )
            new += [
                ir.Node("", "Gather", [source, index], attributes=[ir.AttrInt64("axis", -1)], outputs=[gathered]),
                ir.Node("", "MatMul", [gathered, rows], outputs=[partial]),
                ir.Node("", "Add", [product, partial], outputs=[total]),
            ]
            product = total
        y = node.outputs[0]
        mixed = ir.Value(name=str(y.name), type=y.type, shape=ir.Shape(y.shape) if y.shape is not None else None)
        users = list(y.uses())
        outputs = [i for i, v in enumerate(graph.outputs) if v is y]
        y.name = names(f"{y.name}__float")
        new.append(ir.Node("", "Where", [switch, product, y], outputs=[mixed]))
        graph.insert_after(node, new)
        for user, slot in users:
            user.replace_input_with(slot, mixed)
        for i in outputs:
            graph.outputs[i] = mixed


def _clone_value(graph: ir.Graph, nodes: dict[str, ir.Node], value: ir.Value) -> ir.Value | None:
    """The value of a clone that is ``value`` of the original: by its producer's name and output index, or a graph
    input by name."""
    producer = value.producer()
    if producer is None:
        return next((v for v in graph.inputs if v.name == value.name), None)
    twin = nodes.get(str(producer.name))
    index = value.index()
    return None if twin is None or index is None else twin.outputs[index]
