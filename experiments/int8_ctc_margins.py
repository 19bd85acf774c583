"""The strings a CTC recognizer's step margins predict on calibration runs against those kept on held-out inputs,
for INT8 results that work and for destroyed ones: the evidence for the guard's sequence bound
(``onnxprec/quantization/guard.py``, :class:`onnxprec.accuracy.StepMargins`).

Each candidate (``MODEL:TAG=PATH`` of a quantized model, e.g. a corpus cell's ``out.onnx``, written even where the
guard refused it) and the float model run on the corpus model's ``calib/`` and ``heldout/`` inputs (ONNX Runtime
CPU, graph optimizations on; off for a tag that names fp8). ``MODEL:noiseX=`` is the float scores plus Gaussian noise
of relative L2 ``X``: a destroyed result where no tool destroys the model. The calibration inputs are split as the
guard splits them (``CalibrationData.held_out``: the last quarter held out): ``fit``, the runs the ranges were fitted
to; ``guard``, the quarter the guard holds out; ``heldout``, the corpus's held-out inputs that judge the result (>=
0.95 of the strings identical, issue 24). On each: the share of identical strings seen, and the shares predicted
from the margins of every step (``all_steps``, the guard's prediction before it counted only the steps that can
change a string) and of the steps whose flip to their runner-up changes the decoded string (``string_steps``).

    python experiments/int8_ctc_margins.py --arrays /tmp/ctc-arrays --out experiments/results/X.json \
        ddddocr-rec:int8=cells/ddddocr-rec/int8/<key>/out.onnx ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from benchmarks import corpus  # noqa: E402
from onnxprec.accuracy import StepMargins, ctc_strings  # noqa: E402

CORPUS = Path.home() / ".cache/onnxprec/corpus"


def scores(model: str, split: str, path: Path, tag: str, arrays: Path) -> np.ndarray:
    """The model's ``[N, T, C]`` scores on a split (cached under ``arrays``)."""
    cached = arrays / f"{model}.{split}.{tag}.npy"
    if cached.exists():
        return np.load(cached).astype(np.float32)
    layout = json.loads((CORPUS / "manifest.json").read_text())["models"][model]["metric_options"]["layout"]
    outputs = corpus.run_outputs(path, corpus.batches(CORPUS / "models" / model / split), optimize="fp8" not in tag)
    joined = np.concatenate([next(iter(o.values())) for o in outputs], axis=1 if layout == "TNC" else 0)
    joined = joined.transpose(1, 0, 2) if layout == "TNC" else joined
    arrays.mkdir(parents=True, exist_ok=True)
    np.save(cached, joined)
    return joined.astype(np.float32)


def judged(ref: np.ndarray, cand: np.ndarray, blank: int = 0) -> dict[str, Any]:
    """Seen and predicted shares of identical strings of ``[N, T, C]`` scores."""
    seen = np.mean([a == b for a, b in zip(ctc_strings(ref, 1, blank), ctc_strings(cand, 1, blank))])
    every, strings = StepMargins(), StepMargins(blank)
    every.update(ref, cand, 1)
    strings.update(ref, cand, 1)
    rel_l2 = float(np.linalg.norm(cand - ref) / np.linalg.norm(ref))
    return {"n": len(ref), "seen": float(seen), "all_steps": every.predicted(), "string_steps": strings.predicted(),
            "rel_l2": rel_l2}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="+", help="MODEL:TAG=PATH")
    parser.add_argument("--arrays", type=Path, required=True, help="folder caching every model's scores")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for spec in args.candidates:
        key, path = spec.split("=", 1)
        model, tag = key.split(":", 1)
        float_path = CORPUS / "models" / model / "model.onnx"
        ref = {s: scores(model, s, float_path, "ref", args.arrays) for s in ("calib", "heldout")}
        if tag.startswith("noise"):  # synthetic: the float scores plus Gaussian noise of this relative L2
            rng, level = np.random.default_rng(0), float(tag[5:])
            cand = {s: r + rng.standard_normal(r.shape).astype(np.float32) * level * np.sqrt(np.mean(r**2))
                    for s, r in ref.items()}  # fmt: skip
        else:
            cand = {s: scores(model, s, Path(path), tag, args.arrays) for s in ("calib", "heldout")}
        cut = len(ref["calib"]) - len(ref["calib"]) // 4
        row = {"model": model, "candidate": tag, "path": path,
               "fit": judged(ref["calib"][:cut], cand["calib"][:cut]),
               "guard": judged(ref["calib"][cut:], cand["calib"][cut:]),
               "heldout": judged(ref["heldout"], cand["heldout"])}  # fmt: skip
        rows.append(row)
        fit, held = row["fit"], row["heldout"]
        print(f"{model:13s} {tag:22s} fit({fit['n']}) seen {fit['seen']:.3f} all {fit['all_steps']:.4f} "
              f"strings {fit['string_steps']:.4f} | heldout({held['n']}) seen {held['seen']:.3f} "
              f"rel L2 {held['rel_l2']:.3f}", flush=True)  # fmt: skip
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
