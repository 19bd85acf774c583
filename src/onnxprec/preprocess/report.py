"""Preprocess's report: what each step changed (nodes, op types, shapes newly known), measured around the step by
:func:`measured_step`, and the run's report, the ``--report_json`` file."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import onnx_ir as ir

from onnxprec import _report
from onnxprec._genai import GenaiCarry
from onnxprec._report import header

__all__ = ["PreprocessReport", "StepReport", "measured_step"]

logger = logging.getLogger(__name__)


@dataclass
class StepReport:
    """What one step changed: nodes and op-type counts before and after, and shapes newly known."""

    name: str
    skipped: str = ""
    warnings: list[str] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    op_changes: dict[str, tuple[int, int]] = field(default_factory=dict)
    shapes_before: int = 0
    shapes_after: int = 0
    shapes_new: int = 0
    values_before: int = 0
    values_after: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the log: node counts, op-type changes and shapes newly known (or why it was skipped)."""
        if self.skipped:
            return f"{self.name}: skipped ({self.skipped})"
        parts = [f"{self.nodes_before} -> {self.nodes_after} nodes"]
        if self.op_changes:
            changes = sorted(self.op_changes.items(), key=lambda kv: (-abs(kv[1][1] - kv[1][0]), kv[0]))
            parts.append(", ".join(f"{op} {b}->{a}" for op, (b, a) in changes))
        parts.append(f"{self.shapes_new} shapes newly known ({self.shapes_after} known)")
        return f"{self.name}: " + "; ".join(parts) + f" [{self.seconds:.2f} s]"

    def warn(self, message: str) -> None:
        """Keeps a warning in the report and logs it."""
        self.warnings.append(message)
        logger.warning("%s", message)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "skipped": self.skipped or None,
            "warnings": list(self.warnings),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "op_changes": {op: {"before": b, "after": a} for op, (b, a) in sorted(self.op_changes.items())},
            "shapes_known_before": self.shapes_before,
            "shapes_known_after": self.shapes_after,
            "shapes_newly_known": self.shapes_new,
            "node_outputs_before": self.values_before,
            "node_outputs_after": self.values_after,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class PreprocessReport:
    """The steps that ran (or why they were skipped); :meth:`to_json` is the ``--report_json`` file."""

    TOOL: ClassVar[str] = "preprocess"

    steps: list[StepReport] = field(default_factory=list)
    input_path: Path | None = None
    output_path: Path | None = None
    external_data: bool = False
    seconds: float = 0.0
    genai: GenaiCarry | None = None  # the onnxruntime-genai files carried beside the output
    check: dict[str, Any] = field(default_factory=dict)  # the output against the input on random data

    @property
    def summary(self) -> str:
        ran = [s for s in self.steps if not s.skipped]
        if not ran:
            return "No step ran"
        first, last = ran[0], ran[-1]
        text = (
            f"Pre-processed: {first.nodes_before} -> {last.nodes_after} nodes; shapes known for "
            f"{last.shapes_after} of {last.values_after} node outputs (before: {first.shapes_before} of "
            f"{first.values_before})"
        )
        if self.check:
            text += f"; checked on random data (1 run): {self.check['metric']}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            **header(self),
            "input": None if self.input_path is None else str(self.input_path),
            "output": None if self.output_path is None else str(self.output_path),
            "external_data": self.external_data,
            "seconds": round(self.seconds, 4),
            "steps": [s.to_json() for s in self.steps],
            "genai": None if self.genai is None else self.genai.to_json(),
            "accuracy_check": self.check or None,
        }


def _op_counts(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(
        node.op_type if not node.domain or node.domain == "ai.onnx" else f"{node.domain}.{node.op_type}"
        for node in model.graph.all_nodes()
    )


def _known_shapes(model: ir.Model) -> tuple[set[str], int]:
    """Names of node outputs (all graphs) whose shape is known, and the number of node outputs."""
    outputs = [value for node in model.graph.all_nodes() for value in node.outputs if value.name]
    return {str(value.name) for value in outputs if value.shape is not None}, len(outputs)


@contextlib.contextmanager
def measured_step(name: str, report: PreprocessReport, holder: list[ir.Model]) -> Iterator[StepReport]:
    """Measures a step on ``holder[0]`` (the model before; the step puts the model after in ``holder[0]``)."""
    step = StepReport(name)
    before_ops = _op_counts(holder[0])
    before_shapes, step.values_before = _known_shapes(holder[0])
    with _report.timed() as timer:
        yield step
    step.seconds = timer.seconds
    report.steps.append(step)
    if step.skipped:
        logger.info("%s", step.describe())
        return
    after_ops = _op_counts(holder[0])
    after_shapes, step.values_after = _known_shapes(holder[0])
    step.nodes_before, step.nodes_after = sum(before_ops.values()), sum(after_ops.values())
    step.op_changes = {
        op: (before_ops[op], after_ops[op])
        for op in set(before_ops) | set(after_ops)
        if before_ops[op] != after_ops[op]
    }
    step.shapes_before, step.shapes_after = len(before_shapes), len(after_shapes)
    step.shapes_new = len(after_shapes - before_shapes)
    logger.info("%s", step.describe())
