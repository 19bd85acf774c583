"""GPU inference latency of FP32 and converted models with ONNX Runtime's CUDAExecutionProvider.

A script (it never imports the ``benchmarks`` package); it needs onnxruntime-gpu, onnx, onnx-ir, ml_dtypes and
onnxprec's runtime layer (:mod:`onnxprec._ort`, :mod:`onnxprec.metrics`). Where onnxprec is not installed it is
imported from this checkout's ``src/`` (``pip install -e .`` would bring the CPU onnxruntime, which overwrites
onnxruntime-gpu's files):

    python experiments/gpu_latency.py DIR [--out gpu-<date>.json] [--batches 1,full] [--iters 300]

DIR holds one folder per model: ``<model>/fp32.onnx``, any number of ``<model>/<variant>.onnx`` (onnxprec,
modelopt, occ_fp16...) and ``<model>/inputs.npz`` (real inputs, batch first). If DIR holds ``bundle-NN``
folders from ``python -m experiments.gpu_prepare`` they are first reassembled (and checked against their
SHA-256) into ``DIR/assembled``.

Per model and batch size, every variant gets its own session with inputs and outputs bound on the GPU (IO
binding: no host copies in the timed region), ``--warmup`` untimed runs, then ``--rounds`` rounds that each
time ``--iters / --rounds`` single runs of every variant in turn, so that clock and thermal drift hit all
variants alike; median, p10, p90 of single runs in ms. The outputs are then compared with FP32's (relative
L2, max abs). The card comes from ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    from onnxprec import _ort, metrics
    from onnxprec._io import write_atomically
except ImportError:  # not installed on the GPU machine: this checkout's sources
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from onnxprec import _ort, metrics
    from onnxprec._io import write_atomically

MANIFEST = "manifest.json"


def assemble(root: Path) -> Path:
    """Rebuilds the files of ``root/bundle-*`` into ``root/assembled``; returns that folder."""
    bundles = sorted(p for p in root.glob("bundle-*") if p.is_dir())
    manifest: dict[str, Any] = json.loads((bundles[0] / MANIFEST).read_text())
    out = root / "assembled"
    for rel, info in manifest.items():
        target = out / rel
        if target.exists() and target.stat().st_size == info["bytes"] and sha256(target) == info["sha256"]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            for piece in sorted(info["pieces"], key=lambda p: p["offset"]):
                src = root / piece["bundle"] / piece["name"]
                if not src.exists():
                    raise FileNotFoundError(f"{src} is missing: move every bundle-NN folder into {root}")
                f.seek(piece["offset"])
                f.write(src.read_bytes())
        if sha256(target) != info["sha256"]:
            raise ValueError(f"{target}: SHA-256 mismatch after reassembly")
    return out


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file (also what gpu-prepare writes into the manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def card_info() -> dict[str, str]:
    """GPU name and driver from nvidia-smi ('unknown' without it)."""
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        first = res.stdout.strip().splitlines()[0]
        name, driver, mem = (x.strip() for x in first.split(","))
        return {"card": name, "driver": driver, "memory": mem}
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return {"card": "unknown", "driver": "unknown", "memory": "unknown"}


class Bound:
    """A session with its inputs and outputs bound on the device (IO binding on the session
    :func:`onnxprec._ort.create_session` made: ``Session.run`` copies through the host on every call)."""

    def __init__(self, path: Path, feeds: dict[str, np.ndarray], provider: str) -> None:
        ort = _ort.import_onnxruntime()
        session = _ort.create_session(path, providers=[provider], optimization="all", what=path.name)
        self.sess = session.inner
        self.providers = self.sess.get_providers()
        if provider == "cuda" and self.providers[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"CUDAExecutionProvider unavailable (got {self.providers})")
        self.binding = self.sess.io_binding()
        self._keep = []
        for name, x in session.feeds({k: v for k, v in feeds.items() if k in session.input_types}).items():
            ov = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), provider, 0)
            self._keep.append(ov)
            self.binding.bind_ortvalue_input(name, ov)
        for name in session.output_names:
            self.binding.bind_output(name, provider)

    def run(self) -> None:
        self.sess.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()

    def first_output(self) -> np.ndarray:
        return np.asarray(self.binding.copy_outputs_to_cpu()[0], dtype=np.float32)


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


def _batch(feeds: dict[str, np.ndarray], batch: str) -> dict[str, np.ndarray]:
    if batch == "full":
        return feeds
    n = int(batch)
    return {k: v[:n] for k, v in feeds.items()}


def time_model(folder: Path, batches: list[str], warmup: int, iters: int, rounds: int, provider: str) -> dict[str, Any]:
    """All variants of one model folder, FP32 first; {variant: {"file", "providers", "batches": {...}}}."""
    with np.load(folder / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    paths = sorted(folder.glob("*.onnx"), key=lambda p: (p.stem != "fp32", p.stem))
    result: dict[str, Any] = {p.stem: {"file": p.name, "bytes": p.stat().st_size, "batches": {}} for p in paths}
    for batch in batches:
        f = _batch(feeds, batch)
        key = str(next(iter(f.values())).shape[0])
        bound: dict[str, Bound] = {}
        for p in paths:
            try:
                b = Bound(p, f, provider)
                for _ in range(warmup):
                    b.run()
                bound[p.stem] = b
                result[p.stem]["providers"] = b.providers
            except Exception as e:
                result[p.stem]["batches"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"  {folder.name}/{p.stem} batch {key}: {e}", file=sys.stderr)
        per_round = max(1, iters // rounds)
        times = time_alternating({k: b.run for k, b in bound.items()}, rounds, dict.fromkeys(bound, per_round))
        ref = bound["fp32"].first_output() if "fp32" in bound else None
        for k, b in bound.items():
            r = latency_stats(times[k])
            if ref is not None:
                errors = metrics.compare(ref, b.first_output())
                r["rel_l2"] = errors["rel_l2"]
                r["max_abs"] = errors["max_abs"]
            result[k]["batches"][key] = r
            print(f"  {folder.name}/{k} batch {key}: {r['median_ms']:.3f} ms", file=sys.stderr)
        del bound
    return result


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="model folders (or bundle-NN folders from gpu-prepare)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default gpu-<date>.json in cwd)")
    ap.add_argument("--models", nargs="*", default=None, help="only these model folders")
    ap.add_argument("--batches", default="1,full", help="comma-separated: numbers and/or 'full' (default 1,full)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--iters", type=int, default=300, help="timed runs per variant and batch (default 300)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--provider", choices=["cuda", "cpu"], default="cuda", help="cpu: only to test this script")
    a = ap.parse_args(args_list)
    ort = _ort.import_onnxruntime()

    if a.provider == "cuda" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from the nvidia-* pip packages (onnxruntime-gpu >= 1.21)

    root = a.dir
    models_dir = assemble(root) if any(root.glob("bundle-*")) else root
    folders = sorted(p for p in models_dir.iterdir() if p.is_dir() and (p / "inputs.npz").exists())
    if a.models:
        folders = [p for p in folders if p.name in a.models]
    if not folders:
        print(f"error: no model folders with inputs.npz in {models_dir}", file=sys.stderr)
        return 2
    now = dt.datetime.now().astimezone()
    info = card_info() if a.provider == "cuda" else {"card": "CPU (test)", "driver": "-", "memory": "-"}
    out: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        **info,
        "provider": a.provider,
        "onnxruntime": ort.__version__,
        "available_providers": ort.get_available_providers(),
        "command": "python experiments/gpu_latency.py " + shlex.join(args_list),
        "warmup": a.warmup,
        "iters": a.iters,
        "rounds": a.rounds,
        "models": {},
    }
    print(f"{info['card']}: onnxruntime {ort.__version__}", file=sys.stderr)
    for folder in folders:
        out["models"][folder.name] = time_model(
            folder, [b.strip() for b in a.batches.split(",") if b.strip()], a.warmup, a.iters, a.rounds, a.provider
        )
    path = a.out or Path(f"gpu-{now:%Y-%m-%d-%H%M}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(out, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
