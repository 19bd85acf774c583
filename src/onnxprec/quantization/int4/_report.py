"""What an INT4 run did and measured, per layer and in total; :meth:`Int4Report.to_json` is ``--report_json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from onnxprec._report import add_seconds, json_number
from onnxprec.quantization._tool import QuantizationReportBase, checked, json_start
from onnxprec.quantization.algorithms.rtn import QuantizedWeight

__all__ = ["Int4Report", "LayerReport"]


@dataclass
class LayerReport:
    """One quantized weight (shared by ``layers``)."""

    weight: str
    layers: list[str]
    k: int
    n: int
    bits: int
    method: str
    block_size: int
    dtype: str
    awq: str | None = None
    """How the AWQ scales were applied: ``"folded into <op> '<name>'"``, ``"Mul"``, or None (no AWQ scaling)."""
    info: dict[str, Any] = field(default_factory=dict)
    """alpha, clip ratios, errors on calibration data (``output_rel_error``, on at most 512 evenly spaced output
    columns), and at save time ``weight_rel_error``, ``scale_min``/``scale_max``/``scale_mean`` (of the scales'
    magnitudes) and the quantization ``seconds``."""

    _sums: dict[str, float] = field(default_factory=dict, repr=False)
    """Running sums of :meth:`record` over a weight's column chunks."""

    def record(self, w: np.ndarray, qw: QuantizedWeight, dequantized: np.ndarray, seconds: float) -> None:
        """Fills the save-time entries from the float weight and its quantized form, or from one chunk of their
        columns at a time (the entries then cover every chunk recorded so far)."""
        flat = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
        diff = (flat - np.ascontiguousarray(dequantized, dtype=np.float32).reshape(-1)).astype(np.float32)
        magnitudes = np.abs(qw.scales)  # signed scales: their sign only says which side of the block is the extreme
        sums = self._sums
        sums["den"] = sums.get("den", 0.0) + float(np.dot(flat, flat))
        sums["num"] = sums.get("num", 0.0) + float(np.dot(diff, diff))
        sums["scale_sum"] = sums.get("scale_sum", 0.0) + float(magnitudes.sum(dtype=np.float64))
        sums["scales"] = sums.get("scales", 0.0) + magnitudes.size
        sums["columns"] = sums.get("columns", 0.0) + (w.shape[1] if w.ndim == 2 else 1)
        den, num = sums["den"], sums["num"]
        self.info["weight_rel_error"] = math.sqrt(num / den) if den > 0 else 0.0
        self.info["scale_min"] = min(float(magnitudes.min()), self.info.get("scale_min", math.inf))
        self.info["scale_max"] = max(float(magnitudes.max()), self.info.get("scale_max", -math.inf))
        self.info["scale_mean"] = sums["scale_sum"] / sums["scales"]
        self.info["seconds"] = self.info.get("seconds", 0.0) + seconds

    @property
    def recorded(self) -> bool:
        """Whether :meth:`record` has seen every column of the weight."""
        return self._sums.get("columns", 0.0) >= self.n

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "weight": self.weight,
            "layers": self.layers,
            "shape": [self.k, self.n],
            "bits": self.bits,
            "method": self.method,
            "block_size": self.block_size,
            "dtype": self.dtype,
            "awq": self.awq,
        }
        data.update({key: json_number(value) for key, value in self.info.items()})
        return data


@dataclass
class Int4Report(QuantizationReportBase):
    """The outcome of a run: settings, per-layer entries, exclusions, sizes and timings."""

    TOOL: ClassVar[str] = "quantize int4"
    SUBGRAPH_WHY: ClassVar[str] = "INT4 quantizes the main graph's layers only"

    method: str
    block_size: int
    use_zero_point: bool
    output_format: str
    layers: list[LayerReport] = field(default_factory=list)
    float_bytes: int = 0
    quantized_bytes: int = 0
    ideal_bytes: int = 0
    budget: Any = None
    """The size budget's choice (:class:`~onnxprec.quantization.int4._budget.BudgetReport`), or None."""

    def add_walk_seconds(self, walk: dict[str, float], deciding: float) -> None:
        """Where the calibration's time went, into ``seconds``: its statistics passes' parts (``walk``: the observers',
        the segment sessions'; the rest of ``calibration runs`` is ONNX Runtime's runs and the activations carried
        between segments) and the deciding (its parts, ``calibration: awq``..., come with each decision)."""
        for part, spent in walk.items():
            add_seconds(self.seconds, f"calibration runs: {part}", spent)
        add_seconds(self.seconds, "calibration deciding", deciding)

    @property
    def summary(self) -> str:
        zp = "asymmetric with zero points" if self.use_zero_point else "symmetric"
        block = "per channel" if self.block_size == -1 else f"block {self.block_size}"
        layers = sum(len(entry.layers) for entry in self.layers)
        eight = sum(1 for entry in self.layers if entry.bits == 8)
        every8 = bool(self.layers) and eight == len(self.layers)  # a budget or the guard left no weight at 4 bits
        how = "at 8 bits with " + "/".join(sorted({e.method for e in self.layers})) if every8 else f"with {self.method}"
        text = (
            f"Quantized {len(self.layers)} weights ({layers} layers) {how}, {block}, {zp}, "
            f"{self.output_format}: {self.float_bytes / 1e6:.1f} MB -> {self.quantized_bytes / 1e6:.1f} MB"
        )
        if eight and not every8:
            text += f"; {eight} at 8 bits"
        if self.excluded:
            text += f"; {len(self.excluded)} excluded"
        if self.in_subgraphs:
            text += "; " + self.subgraph_text()
        if self.check:
            text += f"; {checked(self.check)}"
        if self.check.get("raised"):  # the accuracy guard's raise to INT8's cosine bound, and its size cost
            text += f"; {self.check['raised']}"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data: settings, ``counts``, ``sizes`` (float, quantized and ideal bytes), ``calibration``,
        ``seconds`` per step, ``excluded`` (node and pattern), ``skipped`` (node and reason), ``genai`` (the
        onnxruntime-genai files carried beside the output, None when none), ``ort_only_nodes`` (the nodes only ONNX
        Runtime can check, by op, proved by loading the output in it) and ``layers``."""
        return {
            **json_start(self),
            "method": self.method,
            "block_size": self.block_size,
            "use_zero_point": self.use_zero_point,
            "output_format": self.output_format,
            "counts": {
                "weights": len(self.layers),
                "layers": sum(len(entry.layers) for entry in self.layers),
                "excluded": len(self.excluded),
                "skipped": len(self.skipped),
                "in_subgraphs": sum(self.in_subgraphs.values()),
            },
            "sizes": {
                "float_bytes": self.float_bytes,
                "quantized_bytes": self.quantized_bytes,
                "ideal_bytes": self.ideal_bytes,
            },
            "calibration": {key: json_number(value) for key, value in self.calibration.items()},
            "seconds": {step: round(seconds, 4) for step, seconds in self.seconds.items()},
            "excluded": [{"node": node, "pattern": pattern} for node, pattern in self.excluded],
            "skipped": [{"node": node, "reason": reason} for node, reason in self.skipped],
            "genai": None if self.genai is None else self.genai.to_json(),
            "ort_only_nodes": self.ort_only,
            "accuracy_check": json_number(self.check),
            "layers": [entry.to_json() for entry in self.layers],
            "size_budget": None if self.budget is None else self.budget.to_json(),
        }
