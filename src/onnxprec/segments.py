"""Segment-by-segment runs: a model whose weights are too large for one session, cut into pieces run one at a time.

The nodes, in graph order, are cut into pieces of at most ``segment_bytes`` of weights (:func:`cut_segments`); each
piece is a session of its own (with the range reductions of the tensors it produces), run over every batch and
released before the next is created, and only the activations that later pieces read are carried over (per batch,
in memory up to ``CARRY_MEMORY_BYTES`` in all, in temporary files beyond). A piece computes the constants it reads
itself, and declares the tensors that cross pieces by element type alone.

Also the batch helpers the whole-graph run of :mod:`onnxprec.reference` shares: one batch through a session
(:func:`run_batch`), a tensor handed to the observers (:func:`observe`), reduced ranges handed to the range
observers (:func:`update_ranges`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort
from onnxprec._pieces import is_matmulnbits
from onnxprec._progress import Progress
from onnxprec._report import timed
from onnxprec.calibration_data import BatchStore, copy_value
from onnxprec.errors import CalibrationDataError
from onnxprec.observers import Observer, RangeObserver

__all__ = ["CARRY_MEMORY_BYTES", "cut_segments", "observe", "run_batch", "run_segmented", "update_ranges"]

CARRY_MEMORY_BYTES = 256 * 1024 * 1024
"""Activations a segmented run carries between pieces in memory (all batches); more go to temporary files."""

# Ops whose outputs are not a function of their inputs alone.
_NOT_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"})


def _weight_bytes(proto: onnx.ModelProto) -> dict[str, int]:
    """Bytes of every initializer (external ones from their ``length``), read from the message only."""
    sizes = {}
    for t in proto.graph.initializer:
        length = next((int(e.value) for e in t.external_data if e.key == "length"), None)
        if length is None:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 4
            length = len(t.raw_data) or math.prod(t.dims) * itemsize
        sizes[t.name] = length
    return sizes


def cut_segments(proto: onnx.ModelProto, segment_bytes: int, riding: Collection[str] = ()) -> list[list[int]] | None:
    """Node indices cut, in graph order, into pieces of at most ``segment_bytes`` of weights (a node whose own
    weights exceed it is a piece alone); None when the model is small enough to run at once or has subgraphs.
    Nodes whose first output is in ``riding`` (range reductions, which follow their tensor's producer) never start
    a piece: they stay in the piece of the node before them."""
    sizes = _weight_bytes(proto)
    if sum(sizes.values()) <= segment_bytes:
        return None
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in proto.graph.node for a in n.attribute
    ):
        return None  # outer-scope values read inside subgraphs would have to cross pieces: run whole
    segments: list[list[int]] = []
    current: list[int] = []
    held: set[str] = set()
    used = 0
    for index, node in enumerate(proto.graph.node):
        if current and node.output and node.output[0] in riding:
            current.append(index)
            continue
        new = [name for name in dict.fromkeys(node.input) if name in sizes and name not in held]
        need = sum(sizes[name] for name in new)
        if current and used + need > segment_bytes:
            segments.append(current)
            current, held, used = [], set(), 0
            new = [name for name in dict.fromkeys(node.input) if name in sizes]
            need = sum(sizes[name] for name in new)
        current.append(index)
        held.update(new)
        used += need
    if current:
        segments.append(current)
    return segments if len(segments) > 1 else None


@dataclass
class _Piece:
    """One piece of a segmented run: its index among the segments, its serialized model, the tensors it reads from
    the batch or earlier pieces, the tensors it outputs, and the reductions (tensor -> outputs) it computes."""

    index: int
    payload: bytes
    inputs: list[str]
    outputs: list[str]
    here: dict[str, tuple[str, ...]]


@dataclass
class _Plan:
    """The pieces of a segmented run and what the run needs to route tensors between them."""

    pieces: list[_Piece]
    packed: set[int]  # segments with MatMulNBits: pre-packed (unpacked, it dequantizes all its weight to float32)
    last_use: dict[str, int]  # the last piece that reads a tensor (a graph output too: carried while read)
    fetch: set[str]  # the marked tensors fetched to the observers
    graph_outputs: list[str]


def _last_use(
    nodes: Sequence[onnx.NodeProto], segments: list[list[int]], constant: Mapping[str, int]
) -> dict[str, int]:
    """The last piece that reads each tensor (a piece computes the constants it reads itself)."""
    piece_of = {index: s for s, piece in enumerate(segments) for index in piece}
    last_use: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            if name and name not in constant:
                last_use[name] = max(last_use.get(name, -1), piece_of[index])
    return last_use


def _plan(
    base: onnx.ModelProto,
    segments: list[list[int]],
    info_of: Callable[[str], onnx.ValueInfoProto | None],
    fetch: set[str],
    reductions: Mapping[str, tuple[str, ...]],
    n_outputs: int | None,
) -> _Plan | None:
    """The pieces of ``base`` (see :func:`run_segmented`), or None when a crossing tensor has no type."""
    nodes = list(base.graph.node)
    initializers = {t.name: t for t in base.graph.initializer}
    graph_outputs = [o.name for o in base.graph.output[:n_outputs]]
    model_io = {i.name for i in base.graph.input} | set(graph_outputs)
    reduction_infos = {o.name: o for o in base.graph.output[len(graph_outputs) :]}
    constant = _constant_producers(nodes, set(initializers))
    last_use = _last_use(nodes, segments, constant)
    pieces = []
    for s, piece in enumerate(segments):
        own = [out for i in piece for out in nodes[i].output if out]
        piece_nodes = [nodes[i] for i in sorted(_constants_read(piece, nodes, constant) - set(piece))]
        piece_nodes += [nodes[i] for i in piece]
        produced = {out for node in piece_nodes for out in node.output if out}
        read = [name for node in piece_nodes for name in dict.fromkeys(node.input) if name]
        inputs = [name for name in dict.fromkeys(read) if name not in produced and name not in initializers]
        outputs = [name for name in own if name in fetch or name in graph_outputs or last_use.get(name, -1) > s]
        maybe = [info_of(name) for name in inputs + outputs]
        infos = [info if info is None or info.name in model_io else _type_only(info) for info in maybe]
        if any(info is None for info in infos):
            return None  # a crossing tensor of unknown type cannot be a piece's input or output: run whole
        proto = onnx.helper.make_model(
            onnx.helper.make_graph(
                piece_nodes,
                f"{base.graph.name}_segment{s}",
                [info for info in infos[: len(inputs)] if info is not None],
                [info for info in infos[len(inputs) :] if info is not None],
                initializer=[initializers[name] for name in dict.fromkeys(read) if name in initializers],
            ),
            opset_imports=list(base.opset_import),
            ir_version=base.ir_version,
        )
        proto.functions.extend(base.functions)
        here = {name: outs for name, outs in reductions.items() if name in own}
        proto.graph.output.extend(reduction_infos[out] for outs in here.values() for out in outs)
        if outputs or here:  # a piece nothing later reads (only constants, or an unread branch) is not run
            pieces.append(_Piece(s, proto.SerializeToString(), inputs, outputs, here))
        del proto
    packed = {s for s, piece in enumerate(segments) if any(is_matmulnbits(nodes[i]) for i in piece)}
    return _Plan(pieces, packed, last_use, fetch, graph_outputs)


def run_segmented(
    base: onnx.ModelProto,
    segments: list[list[int]],
    folder: Path | None,
    info_of: Callable[[str], onnx.ValueInfoProto | None],
    marked: list[ir.Value],
    replay: Iterable[dict[str, np.ndarray]],
    observers: Sequence[Observer],
    providers: Sequence[str] | None,
    observe_inputs: bool,
    in_graph: Sequence[ir.Value] = (),
    reductions: Mapping[str, tuple[str, ...]] | None = None,
    n_outputs: int | None = None,
    what: str | None = None,
    on_done: Callable[[list[str]], None] | None = None,
) -> tuple[dict[str, np.ndarray], int, float] | None:
    """Runs the graph piece by piece over every batch (see the module docstring); returns the first batch's graph
    outputs, the batches and the seconds making sessions, or None (nothing run) when a crossing tensor has no type.

    ``base`` holds the range reductions of ``in_graph`` (``reductions``: tensor -> outputs), its first ``n_outputs``
    graph outputs are the model's own (default: all); each piece computes the reductions of the tensors it produces.
    """
    reduced = {str(v.name) for v in in_graph}  # reduced to min/max/sum/shape inside the piece, never fetched
    plan = _plan(base, segments, info_of, {str(v.name) for v in marked} - reduced, reductions or {}, n_outputs)
    if plan is None:
        return None
    inputs_of_first = [i.name for i in base.graph.input] if observe_inputs else []
    carried = BatchStore(CARRY_MEMORY_BYTES)
    first_outputs: dict[str, np.ndarray] = {}
    count, making = 0, 0.0
    with contextlib.closing(carried), Progress("Reference run (segments)", "segment", len(plan.pieces)) as bar:
        for number, piece in enumerate(plan.pieces):
            with timed() as making_one:
                session = _ort.create_session(
                    piece.payload,
                    providers=providers,
                    optimization="none",
                    low_memory=True,
                    prepacking=piece.index in plan.packed,
                    spinning=False,
                    external_data_folder=folder,
                    what=f"segment {piece.index + 1}/{len(segments)} of {what or 'the model for the reference run'}",
                )
            making += making_one.seconds
            count = _run_piece(
                session, piece, plan, replay, carried, first_outputs, observers, number == 0 and observe_inputs
            )
            del session
            bar.update()
            if on_done is not None:
                inputs_done = inputs_of_first if number == 0 else []
                on_done(
                    inputs_done + [name for name in piece.outputs if name in plan.fetch or name in plan.graph_outputs]
                )
    return first_outputs, count, making


def _run_piece(
    session: _ort.Session,
    piece: _Piece,
    plan: _Plan,
    replay: Iterable[dict[str, np.ndarray]],
    carried: BatchStore,
    first_outputs: dict[str, np.ndarray],
    observers: Sequence[Observer],
    observe_inputs: bool,
) -> int:
    """Runs one piece over every batch: observes what it fetches, keeps the first batch's graph outputs, carries what
    later pieces read and drops what no later piece reads; returns the batches."""
    s, outputs, fetch, graph_outputs = piece.index, piece.outputs, plan.fetch, plan.graph_outputs
    count = 0
    for i, batch in enumerate(replay):
        if observe_inputs:
            for name, array in batch.items():
                observe(observers, name, array)
        feeds = {name: batch[name] if name in batch else carried.get(i, name) for name in piece.inputs}
        names = outputs + [out for outs in piece.here.values() for out in outs]
        results = run_batch(session, feeds, names, i)
        by_name = dict(zip(names, results))
        update_ranges(observers, piece.here, by_name)
        for name, array in zip(outputs, results):
            if name in fetch or name in graph_outputs:  # as the whole-graph run: outputs are observed too
                observe(observers, name, array)
            if i == 0 and name in graph_outputs:
                first_outputs[name] = copy_value(array)
            if plan.last_use.get(name, -1) > s:
                carried.put(i, name, array)
        del results, feeds
        for name in [n for n in carried.names(i) if plan.last_use.get(n, -1) <= s]:
            carried.drop(i, name)
        count += 1
    return count


def _constant_producers(nodes: Sequence[onnx.NodeProto], initializers: Collection[str]) -> dict[str, int]:
    """The outputs of the nodes computed from constants alone (Constant nodes, and nodes whose every input is an
    initializer or such an output), each with its node's index. A piece computes those it reads itself: the tensor
    never crosses pieces, and the value info an exporter wrote for it is never trusted (onnxruntime-genai's builder
    declares its shape constants as scalars)."""
    constant: dict[str, int] = {}
    for index, node in enumerate(nodes):
        if node.op_type in _NOT_CONSTANT or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            continue
        if all(not name or name in initializers or name in constant for name in node.input):
            constant.update((out, index) for out in node.output if out)
    return constant


def _constants_read(piece: Sequence[int], nodes: Sequence[onnx.NodeProto], constant: Mapping[str, int]) -> set[int]:
    """Indices of the constant nodes (:func:`_constant_producers`) that ``piece``'s nodes read, directly or through
    other constant nodes."""
    found: set[int] = set()
    stack = [name for index in piece for name in nodes[index].input if name in constant]
    while stack:
        index = constant[stack.pop()]
        if index not in found:
            found.add(index)
            stack.extend(name for name in nodes[index].input if name in constant)
    return found


def _type_only(info: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """``info`` without its tensor shape: a tensor crossing pieces is declared by its element type alone, so that a
    wrong shape in the exporter's value info cannot fail the piece that reads it (ONNX Runtime takes the shape from
    the array it is fed)."""
    if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return info
    plain = onnx.ValueInfoProto()
    plain.CopyFrom(info)
    plain.type.tensor_type.ClearField("shape")
    return plain


def run_batch(session: _ort.Session, feeds: Mapping[str, np.ndarray], fetch: list[str], index: int) -> list[Any]:
    """``session.run``; a runtime failure on calibration batch ``index`` becomes a one-line CalibrationDataError."""
    try:
        return session.run(feeds, fetch)
    except Exception as e:
        raise CalibrationDataError(
            f"ONNX Runtime failed to run the model on calibration batch {index} ({_ort.first_line(e)}); "
            "check the input shapes or pass real inputs with --calibration_data."
        ) from e


def update_ranges(
    observers: Sequence[Observer], reductions: Mapping[str, tuple[str, ...]], by_name: dict[str, Any]
) -> None:
    """Hands each reduced tensor's min/max/sum/shape (popped from ``by_name``) to the range observers."""
    for name, (lo, hi, total, shape, *past) in reductions.items():
        minimum = by_name.pop(lo)
        args = (float(minimum), float(by_name.pop(hi)), float(by_name.pop(total)))
        dims = tuple(by_name.pop(shape).tolist())
        unmasked = float(by_name.pop(past[0])) if past else None
        for observer in observers:
            if isinstance(observer, RangeObserver):
                observer.update_range(name, *args, dims, minimum.dtype, unmasked)


def observe(observers: Sequence[Observer], name: str, array: np.ndarray) -> None:
    if not isinstance(array, np.ndarray):
        return  # a sequence or an optional (graph input or output): observers take tensors
    for observer in observers:
        observer.update(name, array)
