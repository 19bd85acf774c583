"""Replace ``If`` nodes whose branch is known by the nodes of that branch.

A model such as Silero VAD keeps its layers inside the two branches of an ``If`` on its sample rate. A run of the
model can only hand out tensors of its main graph, so a copy with the branch the data takes inlined exposes the
branch's tensors, under their own names, to the runtime. The branch's nodes and initializers move into the
enclosing graph in front of the ``If``; each output of the ``If`` becomes an ``Identity`` of the branch's output
and keeps its name, so the copy has the model's inputs and outputs. Values of the enclosing graph that the branch
read stay the same values. Names stay unique: ONNX allows no name of a subgraph to repeat one of its enclosing
graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import onnx_ir as ir

from onnxprec._ops import is_default_domain

__all__ = ["InlineTakenBranchesPass"]

logger = logging.getLogger(__name__)


def _inline(node: ir.Node, branch: ir.Graph) -> None:
    graph = node.graph
    assert graph is not None
    nodes = list(branch)
    branch.remove(nodes, safe=False)
    graph.insert_before(node, nodes)
    for name in list(branch.initializers):
        value = branch.initializers.pop(name)
        graph.register_initializer(value)
    results = list(branch.outputs)
    branch.outputs.clear()
    identities = [
        ir.Node("", "Identity", [result], name=f"{node.name}_inlined_{i}") for i, result in enumerate(results)
    ]
    graph.insert_before(node, identities)
    for old, identity in zip(node.outputs, identities):
        new = identity.outputs[0]
        new.type, new.shape = old.type, old.shape
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    names = [str(old.name) for old in node.outputs]
    graph.remove(node, safe=True)
    for identity, name in zip(identities, names):
        identity.outputs[0].name = name


class InlineTakenBranchesPass(ir.passes.InPlacePass):
    """Inlines the named ``If`` nodes of the main graph: ``taken`` maps an ``If``'s name to its condition (True:
    ``then_branch``). Nested ``If`` nodes of an inlined branch are inlined too when ``taken`` names them (their
    branches are then in the main graph)."""

    def __init__(self, taken: Mapping[str, bool]) -> None:
        super().__init__()
        self.taken = dict(taken)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        inlined = 0
        changed = True
        while changed:  # an inlined branch brings its own If nodes into the main graph
            changed = False
            for node in list(model.graph):
                condition = self.taken.get(str(node.name))
                if node.op_type != "If" or not is_default_domain(node.domain) or condition is None:
                    continue
                attr = node.attributes.get("then_branch" if condition else "else_branch")
                if attr is None or attr.type != ir.AttributeType.GRAPH:
                    continue
                _inline(node, attr.as_graph())
                inlined += 1
                changed = True
        logger.debug("Inlined %d If branches", inlined)
        return ir.passes.PassResult(model, modified=bool(inlined))
