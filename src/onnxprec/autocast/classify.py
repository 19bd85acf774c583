"""Rules -> one decision per node (low or high precision) with the reason, subgraphs included."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx_ir as ir

from onnxprec._graph import tensor_dtype
from onnxprec._ops import (
    CONTROL_FLOW_OPS,
    KEEP_FP32_OPS,
    is_default_domain,
    is_ort_onnx_domain_op,
    is_standard_op,
    normalized_domain,
    opsets_by_domain,
)
from onnxprec._ort import float_contract
from onnxprec.autocast._schema import SchemaSupport, contract_support, schema_support
from onnxprec.autocast.rules import Rule, RuleContext

__all__ = ["Decision", "PluginPrecision", "classify"]

logger = logging.getLogger(__name__)

_F = ir.DataType.FLOAT


@dataclass(frozen=True)
class PluginPrecision:
    """Precision of a custom op from ``trt_plugins_precision``: one for the whole node, or per slot."""

    inputs: tuple[str, ...] | None  # "fp16"/"fp32" per input slot; None: every slot follows ``default``
    outputs: tuple[str, ...] | None
    default: str


@dataclass(frozen=True)
class Decision:
    """Where a node computes and why.

    Attributes:
        low: True for the low-precision type, False for FP32.
        reason: The rule (or default) that decided.
        fp32_inputs: Input slots that stay FP32 inside a low node (schema or plugin requirements).
        fp32_outputs: Output slots that stay FP32 inside a low node (plugin requirements).
    """

    low: bool
    reason: str
    fp32_inputs: frozenset[int] = frozenset()
    fp32_outputs: frozenset[int] = frozenset()


def _float_slots(values: Sequence[ir.Value | None]) -> tuple[int, ...]:
    return tuple(i for i, v in enumerate(values) if v is not None and tensor_dtype(v) == _F)


def _is_container(value: ir.Value | None) -> bool:
    return value is not None and value.type is not None and tensor_dtype(value) is None


def _plugin_decision(node: ir.Node, plugin: PluginPrecision) -> Decision:
    def fp32_slots(per_slot: tuple[str, ...] | None, count: int) -> frozenset[int]:
        if per_slot is None:
            return frozenset(range(count)) if plugin.default == "fp32" else frozenset()
        return frozenset(i for i in range(count) if i < len(per_slot) and per_slot[i] == "fp32")

    fp32_in = fp32_slots(plugin.inputs, len(node.inputs))
    fp32_out = fp32_slots(plugin.outputs, len(node.outputs))
    low = len(fp32_in) < len(node.inputs) or len(fp32_out) < len(node.outputs)
    if not low:
        return Decision(False, "custom op: trt_plugins_precision says fp32")
    return Decision(True, "custom op: trt_plugins_precision", fp32_in, fp32_out)


def _decide(
    node: ir.Node,
    *,
    opsets: Mapping[str, int],
    low: ir.DataType,
    rules: Sequence[Rule],
    includes: Sequence[Rule],
    ctx: RuleContext,
    plugins: Mapping[str, PluginPrecision],
    inherited: str | None,
) -> Decision:
    opset = opsets.get(normalized_domain(node.domain), 1)
    standard = is_standard_op(node, opset)
    contract = None if standard else float_contract(node, opset)
    if not standard:
        plugin = plugins.get(node.op_type)
        if plugin is not None:
            return _plugin_decision(node, plugin)
        name = f"{node.domain or 'ai.onnx'}::{node.op_type}"
        if contract is None:
            contrib = node.domain == "com.microsoft" or is_ort_onnx_domain_op(node.op_type, node.domain, opset)
            kind = "ONNX Runtime contrib op" if contrib else "custom op"
            return Decision(False, f"{kind} {name} (no ONNX schema)")
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
            return Decision(False, f"ONNX Runtime contrib op {name} runs subgraphs: kept in FP32")
    if node.op_type in CONTROL_FLOW_OPS:
        return Decision(False, "control-flow interface kept in FP32 (its subgraph nodes are classified)")
    if (is_default_domain(node.domain) or contract is not None) and node.op_type in KEEP_FP32_OPS:
        return Decision(False, KEEP_FP32_OPS[node.op_type])
    training = node.attributes.get("training_mode")
    if node.op_type == "BatchNormalization" and training is not None and training.as_int():
        return Decision(False, "training-mode BatchNormalization updates running statistics: kept in FP32")
    if node.domain == "ai.onnx.ml":
        return Decision(False, "ai.onnx.ml ops keep FP32 (tree and classifier attributes hold FP32 values)")
    if any(_is_container(v) for v in (*node.inputs, *node.outputs)):
        return Decision(False, "sequence/optional values keep their declared element type (FP32)")
    float_in, float_out = _float_slots(node.inputs), _float_slots(node.outputs)
    if contract is not None:
        support: SchemaSupport | None = contract_support(node, contract, low, float_in, float_out)
    else:
        support = schema_support(node, opset, low, float_in, float_out)
    if support is not None and not support.supported:
        return Decision(False, support.reason)
    reason = inherited
    if reason is None:
        for rule in rules:
            reason = rule(node, ctx)
            if reason:
                break
    if reason:
        for include in includes:
            hit = include(node, ctx)
            if hit:
                return Decision(True, f"included: {hit} (overrides: {reason})", *_fp32_slots(support))
        return Decision(False, reason)
    return Decision(True, "default", *_fp32_slots(support))


def _fp32_slots(support: SchemaSupport | None) -> tuple[frozenset[int], frozenset[int]]:
    if support is None:
        return frozenset(), frozenset()
    return support.fp32_inputs, support.fp32_outputs


def classify(
    model: ir.Model,
    *,
    low: ir.DataType,
    rules: Sequence[Rule],
    includes: Sequence[Rule] = (),
    ctx: RuleContext | None = None,
    plugins: Mapping[str, PluginPrecision] | None = None,
) -> dict[ir.Node, Decision]:
    """Decides every node's precision, nodes of If/Loop/Scan bodies included.

    Schema limits and custom ops come first and cannot be overridden (the model would be invalid). Then
    the exclude ``rules`` in order; ``includes`` (nodes_to_include / op_types_to_include) override them.
    Control-flow nodes keep an FP32 interface; the nodes of their bodies are classified like any other,
    and inherit a data-range exclusion of the control-flow node (their own tensors are not observed).
    """
    ctx = ctx or RuleContext()
    plugins = plugins or {}
    opsets = opsets_by_domain(model)
    if not ctx.opsets:
        ctx.opsets = opsets
    decisions: dict[ir.Node, Decision] = {}
    # What stays the same for every node of this model; visit gives the node and the reason it inherits.
    decide = functools.partial(
        _decide, opsets=opsets, low=low, rules=rules, includes=includes, ctx=ctx, plugins=plugins
    )

    def visit(graph: ir.Graph, inherited: str | None) -> None:
        for node in graph:
            decision = decide(node, inherited=inherited)
            decisions[node] = decision
            logger.debug("%s %s '%s': %s", "LOW " if decision.low else "HIGH", node.op_type, node.name, decision.reason)
            if node.op_type in CONTROL_FLOW_OPS:
                own = inherited
                if own is None:
                    own = next((r for r in (rule(node, ctx) for rule in rules) if r), None)
                    own = f"enclosing {node.op_type} '{node.name}': {own}" if own else None
                for attr in node.attributes.values():
                    if attr.type == ir.AttributeType.GRAPH:
                        visit(attr.as_graph(), own)
                    elif attr.type == ir.AttributeType.GRAPHS:
                        for sub in attr.as_graphs():
                            visit(sub, own)

    visit(model.graph, None)
    return decisions
