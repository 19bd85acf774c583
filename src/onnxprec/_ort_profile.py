"""Kernel profiles: which kernels ONNX Runtime actually ran for a model, read from its profiler.

A quantized model is only as fast as the kernels ONNX Runtime picks for it after its graph optimizations: a QDQ
Conv is fast when ORT fuses it into ``QLinearConv``, a dynamic MatMul when it becomes ``DynamicQuantizeMatMul`` or
``MatMulIntegerToFloat``, and every QuantizeLinear/DequantizeLinear left running as a node of its own costs time.
:func:`profile_kernels` runs a model in a session of its own with ORT's profiler on (warm-up runs first, whose
events are dropped) and reads the profile's ``Node`` events: per executed op type and provider, the node count and
the kernel time per run. :func:`read_profile` does the reading, for a profile written elsewhere.

ORT names the kernel it ran, not the node the model had: fused nodes appear under the fused op type (the Conv of a
QDQ group as ``QLinearConv``), nodes its optimizer removed do not appear, and layout changes it inserted
(``Transpose`` into NHWC around a quantized Conv on the CPU) do. A provider that compiles subgraphs (TensorRT) shows
each compiled subgraph as one node: the precision it runs inside is not visible in the profile.

:func:`unfused_qdq` needs no run: it lets ONNX Runtime optimize a model as a session would (the QDQ fusions
included) and counts the Q/DQ nodes left in the optimized graph, by the node each stands beside.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec._ort import Optimization, create_session, first_line
from onnxprec.errors import UnsupportedModelError

__all__ = [
    "INTEGER_KERNELS",
    "QDQ_KERNELS",
    "KernelProfile",
    "KernelStats",
    "is_integer_kernel",
    "profile_kernels",
    "read_profile",
    "unfused_qdq",
]

logger = logging.getLogger(__name__)

# ONNX Runtime kernels that compute on integer (quantized) tensors: the QDQ fusions of its CPU and CUDA providers,
# the dynamic-quantization kernels and the low-bit weight MatMuls. Op types starting with one of
# _INTEGER_PREFIXES count too (QLinearSoftmax, QOrderedMatMul, MatMulNBitsMlp...).
INTEGER_KERNELS: frozenset[str] = frozenset({
    "ConvInteger",
    "DynamicQuantizeLSTM",
    "DynamicQuantizeMatMul",
    "MatMulBnb4",
    "MatMulFpQ4",
    "MatMulInteger",
    "MatMulInteger16",
    "MatMulIntegerToFloat",
    "MulInteger",
    "QAttention",
    "QEmbedLayerNormalization",
    "QGemm",
    "QMoE",
    "ReduceSumInteger",
})  # fmt: skip
_INTEGER_PREFIXES = ("QLinear", "QOrdered", "MatMulNBits")
# Quantize/dequantize steps that run as nodes of their own (not fused into an integer kernel).
QDQ_KERNELS: frozenset[str] = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def is_integer_kernel(op_type: str) -> bool:
    """Whether ONNX Runtime's kernel of this op type computes on integer (quantized) tensors."""
    return op_type in INTEGER_KERNELS or op_type.startswith(_INTEGER_PREFIXES)


@dataclass(frozen=True)
class KernelStats:
    """The nodes of one op type that ran on one provider, and their kernel time per run in microseconds."""

    op_type: str
    provider: str
    nodes: int
    microseconds: float

    @property
    def integer(self) -> bool:
        """Whether the kernel computes on integer tensors (:func:`is_integer_kernel`)."""
        return is_integer_kernel(self.op_type)

    @property
    def qdq(self) -> bool:
        """Whether these are quantize/dequantize nodes that run on their own (:data:`QDQ_KERNELS`)."""
        return self.op_type in QDQ_KERNELS


@dataclass
class KernelProfile:
    """What ONNX Runtime ran for a model: per op type and provider, nodes and kernel time per run (slowest first).

    A node is one kernel of the optimized graph (a node inside a Loop or If body counts once however often it ran).
    """

    runs: int
    kernels: list[KernelStats] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        """Kernel nodes that ran."""
        return sum(k.nodes for k in self.kernels)

    @property
    def microseconds(self) -> float:
        """Kernel time of all nodes per run (the sum of the node events; it excludes the time between them)."""
        return sum(k.microseconds for k in self.kernels)

    @property
    def integer_nodes(self) -> int:
        """Nodes that ran in integer kernels (QLinearConv, MatMulIntegerToFloat...)."""
        return sum(k.nodes for k in self.kernels if k.integer)

    @property
    def integer_share(self) -> float | None:
        """The integer kernels' share of the kernel time (None when no kernel time was recorded)."""
        return self._share(k for k in self.kernels if k.integer)

    @property
    def qdq_nodes(self) -> int:
        """QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear nodes that ran on their own (unfused)."""
        return sum(k.nodes for k in self.kernels if k.qdq)

    @property
    def qdq_share(self) -> float | None:
        """The unfused Q/DQ nodes' share of the kernel time (None when no kernel time was recorded)."""
        return self._share(k for k in self.kernels if k.qdq)

    def _share(self, kernels: Iterable[KernelStats]) -> float | None:
        total = self.microseconds
        return sum(k.microseconds for k in kernels) / total if total > 0 else None


def read_profile(events: Sequence[Mapping[str, Any]], warmup: int = 0) -> KernelProfile:
    """The kernel profile of ONNX Runtime profiler events (the JSON list ``end_profiling`` writes).

    Args:
        events: The profile's events; ``Node`` events named ``<node>_kernel_time`` (one per kernel run) are
            counted, ``Session`` events named ``model_run`` delimit the runs.
        warmup: Runs at the start whose node events are dropped (the first run pays one-time costs).
    """
    runs = sorted(
        (int(e["ts"]), int(e["ts"]) + int(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    kept = runs[warmup:]
    if runs and not kept:
        return KernelProfile(runs=0)
    start = kept[0][0] if kept else None  # None: no run events, every node event counts (as one run)
    nodes: dict[tuple[str, str], set[str]] = {}
    times: dict[tuple[str, str], float] = {}
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue  # older ORT builds also write <node>_fence_before/_after events
        if start is not None and int(event.get("ts", 0)) < start:
            continue  # a warm-up run's
        args = event.get("args") or {}
        op_type = str(args.get("op_name", "?"))
        key = (op_type, str(args.get("provider", "?")))
        nodes.setdefault(key, set()).add(name.removesuffix("_kernel_time"))
        times[key] = times.get(key, 0.0) + float(event.get("dur", 0))
    count = len(kept) if runs else 1
    kernels = [
        KernelStats(op, provider, len(nodes[op, provider]), times[op, provider] / count) for op, provider in nodes
    ]
    kernels.sort(key=lambda k: (-k.microseconds, k.op_type, k.provider))
    return KernelProfile(runs=count, kernels=kernels)


def profile_kernels(
    source: ir.Model | onnx.ModelProto | str | os.PathLike | bytes,
    feeds: Mapping[str, np.ndarray],
    *,
    fetches: Sequence[str] | None = None,
    runs: int = 3,
    warmup: int = 1,
    providers: Sequence[str] | None = None,
    optimization: Optimization = "all",
    custom_op_libraries: Sequence[str] = (),
    what: str = "the model",
) -> KernelProfile:
    """Runs the model ``warmup + runs`` times in a session of its own with ONNX Runtime's profiler on and returns
    what ran in the last ``runs``: per op type and provider, kernel nodes and time (:class:`KernelProfile`).

    The session is made like :func:`onnxprec._ort.create_session` makes any (same providers, optimization level and
    custom ops), so the profile shows the kernels a session of those settings runs; the profile file goes to a
    temporary folder, removed afterwards.

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load or run the model on these feeds.
    """
    with tempfile.TemporaryDirectory(prefix="onnxprec-profile-") as tmp:
        session = create_session(
            source,
            providers=providers,
            optimization=optimization,
            custom_op_libraries=custom_op_libraries,
            what=what,
            profile_prefix=Path(tmp) / "profile",
        )
        try:
            for _ in range(warmup + runs):
                session.run(feeds, fetches)
        except Exception as e:  # ONNX Runtime's own exception types
            raise UnsupportedModelError(
                f"ONNX Runtime cannot run {what} for its kernel profile: {first_line(e)}"
            ) from None
        finally:
            written = Path(session.inner.end_profiling())
        events = json.loads(written.read_text())
        del session
    profile = read_profile(events, warmup=warmup)
    logger.debug(
        "Kernel profile of %s: %d nodes, %d in integer kernels, %d Q/DQ on their own",
        what,
        profile.nodes,
        profile.integer_nodes,
        profile.qdq_nodes,
    )
    return profile


def unfused_qdq(
    source: str | os.PathLike, *, providers: Sequence[str] | None = None, what: str = "the model"
) -> dict[str, int]:
    """The Q/DQ nodes ONNX Runtime leaves unfused in a model, counted by the op each stands beside.

    A session with every graph optimization (the QDQ fusions into QLinearConv, QLinearMatMul, QLinearAdd,
    MatMulIntegerToFloat, the Q/DQ pairs dropped around Transpose, Reshape, MaxPool...) writes its optimized graph
    to a temporary folder; the QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear nodes left in it (every
    graph, subgraphs included) are the ones that run on their own. A QuantizeLinear counts under the op that
    produces its input (``input`` for a graph input), a DequantizeLinear under the ops that read its output
    (``output`` for a graph output), e.g. ``{"Transpose": 12, "Add": 4}``; ONNX Runtime's own op names, so a Conv
    it kept in float shows as ``FusedConv``.

    Raises:
        UnsupportedModelError: ONNX Runtime cannot load the model.
    """
    with tempfile.TemporaryDirectory(prefix="onnxprec-optimized-") as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        session = create_session(
            source, providers=providers, optimization="all", low_memory=True, what=what, optimized_model_path=optimized
        )
        del session
        proto = onnx.load(str(optimized), load_external_data=False)
    counts: dict[str, int] = {}
    for graph in _graphs(proto.graph):
        producers = {name: node for node in graph.node for name in node.output}
        readers: dict[str, list[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node.op_type)
        outputs = {output.name for output in graph.output}
        for node in graph.node:
            if node.op_type not in QDQ_KERNELS:
                continue
            if node.op_type == "DequantizeLinear":
                beside = sorted(
                    set(readers.get(node.output[0], [])) | ({"output"} if node.output[0] in outputs else set())
                )
            else:
                producer = producers.get(node.input[0])
                beside = [producer.op_type if producer is not None else "input"]
            key = "/".join(beside) or "nothing"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)
