"""Give every node and value a unique name (unnamed nodes become ``<OpType>_<n>``)."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

from onnxprec._graph import all_graphs, all_values, record_original_name, unique_name

__all__ = ["NameNodesPass"]


class _OpTypeNames:
    """Names unnamed nodes after their op type, like ModelOpt's ``{op}_{n}``; values keep ``v``-style names."""

    def generate_node_name(self, node: ir.Node) -> str:
        return node.name or node.op_type

    def generate_value_name(self, value: ir.Value) -> str:
        return value.name or "val"


def _dedupe_node_names(model: ir.Model) -> bool:
    """Suffixes node names that repeat in another graph (NameFixPass makes them unique per graph only)."""
    used: set[str] = set()
    modified = False
    for graph in all_graphs(model.graph):  # the main graph first: its names are kept
        for node in graph:
            name = unique_name(node.name or node.op_type, used)
            if name != node.name:
                node.name = name
                modified = True
    return modified


class NameNodesPass(ir.passes.InPlacePass):
    """Makes node and value names unique across the model, subgraphs included.

    Graph inputs and outputs keep their names. Duplicate or missing names get a numeric suffix, so the
    bookkeeping of later passes (and the names users pass to ``nodes_to_exclude``) is unambiguous. A value
    renamed because its name was taken records its old name in ``metadata_props["onnxprec.original_name"]``
    (:data:`onnxprec._graph.ORIGINAL_NAME`), which saving keeps.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names = {value: value.name for value in all_values(model.graph) if value.name}
        modified = NameFixPass(name_generator=_OpTypeNames())(model).modified
        modified = _dedupe_node_names(model) or modified
        for value, name in names.items():
            if value.name != name:
                record_original_name(value, name)
        return ir.passes.PassResult(model, modified=modified)
