"""Rewrites of a graph run piece by piece (:mod:`onnxprec.reference`) that keep its values and lower its memory.

A tied embedding is often written as ``Transpose(head weight) -> Gather``: the piece holding the Gather would compute
the whole transposed table (671 MB for a 262,144 x 640 Gemma-3 table) to read a few of its rows. The Gather reads
the weight's columns instead, ``Gather(W, ids, axis=1) -> Transpose``: the same values, computed from the mapped
weight alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import onnx
import onnx_ir as ir

__all__ = ["gather_columns", "gather_model_columns", "is_matmulnbits"]


def is_matmulnbits(node: onnx.NodeProto) -> bool:
    return node.op_type == "MatMulNBits" and node.domain == "com.microsoft"


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    attribute = next((a for a in node.attribute if a.name == name), None)
    return None if attribute is None else list(attribute.ints) if attribute.ints else [int(attribute.i)]


def gather_columns(
    proto: onnx.ModelProto, keep: Collection[str], info_of: Callable[[str], onnx.ValueInfoProto | None]
) -> Callable[[str], onnx.ValueInfoProto | None]:
    """Rewrites, in place, each row Gather of a transposed 2-D initializer into a column Gather of the initializer
    and a Transpose of its result; a Transpose nothing else reads is removed. ``keep``: tensors that must stay
    (observed; the graph outputs stay too). Returns ``info_of`` that also knows the new tensors (each Gather's
    column result)."""
    graph = proto.graph
    keep = {*keep, *(o.name for o in graph.output)}
    tables = {t.name: t for t in graph.initializer if len(t.dims) == 2}
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    infos: dict[str, onnx.ValueInfoProto] = {}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        nodes.append(node)
        source = producer.get(node.input[0]) if node.op_type == "Gather" and node.domain in ("", "ai.onnx") else None
        if source is None or source.op_type != "Transpose" or source.input[0] not in tables:
            continue
        ids = info_of(node.input[1])
        if (_ints(node, "axis") or [0]) != [0] or _ints(source, "perm") not in (None, [1, 0]) or ids is None:
            continue
        if node.input[0] in keep or not ids.type.tensor_type.HasField("shape"):
            continue
        rank = len(ids.type.tensor_type.shape.dim)
        columns = f"{node.output[0]}__columns"
        readers[node.input[0]] -= 1
        node.input[0] = source.input[0]
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("axis", 1))
        node.output[0], out = columns, node.output[0]
        nodes.append(
            onnx.helper.make_node(
                "Transpose", [columns], [out], name=f"{node.name}__rows", perm=[*range(1, rank + 1), 0]
            )
        )
        infos[columns] = onnx.helper.make_tensor_value_info(columns, tables[source.input[0]].data_type, None)
    unread = {name for name, count in readers.items() if count == 0} - set(keep)
    kept = [n for n in nodes if not (n.op_type == "Transpose" and n.output and n.output[0] in unread)]
    del graph.node[:]
    graph.node.extend(kept)
    return lambda name: infos.get(name) or info_of(name)


def gather_model_columns(model: ir.Model) -> int:
    """:func:`gather_columns` on an ``ir.Model`` (whose weights stay as they are: mapped or lazy), for a session of
    the whole model, where ONNX Runtime would fold ``Transpose(weight)`` into a transposed copy. Returns how many
    Gathers now read columns."""
    graph, done = model.graph, 0
    for node in list(graph):
        if node.op_type != "Gather" or len(node.inputs) != 2:
            continue
        data, ids = node.inputs
        source = data.producer() if data is not None else None
        if data is None or source is None or source.op_type != "Transpose" or ids is None or ids.shape is None:
            continue
        table = source.inputs[0]
        perm = source.attributes.get_ints("perm", (1, 0))
        if node.attributes.get_int("axis", 0) != 0 or tuple(perm) != (1, 0) or table is None:
            continue
        if not table.is_initializer() or table.shape is None or len(table.shape) != 2 or data.is_graph_output():
            continue
        gather = ir.node("Gather", [table, ids], {"axis": 1}, name=f"{node.name}__columns")
        rows = ir.node(
            "Transpose", gather.outputs, {"perm": [*range(1, len(ids.shape) + 1), 0]}, name=f"{node.name}__rows"
        )
        ir.convenience.replace_nodes_and_values(graph, node, [node], [gather, rows], node.outputs, rows.outputs)
        if not data.uses():
            graph.remove(source, safe=True)
        done += 1
    return done
