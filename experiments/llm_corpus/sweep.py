"""The LLM sweep: every onnxprec tool on every model of the corpus (``build.py``), judged the same way for all.

    python -m experiments.llm_corpus sweep [--models GLOB ...] [--tools T ...] [--feeds ids|full] [--jobs N]
                                          [--timeout S] [--out DIR] [--json OUT] [--md OUT]
    python -m experiments.llm_corpus sweep --measure-bounds     # once: bounds.json from the zoo's smollm2_135m
    python -m experiments.llm_corpus sweep --measure-own-error  # once: each architecture's own FP16/BF16 error

**Data.** ``<corpus>/ids.npy`` (8 windows of 64 random ids < 512, seed 0): windows 0-3 calibrate, 4-7 evaluate.
``--feeds ids`` (default, the path users take) gives the tools ``.npz`` files that hold only ``input_ids``;
``--feeds full`` adds the attention mask, the positions and empty past KV, completed by this sweep.

**Tools.** AutoCast fp16 and bf16 (``--keep_io_types``); INT4 rtn, awq_lite and gptq, each as qdq and matmulnbits
(``mnb``); preprocess; evaluate (perplexity of the eval windows); dump (``--dump_float``); compare (the model
against its AutoCast fp16 output, or against itself when that failed); genai (builder models: load in
onnxruntime-genai on the CPU and generate 8 tokens, in the torch venv). Each case (the tool's command line, as
``onnxprec.cli`` runs it, then the judging) runs in a worker process with a timeout.

**Passing.** The tool exits 0; its output model runs in ONNX Runtime (CPU; where ORT lacks a BF16 kernel,
``onnx.reference`` runs it, and a model with com.microsoft ops is skipped, saying why) on the eval windows with
the inputs completed; the relative L2 error of its logits against the float model's, on the same inputs, is
within the bound the same tool meets on our own SmolLM2-135M export (``bounds.json``, made by
``--measure-bounds``; AutoCast's at least twice the architecture's own FP16/BF16 error in transformers,
``--measure-own-error``; AWQ's and GPTQ's at least RTN's). For builder models the output must also generate in
onnxruntime-genai. evaluate passes when its perplexity equals the one computed here from the float logits (rel.
1e-3); dump when its dumped logits equal them (rel. L2 1e-4; FP16 logits 2^-10); compare when it reports a finite
logits error within the fp16 bound.
AutoCast of an FP16 model (fp16: its FP32 islands; bf16: FP16 -> BF16) is judged like any other, against the FP16
model's logits (rows of runs before 2026-11-27, when AutoCast refused FP16 models in one line, stay skips). A float
model that ONNX Runtime's CPU provider cannot run (the builder's FP16 GroupQueryAttention with q/k norm runs on CUDA
only) still gets every tool: a one-line refusal (exit 2) or an output that loads but fails in ORT likewise is a skip
saying why; a crash is a failure. Random weights judge robustness, not accuracy.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import fnmatch
import json
import math
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

from .build import CORPUS_DIR, error_line, models

REPO = Path(__file__).resolve().parents[2]
BOUNDS = Path(__file__).resolve().parent / "bounds.json"
OUT_DIR = ZOO_DIR.parent / "llm_sweep"
INT4 = {
    f"int4_{m}_{f}": (m, fmt)
    for m in ("rtn", "awq_lite", "gptq")
    for f, fmt in (("qdq", "qdq"), ("mnb", "matmulnbits"))
}
MODEL_TOOLS = ("autocast_fp16", "autocast_bf16", *INT4, "preprocess")
TOOLS = (*MODEL_TOOLS, "evaluate", "dump", "compare", "genai")
EXACT = 1e-4  # evaluate's perplexity, dump's logits: same model, same runtime
FP16_EXACT = 2.0**-10  # the same for FP16 logits: one FP16 rounding
FLOOR = {"autocast_fp16": 2.0**-9, "autocast_bf16": 2.0**-6}  # bounds never under two units of the low type
CALIB, EVAL = slice(0, 4), slice(4, 8)
NOT_GENAI = "not a genai folder (no genai_config.json)"
GENAI = os.environ.get("ONNXPREC_SWEEP_GENAI", "1") != "0"  # 0: a host without the torch venv checks no generation
# cuda: every run on the GPU (ORT sessions, the tools' calibration runs, onnxruntime-genai), with onnxruntime-gpu and
# onnxruntime-genai-cuda importable by this Python (the GPU machine has no torch venv): the runs the CPU provider
# cannot make, e.g. GroupQueryAttention with per-head Q/K norms (Qwen3, LFM2 builder FP16).
PROVIDER = os.environ.get("ONNXPREC_SWEEP_PROVIDER", "cpu")

_GENAI = r"""
import json, os, shutil, sys, tempfile
import onnxruntime_genai as og
src, ids = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
with tempfile.TemporaryDirectory() as tmp:
    d = os.path.join(tmp, "m")
    shutil.copytree(src, d)
    path = os.path.join(d, "genai_config.json")
    cfg = json.load(open(path))
    options = [] if sys.argv[3] == "cpu" else [{sys.argv[3]: {}}]
    cfg["model"]["decoder"].setdefault("session_options", {})["provider_options"] = options
    json.dump(cfg, open(path, "w"))
    m = og.Model(d)
    p = og.GeneratorParams(m)
    p.set_search_options(do_sample=False)  # the config's max_length: a sliding window needs that capacity
    g = og.Generator(m, p)
    g.append_tokens(ids)
    n = 0
    while not g.is_done() and n < 8:
        g.generate_next_token()
        n += 1
    print(json.dumps({"generated": n, "sequence": [int(t) for t in g.get_sequence(0)]}))
"""


# ----------------------------------------------------------------------------------------------------------
# inputs and the reference
# ----------------------------------------------------------------------------------------------------------


def kv_layout(model_dir: Path) -> tuple[int | None, int]:
    """(KV head size, past length to feed) from ``genai_config.json`` beside the model, else the HF config of its
    architecture. The past is empty, except where onnxruntime-genai shares one past/present buffer with
    sliding-window layers: their GroupQueryAttention wants the buffer's capacity (``max_length``) as past length."""
    genai = model_dir / "genai_config.json"
    if genai.exists():
        cfg = json.loads(genai.read_text())
        decoder, search = cfg["model"]["decoder"], cfg.get("search", {})
        shared = decoder.get("sliding_window") and search.get("past_present_share_buffer")
        return int(decoder["head_size"]), int(search["max_length"]) if shared else 0
    hf = model_dir.parent / "hf" / "config.json"
    if hf.exists():
        cfg = json.loads(hf.read_text())
        return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]), 0
    return None, 0


def complete(sess: Any, ids: np.ndarray, head: int | None, full: bool = True, past: int = 0) -> dict[str, np.ndarray]:
    """Feeds for ``sess``: the ids, and with ``full`` an all-ones mask, positions and empty past KV (symbolic
    KV heads / head size resolved from the past input's shape and ``head``; ``past`` zero rows where a shared
    buffer needs them, see :func:`kv_layout`)."""
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
    types |= {"tensor(int32)": np.int32, "tensor(bfloat16)": np.float32}
    feeds: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        dtype = types.get(i.type, np.float32)
        if i.name == "input_ids":
            feeds[i.name] = ids.astype(dtype)
        elif not full:
            continue
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones(ids.shape, dtype)
        elif i.name == "position_ids":
            feeds[i.name] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(dtype)
        elif "past" in i.name and len(i.shape) == 4:
            heads = i.shape[1] if isinstance(i.shape[1], int) else None
            size = i.shape[3] if isinstance(i.shape[3], int) else head
            if heads is None or size is None:
                raise ValueError(f"{i.name}: cannot size the KV dims of {i.shape}")
            feeds[i.name] = np.zeros((ids.shape[0], heads, past, size), dtype)
        elif i.name.startswith("past") and all(isinstance(d, int) for d in i.shape[1:]):
            feeds[i.name] = np.zeros((ids.shape[0], *i.shape[1:]), dtype)  # a fixed-size state (LFM2's conv)
        else:
            raise ValueError(f"input {i.name} {i.shape}: not an LLM input this sweep can fill")
    return feeds


def _session(path: Path, rewrites: bool = True) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not rewrites:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if PROVIDER == "cuda":
        return ort.InferenceSession(str(path), so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_logits(path: Path, ids: np.ndarray, head: int | None, past: int = 0) -> tuple[np.ndarray, str]:
    """Logits of ``path`` on ``ids`` (one window at a time) in ORT, or in onnx.reference when ORT has no kernel
    for a type (BF16 on the CPU). Returns (logits float32, runtime name)."""
    try:
        sess = _session(path)
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e):
            raise
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.load(str(path))
        foreign = sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})
        if foreign:
            raise Skip(
                f"ORT has no kernel ({error_line(str(e))[:120]}) and onnx.reference cannot run {foreign} ops"
            ) from None
        ref = ReferenceEvaluator(model)
        out = []
        for w in ids:
            feeds = complete(_RefSess(model), w[None], head, past=past)
            out.append(np.asarray(ref.run(["logits"], feeds)[0], np.float32))
        return np.concatenate(out), "onnx.reference"
    out = [np.asarray(sess.run(["logits"], complete(sess, w[None], head, past=past))[0], np.float32) for w in ids]
    return np.concatenate(out), "onnxruntime"


class Skip(Exception):
    """The output cannot be run here (no runtime for it on this machine); the reason is the message."""


class _RefSess:
    """Looks like an ORT session's ``get_inputs()`` for :func:`complete`, from an ONNX model."""

    class _In:
        def __init__(self, vi: Any) -> None:
            import onnx

            t = vi.type.tensor_type
            self.name = vi.name
            self.type = {onnx.TensorProto.FLOAT: "tensor(float)", onnx.TensorProto.FLOAT16: "tensor(float16)"}.get(
                t.elem_type, "tensor(int64)" if t.elem_type == onnx.TensorProto.INT64 else "tensor(int32)"
            )
            self.shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]

    def __init__(self, model: Any) -> None:
        inits = {i.name for i in model.graph.initializer}
        self._inputs = [self._In(v) for v in model.graph.input if v.name not in inits]

    def get_inputs(self) -> list[Any]:
        return self._inputs


def prepare(model: Path, work: Path, ids: np.ndarray, full: bool) -> dict[str, Any]:
    """Writes ``work/data``: calib.npz and eval.npz (ids only, or completed with ``full``), eval.npy and ref.npy
    (the float model's logits on the eval windows). Returns the model's facts."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    head, past = kv_layout(model.parent)
    sess = _session(model)
    for name, part in (("calib", ids[CALIB]), ("eval", ids[EVAL])):
        np.savez(data / f"{name}.npz", **complete(sess, part, head, full, past))
    np.save(data / "eval.npy", ids[EVAL])
    fp16 = any(o.name == "logits" and o.type == "tensor(float16)" for o in sess.get_outputs())
    facts = {"head": head, "past": past, "genai": (model.parent / "genai_config.json").exists(), "fp16": fp16}
    try:
        logits, _ = run_logits(model, ids[EVAL], head, past)
    except Exception as e:
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        return facts | {"unrunnable": short(error_line(f"{type(e).__name__}: {e}"))[:160]}
    np.save(data / "ref.npy", logits)
    if PROVIDER != "cpu" and fp16:
        facts["spread"] = runtime_spread(model, ids[EVAL], head, past, logits)
    return facts


def runtime_spread(model: Path, ids: np.ndarray, head: int | None, past: int, logits: np.ndarray) -> float:
    """Relative L2 between the float model's logits with and without ORT's graph rewrites: the runtime's own noise
    on the same model. On CUDA in FP16 it is ~1e-3 (fused kernels round differently; LFM2/Qwen3 builder FP16), ten
    times the exactness bound, so the tools that must reproduce the model exactly are judged against 1.5x it."""
    from onnxprec.metrics import rel_l2

    sess = _session(model, rewrites=False)
    plain = [np.asarray(sess.run(["logits"], complete(sess, w[None], head, past=past))[0], np.float64) for w in ids]
    return float(rel_l2(logits.astype(np.float64), np.concatenate(plain)))


def _exact(tol: float, facts: dict[str, Any]) -> float:
    """An exactness bound, widened to 1.5x the runtime's measured spread where one was measured (see above)."""
    return max(tol, 1.5 * facts.get("spread", 0.0))


# ----------------------------------------------------------------------------------------------------------
# one case: a tool on a model, judged
# ----------------------------------------------------------------------------------------------------------


def command(tool: str, model: Path, work: Path) -> tuple[list[str], Path | None]:
    """The tool's command line and its output model (None for tools that write no model), on ``PROVIDER``."""
    argv, out = _command(tool, model, work)
    if PROVIDER != "cpu" and tool != "preprocess":
        argv += ["--calibration_eps" if tool in INT4 else "--providers", PROVIDER]
    return argv, out


def _command(tool: str, model: Path, work: Path) -> tuple[list[str], Path | None]:
    d = work / "data"
    out = work / tool / "model.onnx"
    if tool.startswith("autocast"):
        args = ["autocast", "--onnx_path", model, "--output_path", out, "-t", tool.split("_")[1], "--keep_io_types"]
        if tool == "autocast_bf16" and PROVIDER == "cpu":  # the CPU provider has few BF16 kernels: the rest stay FP32
            args.append("--keep_unsupported_fp32")
        return [*args, "-d", d / "calib.npz"], out
    if tool in INT4:
        method, fmt = INT4[tool]
        args = ["quantize", "int4", "--onnx_path", model, "--output_path", out, "--calibration_method", method]
        return [*args, "--output_format", fmt, "--calibration_data", d / "calib.npz"], out
    if tool == "preprocess":
        return ["preprocess", "--input", model, "--output", out], out
    if tool == "evaluate":
        return ["evaluate", model, "-d", d / "eval.npy", "--report_json", work / tool / "eval.json"], None
    if tool == "dump":
        return [
            "dump",
            "--onnx_path",
            model,
            "-d",
            d / "eval.npz",
            "--dump_float",
            "--output_dir",
            work / tool / "d",
        ], None
    if tool == "compare":
        fp16 = work / "autocast_fp16" / "model.onnx"
        cand = fp16 if fp16.exists() else model
        return ["compare", model, cand, "-d", d / "eval.npz", "--report_json", work / tool / "compare.json"], None
    raise ValueError(tool)


def genai_generate(folder: Path, ids: np.ndarray, timeout: float) -> dict[str, Any]:
    """Loads ``folder`` in onnxruntime-genai (torch venv, CPU; or this Python on ``PROVIDER``) and generates 8
    tokens after ``ids``."""
    prompt = ",".join(str(int(t)) for t in ids[:8])
    python = sys.executable if PROVIDER != "cpu" else str(ensure_torch_venv())
    cmd = [python, "-c", _GENAI, str(folder), prompt, PROVIDER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"onnxruntime-genai: {error_line(res.stderr + res.stdout)}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def judge(
    tool: str, model: Path, work: Path, facts: dict[str, Any], bounds: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """Checks a tool's output; returns ``{"verdict": "pass"|"fail"|"skip", "stage", "error", "rel_l2", ...}``."""
    from onnxprec.metrics import perplexity, rel_l2

    d = work / "data"
    ids = np.load(d / "eval.npy")
    row: dict[str, Any] = {"verdict": "pass"}
    if facts.get("unrunnable"):
        return unrunnable(tool, work, facts, ids)
    ref = np.load(d / "ref.npy")
    if tool == "genai":
        if not facts["genai"] or not GENAI:
            return {"verdict": "skip", "error": NOT_GENAI if not facts["genai"] else "genai not run on this host"}
        row.update(genai_generate(model.parent, ids[0], timeout))
        row.pop("sequence", None)
        return row
    if tool == "evaluate":
        got = json.loads((work / tool / "eval.json").read_text())["models"][0]["perplexity"]
        want = perplexity(ref, ids)
        row |= {"perplexity": got, "expected": want}
        if got is None or abs(got - want) > 1e-3 * want:
            return row | {"verdict": "fail", "stage": "numerics", "error": f"perplexity {got} != {want:.4f}"}
        return row
    if tool == "dump":
        index = json.loads((work / tool / "d" / "index.json").read_text())
        hit = [t for t in index["tensors"] if t["name"] == "logits" and "float_bin" in t["files"]]
        if not hit:
            return {"verdict": "fail", "stage": "numerics", "error": "no float dump of 'logits' in index.json"}
        got = np.fromfile(
            work / tool / "d" / hit[0]["files"]["float_bin"], np.float16 if hit[0]["dtype"] == "float16" else np.float32
        )
        want = ref[: got.size // ref[0].size].reshape(-1)
        err = rel_l2(want.astype(np.float64), got.astype(np.float64))
        tol = EXACT if hit[0]["dtype"] != "float16" else FP16_EXACT  # FP16 logits: batching changes the rounding
        tol = _exact(tol, facts)
        row |= {"rel_l2": err, "tol": tol}
        return (
            row
            if err <= tol
            else row | {"verdict": "fail", "stage": "numerics", "error": f"dumped logits rel L2 {err:.3g}"}
        )
    if tool == "compare":
        out = json.loads((work / tool / "compare.json").read_text())["outputs"].get("logits") or {}
        err = out.get("rel_l2")
        cand_fp16 = (work / "autocast_fp16" / "model.onnx").exists()
        bound = bounds["autocast_fp16"]["bound"] if cand_fp16 else _exact(EXACT, facts)
        row |= {"rel_l2": err, "bound": bound, "candidate": "autocast_fp16" if cand_fp16 else "itself"}
        if err is None or not math.isfinite(err) or err > bound:
            return row | {"verdict": "fail", "stage": "numerics", "error": f"compare reports logits rel L2 {err}"}
        return row
    out = work / tool / "model.onnx"
    try:
        logits, runtime = run_logits(out, ids, facts["head"], facts["past"])
    except Skip as e:
        return {"verdict": "skip", "stage": "ort", "error": str(e)}
    except Exception as e:
        return {"verdict": "fail", "stage": "ort", "error": error_line(f"{type(e).__name__}: {e}")}
    err = rel_l2(ref.astype(np.float64), logits.astype(np.float64))
    bound = _exact(bounds[tool]["bound"], facts) if tool == "preprocess" else bounds[tool]["bound"]
    row |= {"rel_l2": err, "bound": bound, "runtime": runtime}
    if not err <= bound:
        return row | {"verdict": "fail", "stage": "numerics", "error": f"logits rel L2 {err:.3g} > bound {bound:.3g}"}
    if facts["genai"] and not GENAI:
        row["genai"] = "not run on this host"
    elif facts["genai"]:
        if not (out.parent / "genai_config.json").exists():
            return row | {"verdict": "fail", "stage": "genai", "error": "output folder has no genai_config.json"}
        try:
            row["generated"] = genai_generate(out.parent, ids[0], timeout)["generated"]
        except Exception as e:
            return row | {"verdict": "fail", "stage": "genai", "error": error_line(str(e))}
    return row


def unrunnable(tool: str, work: Path, facts: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """Judges a tool that exited 0 on a float model ONNX Runtime cannot run here (a contrib op's CPU kernel lacks
    a feature the graph uses): the output model must load; it is run, and its failure for the same reason is a
    skip (nothing to judge against), not a failure."""
    why = f"the float model does not run in ORT (CPU): {facts['unrunnable']}"
    out = work / tool / "model.onnx"
    if tool not in MODEL_TOOLS:
        return {"verdict": "skip", "stage": "baseline", "error": why}
    if not out.exists():
        return {"verdict": "fail", "stage": "tool", "error": "exit 0 but no output model"}
    try:
        run_logits(out, ids[:1], facts["head"], facts["past"])
    except Exception as e:
        if not type(e).__module__.startswith("onnxruntime") and not isinstance(e, Skip):
            return {"verdict": "fail", "stage": "ort", "error": error_line(f"{type(e).__name__}: {e}")}
        return {"verdict": "skip", "stage": "baseline", "error": f"output written; {why}"}
    return {"verdict": "skip", "stage": "baseline", "error": f"output runs; no float logits to judge it ({why})"}


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Worker body: runs the tool's command line (in this worker process, which has the timeout) and judges it."""
    tool, model, work = spec["tool"], Path(spec["model"]), Path(spec["work"])
    t0 = time.perf_counter()
    if tool != "genai":
        shutil.rmtree(work / tool, ignore_errors=True)
        (work / tool).mkdir(parents=True)
        argv, _ = command(tool, model, work)
        from onnxprec._testing import run_cli  # the CLI's own code path, in this worker process

        res = run_cli(*map(str, argv))
        (work / tool / "log.txt").write_text(res.stdout + res.stderr)
        if res.returncode:
            err = error_line(res.stderr + res.stdout).removeprefix("error: ")
            if res.returncode == 2 and spec["facts"].get("unrunnable"):  # a one-line error, the model's runtime's
                why = f"the float model does not run in ORT (CPU): {spec['facts']['unrunnable']}"
                return {"verdict": "skip", "stage": "baseline", "error": f"{why}; the tool exits 2: {err[:100]}"}
            return {
                "verdict": "fail",
                "stage": "tool",
                "error": f"exit {res.returncode}: {err}",
                "seconds": round(time.perf_counter() - t0, 1),
            }
    try:
        row = judge(tool, model, work, spec["facts"], spec["bounds"], spec["timeout"])
    except Exception as e:
        row = {"verdict": "fail", "stage": "judge", "error": error_line(f"{type(e).__name__}: {e}")}
    return row | {"seconds": round(time.perf_counter() - t0, 1)}


def _worker(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Runs ``run_case`` / ``prepare`` in a fresh process: a crash or a hang costs only this case."""
    cmd = [sys.executable, "-m", "experiments.llm_corpus.sweep", f"--{kind}", json.dumps(spec)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH")])),
    }
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"verdict": "fail", "stage": "timeout", "error": f"killed after {timeout:.0f} s (tool and judge)"}
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        return {"verdict": "fail", "stage": "crash", "error": f"worker exit {res.returncode}: {error_line(res.stderr)}"}
    return dict(json.loads(lines[-1]))


# ----------------------------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------------------------


def sweep(
    names: Sequence[str],
    tools: Sequence[str],
    out: Path,
    full: bool,
    jobs: int,
    timeout: float,
    ids: np.ndarray | None = None,
    corpus: Path = CORPUS_DIR,
) -> list[dict[str, Any]]:
    """Runs ``tools`` on the corpus models ``names`` (arch/exporter) or on model paths; returns one row per case."""
    doc = json.loads(BOUNDS.read_text()) if BOUNDS.exists() else {"tools": {}}
    missing = [t for t in tools if t in MODEL_TOOLS and t not in doc["tools"]] + (
        ["autocast_fp16"] if "compare" in tools and "autocast_fp16" not in doc["tools"] else []
    )
    doc["tools"] |= {t: {"bound": math.inf, "note": "no bound measured"} for t in missing}
    ids = np.load(corpus / "ids.npy") if ids is None else ids
    rows: list[dict[str, Any]] = []
    first = [t for t in tools if t != "compare"]
    for name in names:
        model = Path(name) if name.endswith(".onnx") else corpus / name / "model.onnx"
        label = name if not name.endswith(".onnx") else model.stem
        work = out / label
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        np.save(work / "ids.npy", ids)
        facts = _worker("prepare", {"model": str(model), "work": str(work), "full": full}, timeout)
        if "error" in facts:
            rows += [
                {"model": label, "tool": t, "verdict": "fail", "stage": "baseline", "error": facts["error"]}
                for t in tools
            ]
            print(f"{label}: baseline fails: {facts['error']}", flush=True)
            continue
        bounds = model_bounds(doc, label)
        spec = {"model": str(model), "work": str(work), "facts": facts, "bounds": bounds, "timeout": timeout}
        for group in (first, ["compare"] if "compare" in tools else []):
            with cf.ThreadPoolExecutor(max(1, jobs)) as pool:
                futures = {t: pool.submit(_worker, "case", spec | {"tool": t}, timeout) for t in group if t != "genai"}
                if "genai" in group:  # decided here when there is nothing to load: no worker
                    futures["genai"] = pool.submit(lambda: {"verdict": "skip", "error": NOT_GENAI})
                    if facts["genai"]:
                        futures["genai"] = pool.submit(_worker, "case", spec | {"tool": "genai"}, timeout)
                for t, f in futures.items():
                    row = {"model": label, "tool": t, **f.result()}
                    rows.append(row)
                    print(f"{label:28s} {t:18s} {row['verdict']:5s} {row.get('error', '')[:150]}", flush=True)
    return rows


def model_bounds(doc: dict[str, Any], label: str) -> dict[str, Any]:
    """The bounds of the corpus model ``label`` (``arch/exporter``): bounds.json's tools, AutoCast's raised to twice
    the architecture's own error at the low precision (``own_error``: transformers' logits in FP16/BF16 against
    FP32, ``--measure-own-error``) where that is larger: a model whose own FP16 inference is that far off cannot
    be held to SmolLM2's."""
    tools = {t: dict(v) for t, v in doc["tools"].items()}
    own = doc.get("own_error", {}).get("arch", {}).get(label.split("/")[0], {})
    for tool, entry in tools.items():
        low = tool.removeprefix("autocast_")
        if tool.startswith("autocast_") and isinstance(own.get(low), float) and 2 * own[low] > entry["bound"]:
            entry |= {"bound": 2 * own[low], "why": f"2 x the architecture's own {low.upper()} error {own[low]:.3g}"}
    return tools


def measure_own_error() -> dict[str, Any]:
    """Runs ``_torch_side.py lowp`` on every architecture of the corpus and records its own FP16/BF16 logits error
    in bounds.json (``own_error``)."""
    from .build import TORCH_SIDE

    names = [a for a in dict.fromkeys(m.split("/")[0] for m in models()) if (CORPUS_DIR / a / "hf").is_dir()]
    subprocess.run([str(ensure_torch_venv()), str(TORCH_SIDE), "lowp", str(CORPUS_DIR), *names], check=True)
    arch = {}
    for a in names:
        status = json.loads((CORPUS_DIR / a / "lowp.json").read_text())
        if status.get("ok"):
            arch[a] = {k: status[k] for k in ("fp16", "bf16")}
    doc = json.loads(BOUNDS.read_text())
    doc["own_error"] = {
        "measured": "logits rel L2 of transformers' model (eager attention) with weights and compute in FP16 / BF16 "
        "against FP32, corpus ids windows 4-7 (the sweep's judged windows), torch CPU",
        "command": "python -m experiments.llm_corpus sweep --measure-own-error",
        "date": dt.date.today().isoformat(),
        "arch": arch,
    }
    BOUNDS.write_text(json.dumps(doc, indent=1) + "\n")
    return doc["own_error"]


def rejudge(rows: list[dict[str, Any]], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Re-applies today's bounds (and the dump and FP16-refusal rules) to recorded rows, e.g. of shards run before
    a bound changed: only verdicts that rest on a recorded number or message change."""
    out = []
    for r in rows:
        r = dict(r)
        bounds = model_bounds(doc, r["model"])
        err, tool = r.get("rel_l2"), r["tool"]
        fp16 = r["model"].endswith("_fp16")
        if r.get("stage") in (None, "numerics") and isinstance(err, float):
            if tool in bounds or tool == "compare":
                cand = r.get("candidate", "autocast_fp16")
                if tool != "compare":
                    bound = bounds[tool]["bound"]
                else:
                    bound = bounds["autocast_fp16"]["bound"] if cand == "autocast_fp16" else EXACT
                ok = err <= bound
                r["bound"] = bound
            elif tool == "dump":
                ok = err <= r.get("tol", FP16_EXACT if fp16 else EXACT)
            else:
                ok = r["verdict"] == "pass"
            r["verdict"] = "pass" if ok else "fail"
            if ok:
                r.pop("stage", None), r.pop("error", None)
            elif tool == "dump":
                r |= {"stage": "numerics", "error": f"dumped logits rel L2 {err:.3g}"}
            else:
                what = "compare reports logits" if tool == "compare" else "logits"
                r |= {"stage": "numerics", "error": f"{what} rel L2 {err:.3g} > bound {r['bound']:.3g}"}
        if fp16 and tool.startswith("autocast") and "exit 2:" in r.get("error", "") and "no FP32" in r["error"]:
            why = f"an FP16 model: AutoCast refuses it in one line ({r['error'][8:88]})"
            r |= {"verdict": "skip", "stage": "", "error": why}
        out.append(r)
    return out


def short(error: str) -> str:
    """An ORT run error without its boilerplate: the node and its status message."""
    error = re.sub(r"\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : Non-zero status code returned while running ", "", error)
    return error.replace(" Status Message:", ":")


def markdown(rows: list[dict[str, Any]], command_line: str) -> str:
    """The model x tool table (pass / FAIL stage / skip) and the failures grouped by their first line."""
    tools = [t for t in TOOLS if any(r["tool"] == t for r in rows)]
    names = list(dict.fromkeys(r["model"] for r in rows))
    cell = {(r["model"], r["tool"]): r for r in rows}
    mark = {"pass": "ok", "skip": "skip"}
    lines = [f"`{command_line}`", "", "| model | " + " | ".join(tools) + " |", "|---" * (len(tools) + 1) + "|"]
    for n in names:
        cells = []
        for t in tools:
            r = cell.get((n, t))
            cells.append("" if r is None else mark.get(r["verdict"], f"**{r.get('stage', 'fail')}**"))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    passed = sum(r["verdict"] == "pass" for r in rows)
    lines += ["", f"{passed} of {len(rows)} cases pass; {sum(r['verdict'] == 'skip' for r in rows)} skipped.", ""]
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["verdict"] != "pass":
            key = f"{r['verdict']} ({r.get('stage') or ''}): {short(r.get('error', ''))[:200]}"
            groups.setdefault(key, []).append(f"{r['model']}:{r['tool']}")
    for key, where in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
        lines.append(f"- {len(where)}x {key} - {shown}")
    return "\n".join(lines) + "\n"


def measure_bounds(out: Path, jobs: int, timeout: float) -> dict[str, Any]:
    """Runs the model tools on the zoo's smollm2_135m (no KV; windows 0-7 calibrate, 8-11 first 128 tokens judge)
    and writes bounds.json: the measured logits rel L2 per tool, and the bound (2x it, at least 1e-4)."""
    from zoo import inputs, model_path

    real = inputs("smollm2_135m")["input_ids"]  # 16 x 256 real token windows
    ids = np.concatenate([real[0:4, :128], real[8:12, :128]])  # CALIB = 0-3, EVAL = 4-7 of this stack
    rows = sweep([str(model_path("smollm2_135m"))], MODEL_TOOLS, out, False, jobs, timeout, ids)
    tools = {}
    for r in rows:
        err = r.get("rel_l2")
        floor = FLOOR.get(r["tool"], EXACT)
        tools[r["tool"]] = {"rel_l2": err, "bound": max(2 * err, floor) if isinstance(err, float) else None}
    for tool, entry in tools.items():  # random weights give AWQ and GPTQ nothing to exploit: RTN's bound
        rtn = tools.get("int4_rtn_" + tool.rsplit("_", 1)[1])
        if tool.startswith(("int4_awq", "int4_gptq")) and rtn and entry["bound"] is not None and rtn["bound"]:
            entry["bound"] = max(entry["bound"], rtn["bound"])
    doc = {
        "measured": "logits rel L2 against FP32 of each tool's output of the zoo smollm2_135m export (no KV cache), "
        "calibrated on 4 windows x 128 tokens of smollm2_eval_input_ids (0-3), judged on windows 8-11 (128 tokens); "
        "default flags; bound = max(2 x measured, 1e-4; AutoCast: two units in the last place of the low type, "
        "2^-9 for FP16 and 2^-6 for BF16, as the logits of a random-weight model carry a rounding per layer; "
        "INT4 AWQ and GPTQ: at least RTN's bound of the same format, as on random weights they match RTN, see "
        "RELIABILITY.md); AutoCast of a corpus model: at least 2 x its architecture's own_error",
        "command": "python -m experiments.llm_corpus sweep --measure-bounds",
        "date": dt.date.today().isoformat(),
        "tools": tools,
    }
    if BOUNDS.exists() and "own_error" in (old := json.loads(BOUNDS.read_text())):
        doc["own_error"] = old["own_error"]
    BOUNDS.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.llm_corpus sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["*"], help="arch/exporter globs (default: every built model)")
    ap.add_argument("--tools", nargs="*", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--feeds", choices=("ids", "full"), default="ids")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case (tool + judging)")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"work folder (default {OUT_DIR})")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--measure-bounds", action="store_true")
    ap.add_argument("--measure-own-error", action="store_true", help="each architecture's own FP16/BF16 error")
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="sweep JSONs (shards; a later one's case wins) to merge and re-judge; no run",
    )
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.case or a.prepare:  # worker mode
        spec = json.loads(a.case or a.prepare)
        if a.case:
            result = run_case(spec)
        else:
            try:
                ids = np.load(Path(spec["work"]) / "ids.npy")
                result = prepare(Path(spec["model"]), Path(spec["work"]), ids, spec["full"])
            except Exception as e:
                result = {"error": error_line(f"{type(e).__name__}: {e}")}
        print(json.dumps(result, default=float))
        return 0
    if a.measure_own_error:
        print(json.dumps(measure_own_error(), indent=1))
        return 0
    if a.measure_bounds:
        print(json.dumps(measure_bounds(a.out / "_bounds", a.jobs, a.timeout), indent=1))
        return 0
    if a.merge:
        bounds = json.loads(BOUNDS.read_text())
        docs = [json.loads(p.read_text()) for p in a.merge]
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        for r in (r for d in docs for r in d["rows"]):  # a later shard's case wins, unless it did not run genai
            key = (r["model"], r["tool"])
            if key not in latest or r.get("error") != "genai not run on this host":
                latest[key] = r
        rows = rejudge(list(latest.values()), bounds)
        rows.sort(key=lambda r: (r["model"], TOOLS.index(r["tool"])))
        cmds = "; ".join(d["command"] for d in docs)
        md = markdown(rows, cmds)
        out_json = {"command": cmds, "merged": [str(p) for p in a.merge], "rows": rows}
        (a.json or a.out / "sweep.json").write_text(json.dumps(out_json, indent=1, default=float) + "\n")
        (a.md or a.out / "sweep.md").write_text(md)
        print(md)
        return 0
    built = models()
    names = [m for m in built if any(fnmatch.fnmatch(m, g) for g in a.models)]
    if not names:
        print(
            f"error: no corpus model matches {a.models}; build it: python -m experiments.llm_corpus build",
            file=sys.stderr,
        )
        return 2
    cmdline = "python -m experiments.llm_corpus sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = sweep(names, a.tools, a.out, a.feeds == "full", a.jobs, a.timeout)
    doc = {
        "command": cmdline.strip(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "feeds": a.feeds,
        "rows": rows,
    }
    (a.json or a.out / "sweep.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    md = markdown(rows, cmdline.strip())
    (a.md or a.out / "sweep.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
