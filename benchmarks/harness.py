"""The one harness: a process runner (:func:`measure`), one results schema (:func:`new_results`), one run loop
(:func:`run_models`: the results file is written after every model, so that an interrupted run keeps what it
measured), and the AutoCast part's run; the INT4 and utilities parts (:mod:`benchmarks.int4`,
:mod:`benchmarks.utilities`) run their tool tables through the same pieces, and :mod:`benchmarks.report` renders
every part's results into BENCHMARKS.md.

AutoCast (the method as BENCHMARKS.md states it: ``report_text.md``'s ``autocast.method``): for each model,
``repeats`` rounds each run every tool once, in the same order, every run a fresh process; a tool that times out,
passes the memory limit or fails is not run again on that model. Then the kept output of each tool (its first
successful round) goes to the metrics worker (:mod:`benchmarks.output_metrics`). Ratios against an anchor are
taken round by round (measured seconds apart), then summarised (median, min, max).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import onnxprec
import zoo
from onnxprec._io import write_atomically

from .output_metrics import file_size, model_files
from .proc import MIB, gnu_time_available, run_measured
from .tools import HEAVY_MODELS, RATIO_ANCHORS, TOOLS, Tool, default_tools, family, python_for, tool_command

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA = 2  # 2: every part writes the same header (versions.project/anchors, settings); 1: AutoCast's
PERPLEXITY_MODELS = frozenset({"smollm2_135m"})
EVAL_BATCH = {"smollm2_135m": 2}  # windows per ONNX Runtime call when measuring accuracy (bounds memory)
METRICS_TIMEOUT_S = 3600.0
ANCHOR_PACKAGES = ("nvidia-modelopt", "onnxconverter-common", "onnx", "onnxruntime", "torch", "neural-compressor")

_MODELOPT_COUNTS = re.compile(r"Converted (\d+)/(\d+) nodes \([\d.]+%\) to \w+")


@dataclass
class RunConfig:
    """What ``python -m benchmarks run|int4|utilities`` was asked to do (``plan``: the INT4 part's model plan;
    ``models``/``tools`` empty: the part's defaults)."""

    models: list[str] = field(default_factory=list)
    tools: list[str] | None = None
    repeats: int = 3
    heavy_repeats: int = 1
    timeout_s: float = 600.0
    mem_limit_mb: float | None = None
    zoo_dir: Path | None = None
    results_dir: Path = RESULTS_DIR
    work_dir: Path | None = None
    tag: str | None = None
    latency: bool = True
    latency_runs: int = 20
    anchors_python: Path | None = None
    command: str = ""
    plan: str = "all"
    decode_from: Path | None = None
    providers: str = "cpu"


# ------------------------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, OS and Python."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu)
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "gnu_time": gnu_time_available()}  # fmt: skip


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(
            ["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def package_versions(python: Path | str, packages: Sequence[str]) -> dict[str, Any]:
    """The versions of ``packages`` in the venv of the interpreter ``python`` (None for those not installed)."""
    code = "import json, sys, importlib.metadata as m\n"
    code += "print(json.dumps({p: next((d.version for d in m.distributions(name=p)), None) for p in sys.argv[1:]}))"
    res = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True, check=True)
    return dict(json.loads(res.stdout))


def project_versions() -> dict[str, Any]:
    """onnxprec (version, git sha, whether src/ differs from it) and the libraries of this venv."""
    out = package_versions(sys.executable, ("onnxprec", "onnx", "onnxruntime", "onnx-ir", "numpy"))
    sha = _git("rev-parse", "--short=10", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=all", "--", "src")
    out["onnxprec_git"] = f"{sha}{'+local changes in src/' if dirty else ''}" if sha else None
    out["onnxprec_src_sha256"] = onnxprec_source_hash()
    return out


def onnxprec_source_hash() -> str:
    """Short SHA-256 of the onnxprec sources in use (tells apart runs made while src/ was being edited)."""
    root = Path(onnxprec.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def default_mem_limit_mb() -> float:
    """75 % of the machine's RAM: a tool above it is stopped (recorded as memory-limit)."""
    return psutil.virtual_memory().total / MIB * 0.75


# ------------------------------------------------------------------------------------------------------------
# statistics
# ------------------------------------------------------------------------------------------------------------


def stats(values: Sequence[float | None]) -> dict[str, Any] | None:
    """median, min, max and n of the non-None values (None when there are none)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def median(values: Sequence[float | None]) -> float | None:
    """The median of the non-None values (None when there are none)."""
    summary = stats(values)
    return summary["median"] if summary else None


def paired_ratios(tool_runs: list[dict[str, Any]], anchor_runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per-round ratios of a tool against an anchor (rounds where both succeeded), summarised.

    speedup = anchor wall / tool wall (higher is better); time_ratio its inverse; rss_ratio = tool peak RSS /
    anchor peak RSS (lower is better)."""
    by_round = {r["repeat"]: r for r in anchor_runs if r["status"] == "ok"}
    pairs = [(r, by_round[r["repeat"]]) for r in tool_runs if r["status"] == "ok" and r["repeat"] in by_round]
    if not pairs:
        return None
    speed = [a["wall_s"] / r["wall_s"] for r, a in pairs]
    tratio = [r["wall_s"] / a["wall_s"] for r, a in pairs]
    rss = [r["peak_rss_mb"] / a["peak_rss_mb"] for r, a in pairs if r.get("peak_rss_mb") and a.get("peak_rss_mb")]
    return {"speedup": stats(speed), "time_ratio": stats(tratio), "rss_ratio": stats(rss), "paired": True}


# ------------------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------------------


def _tool_counts(tool: Tool, log: str, report_json: Path) -> dict[str, Any] | None:
    """The tool's own node counts: onnxprec's from its report JSON (``counts``, and ``target`` for the accuracy
    target runs), ModelOpt's from its log line ("Converted X/Y nodes"); None when the tool reports none."""
    if tool.runner == "onnxprec":
        try:
            report = json.loads(report_json.read_text())
            counts = report["counts"]
            found = {"low_nodes": counts["low_nodes"], "nodes": counts["nodes"], "casts_inserted": counts["casts"]}
            search = report.get("target")
            if search:  # --target_accuracy: what the search did (AutoCast issue 11)
                found["target"] = {k: search[k] for k in ("target", "mode", "reached", "moved", "sessions", "runs")}
            return found
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("%s: no counts from its report JSON %s (%s)", tool.id, report_json, e)
            return None
    logged = _MODELOPT_COUNTS.findall(log) if tool.runner == "modelopt" else []
    return {"low_nodes": int(logged[-1][0]), "nodes": int(logged[-1][1])} if logged else None


def measure(
    argv: list[str], log: Path, timeout_s: float, mem_limit_mb: float | None = None, **popen: Any
) -> dict[str, Any]:
    """Runs one tool as its own process (:func:`benchmarks.proc.run_measured`: whole-process wall time and peak
    RSS, stopped past the timeout or the memory limit, default 75 % of RAM); the round's record every part
    stores, with the error line and the log's tail when it did not succeed."""
    limit = mem_limit_mb or default_mem_limit_mb()
    load = os.getloadavg()[0]  # another job on the machine stretches the times (not the peak RSS)
    r = run_measured(argv, log, timeout_s=timeout_s, mem_limit_mb=limit, **popen)
    runner = r.runner or {}
    rec = {k: v for k, v in asdict(r).items() if k not in ("runner", "log_tail")}
    rec.update(import_s=runner.get("import_s"), convert_s=runner.get("convert_s"), load_before=round(load, 2))
    rec["load_after"] = round(os.getloadavg()[0], 2)
    if r.status == "memory-limit":
        rec["error"] = f"stopped above the memory limit ({limit:.0f} MiB) after {r.wall_s:.0f} s"
    elif r.status == "timeout":
        rec["error"] = f"stopped at the timeout ({timeout_s:.0f} s)"
    elif r.status != "ok":
        rec["error"] = str(runner.get("error") or _last_error(r.log_tail))[:400]
    if r.status != "ok":
        rec["log_tail"] = r.log_tail[-12:]
    return rec


def new_results(kind: str, config: RunConfig, **settings: Any) -> dict[str, Any]:
    """The results file's header (the one schema of every part): what ran, where, with which versions and
    settings; the part adds its ``models``."""
    anchors = package_versions(config.anchors_python, ANCHOR_PACKAGES) if config.anchors_python else {}
    return {"schema": SCHEMA, "kind": kind, "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": config.command, "machine": machine_info(),
            "versions": {"project": project_versions(), "anchors": anchors}, "models": {},
            "settings": {"repeats": config.repeats, "timeout_s": config.timeout_s, **settings}}  # fmt: skip


def results_path(config: RunConfig, kind: str) -> Path:
    """``<results>/<kind>-<date>-<tag>.json`` (``<date>-<tag>.json`` for AutoCast), never an existing file."""
    tag = config.tag or ("all" if len(config.models) > 6 else "+".join(config.models)[:60]) or "run"
    base = f"{dt.date.today():%Y-%m-%d}-{re.sub(r'[^A-Za-z0-9._+-]+', '-', tag)}"
    path = config.results_dir / f"{'' if kind == 'autocast' else kind + '-'}{base}.json"
    stem, n = path.stem, 2
    while path.exists():
        path, n = path.with_name(f"{stem}-{n}.json"), n + 1
    return path


def write_results(path: Path, data: dict[str, Any]) -> None:
    """Writes the results file atomically (after every model, so that an interrupted run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data, indent=1, default=json_default) + "\n")


def ensure_anchors(config: RunConfig, venvs: set[str]) -> None:
    """Creates (or finds) the anchors venv when a planned tool runs there."""
    if "anchors" in venvs and config.anchors_python is None:
        from zoo.anchors_env import ensure_anchor_venv

        config.anchors_python = ensure_anchor_venv()


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and paths."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def run_models(config: RunConfig, kind: str, run_model: Callable[[str, Path], dict[str, Any]], **settings: Any) -> Path:
    """Runs ``run_model(model, work folder)`` on every model of ``config`` into a new results file of ``kind`` (the
    header of :func:`new_results` with ``settings``), written after every model so that an interrupted run keeps
    what it measured; the work folders are removed at the end. Returns the file's path."""
    path = results_path(config, kind)
    data = {**new_results(kind, config, **settings), "run_id": path.stem}
    write_results(path, data)
    logger.info("results -> %s", path)
    work = Path(tempfile.mkdtemp(prefix=f"onnxprec-{kind}-", dir=config.work_dir))
    try:
        for model in config.models:
            t0 = time.perf_counter()
            data["models"][model] = run_model(model, work / model)
            data["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            write_results(path, data)
            logger.info("%s: done in %.0f s", model, time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    end_hash = onnxprec_source_hash()
    if end_hash != data["versions"]["project"]["onnxprec_src_sha256"]:  # src/ was edited meanwhile: mixed numbers
        logger.warning("onnxprec sources changed during the run (now %s)", end_hash)
        data["onnxprec_sources_at_end"] = end_hash
        write_results(path, data)
    return path


def run(config: RunConfig) -> Path:
    """Runs the AutoCast part; returns the results JSON path."""
    plan: dict[str, list[Tool]] = {}
    for model in config.models:
        zoo._check_name(model)
        plan[model] = [TOOLS[n] for n in (config.tools if config.tools is not None else default_tools(model))]
    ensure_anchors(config, {t.venv for ts in plan.values() for t in ts})
    mem_limit = config.mem_limit_mb or default_mem_limit_mb()
    return run_models(
        config,
        "autocast",
        lambda model, work: _run_model(config, model, plan[model], work, mem_limit),
        heavy_repeats=config.heavy_repeats,
        heavy_models=sorted(HEAVY_MODELS),
        mem_limit_mb=round(mem_limit),
        latency_runs=config.latency_runs,
        page_cache="model files read once before every tool run (when they fit in half the free RAM)",
    )


def _run_model(config: RunConfig, model: str, tools: list[Tool], work: Path, mem_limit: float) -> dict[str, Any]:
    src = zoo.model_path(model, config.zoo_dir)
    work.mkdir(parents=True, exist_ok=True)
    inputs_npz = work / "inputs.npz"
    np.savez(inputs_npz, **zoo.inputs(model, config.zoo_dir))  # type: ignore[arg-type]
    size = file_size(src)
    files = model_files(src)
    repeats = config.heavy_repeats if model in HEAVY_MODELS else config.repeats
    block: dict[str, Any] = {"onnxprec_src_sha256": onnxprec_source_hash(), "family": family(model), "tools": {},
                             "file_bytes": size, "repeats": repeats, "order": [t.id for t in tools]}  # fmt: skip
    active: list[Tool] = []
    for tool in tools:
        command = tool.user_command.format(src=f"{model}.onnx", dst="out.onnx")
        entry = block["tools"][tool.id] = {"label": tool.label, "command": command, "runs": []}
        if tool.max_model_mb is not None and size / MIB > tool.max_model_mb:
            entry.update(status="skipped", reason=f"model above {tool.max_model_mb:.0f} MB (too slow for this tool)")
            logger.info("%s %s: skipped (%s)", model, tool.id, entry["reason"])
        else:
            active.append(tool)
    kept: dict[str, Path] = {}
    for rep in range(repeats):
        for tool in active:
            entry = block["tools"][tool.id]
            failed = entry["runs"] and entry["runs"][-1]["status"] != "ok"  # not run again
            if failed or (tool.max_repeats is not None and rep >= tool.max_repeats):
                continue
            rdir = work / f"{tool.id.replace(':', '_')}-r{rep}"
            rdir.mkdir(parents=True, exist_ok=True)
            dst = rdir / "out.onnx"
            report_json = rdir / "report.json"
            cmd = tool_command(tool, python_for(tool, config.anchors_python), src, dst, inputs_npz, report_json)
            timeout = min(config.timeout_s, tool.timeout_s or config.timeout_s)
            warm_page_cache(files)
            record = {"repeat": rep, **measure(cmd, rdir / "log.txt", timeout, mem_limit, cwd=rdir)}
            if record["status"] == "ok" and dst.exists():
                record["out_bytes"] = file_size(dst)
                if counts := _tool_counts(tool, (rdir / "log.txt").read_text(errors="replace"), report_json):
                    record["tool_reported"] = counts
            elif record["status"] == "ok":
                record.update(status="failed", error="no output file")
            entry["runs"].append(record)
            log_run(f"{model} round {rep + 1} {tool.id}", record)
            if record["status"] == "ok" and tool.id not in kept:
                kept[tool.id] = dst
            else:
                shutil.rmtree(rdir, ignore_errors=True)
    for tool in active:  # the summary, and ratios round by round against every anchor measured on the model
        runs = _summarise(block["tools"][tool.id])
        anchors = [a for a in RATIO_ANCHORS if a != tool.id and a in block["tools"]]
        vs = {a: paired_ratios(runs, block["tools"][a]["runs"]) for a in anchors}
        block["tools"][tool.id]["vs"] = {a: r for a, r in vs.items() if r}
    if kept:
        _metrics(config, model, src, work, kept, [t for t in active if t.evaluate], block)
    for p in kept.values():
        shutil.rmtree(p.parent, ignore_errors=True)
    return block


def warm_page_cache(files: list[Path]) -> float:
    """Reads the model's files once, so that every tool run starts with the model in the page cache (as right
    after exporting it) instead of whichever run comes first paying for the disk; skipped when the files would
    not fit in half the available memory. Returns the seconds it took."""
    t0 = time.perf_counter()
    total = sum(p.stat().st_size for p in files if p.exists())
    if total > psutil.virtual_memory().available / 2:
        return 0.0
    buf = bytearray(16 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0


def log_run(what: str, rec: dict[str, Any]) -> None:
    """One INFO line for a measured run: its status, wall time and peak RSS (and error)."""
    wall, peak, error = rec.get("wall_s"), rec.get("peak_rss_mb"), rec.get("error")
    shown = (f"{wall:.1f}" if wall is not None else "?", f"{peak:.0f}" if peak else "?", f" ({error})" if error else "")
    logger.info("%s: %s, %s s, peak RSS %s MiB%s", what, rec["status"], *shown)


def _last_error(tail: list[str]) -> str:
    """The failure's message in a log's tail: the last ``error:`` line, else the last unindented line."""
    for line in reversed(tail):
        if line.strip().startswith("error:"):
            return line.strip()[:300]
    for line in reversed(tail):
        if line.strip() and not line.startswith(("\t", " ")):
            return line.strip()[:300]
    return "see log_tail"


def _summarise(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Adds the tool's status, summary statistics, reported counts and error over its rounds; returns the rounds."""
    runs = entry["runs"]
    ok = [r for r in runs if r["status"] == "ok"]
    status = "ok" if len(ok) == len(runs) else "partial" if ok else runs[0]["status"]
    entry["status"] = status if runs else "not run"
    keys = ("wall_s", "peak_rss_mb", "convert_s", "import_s", "user_s", "sys_s")
    summary: dict[str, Any] = {key: s for key in keys if (s := stats([r.get(key) for r in ok]))}
    sizes = sorted({r["out_bytes"] for r in ok if "out_bytes" in r})
    if sizes:
        summary["out_bytes"] = sizes[0]
        if len(sizes) > 1:
            summary["out_bytes_differ"] = sizes
    if counts := [r["tool_reported"] for r in ok if "tool_reported" in r]:
        entry["tool_reported"] = counts[0]
    entry["summary"] = summary
    if not ok and runs:
        entry["error"] = runs[0].get("error")
    return runs


def _metrics(config: RunConfig, model: str, src: Path, work: Path, kept: dict[str, Path], evaluate: list[Tool],
             block: dict[str, Any]) -> None:  # fmt: skip
    """Runs the metrics worker on the kept outputs; adds its numbers to the model's block and each tool's entry."""
    spec = {"model": model, "fp32": str(src), "inputs": str(work / "inputs.npz"),
            "candidates": {k: str(v) for k, v in kept.items()}, "evaluate": [t.id for t in evaluate if t.id in kept],
            "perplexity": model in PERPLEXITY_MODELS, "batch": EVAL_BATCH.get(model), "latency": config.latency,
            "latency_runs": config.latency_runs}  # fmt: skip
    out_path = work / "metrics-out.json"
    logger.info("%s: metrics (structure, accuracy, CPU latency) for %s", model, ", ".join(kept))
    t0 = time.perf_counter()
    res = run_measured(  # from the repository root, where python -m finds the benchmarks package
        [sys.executable, "-m", "benchmarks.output_metrics", json.dumps(spec), str(out_path)],
        work / "metrics-log.txt",
        timeout_s=METRICS_TIMEOUT_S,
        cwd=REPO_ROOT,
    )
    if res.status != "ok" or not out_path.exists():
        logger.error("%s: metrics worker %s:\n%s", model, res.status, "\n".join(res.log_tail))
        block["metrics_error"] = f"{res.status}: {_last_error(res.log_tail)}"
        return
    result = json.loads(out_path.read_text())
    block.update(fp32=result["fp32"], latency_mode=result["latency_mode"], metrics_s=time.perf_counter() - t0)
    for key, metrics in result.get("tools", {}).items():
        block["tools"].setdefault(key, {}).update(metrics)
