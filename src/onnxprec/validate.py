"""Validation of a converted model: checker, strict type inference, I/O contract, and a numeric check."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort, metrics
from onnxprec._graph import dtype_name
from onnxprec._io import WrittenModel, load_model
from onnxprec._ops import (
    ORT_DOMAINS,
    default_opset,
    is_ort_onnx_domain_op,
    is_standard_op,
    normalized_domain,
    opsets_by_domain,
)
from onnxprec._packed_tables import mapped_for_run
from onnxprec._protobuf import proto_graphs, structure_proto
from onnxprec.errors import ValidationError
from onnxprec.reference import DEFAULT_SEGMENT_BYTES, ReferenceResult, run_message, run_reference

if TYPE_CHECKING:
    from onnxprec.accuracy import TaskMetrics, TaskSummary

__all__ = [
    "IOContract",
    "IOEntry",
    "NumericReport",
    "check_io_contract",
    "check_structure",
    "describe_ops",
    "load_in_ort",
    "numeric_check",
    "ort_only_ops",
    "prove_by_run",
    "task_check",
]

logger = logging.getLogger(__name__)
_F = ir.DataType.FLOAT
_RETYPED = frozenset({_F, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


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
        """The contract after conversion: FP32, FP16 and BF16 tensor I/O become ``low`` unless ``keep_io_types``
        (FP64 I/O keep their type)."""

        def retype(items: tuple[IOEntry, ...]) -> tuple[IOEntry, ...]:
            if keep_io_types:
                return items
            return tuple(
                dataclasses.replace(e, dtype=low) if (e.dtype in _RETYPED and e.kind == "tensor") else e for e in items
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


# Where the structure copy puts ONNX Runtime's ONNX-domain contrib ops, so that onnx.checker and strict inference
# check everything else (they reject an op they do not know in the ONNX domain, and skip other domains).
_SET_ASIDE_DOMAIN = "onnxprec.ort_onnx_domain"


def ort_only_ops(model: ir.Model) -> dict[str, int]:
    """Nodes that only ONNX Runtime can check and run, by op (``"com.microsoft::GroupQueryAttention"``): ORT's contrib
    ops in its own domains and those it registers in the ONNX domain (``SimplifiedLayerNormalization``)."""
    opsets = opsets_by_domain(model)
    found: dict[str, int] = {}
    for node in model.graph.all_nodes():
        if _is_ort_op(node, opsets):
            key = f"{node.domain}::{node.op_type}" if normalized_domain(node.domain) else node.op_type
            found[key] = found.get(key, 0) + 1
    return found


def _is_ort_op(node: ir.Node, opsets: Mapping[str, int]) -> bool:
    domain = normalized_domain(node.domain)
    return domain in ORT_DOMAINS or is_ort_onnx_domain_op(node.op_type, domain, opsets.get(domain, 1))


def describe_ops(ops: Mapping[str, int]) -> str:
    """``{"A": 2, "B": 1}`` as ``"2 nodes (A x2, B x1)"``."""
    total = sum(ops.values())
    listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{total} node{'s' if total != 1 else ''} ({listed})"


def _set_aside(graph: onnx.GraphProto, opset: int) -> int:
    moved = 0
    for g in proto_graphs(graph):
        for node in g.node:
            if is_ort_onnx_domain_op(node.op_type, node.domain, opset):
                node.domain = _SET_ASIDE_DOMAIN
                moved += 1
    return moved


def check_structure(model: ir.Model) -> dict[str, int]:
    """onnx.checker (full check: strict shape and type inference) on the model without its large weights.

    Weights above 1 KB are stripped before the C++ call, so this is cheap and works above 2 GB. ONNX Runtime's
    contrib ops registered in the ONNX domain are moved to a private domain in that copy, so the checker and strict
    inference cover every other node; the nodes that only ONNX Runtime can check are returned, for the caller to
    prove in ONNX Runtime (:func:`load_in_ort`, or the run of :func:`numeric_check`). Intermediate values and graph
    outputs keep their declared element types and lose their declared shapes in the copy: exporters declare wrong
    ones (the onnxruntime-genai builder gives rank-0 shapes to rank-1 Constants; a torch export can declare a rank-2
    output that its Reshape makes rank 3, which Reshape-14's inference sees after an opset upgrade), and ONNX Runtime
    loads such a model, merging the declared shape leniently with the one it infers, while inference here still
    derives and checks every shape from the graph inputs and weights. Entries that declare an initializer or a graph
    input are dropped from the copy, as the tensor or input declares it.

    Strict inference is relaxed only for a model with ops no runtime here knows (plugins of custom domains).

    Args:
        model: The model (unchanged).

    Returns:
        The nodes only ONNX Runtime can check, by op (:func:`ort_only_ops`); empty for a pure ONNX model.
    """
    proto = structure_proto(model)
    # Initializers and graph inputs carry their own type and shape: a shapeless value_info entry of one (onnx-ir
    # writes one for every typed initializer) hides the data of a Slice's axes or a Squeeze's axes from inference.
    declared = {i.name for i in proto.graph.initializer} | {i.name for i in proto.graph.input}
    kept = [info for info in proto.graph.value_info if info.name not in declared]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    _clear_shapes(proto.graph.value_info)  # see the docstring
    if _set_aside(proto.graph, default_opset(model)):
        proto.opset_import.append(onnx.helper.make_opsetid(_SET_ASIDE_DOMAIN, 1))
    ort_only = ort_only_ops(model)
    opsets = opsets_by_domain(model)
    has_custom_ops = any(
        not is_standard_op(n, opsets.get(normalized_domain(n.domain), 1)) and not _is_ort_op(n, opsets)
        for n in model.graph.all_nodes()
    )
    try:
        onnx.checker.check_model(proto)  # a graph output must declare a shape here: the checker's rule
        _clear_shapes(proto.graph.output)
        # What check_model(full_check=True) runs, without the declared shapes of the graph outputs
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=not has_custom_ops)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ValidationError(
            f"Converted model fails onnx.checker/type inference ({_ort.first_line(e, 400)}). This is a bug in "
            "onnxprec: please report it; meanwhile exclude the node it names with --nodes_to_exclude."
        ) from e
    return ort_only


def _clear_shapes(infos: Sequence[onnx.ValueInfoProto]) -> None:
    for info in infos:
        if info.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")


def _chain_text(error: BaseException) -> str:
    """The messages of an exception and of the exceptions it was raised from (ORT's whole message, where ours
    kept its first line)."""
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 8:
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def _no_kernel(error: str) -> bool:
    """ONNX Runtime resolved the graph (typing every node against its schemas) and then found no kernel for a node
    on this provider (a BF16 op on the CPU): the types are proved, the run is not possible here."""
    return _ort.is_kernel_gap(error)


def _typed_not_run(ort_only: Mapping[str, int], error: str) -> None:
    logger.warning(
        "ONNX Runtime typed the output's %s against its schemas, but has no kernel here to run it (%s): they are "
        "type-checked, not run; check the output on a provider that has the kernels (e.g. --providers cuda).",
        describe_ops(ort_only),
        error,
    )


def load_in_ort(
    model: str | bytes | ir.Model, ort_only: Mapping[str, int], *, providers: list[str] | None = None
) -> None:
    """Proves the nodes only ONNX Runtime can check by loading the model in it: ORT types every node against its
    own schemas and creates a kernel for each. No-op when ``ort_only`` is empty. A provider without a kernel for a
    node (after the graph typed) is a WARNING: the types are proved, the kernels are the provider's.

    Raises:
        ValidationError: ONNX Runtime rejects the model, so those nodes are wrong or unchecked.
    """
    if not ort_only:
        return
    try:
        _ort.create_session(model, providers=providers, optimization="none", low_memory=True, what="the output")
    except Exception as e:
        if _no_kernel(str(e)):
            _typed_not_run(ort_only, _ort.first_line(e, 300))
            return
        raise ValidationError(
            f"ONNX Runtime rejects the output ({_ort.first_line(e, 300)}), and only it can check its "
            f"{describe_ops(ort_only)}. This is a bug in onnxprec: please report it with the model."
        ) from e
    logger.info(
        "ONNX Runtime loads the output: its %s, which onnx.checker cannot type, type-check and have kernels",
        describe_ops(ort_only),
    )


def prove_by_run(report: NumericReport, ort_only: Mapping[str, int]) -> None:
    """Says that the numeric check's run proved the nodes only ONNX Runtime can check. When ONNX Runtime could not
    run the output: a WARNING if only a kernel was missing on this provider (the graph typed), else an error.

    Raises:
        ValidationError: The model has such nodes and ONNX Runtime rejected it.
    """
    if not ort_only:
        return
    if report.skipped and report.no_kernel:
        _typed_not_run(ort_only, report.skipped)
    elif report.skipped:
        raise ValidationError(
            f"{report.skipped}; only ONNX Runtime can check the output's {describe_ops(ort_only)}, so the output is "
            "unchecked. This is a bug in onnxprec: please report it with the model; --no_validate skips the check."
        )
    else:
        proved_by_run(ort_only)


def proved_by_run(ort_only: Mapping[str, int]) -> None:
    """Says that a run of the output in ONNX Runtime (every node in a session) proved the nodes only it can check."""
    if ort_only:
        logger.info(
            "ONNX Runtime ran the output: its %s, which onnx.checker cannot type, are proved by the run",
            describe_ops(ort_only),
        )


@dataclass
class NumericReport:
    """Output error of the converted model against the FP32 reference on the same inputs."""

    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: str = ""
    failed_node: str | None = None  # the node ONNX Runtime names when it cannot run the model (a kernel gap)
    failed_op: str | None = None  # its op type, where ORT says it (it names unnamed nodes '')
    no_kernel: bool = False  # ONNX Runtime typed the graph but has no kernel for a node on this provider
    task: TaskSummary | None = None  # each output's task metric (:mod:`onnxprec.accuracy`), when asked for

    @property
    def max_rel_l2(self) -> float:
        return max((e["rel_l2"] for e in self.errors.values()), default=0.0)


# ORT names the node it has no kernel for at load ("node with name 'x'") or at run time ("Name:'x'").
_NODE_IN_ERROR = re.compile(r"node with name '([^']*)'|Name:'([^']*)'")


def numeric_check(
    model: str | onnx.ModelProto | ir.Model | WrittenModel,
    reference: ReferenceResult,
    *,
    providers: list[str] | None = None,
    task: TaskMetrics | None = None,
) -> NumericReport:
    """Runs the converted model on the reference run's first batch and compares outputs with FP32 (and, with
    ``task``, each output's task metric: :class:`onnxprec.accuracy.TaskMetrics`, summarized in ``report.task``).

    BF16 and FP8 inputs and outputs are fed and fetched like any other. Elements that are NaN or infinite in
    FP32 already are left out (a converted model is not blamed for them), as are empty and sequence outputs.
    Never raises for a model ONNX Runtime cannot run (e.g. a BF16 op without a CPU kernel): the report then says
    why the check was skipped. A file just written (:class:`onnxprec._io.WrittenModel`) is run from the message its
    writer knows (its weights read from the file), without reading the file into onnx-ir again.
    """
    report = NumericReport()
    try:
        # A run of the converted model as the reference run of the original one: no graph rewrites (on CPUs
        # without FP16 kernels ORT would fold the FP16->FP32 casts it inserts into FP32 copies of every weight),
        # weights mapped rather than copied, and a large model run segment by segment, so the check never holds
        # more weights at once than the reference run did.
        feeds, what = [reference.first_feeds], "the converted model"
        if isinstance(model, WrittenModel) and model.message is not None:
            run = run_message(model.message, model.path.parent, feeds, providers=providers, what=what)
        else:
            source = load_model(str(model.path) if isinstance(model, WrittenModel) else model)
            run = run_reference(source, feeds, select=(), providers=providers, observe_inputs=False, what=what)
        outputs = run.first_outputs
        if task is not None:
            from onnxprec.accuracy import batch_size

            task.update(reference.first_outputs, outputs, batch_size(reference.first_feeds))
            report.task = task.summary()
    except Exception as e:  # any failure means "cannot check here", never a failed conversion
        report.skipped = f"ONNX Runtime could not run the converted model: {_ort.first_line(e, 200)}"
        text = _chain_text(e)  # the node ORT names may be past the first line our errors keep
        named = _NODE_IN_ERROR.search(text)
        report.failed_node = next(g for g in named.groups() if g is not None) if named else None
        op = _ort.NO_PROVIDER.search(text)
        report.failed_op = op.group(1) if op else None
        report.no_kernel = _no_kernel(text)
        return report
    for name, actual in outputs.items():
        expected = reference.first_outputs.get(name)
        if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
            continue  # missing, or a sequence / optional output
        if not np.issubdtype(expected.dtype, np.floating) or expected.size == 0 or expected.shape != actual.shape:
            continue
        actual = actual.astype(np.float32, copy=False)  # FP32 outputs as they are (no 25 MB copy of logits)
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


def task_check(
    reference: ir.Model,
    candidate: str | os.PathLike[str],
    source: Any = None,
    *,
    providers: Sequence[str] | None = None,
    input_shapes: Mapping[str, Any] | str | None = None,
    segment_bytes: int | None = None,
) -> tuple[TaskSummary, bool]:
    """Runs the float ``reference`` and the written ``candidate`` on the first batch of ``source`` (any calibration
    source; None: realistic random data) and compares each output by its task metric
    (:func:`onnxprec.accuracy.task_metrics`); each model runs alone (segment by segment when large, in sessions of at
    most ``segment_bytes`` of weights: None, the runner's default for ``providers``). The candidate's 4-bit tables
    whose float32 form exceeds that are read packed, not expanded, and its weights mapped from a temporary copy
    (:func:`onnxprec._packed_tables.mapped_for_run`).

    Returns:
        The task metrics and whether the batch was random data.
    """
    from onnxprec.accuracy import batch_size, task_metrics
    from onnxprec.calibration_data import CalibrationArgs, CalibrationData

    limit = segment_bytes or _ort.session_weight_bytes(providers, DEFAULT_SEGMENT_BYTES)

    def run(data: CalibrationData) -> tuple[TaskSummary, bool]:
        feeds = [data.first]
        ref = run_reference(reference, feeds, select=(), providers=providers, observe_inputs=False,
                            segment_bytes=segment_bytes, what="the float model")  # fmt: skip
        with mapped_for_run(candidate, limit) as written:
            got = run_reference(written, feeds, select=(), providers=providers, observe_inputs=False,
                                segment_bytes=segment_bytes, what="the result")  # fmt: skip
        summary = task_metrics(reference, [ref.first_outputs], [got.first_outputs], [batch_size(data.first)])
        return summary, data.random

    return CalibrationArgs(source, input_shapes).run(reference, run)
