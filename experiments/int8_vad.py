"""INT8 for silero-vad, whose layers live inside an ``If`` (16 kHz or 8 kHz network): the whole model and its
16 kHz branch quantized as a model of its own and put back into the ``If``.

Speech from espeak-ng (sentences rendered to wav, resampled to 16 kHz by linear interpolation) with silence and
faint noise between them; the model runs chunk by chunk (512 samples with 64 samples of context, its state carried)
as silero-vad's own wrapper runs it. Calibration on the first three sentences, evaluation on the other three.
Metric per 32 ms frame: the speech probability, the agreement of the > 0.5 decision with FP32 and the largest
absolute difference; latency per chunk with 2 threads (median of alternating runs in one process).

The branch experiment: the ``then_branch`` (taken when ``sr == 16000``) becomes a model whose inputs are the outer
values it reads (``input``, ``state``); ``onnxprec quantize int8`` quantizes it on the (input, state) pairs the
FP32 run saw; its graph (inputs dropped, so the names resolve to the outer scope again) replaces the branch.

    python experiments/int8_vad.py SILERO_VAD.onnx AUDIO_DIR WORK [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import onnx

CHUNK, CONTEXT, RATE = 512, 64, 16000


def _read(path: Path) -> np.ndarray:
    with wave.open(str(path)) as f:
        rate, frames = f.getframerate(), f.readframes(f.getnframes())
    audio = np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0
    times = np.arange(int(len(audio) * RATE / rate)) / RATE
    return np.interp(times, np.arange(len(audio)) / rate, audio).astype(np.float32)


def _stream(paths: list[Path], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = []
    for path in paths:
        parts += [
            np.zeros(RATE // 2, np.float32),
            _read(path),
            (rng.standard_normal(RATE // 2) * 1e-3).astype(np.float32),
        ]
    return np.concatenate(parts)


def _session(path: str | bytes, threads: int = 2) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _run(session: Any, audio: np.ndarray) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    """Speech probability per chunk and the feeds of every chunk."""
    state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, CONTEXT), np.float32)
    probs, feeds = [], []
    for start in range(0, len(audio) - CHUNK + 1, CHUNK):
        x = np.concatenate([context, audio[None, start : start + CHUNK]], axis=1)
        feed = {"input": x, "state": state, "sr": np.array(RATE, np.int64)}
        feeds.append(feed)
        prob, state = session.run(None, feed)
        probs.append(float(prob[0, 0]))
        context = x[:, -CONTEXT:]
    return np.array(probs), feeds


def _branch_model(model: onnx.ModelProto, branch: str) -> onnx.ModelProto:
    node = next(n for n in model.graph.node if n.op_type == "If")
    graph = onnx.GraphProto()
    graph.CopyFrom(next(a.g for a in node.attribute if a.name == branch))
    graph.input.extend([i for i in model.graph.input if i.name in ("input", "state")])
    out = onnx.helper.make_model(graph, opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out


def _splice(model: onnx.ModelProto, branch: str, quantized: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = next(n for n in out.graph.node if n.op_type == "If")
    attr = next(a for a in node.attribute if a.name == branch)
    graph = onnx.GraphProto()
    graph.CopyFrom(quantized.graph)
    del graph.input[:]
    attr.g.CopyFrom(graph)
    known = {o.domain for o in out.opset_import}
    out.opset_import.extend([o for o in quantized.opset_import if o.domain not in known])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("audio", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--exclude", nargs="*", default=[], help="--nodes_to_exclude for the branch")
    parser.add_argument("--method", default="mse", help="--calibration_method for the branch")
    parser.add_argument("--target", help="--target_accuracy for the branch (its float fallback)")
    args = parser.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    files = sorted(args.audio.glob("s*.wav"))
    calib_audio, eval_audio = _stream(files[:3], 0), _stream(files[3:], 1)
    fp32 = _session(args.model)
    _, calib_feeds = _run(fp32, calib_audio)
    ref, eval_feeds = _run(fp32, eval_audio)
    calib_dir = work / "calib"
    calib_dir.mkdir(exist_ok=True)
    for i, feed in enumerate(calib_feeds[::4]):
        np.savez(calib_dir / f"{i:04d}.npz", input=feed["input"], state=feed["state"])
    results: dict[str, Any] = {
        "frames": len(ref),
        "speech_frames_fp32": int((ref > 0.5).sum()),
        "exclude": args.exclude,
        "method": args.method,
        "target": args.target,
    }

    whole = subprocess.run(
        [sys.executable, "-m", "onnxprec", "quantize", "int8", "--onnx_path", args.model,
         "--output_path", str(work / "whole.int8.onnx"), "-d", str(calib_dir)],
        capture_output=True, text=True,
    )  # fmt: skip
    results["whole_model"] = {
        "exit": whole.returncode,
        "last_line": (whole.stderr or whole.stdout).strip().splitlines()[-1],
    }

    model = onnx.load(args.model)
    excluded = ["--nodes_to_exclude", *args.exclude] if args.exclude else []
    excluded += ["--target_accuracy", args.target] if args.target else []
    onnx.save(_branch_model(model, "then_branch"), work / "branch16k.onnx")
    done = subprocess.run(
        [sys.executable, "-m", "onnxprec", "quantize", "int8", "--onnx_path", str(work / "branch16k.onnx"),
         "--output_path", str(work / "branch16k.int8.onnx"), "-d", str(calib_dir), "--nodes_to_quantize", ".*",
         "--report_json", str(work / "branch16k.json"), "--calibration_method", args.method, *excluded],
        capture_output=True, text=True,
    )  # fmt: skip
    results["branch"] = {"exit": done.returncode, "last_line": (done.stderr or done.stdout).strip().splitlines()[-1]}
    if done.returncode == 0:
        spliced = _splice(model, "then_branch", onnx.load(work / "branch16k.int8.onnx"))
        onnx.save(spliced, work / "silero_vad.int8-branch.onnx")
        int8 = _session(str(work / "silero_vad.int8-branch.onnx"))
        got, _ = _run(int8, eval_audio)
        results["branch"] |= {
            "decision_agreement": float(np.mean((got > 0.5) == (ref > 0.5))),
            "max_abs": float(np.abs(got - ref).max()),
            "mean_abs": float(np.abs(got - ref).mean()),
        }
        sessions = {"fp32": fp32, "int8_branch": int8}
        times: dict[str, list[float]] = {name: [] for name in sessions}
        feed = eval_feeds[len(eval_feeds) // 2]
        for _ in range(args.rounds):
            for name, session in sessions.items():
                tick = time.perf_counter()
                session.run(None, feed)
                times[name].append(time.perf_counter() - tick)
        results["latency_us"] = {name: round(statistics.median(t) * 1e6, 1) for name, t in times.items()}
    print(json.dumps(results, indent=1))
    (
        work / f"results-{args.method}{'-excl' if args.exclude else ''}{'-target' if args.target else ''}.json"
    ).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
