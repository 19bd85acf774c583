"""Op tables, domains and opsets: what the tools need to know about ONNX ops beyond the graph itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

__all__ = [
    "CONTRIB_FLOAT_CONTRACTS",
    "CONTROL_FLOW_OPS",
    "DEFAULT_DOMAINS",
    "KEEP_FP32_OPS",
    "ORT_DOMAINS",
    "ORT_ONNX_DOMAIN_OPS",
    "QUANTIZED_OPS",
    "TYPE_ATTRIBUTES",
    "VALUE_ATTRIBUTE_OPS",
    "FloatContract",
    "contrib_float_contract",
    "default_opset",
    "float_contract_of_schema",
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


# ONNX Runtime's own op domains (its kernel registry's, besides the ONNX ones).
ORT_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc"})

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


@dataclass(frozen=True)
class FloatContract:
    """How the float slots of an op without an ONNX schema follow the precision it computes in.

    One code per input and output slot: ``T`` follows the node's float type (FP32, or the low type when the
    node goes low), ``F`` is always FP32 (statistics, KV scales), ``-`` carries no float (integer or quantized
    data). Slots past the end are ``-``.

    Attributes:
        inputs: The codes of the input slots.
        outputs: The codes of the output slots.
        low_types: The low types (``"float16"``, ``"bfloat16"``) the op's ``T`` slots allow.
        fp32_inside: The kernel computes in FP32 inside (normalization statistics, attention softmax and sums), so
            its low-precision inputs and outputs need only fit the low type: AutoCast's ``data_max`` bound, meant
            for chains of low-precision arithmetic, gives way to half the low type's range.
    """

    inputs: str
    outputs: str
    low_types: frozenset[str] = frozenset({"float16", "bfloat16"})
    fp32_inside: bool = False

    def input(self, index: int) -> str:
        """The code of input slot ``index``."""
        return self.inputs[index] if index < len(self.inputs) else "-"

    def output(self, index: int) -> str:
        """The code of output slot ``index``."""
        return self.outputs[index] if index < len(self.outputs) else "-"


_FP16_ONLY = frozenset({"float16"})

# The float contracts of the common ONNX Runtime contrib ops of LLMs and transformers, keyed (domain, op type), from
# ORT 1.32's contrib op schemas (type constraints T/U/M/T_CACHE...): _ops_test.py derives each from the installed
# onnxruntime's schema with float_contract_of_schema and compares. The ONNX-domain entries apply where the op is
# ORT's (ORT_ONNX_DOMAIN_OPS), not ONNX's own LayerNormalization from opset 17. Slot codes: see FloatContract.
CONTRIB_FLOAT_CONTRACTS: dict[tuple[str, str], FloatContract] = {
    # query key value past_key past_value seqlens_k total_sequence_length cos_cache sin_cache position_ids
    # attention_bias head_sink k_scale v_scale q_norm_weight k_norm_weight query_seqlens -> output present_key
    # present_value output_qk. T_CACHE (past/present) is float16/bfloat16/float like T, or an 8-bit type.
    ("com.microsoft", "GroupQueryAttention"): FloatContract("TTTTT--TT-TTFFTT-", "TTTT", fp32_inside=True),
    # query key value bias key_padding_mask attention_bias past_key past_value past_sequence_length
    # cache_indirection -> output present_key present_value qk
    ("com.microsoft", "MultiHeadAttention"): FloatContract("TTTT-TTT--", "TTTT", fp32_inside=True),
    ("com.microsoft", "Attention"): FloatContract(
        "TTT-TT-", "TT", fp32_inside=True
    ),  # input weights bias mask_index past ...
    ("com.microsoft", "RotaryEmbedding"): FloatContract("T-TT", "T"),  # input position_ids cos_cache sin_cache
    # input skip gamma (beta) bias -> output mean inv_std_var input_skip_bias_sum; mean/inv_std_var are U=float.
    ("com.microsoft", "SkipLayerNormalization"): FloatContract("TTTTT", "TFFT", fp32_inside=True),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): FloatContract("TTTT", "TFFT", fp32_inside=True),
    ("", "SimplifiedLayerNormalization"): FloatContract("TT", "TF", fp32_inside=True),  # X scale -> Y inv_std_var
    ("", "LayerNormalization"): FloatContract(
        "TTT", "TFF", fp32_inside=True
    ),  # ORT's before opset 17: X Scale B -> Y Mean InvStdDev
    ("com.microsoft", "FastGelu"): FloatContract("TT", "T"),
    ("com.microsoft", "BiasGelu"): FloatContract("TT", "T"),
    ("com.microsoft", "QuickGelu"): FloatContract("T", "T"),
    ("com.microsoft", "Gelu"): FloatContract("T", "T"),
    ("com.microsoft", "BiasAdd"): FloatContract("TTT", "T", _FP16_ONLY),
    ("com.microsoft", "FusedMatMul"): FloatContract("TT", "T"),
    # A B(uint8) scales zero_points(uint8, or float like A) g_idx bias -> Y
    ("com.microsoft", "MatMulNBits"): FloatContract("T-TT-T", "T"),
    ("com.microsoft", "GatherBlockQuantized"): FloatContract("--T-", "T"),  # data indices scales zero_points
}

_LOW_TYPE_STRINGS = {"tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}


def float_contract_of_schema(
    inputs: Sequence[str], outputs: Sequence[str], constraints: Mapping[str, Sequence[str]]
) -> FloatContract | None:
    """The float contract an op schema implies, or None when its float slots allow no low type.

    A slot whose type allows FP16 or BF16 follows the node (``T``), one that allows float only stays FP32 (``F``),
    the others carry no float (``-``).

    Args:
        inputs: The type string of each input slot (``"T"``, or a type such as ``"tensor(int64)"``).
        outputs: The same for the outputs.
        constraints: Each type parameter's allowed types (``{"T": ["tensor(float)", "tensor(float16)"]}``).
    """
    low_sets: list[set[str]] = []

    def code(type_str: str) -> str:
        allowed = set(constraints.get(type_str, [type_str]))
        low = {_LOW_TYPE_STRINGS[t] for t in allowed if t in _LOW_TYPE_STRINGS}
        if low:
            low_sets.append(low)
            return "T"
        return "F" if "tensor(float)" in allowed else "-"

    contract_in = "".join(code(t) for t in inputs)
    contract_out = "".join(code(t) for t in outputs)
    if not low_sets:
        return None
    return FloatContract(contract_in, contract_out, frozenset(set.intersection(*low_sets)))


def contrib_float_contract(node: ir.Node, opset: int) -> FloatContract | None:
    """The float contract of an ONNX Runtime contrib op from :data:`CONTRIB_FLOAT_CONTRACTS`, or None.

    Args:
        node: The node.
        opset: The model's opset of the node's domain.
    """
    domain = normalized_domain(node.domain)
    if domain == "" and not is_ort_onnx_domain_op(node.op_type, domain, opset):
        return None
    return CONTRIB_FLOAT_CONTRACTS.get((domain, node.op_type))


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
