"""INT8 on PP-OCRv4's text detector and recognizer and on magika, from their PyPI wheels (never running their code).

``prepare`` (needs Pillow and numpy: a venv of its own, ``python -m venv V && V/bin/pip install pillow numpy``)
fetches ``rapidocr-onnxruntime==1.4.4``, ``scikit-image``, ``matplotlib`` and ``magika==1.0.3`` with
``pip download --no-deps`` into the cache, unzips the detector (DB: Conv, BatchNormalization, ConvTranspose, Sigmoid)
and the recognizer (CTC, ``[N, T, 6625]`` softmax, its characters in the model's metadata), and writes the inputs:

- detector: the 22 scikit-image sample photos at 640x480, with 3-6 lines of text (DejaVuSans from matplotlib's wheel,
  words from Python's LICENSE.txt) drawn on all but ``text`` and ``page``; calibration: the first 2, held out: 20;
- recognizer: 65 text-line crops (the same words on photo backgrounds), height 48, padded to 320; calibration 5,
  held out 60; ``rec_texts.json`` the rendered strings;
- magika: the beginning and end bytes (1024 each, as magika's feature extraction) of 71 of Python's own files of
  44 kinds; calibration 22, held out 49.

``eval KIND FLOAT QUANT DATA.npz...`` (the project's venv) prints the task metrics against the float model: det:
probability-map cosine (median, worst) and FP32's boxes (p > 0.3, 8-connected components of >= 10 pixels) matched at
IoU >= 0.5; rec: CTC greedy strings identical (and equal to the rendered text); magika: top-1 agreement; generic:
rel L2 and cosine of all outputs together.

    V/bin/python experiments/int8_ocr.py prepare [CACHE]
    python experiments/int8_ocr.py eval det CACHE/det.onnx det.int8.onnx CACHE/det_calib.npz CACHE/det_hold.npz
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from collections import deque
from pathlib import Path

import numpy as np

with contextlib.suppress(ImportError):  # prepare: Pillow (its own venv); eval: ONNX Runtime (the project's venv)
    from PIL import Image, ImageDraw, ImageFont
with contextlib.suppress(ImportError):
    import onnx
    import onnxruntime as ort

HERE = Path(os.environ.get("ONNXPREC_CACHE", Path.home() / ".cache" / "onnxprec")) / "int8fix"
WHEELS = ("rapidocr-onnxruntime==1.4.4", "scikit-image", "matplotlib", "magika==1.0.3")
MEMBERS = {
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx": "det.onnx",
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx": "rec.onnx",
    "magika/models/standard_v3_3/model.onnx": "magika.onnx",
}


def fetch() -> None:
    """The wheels (pip download --no-deps) and the files this experiment reads from them."""
    wheels = HERE / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
                    *WHEELS], check=True)  # fmt: skip
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member in MEMBERS:
                    (HERE / MEMBERS[member]).write_bytes(archive.read(member))
                elif member.startswith(("skimage/data/", "matplotlib/mpl-data/fonts/ttf/DejaVuSans")):
                    archive.extract(member, HERE)


DATA = HERE / "skimage" / "data"
FONT = HERE / "matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf"
PYLIB = Path(os.__file__).parent
rng = random.Random(0)

PHOTOS = [
    "astronaut",
    "text",
    "brick",
    "camera",
    "cell",
    "chelsea",
    "clock_motion",
    "coffee",
    "coins",
    "color",
    "grass",
    "gravel",
    "horse",
    "hubble_deep_field",
    "ihc",
    "logo",
    "moon",
    "motorcycle_left",
    "page",
    "retina",
    "rocket",
    "motorcycle_right",
]


def load(name):
    path = next(iter(glob.glob(str(DATA / f"{name}.*"))))
    return Image.open(path).convert("RGB")


def text_lines():
    words = re.findall(r"[A-Za-z0-9][A-Za-z0-9.,:'()-]*", (PYLIB / "LICENSE.txt").read_text())
    words += re.findall(r"[A-Za-z][A-Za-z0-9_]*", (PYLIB / "this.py").read_text())
    out = []
    while len(out) < 400:
        n = rng.randint(1, 4)
        i = rng.randrange(len(words) - n)
        line = " ".join(words[i : i + n])
        if 3 <= len(line) <= 24:
            out.append(line)
    return out


LINES = text_lines()


def contrast(img, box):
    region = np.asarray(img.crop(box).convert("L"), dtype=np.float32)
    return (0, 0, 0) if region.mean() > 110 else (255, 255, 255)


def overlay(img, count):
    draw = ImageDraw.Draw(img)
    w, h = img.size
    for _ in range(count):
        size = rng.randint(max(14, h // 30), max(20, h // 12))
        font = ImageFont.truetype(str(FONT), size)
        line = rng.choice(LINES)
        tw, th = draw.textbbox((0, 0), line, font=font)[2:]
        if tw >= w - 4:
            continue
        x, y = rng.randint(2, w - tw - 2), rng.randint(2, h - th - 2)
        draw.text((x, y), line, font=font, fill=contrast(img, (x, y, x + tw, y + th)))
    return img


def det_input(img, size=(640, 480)):
    arr = np.asarray(img.resize(size, Image.BILINEAR), dtype=np.float32)[:, :, ::-1]  # BGR as the package reads
    return ((arr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def rec_input(crop, width=320):
    w, h = crop.size
    rw = min(width, int(np.ceil(48 * w / h)))
    arr = np.asarray(crop.resize((rw, 48), Image.BILINEAR), dtype=np.float32)[:, :, ::-1]
    out = np.zeros((3, 48, width), np.float32)
    out[:, :, :rw] = ((arr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def rec_crop(photo, line):
    size = rng.randint(22, 40)
    font = ImageFont.truetype(str(FONT), size)
    probe = ImageDraw.Draw(photo)
    _, _, x1, y1 = probe.textbbox((0, 0), line, font=font)
    pad = rng.randint(3, 8)
    w, h = x1 + 2 * pad, y1 + 2 * pad
    W, H = photo.size
    scale = max(1.0, w / (W - 2), h / (H - 2))
    if scale > 1:
        photo = photo.resize((int(W * scale) + 2, int(H * scale) + 2))
        W, H = photo.size
    x, y = rng.randint(0, W - w), rng.randint(0, H - h)
    crop = photo.crop((x, y, x + w, y + h)).copy()
    ImageDraw.Draw(crop).text((pad, pad), line, font=font, fill=contrast(crop, (0, 0, w, h)))
    return crop


def prepare():
    fetch()
    photos = {name: load(name) for name in PHOTOS}
    det = []
    for name in PHOTOS:
        img = photos[name].copy()
        if name not in ("text", "page"):
            img = overlay(img, rng.randint(3, 6))
        det.append(det_input(img))
    det = np.stack(det)
    np.savez(HERE / "det_calib.npz", x=det[:2])
    np.savez(HERE / "det_hold.npz", x=det[2:])
    crops, texts = [], []
    for i in range(65):
        photo = photos[PHOTOS[i % len(PHOTOS)]]
        line = LINES[i]
        crops.append(rec_input(rec_crop(photo, line)))
        texts.append(line)
    crops = np.stack(crops)
    np.savez(HERE / "rec_calib.npz", x=crops[:5])
    np.savez(HERE / "rec_hold.npz", x=crops[5:])
    (HERE / "rec_texts.json").write_text(json.dumps(texts))
    # magika: Python's own files of many kinds
    kinds = [
        "py",
        "txt",
        "json",
        "xml",
        "html",
        "css",
        "js",
        "c",
        "h",
        "cfg",
        "ini",
        "pem",
        "wav",
        "png",
        "gif",
        "zip",
        "gz",
        "bz2",
        "xz",
        "tar",
        "so",
        "pyc",
        "csv",
        "sh",
        "bat",
        "ps1",
        "toml",
        "rst",
        "svg",
        "ico",
        "jpg",
        "tcl",
        "mo",
        "whl",
        "exe",
        "aiff",
        "au",
        "pck",
        "plist",
        "xpm",
        "nsh",
        "tst",
        "dat",
        "md",
    ]
    files = []
    for kind in kinds:
        found = sorted(p for p in PYLIB.rglob(f"*.{kind}") if p.is_file() and p.stat().st_size > 64)
        rng.shuffle(found)
        files += found[:2]
    rng.shuffle(files)
    feats = np.stack([magika_features(p.read_bytes()) for p in files])
    np.savez(HERE / "magika_calib.npz", bytes=feats[:22])
    np.savez(HERE / "magika_hold.npz", bytes=feats[22:])
    (HERE / "magika_files.json").write_text(json.dumps([str(p) for p in files]))
    print(det.shape, crops.shape, feats.shape)


def magika_features(content, beg=1024, end=1024, pad=256, block=4096):
    small = len(content) <= block
    head = content[:block]
    tail = content[-block:]
    head = head.strip() if small else head.lstrip()
    tail = tail.strip() if small else tail.rstrip()
    b = list(head[:beg]) + [pad] * max(0, beg - len(head))
    e = [pad] * max(0, end - len(tail)) + list(tail[-end:] if len(tail) >= end else tail)
    return np.array(b + e, dtype=np.int32)


def session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(path, x, name, batch):
    s = session(path)
    return np.concatenate([s.run(None, {name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def components(mask):
    labels = np.zeros(mask.shape, np.int32)
    boxes = []
    h, w = mask.shape
    for y0, x0 in zip(*np.nonzero(mask)):
        if labels[y0, x0]:
            continue
        n = len(boxes) + 1
        labels[y0, x0] = n
        q = deque([(y0, x0)])
        ys, xs = [y0], [x0]
        while q:
            y, x = q.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not labels[yy, xx]:
                        labels[yy, xx] = n
                        q.append((yy, xx))
                        ys.append(yy)
                        xs.append(xx)
        if len(ys) >= 10:
            boxes.append((min(ys), min(xs), max(ys) + 1, max(xs) + 1))
        else:
            boxes.append(None)
    return [b for b in boxes if b is not None]


def iou(a, b):
    y0, x0, y1, x1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0, y1 - y0) * max(0, x1 - x0)
    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def cos(a, b):
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def rel_l2(a, b):
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)


def det(ref, out):
    matched = total = 0
    for r, o in zip(ref[:, 0], out[:, 0]):
        rb, ob = components(r > 0.3), components(o > 0.3)
        total += len(rb)
        matched += sum(any(iou(a, b) >= 0.5 for b in ob) for a in rb)
    c = cos(ref, out)
    return {
        "cos_median": round(float(np.median(c)), 4),
        "cos_min": round(float(c.min()), 4),
        "rel_l2_median": round(float(np.median(rel_l2(ref, out))), 4),
        "boxes": f"{matched}/{total}",
        "boxes_pct": round(100 * matched / max(total, 1), 1),
    }


def chars():
    m = onnx.load(str(HERE / "rec.onnx"), load_external_data=False)
    c = next(p.value for p in m.metadata_props if p.key == "character").split("\n")
    return ["<blank>", *c, " "]


def decode(probs, table):
    out = []
    for seq in probs.argmax(-1):
        keep = [k for i, k in enumerate(seq) if k != 0 and (i == 0 or k != seq[i - 1])]
        out.append("".join(table[k] for k in keep))
    return out


def rec(ref, out, offset):
    table = chars()
    a, b = decode(ref, table), decode(out, table)
    texts = json.loads((HERE / "rec_texts.json").read_text())[offset : offset + len(a)]
    same = sum(x == y for x, y in zip(a, b))
    step = float((ref.argmax(-1) == out.argmax(-1)).mean())
    return {
        "same": f"{same}/{len(a)}",
        "same_pct": round(100 * same / len(a), 1),
        "step_agree": round(step, 4),
        "fp32_vs_truth": f"{sum(x == t for x, t in zip(a, texts))}/{len(a)}",
        "quant_vs_truth": f"{sum(x == t for x, t in zip(b, texts))}/{len(a)}",
        "cos_median": round(float(np.median(cos(ref, out))), 4),
        "diffs": [(x, y) for x, y in zip(a, b) if x != y][:6],
    }


def magika(ref, out):
    agree = float((ref.argmax(-1) == out.argmax(-1)).mean())
    return {"top1": round(agree, 4), "n": len(ref), "rel_l2_median": round(float(np.median(rel_l2(ref, out))), 4)}


def evaluate(kind: str, ref_model: str, model: str, *datas: str) -> None:
    result = {}
    for data in datas:
        arrays = np.load(data)
        name = arrays.files[0]
        x = arrays[name]
        batch = 4 if kind == "det" else 16
        if kind == "generic":
            feeds = {k: arrays[k] for k in arrays.files}
            ref, out = (session(p).run(None, feeds)[0] for p in (ref_model, model))
        else:
            ref, out = run(ref_model, x, name, batch), run(model, x, name, batch)
        tag = Path(data).stem
        if kind == "det":
            result[tag] = det(ref, out)
        elif kind == "rec":
            result[tag] = rec(ref, out, 0 if "calib" in tag else 5)
        elif kind == "magika":
            result[tag] = magika(ref, out)
        else:
            flat = lambda a: a.reshape(1, -1)  # noqa: E731
            result[tag] = {
                "rel_l2": round(float(rel_l2(flat(ref), flat(out))[0]), 4),
                "cos": round(float(cos(flat(ref), flat(out))[0]), 5),
                "rel_l2_max": round(float(rel_l2(ref, out).max()), 4),
                "cos_min": round(float(cos(ref, out).min()), 5),
                "top1": round(
                    float((ref.reshape(len(ref), -1).argmax(-1) == out.reshape(len(out), -1).argmax(-1)).mean()), 4
                ),
            }
    print(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        if len(sys.argv) > 2:
            HERE = Path(sys.argv[2])
        HERE.mkdir(parents=True, exist_ok=True)
        prepare()
    else:
        evaluate(*sys.argv[2:])
