"""FP8 against ModelOpt 0.47 on magika-v3.3 and MiniLM-L6 on held-out sets larger than the corpus's, in ONNX Runtime.

The corpus judges magika on 63 files and MiniLM on 64 sentences, where one flip or one sentence's minimum is a single
draw. This study measures the same models (both tools' defaults, as ``experiments/fp8_spec.py`` builds them) on
larger held-out sets, paired sample by sample:

- magika: the features of up to ``--files`` files of this machine (``/usr``, ``/etc``, the project's venv: sources,
  texts, shared libraries, executables, images, archives, ...), at most ``--per-type`` per file suffix, none whose
  features equal a corpus calibration row. Readings: top-1 agreement with the float model, the samples only one tool
  keeps (McNemar's exact two-sided p), rel L2 of the probabilities, and the KL divergence from the float
  probabilities (mean, 99th percentile).
- MiniLM: the distinct docstring sentences of CPython's standard library (the corpus's held-out half first, then the
  other half), tokenized as the corpus does (padded to 32), none equal to one of the 8 calibration sentences of
  ``../shared/models``. Readings per sentence: cosine of the pooled embedding, of the real tokens, of all positions;
  their minimum, 1st percentile and mean, the count under 0.99, the sentences where one tool is closer (sign test,
  ties counted apart), and each tool's lowest sentence with every tool's cosine on it.

Both in ORT's CPU provider with optimizations off, as the corpus judges FP8; ``onnxprec_fp32`` is onnxprec's FP8 with
an FP32 remainder (``--high_precision_dtype fp32``), beside its default FP16 one. ``minilm_spec`` runs onnxprec's and
ModelOpt's default MiniLM under ``onnx.reference`` instead. Each mode's results are merged into ``--out`` (the other
modes' results there are kept); the note beside it says what the numbers mean.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import math
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from benchmarks.corpus import merged_npz, run_outputs
from experiments.fp8_minilm_padding import FLOAT as MINILM
from experiments.fp8_modelopt import CORPUS, MODELS, RESULTS, note_header
from onnxprec.quantization.fp8 import quantize_file
from onnxprec.quantization.fp8.modelopt_test import _modelopt

Feeds = dict[str, np.ndarray]
ROOTS = ("/usr/lib", "/usr/share", "/usr/include", "/usr/bin", "/etc", "/root/.pyenv", "/work/main/.venv")


def _files(limit: int, per_type: int) -> Iterator[Path]:
    """Regular files under :data:`ROOTS` in sorted order, at most ``per_type`` per suffix, ``limit`` in all."""
    counts: dict[str, int] = {}
    taken = 0
    for root in ROOTS:
        for path in sorted(Path(root).rglob("*")):
            if taken >= limit:
                return
            try:
                if not path.is_file() or path.is_symlink() or path.stat().st_size < 16:
                    continue
            except OSError:
                continue
            kind = path.suffix.lower() or "<none>"
            if counts.get(kind, 0) >= per_type:
                continue
            counts[kind] = counts.get(kind, 0) + 1
            taken += 1
            yield path


def magika_features(paths: Iterator[Path], beg: int = 1024, end: int = 1024, pad: int = 256) -> np.ndarray:
    """The corpus's magika features (``zoo/_corpus_inputs.r_magika``) of each readable file."""
    rows = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        head, tail = data[:4096].lstrip(), data[-4096:].rstrip()
        b = list(head[:beg]) + [pad] * max(0, beg - len(head))
        e = [pad] * max(0, end - len(tail)) + list(tail[-end:])
        rows.append(b + e)
    return np.asarray(rows, np.int32)


def _mcnemar(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p (binomial on the discordant pairs)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def magika(work: Path, log: Callable[[str], None], files: int, per_type: int) -> dict[str, object]:
    folder = CORPUS / "magika-v3.3"
    model, calib = folder / "model.onnx", folder / "calib"
    data = merged_npz(calib, work / "magika_calib.npz")
    with np.load(data) as z:
        feeds = {k: z[k] for k in z.files}
    name = next(iter(feeds))
    seen = {row.tobytes() for row in feeds[name]}
    x = magika_features(_files(files, per_type))
    x = np.unique(x[[row.tobytes() not in seen for row in x]], axis=0)
    log(f"magika: {len(x)} held-out files")
    heldout = [{name: x[i : i + 64]} for i in range(0, len(x), 64)]
    models = {"onnxprec": work / "magika.fp8.onnx", "modelopt": _modelopt(model, feeds, data, work)}
    quantize_file(model, models["onnxprec"], calibration_data=str(calib))
    models["onnxprec_fp32"] = work / "magika.fp8_fp32.onnx"
    quantize_file(model, models["onnxprec_fp32"], calibration_data=str(calib), high_precision_dtype="fp32")
    ref = np.concatenate([next(iter(o.values())) for o in run_outputs(model, heldout)]).astype(np.float64)
    top = ref.argmax(-1)
    out: dict[str, object] = {"samples": len(x), "classes_float_top1": len(set(top.tolist()))}
    keeps = {}
    for tool, path in models.items():
        got = np.concatenate([next(iter(o.values())) for o in run_outputs(path, heldout, optimize=False)])
        got = got.astype(np.float64)
        keeps[tool] = got.argmax(-1) == top
        kl = (ref * (np.log(np.clip(ref, 1e-12, None)) - np.log(np.clip(got, 1e-12, None)))).sum(-1)
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        out[tool] = {"top1": int(keeps[tool].sum()), "rel_l2": round(rel, 5),
                     "kl_mean": float(f"{kl.mean():.3g}"), "kl_p99": float(f"{np.percentile(kl, 99):.3g}")}  # fmt: skip
        log(f"magika {tool} {out[tool]}")
    only_ours = int((keeps["onnxprec"] & ~keeps["modelopt"]).sum())
    only_mo = int((keeps["modelopt"] & ~keeps["onnxprec"]).sum())
    out["only_onnxprec"], out["only_modelopt"] = only_ours, only_mo
    out["mcnemar_p"] = float(f"{_mcnemar(only_ours, only_mo):.2g}")
    return out


def sentences(limit: int) -> list[str]:
    """CPython's docstring sentences as the corpus splits them: the held-out half (odd files) first, then the other."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(lib.glob("*.py"))
    ordered = [f for i, f in enumerate(files) if i % 2] + [f for i, f in enumerate(files) if not i % 2]
    out: list[str] = []
    for f in ordered:
        try:
            doc = ast.get_docstring(ast.parse(f.read_text(errors="replace"))) or ""
        except (SyntaxError, ValueError):
            continue
        for s in " ".join(doc.split()).replace("? ", ". ").split(". "):
            s = s.strip()
            if 20 <= len(s) <= 200 and s.isascii() and not s.startswith((">>>", "...")):
                out.append(s)
    return list(dict.fromkeys(out))[:limit]


def minilm_batches(
    texts: list[str], calibration: Feeds, length: int = 32, step: int = 64
) -> tuple[list[Feeds], list[str]]:
    """``texts`` tokenized as the corpus does, those equal to a calibration row left out, in batches of ``step``; and
    the texts kept."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CORPUS.parent / "resources" / "tokenizer.json"))
    tok.enable_truncation(length)
    tok.enable_padding(length=length)
    enc = tok.encode_batch(texts)
    ids = np.asarray([e.ids for e in enc], np.int64)
    mask = np.asarray([e.attention_mask for e in enc], np.int64)
    seen = {tuple(int(t) for t in row[row != 0]) for row in calibration["input_ids"]}
    keep = np.asarray([tuple(int(t) for t in row[row != 0]) not in seen for row in ids])
    ids, mask = ids[keep], mask[keep]
    batches = [{"input_ids": ids[i : i + step], "attention_mask": mask[i : i + step],
                "token_type_ids": np.zeros_like(ids[i : i + step])} for i in range(0, len(ids), step)]  # fmt: skip
    return batches, [t for t, k in zip(texts, keep) if k]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def minilm_cosines(ref: np.ndarray, got: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per sentence: pooled (masked mean), tokens (its real tokens flattened), all (its 32 positions flattened)."""
    m = mask[..., None].astype(np.float64)
    pooled = _cos((ref * m).sum(1) / m.sum(1), (got * m).sum(1) / m.sum(1))
    tokens = _cos((ref * m).reshape(len(ref), -1), (got * m).reshape(len(ref), -1))
    every = _cos(ref.reshape(len(ref), -1), got.reshape(len(ref), -1))
    return {"pooled": pooled, "tokens": tokens, "all": every}


def _minilm_setup(work: Path, n: int, anchors: tuple[str, ...]) -> tuple[dict[str, Path], list[Feeds], list[str]]:
    """The FP8 models (onnxprec's default, ModelOpt's ``anchors``: ``modelopt`` its default, ``modelopt_max``), the
    held-out batches and their sentences; the calibration data is ``work / "minilm_calibration.npz"``."""
    with np.load(MODELS / "minilm_l6_v2_bert_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    data = work / "minilm_calibration.npz"
    np.savez(data, **feeds)
    heldout, texts = minilm_batches(sentences(n), feeds)
    extra = {"modelopt": (), "modelopt_max": ("--calibration_method", "max")}
    models = {"onnxprec": work / "minilm.fp8.onnx"} | {
        a: _modelopt(MINILM, feeds, data, work, extra[a]) for a in anchors
    }
    quantize_file(MINILM, models["onnxprec"], calibration_data=str(data))
    return models, heldout, texts


def _summary(values: np.ndarray) -> dict[str, float | int]:
    return {"min": round(float(values.min()), 5), "p1": round(float(np.percentile(values, 1)), 5),
            "mean": round(float(values.mean()), 5), "under_0.99": int((values < 0.99).sum())}  # fmt: skip


def _signs(ours: np.ndarray, theirs: np.ndarray, anchor: str) -> dict[str, float | int]:
    """Sentences where onnxprec's cosine is higher, lower and equal; the sign test's p over the first two."""
    closer, further = int((ours > theirs).sum()), int((ours < theirs).sum())
    return {"onnxprec": closer, anchor: further, "ties": int(len(ours) - closer - further),
            "sign_p": float(f"{_mcnemar(closer, further):.2g}")}  # fmt: skip


def _minilm_readings(
    models: dict[str, Path], heldout: list[Feeds], texts: list[str], engine: str, log: Callable[[str], None]
) -> dict[str, object]:
    """Each model's cosines under ``engine`` (``ort``: ORT's CPU provider, optimizations off; ``spec``:
    ``onnx.reference``) against the float model in ORT, their summaries, signs and lowest sentences."""
    from experiments.fp8_spec import outputs

    ref = np.concatenate([o["last_hidden_state"] for o in run_outputs(MINILM, heldout)]).astype(np.float64)
    mask = np.concatenate([f["attention_mask"] for f in heldout])
    out: dict[str, object] = {"sentences": len(ref), "engine": engine}
    cos = {}
    for tool, path in models.items():
        got = np.concatenate([o["last_hidden_state"] for o in outputs(path, heldout, engine)])
        cos[tool] = minilm_cosines(ref, got.astype(np.float64), mask)
        out[tool] = {k: _summary(v) for k, v in cos[tool].items()}
        log(f"minilm {engine} {tool} {out[tool]}")
    for anchor in (a for a in ("modelopt", "modelopt_max") if a in cos):
        for kind in ("pooled", "tokens", "all"):
            out[f"closer_than_{anchor}/{kind}"] = _signs(cos["onnxprec"][kind], cos[anchor][kind], anchor)
    for kind in ("tokens", "all"):  # each tool's lowest sentence, and every tool's cosine on it
        out[f"lowest/{kind}"] = {
            tool: {
                "sentence": texts[i][:60],
                "tokens": int(mask[i].sum()),
                "cosines": {t: round(float(c[kind][i]), 5) for t, c in cos.items()},
            }
            for tool, cs in cos.items()
            for i in [int(np.argmin(cs[kind]))]
        }
    return out


def minilm(work: Path, log: Callable[[str], None], n: int) -> dict[str, object]:
    models, heldout, texts = _minilm_setup(work, n, ("modelopt", "modelopt_max"))
    models["onnxprec_fp32"] = work / "minilm.fp8_fp32.onnx"
    data = str(work / "minilm_calibration.npz")
    quantize_file(MINILM, models["onnxprec_fp32"], calibration_data=data, high_precision_dtype="fp32")
    return _minilm_readings(models, heldout, texts, "ort", log)


def minilm_spec(work: Path, log: Callable[[str], None], n: int) -> dict[str, object]:
    """onnxprec's and ModelOpt's default FP8 MiniLM on the same sentences under ``onnx.reference`` (``spec`` of
    ``experiments/fp8_spec.py``: the golden the issue names), against the float model in ORT."""
    models, heldout, texts = _minilm_setup(work, n, ("modelopt",))
    return _minilm_readings(models, heldout, texts, "spec", log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="magika,minilm", help="magika, minilm, minilm_spec (slow: about 25 min)")
    ap.add_argument("--files", type=int, default=3000, help="magika: files read (before duplicates are dropped)")
    ap.add_argument("--per-type", type=int, default=80, help="magika: files per suffix at most")
    ap.add_argument("--sentences", type=int, default=2048, help="MiniLM: held-out sentences")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{dt.date.today():%Y-%m-%d}-fp8-wide-heldout.json",
                    help="results file: each mode's results replace its own there, the others are kept")  # fmt: skip
    args = ap.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    wanted = args.models.split(",")
    header = note_header("experiments.fp8_wide_heldout")
    results |= header  # the last run's; each mode also keeps its own build and command
    results |= {f"note/{mode}": header for mode in wanted}
    with tempfile.TemporaryDirectory() as tmp:
        if "magika" in wanted:
            results["magika"] = magika(Path(tmp), print, args.files, args.per_type)
        if "minilm" in wanted:
            results["minilm"] = minilm(Path(tmp), print, args.sentences)
        if "minilm_spec" in wanted:
            results["minilm_spec"] = minilm_spec(Path(tmp), print, args.sentences)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
