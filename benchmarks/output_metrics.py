"""What a converted model is worth, measured after (and apart from) the timed runs, in the project venv.

:func:`structure` counts the nodes (Cast and Constant excluded), the float nodes (any FP64/FP32/FP16/BF16 input or
output), the low nodes (any FP16/BF16 input or output, types completed by ONNX shape inference), the Cast nodes and
the size with external data; :func:`versus_fp32` runs :func:`onnxprec.evaluate.evaluate_models` on the FP32 model
and one candidate at a time (a result ONNX Runtime cannot load fails alone): agreement of every output
(:class:`onnxprec.metrics.ErrorStats`), perplexity and ONNX Runtime CPU latency of batch 1. BENCHMARKS.md states
the same definitions (``report_text.md``'s ``autocast.quality``). Run as a worker (``python -m
benchmarks.output_metrics SPEC OUT.json``, :func:`main`) so that ONNX Runtime's memory is given back after each model.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from onnxprec import _ort
from onnxprec._io import write_atomically
from onnxprec._protobuf import proto_graphs

logger = logging.getLogger(__name__)

LOW_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
FLOAT_TYPES = LOW_TYPES | {TensorProto.FLOAT, TensorProto.DOUBLE}


# ------------------------------------------------------------------------------------------------------------
# structure
# ------------------------------------------------------------------------------------------------------------


def external_files(model: onnx.ModelProto, folder: Path) -> list[Path]:
    """The external data files the model's initializers refer to (existing ones, once each)."""
    found = {
        e.value: folder / e.value
        for g in proto_graphs(model.graph)
        for t in g.initializer
        if t.data_location == TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    return [p for p in found.values() if p.exists()]


def model_files(path: Path, model: onnx.ModelProto | None = None) -> list[Path]:
    """The model file and its external data files (``model``: the file, already loaded without its data)."""
    model = model or onnx.load(str(path), load_external_data=False)
    return [path, *external_files(model, path.parent)]


def file_size(path: Path, model: onnx.ModelProto | None = None) -> int:
    """Bytes of ``path`` plus its external data files (``model``: as :func:`model_files`)."""
    return sum(p.stat().st_size for p in model_files(path, model))


def structure(path: Path) -> dict[str, Any]:
    """Node, cast and float-node counts of a model file, and its size (weights are not read)."""
    model = onnx.load(str(path), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception as e:  # custom ops, or too large: fall back to the declared types
        logger.warning("%s: shape inference failed (%s); using declared types only", path.name, e)
        inferred = model
    types = _tensor_types(inferred.graph)
    nodes = low = casts = floats = 0
    fp32_ops: Counter[str] = Counter()
    for node in (n for g in proto_graphs(inferred.graph) for n in g.node):
        if node.domain in ("", "ai.onnx") and node.op_type in ("Cast", "Constant"):
            casts += node.op_type == "Cast"
            continue
        nodes += 1
        io = {types.get(n) for n in (*node.input, *node.output) if n}
        low += bool(io & LOW_TYPES)
        floats += bool(io & FLOAT_TYPES)
        if io & FLOAT_TYPES and not io & LOW_TYPES:
            fp32_ops[node.op_type] += 1
    return {"nodes": nodes, "float_nodes": floats, "low_nodes": low, "fp32_nodes": floats - low,
            "low_pct": 100.0 * low / floats if floats else 0.0, "casts": casts, "file_bytes": file_size(path, model),
            "fp32_ops": dict(fp32_ops.most_common())}  # fmt: skip


def _tensor_types(graph: onnx.GraphProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for g in proto_graphs(graph):
        for vi in (*g.input, *g.output, *g.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
        for node in g.node:  # Constant outputs, in case inference skipped them
            if node.op_type == "Constant" and node.output and node.output[0] not in types:
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        types[node.output[0]] = attr.t.data_type
    return types


def session(path: Path, what: str = "the model") -> _ort.Session:
    """An ONNX Runtime CPU session with ONNX Runtime's default optimizations (quiet)."""
    return _ort.create_session(path, optimization="all", what=what)


def versus_fp32(
    fp32: Path, candidate: Path, feeds: Mapping[str, np.ndarray], spec: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """FP32's own ``perplexity`` and ``latency_cpu`` (where measured), and the candidate's ``accuracy`` and
    ``latency_cpu`` against FP32's, from one :func:`onnxprec.evaluate.evaluate_models` of the two."""
    from onnxprec.evaluate import evaluate_models

    runs = int(spec.get("latency_runs", 20)) if spec.get("latency", True) else 0
    ppl = None if spec.get("perplexity") else False
    # no kernel profile: none of these tables shows one, and it would add a profiled session per model
    report = evaluate_models([fp32, candidate], dict(feeds), batch_size=spec.get("batch"), perplexity=ppl,
                             latency_runs=runs, profile_runs=0)  # fmt: skip
    ref, res = report.models
    acc = {"output": res.main_output, **(res.main_agreement or {}), "outputs": res.agreement or {}}
    base: dict[str, Any] = {} if ref.perplexity is None else {"perplexity": ref.perplexity}
    out: dict[str, Any] = {"accuracy": acc}
    if res.perplexity is not None:
        acc["perplexity"] = res.perplexity
    if ref.latency_ms and res.latency_ms:
        for got, m in ((base, ref.latency_ms), (out, res.latency_ms)):
            got["latency_cpu"] = {**{f"{s}_ms": v for s, v in m.items() if s != "runs"}, "iters": runs}
        out["latency_cpu"]["vs_fp32"] = res.latency_ms["median"] / ref.latency_ms["median"]
    return base, out


def latencies(paths: Mapping[str, Path], feeds: Mapping[str, np.ndarray], runs: int) -> dict[str, dict[str, Any]]:
    """CPU latency of every model of ``paths`` (the first is FP32) on ``feeds``, each against FP32 in its own
    :func:`versus_fp32`; a model that fails gets its ``error``."""
    (ref, fp32), *others = paths.items()
    out: dict[str, dict[str, Any]] = {}
    for key, path in others:
        try:
            base, got = versus_fp32(fp32, path, feeds, {"latency_runs": runs, "perplexity": False})
        except Exception as e:  # a result ONNX Runtime cannot run is a result too
            out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        out.setdefault(ref, base["latency_cpu"])
        out[key] = got["latency_cpu"]
    return dict(sorted(out.items(), key=lambda kv: kv[0] != ref))


# ------------------------------------------------------------------------------------------------------------
# worker
# ------------------------------------------------------------------------------------------------------------


def evaluate(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Everything for one model: structure of FP32 and each candidate, accuracy and CPU latency.

    ``spec``: model, fp32 (path), inputs (npz path), candidates {tool: path}, evaluate [tools to run],
    perplexity, batch, latency (bool), latency_runs."""
    fp32 = Path(spec["fp32"])
    with np.load(spec["inputs"]) as z:
        feeds = {k: z[k] for k in z.files}
    cands = {k: Path(v) for k, v in spec["candidates"].items()}
    to_run = [k for k in spec.get("evaluate", list(cands)) if k in cands]
    result: dict[str, Any] = {"fp32": {"structure": structure(fp32)}, "tools": {k: {} for k in cands}}
    for key, p in cands.items():
        t = time.perf_counter()
        result["tools"][key]["structure"] = structure(p)
        logger.info("%s %s: structure in %.1f s", spec["model"], key, time.perf_counter() - t)
    for key in to_run:
        t = time.perf_counter()
        try:
            base, got = versus_fp32(fp32, cands[key], feeds, spec)
        except Exception as e:  # a result ONNX Runtime cannot load or run is a result too
            logger.warning("%s %s: evaluation failed: %s", spec["model"], key, e)
            result["tools"][key]["accuracy"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        result["fp32"] = {**base, **result["fp32"]}  # FP32's first measurement beside a candidate
        result["tools"][key].update(got)
        logger.info("%s %s: accuracy and latency in %.1f s", spec["model"], key, time.perf_counter() - t)
    result["latency_mode"] = "FP32 and one candidate at a time (onnxprec.evaluate)"
    return result


def main(argv: list[str] | None = None) -> int:
    """The worker: ``python -m benchmarks.output_metrics SPEC OUT.json``, SPEC the JSON text of :func:`evaluate`'s
    ``spec``."""
    spec, out = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    write_atomically(out, json.dumps(evaluate(json.loads(spec)), indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
