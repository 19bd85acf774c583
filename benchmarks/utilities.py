"""The utilities part: ``onnxprec preprocess``, ``evaluate``, ``dump`` and ``compare`` (issue 10), and ONNX Runtime's
``quant_pre_process`` beside ``preprocess``.

    python -m benchmarks utilities [--models smollm2_135m,matmul_4gb] [--tools ID,...] [--repeats 1] [--tag T]

Each tool (:func:`tool_command`: the command a user types) runs as its own process through the harness's runner,
on one batch of the zoo's inputs; ``evaluate`` and ``compare`` take the model and its FP16 AutoCast, made first
and measured too. The method as BENCHMARKS.md states it is ``report_text.md``'s ``utilities.intro``; the results
(``utilities-<date>-<tag>.json``) render through :mod:`benchmarks.report_utilities`.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

import zoo

from .harness import RunConfig, log_run, measure, median, run_models, warm_page_cache
from .output_metrics import file_size, model_files
from .tools import parse_tools

logger = logging.getLogger(__name__)

KIND = "utilities"
LLM = "smollm2_135m"
SYNTHETIC = "matmul_4gb"
DEFAULT_MODELS = (LLM, SYNTHETIC)
CANDIDATE = "autocast:fp16"  # the candidate's production (measured, not one of the four tools)
ORT_PREPROCESS = "ort:quant_pre_process"
TOOL_IDS = ("preprocess", ORT_PREPROCESS, "evaluate", "dump", "compare")
LLM_TOKENS = 256

# ONNX Runtime's quant_pre_process as a user calls it: python -c CODE INPUT OUTPUT [external]
_ORT_CODE = (
    "import sys\n"
    "from onnxruntime.quantization.shape_inference import quant_pre_process\n"
    "ext = len(sys.argv) > 3\n"
    "quant_pre_process(sys.argv[1], sys.argv[2], save_as_external_data=ext, all_tensors_to_one_file=ext)\n"
)
# the tool table: its output (file or folder) and its command after the interpreter, {M} the model, {C} its FP16
# candidate, {D} the data, {O} the output; what a user types is the same with `onnxprec` for `-m onnxprec.cli`
TOOLS: dict[str, tuple[str, str]] = {
    "preprocess": ("M.pre.onnx", "-m onnxprec.cli preprocess --input {M} --output {O}"),
    ORT_PREPROCESS: ("M.ort_pre.onnx", "-c {ORT} {M} {O}"),
    "evaluate": ("eval.json", "-m onnxprec.cli evaluate {M} {C} --data {D} --report_json {O}"),
    "dump": ("dump", "-m onnxprec.cli dump --onnx_path {M} --calibration_data {D} --dump_float --output_dir {O}"),
    "compare": ("compare.json", "-m onnxprec.cli compare {M} {C} --calibration_data {D} --report_json {O}"),
    CANDIDATE: ("M.fp16.onnx", "-m onnxprec.autocast --onnx_path {M} --output_path {O} --keep_io_types"),
}
# what _details records, moved from the last round to the tool's row
_DETAILS = ("output_bytes", "tensors", "counts", "first_divergence", "chunks", "outputs", "evaluated", "details_error")
_USER = {"{M}": "M", "{C}": "M.fp16.onnx", "{D}": "data.npz", "-m onnxprec.cli": "onnxprec", "-m ": "python -m "}


def tool_command(tool: str, model: Path, work: Path, external: bool) -> tuple[list[str], str]:
    """``(argv, user command)`` of one tool on one model (its files in ``work``: data.npz, the candidate)."""
    out, template = TOOLS[tool]
    files = {"M": model, "C": work / TOOLS[CANDIDATE][0], "D": work / "data.npz", "O": work / out, "ORT": _ORT_CODE}
    argv = [sys.executable, *(a.format(**files) for a in template.split())]
    if external:  # ORT writes external data only when told; AutoCast keeps it when told
        argv += {ORT_PREPROCESS: ["external"], CANDIDATE: ["--external_data"]}.get(tool, [])
    user = template.replace("{O}", out)
    for key, value in _USER.items():
        user = user.replace(key, value)
    if tool == ORT_PREPROCESS:
        ext = ", save_as_external_data=True, all_tensors_to_one_file=True" if external else ""
        user = f"onnxruntime.quantization.shape_inference.quant_pre_process(M, 'M.ort_pre.onnx'{ext})"
    return argv, user + (" --external_data" if external and tool == CANDIDATE else "")


# ------------------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------------------


def files_bytes(path: Path) -> int:
    """Bytes of a model file and its external data files, or of everything under a folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return file_size(path) if path.exists() else 0


def _details(tool: str, out: Path) -> dict[str, Any]:
    """What the tool produced, in a few numbers (sizes, counts, the comparison's verdict)."""
    info: dict[str, Any] = {}
    try:
        if tool in ("preprocess", ORT_PREPROCESS, "dump"):
            info["output_bytes"] = files_bytes(out)
        if tool == "dump":
            info["tensors"] = len(json.loads((out / "index.json").read_text()).get("tensors", []))
        elif tool == "compare":
            data = json.loads(out.read_text())
            info.update({k: data.get(k) for k in ("counts", "first_divergence", "chunks", "outputs")})
        elif tool == "evaluate":
            data = json.loads(out.read_text())
            keys = ("name", "reference", "perplexity", "agreement")
            info["evaluated"] = [
                {**{k: m.get(k) for k in keys}, "latency_ms": (m.get("latency_ms") or {}).get("median")}
                for m in data.get("models", [])
            ]
    except (OSError, ValueError, AttributeError) as e:
        info["details_error"] = f"{type(e).__name__}: {e}"[:200]
    return info


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
        return
    for p in (path, path.with_name(path.name + ".data"), path.with_name(path.stem + ".onnx_data")):
        p.unlink(missing_ok=True)


def _summary(rounds: list[dict[str, Any]], user_command: str) -> dict[str, Any]:
    ok = [x for x in rounds if x["status"] == "ok"]
    rec: dict[str, Any] = {
        "command": user_command,
        "status": rounds[-1]["status"],
        "wall_s": median([x["wall_s"] for x in ok]) if ok else rounds[-1]["wall_s"],
        "peak_rss_mb": median([x["peak_rss_mb"] for x in ok]),
        "rounds": rounds,
    }
    rec.update({key: rounds[-1][key] for key in ("error", "log_tail") if key in rounds[-1]})
    rec.update({key: rounds[-1].pop(key) for key in _DETAILS if key in rounds[-1]})
    return rec


# ------------------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------------------


def write_data(model: str, dst: Path, zoo_dir: Path | None) -> dict[str, list[int]]:
    """The first sample of the zoo's inputs (for a causal LM its first window, cut to :data:`LLM_TOKENS`) as one
    ``.npz``; returns the shapes."""
    feeds = {k: v[:1] for k, v in zoo.inputs(model, zoo_dir).items()}
    if "input_ids" in feeds:
        feeds = {k: v[:, :LLM_TOKENS] if v.ndim >= 2 else v for k, v in feeds.items()}
    np.savez(dst, **feeds)  # type: ignore[arg-type]
    return {k: list(v.shape) for k, v in feeds.items()}


# ------------------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------------------


def _run_model(config: RunConfig, model: str, mwork: Path) -> dict[str, Any]:
    src = zoo.model_path(model, config.zoo_dir)
    mwork.mkdir(parents=True, exist_ok=True)
    files = model_files(src)
    external = len(files) > 1  # the model file and its external data files
    shapes = write_data(model, mwork / "data.npz", config.zoo_dir)
    entry: dict[str, Any] = {"file_bytes": file_size(src), "external_data": external, "data": shapes, "tools": {}}
    entry["page_cache_warm_s"] = warm_page_cache(files)
    candidate = None
    tools = config.tools or list(TOOL_IDS)
    if any(t in ("evaluate", "compare") for t in tools):
        argv, user = tool_command(CANDIDATE, src, mwork, external)
        dst = mwork / TOOLS[CANDIDATE][0]
        logger.info("[%s] candidate: %s", model, user)
        rec = measure(argv, mwork / "candidate.log", config.timeout_s, config.mem_limit_mb)
        rec["output_bytes"] = files_bytes(dst) if rec["status"] == "ok" else None
        entry["candidate"] = {"id": CANDIDATE, **_summary([rec], user)}
        log_run(f"{model} {CANDIDATE}", entry["candidate"])
        if rec["status"] == "ok":
            candidate = dst
            warm_page_cache(model_files(dst))
    rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    commands: dict[str, str] = {}
    for r in range(config.repeats):
        for tool in tools:
            out = mwork / TOOLS[tool][0]
            if tool in ("evaluate", "compare") and candidate is None:
                rounds[tool].append({"status": "skipped", "wall_s": None, "error": "no FP16 candidate (see candidate)"})
                continue
            argv, commands[tool] = tool_command(tool, src, mwork, external)
            logger.info("[%s round %d/%d] %s", model, r + 1, config.repeats, tool)
            rec = measure(argv, mwork / f"{tool.replace(':', '_')}.log", config.timeout_s, config.mem_limit_mb)
            if rec["status"] == "ok":
                rec.update(_details(tool, out))
            _remove(out)
            rounds[tool].append(rec)
    for tool in tools:
        entry["tools"][tool] = _summary(rounds[tool], commands.get(tool, ""))
        log_run(f"{model} {tool}", entry["tools"][tool])
    if candidate is not None:
        _remove(candidate)
    return entry


def run(config: RunConfig) -> Path:
    """Runs every tool on every model; writes and returns the results file."""
    config.models = config.models or list(DEFAULT_MODELS)
    config.tools = parse_tools(config.tools or TOOL_IDS, TOOL_IDS)
    return run_models(config, KIND, lambda model, work: _run_model(config, model, work))
