"""Runs a written 4-bit QDQ model without expanding its large tables: each constant ``DequantizeLinear`` of 4-bit
levels whose float output is larger than a limit is replaced, for the run only, by ONNX Runtime's operators that read
the levels as they are.

A tied LLM table (Gemma-3's 262,144 x 640) dequantizes to 671 MB of float32 in the session that runs it, once for the
embedding's Gather and again for the head's MatMul; the same values come from:

- ``Gather(DequantizeLinear(W), ids)`` -> ``com.microsoft::GatherBlockQuantized(W, ids, scales[, zero points])``, the
  gathered rows or columns dequantized (the same products ``scale * (level - zero point)``);
- ``MatMul(A, DequantizeLinear(W))`` with blocks along K -> ``com.microsoft::MatMulNBits`` without
  ``accuracy_level`` (float32 compute: each block dequantized to float32 and multiplied in float32, the sums in another
  order than MLAS's float GEMM), its levels repacked ``[N, blocks, block / 2]``.

Readers of any other kind keep the ``DequantizeLinear``. The file on disk is not changed.

:func:`mapped_for_run` gives such a copy of a written model with its weights in a temporary file, memory-mapped: a
model written as one protobuf otherwise holds all its weights in memory while it runs segment by segment.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir

from onnxprec._graph import NameAllocator
from onnxprec._io import load_model, trim_heap
from onnxprec._tensors import pack_nibbles, unpack_nibbles
from onnxprec.errors import ValidationError

__all__ = ["mapped_for_run", "packed_tables"]

logger = logging.getLogger(__name__)

_FOUR_BITS = frozenset({ir.DataType.INT4, ir.DataType.UINT4})
_COLUMNS_AT_ONCE = 8192
"""Columns of a table repacked at once (a 640-row table: 5 MiB of nibbles per step)."""


def packed_tables(model: ir.Model, limit: int) -> int:
    """Rewrites ``model``'s main graph in place as the module docstring says, for every 4-bit ``DequantizeLinear`` of
    a 2-D initializer whose float32 output exceeds ``limit`` bytes. Returns the number of readers rewritten."""
    graph = model.graph
    names = NameAllocator(model)
    rewritten = 0
    for node in list(graph):
        table = _table(node, limit)
        if table is None:
            continue
        for reader, index in list(node.outputs[0].uses()):
            replacement = _replacement(node, reader, index, names)
            if replacement is None:
                continue
            ir.convenience.replace_nodes_and_values(graph, reader, [reader], [replacement], list(reader.outputs),
                                                    list(replacement.outputs))  # fmt: skip
            rewritten += 1
        if not node.outputs[0].uses() and not node.outputs[0].is_graph_output():
            inputs = list(node.inputs)
            graph.remove(node, safe=True)
            _drop_unread(graph, inputs)
    if rewritten:
        model.opset_imports.setdefault("com.microsoft", 1)
        trim_heap()  # the repacking's column ranges, freed in blocks the heap keeps
        logger.info("The run reads %d large 4-bit table reader(s) as GatherBlockQuantized / MatMulNBits", rewritten)
    return rewritten


def _drop_unread(graph: ir.Graph, values: Sequence[ir.Value | None]) -> None:
    """Removes the initializers among ``values`` nothing reads any more (a table only MatMuls read: its levels and
    scales live on repacked, and the run's copy would hold both)."""
    for value in values:
        if value is None or not value.is_initializer() or value.uses() or value.is_graph_output():
            continue
        if not value.is_graph_input() and value.name is not None:
            graph.initializers.pop(value.name)


@contextlib.contextmanager
def mapped_for_run(path: str | os.PathLike[str], limit: int) -> Iterator[ir.Model]:
    """The model at ``path`` with its large tables read packed (:func:`packed_tables` at ``limit``) and every
    weight of over 1 KiB in a temporary file, mapped on first access; the file goes when the block ends."""
    model = load_model(str(path))
    packed_tables(model, limit)
    with tempfile.TemporaryDirectory(prefix="onnxprec-run-") as folder:
        copy = Path(folder) / "model.onnx"
        try:
            ir.save(model, copy, external_data="model.onnx.data", size_threshold_bytes=1024)
        except OSError as e:  # a full or read-only temporary directory
            raise ValidationError(
                f"cannot write the copy the result's check runs from in {folder}: {e.strerror or e}; set TMPDIR to "
                "a folder with room for the model"
            ) from e
        del model
        trim_heap()  # the parsed file's weights
        yield load_model(copy)


def _table(node: ir.Node, limit: int) -> ir.Value | None:
    """The levels ``node`` dequantizes when it is a constant 4-bit blockwise ``DequantizeLinear`` of float32 scales
    whose output is larger than ``limit`` bytes, else None."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    data, scales = node.inputs[0], node.inputs[1]
    zero = node.inputs[2] if len(node.inputs) > 2 else None
    constant = all(v is None or (v.is_initializer() and v.const_value is not None) for v in (data, scales, zero))
    if data is None or scales is None or not constant or data.dtype not in _FOUR_BITS:
        return None
    block = _block_size(node)
    if data.shape is None or len(data.shape) != 2 or scales.dtype != ir.DataType.FLOAT or block is None:
        return None
    if zero is not None and zero.dtype != data.dtype:
        return None
    return data if math.prod(data.shape.numpy()) * 4 > limit else None


def _block_size(node: ir.Node) -> int | None:
    """The node's ``block_size`` when it is a power of two >= 16 (what both replacements take), else None."""
    block = node.attributes.get_int("block_size", 0)
    return block if block >= 16 and block & (block - 1) == 0 else None


def _axis(node: ir.Node) -> int:
    axis = node.attributes.get_int("axis", 1)
    return axis + 2 if axis < 0 else axis


def _replacement(dq: ir.Node, reader: ir.Node, index: int, names: NameAllocator) -> ir.Node | None:
    """The node that replaces ``reader`` (reading ``dq``'s output at input ``index``), or None to keep it."""
    if reader.domain not in ("", "ai.onnx"):
        return None
    if reader.op_type == "Gather" and index == 0:
        return _gather(dq, reader, names)
    if reader.op_type == "MatMul" and index == 1 and _axis(dq) == 0 and _pads_to_zero(dq):
        return _matmul(dq, reader, names)
    return None


def _pads_to_zero(dq: ir.Node) -> bool:
    """Whether MatMulNBits' rows past K (a last block shorter than ``block_size``) dequantize to zero: levels of 8
    with the implicit zero point, i.e. signed levels without zero points, or K a whole number of blocks."""
    data = dq.inputs[0]
    assert data is not None and data.shape is not None
    signed_without_zero_points = data.dtype == ir.DataType.INT4 and (len(dq.inputs) < 3 or dq.inputs[2] is None)
    return signed_without_zero_points or data.shape.numpy()[0] % dq.attributes.get_int("block_size", 0) == 0


def _outputs_like(reader: ir.Node, names: NameAllocator) -> list[ir.Value]:
    old = reader.outputs[0]
    return [ir.Value(name=names(f"{old.name}_packed"), type=old.type, shape=old.shape)]


def _gather(dq: ir.Node, reader: ir.Node, names: NameAllocator) -> ir.Node:
    axis = reader.attributes.get_int("axis", 0)
    attributes = [
        ir.AttrInt64("gather_axis", axis + 2 if axis < 0 else axis),
        ir.AttrInt64("quantize_axis", _axis(dq)),
        ir.AttrInt64("block_size", dq.attributes.get_int("block_size", 0)),
    ]
    inputs = [dq.inputs[0], reader.inputs[1], *dq.inputs[1:]]
    return ir.Node("com.microsoft", "GatherBlockQuantized", inputs, attributes=attributes,
                   outputs=_outputs_like(reader, names), name=names.node(f"{reader.name}_packed"))  # fmt: skip


def _matmul(dq: ir.Node, reader: ir.Node, names: NameAllocator) -> ir.Node:
    data, scales = dq.inputs[0], dq.inputs[1]
    zero = dq.inputs[2] if len(dq.inputs) > 2 else None
    assert data is not None and scales is not None and data.const_value is not None and data.shape is not None
    k, n = data.shape.numpy()
    block = dq.attributes.get_int("block_size", 0)
    blocks = math.ceil(k / block)
    signed = data.dtype == ir.DataType.INT4
    # MatMulNBits' levels are unsigned with an implicit zero point of 8: a signed level's nibble with its top bit
    # flipped is that level + 8; unsigned levels keep their nibbles and their zero points (0 when none is given).
    flip = 8 if signed else 0
    levels = _repacked(data.const_value, k, n, block, flip)
    scale_values = np.ascontiguousarray(np.asarray(scales.const_value.numpy(), dtype=np.float32).T).reshape(-1)  # type: ignore[union-attr]
    inputs = [
        reader.inputs[0],
        _initializer(reader.graph, names, f"{data.name}_B", levels),
        _initializer(reader.graph, names, f"{scales.name}_packed", scale_values),
    ]
    if zero is not None or not signed:
        if zero is None:
            points = np.zeros((n, blocks), dtype=np.uint8)
        else:
            points = np.ascontiguousarray(_nibbles(_bytes(zero.const_value), blocks, n).T) ^ np.uint8(flip)
        if blocks % 2:
            points = np.concatenate([points, np.full((n, 1), 8 if signed else 0, np.uint8)], axis=1)
        inputs.append(_initializer(reader.graph, names, f"{data.name}_zero_points_packed", pack_nibbles(points)))
    sizes = {"K": k, "N": n, "bits": 4, "block_size": block}
    attributes = [ir.AttrInt64(key, value) for key, value in sizes.items()]
    return ir.Node("com.microsoft", "MatMulNBits", inputs, attributes=attributes,
                   outputs=_outputs_like(reader, names), name=names.node(f"{reader.name}_packed"))  # fmt: skip


def _nibbles(raw: np.ndarray, rows: int, columns: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Columns ``start:stop`` (``start`` even) of a row-major 4-bit ``[rows, columns]`` tensor's bytes ``raw`` as
    uint8 nibbles."""
    stop = columns if stop is None else stop
    if columns % 2:  # rows share bytes: unpack the whole tensor
        return unpack_nibbles(raw)[: rows * columns].reshape(rows, columns)[:, start:stop]
    part = raw.reshape(rows, columns // 2)[:, start // 2 : (stop + 1) // 2]
    return unpack_nibbles(part)[:, : stop - start]


def _bytes(tensor: ir.TensorProtocol | None) -> np.ndarray:
    assert tensor is not None
    return np.frombuffer(tensor.tobytes(), dtype=np.uint8)


def _repacked(tensor: ir.TensorProtocol, k: int, n: int, block: int, flip: int) -> np.ndarray:
    """MatMulNBits' ``B`` ``[N, blocks, block / 2]`` of the 4-bit ``[K, N]`` levels, a column range at a time (rows
    past K hold 8: zero after the implicit zero point, :func:`_pads_to_zero`)."""
    blocks = math.ceil(k / block)
    raw = _bytes(tensor)
    out = np.empty((n, blocks, block // 2), dtype=np.uint8)
    step = _COLUMNS_AT_ONCE
    for start in range(0, n, step):
        stop = min(n, start + step)
        unsigned = np.full((stop - start, blocks * block), 8, dtype=np.uint8)
        unsigned[:, :k] = _nibbles(raw, k, n, start, stop).T ^ flip
        out[start:stop] = pack_nibbles(unsigned.reshape(stop - start, blocks, block))
    return out


def _initializer(graph: ir.Graph | None, names: NameAllocator, base: str, array: np.ndarray) -> ir.Value:
    assert graph is not None
    name = names(base)
    value = ir.Value(name=name, const_value=ir.Tensor(array, name=name))
    graph.register_initializer(value)
    return value
