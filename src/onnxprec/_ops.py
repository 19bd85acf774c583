"""Op tables, domains and opsets: what the tools need to know about ONNX ops beyond the graph itself."""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = [
    "CONTROL_FLOW_OPS",
    "DEFAULT_DOMAINS",
    "KEEP_FP32_OPS",
    "QUANTIZED_OPS",
    "TYPE_ATTRIBUTES",
    "VALUE_ATTRIBUTE_OPS",
    "default_opset",
    "is_default_domain",
    "is_standard_op",
    "min_ir_version",
    "normalized_domain",
    "opsets_by_domain",
]

# The default ONNX domain has two spellings.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
_STANDARD_DOMAINS = frozenset({*DEFAULT_DOMAINS, "ai.onnx.ml"})

# Ops with subgraph attributes (If/Loop/Scan bodies).
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

# Ops of quantized models (QDQ, QOperator and ONNX Runtime's quantized contrib ops).
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "MatMulNBits",
        "GatherBlockQuantized",
        "QLinearAdd",
        "QLinearMul",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "QAttention",
        "QGemm",
    }
)

# Default-domain ops that mixed precision keeps in FP32, with the reason (their schema would allow FP16/BF16).
KEEP_FP32_OPS = {
    "BitCast": "BitCast reinterprets the bits of its input: its input keeps its type",
    "QuantizeLinear": "quantization keeps its FP32 input and scale (exact rounding; the output is an integer)",
    "EyeLike": "EyeLike reads only the shape of its input (nothing to gain; ONNX Runtime has no FP16 kernel)",
    "MeanVarianceNormalization": "ONNX's function body of MeanVarianceNormalization adds an FP32 epsilon",
}

# Default-domain ops whose output element type is set by an integer attribute rather than by an input.
TYPE_ATTRIBUTES = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
}

# Default-domain ops whose output element type is that of their ``value`` tensor attribute.
VALUE_ATTRIBUTE_OPS = frozenset({"Constant", "ConstantOfShape"})


def is_default_domain(domain: str) -> bool:
    """Whether ``domain`` is the default ONNX domain (``""`` or ``"ai.onnx"``)."""
    return domain in DEFAULT_DOMAINS


def normalized_domain(domain: str) -> str:
    """``domain`` with the default domain spelled ``""``, as ``onnx.defs`` and opset imports expect."""
    return "" if domain == "ai.onnx" else domain


def opsets_by_domain(model: ir.Model) -> dict[str, int]:
    """The model's opset imports keyed by :func:`normalized_domain`."""
    opsets = dict(model.opset_imports)
    if "ai.onnx" in opsets and "" not in opsets:
        opsets[""] = opsets["ai.onnx"]
    return opsets


def default_opset(model: ir.Model) -> int:
    """The model's opset of the default domain (1 when it imports none)."""
    return opsets_by_domain(model).get("", 1)


def is_standard_op(node: ir.Node, opset: int) -> bool:
    """Whether ``node`` is an op of the ONNX standard (default or ai.onnx.ml domain) that exists at ``opset``.

    Args:
        node: The node.
        opset: The model's opset of the node's domain.
    """
    if node.domain not in _STANDARD_DOMAINS:
        return False
    return bool(onnx.defs.has(node.op_type, opset, normalized_domain(node.domain)))


def min_ir_version(opset: int) -> int:
    """The lowest IR version that can carry ``opset`` of the default domain."""
    for entry in onnx.helper.VERSION_TABLE:  # (release, ir_version, ai.onnx opset, ai.onnx.ml opset, ...)
        if entry[2] >= opset:
            return int(entry[1])
    return int(onnx.IR_VERSION)
