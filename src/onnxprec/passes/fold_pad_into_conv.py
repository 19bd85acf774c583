"""Fold a zero-padding ``Pad`` into the ``pads`` of the ``Conv`` that reads it (exact).

PyTorch exports "same" padding of TensorFlow-style networks (EfficientNet-Lite, MobileNet ports) as an explicit
``Pad`` in front of each ``Conv``. ONNX Runtime folds it when the model is float, but once a quantizer puts
QuantizeLinear/DequantizeLinear between them the ``Pad`` stays, runs in float and keeps the ``Conv`` from fusing into
``QLinearConv``. Folding it first is exact: a constant Pad with value 0 on the spatial axes only is the Conv's own
zero padding. Pads computed from constants (``ConstantOfShape -> Concat -> Reshape -> Slice -> Transpose``, as
PyTorch writes ``F.pad``) are evaluated once with ONNX's reference evaluator.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxprec._ops import is_default_domain

__all__ = ["FoldPadIntoConvPass", "constant_value"]

logger = logging.getLogger(__name__)

_MAX_CONSTANT_NODES = 64


def constant_value(value: ir.Value | None) -> np.ndarray | None:
    """The value of a tensor computed from initializers and Constant nodes only (None otherwise).

    Small subgraphs (at most 64 nodes, no graph input among their sources) are evaluated with
    ``onnx.reference.ReferenceEvaluator``; an initializer or a Constant node is read directly.
    """
    if value is None:
        return None
    if value.const_value is not None:
        return np.asarray(value.const_value.numpy())
    nodes: list[ir.Node] = []
    seen: set[int] = set()
    stack = [value]
    initializers: dict[str, ir.Value] = {}
    while stack:
        current = stack.pop()
        if current.const_value is not None and current.name:
            initializers[current.name] = current
            continue
        producer = current.producer()
        if producer is None or not is_default_domain(producer.domain) or producer.graph is None:
            return None  # a graph input, or an op the reference evaluator may not know
        if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in producer.attributes.values()):
            return None
        if id(producer) in seen:
            continue
        seen.add(id(producer))
        nodes.append(producer)
        if len(nodes) > _MAX_CONSTANT_NODES:
            return None
        stack.extend(v for v in producer.inputs if v is not None)
    order = {id(node): i for i, node in enumerate(value.graph or nodes[0].graph or [])} if nodes else {}
    nodes.sort(key=lambda node: order.get(id(node), 0))
    try:
        from onnx.reference import ReferenceEvaluator

        graph = onnx.helper.make_graph(
            [ir.serde.serialize_node(node) for node in nodes],
            "constant",
            [],
            [onnx.helper.make_tensor_value_info(str(value.name), onnx.TensorProto.UNDEFINED, None)],
            [ir.serde.serialize_tensor(v.const_value) for v in initializers.values() if v.const_value is not None],
        )
        for tensor, name in zip(graph.initializer, initializers):
            tensor.name = name
        opsets = nodes[0].graph.opset_imports if nodes[0].graph is not None else {"": 17}
        proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
        (result,) = ReferenceEvaluator(proto).run(None, {})
    except Exception as e:  # not evaluable here: leave the Pad alone
        logger.debug("Could not evaluate '%s': %s", value.name, e)
        return None
    return np.asarray(result)


def _zero_constant(pad: ir.Node) -> bool:
    if len(pad.inputs) > 2 and pad.inputs[2] is not None:
        fill = constant_value(pad.inputs[2])
        if fill is None or np.any(fill != 0):
            return False
    return len(pad.inputs) <= 3 or pad.inputs[3] is None


def _spatial_pads(pad: ir.Node, conv: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """The begin and end pads of ``pad``'s spatial axes when it is ``conv``'s own zero padding (else None)."""
    mode = pad.attributes.get("mode")
    if mode is not None and mode.as_string() != "constant":
        return None
    if _auto_pad(conv) or not _zero_constant(pad):
        return None
    pads = constant_value(pad.inputs[1]) if len(pad.inputs) > 1 else None
    if pads is None or pads.ndim != 1 or pads.size % 2 or np.any(pads < 0):
        return None
    rank = pads.size // 2
    begins, ends = pads[:rank].astype(int), pads[rank:].astype(int)
    if rank < 3 or np.any(begins[:2]) or np.any(ends[:2]):
        return None
    return begins[2:], ends[2:]


class _FoldPadIntoConv(pattern.RewriteRuleClassBase):
    """``Conv(Pad(x, pads, ...), W, ...)`` -> ``Conv(x, W, ...)`` with the Pad's spatial pads added to the Conv's."""

    def pattern(self, op: Any, x: ir.Value, pads: ir.Value) -> Any:
        padded = op.Pad(x, pads, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["padded"])
        return op.Conv(padded, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, op: Any, *args: Any, **bindings: Any) -> Any:
        result = pattern.MatchResult()
        pad, conv = bindings["padded"].producer(), bindings["y"].producer()
        if pad is None or conv is None or _spatial_pads(pad, conv) is None:
            return result.fail("not a constant zero Pad of the spatial axes, or the Conv sets auto_pad")
        return result

    def rewrite(self, op: Any, x: ir.Value, padded: ir.Value, y: ir.Value, **_: Any) -> Any:
        pad, conv = padded.producer(), y.producer()
        assert pad is not None and conv is not None
        spatial = _spatial_pads(pad, conv)
        assert spatial is not None  # check() passed
        begins, ends = spatial
        old = conv.attributes.get("pads")
        current = list(old.as_ints()) if old is not None else [0] * (2 * begins.size)
        merged = [current[i] + int(b) for i, b in enumerate(begins)]
        merged += [current[begins.size + i] + int(e) for i, e in enumerate(ends)]
        attributes = dict(conv.attributes)
        attributes["pads"] = ir.AttrInt64s("pads", merged)
        folded = op.Conv(x, *conv.inputs[1:], **attributes)
        folded.producer().name = conv.name  # the Conv keeps its name: exclusion patterns still match
        return folded


# A Pad that several Convs read is left alone: the rewriter replaces a matched subgraph only when nothing outside
# it reads its intermediate values (its own rule), and a per-reader copy of the Pad would be a hand-written walk
# for a layout that PyTorch and tf2onnx exports do not write (one Pad per Conv).
def _rule(rule: pattern.RewriteRuleClassBase) -> pattern.RewriteRule:
    """``rule`` without a name: a named rule tags each node it writes with its name in ``metadata_props``."""
    return pattern.RewriteRule(rule.pattern, rule.rewrite, rule.check, name=None)


_RULES = pattern.RewriteRuleSet([_rule(_FoldPadIntoConv())])


class FoldPadIntoConvPass(ir.passes.InPlacePass):
    """Removes ``Pad(mode=constant, value 0) -> Conv`` pairs by adding the spatial pads to the Conv's ``pads``, in
    every graph (the rewriter visits If/Loop/Scan bodies too).

    A Pad whose output is read by anything other than one Conv (or is a graph output), that pads the batch or
    channel axis, has negative or non-constant pads, or feeds a Conv with ``auto_pad`` set, is left alone.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count: int = _RULES.apply_to_model(model)
        if count:
            logger.debug("Folded %d Pad nodes into their Conv", count)
        return ir.passes.PassResult(model, modified=bool(count))


def _auto_pad(conv: ir.Node) -> bool:
    attr = conv.attributes.get("auto_pad")
    return attr is not None and attr.as_string() not in ("NOTSET", "")
