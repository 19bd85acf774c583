"""What an op's schema allows in low precision, slot by slot."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxprec._ops import TYPE_ATTRIBUTES, VALUE_ATTRIBUTE_OPS, FloatContract, normalized_domain

__all__ = ["SchemaSupport", "contract_support", "schema_support"]

# Ops whose floating-point output type comes from an attribute or a constant value; AutoCast rewrites it.
_RETYPABLE = frozenset({*TYPE_ATTRIBUTES, *VALUE_ATTRIBUTE_OPS})

_TYPE_STR = {ir.DataType.FLOAT16: "tensor(float16)", ir.DataType.BFLOAT16: "tensor(bfloat16)"}


@dataclass(frozen=True)
class SchemaSupport:
    """Low-precision support of one node, from its schema.

    Attributes:
        supported: Whether the node may compute in low precision.
        reason: Why not, when ``supported`` is False.
        fp32_inputs: Input slots that must stay FP32 even in a low-precision node (Resize scales...).
        fp32_outputs: Output slots that stay FP32 even in a low-precision node (a contrib op's statistics).
    """

    supported: bool
    reason: str = ""
    fp32_inputs: frozenset[int] = frozenset()
    fp32_outputs: frozenset[int] = frozenset()


@functools.lru_cache(maxsize=4096)
def _schema(op_type: str, domain: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except onnx.defs.SchemaError:
        return None


def _formal(
    params: Sequence[onnx.defs.OpSchema.FormalParameter], index: int
) -> onnx.defs.OpSchema.FormalParameter | None:
    if index < len(params):
        return params[index]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def schema_support(
    node: ir.Node, opset: int, low: ir.DataType, float_inputs: tuple[int, ...], float_outputs: tuple[int, ...]
) -> SchemaSupport | None:
    """Checks ``node``'s schema at ``opset`` for the ``low`` type on the slots that carry FP32.

    Args:
        node: The node.
        opset: The model's opset for the node's domain.
        low: FLOAT16 or BFLOAT16.
        float_inputs: Indices of inputs that carry FP32 tensors.
        float_outputs: Indices of outputs that carry FP32 tensors.

    Returns:
        The support, or None when the op has no ONNX schema (a custom or contrib op).
    """
    schema = _schema(node.op_type, normalized_domain(node.domain), opset)
    if schema is None:
        return None
    low_str = _TYPE_STR[low]
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    input_params = {p.type_str for p in schema.inputs}
    for j in float_outputs:
        formal = _formal(schema.outputs, j)
        if formal is None:
            continue
        types = allowed.get(formal.type_str, {formal.type_str})
        if low_str not in types:
            return SchemaSupport(False, f"{node.op_type}-{schema.since_version} has no {low.name.lower()} output type")
        if formal.type_str not in input_params and node.op_type not in _RETYPABLE:
            return SchemaSupport(False, f"{node.op_type} output type is set by an attribute AutoCast does not rewrite")
    fp32_inputs = set()
    for i in float_inputs:
        formal = _formal(schema.inputs, i)
        if formal is not None and low_str not in allowed.get(formal.type_str, {formal.type_str}):
            fp32_inputs.add(i)
    if float_inputs and not float_outputs and fp32_inputs == set(float_inputs):
        return SchemaSupport(False, f"{node.op_type}-{schema.since_version} has no {low.name.lower()} input type")
    return SchemaSupport(True, fp32_inputs=frozenset(fp32_inputs))


def contract_support(
    node: ir.Node,
    contract: FloatContract,
    low: ir.DataType,
    float_inputs: tuple[int, ...],
    float_outputs: tuple[int, ...],
) -> SchemaSupport:
    """What an ONNX Runtime contrib op's float contract allows: its ``T`` slots go low, its ``F`` slots stay FP32.

    Args:
        node: The node.
        contract: The op's float contract (:func:`onnxprec._ort.float_contract`).
        low: FLOAT16 or BFLOAT16.
        float_inputs: Indices of inputs that carry FP32 tensors.
        float_outputs: Indices of outputs that carry FP32 tensors.
    """
    low_name = low.name.lower()
    if low_name not in contract.low_types:
        return SchemaSupport(False, f"ONNX Runtime's {node.op_type} has no {low_name} type")
    fp32_inputs = frozenset(i for i in float_inputs if contract.input(i) != "T")
    fp32_outputs = frozenset(j for j in float_outputs if contract.output(j) != "T")
    if len(fp32_inputs) == len(float_inputs) and len(fp32_outputs) == len(float_outputs):
        return SchemaSupport(False, f"ONNX Runtime's {node.op_type} has no float slot that can go {low_name}")
    return SchemaSupport(True, fp32_inputs=fp32_inputs, fp32_outputs=fp32_outputs)
