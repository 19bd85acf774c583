"""The records of INT8's decisions: what a calibration pass measured (:class:`Statistics`), how each layer is
quantized (:class:`LayerDecision`) and every decision of a run by name (:class:`Decisions`), which
:func:`~onnxprec.quantization.int8.decide.decide` fills and :func:`~onnxprec.quantization.int8.decide.build`
applies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxprec.observers import ChannelStatsObserver, Histogram, RunSampleObserver
from onnxprec.quantization.algorithms.smoothquant import ChannelDecision
from onnxprec.quantization.int8._report import LayerEntry
from onnxprec.quantization.int8.grams import HessianObserver
from onnxprec.quantization.int8.rewrite import WeightRecipe

__all__ = ["Decisions", "LayerDecision", "Statistics"]


@dataclass
class Statistics:
    """What one calibration pass measured."""

    histograms: dict[str, Histogram]
    channels: ChannelStatsObserver
    samples: RunSampleObserver
    hessians: HessianObserver


@dataclass
class LayerDecision:
    """How one layer is quantized."""

    recipe: WeightRecipe
    dynamic: bool
    bias: np.ndarray | None = None
    """The layer's new float bias (Conv: original + correction) or, for MatMul/Gemm, the correction to add."""
    split_rows: np.ndarray | None = None
    """``[J, N]`` float rows of the split channels (MatMul/Gemm)."""
    residual: tuple[np.ndarray, np.ndarray] | None = None
    """A pointwise Conv's second INT8 part: levels ``[C_out, C_in]`` and per-channel scales of the float weight minus
    its rounded INT8 weight (``w = s q + s_r q_r``)."""
    entry: LayerEntry | None = None


@dataclass
class Decisions:
    """Every decision, by name: layers by node name, groups and static tensors by tensor name."""

    layers: dict[str, LayerDecision] = field(default_factory=dict)
    groups: dict[str, ChannelDecision] = field(default_factory=dict)
    tensors: dict[str, tuple[float, int]] = field(default_factory=dict)
    kept_float: dict[str, str] = field(default_factory=dict)
    """Layers the calibration statistics keep in float, by node name, with the reason; every build leaves them
    float."""
    wide: dict[str, tuple[float, int]] = field(default_factory=dict)
    """A16W8: each static tensor's 16-bit scale and zero point (:attr:`Int8Options.wide_qtype`), by name."""
    noise: dict[str, float] = field(default_factory=dict)
    """A16W8: each static tensor's relative RMS error at 8 bits on the calibration data (the promotion's proxy)."""
    widened: frozenset[str] = frozenset()
    """The static tensors a build writes at 16 bits."""
    calibrated_branches: frozenset[tuple[str, str]] | None = None
    """The If branches calibration saw, as ``(If name, branch attribute)`` (None: the model has no layer in one);
    every build places layers there and keeps the other bodies' layers float."""
    varying_branches: frozenset[str] = frozenset()
    """The If nodes whose condition changed across the calibration data."""
    equalized: dict[str, np.ndarray] = field(default_factory=dict)
    """Static Convs whose input is equalized per channel (:func:`equalized_inputs`): the factors ``s`` by node name
    (the input divided by them, the weight's input channels multiplied)."""
