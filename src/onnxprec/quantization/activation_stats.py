"""Activation statistics of the quantized layers' inputs, streamed from reference runs in bounded memory.

Each input group's statistics (mean ``|x|`` per channel, a reservoir of tokens, ``XᵀX``) are accumulated by
observers while ONNX Runtime runs the calibration batches (:func:`onnxprec.reference.run_reference`); no
activation is kept after its batch. Groups whose statistics do not fit in the memory budget together are split
into chunks in graph order, one pass over the data per chunk. Each pass runs a copy of the model cut after the
chunk's last input (for an LLM the first pass never computes the later layers nor the logits).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from onnxprec._array import NUMPY, ArrayBackend
from onnxprec._report import add_seconds, timed
from onnxprec.observers import ChannelAbsMeanObserver, GramObserver, Observer, TokenSampleObserver
from onnxprec.passes import InferTypesPass
from onnxprec.quantization.algorithms.gptq import FACTOR_MATRICES
from onnxprec.quantization.methods import GroupStats, MethodSpec
from onnxprec.quantization.select import InputGroup
from onnxprec.reference import DEFAULT_SEGMENT_BYTES, run_reference

__all__ = [
    "Float32GramObserver",
    "collect_stats",
    "device_gram",
    "plan_chunks",
    "pruned_copy",
    "quiet_onnx_ir",
    "stats_bytes",
    "streams",
]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_onnx_ir() -> Iterator[None]:
    """Silences onnx-ir's INFO logs ("Removed 19 unused nodes") of passes run on the user's behalf."""
    quiet = logging.getLogger("onnx_ir.passes")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        yield
    finally:
        quiet.setLevel(level)


class Float32GramObserver(GramObserver):
    """:class:`~onnxprec.observers.GramObserver` with each batch's ``XᵀX`` computed in float32 and summed in
    float64: twice as fast (a float32 symmetric rank-k update), with per-batch sums exact to about 1e-7; the batch's
    float32 term is widened as it is added, so a ``[K, K]`` Gram costs its float64 sum and one float32 term.

    On a device ``backend`` the batch's token rows go there (``[T, K]`` float32) and the Gram is made and kept there,
    ready for GPTQ on the same device: no ``[K, K]`` matrix in host memory. A Gram whose GPTQ would not fit the
    backend's memory (:func:`device_gram`) is made on the host as on numpy."""

    def __init__(self, names: Collection[str] | None = None, backend: ArrayBackend = NUMPY) -> None:
        super().__init__(names)
        self.backend = backend

    def term(self, rows: np.ndarray) -> Any:
        if device_gram(self.backend, rows.shape[1]):
            rows = self.backend.from_host(rows)
        return rows.T @ rows


class _TimedObservers:
    """Hands each tensor to ``observers`` (those that want it) and counts the wall seconds they take in ``seconds``."""

    def __init__(self, observers: list[Observer]) -> None:
        self.observers = observers
        self.seconds = 0.0

    def wants(self, name: str) -> bool:
        return any(getattr(o, "wants", lambda _: True)(name) for o in self.observers)

    def update(self, name: str, array: np.ndarray) -> None:
        with timed() as observing:
            for observer in self.observers:
                observer.update(name, array)
        self.seconds += observing.seconds


def device_gram(backend: ArrayBackend, k: int) -> bool:
    """Whether a ``[k, k]`` Gram is made and kept on ``backend``: a device one that can hold it beside GPTQ's
    factorisation of it (:data:`~onnxprec.quantization.algorithms.gptq.FACTOR_MATRICES` ``[k, k]`` float64
    matrices); never on numpy."""
    return not backend.on_host and backend.fits((FACTOR_MATRICES + 1) * 8 * k * k)


SAMPLE_DTYPE = np.float16
"""Storage of the token samples (AWQ's scale and clip searches score on them in float32, one group at a time): half
the bytes of float32, so a billion-parameter model's samples need half the passes over the data."""


def stats_bytes(group: InputGroup, spec: MethodSpec, sample_tokens: int) -> int:
    """Bytes the statistics of ``group`` take (float64 Gram, :data:`SAMPLE_DTYPE` token sample, float64 channel
    sums)."""
    k = group.k
    total = 16 * k
    if spec.needs_sample:
        total += np.dtype(SAMPLE_DTYPE).itemsize * sample_tokens * k
    if spec.needs_gram:
        total += 8 * k * k
    return total


def plan_chunks(groups: list[InputGroup], spec: MethodSpec, sample_tokens: int, budget: int) -> list[list[InputGroup]]:
    """Groups in graph order, split into chunks whose statistics fit ``budget`` bytes (at least one group each)."""
    chunks: list[list[InputGroup]] = []
    used = 0
    for group in groups:
        size = stats_bytes(group, spec, sample_tokens)
        if not chunks or (chunks[-1] and used + size > budget):
            chunks.append([])
            used = 0
        chunks[-1].append(group)
        used += size
    return chunks


def pruned_copy(model: ir.Model, outputs: list[str]) -> ir.Model:
    """A copy of ``model`` whose outputs are ``outputs`` and that has only the nodes they need.

    Memory-mapped weights stay references to their files (only the graph structure is copied).
    """
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(model))
    base_dirs = {
        str(v.const_value.base_dir)
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    if len(base_dirs) == 1:
        ir.external_data.set_base_dir(copy.graph, base_dirs.pop())
    elif base_dirs:  # weights in several folders (e.g. stand-ins beside the model's own): each keeps its folder
        for name, value in copy.graph.initializers.items():
            tensor, source = value.const_value, model.graph.initializers.get(name)
            if isinstance(tensor, ir.ExternalTensor) and source is not None:
                assert isinstance(source.const_value, ir.ExternalTensor)
                tensor.base_dir = source.const_value.base_dir
    produced = {str(out.name): out for node in copy.graph for out in node.outputs}
    wanted = [produced[name] for name in outputs if name in produced]
    if wanted:
        copy.graph.outputs.clear()
        copy.graph.outputs.extend(wanted)
        with quiet_onnx_ir():
            RemoveUnusedNodesPass()(copy)
    return copy


def _sinks(model: ir.Model, names: list[str]) -> list[str]:
    """The node outputs among ``names`` that no other of ``names`` depends on, deepest first: the outputs of the
    smallest cut of the model that computes them all. One for a chain of layers; more where branches run side by
    side to the end (Phi's parallel attention and MLP: the last attention output feeds no later MLP input)."""
    producer = {str(out.name): node for node in model.graph for out in node.outputs}
    order = {str(out.name): i for i, node in enumerate(model.graph) for out in node.outputs}
    covered: set[str] = set()  # values some kept output depends on (or is)
    seen: set[int] = set()
    sinks = []
    for name in sorted((n for n in set(names) if n in producer), key=lambda n: -order[n]):
        if name in covered:
            continue
        sinks.append(name)
        stack = [name]
        while stack:
            value = stack.pop()
            covered.add(value)
            node = producer.get(value)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(str(v.name) for v in node.inputs if v is not None)
    return sinks


def _finish(
    name: str,
    absmean: ChannelAbsMeanObserver | None,
    sample: TokenSampleObserver | None,
    gram: Float32GramObserver | None,
) -> GroupStats:
    """The statistics of the input ``name`` from the observers a pass has, which then forget it."""
    result = GroupStats()
    if absmean is not None:
        result.absmean = absmean.mean(name)
        result.tokens = absmean.tokens[name]
        absmean.drop(name)
    if sample is not None:
        result.sample = sample.sample(name)
        result.tokens = sample.seen(name)
        sample.drop(name)
    if gram is not None:
        result.gram = gram.gram[name]
        result.tokens = gram.tokens[name]
        gram.drop(name)
    return result


def collect_stats(
    model: ir.Model,
    groups: list[InputGroup],
    batches: Iterable[Mapping[str, np.ndarray]],
    spec: MethodSpec,
    *,
    sample_tokens: int = 512,
    providers: Iterable[str] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    on_ready: Callable[[dict[InputGroup, GroupStats]], None] | None = None,
    backend: ArrayBackend = NUMPY,
    seconds: dict[str, float] | None = None,
) -> dict[InputGroup, GroupStats]:
    """One pass over ``batches``: the statistics ``spec`` needs of every group's input.

    The model is run up to the deepest of the inputs only: the inputs no other input depends on are fetched as
    the graph outputs, the others through the reference runner's memory-bounded chunks. A model with more than
    ``segment_bytes`` of weights runs in segments of at most that many (a session holds its weights in memory).

    ``on_ready``: called with the statistics of the groups whose inputs are complete as soon as they are (after each
    segment), which the observers then drop: one pass holds the statistics of one segment's groups at a time
    (:func:`streams`). Returns the statistics not handed to ``on_ready``.

    ``backend``: where the ``XᵀX`` are made and kept (:class:`Float32GramObserver`); the other statistics stay on the
    host. ``seconds``: the pass adds the wall seconds its observers took (``statistics``) and those making segment
    sessions took (``sessions``) to it.
    """
    names = [group.name for group in groups]
    sinks = _sinks(model, names)
    calibration_model = pruned_copy(model, sinks) if sinks else model
    if (
        calibration_model is not model
        and streams(calibration_model, segment_bytes)
        and any(out.dtype is None for node in calibration_model.graph for out in node.outputs)
    ):
        with quiet_onnx_ir():  # a tensor that crosses segments needs its type (an untyped model would run whole)
            InferTypesPass()(calibration_model)
    absmean = ChannelAbsMeanObserver(names) if spec.needs_absmean else None
    sample = TokenSampleObserver(sample_tokens, names, dtype=SAMPLE_DTYPE) if spec.needs_sample else None
    gram = Float32GramObserver(names, backend) if spec.needs_gram else None
    observers: list[Observer] = [o for o in (absmean, sample, gram) if o is not None]
    timed_observers = _TimedObservers(observers)
    wanted = set(names) - set(sinks)
    pending = {group.name: group for group in groups}

    def finish(group: InputGroup) -> GroupStats:
        return _finish(group.name, absmean, sample, gram)

    def done(names_done: list[str]) -> None:
        ready = [pending.pop(name) for name in dict.fromkeys(names_done) if name in pending]
        if on_ready is not None and ready:
            on_ready({group: finish(group) for group in ready})

    result = run_reference(
        calibration_model,
        batches,
        select=lambda value: str(value.name) in wanted,
        observers=[timed_observers],
        providers=list(providers) if providers is not None else None,
        segment_bytes=segment_bytes,
        on_done=done if on_ready is not None else None,
    )
    if seconds is not None:
        add_seconds(seconds, "statistics", timed_observers.seconds)
        add_seconds(seconds, "sessions", result.session_seconds)
    del calibration_model, result
    return {group: finish(group) for group in groups if group.name in pending}


def streams(model: ir.Model, segment_bytes: int) -> bool:
    """Whether a statistics pass over ``model`` runs segment by segment, handing each segment's statistics over as
    it ends (``collect_stats(on_ready=...)``): one pass then holds one segment's statistics, whatever the depth,
    where a whole-graph run holds those of every input it observes."""
    if any(
        attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for node in model.graph
        for attr in node.attributes.values()
    ):
        return False  # run whole (see onnxprec.reference)
    total = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    return total > segment_bytes
