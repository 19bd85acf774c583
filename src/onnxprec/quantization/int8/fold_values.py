"""Folding an attention context's SmoothQuant scales into the V layer that feeds it (:func:`fold_into_values`): the
heads mix tokens, not channels, so per-channel factors on V's columns reach the context unchanged and its ``1/s`` Mul
is not needed."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxprec._graph import NameAllocator
from onnxprec.quantization.int8.decisions import Decisions, LayerDecision
from onnxprec.quantization.int8.place import Plan
from onnxprec.quantization.int8.rewrite import add_initializer

__all__ = ["attention_values", "fold_into_values"]

logger = logging.getLogger(__name__)


class _MergedHeads(pattern.PatternBase):
    """The merged context ``Reshape(Transpose(MatMul(P, Transpose(Reshape(V, shape), perm)), perm))`` of an
    attention, with ``perm`` ``[0, 2, 1, 3]`` both times, where nothing else reads a value between V and the context
    (the matcher's own rule); V's other readers are checked here."""

    def pattern(self, op: Any, probs: ir.Value, values: ir.Value, split_shape: ir.Value, merge_shape: ir.Value) -> Any:
        split = op.Reshape(values, split_shape, _outputs=["split"])
        mixed = op.MatMul(probs, op.Transpose(split, perm=[0, 2, 1, 3]))
        return op.Reshape(op.Transpose(mixed, perm=[0, 2, 1, 3]), merge_shape)

    def check(self, op: Any, values: ir.Value, **_: Any) -> Any:
        result = pattern.MatchResult()
        if len(values.uses()) != 1:
            return result.fail("V is read by another node too")
        return result


_MERGED_HEADS = _MergedHeads()


def attention_values(activation: ir.Value, k: int) -> ir.Value | None:
    """The attention's V (``[B, S, K]``, before its heads are split) whose channels are ``activation``'s, if
    ``activation`` is the merged context ``Reshape(Transpose(MatMul(P, Transpose(Reshape(V, [B, S, H, D])))))``
    (:class:`_MergedHeads`); else None. Channel ``h * D + d`` of the context is channel ``h * D + d`` of V:
    per-channel factors on V's columns reach the context unchanged (the attention mixes tokens, not channels)."""
    merge = activation.producer()  # its last axis is K, the reading layers' (a valid model): [B, S, H, D] merged
    if merge is None or merge.graph is None:
        return None
    match = _MERGED_HEADS.match(None, merge.graph, merge)  # type: ignore[arg-type]  # the matcher reads no model
    if not match:
        return None
    values, split = match.bindings["values"], match.bindings["split"]
    before, after = values.shape, split.shape
    if before is None or after is None or len(before) != 3 or len(after) != 4:
        return None
    leading = all(isinstance(d, int) or d.value is not None for d in (*before[:2], *after[:2]))
    head_size = after[3]
    if not leading or list(before[:2]) != list(after[:2]) or not isinstance(head_size, int) or k % head_size:
        return None  # the last axis split into heads x head size (the leading axes proven the same), nothing else
    return values


def _path_values(activation: ir.Value, values: ir.Value) -> list[ir.Value]:
    """The values from ``values`` (V) to ``activation`` (the context) along :func:`attention_values`' path."""
    path = [activation]
    node = activation.producer()
    while node is not None and path[-1] is not values:
        source = node.inputs[1] if node.op_type == "MatMul" else node.inputs[0]
        assert source is not None
        path.append(source)
        node = source.producer()
    return path


def fold_into_values(plan: Plan, decisions: Decisions, names: NameAllocator) -> tuple[Decisions, set[str]]:
    """Folds the smoothing of each attention context into the V layer that feeds it (:func:`attention_values`):
    V's weight columns, bias, bias correction and outlier rows times ``1/s``, its INT8 levels unchanged.

    Only where the context has no split channels and V is a dynamic layer of this build whose product reaches V
    through its bias Add alone. The decisions are not changed: a copy with new V decisions is returned, with the
    names of the contexts whose Mul is no longer needed.
    """
    layers = {layer.node: layer for layer in plan.layers if layer.dynamic and layer.name in decisions.layers}
    changed: dict[str, LayerDecision] = {}
    folded: set[str] = set()
    for activation, group in plan.dynamic_groups.items():
        channel = decisions.groups.get(str(activation.name))
        group = [layer for layer in group if layer.name in decisions.layers]
        if channel is None or channel.scales is None or channel.split.size or not group:
            continue
        k = decisions.layers[group[0].name].recipe.shape()[0]
        values = attention_values(activation, k)
        add = values.producer() if values is not None else None
        if add is None or add.op_type != "Add" or len(add.inputs) != 2:
            continue
        product, bias = add.inputs
        if product is None or bias is None or product.const_value is not None:
            product, bias = bias, product
        v = layers.get(product.producer()) if product is not None else None  # type: ignore[arg-type]
        if v is None or bias is None or bias.const_value is None or len(product.uses()) != 1:  # type: ignore[union-attr]
            continue
        decision = changed.get(v.name, decisions.layers[v.name])
        if decision.recipe.shape() != (decision.recipe.shape()[0], k) or tuple(bias.const_value.shape) != (k,):
            continue
        factors = channel.factors(k).astype(np.float32)
        columns = factors if decision.recipe.columns is None else decision.recipe.columns * factors
        recipe = replace(decision.recipe, scales=(decision.recipe.scales * factors).astype(np.float32),
                         columns=columns)  # fmt: skip
        changed[v.name] = replace(
            decision,
            recipe=recipe,
            bias=None if decision.bias is None else decision.bias * factors,
            split_rows=None if decision.split_rows is None else decision.split_rows * factors[None, :],
        )
        scaled = np.asarray(bias.const_value.numpy(), dtype=np.float32) * factors
        assert add.graph is not None
        new_bias = add_initializer(add.graph, names(f"{bias.name}_smoothed"), scaled)
        add.replace_input_with(list(add.inputs).index(bias), new_bias)
        folded.add(str(activation.name))
        for value in _path_values(activation, values):  # type: ignore[arg-type]
            value.name = names(f"{value.name}_smoothed")  # they hold V / s now (compare matches tensors by name)
        logger.debug("SmoothQuant scales of '%s' folded into '%s'", activation.name, v.name)
    if not changed:
        return decisions, folded
    return replace(decisions, layers={**decisions.layers, **changed}), folded
