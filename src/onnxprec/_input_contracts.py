"""What the op that consumes a graph input needs of its values: random data that respects op contracts.

Random calibration data must let the graph run. Standard-normal floats and small integers do for the data a
model computes on, but not for the *parameters* some graphs take as inputs: a Reshape target must fit the
data, Slice axes must be distinct, Resize scales positive, an NMS IoU threshold in [0, 1], Split sizes must sum
to the axis, a Col2Im image shape must match the number of blocks... and domain-limited ops (Log, Sqrt, Acos)
turn out-of-domain data into NaN, which then looks like an overflow. :func:`contract_array` finds the first
consumer of a graph input (looking through Cast and Identity) whose slot has such a contract and makes valid
values for it, using the shapes of the data already generated for the other inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxprec._ops import is_default_domain

__all__ = ["Contract", "contract_array", "is_parameter"]

Dims = tuple[int | str | None, ...]


@dataclass
class Contract:
    """A consumer (``node``, input ``slot``) of a graph input, and what is known around it."""

    node: ir.Node
    slot: int
    dims: Dims  # the graph input's declared dims
    shape: tuple[int, ...]  # the sizes chosen for them (dynamic dims included)
    known: Mapping[str, tuple[int, ...]]  # shapes of the inputs generated so far
    rng: np.random.Generator

    def attr(self, name: str, default: object = None) -> object:
        attr = self.node.attributes.get(name)
        return default if attr is None else attr.value

    def data_shape(self, index: int = 0) -> tuple[int, ...] | None:
        """The concrete shape of the node's input ``index``: generated, or static in the model; else None."""
        if index >= len(self.node.inputs) or self.node.inputs[index] is None:
            return None
        value = self.node.inputs[index]
        assert value is not None
        if value.name in self.known:
            return self.known[str(value.name)]
        if value.const_value is not None:
            return tuple(value.const_value.shape.numpy())
        if value.shape is not None and all(isinstance(d, int) for d in value.shape):
            return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]
        return None

    def length(self, default: int = 1) -> int | None:
        """The number of values a 1-D parameter holds (static, else ``default``); None for a scalar."""
        if not self.dims:
            return None
        first = self.dims[0]
        return first if isinstance(first, int) and first >= 0 else default

    def shaped(self, values: list[float] | list[int] | np.ndarray) -> np.ndarray:
        """``values`` as the parameter's shape (a scalar takes the first value)."""
        array = np.asarray(values)
        if not self.dims:
            return array.reshape(-1)[:1].reshape(())
        return array.reshape((-1,) + (1,) * (len(self.dims) - 1)) if len(self.dims) > 1 else array


Maker = Callable[[Contract], "np.ndarray | None"]


def _axis_dim(c: Contract, axis_attr: str = "axis", default_axis: int = 0) -> int | None:
    shape = c.data_shape(0)
    if shape is None or not shape:
        return None
    axis = int(c.attr(axis_attr, default_axis))  # type: ignore[call-overload]
    return shape[axis % len(shape)]


def _rank(c: Contract) -> int | None:
    shape = c.data_shape(0)
    return None if shape is None else len(shape)


def _reshape_target(c: Contract) -> np.ndarray | None:
    k = c.length(1)
    if k is None or k < 1:
        return None
    return c.shaped([1] * (k - 1) + [-1])


def _ones(c: Contract) -> np.ndarray | None:
    k = c.length(_rank(c) or 1)
    return None if k is None else c.shaped([1] * k)


def _axes(c: Contract) -> np.ndarray | None:
    k = c.length(1)
    rank = _rank(c)
    if k is None:
        return c.shaped([0])
    if c.node.op_type == "Unsqueeze":
        return c.shaped(list(range(k)))
    if rank is not None:
        k = min(k, rank)
    return c.shaped(list(range(k))) if k else np.zeros((0,), np.int64)


def _squeeze_axes(c: Contract) -> np.ndarray | None:
    shape = c.data_shape(0)
    ones = [i for i, d in enumerate(shape or ()) if d == 1]
    k = c.length(len(ones) or 1)
    return c.shaped(ones[:k]) if k and len(ones) >= k else None


def _slice(c: Contract) -> np.ndarray | None:
    shape = c.data_shape(0)
    k = c.length(1) or 1
    if shape is not None:
        k = min(k, len(shape)) or 1
    if c.slot == 1:  # starts
        return c.shaped([0] * k)
    if c.slot == 2:  # ends
        return c.shaped([2**31 - 1] * k)
    if c.slot == 3:  # axes
        return c.shaped(list(range(k)))
    return c.shaped([1] * k)  # steps


def _split_sizes(c: Contract) -> np.ndarray | None:
    n = _axis_dim(c)
    k = c.length(2) or 1
    if n is None or k < 1:
        return None
    return c.shaped([n // k + (1 if i < n % k else 0) for i in range(k)])


def _value(value: float) -> Maker:
    """A maker of the one value ``value`` (a scalar, or a 1-element vector)."""
    return lambda c: c.shaped([value])


def _positive(value: float) -> Maker:
    return lambda c: c.shaped([value] * (c.length(1) or 1))


def _scales(c: Contract) -> np.ndarray | None:
    k = c.length(_rank(c) or 4)
    if not k:
        return None
    return c.shaped([1.0] * min(k, 2) + [2.0] * max(k - 2, 0))


def _sizes(c: Contract) -> np.ndarray | None:
    shape = c.data_shape(0)
    k = c.length(len(shape) if shape else 4)
    if not k:
        return None
    if shape is not None and len(shape) == k:
        return c.shaped(list(shape))
    return c.shaped([4] * k)


def _roi(c: Contract) -> np.ndarray | None:
    k = c.length(8) or 8
    return c.shaped([0.0] * (k // 2) + [1.0] * (k - k // 2))


def _index(axis_attr: str = "axis", default_axis: int = 0) -> Maker:
    def make(c: Contract) -> np.ndarray | None:
        n = _axis_dim(c, axis_attr, default_axis)
        return None if n is None else _draw(c, max(n, 1))

    return make


def _draw(c: Contract, high: int) -> np.ndarray:
    return c.rng.integers(0, high, size=c.shape)


def _gather_nd(c: Contract) -> np.ndarray | None:
    shape = c.data_shape(0)
    if shape is None or not c.dims or not isinstance(c.dims[-1], int):
        return None
    batch = int(c.attr("batch_dims", 0))  # type: ignore[call-overload]
    depth = c.dims[-1]
    if batch + depth > len(shape):
        return None
    dims = c.shape
    columns = [c.rng.integers(0, max(shape[batch + j], 1), size=dims[:-1]) for j in range(depth)]
    return np.stack(columns, axis=-1) if columns else np.zeros(dims, np.int64)


def _pads(c: Contract) -> np.ndarray | None:
    k = c.length(2 * (_rank(c) or 1))
    return None if k is None else c.shaped([1] * k)


def _affine_size(c: Contract) -> np.ndarray | None:
    theta = c.data_shape(0)
    k = c.length(4) or 4
    n = theta[0] if theta else 1
    return c.shaped([n, 1] + [4] * (k - 2))


def _col2im(c: Contract) -> np.ndarray | None:
    """Block shape all ones; the image shape that makes exactly the input's number of blocks."""
    shape = c.data_shape(0)
    k = c.length(2) or 2
    if c.slot == 2:
        return c.shaped([1] * k)
    if shape is None or len(shape) != 3:
        return None
    strides = list(c.attr("strides", [1] * k))  # type: ignore[call-overload]
    pads = list(c.attr("pads", [0] * (2 * k)))  # type: ignore[call-overload]
    padding = [pads[i] + pads[i + k] for i in range(k)]
    blocks_at_one = [(padding[i]) // strides[i] + 1 for i in range(k)]  # blocks of a 1-wide image
    rest = math.prod(blocks_at_one[1:])
    if shape[2] % rest:
        return None
    first = shape[2] // rest
    image = [(first - 1) * strides[0] + 1 - padding[0]] + [1] * (k - 1)
    return c.shaped(image) if image[0] >= 1 else None


def _range(c: Contract) -> np.ndarray | None:
    return c.shaped([(0.0, 8.0, 1.0)[c.slot]])


def _stft_frame(c: Contract) -> np.ndarray | None:
    signal = c.data_shape(0)
    n = signal[1] if signal and len(signal) > 1 else 16
    return c.shaped([max(1, n // 4)] if c.slot == 1 else [max(1, n // 2)])


_MEL = (8, 16, 8000, 0.0, 4000.0)

# (op, input slot) -> maker of valid values, for integer and float parameters alike; ops or slots that share a
# maker share a line.
_PARAMETERS: dict[tuple[str, int], Maker] = {
    ("Reshape", 1): _reshape_target,
    **{(op, 1): _ones for op in ("Expand", "Tile")},
    ("ConstantOfShape", 0): lambda c: c.shaped([2] * (c.length(1) or 1)),
    **{("Slice", i): _slice for i in (1, 2, 3, 4)},
    ("Unsqueeze", 1): _axes,
    ("Squeeze", 1): _squeeze_axes,
    **{(op, 1): _split_sizes for op in ("Split", "SplitToSequence")},
    ("TopK", 1): _value(1),
    ("OneHot", 1): _value(4),
    ("Resize", 1): _roi,
    ("Resize", 2): _scales,
    ("Resize", 3): _sizes,
    ("Upsample", 1): _scales,
    ("CenterCropPad", 1): _sizes,
    ("Pad", 1): _pads,
    ("Pad", 3): _axes,
    **{("Range", i): _range for i in (0, 1, 2)},
    ("NonMaxSuppression", 2): _value(3),
    ("NonMaxSuppression", 3): _value(0.5),
    ("NonMaxSuppression", 4): _value(0.0),
    **{(op, 1): _index() for op in ("Gather", "GatherElements", "ScatterElements")},
    **{(op, 1): _gather_nd for op in ("GatherND", "ScatterND")},
    **{(op, 1): _value(0) for op in ("CumSum", "Trilu")},
    ("AffineGrid", 1): _affine_size,
    **{("Col2Im", i): _col2im for i in (1, 2)},
    ("Dropout", 1): _positive(0.5),
    **{(op, 1): lambda c: np.full(c.shape, 0.05) for op in ("QuantizeLinear", "DequantizeLinear")},
    **{(op, 2): lambda c: np.zeros(c.shape) for op in ("QuantizeLinear", "DequantizeLinear")},
    ("Bernoulli", 0): lambda c: c.rng.uniform(0, 1, size=c.shape),
    **{("MelWeightMatrix", i): _value(value) for i, value in enumerate(_MEL)},
    **{(op, 0): _value(8) for op in ("HannWindow", "HammingWindow", "BlackmanWindow")},
    ("DFT", 1): lambda c: c.shaped([_axis_dim(c, "axis", 1) or 4]),
    **{("STFT", i): _stft_frame for i in (1, 3)},
    ("Loop", 0): _value(3),
    ("Loop", 1): lambda c: np.ones(c.shape, dtype=np.bool_),
    ("SequenceAt", 1): _value(0),
    ("ReverseSequence", 1): lambda c: np.full(c.shape, _axis_dim(c, "time_axis", 0) or 1),
    **{(op, 1): _index("", 1) for op in ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")},
    **{(op, 1): _axes for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")},
    **{(op, 1): _axes for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}

# Float data that must stay in a domain: op -> (input slot, low, high) for uniform values.
_DOMAINS: dict[str, tuple[int, float, float]] = {
    "Log": (0, 0.05, 4.0),
    "Sqrt": (0, 0.0, 4.0),
    "Reciprocal": (0, 0.25, 4.0),
    "Acos": (0, -0.95, 0.95),
    "Asin": (0, -0.95, 0.95),
    "Atanh": (0, -0.95, 0.95),
    "Acosh": (0, 1.0, 4.0),
}

_PASS_THROUGH = frozenset({"Cast", "Identity", "CastLike"})


def _consumers(value: ir.Value, depth: int = 2) -> Iterator[tuple[ir.Node, int]]:
    for use in value.uses():
        node = use.node
        yield node, use.idx
        if depth and is_default_domain(node.domain) and node.op_type in _PASS_THROUGH and use.idx == 0:
            yield from _consumers(node.outputs[0], depth - 1)


def is_parameter(value: ir.Value) -> bool:
    """Whether a consumer of ``value`` needs valid parameter values (its data is made after the others)."""
    return any(
        is_default_domain(node.domain) and (node.op_type, slot) in _PARAMETERS for node, slot in _consumers(value)
    )


def contract_array(
    value: ir.Value,
    dims: Dims,
    shape: tuple[int, ...],
    dtype: np.dtype,
    known: Mapping[str, tuple[int, ...]],
    rng: np.random.Generator,
) -> np.ndarray | None:
    """Valid random values for the graph input ``value`` (declared ``dims``, chosen ``shape``), or None when no
    consumer has a contract: parameters first (shapes, axes, scales, thresholds, indices...), then float domains.
    A parameter's length follows its op (a Tile takes one repeat per axis) where the model leaves it open."""
    for node, slot in _consumers(value):
        if not is_default_domain(node.domain):
            continue
        maker = _PARAMETERS.get((node.op_type, slot))
        if maker is not None:
            array = maker(Contract(node, slot, dims, shape, known, rng))
            if array is not None:
                return _as(array, dtype)
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        return None
    for node, slot in _consumers(value):
        domain = _DOMAINS.get(node.op_type) if is_default_domain(node.domain) else None
        if domain is not None and domain[0] == slot:
            return _as(rng.uniform(domain[1], domain[2], size=shape), dtype)
    return None


def _as(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        array = np.clip(np.asarray(array), info.min, info.max)
    return np.asarray(array).astype(dtype)
