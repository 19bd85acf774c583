"""``onnxprec compare``: where a converted or quantized model first departs from its reference, node by node.

The pipeline::

    load both (named as AutoCast names them) -> match tensors -> for each chunk of tensors: run the reference
    (arrays spooled) then the candidate (each array compared as it arrives) -> rows in topological order ->
    first divergence -> the --nodes_to_exclude pattern -> (verify: AutoCast with it, compare again)

Memory: the selected tensors are split into chunks whose estimated size fits half the budget; for each chunk
the reference's arrays are copied as they arrive and kept (in memory up to half the budget, beyond it -- several
batches -- in a temporary file) until the candidate's run on the same batches hands over the matching arrays,
which update streaming :class:`~onnxprec.metrics.ErrorStats` and are dropped. At most one chunk of each model
is held at a time.

Divergence: a tensor *diverges* when the candidate has non-finite values where the reference has none, or when
its relative L2 error exceeds ``rtol`` **and** its max abs error exceeds ``atol`` (the absolute guard keeps
tensors that are nearly all zeros from being flagged for negligible differences). ``first_divergence`` is the
node of the first diverging tensor in the reference's topological order.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import calibration
from onnxprec._graph import FLOAT_TYPES
from onnxprec._io import ModelSource
from onnxprec._ops import QUANTIZED_OPS
from onnxprec._options import fields_in
from onnxprec._report import SUMMARY
from onnxprec._tensors import SENTINEL, SENTINEL_MIN
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.debug._common import depths, model_path, prepare
from onnxprec.debug._options import DEFAULT_ATOL, DEFAULT_RTOL, CompareOptions
from onnxprec.debug.compare_report import (
    CompareReport,
    CompareRow,
    OutputError,
    Verification,
    exclude_pattern,
)
from onnxprec.debug.match import Match, carried_source, carrier_ops, match_values
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, UnsupportedModelError
from onnxprec.metrics import ErrorStats
from onnxprec.reference import DEFAULT_BUDGET_BYTES, chunk_values, estimated_sizes, float_tensors, run_reference

__all__ = [
    "CompareReport",
    "CompareRow",
    "OutputError",
    "Verification",
    "compare_models",
    "exclude_pattern",
]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Streaming comparison


class _Accumulator:
    """Errors of one reference tensor against its candidate, batch by batch."""

    def __init__(self, track_top1: bool = False) -> None:
        self.errors = ErrorStats(track_top1=track_top1)
        self.ref_absmax = 0.0
        self.ref_nonfinite = 0
        self.batches = 0
        self.mismatch: str | None = None
        self.candidate_dtype: str | None = None

    def update(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        self.candidate_dtype = str(candidate.dtype)
        if reference.shape != candidate.shape:
            self.mismatch = f"reference {list(reference.shape)} vs candidate {list(candidate.shape)}"
            return
        if self.mismatch is not None:
            return
        ref = reference if reference.dtype.kind in "fiub" else reference.astype(np.float32)
        if ref.dtype.kind == "f":
            finite = np.isfinite(ref)
            self.ref_nonfinite += int(finite.size - np.count_nonzero(finite))
            if ref.size:
                self.ref_absmax = max(self.ref_absmax, float(np.max(np.abs(ref), where=finite, initial=0.0)))
        elif ref.size:
            self.ref_absmax = max(self.ref_absmax, float(np.abs(ref.astype(np.float64)).max()))
        if ref.dtype.kind == "f" and candidate.dtype.kind == "f":
            reference, candidate = _mask_fills_agree(ref, candidate)
        self.errors.update(reference, candidate)
        self.batches += 1


def _mask_fills_agree(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays with the attention-mask fills they agree on set to 0: where the reference holds an FP32 fill
    (-inf, or ``finfo(float32).min``-like, <= -1e30) and the candidate a fill of its own (<= -1e4: AutoCast writes
    -16384 for FP16 and -2^126 for BF16, :mod:`onnxprec.autocast.masks`). Both mean "masked"; their difference is
    no error (counted as one, a model's mask would be flagged as the first divergence)."""
    with np.errstate(invalid="ignore"):
        both = (reference <= -SENTINEL) & (candidate <= -SENTINEL_MIN)
    if not both.any():
        return reference, candidate
    return np.where(both, 0, reference), np.where(both, 0, candidate)


class _Spool:
    """The reference's arrays of one chunk, per batch, until the candidate's arrays arrive.

    Arrays are copied (ONNX Runtime's arrays can pin the finished session's memory) and kept in memory while they
    fit in ``limit`` bytes; the rest (several batches) goes to one temporary file and is read back one array at a
    time.
    """

    def __init__(self, wanted: Iterable[str], limit: int, folder: Path) -> None:
        self.wanted = set(wanted)
        self.limit = limit
        self.path = folder / "spool.bin"
        self.held = 0
        self._seen: dict[str, int] = {}
        self._memory: dict[tuple[str, int], np.ndarray] = {}
        self._stored: dict[tuple[str, int], tuple[int, np.dtype, tuple[int, ...]]] = {}
        self._end = 0

    def update(self, name: str, array: np.ndarray) -> None:
        if name not in self.wanted:
            return
        batch = self._seen.get(name, 0)
        self._seen[name] = batch + 1
        array = np.asarray(array)
        if self.held + array.nbytes <= self.limit:
            self._memory[(name, batch)] = np.array(array, copy=True)
            self.held += array.nbytes
            return
        with open(self.path, "ab") as stream:
            np.ascontiguousarray(array).tofile(stream)
        self._stored[(name, batch)] = (self._end, array.dtype, array.shape)
        self._end += array.nbytes

    def pop(self, name: str, batch: int) -> np.ndarray | None:
        array = self._memory.pop((name, batch), None)
        if array is not None:
            self.held -= array.nbytes
            return array
        stored = self._stored.pop((name, batch), None)
        if stored is None:
            return None
        offset, dtype, shape = stored
        count = int(np.prod(shape, dtype=np.int64))
        return np.fromfile(self.path, dtype=dtype, count=count, offset=offset).reshape(shape)

    def close(self) -> None:
        self._memory.clear()
        self.path.unlink(missing_ok=True)


class _Comparer:
    """Compares each candidate array with the spooled reference arrays it was matched to."""

    def __init__(self, spool: _Spool, targets: Mapping[str, list[tuple[str, _Accumulator]]]) -> None:
        self.spool = spool
        self.targets = targets
        self._seen: dict[str, int] = {}

    def update(self, name: str, array: np.ndarray) -> None:
        targets = self.targets.get(name)
        if not targets:
            return
        batch = self._seen.get(name, 0)
        self._seen[name] = batch + 1
        candidate = np.asarray(array)
        references: dict[str, np.ndarray | None] = {}
        for ref_name, accumulator in targets:
            if ref_name not in references:
                references[ref_name] = self.spool.pop(ref_name, batch)
            reference = references[ref_name]
            if reference is not None:
                accumulator.update(reference, candidate)


@dataclass
class _Plan:
    """What to compare: reference values with their matches, and the final outputs paired by name or position."""

    rows: list[CompareRow]
    values: list[ir.Value]
    matches: dict[ir.Value, Match]
    outputs: list[tuple[ir.Value, ir.Value | None]]


def _selected(model: ir.Model) -> list[ir.Value]:
    return [
        out
        for node in model.graph
        if node.op_type != "Constant"
        for out in node.outputs
        if out.name and float_tensors(out)
    ]


def _pair_outputs(reference: ir.Model, candidate: ir.Model) -> list[tuple[ir.Value, ir.Value | None]]:
    by_name = {v.name: v for v in candidate.graph.outputs}
    same_count = len(reference.graph.outputs) == len(candidate.graph.outputs)
    pairs = []
    for position, value in enumerate(reference.graph.outputs):
        twin = by_name.get(value.name)
        if twin is None and same_count:
            twin = candidate.graph.outputs[position]
        pairs.append((value, twin))
    return pairs


def _plan(reference: ir.Model, candidate: ir.Model) -> _Plan:
    values = _selected(reference)
    matches = match_values(candidate, values)
    level = depths(reference.graph)
    position = {node: i for i, node in enumerate(reference.graph)}
    rows = []
    for value in values:
        node = value.producer()
        assert node is not None
        m = matches[value]
        rows.append(
            CompareRow(
                index=position[node],
                depth=level[node],
                node=node.name or "",
                op_type=node.op_type,
                tensor=value.name or "",
                candidate=m.candidate.name if m.candidate is not None else None,
                match=m.how,
                status="not run" if m.candidate is not None else "unmatched",
            )
        )
    return _Plan(rows, values, matches, _pair_outputs(reference, candidate))


def _check_inputs(reference: ir.Model, candidate: ir.Model) -> None:
    ref = {s.name: s for s in calibration.input_specs(reference)}
    cand = {s.name: s for s in calibration.input_specs(candidate)}
    if set(ref) != set(cand):
        raise InvalidArgumentError(
            f"The models have different inputs: reference {sorted(ref)}, candidate {sorted(cand)}; compare a model "
            "with a conversion of it (same input names)."
        )
    for name, spec in ref.items():
        other = cand[name].dtype
        both_float = np.issubdtype(spec.dtype, np.floating) and (
            np.issubdtype(other, np.floating) or "float" in str(other)
        )
        if spec.dtype != other and not both_float:
            raise InvalidArgumentError(
                f"Input '{name}' is {spec.dtype} in the reference but {other} in the candidate: compare a model with "
                "a conversion of it (same integer inputs)."
            )


@contextlib.contextmanager
def _runtime_errors(which: str, options: CompareOptions) -> Iterator[None]:
    """ONNX Runtime's refusal to load a model, said for compare (the runner's own hint is about AutoCast)."""
    try:
        yield
    except UnsupportedModelError as e:
        reason = str(e).split("; skip the reference run", 1)[0]
        raise UnsupportedModelError(
            f"{reason} (the {which} model, providers {list(options.providers)}); compare on a provider that has "
            "kernels for its types, e.g. --providers cuda:0 for BF16."
        ) from None


def _stream(
    reference: ir.Model,
    candidate: ir.Model,
    plan: _Plan,
    batches: Iterable[Mapping[str, np.ndarray]],
    options: CompareOptions,
) -> tuple[dict[str, _Accumulator], dict[str, _Accumulator], int, int]:
    """Runs both models chunk by chunk on the same batches; returns accumulators per row tensor and per output."""
    # Half the budget for each model: the reference's chunk (fetched, then copied) and then the spooled chunk
    # with the candidate's each stay within the budget.
    budget = (options.budget_bytes or DEFAULT_BUDGET_BYTES) // 2
    first = next(iter(batches), None)
    if first is None:
        raise CalibrationDataError("The calibration data holds no batch: give at least one set of inputs.")
    graph_outputs = set(reference.graph.outputs)
    matched = [v for v in plan.values if plan.matches[v].candidate is not None]
    inner = [v for v in matched if v not in graph_outputs]
    chunks = chunk_values(inner, estimated_sizes(reference, first), budget) if inner else [[]]
    rows: dict[str, _Accumulator] = {}
    outputs: dict[str, _Accumulator] = {}
    count = 0
    with tempfile.TemporaryDirectory(prefix="onnxprec-compare-") as tmp:
        for index, chunk in enumerate(chunks):
            # Graph outputs come with every run; they are compared with the first chunk.
            chunk_fetch = list(chunk) + ([v for v in matched if v in graph_outputs] if index == 0 else [])
            targets: dict[str, list[tuple[str, _Accumulator]]] = {}
            for value in chunk_fetch:
                cand = plan.matches[value].candidate
                assert cand is not None
                accumulator = rows.setdefault(str(value.name), _Accumulator())
                targets.setdefault(str(cand.name), []).append((str(value.name), accumulator))
            if index == 0:
                for ref_out, cand_out in plan.outputs:
                    if cand_out is not None:
                        accumulator = outputs.setdefault(str(ref_out.name), _Accumulator(track_top1=True))
                        targets.setdefault(str(cand_out.name), []).append((str(ref_out.name), accumulator))
            wanted = {ref_name for pairs in targets.values() for ref_name, _ in pairs}
            spool = _Spool(wanted, budget, Path(tmp))
            common = {"providers": options.providers, "budget_bytes": budget, "observe_inputs": False}
            logger.info("Chunk %d/%d: %d tensors", index + 1, len(chunks), len(chunk_fetch))
            with _runtime_errors("reference", options):
                result = run_reference(reference, batches, select=chunk, observers=[spool], **common)  # type: ignore[arg-type]
            count = result.num_batches
            cand_values = [plan.matches[v].candidate for v in chunk]
            with _runtime_errors("candidate", options):
                run_reference(candidate, batches, select=cand_values, observers=[_Comparer(spool, targets)], **common)  # type: ignore[arg-type]
            spool.close()
    return rows, outputs, count, len(chunks)


def _fill(
    plan: _Plan, rows: Mapping[str, _Accumulator], outputs: Mapping[str, _Accumulator], options: CompareOptions
) -> dict[str, OutputError]:
    for row in plan.rows:
        accumulator = rows.get(row.tensor)
        if accumulator is None:
            continue
        row.candidate_dtype = accumulator.candidate_dtype
        if accumulator.mismatch is not None:
            row.status = "shape mismatch"
            row.match = f"{row.match}; {accumulator.mismatch}"
            continue
        if not accumulator.batches:
            continue
        errors = accumulator.errors
        row.status = "compared"
        row.max_abs, row.rel_l2, row.cosine = errors.max_abs, errors.rel_l2, errors.cosine
        row.ref_absmax = accumulator.ref_absmax
        row.nonfinite, row.ref_nonfinite = errors.nonfinite, accumulator.ref_nonfinite
        row.diverged = errors.nonfinite > accumulator.ref_nonfinite or (
            errors.rel_l2 > options.rtol and errors.max_abs > options.atol
        )
    result = {}
    for ref_out, cand_out in plan.outputs:
        name = str(ref_out.name)
        error = OutputError(name, cand_out.name if cand_out is not None else None)
        accumulator = outputs.get(name)
        if accumulator is not None and accumulator.batches:
            stats = accumulator.errors
            error.max_abs, error.rel_l2, error.cosine = stats.max_abs, stats.rel_l2, stats.cosine
            error.top1, error.nonfinite = stats.top1, stats.nonfinite
        result[name] = error
    return result


def _compare(reference: ir.Model, candidate: ir.Model, options: CompareOptions, data: CalibrationArgs) -> CompareReport:
    _check_inputs(reference, candidate)
    plan = _plan(reference, candidate)

    def run(batches: CalibrationData) -> tuple[Any, ...]:
        return _stream(reference, candidate, plan, batches, options)

    rows, outputs, batches, chunks = data.run(reference, run)
    report = CompareReport(plan.rows, _fill(plan, rows, outputs, options), options.atol, options.rtol, batches, chunks)
    subgraphs = sum(1 for _ in reference.graph.subgraphs())
    if subgraphs:
        report.notes.append(f"{subgraphs} subgraph(s) (If/Loop/Scan bodies) are compared only through their outputs")
    report.exclude_nodes = _exclude_nodes(reference, candidate, plan, report.first_divergence_row)
    if report.exclude_nodes and report.exclude_nodes != [report.first_divergence]:
        first = report.first_divergence_row
        assert first is not None
        report.notes.append(
            f"'{first.node}' is not a quantized layer (Conv, MatMul, Gemm, Gather) in the candidate; the quantized "
            "layer(s) behind its error: " + ", ".join(report.exclude_nodes)
        )
    else:
        hint = _upstream_hint(candidate, report.first_divergence)
        if hint:
            report.notes.append(hint)
    return report


_INTEGER_KERNELS = QUANTIZED_OPS - {"QuantizeLinear", "DequantizeLinear"}


def _reads_quantized(node: ir.Node) -> bool:
    """Whether a candidate node computes on quantized values: an integer kernel, or inputs through DequantizeLinear."""
    if node.op_type in _INTEGER_KERNELS:
        return True
    return any(v is not None and "DequantizeLinear" in carrier_ops(v) for v in node.inputs)


class _Quantized:
    """Which reference nodes compute on quantized values in the candidate (their twin, or what replaced them)."""

    def __init__(self, reference: ir.Model, candidate: ir.Model, plan: _Plan) -> None:
        self.ref_names = {n.name for n in reference.graph if n.name}
        self.twins = {n.name: n for n in candidate.graph if n.name}
        self.plan = plan

    def __call__(self, node: ir.Node) -> bool:
        twin = self.twins.get(node.name or "")
        if twin is not None:
            return _reads_quantized(twin)
        # Replaced (e.g. a MatMul by MatMulInteger and rescaling nodes): look at the new nodes behind its output.
        for out in node.outputs:
            match = self.plan.matches.get(out)
            start = match.candidate.producer() if match is not None and match.candidate is not None else None
            stack, seen = [start] if start is not None else [], 0
            while stack and seen < 16:
                current = stack.pop()
                seen += 1
                if current.op_type in _INTEGER_KERNELS or (
                    current.op_type != "DequantizeLinear" and _reads_quantized(current)
                ):
                    return True
                stack += [
                    p
                    for v in current.inputs
                    if v is not None and (p := v.producer()) is not None and p.name not in self.ref_names
                ]
        return False


def _exclude_nodes(
    reference: ir.Model, candidate: ir.Model, plan: _Plan, first: CompareRow | None, limit: int = 400
) -> list[str]:
    """The nodes whose ``--nodes_to_exclude`` removes the quantization behind the first divergence.

    The divergent node itself when it computes on quantized values; else, when its tensor is compared as its
    consumers see it (through QuantizeLinear/DequantizeLinear), the candidate nodes that read it quantized; else the
    nearest quantized nodes upstream in the reference. Each is then named by the layer the quantizer owns
    (:func:`_owned_layers`: a Transpose on INT8 values by the Conv that reads it), so the advice changes what
    ``quantize int8`` / ``int4`` write. Empty when the candidate has no quantized node on that path (an AutoCast
    model: the divergent node itself is the answer).
    """
    if first is None:
        return []
    value = next((v for v in plan.values if v.name == first.tensor), None)
    node = value.producer() if value is not None else None
    if value is None or node is None:
        return []
    quantized = _Quantized(reference, candidate, plan)
    if quantized(node):
        return _owned_layers([node], quantized, limit)
    seen = plan.matches[value].candidate
    if seen is not None and (producer := seen.producer()) is not None and producer.op_type == "DequantizeLinear":
        by_name = {n.name: n for n in reference.graph if n.name}
        readers = sorted({u.node.name for u in seen.uses() if u.node.name in quantized.ref_names})
        if readers:
            return _owned_layers([by_name[name] for name in readers], quantized, limit)
    found: list[ir.Node] = []
    visited: set[ir.Node] = {node}
    frontier = [node]
    while frontier and not found and len(visited) < limit:
        upstream = []
        for current in frontier:
            for v in current.inputs:
                p = v.producer() if v is not None else None
                if p is not None and p not in visited:
                    visited.add(p)
                    upstream.append(p)
        found = [p for p in upstream if p.name and quantized(p)]
        frontier = upstream
    return _owned_layers(found, quantized, limit)


LAYER_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Gather"})
"""The ops whose weights the quantizers own (INT8: Conv, MatMul, Gemm; INT4: MatMul, Gemm, Gather): the nodes a
``--nodes_to_exclude`` of ``quantize int8`` / ``int4`` keeps in float."""


def _owned_layers(nodes: list[ir.Node], quantized: _Quantized, limit: int) -> list[str]:
    """The quantized layers (:data:`LAYER_OPS`) that own the quantization of ``nodes``: a node that is one itself,
    else the nearest quantized layers downstream (a Transpose or a pool computing on INT8 values does so because the
    Conv that reads it is quantized: excluding the Conv removes the Q/DQ pair), else upstream; a node with none
    stays as it is."""
    owners: set[str] = set()
    for node in nodes:
        if node.op_type in LAYER_OPS:
            owners.add(str(node.name))
            continue
        found = _nearest(node, quantized, _readers, limit) or _nearest(node, quantized, _producers, limit)
        owners.update(found or [str(node.name)])
    return sorted(owners)


def _readers(node: ir.Node) -> list[ir.Node]:
    return [use.node for out in node.outputs for use in out.uses()]


def _producers(node: ir.Node) -> list[ir.Node]:
    return [p for v in node.inputs if v is not None and (p := v.producer()) is not None]


def _nearest(node: ir.Node, quantized: _Quantized, step: Callable[[ir.Node], list[ir.Node]], limit: int) -> list[str]:
    """The quantized layers nearest to ``node`` along ``step`` (all of the first level that has any)."""
    visited, frontier = {node}, [node]
    while frontier and len(visited) < limit:
        level = [n for current in frontier for n in step(current) if n not in visited]
        visited.update(level)
        found = sorted({str(n.name) for n in level if n.op_type in LAYER_OPS and n.name and quantized(n)})
        if found:
            return found
        frontier = level
    return []


def _upstream_hint(candidate: ir.Model, node_name: str | None) -> str | None:
    """A note when the first divergent node already computes in FP32 in the candidate (the cause is upstream)."""
    node = next((n for n in candidate.graph if node_name and n.name == node_name), None)
    if node is None:
        return None
    floats = [v for v in node.inputs if v is not None and v.dtype in FLOAT_TYPES]
    if not floats or any(v.dtype != ir.DataType.FLOAT for v in floats):
        return None
    if any(op in QUANTIZED_OPS for v in floats for op in carrier_ops(v)):
        return None  # a dequantized (e.g. INT4) weight or activation: excluding the node from quantization helps
    producers = sorted({p.name for v in floats if (p := carried_source(v).producer()) is not None and p.name})
    where = f"; its inputs come from {', '.join(producers[:5])}" if producers else ""
    return (
        f"'{node_name}' already computes in FP32 in the candidate, so excluding it changes nothing: the difference "
        f"comes from its inputs or its weights{where}"
    )


# --------------------------------------------------------------------------------------------------
# Verification with AutoCast


def _float_types(model: ir.Model) -> set[ir.DataType]:
    types = {out.dtype for node in model.graph.all_nodes() for out in node.outputs}
    types |= {v.dtype for v in model.graph.initializers.values()}
    return {t for t in types if t in FLOAT_TYPES}


def _keeps_io_types(reference: ir.Model, candidate: ir.Model) -> bool:
    ref = {v.name: v.dtype for v in (*reference.graph.inputs, *reference.graph.outputs)}
    return all(v.dtype == ref.get(v.name) for v in (*candidate.graph.inputs, *candidate.graph.outputs) if v.name in ref)


def _verify(
    source: ModelSource,
    reference: ir.Model,
    candidate: ir.Model,
    report: CompareReport,
    options: CompareOptions,
    data: CalibrationArgs,
) -> Verification | None:
    first = report.first_divergence_row
    if first is None:
        report.notes.append("verify: nothing to verify, no node diverges")
        return None
    types = _float_types(candidate)
    if ir.DataType.BFLOAT16 in types:
        low = "bf16"
    elif ir.DataType.FLOAT16 in types:
        low = "fp16"
    else:
        report.notes.append("verify: skipped, the candidate has no FP16 or BF16 tensors (not an AutoCast model)")
        return None
    from onnxprec.autocast import convert_file, convert_to_mixed_precision

    pattern = exclude_pattern(first.node)
    keep_io = _keeps_io_types(reference, candidate)
    settings: dict[str, Any] = {
        "low_precision_type": low,
        "keep_io_types": keep_io,
        "calibration_data": data.source,
        "input_shapes": options.input_shapes,
        "providers": options.providers,
        **dict(options.autocast_options or {}),
    }
    settings["nodes_to_exclude"] = [*settings.get("nodes_to_exclude", ()), pattern]
    logger.info("verify: AutoCast %s with --nodes_to_exclude '%s'", low, pattern)
    with tempfile.TemporaryDirectory(prefix="onnxprec-verify-") as tmp:
        path = model_path(source)
        fixed: ModelSource
        if path is not None:
            fixed = Path(tmp) / "fixed.onnx"
            convert_file(path, fixed, **settings)
        else:
            proto = source if isinstance(source, onnx.ModelProto) else ir.serde.serialize_model(reference)
            fixed = convert_to_mixed_precision(proto, **settings)
        after = _compare(reference, prepare(fixed), replace(options, verify=False), data)
    return Verification(
        pattern=pattern,
        node=first.node,
        low_precision_type=low,
        keep_io_types=keep_io,
        before=first,
        after=next((r for r in after.rows if r.tensor == first.tensor), None),
        after_first_divergence=after.first_divergence,
        outputs_before=report.outputs,
        outputs_after=after.outputs,
    )


# --------------------------------------------------------------------------------------------------
# API


def compare_models(
    reference: ModelSource,
    candidate: ModelSource,
    calibration_data: Any = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    *,
    input_shapes: str | Mapping[str, Any] | None = None,
    providers: Any = ("cpu",),
    verify: bool = False,
    autocast_options: Mapping[str, Any] | None = None,
    budget_bytes: int | None = None,
) -> CompareReport:
    """Runs both models on the same inputs and compares every matched tensor, in the reference's topological order.

    Tensors are matched by name, then by the original name converters record, then through inserted Casts,
    QuantizeLinear/DequantizeLinear and renamed nodes (:mod:`onnxprec.debug.match`). Each float node output of
    the reference gets a row with max abs error, relative L2 error and cosine similarity over all batches; the
    final outputs also get top-1 agreement. Both models are run chunk by chunk on the same batches, so memory
    stays bounded (see the module docstring).

    Args:
        reference: The source model: a path, an ``onnx.ModelProto`` or an ``ir.Model``.
        candidate: Its conversion or quantization (same input names).
        calibration_data: Inputs for both models: a path (an ``.npz`` file, a folder of ``.npz`` files, a Polygraphy
            ``.json``), a dict of arrays, a list or iterator of feed dicts, or an ONNX Runtime
            ``CalibrationDataReader``; None: realistic random inputs made from the reference's inputs.
        atol: A node diverges when its max abs error exceeds atol and its relative L2 error exceeds rtol, or when it
            has non-finite values the reference has not.
        rtol: Relative L2 error tolerance (see --atol).
        input_shapes: Sizes of dynamic inputs for random data: ``"name:1x3x224x224,ids:1x128"`` or a dict of shapes.
        providers: ONNX Runtime providers for both models' runs: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        verify: Re-run AutoCast on the reference with the printed --nodes_to_exclude pattern and compare again, to
            check that keeping the first divergent node in high precision fixes the divergence.
        autocast_options: Other ``convert_to_mixed_precision`` arguments for the conversion of ``verify`` (e.g.
            ``{'data_max': math.inf}`` when the candidate was made that way).
        budget_bytes: Upper bound on the bytes of the tensors fetched in one ONNX Runtime run (tensors are fetched in
            chunks); None: the reference runner's default (768 MiB).

    Returns:
        The report: ``rows``, ``outputs``, ``first_divergence``, ``exclude_pattern``, ``verification``,
        ``to_json()``, ``to_html()`` and ``table()``.

    Raises:
        OnnxprecError: A bad model or input data, or models with different inputs.
    """
    options = CompareOptions(**fields_in(CompareOptions, locals()))
    ref_model = prepare(reference, "reference")
    cand_model = prepare(candidate, "candidate")
    data = CalibrationArgs(options.calibration_data, options.input_shapes)
    with contextlib.ExitStack() as stack:
        if not data.random:  # read by the comparison and again by the verification: made once
            data = replace(data, source=stack.enter_context(data.open(ref_model)))
        report = _compare(ref_model, cand_model, options, data)
        ref_path, cand_path = model_path(reference), model_path(candidate)
        report.reference = str(ref_path) if ref_path is not None else None
        report.candidate = str(cand_path) if cand_path is not None else None
        if options.verify:
            report.verification = _verify(reference, ref_model, cand_model, report, options, data)
    logger.info(report.summary, extra=SUMMARY)
    return report
