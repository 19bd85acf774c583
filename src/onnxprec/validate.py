"""Validation of a converted model: checker, strict type inference, I/O contract, and a numeric check."""

from __future__ import annotations

import dataclasses
import logging
import re
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

__all__ = ["IOContract", "IOEntry", "NumericReport", "check_io_contract", "check_structure", "numeric_check"]

logger = logging.getLogger(__name__)
_F = ir.DataType.FLOAT


@dataclass(frozen=True)
class IOEntry:
    """One graph input or output: name, element type, kind (``tensor``, ``sequence``, ``optional``...), shape.

    ``shape`` holds ints for static dims and None for the others; None as a whole when undeclared.
    """

    name: str
    dtype: ir.DataType | None
    kind: str
    shape: tuple[int | None, ...] | None

    @classmethod
    def of(cls, value: ir.Value) -> IOEntry:
        kind = "tensor" if value.type is None else type(value.type).__name__.removesuffix("Type").lower()
        shape = None
        if value.shape is not None:
            shape = tuple(d if isinstance(d, int) else None for d in value.shape)
        return cls(str(value.name), value.dtype, kind, shape)

    def fits(self, expected: IOEntry) -> bool:
        """Same name, type and kind; the same rank and static dims wherever ``expected`` declares them."""
        if (self.name, self.dtype, self.kind) != (expected.name, expected.dtype, expected.kind):
            return False
        if expected.shape is None:
            return True
        if self.shape is None or len(self.shape) != len(expected.shape):
            return False
        return all(e is None or a == e for a, e in zip(self.shape, expected.shape))

    def __str__(self) -> str:
        dtype = dtype_name(self.dtype) if self.dtype else "?"
        kind = "" if self.kind == "tensor" else f"{self.kind} of "
        shape = "" if self.shape is None else "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.name}:{kind}{dtype}{shape}"


@dataclass(frozen=True)
class IOContract:
    """The graph's fed inputs and its outputs (names, types, kinds and shapes), captured before conversion."""

    inputs: tuple[IOEntry, ...]
    outputs: tuple[IOEntry, ...]

    @classmethod
    def of(cls, model: ir.Model) -> IOContract:
        graph = model.graph
        return cls(
            tuple(IOEntry.of(v) for v in graph.inputs if not v.is_initializer()),
            tuple(IOEntry.of(v) for v in graph.outputs),
        )

    def expected(self, low: ir.DataType, keep_io_types: bool) -> IOContract:
        """The contract after conversion: FP32 tensor I/O become ``low`` unless ``keep_io_types``."""

        def retype(items: tuple[IOEntry, ...]) -> tuple[IOEntry, ...]:
            if keep_io_types:
                return items
            return tuple(
                dataclasses.replace(e, dtype=low) if (e.dtype == _F and e.kind == "tensor") else e for e in items
            )

        return IOContract(retype(self.inputs), retype(self.outputs))

    def fits(self, expected: IOContract) -> bool:
        return all(
            len(mine) == len(theirs) and all(a.fits(b) for a, b in zip(mine, theirs))
            for mine, theirs in ((self.inputs, expected.inputs), (self.outputs, expected.outputs))
        )


def check_io_contract(model: ir.Model, expected: IOContract) -> None:
    """Raises ValidationError if I/O names, types or declared shapes differ from ``expected``.

    ``expected`` comes from the user's original model (before any opset upgrade): a conversion must never
    change the public interface.
    """
    actual = IOContract.of(model)
    if not actual.fits(expected):
        raise ValidationError(
            f"Converted model broke the I/O contract: expected inputs {_fmt(expected.inputs)} and outputs "
            f"{_fmt(expected.outputs)}, got {_fmt(actual.inputs)} and {_fmt(actual.outputs)}. This is a bug in "
            "onnxprec: please report it with the model."
        )


def _fmt(items: tuple[IOEntry, ...]) -> str:
    return "[" + ", ".join(str(e) for e in items) + "]"


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
    failed_node: str | None = None  # the node ONNX Runtime names when it cannot run the model (a kernel gap)

    @property
    def max_rel_l2(self) -> float:
        return max((e["rel_l2"] for e in self.errors.values()), default=0.0)


# ORT names the node it has no kernel for at load ("node with name 'x'") or at run time ("Name:'x'").
_NODE_IN_ERROR = re.compile(r"node with name '([^']*)'|Name:'([^']*)'")


def numeric_check(
    model: str | bytes | ir.Model,
    reference: ReferenceResult,
    *,
    providers: list[str] | None = None,
) -> NumericReport:
    """Runs the converted model on the reference run's first batch and compares outputs with FP32.

    BF16 and FP8 inputs and outputs are fed and fetched like any other. Elements that are NaN or infinite in
    FP32 already are left out (a converted model is not blamed for them), as are empty and sequence outputs.
    Never raises for a model ONNX Runtime cannot run (e.g. a BF16 op without a CPU kernel): the report then says
    why the check was skipped.
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
        named = _NODE_IN_ERROR.search(str(e))
        report.failed_node = next(g for g in named.groups() if g is not None) if named else None
        return report
    for name, actual in zip(session.output_names, outputs):
        expected = reference.first_outputs.get(name)
        if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
            continue  # missing, or a sequence / optional output
        if not np.issubdtype(expected.dtype, np.floating) or expected.size == 0 or expected.shape != actual.shape:
            continue
        actual = actual.astype(np.float32)
        finite = np.isfinite(expected)
        if not finite.all():  # where FP32 itself gives NaN or inf, the converted model is not judged
            expected, actual = expected[finite], actual[finite]
            if not expected.size:
                continue
        result = metrics.compare(expected, actual)
        report.errors[name] = {
            "max_abs": result["max_abs"],
            "rel_l2": result["rel_l2"],
            "cosine": result["cosine"],
            "finite": float(result["nonfinite"] == 0),
        }
    return report
