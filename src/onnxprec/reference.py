"""Reference runs: ONNX Runtime over calibration batches, every selected tensor handed to observers.

A tool says *which* tensors it needs (a selector over ``ir.Value``) and *what* it keeps of them
(observers, :mod:`onnxprec.observers`); the runner never keeps a tensor after handing it over. Selected
tensors are marked as graph outputs in chunks whose estimated size stays under a memory budget, so a large
model's activations never all sit in memory at once. ONNX Runtime maps the model's weights from their
files itself (no second copy in this process, no weight pre-packing), and the graph is serialized once:
each chunk only adds its outputs to the same small message.

ONNX Runtime maps external weights rather than copying them, but every page a run touches stays resident (as
file-backed memory) while the session lives, so one session over a 4 GB model peaks at 4 GB of RSS. Models whose
weights exceed ``segment_bytes`` (192 MiB on the CPU, 1 GiB on a GPU by default) are therefore run **segment by
segment** when no node has a subgraph (:mod:`onnxprec.segments`): peak RSS is then one piece's weights plus the
activations later pieces read; each piece runs once, so a run is linear in the depth of the model.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort, segments
from onnxprec._graph import FLOAT_TYPES
from onnxprec._pieces import gather_columns
from onnxprec._progress import Progress
from onnxprec._protobuf import structure_proto
from onnxprec.calibration_data import CalibrationData, copy_value
from onnxprec.errors import UnsupportedModelError
from onnxprec.observers import Observer, RangeObserver, TensorStats
from onnxprec.reductions import AddRangeReductionsPass, RangeReductionsResult, remove_range_reductions
from onnxprec.segments import observe, run_batch, update_ranges

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "ReferenceResult",
    "Selector",
    "TensorStats",
    "chunk_values",
    "estimated_sizes",
    "float_tensors",
    "run_reference",
]

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_BYTES = 768 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 192 * 1024 * 1024

Selector = Callable[[ir.Value], bool]
Feeds = Mapping[str, np.ndarray]


@dataclass
class ReferenceResult:
    """What every reference run leaves behind besides its observers: the first batch and its outputs.

    ``stats`` holds the range statistics when the run was given a :class:`RangeObserver` (AutoCast).
    """

    first_feeds: dict[str, np.ndarray]
    first_outputs: dict[str, np.ndarray]
    num_batches: int = 1
    chunks: int = 1
    stats: dict[str, TensorStats] | None = None
    segments: int = 1
    """Sessions the graph was cut into (1: the whole graph at once)."""
    session_seconds: float = 0.0  # spent making the sessions of a segmented run (0 for a whole one)


def float_tensors(value: ir.Value) -> bool:
    """The default selector: every node output of float (or not yet known) element type; tensors only (a
    sequence or optional of floats is not measured)."""
    if value.type is not None and not isinstance(value.type, ir.TensorType):
        return False
    return value.dtype is None or value.dtype in FLOAT_TYPES


def _selected(model: ir.Model, select: Selector | Iterable[ir.Value]) -> list[ir.Value]:
    outputs = set(model.graph.outputs)
    if not callable(select):
        wanted = set(select)
        return [out for node in model.graph for out in node.outputs if out in wanted and out not in outputs]
    # An output nothing reads (an optional output such as a fused norm's mean) decides nothing, and some providers
    # never compute it: ORT's CUDA SkipSimplifiedLayerNormalization leaves it missing, and observing it failed the run.
    return [
        out
        for node in model.graph
        for out in node.outputs
        if out.name and out not in outputs and len(out.uses()) > 0 and select(out)
    ]


# --------------------------------------------------------------------------------------------------
# Chunking under a memory budget


def _concrete_sizes(proto: onnx.ModelProto, feeds: Feeds) -> dict[str, int]:
    """Byte sizes of intermediate tensors from ONNX shape inference with the inputs' concrete shapes."""
    for inp in proto.graph.input:
        array = feeds.get(inp.name)
        if array is None or not inp.type.HasField("tensor_type"):
            continue
        shape = inp.type.tensor_type.shape
        shape.ClearField("dim")
        for size in np.asarray(array).shape:
            shape.dim.add().dim_value = int(size)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:  # inference is only an estimate here; fall back to the heuristic
        logger.debug("Concrete shape inference failed: %s", e)
        return {}
    sizes = {}
    for info in inferred.graph.value_info:
        tensor_type = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
        if tensor_type.HasField("shape") and all(d >= 0 for d in dims) and tensor_type.elem_type:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).itemsize
            sizes[info.name] = math.prod(dims) * itemsize
    return sizes


def estimated_sizes(model: ir.Model, feeds: Feeds) -> dict[str, int]:
    """Byte size of every main-graph tensor: concrete shape inference, else the largest activation input.

    Shapes that inference cannot make concrete (e.g. after a Pad whose pads are computed) are estimated
    as the largest non-constant input of their producer: right within a small factor for the elementwise,
    convolution and matmul chains that make up real models, which is all the chunking needs.
    """
    sizes = _concrete_sizes(structure_proto(model), feeds)
    for name, array in feeds.items():
        sizes[name] = int(np.asarray(array).nbytes)
    default = max(sizes.values(), default=4)
    for node in model.graph:
        inputs = [sizes.get(str(v.name), 0) for v in node.inputs if v is not None and not v.is_initializer()]
        estimate = max(inputs, default=0) or default
        for out in node.outputs:
            sizes.setdefault(str(out.name), estimate)
    return sizes


def chunk_values(values: list[ir.Value], sizes: dict[str, int], budget: int) -> list[list[ir.Value]]:
    chunks: list[list[ir.Value]] = [[]]
    used = 0
    for value in values:
        size = sizes.get(str(value.name), 0)
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(value)
        used += size
    return chunks


# --------------------------------------------------------------------------------------------------
# The run


def run_reference(
    model: ir.Model,
    batches: Iterable[Feeds],
    *,
    select: Selector | Iterable[ir.Value] = float_tensors,
    observers: Sequence[Observer] = (),
    providers: Sequence[str] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    observe_inputs: bool = True,
    segment_bytes: int | None = None,
    what: str | None = None,
    on_done: Callable[[list[str]], None] | None = None,
) -> ReferenceResult:
    """Runs ``model`` on every batch; each selected tensor of each batch goes to every observer.

    Args:
        model: The model (unchanged; its memory-mapped weights are given to ONNX Runtime by reference).
        batches: Feed dicts: a list, a re-iterable source, or a one-shot iterator (spooled to disk when
            more than one chunk needs it).
        select: Which node outputs to observe: a predicate over values (default: float tensors) or values.
        observers: Objects with ``update(name, array)``; a :class:`RangeObserver` also fills ``stats``.
        providers: ModelOpt-style provider names (``cpu``, ``cuda:0``, ...).
        budget_bytes: Upper bound on the estimated bytes of the tensors fetched in one run.
        observe_inputs: Also hand the graph inputs of every batch to the observers.
        segment_bytes: Weights per session when the model is run in segments (see the module docstring); None:
            ``DEFAULT_SEGMENT_BYTES`` on the CPU (:func:`onnxprec._ort.session_weight_bytes`).
        what: How errors name the model (default: the model for the reference run, with advice on how to skip
            that run).
        on_done: Called with the names of observed tensors as soon as every batch of them has been handed to the
            observers (after each piece of a segmented run, after each chunk of a whole one), so that a caller can
            use and free their statistics before the run goes on.

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the model.
        CalibrationDataError: ONNX Runtime fails on the given inputs.
    """
    if segment_bytes is None:
        segment_bytes = _ort.session_weight_bytes(providers, DEFAULT_SEGMENT_BYTES)
    data = CalibrationData.of(batches)
    marked = _selected(model, select)
    # Ranges need no tensor out of the runtime: it reduces each FP32 tensor to min/max/sum/shape itself. Only the
    # tensors another observer wants are fetched.
    in_graph = _reduced_in_graph(marked, observers)
    ranges = next((o for o in observers if isinstance(o, RangeObserver)), None)
    sentinels = ranges.sentinels if ranges else {}
    reduced = set(in_graph)
    fetched = [v for v in marked if v not in reduced]
    chunks = chunk_values(fetched, estimated_sizes(model, data.first), budget_bytes) if fetched else [[]]
    values = {str(v.name): v for v in model.graph.inputs}
    values.update({str(out.name): out for node in model.graph for out in node.outputs})
    run = _Run(data, observers, providers, observe_inputs, what, len(model.graph.outputs), on_done)
    with contextlib.ExitStack() as stack:
        if data is not batches:
            stack.callback(data.close)
        payload, folder, reductions, added = stack.enter_context(_ort_model_with_reductions(model, in_graph, sentinels))
        path = payload if isinstance(payload, str) else None
        base = _ort.model_proto(payload)
        data_folder = folder if folder is not None or path is None else Path(path).parent
        info_of = lambda name: _value_info(values, name)  # noqa: E731
        result = run.segmented(base, segment_bytes, data_folder, marked, in_graph, reductions, added, info_of)
        if result is None:
            result = run.whole(base, path, folder, chunks, reductions, added)
    result.stats = ranges.stats if ranges else None
    _log_run(result, len(marked), segment_bytes)
    return result


def _log_run(result: ReferenceResult, marked: int, segment_bytes: int) -> None:
    logger.log(
        logging.INFO if marked else logging.DEBUG,  # a plain run of a model (e.g. a numeric check) is no step
        "Reference run: %d tensors over %d batch(es) in %s", marked, result.num_batches,
        f"{result.segments} segments of <= {segment_bytes / (1 << 20):.4g} MiB of weights (sessions made in "
        f"{result.session_seconds:.1f} s)" if result.segments > 1 else f"{result.chunks} chunk(s)",
    )  # fmt: skip


def run_message(
    message: onnx.ModelProto,
    folder: Path | None,
    batches: Iterable[Feeds],
    *,
    providers: Sequence[str] | None = None,
    segment_bytes: int | None = None,
    what: str | None = None,
) -> ReferenceResult:
    """Runs a model given as a message (its weights references to files in ``folder``) on every batch and keeps the
    first batch's graph outputs, as :func:`run_reference` with nothing selected (segment by segment when its weights
    are large), without a round trip through onnx-ir. ``message`` is unchanged.

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the model.
        CalibrationDataError: ONNX Runtime fails on the given inputs.
    """
    data = CalibrationData.of(batches)
    if segment_bytes is None:
        segment_bytes = _ort.session_weight_bytes(providers, DEFAULT_SEGMENT_BYTES)
    base = onnx.ModelProto()
    base.CopyFrom(message)
    graph = base.graph
    infos = {i.name: i for i in (*graph.input, *graph.value_info, *graph.output)}
    run = _Run(data, (), providers, False, what, len(graph.output))
    with contextlib.ExitStack() as stack:
        if data is not batches:
            stack.callback(data.close)
        result = run.segmented(base, segment_bytes, folder, [], [], {}, frozenset(), infos.get)
        if result is None:
            result = run.whole(base, None, folder, [[]], {}, frozenset())
    _log_run(result, 0, segment_bytes)
    return result


@dataclass
class _Run:
    """One run's settings, shared by its segmented and whole-graph forms (``n_outputs``: the model's own graph
    outputs, first in every message it runs)."""

    data: CalibrationData
    observers: Sequence[Observer]
    providers: Sequence[str] | None
    observe_inputs: bool
    what: str | None
    n_outputs: int
    on_done: Callable[[list[str]], None] | None = None

    def segmented(
        self,
        base: onnx.ModelProto,
        segment_bytes: int,
        folder: Path | None,
        marked: list[ir.Value],
        in_graph: Sequence[ir.Value],
        reductions: Mapping[str, tuple[str, ...]],
        added: Collection[str],
        info_of: Callable[[str], onnx.ValueInfoProto | None],
    ) -> ReferenceResult | None:
        """The run segment by segment (see the module docstring), or None when the model runs whole (``added``:
        the outputs of every node of the range reductions, :func:`_ort_model_with_reductions`)."""
        if segments.cut_segments(base, segment_bytes, added) is None:
            return None
        info_of = gather_columns(base, {str(v.name) for v in marked}, info_of)  # no whole transposed table in a piece
        pieces = segments.cut_segments(base, segment_bytes, added) or []
        done = segments.run_segmented(
            base, pieces, folder, info_of, marked, self.data, self.observers, self.providers, self.observe_inputs,
            in_graph, reductions, self.n_outputs, self.what, self.on_done,
        )  # fmt: skip
        if done is None:
            return None
        first_outputs, count, seconds = done
        return ReferenceResult(self.data.first, first_outputs, count, 1, None, len(pieces), seconds)

    def whole(
        self,
        base: onnx.ModelProto,
        path: str | None,
        folder: Path | None,
        chunks: list[list[ir.Value]],
        reductions: Mapping[str, tuple[str, ...]],
        added: Collection[str],
    ) -> ReferenceResult:
        """The run of the whole graph, once per chunk of fetched tensors (the reductions, whose nodes' outputs are
        ``added``, with the first)."""
        observers = self.observers
        graph_outputs = [o.name for o in base.graph.output[: self.n_outputs]]
        first_outputs: dict[str, np.ndarray] = {}
        count = 0
        desc = "Reference run" if len(chunks) == 1 else f"Reference run ({len(chunks)} chunks of tensors)"
        known = self.data.batches * len(chunks) or None  # the batches of an earlier pass over the data, if any
        with Progress(desc, "batch", known) as progress:
            for chunk_index, chunk in enumerate(chunks):
                names = [str(v.name) for v in chunk]
                if chunk_index == 1 and reductions:  # the reductions ran with the first chunk
                    base, reductions = _without(base, added, self.n_outputs), {}
                n_outputs = len(base.graph.output)
                session = _chunk_session(base, path, folder, chunk, self.providers, self.what)
                del base.graph.output[n_outputs:]
                fetch = graph_outputs + names if chunk_index == 0 else names
                fetch += [out for outs in reductions.values() for out in outs]
                count = 0
                for i, batch in enumerate(self.data):
                    if chunk_index == 0 and self.observe_inputs:
                        for name, array in batch.items():
                            observe(observers, name, array)
                    results = run_batch(session, batch, fetch, i)
                    by_name = dict(zip(fetch, results))
                    del results
                    update_ranges(observers, reductions, by_name)
                    for name, array in by_name.items():
                        if chunk_index == 0 and i == 0 and name in graph_outputs:
                            # A copy: ORT's arrays can pin the session's buffers and weight mappings.
                            first_outputs[name] = copy_value(array)
                        observe(observers, name, array)
                    del by_name
                    count += 1
                    progress.update()
                del session
                if progress.total is None:
                    progress.set_total(count * len(chunks))
                if self.on_done is not None:
                    inputs = [i.name for i in base.graph.input] if chunk_index == 0 and self.observe_inputs else []
                    self.on_done(inputs + (graph_outputs if chunk_index == 0 else []) + names)
        return ReferenceResult(self.data.first, first_outputs, count, len(chunks))


def _value_info(values: Mapping[str, ir.Value], name: str) -> onnx.ValueInfoProto | None:
    value = values.get(name)
    if value is None or value.type is None:
        return None
    return ir.serde.serialize_value(value)


def _reduced_in_graph(marked: list[ir.Value], observers: Sequence[Observer]) -> list[ir.Value]:
    """The FP32 tensors that only range observers want: they are reduced inside the runtime, never fetched."""
    if not any(isinstance(o, RangeObserver) for o in observers):
        return []
    others = [o for o in observers if not isinstance(o, RangeObserver)]

    def fetched(name: str) -> bool:
        return any(getattr(o, "wants", lambda _: True)(name) for o in others)

    return [v for v in marked if v.dtype == ir.DataType.FLOAT and not fetched(str(v.name))]


@contextlib.contextmanager
def _ort_model_with_reductions(
    model: ir.Model, values: Sequence[ir.Value], sentinels: Mapping[str, float] | None
) -> Iterator[tuple[bytes | str, Path | None, dict[str, tuple[str, ...]], frozenset[str]]]:
    """:func:`onnxprec._ort.ort_model` of ``model`` with the range reductions of ``values``, the names of their
    graph outputs (tensor -> outputs), and the outputs of every node they add (the sentinel ones' Constant, Where...
    included, which :func:`onnxprec.segments.cut_segments` and :func:`_without` must treat as the reductions they feed).
    :class:`AddRangeReductionsPass` changes the model only while it is serialized: the model is as before when this
    yields (a clone or a round trip through onnx-ir would cost a deserialization of the whole graph)."""
    if not values:
        with _ort.ort_model(model) as (payload, folder):
            yield payload, folder, {}, frozenset()
        return
    result = AddRangeReductionsPass([str(v.name) for v in values], sentinels)(model)
    assert isinstance(result, RangeReductionsResult)
    with contextlib.ExitStack() as stack:
        try:
            payload, folder = stack.enter_context(_ort.ort_model(model))
        finally:
            remove_range_reductions(result)
        yield (
            payload,
            folder,
            result.reductions,
            frozenset(str(out.name) for node in result.nodes for out in node.outputs),
        )


def _without(base: onnx.ModelProto, riding: Collection[str], n_outputs: int) -> onnx.ModelProto:
    """A copy of ``base`` without its range reductions (the nodes whose first output is in ``riding``: every output
    of the nodes they added) and without graph outputs past the first ``n_outputs``."""
    plain = onnx.ModelProto()
    plain.CopyFrom(base)
    del plain.graph.node[:], plain.graph.output[n_outputs:]
    plain.graph.node.extend(n for n in base.graph.node if not (n.output and n.output[0] in riding))
    return plain


def _chunk_session(
    base: onnx.ModelProto,
    path: str | None,
    folder: Path | None,
    chunk: list[ir.Value],
    providers: Sequence[str] | None,
    what: str | None = None,
) -> _ort.Session:
    base.graph.output.extend(ir.serde.serialize_value(v) for v in chunk)
    if path is None:
        source: bytes | str = base.SerializeToString()
    else:  # a temporary model whose weights are in its external data file: rewrite only the small .onnx
        onnx.save(base, path)
        source = path
    try:
        return _ort.create_session(
            source,
            providers=providers,
            optimization="none",  # exact semantics, and session creation takes half the time
            low_memory=True,
            spinning=False,  # batches of calibration data: CPU seconds, not latency
            external_data_folder=folder,
            what=what or "the model for the reference run",
        )
    except UnsupportedModelError as e:
        if what is not None:
            raise
        if "NOT_IMPLEMENTED" in str(e) or "No Op registered" in str(e) or "is not a registered function" in str(e):
            advice = "skip the reference run with --data_max inf, or use a provider that supports its ops"
        else:  # ONNX Runtime's graph checks: the model itself is broken
            advice = (
                "the model is not valid: fix it (onnx.checker.check_model(model, full_check=True) names the problem)"
            )
        raise UnsupportedModelError(f"{e}; {advice}.") from e
