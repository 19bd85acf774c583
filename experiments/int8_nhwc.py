"""Latency, unfused Q/DQ and agreement of INT8 models of one float classifier on ONNX Runtime CPU.

Each model gets a session with 2 intra-op threads (graph optimizations all, as deployed); the timed runs alternate
between the models in one process (one run of each per round, after warm-up) and the median per model is printed
with its ratio to the first (the FP32 model). Agreement with the first model on the held-out inputs: top-1
agreement and the largest absolute difference of the class probabilities. The kernel profile counts the
Q/DQ nodes ONNX Runtime ran on their own (unfused) and the nodes in integer kernels.

    python experiments/int8_nhwc.py --data HELD.npz --rounds 30 FP32.onnx INT8_A.onnx [INT8_B.onnx ...]

Used for issue 24's NHWC classifier (Yahoo open_nsfw, a TensorFlow ResNet-50 re-exported with its BatchNorms as
Sub/Mul/Add between NHWC Transposes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from onnxprec._ort_profile import profile_kernels


def _session(path: str, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--data", required=True, help=".npz with the held-out inputs (one array per model input)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with np.load(args.data) as data:
        feeds_all = {k: data[k] for k in data.files}
    sessions = [_session(m, args.threads) for m in args.models]
    outputs = []
    for session in sessions:
        rows = len(next(iter(feeds_all.values())))
        chunks = [session.run(None, {k: v[i : i + 1] for k, v in feeds_all.items()})[0] for i in range(rows)]
        outputs.append(np.concatenate(chunks))
    one = {k: v[:1] for k, v in feeds_all.items()}
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(3):
        for session in sessions:
            session.run(None, one)
    for _ in range(args.rounds):
        for i, session in enumerate(sessions):
            tick = time.perf_counter()
            session.run(None, one)
            times[i].append(time.perf_counter() - tick)
    medians = [statistics.median(t) * 1e3 for t in times]
    results = []
    for path, out, median in zip(args.models, outputs, medians):
        profile = profile_kernels(path, one, runs=2)
        ref = outputs[0]
        row = {
            "model": Path(path).name,
            "median_ms": round(median, 3),
            "vs_first": round(median / medians[0], 3),
            "top1_agreement": float(np.mean(out.argmax(-1) == ref.argmax(-1))),
            "max_abs": float(np.abs(out - ref).max()),
            "unfused_qdq": profile.qdq_nodes,
            "integer_nodes": profile.integer_nodes,
            "kernel_nodes": profile.nodes,
        }
        results.append(row)
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "threads": args.threads, "rows": results}))


if __name__ == "__main__":
    main()
