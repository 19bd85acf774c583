"""Where ONNX Runtime lacks a kernel for a node AutoCast made low, and what AutoCast does about it.

Up front, :func:`keep_kernel_gaps` probes the provider's BF16 kernels once per op signature and keeps the nodes it
cannot run in FP32 (with only the CPU provider: refuses, unless asked to keep them); after a failed numeric check,
:func:`raise_kernel_gap` reads ONNX Runtime's error, names the node and asks for one more conversion with it in FP32
(:class:`KernelGap`).
:func:`warn_cast_shared_kv` warns about a KV cache that ``keep_io_types`` puts behind casts where a sliding-window
attention kernel needs it in place.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

import onnx_ir as ir

from onnxprec._graph import tensor_dtype
from onnxprec._io import ModelSource
from onnxprec._ops import opsets_by_domain
from onnxprec._ort import lacks_kernels
from onnxprec._report import timed
from onnxprec.autocast._options import AutoCastOptions
from onnxprec.autocast.classify import Decision
from onnxprec.autocast.report import AutoCastReport
from onnxprec.errors import UnsupportedModelError
from onnxprec.validate import NumericReport

__all__ = [
    "MAX_KERNEL_FALLBACKS",
    "KernelGap",
    "keep_kernel_gaps",
    "node_keys",
    "raise_kernel_gap",
    "warn_cast_shared_kv",
]

logger = logging.getLogger(__name__)


def warn_cast_shared_kv(model: ir.Model) -> None:
    """Warns when a sliding-window GroupQueryAttention (``sliding_window_cache=1``, the builder's Gemma2 and GPT-OSS)
    reads a KV cache cast at the model's interface (``keep_io_types`` with the cache in another type than the
    attention): ORT's CUDA kernel needs past and present to share one buffer, which a Cast between them breaks, so
    onnxruntime-genai cannot run the model on CUDA."""
    for node in model.graph.all_nodes():
        attr = node.attributes.get("sliding_window_cache")
        if node.op_type != "GroupQueryAttention" or attr is None or not attr.as_int() or len(node.inputs) < 4:
            continue
        past = node.inputs[3]
        producer = past.producer() if past is not None else None
        source = producer.inputs[0] if producer is not None and producer.op_type == "Cast" else None
        if source is not None and source.is_graph_input():
            logger.warning(
                "GroupQueryAttention '%s' keeps a sliding-window KV cache in place, but its cache input '%s' is "
                "cast at the model's interface (--keep_io_types): ONNX Runtime's CUDA kernel needs past and "
                "present in one shared buffer, so onnxruntime-genai cannot run it on CUDA; convert without "
                "--keep_io_types to make the KV cache the low type.",
                node.name,
                source.name,
            )
            return


def _gpu_provider(options: AutoCastOptions) -> str | None:
    """The first provider of ``options`` that is not the CPU (``cuda:0``, ``trt``, ``dml``), if any."""
    return next((str(p) for p in options.providers if not str(p).lower().startswith("cpu")), None)


def keep_kernel_gaps(
    model: ir.Model, decisions: dict[ir.Node, Decision], options: AutoCastOptions, *, refuse: bool = False
) -> dict[str, int]:
    """Keeps in FP32 the BF16 nodes ONNX Runtime has no BF16 kernel for on the provider the model is meant for
    (nor on the CPU it falls back to), found up front by probing each op signature once
    (:func:`onnxprec._ort.lacks_kernels`; ORT 1.31's CUDA provider has no BF16 Clip, Reciprocal or Log, say) instead
    of one failed run of the whole model per node (:func:`raise_kernel_gap`, still the fallback). Only BF16: ORT runs an
    FP16 node without a kernel in FP32 behind casts it inserts itself.

    On a GPU provider the nodes without a kernel stay FP32 always. With only the CPU provider (whose BF16 kernels
    are mostly data movement: a BF16 CNN or transformer cannot load there), the probe runs when ``refuse`` (the
    file-to-file API and the command line, which never write a model the chosen provider cannot load) or
    ``options.keep_unsupported_fp32`` asks for it: the nodes stay FP32 with ``keep_unsupported_fp32``, else the
    conversion is refused. ModelOpt's API (``refuse=False``) converts as ModelOpt does and warns after its check.

    Returns:
        Op type -> count of the nodes kept in FP32 for lack of a kernel.

    Raises:
        UnsupportedModelError: BF16 with only the CPU provider, nodes without a kernel, ``refuse`` and neither
            ``keep_unsupported_fp32`` nor ``validate=False``.
    """
    gpu = _gpu_provider(options)
    if options.low != ir.DataType.BFLOAT16:
        return {}
    keep = options.keep_unsupported_fp32
    if gpu is None and not (keep or (refuse and options.validate)):
        return {}
    provider = gpu or "cpu"
    low = [
        (node, d.fp32_inputs, d.fp32_outputs)
        for node, d in decisions.items()
        if d.low and any(v is not None and tensor_dtype(v) == ir.DataType.FLOAT for v in (*node.inputs, *node.outputs))
    ]
    with timed() as clock:
        lacking = lacks_kernels(low, opsets_by_domain(model), options.low, provider)
    kept: dict[str, int] = {}
    for node in lacking:
        kept[node.op_type] = kept.get(node.op_type, 0) + 1
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(kept.items(), key=lambda item: (-item[1], item[0])))
    if gpu is None and lacking and not keep:
        converted = sum(1 for d in decisions.values() if d.low) - len(lacking)
        raise UnsupportedModelError(
            f"BF16 with only the CPU provider: ONNX Runtime has no CPU BF16 kernel for {len(lacking)} of the "
            f"{len(decisions)} nodes ({ops}), so it could not load the result: pass --providers cuda (the GPU the "
            f"model is meant for), --keep_unsupported_fp32 to keep those nodes in FP32 ({converted}/{len(decisions)} "
            "would be converted), or --no_validate to write it unchecked for another runtime."
        )
    for node in lacking:
        decisions[node] = Decision(False, f"ONNX Runtime has no BF16 kernel for {node.op_type} on {provider}")
    logger.info(
        "Probed ONNX Runtime's BF16 kernels on %s (%.1f s)%s",
        provider,
        clock.seconds,
        f": kept in FP32 for lack of one: {ops}" if kept else "",
    )
    return kept


MAX_KERNEL_FALLBACKS = 8


def node_keys(nodes: Iterable[ir.Node]) -> dict[ir.Node, str]:
    """A key per node that survives converting again from the file: its name, or for an unnamed node its op type
    and its rank among the unnamed nodes of that op (in graph order)."""
    keys: dict[ir.Node, str] = {}
    counts: dict[str, int] = {}
    for node in nodes:
        if node.name:
            keys[node] = str(node.name)
        else:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            keys[node] = f"<unnamed {node.op_type} #{counts[node.op_type]}>"
    return keys


class KernelGap(Exception):
    """ONNX Runtime could not run the converted model because of a node it made low: convert again with the node in
    FP32 (raised by :func:`raise_kernel_gap`, caught by the one conversion loop,
    :func:`onnxprec.autocast._api.convert_until_runs`)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        """The node's :func:`node_keys` key."""
        self.reason = reason
        """Why it stays FP32, as its decision says."""


def raise_kernel_gap(
    numeric: NumericReport,
    report: AutoCastReport,
    options: AutoCastOptions,
    source: ModelSource,
    fp32_nodes: Mapping[str, str],
) -> None:
    """Raises :class:`KernelGap` when ONNX Runtime could not run the converted model because of a node this
    conversion made low and converting again can help; returns otherwise (the caller goes on with its checks).

    The node is named in a WARNING with its op (ModelOpt's guide promises a model that runs). BF16 is retried where
    the check ran on a GPU provider (a gap there, e.g. no CUDA BF16 Reciprocal, is the runtime's and worth working
    around) or with ``keep_unsupported_fp32``: ONNX Runtime's CPU provider has almost no BF16 kernels. A model given
    as an ``ir.Model`` cannot be converted again (it was converted in place), nor one that already kept
    :data:`MAX_KERNEL_FALLBACKS` nodes (``fp32_nodes``: the nodes earlier attempts kept in FP32).

    Raises:
        KernelGap: Convert again with the node in FP32.
    """
    if not numeric.skipped or numeric.failed_node is None:
        return
    node = next((n for n, d in report.decisions.items() if d.low and n.name == numeric.failed_node), None)
    if node is None and not numeric.failed_node and numeric.failed_op:
        # ORT names an unnamed node '': the gap is that op's, if only one unnamed node of it went low.
        unnamed = [n for n, d in report.decisions.items() if d.low and not n.name and n.op_type == numeric.failed_op]
        node = unnamed[0] if len(unnamed) == 1 else None
    if node is None:
        return
    on_gpu = _gpu_provider(options) is not None
    retried = options.low == ir.DataType.FLOAT16 or on_gpu or options.keep_unsupported_fp32
    if not retried or isinstance(source, ir.Model) or len(fp32_nodes) >= MAX_KERNEL_FALLBACKS:
        logger.log(
            logging.INFO if not retried else logging.WARNING,
            "ONNX Runtime cannot run %s node '%s' of the converted model (%s): keep it in FP32 with "
            "--nodes_to_exclude '%s' if your runtime has the same gap.",
            node.op_type,
            node.name,
            numeric.skipped.split(": ", 1)[-1],
            re.escape(str(node.name)),
        )
        return
    low = options.low_precision_type.upper()
    logger.warning(
        "ONNX Runtime cannot run %s node '%s' in %s (%s): converting again with it in FP32.",
        node.op_type,
        node.name,
        low,
        numeric.skipped.split(": ", 1)[-1],
    )
    raise KernelGap(node_keys(report.decisions)[node], f"ONNX Runtime cannot run {node.op_type} in {low} here")
