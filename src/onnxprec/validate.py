"""Validation of a converted model: checker, strict type inference, I/O contract, and a numeric check."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort, metrics
from onnxprec._graph import dtype_name
from onnxprec._io import load_model
from onnxprec._protobuf import structure_proto
from onnxprec.errors import ValidationError
from onnxprec.reference import ReferenceResult

__all__ = ["IOContract", "NumericReport", "check_io_contract", "check_structure", "numeric_check"]

logger = logging.getLogger(__name__)
_F = ir.DataType.FLOAT


@dataclass(frozen=True)
class IOContract:
    """Names and element types of the graph's fed inputs and outputs, captured before conversion."""

    inputs: tuple[tuple[str, ir.DataType | None], ...]
    outputs: tuple[tuple[str, ir.DataType | None], ...]

    @classmethod
    def of(cls, model: ir.Model) -> IOContract:
        graph = model.graph
        return cls(
            tuple((str(v.name), v.dtype) for v in graph.inputs if not v.is_initializer()),
            tuple((str(v.name), v.dtype) for v in graph.outputs),
        )

    def expected(self, low: ir.DataType, keep_io_types: bool) -> IOContract:
        """The contract after conversion: FP32 I/O become ``low`` unless ``keep_io_types``."""

        def retype(items: tuple[tuple[str, ir.DataType | None], ...]) -> tuple[tuple[str, ir.DataType | None], ...]:
            return tuple((n, low if (t == _F and not keep_io_types) else t) for n, t in items)

        return IOContract(retype(self.inputs), retype(self.outputs))


def check_io_contract(model: ir.Model, expected: IOContract) -> None:
    """Raises ValidationError if I/O names or types differ from ``expected``."""
    actual = IOContract.of(model)
    if actual != expected:
        raise ValidationError(
            f"Converted model broke the I/O contract: expected inputs {_fmt(expected.inputs)} and outputs "
            f"{_fmt(expected.outputs)}, got {_fmt(actual.inputs)} and {_fmt(actual.outputs)}. This is a bug in "
            "onnxprec: please report it with the model."
        )


def _fmt(items: tuple[tuple[str, ir.DataType | None], ...]) -> str:
    return "[" + ", ".join(f"{n}:{dtype_name(t) if t else '?'}" for n, t in items) + "]"


def check_structure(model: ir.Model, *, has_custom_ops: bool) -> None:
    """onnx.checker (full check: strict shape and type inference) on the model without its large weights.

    Weights above 1 KB are stripped before the C++ call, so this is cheap and works above 2 GB.
    """

    proto = structure_proto(model)
    try:
        onnx.checker.check_model(proto, full_check=not has_custom_ops)
        if has_custom_ops:
            onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ValidationError(
            f"Converted model fails onnx.checker/type inference ({_ort.first_line(e, 400)}). This is a bug in "
            "onnxprec: please report it; meanwhile exclude the node it names with --nodes_to_exclude."
        ) from e


@dataclass
class NumericReport:
    """Output error of the converted model against the FP32 reference on the same inputs."""

    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: str = ""

    @property
    def max_rel_l2(self) -> float:
        return max((e["rel_l2"] for e in self.errors.values()), default=0.0)


def numeric_check(
    model: str | bytes | ir.Model,
    reference: ReferenceResult,
    *,
    providers: list[str] | None = None,
) -> NumericReport:
    """Runs the converted model on the reference run's first batch and compares outputs with FP32.

    BF16 and FP8 inputs and outputs are fed and fetched like any other. Never raises for a model ONNX Runtime
    cannot run (e.g. a BF16 op without a CPU kernel): the report then says why the check was skipped.
    """
    report = NumericReport()
    try:
        # No graph rewrites: on CPUs without FP16 kernels ORT would otherwise fold the FP16->FP32 casts it
        # inserts into FP32 copies of every weight, doubling the check's memory for nothing.
        # A saved model is mapped, so ONNX Runtime maps its weights instead of parsing a copy of the file.
        source = load_model(model) if isinstance(model, str) else model
        session = _ort.create_session(
            source, providers=providers, optimization="none", low_memory=True, what="the converted model"
        )
        outputs = session.run(reference.first_feeds)
    except Exception as e:  # any failure means "cannot check here", never a failed conversion
        report.skipped = f"ONNX Runtime could not run the converted model: {_ort.first_line(e, 200)}"
        return report
    for name, actual in zip(session.output_names, outputs):
        expected = reference.first_outputs.get(name)
        if expected is None or not np.issubdtype(np.asarray(expected).dtype, np.floating):
            continue
        result = metrics.compare(expected, np.asarray(actual, dtype=np.float32))
        report.errors[name] = {
            "max_abs": result["max_abs"],
            "rel_l2": result["rel_l2"],
            "cosine": result["cosine"],
            "finite": float(result["nonfinite"] == 0),
        }
    return report
