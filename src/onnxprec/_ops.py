"""Op tables, domains and opsets: what the tools need to know about ONNX ops beyond the graph itself."""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = [
    "CONTROL_FLOW_OPS",
    "DEFAULT_DOMAINS",
    "KEEP_FP32_OPS",
    "ORT_ONNX_DOMAIN_OPS",
    "QUANTIZED_OPS",
    "TYPE_ATTRIBUTES",
    "VALUE_ATTRIBUTE_OPS",
    "default_opset",
    "is_default_domain",
    "is_known_onnx_domain_op",
    "is_ort_onnx_domain_op",
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


_LAST = 2**31 - 1  # ONNX Runtime's "every later opset"

# ONNX Runtime's contrib kernels registered in the ONNX (default) domain, for ops ONNX itself lacks at those opsets:
# op -> (first, last) opset they cover. Read off ORT 1.32's kernel registry
# (onnxruntime.capi.onnxruntime_pybind11_state.get_all_opkernel_def(), CPU); _ops_test.py compares this table with the
# installed onnxruntime. The I/O layer cannot import onnxruntime, hence the table. LayerNormalization before opset 17
# and SimplifiedLayerNormalization are what exporters (torch, onnxruntime-genai's builder) emit; the rest are ONNX's
# removed experimental ops and ORT's memory copies.
ORT_ONNX_DOMAIN_OPS: dict[str, tuple[int, int]] = {
    "Affine": (1, _LAST),
    "Crop": (1, _LAST),
    "DynamicSlice": (1, _LAST),
    "ImageScaler": (1, _LAST),
    "LayerNormalization": (1, 16),
    "MeanVarianceNormalization": (1, 8),
    "MemcpyFromHost": (1, _LAST),
    "MemcpyToHost": (1, _LAST),
    "ParametricSoftplus": (1, _LAST),
    "Scale": (1, _LAST),
    "ScaledTanh": (1, _LAST),
    "SimplifiedLayerNormalization": (1, _LAST),
    "ThresholdedRelu": (1, 9),
}


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


def is_ort_onnx_domain_op(op_type: str, domain: str, opset: int) -> bool:
    """Whether ``op_type`` in ``domain`` at ``opset`` is an ONNX Runtime contrib op registered in the ONNX domain.

    Such an op (e.g. ``SimplifiedLayerNormalization``) is no ONNX op: ONNX Runtime runs it, onnx.checker and
    ONNX's shape inference do not know it. The op's own ONNX version, where ONNX has one (``LayerNormalization``
    from opset 17), is a standard op and not this.

    Args:
        op_type: The node's op type.
        domain: The node's domain.
        opset: The model's opset of the default domain.
    """
    if not is_default_domain(domain) or op_type not in ORT_ONNX_DOMAIN_OPS:
        return False
    first, last = ORT_ONNX_DOMAIN_OPS[op_type]
    return first <= opset <= last and not onnx.defs.has(op_type, opset, "")


def is_known_onnx_domain_op(op_type: str, domain: str, opset: int) -> bool:
    """Whether a default- or ai.onnx.ml-domain op exists at ``opset`` for ONNX or for ONNX Runtime."""
    domain = normalized_domain(domain)
    return bool(onnx.defs.has(op_type, opset, domain)) or is_ort_onnx_domain_op(op_type, domain, opset)


def min_ir_version(opset: int) -> int:
    """The lowest IR version that can carry ``opset`` of the default domain."""
    for entry in onnx.helper.VERSION_TABLE:  # (release, ir_version, ai.onnx opset, ai.onnx.ml opset, ...)
        if entry[2] >= opset:
            return int(entry[1])
    return int(onnx.IR_VERSION)
