"""Give every node and value a unique name (unnamed nodes become ``<OpType>_<n>``)."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

__all__ = ["NameNodesPass"]


class _OpTypeNames:
    """Names unnamed nodes after their op type, like ModelOpt's ``{op}_{n}``; values keep ``v``-style names."""

    def generate_node_name(self, node: ir.Node) -> str:
        return node.name or node.op_type

    def generate_value_name(self, value: ir.Value) -> str:
        return value.name or "val"


class NameNodesPass(ir.passes.InPlacePass):
    """Makes node and value names unique across the model, subgraphs included.

    Graph inputs and outputs keep their names. Duplicate or missing names get a numeric suffix, so the
    bookkeeping of later passes (and the names users pass to ``nodes_to_exclude``) is unambiguous.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return NameFixPass(name_generator=_OpTypeNames())(model)
