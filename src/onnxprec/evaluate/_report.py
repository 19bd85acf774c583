"""The evaluation's results: one model's metrics (:class:`ModelResult`), all models side by side
(:class:`EvaluationReport`: a text table for the terminal, JSON for scripts), and the plain-text table helper the
generation report shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from onnxprec._ort_profile import KernelProfile
from onnxprec._report import header

__all__ = ["EvaluationReport", "ModelResult", "ModelsReport", "fmt", "integer_nodes", "text_table"]


def _number(value: float | None) -> float | None:
    """JSON-ready: finite floats as they are, nan/inf as None."""
    return float(value) if value is not None and math.isfinite(value) else None


@dataclass
class ModelResult:
    """One model's metrics over the whole data set."""

    name: str
    path: str | None
    is_reference: bool = False
    batches: int = 0
    samples: int = 0
    perplexity: float | None = None
    tokens: int = 0
    top1_accuracy: float | None = None
    top5_accuracy: float | None = None
    labelled: int = 0
    agreement: dict[str, dict[str, Any]] | None = None
    main_output: str | None = None
    latency_ms: dict[str, float] | None = None
    kernels: KernelProfile | None = None
    seconds: float = 0.0

    @property
    def main_agreement(self) -> dict[str, Any] | None:
        """Agreement of the main output (LM logits, the labelled output, or the first output)."""
        if not self.agreement:
            return None
        return self.agreement.get(self.main_output or "", next(iter(self.agreement.values())))

    def to_json(self) -> dict[str, Any]:
        agreement = None
        if self.agreement is not None:
            agreement = {
                name: {k: (_number(v) if isinstance(v, float) else v) for k, v in stats.items()}
                for name, stats in self.agreement.items()
            }
        return {
            "name": self.name,
            "path": self.path,
            "reference": self.is_reference,
            "batches": self.batches,
            "samples": self.samples,
            "perplexity": _number(self.perplexity),
            "tokens": self.tokens,
            "accuracy": None
            if self.top1_accuracy is None
            else {"top1": self.top1_accuracy, "top5": self.top5_accuracy, "samples": self.labelled},
            "main_output": self.main_output,
            "agreement": agreement,
            "latency_ms": None
            if self.latency_ms is None
            else {k: (round(v, 4) if k != "runs" else int(v)) for k, v in self.latency_ms.items()},
            "kernels": None if self.kernels is None else _kernels_json(self.kernels),
            "seconds": round(self.seconds, 4),
        }


def _kernels_json(profile: KernelProfile) -> dict[str, Any]:
    """A kernel profile for the report: totals, then one entry per op type and provider (slowest first)."""
    return {
        "runs": profile.runs,
        "nodes": profile.nodes,
        "integer_nodes": profile.integer_nodes,
        "integer_time_share": _round(profile.integer_share),
        "qdq_nodes": profile.qdq_nodes,
        "qdq_time_share": _round(profile.qdq_share),
        "kernel_ms": round(profile.microseconds / 1000.0, 4),
        "op_types": [
            {
                "op_type": k.op_type,
                "provider": k.provider,
                "nodes": k.nodes,
                "ms": round(k.microseconds / 1000.0, 4),
                "integer": k.integer,
                "qdq": k.qdq,
            }
            for k in profile.kernels
        ],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class _Result(Protocol):
    name: str
    is_reference: bool


ResultT = TypeVar("ResultT", bound=_Result)


@dataclass
class ModelsReport(Generic[ResultT]):
    """The results of models run side by side, one of them the reference; ``report[name]`` is one model's."""

    models: list[ResultT] = field(default_factory=list)

    @property
    def reference(self) -> ResultT:
        """The reference model's result."""
        return next(m for m in self.models if m.is_reference)

    def __getitem__(self, name: str) -> ResultT:
        for result in self.models:
            if result.name == name:
                return result
        raise KeyError(name)


@dataclass
class EvaluationReport(ModelsReport[ModelResult]):
    """All models' results; :meth:`table` for the terminal, :meth:`to_json` for scripts (``--report_json``)."""

    TOOL: ClassVar[str] = "evaluate"

    data: str | None = None
    providers: list[str] = field(default_factory=list)
    latency_batch: dict[str, list[int]] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line: the models, the data, and each model's perplexity or accuracy when measured."""
        ref = self.reference
        parts = []
        for m in self.models:
            if m.perplexity is not None:
                parts.append(f"{m.name} perplexity {fmt(m.perplexity, '{:.4f}')}")
            elif m.top1_accuracy is not None:
                parts.append(f"{m.name} top-1 {fmt(m.top1_accuracy, '{:.2%}')}")
        text = f"Evaluated {len(self.models)} model(s) on {ref.samples} samples in {ref.batches} batch(es)"
        return f"{text}: {', '.join(parts)}" if parts else text

    def to_json(self) -> dict[str, Any]:
        """``tool``, ``onnxprec_version``, ``summary``, ``data``, ``providers``, ``reference`` (a model name),
        ``latency_batch`` (input shapes of the timed batch) and ``models``: per model ``name``, ``path``,
        ``reference``, ``batches``, ``samples``, ``perplexity`` and ``tokens``, ``accuracy`` (``top1``, ``top5``,
        ``samples``; None without labels), ``main_output``, ``agreement`` (None for the reference; per output
        ``max_abs``, ``rel_l2``, ``cosine``, ``nonfinite``, for scores ``top1`` and for a causal LM's logits
        ``kl``, the mean KL divergence of its next-token distributions from the reference's in nats), ``latency_ms``
        (``median``, ``p90``, ``mean``, ``min``, ``runs``; None without latency runs), ``kernels`` (ONNX Runtime's
        profile of the first batch; None with ``profile_runs=0``: ``runs``, ``nodes`` (kernel nodes that ran),
        ``integer_nodes`` and ``integer_time_share`` (nodes in integer kernels such as QLinearConv and their share
        of the kernel time), ``qdq_nodes`` and ``qdq_time_share`` (QuantizeLinear, DequantizeLinear and
        DynamicQuantizeLinear nodes that ran unfused), ``kernel_ms`` (kernel time per run) and ``op_types``: per
        op type and provider ``nodes``, ``ms`` per run, ``integer``, ``qdq``, slowest first) and ``seconds``.
        Non-finite numbers are None."""
        return {
            **header(self),
            "data": self.data,
            "providers": list(self.providers),
            "reference": self.reference.name,
            "latency_batch": {k: list(v) for k, v in self.latency_batch.items()},
            "models": [m.to_json() for m in self.models],
        }

    def table(self) -> str:
        """A plain-text table: one row per model, columns for the metrics that were measured."""
        columns: list[tuple[str, Any]] = [("model", lambda m: m.name + (" (ref)" if m.is_reference else ""))]
        if any(m.perplexity is not None for m in self.models):
            columns.append(("perplexity", lambda m: fmt(m.perplexity, "{:.4f}")))
        if any(m.top1_accuracy is not None for m in self.models):
            columns.append(("top-1 acc", lambda m: fmt(m.top1_accuracy, "{:.2%}")))
            columns.append(("top-5 acc", lambda m: fmt(m.top5_accuracy, "{:.2%}")))
        if len(self.models) > 1:
            if any((m.main_agreement or {}).get("kl") is not None for m in self.models):
                columns.append(("KL", lambda m: fmt((m.main_agreement or {}).get("kl"), "{:.4g}")))
            if any((m.main_agreement or {}).get("top1") is not None for m in self.models):
                columns.append(("top-1 agree", lambda m: fmt((m.main_agreement or {}).get("top1"), "{:.2%}")))
            columns.append(("max abs", lambda m: fmt((m.main_agreement or {}).get("max_abs"), "{:.3g}")))
            columns.append(("rel L2", lambda m: fmt((m.main_agreement or {}).get("rel_l2"), "{:.3g}")))
            columns.append(("cosine", lambda m: fmt((m.main_agreement or {}).get("cosine"), "{:.6f}")))
        if any(m.latency_ms for m in self.models):
            columns.append(("median ms", lambda m: fmt((m.latency_ms or {}).get("median"), "{:.2f}")))
            columns.append(("p90 ms", lambda m: fmt((m.latency_ms or {}).get("p90"), "{:.2f}")))
        profiles = [m.kernels for m in self.models if m.kernels is not None]
        if profiles:
            columns.append(("int kernels", lambda m: "-" if m.kernels is None else integer_nodes(m.kernels)))
            columns.append(("int time", lambda m: fmt(m.kernels and m.kernels.integer_share, "{:.1%}")))
            columns.append(("Q/DQ", lambda m: "-" if m.kernels is None else str(m.kernels.qdq_nodes)))
        lines = text_table(columns, self.models)
        main = self.reference.main_output
        notes = []
        if len(self.models) > 1 and main:
            notes.append(f"agreement with {self.reference.name} on output '{main}'")
        if self.latency_batch:
            shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.latency_batch.items())
            notes.append(f"latency per batch ({shapes}) on {', '.join(self.providers)}")
        if profiles:
            notes.append(
                f"ONNX Runtime profile, {profiles[0].runs} run(s): nodes in integer kernels / all kernel nodes, their "
                "share of kernel time, Q/DQ nodes run unfused"
            )
        return "\n".join(lines + ([f"({'; '.join(notes)})"] if notes else []))


def text_table(columns: Sequence[tuple[str, Callable[[Any], Any]]], items: Sequence[Any]) -> list[str]:
    """The lines of a plain-text table: a header, a rule, one row per item (first column left-aligned, others
    right-aligned); ``columns`` are (title, cell of an item)."""
    rows = [[title for title, _ in columns]] + [[str(get(item)) for _, get in columns] for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def integer_nodes(profile: KernelProfile) -> str:
    """Nodes in integer kernels / all kernel nodes."""
    return f"{profile.integer_nodes}/{profile.nodes}"


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec``; "-" for None, nan and inf as they are."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return spec.format(value)
