"""What a converted model is worth, measured after (and apart from) the timed runs, in the project venv.

Definitions (the same for every tool, so the columns compare):

* **nodes** - nodes of the output model's main graph and subgraphs, Cast and Constant nodes excluded (tools
  differ in whether constants are nodes or initializers; neither computes anything).
* **float nodes** - of those, the ones with at least one floating-point (FP64/FP32/FP16/BF16) input or output;
  the rest is integer shape arithmetic that no converter touches.
* **low nodes** - the ones with at least one FP16 or BF16 input or output tensor (types from the model's
  declarations completed by ONNX shape inference). A Shape or Gather reading an FP16 tensor counts; a node
  kept in FP32 between two casts does not. **FP32 nodes** = float nodes - low nodes (what stayed in FP32).
* **casts** - Cast nodes in the output; **casts inserted** - that minus the FP32 model's own Cast nodes.
* **size** - the ``.onnx`` file plus every external data file it references.
* **output error** - against the FP32 model run by ONNX Runtime CPU on the model's real inputs (whole batch,
  in slices for SmolLM2): max |a-b|, relative L2 ||a-b||/||a||, cosine <a,b>/(||a|| ||b||) over the whole
  output, top-1 agreement (share of rows whose argmax over the last axis matches; classifiers and LLM logits
  only), all on the model's first output (every output is kept in the JSON); computed by
  :class:`onnxprec.metrics.ErrorStats`.
* **perplexity** - SmolLM2 only: exp(mean next-token NLL) of the logits on the real 16x256 windows
  (:class:`onnxprec.metrics.Perplexity`).
* **CPU latency** - ONNX Runtime CPU, default session options, batch 1 (the first real sample); warm-up runs,
  then rounds that alternate the FP32 model and every candidate in one process (one model at a time for
  models above ``TOGETHER_LIMIT_MB``); median and 10th/90th percentiles of single runs (the same timing loop
  and statistics as ``experiments/gpu_latency.py``).

Run as a worker (``python -m benchmarks.output_metrics SPEC.json OUT.json``) so that ONNX Runtime's memory is given
back to the system after each model. Sessions come from :func:`onnxprec._ort.create_session`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from onnxprec import _ort, metrics
from onnxprec._io import write_atomically

logger = logging.getLogger(__name__)

LOW_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
FLOAT_TYPES = LOW_TYPES | {TensorProto.FLOAT, TensorProto.DOUBLE}
TOGETHER_LIMIT_MB = 3000.0
MIB = 1 << 20


# ------------------------------------------------------------------------------------------------------------
# structure
# ------------------------------------------------------------------------------------------------------------


def external_files(model: onnx.ModelProto, folder: Path) -> list[Path]:
    """The external data files the model's initializers refer to (existing ones, once each)."""
    found: dict[str, Path] = {}
    for t in _all_initializers(model.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        for e in t.external_data:
            if e.key == "location":
                found.setdefault(e.value, folder / e.value)
    return [p for p in found.values() if p.exists()]


def file_size(path: Path) -> int:
    """Bytes of ``path`` plus its external data files."""
    model = onnx.load(str(path), load_external_data=False)
    return path.stat().st_size + sum(p.stat().st_size for p in external_files(model, path.parent))


def structure(path: Path) -> dict[str, Any]:
    """Node, cast and weight counts of a model file (weights are not read)."""
    model = onnx.load(str(path), load_external_data=False)
    size = path.stat().st_size + sum(p.stat().st_size for p in external_files(model, path.parent))
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception as e:  # custom ops, or too large: fall back to the declared types
        logger.warning("%s: shape inference failed (%s); using declared types only", path.name, e)
        inferred = model
    types = _tensor_types(inferred.graph)
    nodes = low = casts = constants = floats = 0
    op_low: dict[str, int] = {}
    op_fp32: dict[str, int] = {}
    for node in _all_nodes(inferred.graph):
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "Cast":
            casts += 1
            continue
        if standard and node.op_type == "Constant":
            constants += 1
            continue
        nodes += 1
        io = [types.get(n) for n in (*node.input, *node.output) if n]
        if any(t in LOW_TYPES for t in io):
            low += 1
            op_low[node.op_type] = op_low.get(node.op_type, 0) + 1
        if any(t in FLOAT_TYPES for t in io):
            floats += 1
            if not any(t in LOW_TYPES for t in io):
                op_fp32[node.op_type] = op_fp32.get(node.op_type, 0) + 1
    weights: dict[str, float] = {}
    for t in _all_initializers(model.graph):
        name = TensorProto.DataType.Name(t.data_type).lower()
        n = math.prod(t.dims) if t.dims else 1
        weights[name] = weights.get(name, 0.0) + n * _itemsize(t.data_type) / MIB
    return {
        "nodes": nodes,
        "float_nodes": floats,
        "low_nodes": low,
        "fp32_nodes": floats - low,
        "low_pct": 100.0 * low / floats if floats else 0.0,
        "casts": casts,
        "constants": constants,
        "file_bytes": size,
        "weights_mb": {k: round(v, 3) for k, v in sorted(weights.items())},
        "low_ops": dict(sorted(op_low.items(), key=lambda kv: -kv[1])),
        "fp32_ops": dict(sorted(op_fp32.items(), key=lambda kv: -kv[1])),
    }


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for g in _all_graphs(graph):
        yield from g.node


def _all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_graphs(g)


def _all_initializers(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    for g in _all_graphs(graph):
        yield from g.initializer


def _tensor_types(graph: onnx.GraphProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for g in _all_graphs(graph):
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


def _itemsize(data_type: int) -> float:
    try:
        return float(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 0.5 if data_type in (TensorProto.INT4, TensorProto.UINT4) else 0.0


# ------------------------------------------------------------------------------------------------------------
# running models
# ------------------------------------------------------------------------------------------------------------


def session(path: Path, what: str = "the model") -> _ort.Session:
    """An ONNX Runtime CPU session with ONNX Runtime's default optimizations (quiet); it casts FP32 feeds to
    FP16 inputs (a tool that did not keep the I/O types) and fetches every float type."""
    return _ort.create_session(path, optimization="all", what=what)


def _own_feeds(sess: _ort.Session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds that are inputs of ``sess`` (a converter may drop an unused input)."""
    return {k: v for k, v in feeds.items() if k in sess.input_types}


def batches(feeds: Mapping[str, np.ndarray], size: int | None) -> list[dict[str, np.ndarray]]:
    """``feeds`` sliced along their common leading dimension into batches of ``size`` (None: one batch)."""
    arrays = list(feeds.values())
    n = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
    if size is None or size >= n or any(a.ndim == 0 or a.shape[0] != n for a in arrays):
        return [dict(feeds)]
    return [{k: v[i : i + size] for k, v in feeds.items()} for i in range(0, n, size)]


def first_sample(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Batch 1: the first row of every input."""
    return {k: v[:1] if v.ndim else v for k, v in feeds.items()}


def reference_outputs(
    fp32: Path, feeds: Mapping[str, np.ndarray], batch: int | None, work: Path, perplexity: bool
) -> tuple[list[Path], list[str], float | None]:
    """Runs the FP32 model batch by batch; saves each batch's outputs to ``work``; returns the files, the output
    names and the FP32 perplexity (when asked)."""
    sess = session(fp32, "the FP32 model")
    names = sess.output_names
    files = []
    ppl = metrics.Perplexity()
    for i, b in enumerate(batches(feeds, batch)):
        outs = sess.run(_own_feeds(sess, b))
        f = work / f"ref-{i}.npz"
        np.savez(f, **{f"o{j}": o for j, o in enumerate(outs)})
        files.append(f)
        if perplexity:
            ppl.update(outs[0], b["input_ids"])
        del outs
    del sess
    return files, names, ppl.value if perplexity and ppl.tokens else None


def accuracy(
    path: Path,
    feeds: Mapping[str, np.ndarray],
    batch: int | None,
    ref_files: list[Path],
    names: list[str],
    top1: bool,
    perplexity: bool,
) -> dict[str, Any]:
    """Output error of ``path`` against the saved FP32 outputs (and its perplexity when asked)."""
    sess = session(path, "the result")
    streams = [metrics.ErrorStats(track_top1=top1 and j == 0) for j in range(len(names))]
    ppl = metrics.Perplexity()
    for b, f in zip(batches(feeds, batch), ref_files):
        outs = sess.run(_own_feeds(sess, b))
        with np.load(f) as z:
            for j, o in enumerate(outs):
                streams[j].update(z[f"o{j}"], o)
        if perplexity:
            ppl.update(outs[0], b["input_ids"])
        del outs
    del sess
    per_output = {name: s.as_dict() for name, s in zip(names, streams)}
    out: dict[str, Any] = {"output": names[0], **per_output[names[0]], "outputs": per_output}
    if perplexity:
        out["perplexity"] = ppl.value if ppl.tokens else math.inf
    return out


def time_alternating(
    runs: Mapping[str, Callable[[], object]], rounds: int, per_round: Mapping[str, int]
) -> dict[str, list[float]]:
    """Single-run times (ms) of each callable: ``rounds`` rounds that each time ``per_round[key]`` runs of every
    callable in turn, so that clock, thermal and neighbour drift hit all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            for _ in range(per_round[k]):
                t = time.perf_counter()
                run()
                times[k].append((time.perf_counter() - t) * 1e3)
    return times


def latency_stats(times_ms: Sequence[float]) -> dict[str, Any]:
    """Median, 10th and 90th percentile and mean (ms) of single runs, and their number."""
    a = np.asarray(times_ms)
    return {
        "median_ms": float(np.median(a)),
        "p10_ms": float(np.percentile(a, 10)),
        "p90_ms": float(np.percentile(a, 90)),
        "mean_ms": float(a.mean()),
        "iters": len(a),
    }


def latency(
    paths: Mapping[str, Path],
    feeds: Mapping[str, np.ndarray],
    budget_s: float = 3.0,
    rounds: int = 5,
    max_iters: int = 200,
    min_iters: int = 10,
    together: bool = True,
) -> dict[str, dict[str, Any]]:
    """Single-run CPU latencies (ms) of each model on ``feeds``: warm-up, then ``rounds`` rounds alternating the
    models (all sessions open at once when ``together``, else one model at a time); about ``budget_s`` of timed
    runs per model, at least ``min_iters`` and at most ``max_iters``."""
    out: dict[str, dict[str, Any]] = {}
    groups = [list(paths)] if together else [[k] for k in paths]
    for group in groups:
        sessions = {}
        per_iter: dict[str, int] = {}
        for key in group:
            try:
                wrapped = session(paths[key], f"{key}'s model")
                f = wrapped.feeds(_own_feeds(wrapped, feeds))
                sess = wrapped.inner  # the raw ORT session: only ONNX Runtime's own run is timed
                sess.run(None, f)  # warm-up (first run allocates)
                t = time.perf_counter()
                sess.run(None, f)
                one = max(time.perf_counter() - t, 1e-5)
            except Exception as e:
                logger.warning("latency: %s failed: %s", key, e)
                out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            sessions[key] = (sess, f)
            per_iter[key] = int(min(max_iters / rounds, max(math.ceil(min_iters / rounds), budget_s / rounds / one)))
        runs = {key: functools.partial(sess.run, None, f) for key, (sess, f) in sessions.items()}
        for key, ts in time_alternating(runs, rounds, per_iter).items():
            out[key] = latency_stats(ts)
        del sessions, runs
    return out


# ------------------------------------------------------------------------------------------------------------
# worker
# ------------------------------------------------------------------------------------------------------------


def evaluate(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Everything for one model: structure of FP32 and each candidate, accuracy and CPU latency.

    ``spec``: model, fp32 (path), inputs (npz path), candidates {tool: path}, evaluate [tools to run],
    top1, perplexity, batch, latency (bool), latency_budget_s, work (scratch folder)."""
    fp32 = Path(spec["fp32"])
    work = Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    with np.load(spec["inputs"]) as z:
        feeds = {k: z[k] for k in z.files}
    cands = {k: Path(v) for k, v in spec["candidates"].items()}
    to_run = [k for k in spec.get("evaluate", list(cands)) if k in cands]
    result: dict[str, Any] = {"fp32": {"structure": structure(fp32)}, "tools": {k: {} for k in cands}}
    for key, p in cands.items():
        t = time.perf_counter()
        result["tools"][key]["structure"] = structure(p)
        logger.info("%s %s: structure in %.1f s", spec["model"], key, time.perf_counter() - t)
    if spec.get("accuracy", True) and to_run:
        t = time.perf_counter()
        ref_files, names, ppl = reference_outputs(fp32, feeds, spec.get("batch"), work, bool(spec.get("perplexity")))
        if ppl is not None:
            result["fp32"]["perplexity"] = ppl
        logger.info("%s fp32: reference outputs in %.1f s", spec["model"], time.perf_counter() - t)
        for key in to_run:
            t = time.perf_counter()
            try:
                result["tools"][key]["accuracy"] = accuracy(
                    cands[key],
                    feeds,
                    spec.get("batch"),
                    ref_files,
                    names,
                    bool(spec.get("top1")),
                    bool(spec.get("perplexity")),
                )
            except Exception as e:
                logger.warning("%s %s: accuracy failed: %s", spec["model"], key, e)
                result["tools"][key]["accuracy"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            logger.info("%s %s: accuracy in %.1f s", spec["model"], key, time.perf_counter() - t)
        for f in ref_files:
            f.unlink(missing_ok=True)
    if spec.get("latency", True) and to_run:
        t = time.perf_counter()
        paths = {"fp32": fp32, **{k: cands[k] for k in to_run}}
        total_mb = sum(file_size(p) for p in paths.values()) / MIB
        lat = latency(
            paths,
            first_sample(feeds),
            budget_s=float(spec.get("latency_budget_s", 3.0)),
            together=total_mb <= TOGETHER_LIMIT_MB,
        )
        result["fp32"]["latency_cpu"] = lat.pop("fp32")
        base = result["fp32"]["latency_cpu"].get("median_ms")
        for key, v in lat.items():
            if base and "median_ms" in v:
                v["vs_fp32"] = v["median_ms"] / base
            result["tools"][key]["latency_cpu"] = v
        result["latency_mode"] = "together" if total_mb <= TOGETHER_LIMIT_MB else "one model at a time"
        logger.info("%s: CPU latency in %.1f s", spec["model"], time.perf_counter() - t)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.output_metrics SPEC.json OUT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(args[0]).read_text())
    result = evaluate(spec)
    write_atomically(args[1], json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
