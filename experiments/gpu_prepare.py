"""``python -m experiments.gpu_prepare --out DIR``: the models for the GPU latency run, in bundles small enough to move.

For each model it writes ``<model>/fp32.onnx`` (the zoo model), ``<model>/<tool>.onnx`` (each tool's
conversion, made here on the CPU machine with the same runner and flags as the benchmark) and
``<model>/inputs.npz`` (the real inputs), then packs all files into ``bundle-NN/`` folders of at most
``chunk_bytes`` each (files larger than that are split into ``.partNN`` pieces). Every bundle holds the same
``manifest.json`` (file sizes, SHA-256, where each piece is). ``experiments/gpu_latency.py DIR`` reassembles and
checks them.

SmolLM2 (652 MB FP32) is not bundled by default: its GPU row is made by converting on the GPU machine.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import zoo
from benchmarks.output_metrics import external_files
from benchmarks.proc import run_measured
from benchmarks.tools import TOOLS, python_for, tool_command

from .gpu_latency import MANIFEST, sha256

logger = logging.getLogger(__name__)


def variant_name(tool: str) -> str:
    """File stem of a tool's model in the GPU folder (``onnxprec:inf`` -> ``onnxprec_inf``)."""
    return tool.replace(":", "_")


def stage(out: Path, models: list[str], tools: list[str], zoo_dir: Path | None = None) -> Path:
    """Writes the unbundled folder ``out/stage`` (models, converted models, inputs); returns it."""
    staged = out / "stage"
    anchors = None
    if any(TOOLS[t].venv == "anchors" for t in tools):
        from zoo.anchors_env import ensure_anchor_venv

        anchors = ensure_anchor_venv()
    for model in models:
        src = zoo.model_path(model, zoo_dir)
        folder = staged / model
        folder.mkdir(parents=True, exist_ok=True)
        model_proto = onnx.load(str(src), load_external_data=False)
        if external_files(model_proto, src.parent):
            raise ValueError(f"{model}: external-data models are not supported by gpu-prepare")
        shutil.copyfile(src, folder / "fp32.onnx")
        with open(folder / "inputs.npz", "wb") as f:
            np.savez(f, **zoo.inputs(model, zoo_dir))  # type: ignore[arg-type]
        for tool in tools:
            spec = TOOLS[tool]
            dst = folder / f"{variant_name(tool)}.onnx"
            cmd = tool_command(spec, python_for(spec, anchors), src, dst, folder / "inputs.npz")
            res = run_measured(cmd, out / "logs" / f"{model}-{variant_name(tool)}.txt", timeout_s=1800, cwd=folder)
            if res.status != "ok" or not dst.exists():
                logger.error("%s %s: %s\n%s", model, tool, res.status, "\n".join(res.log_tail))
                dst.unlink(missing_ok=True)
                continue
            logger.info("%s %s: %.1f s", model, tool, res.wall_s)
    return staged


def bundle(staged: Path, out: Path, chunk_bytes: int) -> list[Path]:
    """Packs the files of ``staged`` into ``out/bundle-NN`` folders of at most ``chunk_bytes``."""
    files = sorted(p for p in staged.rglob("*") if p.is_file())
    pieces: list[tuple[Path, str, int, int]] = []  # (source, piece name, offset, length)
    manifest: dict[str, dict[str, Any]] = {}
    for p in files:
        rel = p.relative_to(staged).as_posix()
        size = p.stat().st_size
        manifest[rel] = {"bytes": size, "sha256": sha256(p), "pieces": []}
        if size <= chunk_bytes:
            pieces.append((p, rel, 0, size))
        else:
            for i, off in enumerate(range(0, size, chunk_bytes)):
                pieces.append((p, f"{rel}.part{i:02d}", off, min(chunk_bytes, size - off)))
    bundles: list[list[tuple[Path, str, int, int]]] = []
    sizes: list[int] = []
    for piece in sorted(pieces, key=lambda x: -x[3]):  # first fit, largest first
        for i, used in enumerate(sizes):
            if used + piece[3] <= chunk_bytes:
                bundles[i].append(piece)
                sizes[i] += piece[3]
                break
        else:
            bundles.append([piece])
            sizes.append(piece[3])
    dirs = []
    for i, content in enumerate(bundles):
        d = out / f"bundle-{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for src, name, off, length in content:
            target = d / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as fin, open(target, "wb") as fout:
                fin.seek(off)
                fout.write(fin.read(length))
            rel = src.relative_to(staged).as_posix()
            manifest[rel]["pieces"].append({"bundle": d.name, "name": name, "offset": off})
        dirs.append(d)
    for d in dirs:
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return dirs


def prepare(
    out: Path, models: list[str], tools: list[str], chunk_bytes: int = 60_000_000, zoo_dir: Path | None = None
) -> list[Path]:
    """Stages and bundles; returns the bundle folders (each at most ``chunk_bytes`` plus its manifest)."""
    out = out.resolve()  # the tools run with cwd= the model's folder: relative paths would break
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("bundle-*")):
        raise ValueError(f"{out} already holds bundles: use an empty folder")
    staged = stage(out, models, tools, zoo_dir)
    dirs = bundle(staged, out, chunk_bytes)
    shutil.rmtree(staged)
    total = sum(p.stat().st_size for d in dirs for p in d.rglob("*") if p.is_file())
    logger.info("%d bundles, %.1f MB in all, in %s", len(dirs), total / 1e6, out)
    print(
        f"Move each of {out}/bundle-NN (<= {chunk_bytes / 1e6:.0f} MB) to the same folder DIR on the GPU machine, "
        "then run: python experiments/gpu_latency.py DIR --out experiments/results/gpu-<date>.json",
        file=sys.stderr,
    )
    return dirs


def main(argv: list[str] | None = None) -> int:
    import argparse

    from benchmarks.tools import expand_models, parse_tools

    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (bundle-NN/ subfolders)")
    ap.add_argument("--models", default="minilm_l6_v2,efficientnet_lite0", help="zoo models, comma separated")
    ap.add_argument("--tools", default="onnxprec,modelopt,occ_fp16", help="tool ids, comma separated")
    ap.add_argument("--chunk-mb", type=float, default=60.0, help="largest bundle (default 60 MB)")
    ap.add_argument("--zoo-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        models = expand_models(a.models.split(","))
        tools = parse_tools(a.tools.split(","))
        for b in prepare(a.out, models, tools, chunk_bytes=int(a.chunk_mb * 1e6), zoo_dir=a.zoo_dir):
            print(b)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
