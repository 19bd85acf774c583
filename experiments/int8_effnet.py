"""EfficientNet-Lite0 INT8 accuracy on images the calibration never saw, and CPU latency against FP32.

``images`` (needs Pillow, scikit-image and scikit-learn: the torch venv) writes the held-out set: the 15 other photos
shipped in scikit-image's data folder (hubble_deep_field, ihc, retina, motorcycle_right, horse, brick, grass, gravel,
camera, coins, moon, page, cell, color, logo; grey ones as RGB) and two off-centre crops (60 %, top-left and
bottom-right) of each of the 7 calibration photos, preprocessed as ``../shared/zoo/effnet_lite0.py`` does.
``eval`` prints, for each candidate, the rel L2 of the logits against FP32 (all images together and the worst
image) and the top-1 agreement on the 7 calibration images and on the held-out set, one image per run.
``decompose`` prints, for each candidate, the same errors with some of its activation Q/DQ pairs bypassed (the
DequantizeLinear's readers read the QuantizeLinear's input): all of them (the INT8 weights alone), or those of the
ReLU6 outputs, the project-Conv outputs or the residual Adds.
``latency`` runs FP32 and the candidates in one process, 2 threads, batch 1, alternating rounds, and prints the
median of the per-round ratios.

    ~/.cache/onnxprec/torch-venv/bin/python experiments/int8_effnet.py images heldout.npy
    python experiments/int8_effnet.py eval --heldout heldout.npy INT8.onnx [...]
    python experiments/int8_effnet.py decompose --heldout heldout.npy INT8.onnx [...]
    python experiments/int8_effnet.py latency INT8.onnx [...]
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import tempfile
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
FP32 = MODELS / "efficientnet_lite0.onnx"
CALIBRATION = MODELS / "efficientnet_lite0_input.npy"
NEW = ("hubble_deep_field.jpg", "ihc.png", "retina.jpg", "motorcycle_right.png", "horse.png", "brick.png",
       "grass.png", "gravel.png", "camera.png", "coins.png", "moon.png", "page.png", "cell.png", "color.png",
       "logo.png")  # fmt: skip


def images(out: str) -> None:
    import skimage  # type: ignore[import-not-found]
    import sklearn  # type: ignore[import-not-found]
    from PIL import Image  # type: ignore[import-not-found]

    sk = Path(skimage.__file__).parent / "data"
    sl = Path(sklearn.__file__).parent / "datasets" / "images"
    mean = np.array([0.485, 0.456, 0.406], np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], np.float32) * 255

    def prep(im: Image.Image, box: tuple[int, int, int, int] | None = None) -> np.ndarray:
        im = im.convert("RGB")
        w, h = im.size
        s = min(w, h)
        box = box or ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        pixels = np.asarray(im.crop(box).resize((224, 224), Image.BICUBIC), np.float32)
        return ((pixels - mean) / std).transpose(2, 0, 1)

    batch = [prep(Image.open(sk / f)) for f in NEW]
    seen = [sk / f for f in ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png")]
    for path in [*seen, sl / "china.jpg", sl / "flower.jpg"]:
        im = Image.open(path)
        w, h = im.size
        s = int(min(w, h) * 0.6)
        batch += [prep(im, (0, 0, s, s)), prep(im, (w - s, h - s, w, h))]
    np.save(out, np.stack(batch).astype(np.float32))


OPTIMIZE = True
"""ONNX Runtime's graph optimizations (eval --no_optimizations: Q/DQ computed as written, for emulations)."""


def _session(path: str | Path, threads: int = 1):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    if not OPTIMIZE:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _logits(path: str | Path, x: np.ndarray) -> np.ndarray:
    session = _session(path)
    return np.concatenate([session.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))])


def evaluate(candidates: list[str], heldout: str) -> None:
    sets = {"calibration 7": np.load(CALIBRATION), f"held out {os.path.basename(heldout)}": np.load(heldout)}
    reference = {k: _logits(FP32, x) for k, x in sets.items()}
    for path in candidates:
        parts = []
        for k, x in sets.items():
            got, ref = _logits(path, x), reference[k]
            rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            worst = (np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)).max()
            top1 = int((got.argmax(1) == ref.argmax(1)).sum())
            parts.append(f"{k}: rel L2 {rel:.4f} (worst image {worst:.4f}), top-1 {top1}/{len(x)}")
        print(f"{path}: " + " | ".join(parts), flush=True)


DECOMPOSITION = {
    "weights alone": "",
    "ReLU6 outputs float": "Clip",
    "project outputs float": "project_conv",
    "residual Adds float": "/Add",
    "project outputs and residual Adds float": "project_conv|/Add",
}


def bypassed(path: str, pattern: str, out: str) -> None:
    """Writes ``path`` with the activation Q/DQ pairs whose float input matches ``pattern`` (re.search) removed."""
    import onnx

    model = onnx.load(path)
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    renamed, dropped = {}, []
    for node in graph.node:
        q = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if (
            q is not None
            and q.op_type == "QuantizeLinear"
            and node.input[0] not in constants
            and re.search(pattern, q.input[0])
        ):
            renamed[node.output[0]] = q.input[0]
            dropped += [id(node), id(q)]
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    for node in graph.node:
        node.input[:] = [renamed.get(x, x) for x in node.input]
    onnx.save(model, out)


def decompose(candidates: list[str], heldout: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for path in candidates:
            for label, pattern in DECOMPOSITION.items():
                out = os.path.join(tmp, f"{Path(path).stem}, {label}.onnx")
                bypassed(path, pattern, out)
                evaluate([out], heldout)


def latency(candidates: list[str], rounds: int = 25, runs: int = 20) -> None:
    from onnxprec._latency import time_alternating  # here: `images` runs in the torch venv, without onnxprec

    x = np.load(CALIBRATION)[:1]
    paths = [str(FP32), *candidates]
    sessions = [_session(p, threads=2) for p in paths]
    latencies = time_alternating([functools.partial(s.run, None, {"input": x}) for s in sessions], rounds, runs=runs,
                                 warmup=5)  # fmt: skip
    for path, ratio in zip(paths[1:], latencies.ratios()[1:]):
        print(f"{path}: {ratio:.3f}x FP32 (median of {rounds} rounds of {runs} runs, 2 threads, batch 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("images").add_argument("out")
    ev = sub.add_parser("eval")
    ev.add_argument("--heldout", required=True)
    ev.add_argument("--no_optimizations", action="store_true", help="ONNX Runtime's graph optimizations off")
    ev.add_argument("candidates", nargs="+")
    de = sub.add_parser("decompose")
    de.add_argument("--heldout", required=True)
    de.add_argument("candidates", nargs="+")
    sub.add_parser("latency").add_argument("candidates", nargs="+")
    args = parser.parse_args()
    if args.command == "images":
        images(args.out)
    elif args.command == "eval":
        global OPTIMIZE
        OPTIMIZE = not args.no_optimizations
        evaluate(args.candidates, args.heldout)
    elif args.command == "decompose":
        decompose(args.candidates, args.heldout)
    else:
        latency(args.candidates)


if __name__ == "__main__":
    main()
