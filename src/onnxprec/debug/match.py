"""Which tensor of a converted or quantized model holds the values of a tensor of its source model.

Converters keep most names, but not all: AutoCast renames a graph output's producer output (``y`` becomes
``y_pre_cast`` behind a Cast that keeps the public name) and removes Casts that became no-ops; INT4 replaces a
MatMul's weight by a DequantizeLinear output or the whole node by ``MatMulNBits``. :func:`match_values` tries,
for each reference tensor, in this order:

1. ``name``: the candidate tensor of the same name;
2. ``original name``: a candidate tensor whose ``metadata_props["onnxprec.original_name"]`` records that name;
3. ``producer``: the same output of the candidate node named like the reference tensor's producer;
4. ``through <op>``: the reference tensor is the output of a value-preserving Cast or Identity that the candidate
   dropped; it matches what the Cast's input matches;
5. ``via consumer``: the candidate node named like a consumer of the reference tensor reads, through a chain of
   Cast / QuantizeLinear / DequantizeLinear / Identity, the output of a node of the reference producer's name or
   op type -- or, when the reference producer is a Relu or Clip, through QuantizeLinear/DequantizeLinear the output
   of the node that feeds it (the converter removed the clamp because the quantization range does its work).

**The value its consumers see.** A quantized model's consumers read a tensor through QuantizeLinear ->
DequantizeLinear. When every consumer of the matched candidate tensor reads it that way, the DequantizeLinear output
is compared (``how`` ends with ``-> consumers' DequantizeLinear``): the quantization error is part of the candidate.

**Names that survive a removed op.** A converter that removes an op may leave the op's output name on the tensor
of the node before it (ONNX Runtime's quantizer drops a Clip before a QuantizeLinear and names the Conv's output
``/Clip_output_0``): that tensor holds the Conv's values, not the Clip's. A same-named candidate tensor whose
producer is the twin (same name and op type) of a *different* reference node is therefore matched to that node's
output, not by name; the reference tensor gets the value its consumers see instead, or stays unmatched.

Only tensors ONNX Runtime can fetch qualify (node outputs or graph outputs of the main graph, not INT4).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from onnxprec._graph import FLOAT_TYPES, ORIGINAL_NAME
from onnxprec.debug._common import fetchable

__all__ = ["Match", "carried_source", "carrier_ops", "consumers_view", "match_values"]

# Ops whose work a QuantizeLinear's range can do (a quantizer may drop them before one).
_CLAMPS = frozenset({"Relu", "Clip"})

# Ops a converter inserts that carry a tensor's values on (up to rounding or quantization).
_CARRIERS = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Identity"})


@dataclass(frozen=True)
class Match:
    """The candidate tensor matched to one reference tensor, and how it was found (``candidate`` None: none)."""

    reference: ir.Value
    candidate: ir.Value | None
    how: str


class _Index:
    """Lookups over the candidate's main graph."""

    def __init__(self, model: ir.Model) -> None:
        graph = model.graph
        self.by_name: dict[str, ir.Value] = {}
        self.by_original: dict[str, list[ir.Value]] = {}
        self.nodes: dict[str, ir.Node] = {}
        for node in graph:
            if node.name:
                self.nodes.setdefault(node.name, node)
            for out in node.outputs:
                self._add(out)
        for out in graph.outputs:
            self._add(out)

    def _add(self, value: ir.Value) -> None:
        if not value.name or not fetchable(value):
            return
        self.by_name.setdefault(value.name, value)
        original = value.metadata_props.get(ORIGINAL_NAME)
        if original and original != value.name:
            self.by_original.setdefault(original, []).append(value)


def _is_float_cast(node: ir.Node) -> bool:
    if node.op_type == "Identity":
        return True
    if node.op_type != "Cast" or "to" not in node.attributes:
        return False
    source = node.inputs[0] if node.inputs else None
    to = ir.DataType(node.attributes["to"].as_int())
    return (
        source is not None
        and source.dtype in FLOAT_TYPES
        and to in FLOAT_TYPES
        and source.dtype.itemsize <= to.itemsize
    )


def _chain(value: ir.Value) -> tuple[ir.Value, list[str]]:
    ops: list[str] = []
    while len(ops) < 16:
        producer = value.producer()
        if producer is None or producer.op_type not in _CARRIERS or not producer.inputs or producer.inputs[0] is None:
            break
        ops.append(producer.op_type)
        value = producer.inputs[0]
    return value, ops


def carried_source(value: ir.Value) -> ir.Value:
    """The value at the start of the chain of carrier ops (Cast, Q/DQ, Identity...) ending in ``value``."""
    return _chain(value)[0]


def carrier_ops(value: ir.Value) -> list[str]:
    """The op types of that chain, nearest first."""
    return _chain(value)[1]


def consumers_view(value: ir.Value) -> ir.Value | None:
    """The DequantizeLinear output every consumer of ``value`` reads it through (QuantizeLinear -> DequantizeLinear).

    None when ``value`` is a graph output, has no consumer, or any consumer reads it otherwise.
    """
    if value.is_graph_output():
        return None
    uses = list(value.uses())
    if not uses or any(u.node.op_type != "QuantizeLinear" or u.idx != 0 for u in uses):
        return None
    views = []
    for use in uses:
        quantized = use.node.outputs[0]
        readers = list(quantized.uses())
        if quantized.is_graph_output() or not readers:
            return None
        if any(r.node.op_type != "DequantizeLinear" or r.idx != 0 for r in readers):
            return None
        views += [r.node.outputs[0] for r in readers]
    view = next((v for v in views if v.name and fetchable(v) and v.dtype in FLOAT_TYPES), None)
    return view


class _Matcher:
    def __init__(self, candidate: ir.Model, reference: ir.Graph | None) -> None:
        self.index = _Index(candidate)
        self.done: dict[ir.Value, Match] = {}
        self.ref_nodes: dict[str, ir.Node] = {}
        self.ref_values: dict[str, ir.Value] = {}
        for node in reference or ():
            if node.name:
                self.ref_nodes.setdefault(node.name, node)
            for out in node.outputs:
                if out.name:
                    self.ref_values.setdefault(out.name, out)

    def match(self, value: ir.Value, depth: int = 0) -> Match:
        found = self.done.get(value)
        if found is None:
            found = self._viewed(self._find(value, depth))
            self.done[value] = found
        return found

    def _holds_other(self, value: ir.Value, candidate: ir.Value) -> ir.Node | None:
        """The reference node whose output ``candidate`` holds when that is not ``value``'s producer.

        That is the case when the candidate's producer is the twin (same name and op type) of another reference
        node: the converter removed or fused ``value``'s producer and left its output name on the tensor before.
        """
        producer, origin = value.producer(), candidate.producer()
        if producer is None or origin is None or not origin.name or origin.name == producer.name:
            return None
        twin = self.ref_nodes.get(origin.name)
        return twin if twin is not None and twin is not producer and twin.op_type == origin.op_type else None

    def _viewed(self, found: Match) -> Match:
        """The match moved to the value the candidate's consumers see, when they all read it quantized."""
        candidate = found.candidate
        if candidate is None:
            return found
        # A tensor that carries another reference tensor's name (a removed op's output) is compared raw: its
        # consumers' view includes the removed op's effect.
        other = self.ref_values.get(candidate.name or "")
        if other is not None and other is not found.reference:
            return found
        view = consumers_view(candidate)
        if view is None or not self._read_by_twins(found.reference, view):
            return found
        return Match(found.reference, view, f"{found.how} -> consumers' DequantizeLinear")

    def _read_by_twins(self, value: ir.Value, view: ir.Value) -> bool:
        """Whether the candidate nodes reading ``view`` read ``value`` in the reference (through carrier ops).

        False when they are twins of reference nodes that read something else: the converter removed an op between
        (a Clip dropped before a QuantizeLinear), so the view holds that op's result, not ``value``.
        """
        twins = [self.ref_nodes[u.node.name] for u in view.uses() if u.node.name in self.ref_nodes]
        if not twins:
            return True
        return any(v is not None and carried_source(v) is value for twin in twins for v in twin.inputs)

    def _find(self, value: ir.Value, depth: int) -> Match:
        index = self.index
        name = value.name or ""
        survivor = None
        if name in index.by_name:
            candidate = index.by_name[name]
            holder = self._holds_other(value, candidate)
            if holder is None:
                return Match(value, candidate, "name")
            survivor = self._survivor(value, candidate, holder)
            if survivor.candidate is not None:
                return survivor
        renamed = index.by_original.get(name)
        if renamed:
            # Prefer the tensor computed by a real node over the Cast that re-exposes it.
            renamed = sorted(renamed, key=lambda v: v.producer() is not None and v.producer().op_type == "Cast")  # type: ignore[union-attr]
            return Match(value, renamed[0], "original name")
        producer = value.producer()
        if producer is None:
            return Match(value, None, "not a node output")
        twin = index.nodes.get(producer.name or "")
        position = value.index()
        if twin is not None and position is not None and position < len(twin.outputs):
            out = twin.outputs[position]
            if out.name and fetchable(out):
                return Match(value, out, "producer")
        if _is_float_cast(producer) and producer.inputs[0] is not None and depth < 32:
            upstream = self.match(producer.inputs[0], depth + 1)
            if upstream.candidate is not None:
                return Match(value, upstream.candidate, f"through {producer.op_type}")
        ref_origin = carried_source(value).producer() or producer
        for node, idx in self._uses(value):
            consumer = index.nodes.get(node.name or "")
            if consumer is None or idx >= len(consumer.inputs) or consumer.inputs[idx] is None:
                continue
            source = carried_source(consumer.inputs[idx])  # type: ignore[arg-type]
            origin = source.producer()
            if origin is None or not source.name or not fetchable(source):
                continue
            if origin.name == ref_origin.name or origin.op_type == ref_origin.op_type:
                return Match(value, source, f"via consumer {node.name}")
            seen = consumer.inputs[idx]
            removed = producer.op_type in _CLAMPS and origin.name in self._feeders(producer)
            if removed and "DequantizeLinear" in carrier_ops(seen):  # type: ignore[arg-type]
                return Match(value, seen, f"via consumer {node.name}: {producer.op_type} removed, its effect quantized")
        return survivor or Match(value, None, "no candidate tensor")

    def _feeders(self, node: ir.Node) -> set[str]:
        """Names of the reference nodes producing ``node``'s inputs."""
        return {p.name for v in node.inputs if v is not None and (p := v.producer()) is not None and p.name}

    def _survivor(self, value: ir.Value, candidate: ir.Value, holder: ir.Node) -> Match:
        """The match of a reference tensor whose name survives on ``holder``'s output in the candidate."""
        gone = value.producer().op_type  # type: ignore[union-attr]
        removed = f"'{candidate.name}' holds the output of {holder.op_type} '{holder.name}' (the {gone} was removed)"
        view = consumers_view(candidate)
        if view is None:
            return Match(value, None, f"unmatched: {removed}")
        return Match(value, view, f"consumers' DequantizeLinear; {removed}")

    def _uses(self, value: ir.Value, depth: int = 0) -> list[tuple[ir.Node, int]]:
        """The reference's consumers of ``value``, looking through carrier ops the candidate does not have."""
        uses = []
        for use in value.uses():
            uses.append((use.node, use.idx))
            if use.node.op_type in _CARRIERS and use.node.name not in self.index.nodes and depth < 16:
                for out in use.node.outputs:
                    uses += self._uses(out, depth + 1)
        return uses


def match_values(candidate: ir.Model, values: Iterable[ir.Value]) -> dict[ir.Value, Match]:
    """Matches each reference value (node outputs of the reference's main graph) to a candidate tensor.

    Args:
        candidate: The converted or quantized model.
        values: Values of the reference model.

    Returns:
        A :class:`Match` per value (``candidate`` is None where nothing matched; ``how`` says why).
    """
    values = list(values)
    producers = (v.producer() for v in values)
    reference = next((p.graph for p in producers if p is not None and p.graph is not None), None)
    matcher = _Matcher(candidate, reference)
    return {value: matcher.match(value) for value in values}
