"""FP8 against ModelOpt 0.47's ``--quantize_mode fp8`` on MiniLM-L6 and EfficientNet-Lite0: the Q/DQ placement on
every node input, and the accuracy on held-out inputs.

Both tools calibrate on the inputs in ``../shared/models`` (MiniLM: 8 sentences; EfficientNet-Lite0: 7 photos), with
their defaults (onnxprec: the accuracy guard on; ModelOpt: ``--calibration_eps cpu``, run on a copy, its result
cached as ``fp8/modelopt_test.py`` caches it). Held out: for MiniLM the corpus's ``paraphrase-minilm-l3`` held-out
texts (64 sentences, the same BERT uncased vocabulary, ``token_type_ids`` 0); for EfficientNet-Lite0 the 29 images
of ``experiments/int8_effnet.py images``. Both FP8 models run in ONNX Runtime's CPU provider with graph optimizations
off (docs/tools/fp8.md says why), the float model with them on.

Per node input (node, input index) the results file says whether each model reads it through a DequantizeLinear,
and for each difference why: ``fp8/modelopt_test.py``'s ``EXPLAINED``, or the layers onnxprec's guard kept float.
Accuracy per model on the held-out set: relative L2 of the first output (all rows), the cosine of each row (min and
mean: a sentence's hidden states, an image's logits) and top-1 agreement (EfficientNet-Lite0); for MiniLM also the
cosine over each sentence's real tokens (its padding, which no reader uses, left out) and of its mean-pooled embedding.

    ~/.cache/onnxprec/torch-venv/bin/python experiments/int8_effnet.py images effnet_heldout.npy
    python -m experiments.fp8_modelopt --effnet-heldout effnet_heldout.npy
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx

from onnxprec._ort import create_session
from onnxprec.errors import AccuracyGuardError
from onnxprec.quantization.fp8 import quantize_file
from onnxprec.quantization.fp8.modelopt_test import EXPLAINED, _modelopt, placement

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT.parent / "shared" / "models"
CORPUS = Path.home() / ".cache" / "onnxprec" / "corpus" / "models"
RESULTS = ROOT / "experiments" / "results"


def minilm_heldout(folder: Path) -> list[dict[str, np.ndarray]]:
    """The corpus text encoder's held-out batches with the zero ``token_type_ids`` MiniLM-L6's export reads."""
    out = []
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as z:
            feeds = {k: z[k].astype(np.int64) for k in z.files}
        feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
        out.append(feeds)
    return out


def accuracy(reference: Path, model: Path, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, float]:
    """First output against the float model's over every batch: rel L2, cosine per row (min, mean), top-1. With an
    ``attention_mask`` also the cosine of each sentence's real tokens (its padding left out: no reader uses it) and
    of its mean-pooled embedding (sentence-transformers' pooling, over the real tokens)."""
    float_session = create_session(str(reference), optimization="all")
    fp8_session = create_session(str(model), optimization="none")
    refs, gots, tokens, pooled = [], [], [], []
    for feeds in batches:
        ref = np.asarray(float_session.run(feeds)[0], np.float64)
        got = np.asarray(fp8_session.run(feeds)[0], np.float64)
        refs.append(ref.reshape(len(ref), -1))
        gots.append(got.reshape(refs[-1].shape))
        for i, mask in enumerate(np.asarray(feeds.get("attention_mask", []), bool)):
            tokens.append(_cosine(ref[i][mask].ravel(), got[i][mask].ravel()))
            pooled.append(_cosine(ref[i][mask].mean(0), got[i][mask].mean(0)))
    a, b = np.concatenate(refs), np.concatenate(gots)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    out = {"rows": len(a), "rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(a)),
           "cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
           "top1": float(np.mean(a.argmax(1) == b.argmax(1)))}  # fmt: skip
    if tokens:
        out.update(tokens_cosine_min=min(tokens), tokens_cosine_mean=float(np.mean(tokens)),
                   pooled_cosine_min=min(pooled), pooled_cosine_mean=float(np.mean(pooled)))  # fmt: skip
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def compare(case: str, model: Path, feeds: dict[str, np.ndarray], heldout: list[dict[str, np.ndarray]],
            work: Path) -> dict[str, object]:  # fmt: skip
    data = work / f"{case}_calibration.npz"
    np.savez(data, **feeds)  # type: ignore[arg-type]
    ours = work / f"{case}.fp8.onnx"
    refused = None
    try:
        report = quantize_file(model, ours, calibration_data=str(data))
    except AccuracyGuardError as error:  # written for inspection: its placement and accuracy are still compared
        report, refused = error.report, str(error).split(";")[0]  # type: ignore[assignment]
    guarded = sorted(entry.name for entry in report.layers if entry.mode == "float")
    theirs = _modelopt(model, feeds, data, work)
    a, b = placement(ours), placement(theirs)
    ops = {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    inputs = []
    for node, index in sorted(set(a) | set(b)):
        mine, mo = bool(a.get((node, index))), bool(b.get((node, index)))
        why = ""
        if mine != mo:
            why = EXPLAINED[case].get((node, index), "kept float by onnxprec's accuracy guard" if node in guarded
                                      else "UNEXPLAINED")  # fmt: skip
        inputs.append({"node": node, "op": ops.get(node, "?"), "input": index, "onnxprec": mine, "modelopt": mo,
                       "why": why})  # fmt: skip
    return {
        "node_inputs": len(inputs),
        "quantized_both": sum(i["onnxprec"] and i["modelopt"] for i in inputs),
        "differences": [i for i in inputs if i["onnxprec"] != i["modelopt"]],
        "guard_float_layers": guarded,
        "refused": refused,
        "heldout": {"onnxprec": accuracy(model, ours, heldout), "modelopt": accuracy(model, theirs, heldout)},
        "calibration": {"onnxprec": accuracy(model, ours, [feeds]), "modelopt": accuracy(model, theirs, [feeds])},
        "inputs": inputs,
    }


def note_header(module: str) -> dict[str, object]:
    """The head of a results note: its kind, date, build (git HEAD) and command line (``python -m module ...``)."""
    build = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    return {
        "kind": "note",  # not a table's run (benchmarks/report_common.load_results)
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "build": build.strip(),
        "command": f"python -m {module} " + " ".join(sys.argv[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--effnet-heldout", type=Path, required=True, help="experiments/int8_effnet.py images' output")
    ap.add_argument("--minilm-heldout", type=Path, default=CORPUS / "paraphrase-minilm-l3" / "heldout")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{dt.date.today():%Y-%m-%d}-fp8-modelopt.json")
    args = ap.parse_args()
    with np.load(MODELS / "minilm_l6_v2_bert_inputs.npz") as z:
        minilm = {k: z[k] for k in z.files}
    effnet_model = MODELS / "efficientnet_lite0.onnx"
    effnet_input = onnx.load(str(effnet_model), load_external_data=False).graph.input[0].name
    effnet = {effnet_input: np.load(MODELS / "efficientnet_lite0_input.npy")}
    images = np.load(args.effnet_heldout)
    results = note_header("experiments.fp8_modelopt")
    with tempfile.TemporaryDirectory() as tmp:
        results["minilm"] = compare("minilm", MODELS / "minilm_l6_v2_bert.onnx", minilm,
                                    minilm_heldout(args.minilm_heldout), Path(tmp))  # fmt: skip
        one_each = [{effnet_input: images[i : i + 1]} for i in range(len(images))]
        results["efficientnet"] = compare("efficientnet", effnet_model, effnet, one_each, Path(tmp))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    for case in ("minilm", "efficientnet"):
        r = results[case]
        assert isinstance(r, dict)
        print(f"{case}: {r['node_inputs']} node inputs, {r['quantized_both']} quantized by both, "
              f"{len(r['differences'])} differ; guard kept float: {r['guard_float_layers']}; "
              f"refused: {r['refused']}")  # fmt: skip
        for d in r["differences"]:
            print(f"  {d['node']} input {d['input']} ({d['op']}): onnxprec {d['onnxprec']}, ModelOpt {d['modelopt']}"
                  f" — {d['why']}")  # fmt: skip
        for split in ("calibration", "heldout"):
            for tool in ("onnxprec", "modelopt"):
                m = r[split][tool]
                tokens = "".join(f" {k} {m[f'{k}_cosine_min']:.5f}/{m[f'{k}_cosine_mean']:.5f}"
                                 for k in ("tokens", "pooled") if f"{k}_cosine_min" in m)  # fmt: skip
                print(f"  {split} {tool}: rows {m['rows']} rel L2 {m['rel_l2']:.4f} cosine min {m['cosine_min']:.5f} "
                      f"mean {m['cosine_mean']:.5f} top1 {m['top1']:.3f}{tokens}")  # fmt: skip
    print("wrote", args.out)


if __name__ == "__main__":
    main()
