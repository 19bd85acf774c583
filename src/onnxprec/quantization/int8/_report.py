"""What an INT8 run did and measured, per layer and in total; :meth:`Int8Report.to_json` is ``--report_json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from onnxprec._report import fields_of, json_number
from onnxprec.quantization._tool import QuantizationReportBase, checked, json_start

if TYPE_CHECKING:
    from onnxprec.quantization import guard

__all__ = ["Int8Report", "LayerEntry", "unfused_text"]

# Ops that ``onnxprec preprocess`` (shape inference, ONNX Runtime's basic optimizations: constant folding of shape
# computations, its Transpose optimizer, Cast and Identity elimination) can remove where they keep Q/DQ apart; a Pad
# or an Add it leaves as they are
_PREPROCESS_HELPS = frozenset({"Cast", "Expand", "Identity", "Reshape", "Slice", "Squeeze", "Transpose", "Unsqueeze"})


def unfused_text(unfused: dict[str, int], preprocessed: bool = False) -> str:
    """``16 Q/DQ left unfused on ort-cpu: 12 beside Transpose, 4 beside Add``; unless ``preprocessed``, with the hint
    to run preprocess first where the ops beside them are ones its optimizations remove; ``every Q/DQ fused on
    ort-cpu`` for none."""
    total = sum(unfused.values())
    if not total:
        return "every Q/DQ fused on ort-cpu"
    shown = ", ".join(f"{count} beside {op}" for op, count in list(unfused.items())[:4])
    more = len(unfused) - 4
    text = f"{total} Q/DQ left unfused on ort-cpu: {shown}" + (f" and {more} more kinds" if more > 0 else "")
    helped = sorted({op for key in unfused for op in key.split("/")} & _PREPROCESS_HELPS)
    if helped and not preprocessed:
        text += f" (onnxprec preprocess first may remove the {'/'.join(helped)})"
    return text


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
    FORMAT: ClassVar[str] = "INT8"
    """The quantized type the summary names."""
    SUBGRAPH_WHY: ClassVar[str] = (
        "no calibrated ranges: an If branch the data never takes or takes only on some batches, a Loop/Scan body"
    )

    runtime: str
    calibration_method: str
    float_type: str
    layers: list[LayerEntry] = field(default_factory=list)
    static_tensors: int = 0
    passthrough: list[str] = field(default_factory=list)
    target: str | None = None
    accuracy: dict[str, Any] = field(default_factory=dict)
    """The outputs' worst errors against the float model on the calibration data (the final model)."""
    fallback_steps: list[dict[str, Any]] = field(default_factory=list)
    structure: dict[str, int] = field(default_factory=dict)
    """What sanitizing folded: same-type Casts, layout Transposes (net), per-channel Add/Sub/Mul/Div."""
    unfused: dict[str, int] | None = None
    """Q/DQ nodes ONNX Runtime's CPU provider leaves unfused in the output, by the op beside them (ort-cpu only)."""
    preprocessed: bool = False
    """Whether the input went through ``onnxprec preprocess`` (ONNX Runtime's ``quant_pre_process``) already."""
    autocast: str | None = None
    """AutoCast's summary when the float remainder was converted (``high_precision_dtype`` fp16/bf16)."""
    wide_tensors: list[str] = field(default_factory=list)
    """A16W8: the static tensors written at 16 bits (the others 8)."""
    wide_steps: list[dict[str, Any]] = field(default_factory=list)
    """A16W8: each configuration the 16-bit search tried."""
    in_branches: int = 0
    """Layers placed inside the If branches the calibration data takes (calibrated on a copy with them inlined)."""
    input_layers: list[str] = field(default_factory=list)
    """ort-cpu: the layers reading the model input quantized on a second try, the guard having missed with them in
    float (:mod:`onnxprec.quantization.int8.input_layers`)."""

    def count(self, mode: str) -> int:
        return sum(1 for entry in self.layers if entry.mode == mode)

    @property
    def summary(self) -> str:
        quantized = self.count("dynamic") + self.count("static")
        text = (
            f"{self.FORMAT} for {self.runtime}: {quantized}/{len(self.layers)} layers quantized "
            f"({self.count('dynamic')} dynamic, {self.count('static')} static), {self.static_tensors} static tensors"
        )
        if not self.layers and self.skipped:  # written without Q/DQ (Int8Options.WRITES_REMAINDER)
            text += f"; none quantized: the placement rules skipped all {len(self.skipped)} candidates"
        split = sum(1 for entry in self.layers if entry.outlier_channels)
        smoothed = sum(1 for entry in self.layers if entry.alpha is not None)
        if split or smoothed:
            text += f"; {split} with outlier channels in float, {smoothed} smoothed"
        if self.wide_tensors:
            text += f"; {len(self.wide_tensors)} of {self.static_tensors} static tensors at 16 bits"
        kept = sum(1 for entry in self.layers if entry.mode == "float" and "kept_float" in entry.info)
        if kept:
            text += f"; {kept} depthwise kept float (heavy-tailed inputs)"
        if self.count("float") > kept:
            text += f"; {self.count('float') - kept} kept in float for {self.target or 'the accuracy guard'}"
        if self.check:
            text += f"; {checked(self.check)}"
        elif self.accuracy:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in self.accuracy.items() if isinstance(v, float))
            text += f"; on calibration data {shown}"
        if self.autocast:
            text += f"; float remainder {self.float_type}"
        if self.input_layers:
            text += f"; {len(self.input_layers)} reading the model input quantized too (the guard missed without them)"
        if self.in_branches:
            text += f"; {self.in_branches} of the layers inside the If branches the calibration data takes"
        if self.in_subgraphs:
            text += "; " + self.subgraph_text()
        if self.unfused is not None:
            text += "; " + unfused_text(self.unfused, self.preprocessed)
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
                "in_subgraphs": sum(self.in_subgraphs.values()),
                "in_branches": self.in_branches,
            },
            "accuracy": json_number(self.accuracy),
            "accuracy_check": json_number(self.check),
            "fallback_steps": [json_number(step) for step in self.fallback_steps],
            "wide_tensors": list(self.wide_tensors),
            "wide_steps": [json_number(step) for step in self.wide_steps],
            **({"input_layers": list(self.input_layers)} if self.input_layers else {}),
            "calibration": json_number(self.calibration),
            "seconds": {step: round(seconds, 4) for step, seconds in self.seconds.items()},
            "autocast": self.autocast,
            "structure": dict(self.structure),
            "unfused_qdq": None if self.unfused is None else {"total": sum(self.unfused.values()), **self.unfused},
            "excluded": [{"node": node, "pattern": pattern} for node, pattern in self.excluded],
            "skipped": [{"node": node, "reason": reason} for node, reason in self.skipped],
            "ort_only_nodes": self.ort_only,
            "layers": [entry.to_json() for entry in self.layers],
        }

    def guard_line(self, checked: list[guard.Checked]) -> str:
        """The guard's one line: the bound, what was measured where, the layers that carry the error and what to do."""
        where = ["calibration data", "held-out runs"]
        measured = "; ".join(f"{c.summary.describe()} on {w}" for c, w in zip(checked, where) if not c.ok)
        text = f"{self.FORMAT} result misses the accuracy guard ({self.check['bound']}): {measured}"
        steps = [s["layers"] for s in self.fallback_steps if s.get("what") == "most sensitive layers"]
        ranked: list[str] = steps[-1] if steps else []
        floats = self.count("float")
        if ranked:
            text += f"; the error is carried most by {', '.join(repr(n) for n in ranked[:4])}"
        beyond = [s["float_layers"] for s in self.fallback_steps if "beyond" in str(s.get("what", ""))]
        within = f"{floats} {'layer' if floats == 1 else 'layers'} in float within --max_float_compute"
        if beyond:  # the fallback went past --max_float_compute (the guard's default budget) and missed too
            text += f"; {within} did not meet it, nor {max(beyond)} beyond it"
        elif floats:
            text += f"; {within} did not meet it"
        if self.calibration.get("random"):
            text += "; measured on synthetic inputs: pass representative inputs (--calibration_data)"
        return text + "; --nodes_to_exclude keeps layers in float, --no_accuracy_guard accepts the result"
