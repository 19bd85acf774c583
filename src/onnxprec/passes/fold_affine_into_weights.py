"""Fold per-channel ``Add``/``Sub``/``Mul``/``Div`` by constants after a Conv, Gemm or MatMul into its weight and bias.

TensorFlow models converted to ONNX (and PyTorch re-exports of them) often write BatchNormalization as a chain
``Sub(mean) -> Mul(scale) -> Add(beta)`` after a Conv without bias, and the Conv bias as a separate ``Add``. ONNX
Runtime folds them when the model is float, but once a quantizer puts Q/DQ around the Conv the chain runs in float
between DequantizeLinear and QuantizeLinear and keeps the Conv from fusing with the next layer. The chain is an
affine map ``y * s + t`` per output channel, so it folds into the layer: ``W' = W * s`` along the output channel and
``b' = b * s + t``. The fold is exact in real arithmetic; in floating point the folded weights are computed in
FP64 and rounded once (the result differs from the chain by a few units in the last place).

The rules are onnxscript rewrite rules (pattern, check, rewrite), one per layer and operator:

- ``Op(Conv(x, W[, b]), c)`` and ``Op(Gemm(x, W[, C]), c)`` for ``Op`` in Add, Sub, Mul, Div, and ``Sub(c, layer)``;
- ``Mul/Div(MatMul(x, W), c)`` into ``W``, and ``Op(Add(MatMul(x, W), b), c)`` into ``W`` and ``b``.

A rule applies only when ``c`` is a constant that broadcasts along the output-channel axis alone (a scalar, ``[C]``,
``[1, C, 1, 1]`` after a Conv; ``[N]`` or ``[1, N]`` after a Gemm or MatMul), does not widen the output, has the
weight's float type (FP16, FP32, FP64), and (for Div) has no zero; and only when no other node reads the layer's
output (the rewriter's own rule: a matched intermediate value used outside the match is never replaced). The layer
keeps its name.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

__all__ = ["FoldAffineIntoWeightsPass", "FoldAffineIntoWeightsResult"]

logger = logging.getLogger(__name__)

_BINARY = ("Add", "Sub", "Mul", "Div")


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else np.array(tensor.numpy())


def _channel_vector(c: np.ndarray, rank: int | None, axis: int, channels: int) -> np.ndarray | None:
    """``c`` as one value per channel when it broadcasts along ``axis`` of a rank-``rank`` output only."""
    if rank is None:
        rank = max(c.ndim, 1)
        if c.ndim > 1:
            return None  # might widen an output of unknown rank
    if c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    axis %= rank
    if any(size != 1 for i, size in enumerate(shape) if i != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))


def _affine(op_type: str, c: np.ndarray, const_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(s, t)`` with ``Op(y, c) = y * s + t`` (``Sub(c, y)`` when ``const_first``)."""
    one, zero = np.ones_like(c), np.zeros_like(c)
    if op_type == "Add":
        return one, c
    if op_type == "Sub":
        return (-one, c) if const_first else (one, -c)
    if op_type == "Mul":
        return c, zero
    return 1.0 / c, zero  # Div


def _rank(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def _named(value: ir.Value, node: ir.Node | None) -> ir.Value:
    """``value`` with its producer named as ``node`` (the layer keeps its name: exclusion patterns still match)."""
    producer = value.producer()
    if producer is not None and node is not None:
        producer.name = node.name
    return value


class _FoldIntoLayer(pattern.RewriteRuleClassBase):
    """``Op(layer(x, W, ...), c)`` (or ``Sub(c, layer)``) with the affine map folded into the layer's W and bias."""

    def __init__(self, layer: str, op_type: str, const_first: bool = False) -> None:
        super().__init__(f"Fold{op_type}Into{layer}" + ("Reversed" if const_first else ""))
        self.layer, self.op_type, self.const_first = layer, op_type, const_first

    def pattern(self, op: Any, x: ir.Value, w: ir.Value, c: ir.Value) -> Any:
        y = getattr(op, self.layer)(x, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])
        return getattr(op, self.op_type)(c, y) if self.const_first else getattr(op, self.op_type)(y, c)

    def _parts(self, x: ir.Value, w: ir.Value, c: ir.Value, y: ir.Value) -> tuple[Any, ...] | None:
        """(layer node, W, bias or None, s, t, output-channel axis of W) when the rule applies."""
        node = y.producer()
        weight, constant = _const(w), _const(c)
        if node is None or weight is None or constant is None or weight.dtype != constant.dtype:
            return None
        if weight.dtype.kind != "f":  # float types; BF16 weights are not folded
            return None
        bias_value = node.inputs[2] if len(node.inputs) > 2 else None
        bias = _const(bias_value)
        if bias_value is not None and bias is None:
            return None
        rank: int | None
        if self.layer == "Conv":
            channels, rank, axis, w_axis = weight.shape[0], weight.ndim, 1, 0
        elif self.layer == "Gemm":
            trans_b = node.attributes.get_int("transB", 0)
            w_axis = 0 if trans_b else 1
            channels, rank, axis = weight.shape[w_axis], 2, -1
            if bias is not None and _channel_vector(bias, 2, -1, channels) is None:
                return None  # a [M, N] bias: not one value per channel
        else:  # MatMul: y = x @ W, W [K, N]
            if weight.ndim != 2 or self.op_type in ("Add", "Sub") or self.const_first:
                return None  # an Add after a MatMul is its bias
            channels, axis, w_axis = weight.shape[1], -1, 1
            rank = _rank(x)
        vector = _channel_vector(constant, rank, axis, channels)
        if vector is None or (self.op_type == "Div" and not np.all(vector)):
            return None
        s, t = _affine(self.op_type, vector, self.const_first)
        return node, weight, bias, s, t, w_axis

    def check(self, op: Any, *args: Any, **bindings: Any) -> Any:
        result = pattern.MatchResult()
        if self._parts(bindings["x"], bindings["w"], bindings["c"], bindings["y"]) is None:
            return result.fail("not a per-channel constant of the layer's float type, or the layer is not foldable")
        return result

    def rewrite(self, op: Any, x: ir.Value, w: ir.Value, c: ir.Value, y: ir.Value, **_: Any) -> Any:
        parts = self._parts(x, w, c, y)
        assert parts is not None  # check() passed
        node, weight, bias, s, t, w_axis = parts
        dtype = weight.dtype
        shape = [1] * weight.ndim
        shape[w_axis] = -1
        new_weight = (weight.astype(np.float64) * s.reshape(shape)).astype(dtype)
        stem = f"{node.outputs[0].name}_folded"
        inputs = [x, op.initializer(ir.tensor(new_weight), name=f"{stem}_weight")]
        attributes = dict(node.attributes)
        if self.layer == "MatMul":
            return _named(op.MatMul(*inputs), node)
        if self.layer == "Gemm":
            beta = attributes.pop("beta").as_float() if "beta" in attributes else 1.0
            old = 0.0 if bias is None else beta * np.broadcast_to(bias.reshape(-1).astype(np.float64), s.shape)
            attributes["beta"] = ir.AttrFloat32("beta", 1.0)
        else:
            old = 0.0 if bias is None else bias.astype(np.float64)
        new_bias = (old * s + t).astype(dtype)
        inputs.append(op.initializer(ir.tensor(new_bias), name=f"{stem}_bias"))
        return _named(getattr(op, self.layer)(*inputs, **dict(attributes)), node)


class _FoldIntoMatMulBias(pattern.RewriteRuleClassBase):
    """``Op(Add(MatMul(x, W), b), c)``: Mul/Div fold into ``W`` and ``b``, Add/Sub into ``b``."""

    def __init__(self, op_type: str) -> None:
        super().__init__(f"Fold{op_type}IntoMatMulBias")
        self.op_type = op_type

    def pattern(self, op: Any, x: ir.Value, w: ir.Value, b: ir.Value, c: ir.Value) -> Any:
        return getattr(op, self.op_type)(op.Add(op.MatMul(x, w, _outputs=["y"]), b, _outputs=["biased"]), c)

    def _parts(self, x: ir.Value, w: ir.Value, b: ir.Value, c: ir.Value) -> tuple[Any, ...] | None:
        weight, bias, constant = _const(w), _const(b), _const(c)
        if weight is None or bias is None or constant is None or weight.ndim != 2 or weight.dtype.kind != "f":
            return None
        if bias.dtype != weight.dtype or constant.dtype != weight.dtype:
            return None
        channels, rank = weight.shape[1], _rank(x)
        bias_vector = _channel_vector(bias, rank, -1, channels)
        vector = _channel_vector(constant, rank, -1, channels)
        if bias_vector is None or vector is None or (self.op_type == "Div" and not np.all(vector)):
            return None
        s, t = _affine(self.op_type, vector, False)
        return weight, bias_vector, s, t

    def check(self, op: Any, *args: Any, **bindings: Any) -> Any:
        result = pattern.MatchResult()
        if self._parts(bindings["x"], bindings["w"], bindings["b"], bindings["c"]) is None:
            return result.fail("not a per-channel constant of the weight's float type")
        return result

    def rewrite(self, op: Any, x: ir.Value, w: ir.Value, b: ir.Value, c: ir.Value, y: ir.Value, **_: Any) -> Any:
        parts = self._parts(x, w, b, c)
        assert parts is not None
        weight, bias, s, t = parts
        stem = f"{y.name}_folded"
        if self.op_type in ("Mul", "Div"):
            new_weight = op.initializer(
                ir.tensor((weight.astype(np.float64) * s).astype(weight.dtype)), f"{stem}_weight"
            )
        else:
            new_weight = w
        new_bias = op.initializer(ir.tensor((bias * s + t).astype(weight.dtype)), name=f"{stem}_bias")
        matmul, add = y.producer(), next(iter(y.uses()))[0]
        return _named(op.Add(_named(op.MatMul(x, new_weight), matmul), new_bias), add)


def _rules() -> pattern.RewriteRuleSet:
    rules = [_FoldIntoLayer.rule(layer, op_type) for layer in ("Conv", "Gemm", "MatMul") for op_type in _BINARY]
    rules += [_FoldIntoLayer.rule(layer, "Sub", const_first=True) for layer in ("Conv", "Gemm")]
    rules += [_FoldIntoMatMulBias.rule(op_type) for op_type in _BINARY]
    return pattern.RewriteRuleSet(rules, commute=True)


@dataclasses.dataclass
class FoldAffineIntoWeightsResult(ir.passes.PassResult):
    """The result of :class:`FoldAffineIntoWeightsPass`: how many Add/Sub/Mul/Div nodes were ``folded``."""

    folded: int = 0


class FoldAffineIntoWeightsPass(ir.passes.InPlacePass):
    """Folds per-channel affine chains after Conv, Gemm and MatMul layers into their weights, in every graph (the
    rewriter visits If/Loop/Scan bodies too).

    Applied until nothing changes (each application folds one operator of a chain); the initializers of the main
    graph that the folds left unread are removed.
    """

    def call(self, model: ir.Model) -> FoldAffineIntoWeightsResult:
        rules = _rules()
        initializers = model.graph.initializers
        unread = {name for name, value in initializers.items() if not value.uses()}  # left as they were
        folded = 0
        while True:
            count = _apply(rules, model)
            folded += count
            if not count:
                break
        for name, value in list(initializers.items()):
            if name not in unread and not value.uses() and not value.is_graph_input() and not value.is_graph_output():
                initializers.pop(name)
        if folded:
            logger.debug("Folded %d per-channel Add/Sub/Mul/Div into Conv, Gemm and MatMul weights", folded)
        return FoldAffineIntoWeightsResult(model, modified=bool(folded), folded=folded)


def _apply(rules: pattern.RewriteRuleSet, model: ir.Model) -> int:
    count: int = rules.apply_to_model(model)
    return count
