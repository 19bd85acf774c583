"""Where ONNX Runtime lacks a kernel for a node AutoCast made low, and what AutoCast does about it.

Up front, :func:`keep_kernel_gaps` probes the GPU provider's BF16 kernels once per op signature and keeps the nodes
it cannot run in FP32; after a failed numeric check, :func:`kernel_gap` reads ONNX Runtime's error, names the node
and asks for one more conversion with it in FP32. :func:`warn_cast_shared_kv` warns about a KV cache that
``keep_io_types`` puts behind casts where a sliding-window attention kernel needs it in place.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable

import onnx_ir as ir

from onnxprec._graph import tensor_dtype
from onnxprec._io import ModelSource
from onnxprec._ops import opsets_by_domain
from onnxprec._ort import lacks_kernels
from onnxprec.autocast._options import AutoCastOptions
from onnxprec.autocast.classify import Decision
from onnxprec.autocast.report import AutoCastReport
from onnxprec.validate import NumericReport

__all__ = ["MAX_KERNEL_FALLBACKS", "keep_kernel_gaps", "kernel_gap", "node_keys", "warn_cast_shared_kv"]

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


def keep_kernel_gaps(model: ir.Model, decisions: dict[ir.Node, Decision], options: AutoCastOptions) -> None:
    """Keeps in FP32 the BF16 nodes ONNX Runtime has no BF16 kernel for on the GPU provider the model is meant for
    (nor on the CPU it falls back to), found up front by probing each op signature once
    (:func:`onnxprec._ort.lacks_kernels`; ORT 1.31's CUDA provider has no BF16 Clip, Reciprocal or Log, say) instead
    of one failed run of the whole model per node (:func:`kernel_gap`, still the fallback). Only BF16 (ORT runs an
    FP16 node without a kernel in FP32 behind casts it inserts itself) and only for GPU providers: ORT's CPU provider
    has almost no BF16 kernels, and BF16 models are meant for GPUs."""
    gpu = _gpu_provider(options)
    if gpu is None or options.low != ir.DataType.BFLOAT16:
        return
    low = [
        (node, d.fp32_inputs, d.fp32_outputs)
        for node, d in decisions.items()
        if d.low and any(v is not None and tensor_dtype(v) == ir.DataType.FLOAT for v in (*node.inputs, *node.outputs))
    ]
    tick = time.perf_counter()
    lacking = lacks_kernels(low, opsets_by_domain(model), options.low, gpu)
    kept: dict[str, int] = {}
    for node in lacking:
        decisions[node] = Decision(False, f"ONNX Runtime has no BF16 kernel for {node.op_type} on {gpu}")
        kept[node.op_type] = kept.get(node.op_type, 0) + 1
    logger.info(
        "Probed ONNX Runtime's BF16 kernels on %s (%.1f s)%s",
        gpu,
        time.perf_counter() - tick,
        ": kept in FP32 for lack of one: " + ", ".join(f"{op} x{n}" for op, n in sorted(kept.items())) if kept else "",
    )


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


def kernel_gap(
    numeric: NumericReport,
    report: AutoCastReport,
    options: AutoCastOptions,
    source: ModelSource,
    fp32_nodes: dict[str, str],
) -> bool:
    """Whether ONNX Runtime could not run the converted model because of a node this conversion made low.

    If so, the node is added to ``fp32_nodes`` with a WARNING naming it and its op, and the caller converts
    again (ModelOpt's guide promises a model that runs). BF16 is retried only where the check ran on a GPU
    provider: ONNX Runtime's CPU provider has almost no BF16 kernels, and BF16 models are meant for GPUs, where a
    gap (e.g. no CUDA BF16 Reciprocal) is the runtime's and worth working around. A model given as an
    ``ir.Model`` cannot be converted again (it was converted in place).
    """
    if not numeric.skipped or numeric.failed_node is None:
        return False
    node = next((n for n, d in report.decisions.items() if d.low and n.name == numeric.failed_node), None)
    if node is None and not numeric.failed_node and numeric.failed_op:
        # ORT names an unnamed node '': the gap is that op's, if only one unnamed node of it went low.
        unnamed = [n for n, d in report.decisions.items() if d.low and not n.name and n.op_type == numeric.failed_op]
        node = unnamed[0] if len(unnamed) == 1 else None
    if node is None:
        return False
    on_gpu = _gpu_provider(options) is not None
    retried = options.low == ir.DataType.FLOAT16 or on_gpu
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
        return False
    low = options.low_precision_type.upper()
    fp32_nodes[node_keys(report.decisions)[node]] = f"ONNX Runtime cannot run {node.op_type} in {low} here"
    logger.warning(
        "ONNX Runtime cannot run %s node '%s' in %s (%s): converting again with it in FP32.",
        node.op_type,
        node.name,
        low,
        numeric.skipped.split(": ", 1)[-1],
    )
    return True
