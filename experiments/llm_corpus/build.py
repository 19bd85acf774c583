"""Builds the LLM corpus: tiny random-weight decoders of every architecture onnxruntime-genai's builder supports
that transformers can instantiate offline from a config, each exported four ways. Cached outside git in
``$ONNXPREC_LLM_CORPUS`` or ``<zoo>/llm_corpus`` (``~/.cache/onnxprec/zoo/llm_corpus``)::

    python -m experiments.llm_corpus build [--archs A ...] [--exporters E ...] [--force]

Per architecture ``<corpus>/<arch>/``: ``hf/`` (config + safetensors + tokenizer, ``_torch_side.py``), then

  builder_fp32  ``onnxruntime_genai.models.builder -p fp32 -e cpu`` (torch venv)
  builder_fp16  ``... -p fp16 -e cuda``
  torch         ``torch.onnx.export`` with past_key_values inputs (dynamo, else TorchScript; ``_torch_side.py``)
  optimum       ``optimum.exporters.onnx.main_export(task="text-generation-with-past")`` (Optimum venv)

plus ``synthetic/onnx/model.onnx``, a KV decoder written without torch (``synthetic.py``), the model CI sweeps.

each in ``<arch>/<exporter>/model.onnx``, with ``<exporter>.status.json`` (ok, or the first line of the failure)
and ``<exporter>.check.json`` (ORT logits against transformers' on ``<corpus>/ids.npy``). ``manifest.json`` sums it
up. An exporter whose status exists is skipped unless ``--force``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo import ZOO_DIR, ensure_torch_venv

from ._venvs import ensure_optimum_venv
from .synthetic import build_kv_decoder

logger = logging.getLogger(__name__)

CORPUS_DIR = Path(os.environ.get("ONNXPREC_LLM_CORPUS", ZOO_DIR / "llm_corpus")).expanduser()
TOKENIZER_SRC = ZOO_DIR / "genai" / "smollm2_hf"  # python -m zoo build genai/smollm2_fp32 makes it
TORCH_SIDE = Path(__file__).resolve().parent / "_torch_side.py"
EXPORTERS = ("builder_fp32", "builder_fp16", "torch", "optimum")
BUILDER_ARGS = {"builder_fp32": ("-p", "fp32", "-e", "cpu"), "builder_fp16": ("-p", "fp16", "-e", "cuda")}
TIMEOUT_S = 900
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
_OPTIMUM = (
    "import sys; from optimum.exporters.onnx import main_export; "
    "main_export(sys.argv[1], output=sys.argv[2], task='text-generation-with-past', do_validation=False)"
)


def archs() -> list[str]:
    """Architecture names of the corpus, read from ``_torch_side.ARCHS`` without importing torch."""
    for node in ast.parse(TORCH_SIDE.read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "ARCHS":
            assert isinstance(node.value, ast.Dict)
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError(f"no ARCHS in {TORCH_SIDE}")


def error_line(log: str) -> str:
    """The line that says why a run failed: its last exception line, else its last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        head = ln.split(":", 1)[0]
        if ln == "AssertionError" and i > 0:  # a bare assert: the failing line is the statement above it
            return f"AssertionError: {lines[i - 1]}"[:400]
        if head.endswith(("Error", "Exception", "Interrupt")) or head == "SystemExit":
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


def _status(path: Path, **fields: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fields, indent=1) + "\n")
    os.replace(tmp, path)


def _run_into(cmd: Sequence[str | Path], arch_dir: Path, kind: str, env: dict[str, str]) -> bool:
    """Runs ``cmd`` (``{out}`` in it: a temp folder), logs it to ``<kind>.log``, moves the folder to ``<kind>/`` on
    success and writes ``<kind>.status.json``."""
    out, status, log = arch_dir / kind, arch_dir / f"{kind}.status.json", arch_dir / f"{kind}.log"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    args = [str(c).replace("{out}", str(tmp)) for c in cmd]
    try:
        with open(log, "w") as f:
            rc = subprocess.run(args, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        rc = -9
        with open(log, "a") as f:
            f.write(f"\nTimeoutError: killed after {TIMEOUT_S} s\n")
    seconds = round(time.perf_counter() - t0, 1)
    if rc == 0 and (tmp / "model.onnx").exists():
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        _status(status, ok=True, seconds=seconds)
        return True
    shutil.rmtree(tmp, ignore_errors=True)
    why = error_line(log.read_text(errors="replace")) if rc else "exit 0 but no model.onnx written"
    _status(status, ok=False, error=why, exit=rc, seconds=seconds)
    return False


def build(names: Sequence[str] = (), exporters: Sequence[str] = EXPORTERS, force: bool = False) -> dict[str, Any]:
    """Builds the corpus (architectures ``names``, all when empty) and returns the manifest."""
    all_archs = archs()
    unknown = sorted(set(names) - set(all_archs)) + sorted(set(exporters) - set(EXPORTERS))
    if unknown:
        raise ValueError(f"unknown architecture/exporter {unknown}; known: {all_archs} and {list(EXPORTERS)}")
    names = list(names) or all_archs
    corpus = build_synthetic(CORPUS_DIR)
    torch_py = ensure_torch_venv()
    env = {**os.environ, **_OFFLINE}

    def todo(kind: str) -> list[str]:
        return [a for a in names if force or not (corpus / a / f"{kind}.status.json").exists()]

    if hf := todo("hf"):
        if not (TOKENIZER_SRC / "tokenizer.json").exists():
            raise RuntimeError(f"no SmolLM2 tokenizer in {TOKENIZER_SRC}: run python -m zoo build genai")
        for a in hf:
            shutil.rmtree(corpus / a / "hf", ignore_errors=True)
        tok_env = {**env, "ONNXPREC_CORPUS_TOKENIZER": str(TOKENIZER_SRC)}
        subprocess.run([torch_py, TORCH_SIDE, "hf", corpus, *hf], env=tok_env, check=True)
    ok_hf = [a for a in names if json.loads((corpus / a / "hf.status.json").read_text())["ok"]]
    for exporter in [e for e in exporters if e in BUILDER_ARGS]:
        for a in [a for a in todo(exporter) if a in ok_hf]:
            cmd = [torch_py, "-m", "onnxruntime_genai.models.builder", "-i", corpus / a / "hf", "-o", "{out}"]
            cmd += ["-c", corpus / ".builder-cache", *BUILDER_ARGS[exporter]]
            ok = _run_into(cmd, corpus / a, exporter, env)
            logger.info("%s/%s: %s", a, exporter, "ok" if ok else "FAILED")
    if "torch" in exporters and (tt := [a for a in todo("torch") if a in ok_hf]):
        with open(corpus / "torch_export.log", "w") as f:
            subprocess.run([torch_py, TORCH_SIDE, "export", corpus, *tt], env=env, stdout=f, stderr=subprocess.STDOUT)
    if "optimum" in exporters and (oo := [a for a in todo("optimum") if a in ok_hf]):
        opt_py = ensure_optimum_venv()
        for a in oo:
            cmd = [opt_py, "-c", _OPTIMUM, corpus / a / "hf", "{out}"]
            ok = _run_into(cmd, corpus / a, "optimum", env)
            logger.info("%s/optimum: %s", a, "ok" if ok else "FAILED")
    checks = [f"{a}/{e}" for a in names for e in exporters if (corpus / a / e / "model.onnx").exists()]
    checks = [c for c in checks if force or not (corpus / f"{c}.check.json").exists()]
    if checks:
        with open(corpus / "check.log", "w") as f:
            cmd = [torch_py, TORCH_SIDE, "check", corpus, *checks]
            subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    manifest = collect(corpus)
    _status(corpus / "manifest.json", **manifest)
    return manifest


def build_synthetic(corpus: Path) -> Path:
    """The part of the corpus that needs no torch: ``ids.npy`` and ``synthetic/onnx/model.onnx``
    (:func:`synthetic.build_kv_decoder`). Returns ``corpus``."""
    corpus.mkdir(parents=True, exist_ok=True)
    if not (corpus / "ids.npy").exists():
        np.save(corpus / "ids.npy", np.random.default_rng(0).integers(17, 512, (8, 64), dtype=np.int64))
    if not (corpus / "synthetic" / "onnx" / "model.onnx").exists():
        build_kv_decoder(corpus / "synthetic" / "onnx" / "model.onnx")
    return corpus


def collect(corpus: Path = CORPUS_DIR) -> dict[str, Any]:
    """``{arch: {"hf": status, exporter: status + check}}`` from the status files on disk."""
    out: dict[str, Any] = {}
    for a in [*archs(), "synthetic"]:
        row: dict[str, Any] = {}
        if a == "synthetic" and (corpus / a / "onnx" / "model.onnx").exists():
            row["onnx"] = {"ok": True}
        for kind in ("hf", *EXPORTERS):
            st = corpus / a / f"{kind}.status.json"
            if not st.exists():
                continue
            entry = {k: v for k, v in json.loads(st.read_text()).items() if k != "trace"}
            chk = corpus / a / f"{kind}.check.json"
            if chk.exists():
                c = json.loads(chk.read_text())
                entry["check"] = c.get("ort_vs_torch_rel_l2") if c["ok"] else f"failed: {c['error']}"
            row[kind] = entry
        if row:
            out[a] = row
    return out


def markdown(manifest: dict[str, Any]) -> str:
    """arch x exporter: ok with the ORT-vs-transformers logits rel L2, or the first line of the failure."""
    lines = ["| arch | " + " | ".join(EXPORTERS) + " |", "|---" * (len(EXPORTERS) + 1) + "|"]
    for arch, row in manifest.items():
        cells = []
        for e in EXPORTERS:
            st = row.get(e) or ({"ok": False, "error": row["hf"].get("error", "")} if "hf" in row else None)
            if st is None:
                cells.append("")
            elif not st["ok"]:
                cells.append("FAIL: " + _brief(st.get("error", "")))
            else:
                chk = st.get("check")
                note = f" ({chk:.1e})" if isinstance(chk, float) else f" (check {_brief(chk)})" if chk else ""
                cells.append("ok" + note)
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _brief(error: str) -> str:
    """A table cell's failure: no colour codes, ORT's status message only, no pipes, 110 characters."""
    error = re.sub(r"\x1b\[[0-9;]*m|\[\d+m", "", error).split("Status Message: ")[-1]
    return error.replace("failed: ", "").replace("|", "/").strip()[:110]


def models(corpus: Path = CORPUS_DIR) -> list[str]:
    """``arch/exporter`` of every built corpus model (``synthetic/onnx``: the torch-free one)."""
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in corpus.glob("*/*/model.onnx"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.llm_corpus build", description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="*", default=[], help="architectures (default: all)")
    ap.add_argument("--exporters", nargs="*", default=list(EXPORTERS), choices=EXPORTERS)
    ap.add_argument("--force", action="store_true", help="rebuild what exists, failures included")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        manifest = build(a.archs, a.exporters, a.force)
    except (ValueError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(manifest))
    print(f"manifest: {CORPUS_DIR / 'manifest.json'}")
    return 0
