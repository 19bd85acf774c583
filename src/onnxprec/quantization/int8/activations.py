"""The saturating activation that reads a static tensor, as a numpy function: its range is calibrated for the
activation's output (:func:`onnxprec.quantization.algorithms.ranges.activation_range`).

On ONNX Runtime's CPU a static Conv writes its output quantized (``QLinearConv``), and a SiLU, HardSwish or Sigmoid
that ONNX Runtime has no QLinear kernel for reads it through a DequantizeLinear. Those activations flatten the
negative side (HardSwish is 0 below -3, SiLU nearly so below -6): the levels a plain range spends there change
nothing the network sees, and the positive side, where the activation is steep, loses them. Recognized, with ``x``
the static tensor and every consumer of ``x`` part of the pattern:

- ``Sigmoid(x)``; ``HardSigmoid(x)``; ``HardSwish(x)``;
- SiLU: ``Mul(x, Sigmoid(x))``;
- HardSwish written out: ``Mul(x, Clip(Add(x, c), lo, hi))`` (then a Div or Mul by a constant, which scales it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnxprec.passes.fold_pad_into_conv import constant_value

__all__ = ["Activation", "activation_of"]

Activation = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60.0, 60.0)))


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_value(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def _clip_bounds(node: ir.Node) -> tuple[float, float] | None:
    """A Clip's (min, max) when both are constants."""
    if len(node.inputs) >= 3:  # opset >= 11: inputs
        lo, hi = _scalar(node.inputs[1]), _scalar(node.inputs[2])
    else:
        lo, hi = node.attributes.get_float("min", None), node.attributes.get_float("max", None)
    return (lo, hi) if lo is not None and hi is not None else None


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other input of a two-input node one of whose inputs is ``value``."""
    if len(node.inputs) != 2 or value not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _written_out_hardswish(x: ir.Value, add: ir.Node, mul: ir.Node) -> Activation | None:
    """``Mul(x, Clip(Add(x, c), lo, hi))``: ``x * clip(x + c, lo, hi)``."""
    shift = _scalar(_other(add, x))
    clips = add.outputs[0].consumers()
    if shift is None or len(clips) != 1 or clips[0].op_type != "Clip" or clips[0].inputs[0] is not add.outputs[0]:
        return None
    bounds = _clip_bounds(clips[0])
    if bounds is None or _other(mul, x) is not clips[0].outputs[0]:
        return None
    lo, hi = bounds
    return lambda v: v * np.clip(v + shift, lo, hi)


def activation_of(x: ir.Value) -> Activation | None:
    """The activation every consumer of ``x`` belongs to (the module docstring), or None."""
    consumers = list(x.consumers())
    ops = sorted(node.op_type for node in consumers)
    if not consumers or any(node.domain not in ("", "ai.onnx") for node in consumers):
        return None
    if ops == ["Sigmoid"] * len(ops):
        return _sigmoid
    if ops == ["HardSwish"] * len(ops):
        return lambda v: v * np.clip(v / 6.0 + 0.5, 0.0, 1.0)
    if ops == ["HardSigmoid"] * len(ops):
        node = consumers[0]
        alpha, beta = node.attributes.get_float("alpha", 0.2), node.attributes.get_float("beta", 0.5)
        if any(n.attributes.get_float("alpha", 0.2) != alpha or n.attributes.get_float("beta", 0.5) != beta
               for n in consumers):  # fmt: skip
            return None
        return lambda v: np.clip(alpha * v + beta, 0.0, 1.0)
    if len(consumers) != 2:
        return None
    by_op = {node.op_type: node for node in consumers}
    if ops == ["Mul", "Sigmoid"]:
        if _other(by_op["Mul"], x) is by_op["Sigmoid"].outputs[0]:
            return lambda v: v * _sigmoid(v)
        return None
    if ops == ["Add", "Mul"]:
        return _written_out_hardswish(x, by_op["Add"], by_op["Mul"])
    return None
