"""What an INT8 run did and measured, per layer and in total; :meth:`Int8Report.to_json` is ``--report_json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from onnxprec._report import fields_of, json_number
from onnxprec.quantization._tool import QuantizationReportBase, json_start

__all__ = ["Int8Report", "LayerEntry"]


@dataclass
class LayerEntry:
    """One Conv, MatMul or Gemm layer with a constant weight."""

    name: str
    op: str
    mode: str
    """``dynamic``, ``static``, or ``float`` (sent back to float by the accuracy target, or kept float by a rule on
    the calibration statistics: ``info["kept_float"]`` says why)."""
    weight: str
    shape: list[int]
    outlier_channels: int = 0
    alpha: float | None = None
    bias_corrected: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """Errors on the calibration sample (``plain``, ``split``, ``smoothed``, ``final``), the fallback reason..."""

    def to_json(self) -> dict[str, Any]:
        return {
            **fields_of(self, "name", "op", "mode", "weight", "shape", "outlier_channels"),
            "smoothquant_alpha": self.alpha,
            "bias_corrected": self.bias_corrected,
            **{key: json_number(value) for key, value in self.info.items()},
        }


@dataclass
class Int8Report(QuantizationReportBase):
    """The outcome of a run: settings, per-layer entries, static tensors, fallback, accuracy and timings."""

    TOOL: ClassVar[str] = "quantize int8"

    runtime: str
    calibration_method: str
    float_type: str
    layers: list[LayerEntry] = field(default_factory=list)
    static_tensors: int = 0
    passthrough: list[str] = field(default_factory=list)
    target: str | None = None
    accuracy: dict[str, Any] = field(default_factory=dict)
    """The outputs' errors against the float model on the calibration data (the final model)."""
    fallback_steps: list[dict[str, Any]] = field(default_factory=list)
    autocast: str | None = None
    """AutoCast's summary when the float remainder was converted (``high_precision_dtype`` fp16/bf16)."""

    def count(self, mode: str) -> int:
        return sum(1 for entry in self.layers if entry.mode == mode)

    @property
    def summary(self) -> str:
        quantized = self.count("dynamic") + self.count("static")
        text = (
            f"INT8 for {self.runtime}: {quantized}/{len(self.layers)} layers quantized ({self.count('dynamic')} "
            f"dynamic, {self.count('static')} static), {self.static_tensors} static tensors"
        )
        split = sum(1 for entry in self.layers if entry.outlier_channels)
        smoothed = sum(1 for entry in self.layers if entry.alpha is not None)
        if split or smoothed:
            text += f"; {split} with outlier channels in float, {smoothed} smoothed"
        kept = sum(1 for entry in self.layers if entry.mode == "float" and "kept_float" in entry.info)
        if kept:
            text += f"; {kept} depthwise kept float (heavy-tailed inputs)"
        if self.count("float") > kept:
            text += f"; {self.count('float') - kept} kept in float for {self.target}"
        if self.accuracy:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in self.accuracy.items() if isinstance(v, float))
            text += f"; on calibration data {shown}"
        if self.autocast:
            text += f"; float remainder {self.float_type}"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data: settings, ``counts``, ``accuracy`` (worst output errors on the calibration data),
        ``fallback_steps`` (each configuration the target search tried), ``calibration``, ``seconds``,
        ``excluded``/``skipped`` nodes and ``layers``."""
        return {
            **json_start(self),
            "runtime": self.runtime,
            "calibration_method": self.calibration_method,
            "high_precision_dtype": self.float_type,
            "target_accuracy": self.target,
            "counts": {
                "layers": len(self.layers),
                "dynamic": self.count("dynamic"),
                "static": self.count("static"),
                "float": self.count("float"),
                "static_tensors": self.static_tensors,
                "static_ops": len(self.passthrough),
                "excluded": len(self.excluded),
                "skipped": len(self.skipped),
            },
            "accuracy": json_number(self.accuracy),
            "fallback_steps": [json_number(step) for step in self.fallback_steps],
            "calibration": json_number(self.calibration),
            "seconds": {step: round(seconds, 4) for step, seconds in self.seconds.items()},
            "autocast": self.autocast,
            "excluded": [{"node": node, "pattern": pattern} for node, pattern in self.excluded],
            "skipped": [{"node": node, "reason": reason} for node, reason in self.skipped],
            "ort_only_nodes": self.ort_only,
            "layers": [entry.to_json() for entry in self.layers],
        }
