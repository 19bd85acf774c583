"""Retyping helpers shared by the precision passes: weights and type-setting attributes, clamped to the new type."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator, all_graphs, cast_graph_output, insert_cast, tensor_attribute
from onnxprec._ops import TYPE_ATTRIBUTES, VALUE_ATTRIBUTE_OPS, is_default_domain
from onnxprec._tensors import Fp16Kernel, cast_array, converted_tensor

__all__ = ["retarget_type_attributes", "retype_floats_to_fp32", "retype_initializer"]


def retype_initializer(value: ir.Value, to: ir.DataType, kernel: Fp16Kernel | None = None) -> None:
    """Converts an initializer to ``to`` in place, lazily (on save) and clamped to the finite range of ``to``.

    The value and its tensor keep their name; the sign of every element is kept (see
    :func:`onnxprec._tensors.cast_array`, which also says what ``kernel`` does).
    """
    if value.const_value is None:
        raise ValueError(f"'{value.name}' is not an initializer with a value")
    value.const_value = converted_tensor(value.const_value, to, kernel=kernel)
    value.dtype = to


# Type attributes whose absence means FLOAT (the *Like ops default to their input's type instead).
_DEFAULT_TYPES = {"RandomNormal": ir.DataType.FLOAT, "RandomUniform": ir.DataType.FLOAT}


def retarget_type_attributes(node: ir.Node, source: ir.DataType, target: ir.DataType) -> bool:
    """Rewrites the attributes of ``node`` that make an output of type ``source`` to make it ``target``.

    These are the integer type attributes of :data:`onnxprec._ops.TYPE_ATTRIBUTES` (Cast ``to``, Random*
    ``dtype``...) and the ``value`` of Constant and ConstantOfShape, converted with clamping and keeping its
    name (a ``value_float``/``value_floats`` Constant becomes a ``value`` tensor when ``source`` is FLOAT).
    Attributes left out are written when their default is ``source``: a ConstantOfShape without ``value`` (a
    float32 zero) gets a zero of ``target``, a RandomNormal without ``dtype`` gets ``dtype=target``. Output
    values are not retyped here.

    Returns:
        Whether an attribute changed.
    """
    if not is_default_domain(node.domain):
        return False
    attrs = node.attributes
    type_attribute = TYPE_ATTRIBUTES.get(node.op_type)
    if type_attribute is not None:
        current = attrs[type_attribute].as_int() if type_attribute in attrs else _DEFAULT_TYPES.get(node.op_type)
        if current == source:
            attrs[type_attribute] = ir.AttrInt64(type_attribute, target)
            return True
        return False
    if node.op_type not in VALUE_ATTRIBUTE_OPS:
        return False
    if "value" in attrs:
        tensor = tensor_attribute(attrs["value"])
        if tensor.dtype != source:
            return False
        converted = ir.Tensor(cast_array(tensor.numpy(), target), dtype=target, name=tensor.name)
        attrs["value"] = ir.AttrTensor("value", converted)
        return True
    if node.op_type == "ConstantOfShape" and source == ir.DataType.FLOAT:
        # No ``value``: the default fill is a float32 zero, which only an explicit value of ``target`` retypes.
        zero = cast_array(np.zeros(1, dtype=np.float32), target)
        attrs["value"] = ir.AttrTensor("value", ir.Tensor(zero, dtype=target))
        return True
    scalar = "value_float" if "value_float" in attrs else "value_floats" if "value_floats" in attrs else None
    if scalar is None or source != ir.DataType.FLOAT:
        return False
    array = np.asarray(attrs[scalar].value, dtype=np.float32)
    del attrs[scalar]
    attrs["value"] = ir.AttrTensor("value", ir.Tensor(cast_array(array, target), dtype=target))
    return True


_F = ir.DataType.FLOAT


def _is_cast(node: ir.Node) -> bool:
    return node.op_type == "Cast" and is_default_domain(node.domain)


def _output_casts(graph: ir.Graph, sources: frozenset[ir.DataType]) -> set[ir.Node]:
    """The Casts FLOAT -> a source type that produce outputs of ``graph``: boundaries already in place."""
    casts = set()
    for out in graph.outputs:
        producer = out.producer()
        if out.dtype in sources and producer is not None and _is_cast(producer):
            source = producer.inputs[0]
            if source is not None and source.dtype == _F:
                casts.add(producer)
    return casts


def retype_floats_to_fp32(model: ir.Model, sources: frozenset[ir.DataType], *, keep_io: bool) -> int:
    """Retypes the ``sources`` values, initializers, Cast targets and dtype attributes to FLOAT, subgraphs included;
    with ``keep_io`` the main graph's inputs and outputs keep their type behind boundary casts. Returns the count."""
    names = NameAllocator(model)
    main = model.graph
    io_values = {*main.inputs, *main.outputs} if keep_io else set()
    boundaries = _output_casts(main, sources) if keep_io else set()
    count = 0
    for graph in all_graphs(main):
        inputs = graph.inputs if graph is not main or not keep_io else ()  # Loop/Scan state and scan slices
        for value in inputs:
            if value.dtype in sources and not value.is_initializer():
                value.dtype = _F
                count += 1
        for init in list(graph.initializers.values()):
            if init.dtype in sources and init.const_value is not None and init not in io_values:
                retype_initializer(init, _F)
                count += 1
        for node in graph:
            if node not in boundaries:
                count += sum(retarget_type_attributes(node, source, _F) for source in sources)
            for out in node.outputs:
                if out.dtype in sources and out not in io_values:
                    out.dtype = _F
                    count += 1
    if not keep_io:
        return count
    for value in main.inputs:
        uses = [use for use in value.uses() if not _is_cast(use.node)]
        if value.dtype in sources and uses:
            cast = insert_cast(main, value, _F, names)
            for use in uses:
                use.node.replace_input_with(use.idx, cast.outputs[0])
            count += 1
    for position, out in enumerate(main.outputs):
        producer = out.producer()
        dtype = out.dtype
        if dtype in sources and not out.is_graph_input() and producer is not None and producer not in boundaries:
            out.dtype = _F
            cast_graph_output(main, position, dtype, names)
            count += 1
    return count
