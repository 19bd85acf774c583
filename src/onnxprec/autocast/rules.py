"""Node rules: each small rule says why a node must stay in high precision (a reason string) or nothing.

A rule is a callable ``rule(node, ctx) -> str | None``. :func:`onnxprec.autocast.classify.classify` applies
them in the order given. Users can add their own through ``custom_rule``: an object with ModelOpt's
``NodeRuleBase`` interface (``check(node_proto) -> bool``), or any callable taking an ``onnx_ir.Node``.
"""

from __future__ import annotations

import abc
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, tensor_dtype
from onnxprec._ops import contrib_float_contract, normalized_domain
from onnxprec._tensors import SENTINEL, finite_max, release
from onnxprec.observers import TensorStats

__all__ = [
    "DataRangeRule",
    "DepthOfReductionRule",
    "InitializerRangeRule",
    "NodeNameRule",
    "NodeRuleBase",
    "OpTypeRule",
    "Rule",
    "RuleContext",
    "UserRule",
    "reduction_depth",
]

logger = logging.getLogger(__name__)


@dataclass
class RuleContext:
    """What rules may look at besides the node: reference statistics and cached initializer magnitudes."""

    stats: dict[str, TensorStats] | None = None
    opsets: Mapping[str, int] = field(default_factory=dict)  # the model's opsets by domain (classify fills them)
    _init_absmax: dict[int, float] = field(default_factory=dict)

    def initializer_absmax(self, value: ir.Value) -> float:
        """Largest magnitude of an initializer's values, masking sentinels left out.

        Values of magnitude >= ``SENTINEL`` (``finfo(float32).min`` or -inf used as an attention-mask fill)
        are not data: converting them clamps them to the low type's extreme (-65504), which masks just as
        well. Read once, then the mapping is released.
        """
        key = id(value)
        if key not in self._init_absmax:
            tensor = value.const_value
            assert tensor is not None
            array = tensor.numpy()
            hi, lo = (float(array.max()), float(array.min())) if array.size else (0.0, 0.0)
            if math.isnan(hi) or math.isnan(lo):  # max and min propagate NaN: no separate pass looks for it
                result = math.inf
            else:
                result = max(abs(hi), abs(lo))
                if result >= SENTINEL:  # rare: look again, past the sentinels
                    magnitudes = np.abs(array)
                    kept = magnitudes[magnitudes < SENTINEL]
                    result = float(kept.max()) if kept.size else 0.0
                    del magnitudes, kept
            del array
            release(tensor)
            self._init_absmax[key] = result
        return self._init_absmax[key]

    def shape(self, value: ir.Value) -> tuple[int, ...] | None:
        """The value's static shape, else the shape seen in the reference run, else None."""
        if value.shape is not None and all(isinstance(d, int) for d in value.shape):
            return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]
        if value.const_value is not None:
            return tuple(value.const_value.shape.numpy())
        if self.stats is not None and value.name in self.stats:
            return self.stats[value.name].shape
        return None


Rule = Callable[[ir.Node, RuleContext], "str | None"]


class NodeNameRule:
    """Matches node names with ``re.match`` (anchored at the start, as in ModelOpt: write ``.*attn.*``)."""

    def __init__(self, patterns: Sequence[re.Pattern[str]], what: str = "nodes_to_exclude") -> None:
        self.patterns = list(patterns)
        self.what = what

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        for pattern in self.patterns:
            if node.name and pattern.match(node.name):
                return f"name matches {self.what} pattern '{pattern.pattern}'"
        return None


class OpTypeRule:
    """Matches op types exactly."""

    def __init__(self, op_types: Sequence[str], what: str = "op_types_to_exclude") -> None:
        self.op_types = frozenset(op_types)
        self.what = what

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        return f"op type {node.op_type} is in {self.what}" if node.op_type in self.op_types else None


class InitializerRangeRule:
    """Keeps nodes whose FP32 initializer inputs hold magnitudes above ``init_max``."""

    def __init__(self, init_max: float) -> None:
        self.init_max = init_max

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        for value in node.inputs:
            if value is None or value.const_value is None or not value.is_initializer():
                continue
            if value.dtype != ir.DataType.FLOAT:
                continue
            absmax = ctx.initializer_absmax(value)
            if absmax > self.init_max:
                return f"initializer '{value.name}' reaches {absmax:.4g} > init_max {self.init_max:g}"
        return None


class DataRangeRule:
    """Keeps nodes whose floating-point inputs or outputs exceed ``data_max`` in the reference run.

    Integer and bool tensors never trip it: shape values and token ids above 512 are not overflow risks
    (ModelOpt checks them too and needlessly keeps Reshape, Gather and Shape nodes in FP32). A float tensor the
    reference run did not measure (the tensors of If/Loop/Scan bodies) is not "in range": its nodes stay FP32.

    ONNX Runtime contrib ops that compute in FP32 inside (:attr:`onnxprec._ops.FloatContract.fp32_inside`: the
    fused normalizations and attentions) are held to half the ``low`` type's range instead, when that is wider:
    their low-precision tensors only carry values, the sums and statistics that overflow are FP32.
    """

    def __init__(self, data_max: float, low: ir.DataType | None = None) -> None:
        self.data_max = data_max
        self.low = low

    def _bound(self, node: ir.Node, ctx: RuleContext) -> tuple[float, str]:
        if self.low is not None:
            contract = contrib_float_contract(node, ctx.opsets.get(normalized_domain(node.domain), 1))
            if contract is not None and contract.fp32_inside:
                wide = finite_max(self.low) / 2
                if wide > self.data_max:
                    return wide, f"half the {self.low.name.lower()} range {wide:g} ({node.op_type} computes in FP32)"
        return self.data_max, f"data_max {self.data_max:g}"

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        if ctx.stats is None:
            return None
        bound, what = self._bound(node, ctx)
        for kind, values in (("input", node.inputs), ("output", node.outputs)):
            for value in values:
                if value is None or value.is_initializer():
                    continue
                if kind == "output" and not value.uses() and not value.is_graph_output():
                    continue  # nothing reads it (a fused norm's mean): the reference run does not measure it
                stats = ctx.stats.get(str(value.name))
                if stats is None:
                    if tensor_dtype(value) in FLOAT_TYPES:  # e.g. inside an If/Loop/Scan body
                        return f"{kind} '{value.name}' was not measured by the reference run (kept in FP32)"
                    continue
                if not stats.is_float or stats.size == 0:
                    continue
                if stats.absmax > bound:
                    return f"{kind} '{value.name}' reaches {stats.absmax:.4g} > {what}"
        return None


_REDUCE_SUM_LIKE = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceProd",
    }
)


def _axes(node: ir.Node, rank: int) -> list[int] | None:
    """Reduced axes of a Reduce* node from its ``axes`` attribute or constant ``axes`` input; None if unknown."""
    if "axes" in node.attributes:
        axes = list(node.attributes["axes"].as_ints())
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        const = node.inputs[1].const_value
        if const is None:
            return None
        axes = [int(a) for a in np.asarray(const.numpy()).reshape(-1)]
    else:
        axes = []
    if not axes:
        noop = "noop_with_empty_axes" in node.attributes and node.attributes["noop_with_empty_axes"].as_int()
        return [] if noop else list(range(rank))
    return [a % rank for a in axes]


def _einsum_depth(equation: str, shapes: list[tuple[int, ...]]) -> int | None:
    if "..." in equation or "->" not in equation:
        return None
    lhs, rhs = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return None
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            return None
        sizes.update(zip(term, shape))
    contracted = set(sizes) - set(rhs)
    return math.prod(sizes[c] for c in contracted)


def reduction_depth(node: ir.Node, ctx: RuleContext) -> int | None:
    """Number of terms each output element accumulates; None when the op does not reduce or shapes are unknown.

    MatMul: K; Gemm: K (honouring transA); Conv: Cin/group * kernel; ConvTranspose: Cin/group * kernel;
    Reduce*: the product of all reduced dims (``axes`` attribute or input); Einsum: the product of the
    contracted dims; CumSum: the scanned dim; LayerNormalization: the normalized size.
    """
    op = node.op_type
    inputs = node.inputs

    def shape(i: int) -> tuple[int, ...] | None:
        if i >= len(inputs) or inputs[i] is None:
            return None
        return ctx.shape(inputs[i])  # type: ignore[arg-type]

    if op == "MatMul":
        a = shape(0)
        return a[-1] if a else None
    if op == "Gemm":
        a = shape(0)
        if a is None or len(a) != 2:
            return None
        trans = "transA" in node.attributes and node.attributes["transA"].as_int()
        return a[0] if trans else a[1]
    if op in ("Conv", "ConvTranspose"):
        w = shape(1)
        if w is None or len(w) < 3:
            return None
        group = node.attributes["group"].as_int() if "group" in node.attributes else 1
        cin = w[1] if op == "Conv" else w[0] // max(group, 1)
        return cin * math.prod(w[2:])
    if op in _REDUCE_SUM_LIKE:
        x = shape(0)
        if x is None:
            return None
        axes = _axes(node, len(x))
        return None if axes is None else math.prod(x[a] for a in axes)
    if op == "Einsum":
        shapes = [shape(i) for i in range(len(inputs))]
        if any(s is None for s in shapes) or "equation" not in node.attributes:
            return None
        return _einsum_depth(node.attributes["equation"].as_string(), shapes)  # type: ignore[arg-type]
    if op == "CumSum":
        x = shape(0)
        axis_value = inputs[1].const_value if len(inputs) > 1 and inputs[1] is not None else None
        if x is None or axis_value is None:
            return None
        return x[int(np.asarray(axis_value.numpy()).reshape(-1)[0]) % len(x)]
    if op == "LayerNormalization":
        x = shape(0)
        if x is None:
            return None
        axis = node.attributes["axis"].as_int() if "axis" in node.attributes else -1
        return math.prod(x[axis % len(x) :])
    return None


REDUCING_OPS = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "CumSum", "LayerNormalization", *_REDUCE_SUM_LIKE}
)


class DepthOfReductionRule:
    """Keeps nodes that accumulate more than ``max_depth`` terms per output element."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        if node.op_type not in REDUCING_OPS:
            return None
        depth = reduction_depth(node, ctx)
        if depth is not None and depth > self.max_depth:
            return f"depth of reduction {depth} > max_depth_of_reduction {self.max_depth}"
        return None


class NodeRuleBase(abc.ABC):
    """ModelOpt-compatible base for custom rules: implement ``_check_inner(node) -> bool`` on an onnx NodeProto."""

    @abc.abstractmethod
    def _check_inner(self, node: onnx.NodeProto) -> bool:
        """True if the node must stay in high precision."""

    def _log_skipped(self, node: onnx.NodeProto, **kwargs: object) -> None:
        logger.info("Skipping node %s: %s", node.name, type(self).__name__)

    def check(self, node: onnx.NodeProto) -> bool:
        """Applies the rule, logging the nodes it keeps in high precision."""
        result = bool(self._check_inner(node))
        if result:
            self._log_skipped(node)
        return result


class UserRule:
    """Adapts ``custom_rule``: a ``NodeRuleBase``-like object (``check(NodeProto)``) or a callable on ir.Node."""

    def __init__(self, rule: object) -> None:
        self.rule = rule
        self.name = type(rule).__name__ if hasattr(rule, "check") else getattr(rule, "__name__", "custom_rule")

    def __call__(self, node: ir.Node, ctx: RuleContext) -> str | None:
        if hasattr(self.rule, "check"):
            hit = self.rule.check(ir.serde.serialize_node(node))
        else:
            hit = self.rule(node)  # type: ignore[operator]
        if isinstance(hit, str):
            return hit or None
        return f"custom rule {self.name}" if hit else None
