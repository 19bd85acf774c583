"""Validation of a converted model: checker, strict type inference, I/O contract, and a numeric check."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import _c_api_utils

from onnxprec._graph import dtype_name
from onnxprec.errors import ValidationError
from onnxprec.reference import ReferenceResult, ort_providers

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

    def check(proto: onnx.ModelProto) -> None:
        onnx.checker.check_model(proto, full_check=not has_custom_ops)
        if has_custom_ops:
            onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False)

    try:
        _c_api_utils.call_onnx_api(check, model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        first = str(e).strip().splitlines()[0][:400]
        raise ValidationError(
            f"Converted model fails onnx.checker/type inference ({first}). This is a bug in onnxprec: please "
            "report it; meanwhile exclude the node it names with --nodes_to_exclude."
        ) from None


@dataclass
class NumericReport:
    """Output error of the converted model against the FP32 reference on the same inputs."""

    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: str = ""

    @property
    def max_rel_l2(self) -> float:
        return max((e["rel_l2"] for e in self.errors.values()), default=0.0)


def _feed_for(session: object, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    types = {i.name: i.type for i in session.get_inputs()}  # type: ignore[attr-defined]
    result = {}
    for name, array in feeds.items():
        if types.get(name) == "tensor(float16)" and array.dtype == np.float32:
            array = array.astype(np.float16)
        result[name] = array
    return result


def numeric_check(
    model: str | bytes,
    reference: ReferenceResult,
    *,
    low: ir.DataType,
    keep_io_types: bool,
    providers: list[str] | None = None,
) -> NumericReport:
    """Runs the converted model on the reference run's first batch and compares outputs with FP32.

    Never raises for a model ONNX Runtime cannot run (e.g. BF16 on a CPU build without BF16 kernels): the
    report then says why the check was skipped.
    """
    import onnxruntime as ort

    report = NumericReport()
    if low == ir.DataType.BFLOAT16 and not keep_io_types:
        report.skipped = "BF16 inputs cannot be fed from numpy; run with keep_io_types to check numerics"
        return report
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # No graph rewrites: on CPUs without FP16 kernels ORT would otherwise fold the FP16->FP32 casts it
    # inserts into FP32 copies of every weight, doubling the check's memory for nothing.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model, options, providers=ort_providers(providers))
        outputs = session.run(None, _feed_for(session, reference.first_feeds))
    except Exception as e:  # ORT raises its own exception types; any failure means "cannot check here"
        report.skipped = f"ONNX Runtime could not run the converted model: {str(e).strip().splitlines()[0][:200]}"
        return report
    for meta, actual in zip(session.get_outputs(), outputs):
        expected = reference.first_outputs.get(meta.name)
        if expected is None or not np.issubdtype(np.asarray(expected).dtype, np.floating):
            continue
        ref = np.asarray(expected, dtype=np.float64)
        out = np.asarray(actual, dtype=np.float64)
        diff = np.abs(ref - out)
        norm = float(np.linalg.norm(ref))
        report.errors[meta.name] = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "rel_l2": float(np.linalg.norm(ref - out) / norm) if norm > 0 else float(np.linalg.norm(out)),
            "finite": float(np.isfinite(out).all()),
        }
    return report
