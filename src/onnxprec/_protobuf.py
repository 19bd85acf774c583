"""Streaming ONNX protobuf I/O: weights are memory-mapped on load and written one tensor at a time on save.

``onnx.load`` of a single-file model holds the file bytes and the parsed message (twice the model's size) and
``onnx.save`` builds the whole message again. Here the file is scanned at the protobuf wire level: large
``raw_data`` fields of main-graph initializers become external references into the model file itself
(memory-mapped by onnx-ir, read only when needed), and on save each initializer is encoded and written on
its own, so peak memory is the graph structure plus one tensor.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
import onnx_ir as ir

from onnxprec._graph import all_graphs
from onnxprec._progress import progress
from onnxprec._tensors import release

__all__ = ["load_mapped", "proto_graphs", "structure_proto", "write_streaming"]

logger = logging.getLogger(__name__)

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_MAP_THRESHOLD = 1024  # raw_data fields at least this large are mapped, not copied


def proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A GraphProto and every subgraph in it (If/Loop/Scan bodies, nested), parents first: the one protobuf walk.

    onnx-ir's ``Graph.subgraphs()`` does this for an ``ir.Graph``; this is for code that must edit or check the
    protobuf itself (the load checks, the checker's view of a model).
    """
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        children = []
        for node in current.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    children.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    children.extend(attr.graphs)
        stack.extend(reversed(children))


def _varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yields (field number, wire type, field start, value start, value end) of a message's fields."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            _, value_end = _varint(buf, pos)
        elif wire == _WIRE_I64:
            value_end = pos + 8
        elif wire == _WIRE_I32:
            value_end = pos + 4
        elif wire == _WIRE_LEN:
            length, pos = _varint(buf, pos)
            value_end = pos + length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {field_start}")
        if value_end > end:
            raise ValueError(f"field {number} at byte {field_start} runs past the end of its message (truncated file)")
        yield number, wire, field_start, pos, value_end
        pos = value_end


def _mapped_tensor(buf: memoryview, start: int, end: int, location: str) -> onnx.TensorProto:
    """Parses an initializer, turning a large ``raw_data`` field into a reference into the model file."""
    kept = bytearray()
    raw: tuple[int, int] | None = None
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA and wire == _WIRE_LEN and value_end - value_start >= _MAP_THRESHOLD:
            raw = (value_start, value_end - value_start)
        else:
            kept += buf[field_start:value_end]
    tensor = onnx.TensorProto()
    tensor.ParseFromString(bytes(kept))
    if raw is not None:
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    return tensor


def load_mapped(path: Path) -> onnx.ModelProto:
    """Parses a model file whose large initializers become external references into the file itself.

    The returned proto is small (no weights); onnx-ir maps the weights from ``path`` on first access.

    Raises:
        ValueError: The file is not valid protobuf (e.g. truncated).
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        buf = memoryview(mapped)
        try:
            head = bytearray()
            graph_rest = bytearray()
            tensors: list[onnx.TensorProto] = []
            for number, wire, field_start, value_start, value_end in _fields(buf, 0, len(buf)):
                if number != _MODEL_GRAPH or wire != _WIRE_LEN:
                    head += buf[field_start:value_end]
                    continue
                for g_number, g_wire, g_start, g_value_start, g_value_end in _fields(buf, value_start, value_end):
                    if g_number == _GRAPH_INITIALIZER and g_wire == _WIRE_LEN:
                        tensors.append(_mapped_tensor(buf, g_value_start, g_value_end, path.name))
                    else:
                        graph_rest += buf[g_start:g_value_end]
            model = onnx.ModelProto()
            model.ParseFromString(bytes(head))
            graph = onnx.GraphProto()
            graph.ParseFromString(bytes(graph_rest))
            graph.initializer.extend(tensors)
            model.graph.CopyFrom(graph)
        finally:
            buf.release()
    return model


def _tensor_header(value: ir.Value, tensor: ir.TensorProtocol) -> onnx.TensorProto:
    """A TensorProto without its data: name, dims, data type."""
    proto = onnx.TensorProto(name=value.name, data_type=int(tensor.dtype))
    proto.dims.extend(int(d) for d in tensor.shape.numpy())
    return proto


def _streamable(value: ir.Value) -> bool:
    tensor = value.const_value
    return tensor is not None and tensor.dtype != ir.DataType.STRING and value.name is not None


def _serialized_without(model: ir.Model, left_out: list[ir.Value]) -> onnx.ModelProto:
    """The model's message without the main-graph initializers ``left_out``; the model is left as it was."""
    graph = model.graph
    order = list(graph.initializers.values())
    for value in left_out:
        assert value.name is not None
        graph.initializers.pop(value.name)
    try:
        return ir.serde.serialize_model(model)
    finally:
        graph.initializers.clear()
        for value in order:
            graph.initializers.add(value)


def write_streaming(model: ir.Model, stream: BinaryIO, location: str | None = None) -> onnx.ModelProto | None:
    """Writes ``model`` as one protobuf file, encoding and writing one main-graph initializer at a time.

    Every tensor's bytes are embedded (external references of the source model are read and inlined),
    so the result is self-contained. The caller keeps the model below the 2 GB protobuf limit.

    Args:
        model: The model.
        stream: Where to write, from its start.
        location: The file's name, relative to the folder ONNX Runtime is told the weights are in.

    Returns:
        With ``location``: the written model as a message, as :func:`load_mapped` reads the file: initializers of
        1 KiB or more are external references to their bytes in it (``location``, offset, length); for ONNX Runtime
        to run without reading the file into onnx-ir again. Else None.
    """
    streamed = [v for v in model.graph.initializers.values() if _streamable(v)]
    proto = _serialized_without(model, streamed)
    names = {v.name for v in streamed}
    # Initializers' value_info is redundant with the tensor header, unless it carries metadata (such as the
    # original name a conversion recorded).
    kept_info = [vi for vi in proto.graph.value_info if vi.name not in names]
    kept_info += [ir.serde.serialize_value(v) for v in streamed if v.metadata_props]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept_info)
    graph_bytes = proto.graph.SerializeToString()
    proto.ClearField("graph")

    headers = []
    tensors = []
    total = len(graph_bytes)
    for value in streamed:
        tensor = value.const_value
        assert tensor is not None
        tensors.append(_tensor_header(value, tensor))
        raw_field = b"\x4a" + _encode_varint(tensor.nbytes)  # field 9 (raw_data), length-delimited
        header = tensors[-1].SerializeToString() + raw_field
        body = len(header) + tensor.nbytes
        headers.append((header, body))
        total += 1 + len(_encode_varint(body)) + body

    head = proto.SerializeToString() + b"\x3a" + _encode_varint(total)  # field 7 (graph), length-delimited
    stream.write(head)
    stream.write(graph_bytes)
    position = len(head) + len(graph_bytes)
    for value, tensor_proto, (header, body) in progress(
        list(zip(streamed, tensors, headers)), "Writing weights", "tensor"
    ):
        tensor = value.const_value
        assert tensor is not None
        field = b"\x2a" + _encode_varint(body)  # field 5 (initializer), length-delimited
        stream.write(field)
        stream.write(header)
        position += len(field) + len(header)
        if tensor.nbytes < _MAP_THRESHOLD:
            data = tensor.tobytes()
            stream.write(data)
            written = len(data)
            if location is not None:  # as load_mapped reads it: small tensors (shapes...) in the message
                tensor_proto.raw_data = data
        else:
            start = stream.tell()
            tensor.tofile(stream)  # type: ignore[attr-defined]  # every onnx-ir tensor class has it; no bytes copy
            written = stream.tell() - start
            if location is not None:
                tensor_proto.data_location = onnx.TensorProto.EXTERNAL
                for key, entry in (("location", location), ("offset", position), ("length", written)):
                    tensor_proto.external_data.add(key=key, value=str(entry))
        if written != tensor.nbytes:
            raise RuntimeError(f"tensor '{value.name}' produced {written} bytes, expected {tensor.nbytes}")
        position += written
        release(tensor)
    stream.flush()
    if location is None:
        return None
    proto.graph.ParseFromString(graph_bytes)
    proto.graph.initializer.extend(tensors)
    return proto


def structure_proto(model: ir.Model, threshold: int = 1024) -> onnx.ModelProto:
    """The model as a small ModelProto for ONNX's C++ APIs (checker, shape inference), at any model size.

    Main-graph initializers larger than ``threshold`` bytes are left out and declared as graph inputs of
    the same type and shape instead, so their data is neither read nor copied. The initializers that stay are
    embedded, also those mapped from a file (:func:`load_mapped` maps ``raw_data`` from 1 KiB up, so a tensor of
    exactly ``threshold`` bytes is one): the copy never names a model file as its external data. The model is
    unchanged.
    """
    big = [
        v for v in model.graph.initializers.values() if v.const_value is not None and v.const_value.nbytes > threshold
    ]
    left_out = set(big)
    mapped: list[tuple[ir.Value, ir.ExternalTensor]] = []
    for value in (v for g in all_graphs(model.graph) for v in g.initializers.values()):
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and value not in left_out:
            mapped.append((value, tensor))
            value.const_value = ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=value.name)
    try:
        proto = _serialized_without(model, big)
    finally:
        for value, tensor in mapped:
            value.const_value = tensor
            release(tensor)
    declared = {i.name for i in proto.graph.input}
    for value in big:
        tensor = value.const_value
        assert tensor is not None and value.name is not None
        if value.name not in declared:
            dims = [int(d) for d in tensor.shape.numpy()]
            proto.graph.input.append(onnx.helper.make_tensor_value_info(value.name, int(tensor.dtype), dims))
    return proto
