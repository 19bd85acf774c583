"""The corpus part: every tool on every corpus model (``zoo.corpus``), as a user runs it, judged by its task metric.

    python -m benchmarks corpus [--models M,...] [--tools T,...] [--jobs 1] [--timeout 600] [--table] [--report-only]

Every tool of :data:`TOOLS` runs as its own process through onnxprec's command line (the anchors through their own
entry points in the anchors venv, on a copy of the model) with a timeout, on the corpus model and its calibration
inputs (``calib/``, a folder of ``.npz`` batches; ModelOpt gets them as one ``.npz``). Then, in this process, the
result is run with ONNX Runtime's CPU provider on the held-out inputs (``heldout/``) and judged against FP32's
outputs by the model's task metric (:mod:`benchmarks.corpus_metrics`, the bound from the manifest); for the INT8
results, the latency against FP32 with 2 threads (:func:`benchmarks.int8.latency_ratios`: the median of
alternating rounds in one process). ``evaluate`` and ``compare`` take the model and its INT8 result.

Each cell (exit code, the tool's one-line message when it failed, the metric, pass/fail, latency, wall time) is
cached in ``<corpus>/cells/<model>/<tool>/<key>/cell.json``, the key made of the model's sha256, its inputs, the
command and the onnxprec sources (their hash) or the anchors' versions: a rerun only redoes what changed, and runs
of different sources keep their cells side by side. A run first reports every model's current cached cells.
A run of every model and tool writes ``benchmarks/results/corpus-<date>.json`` and regenerates RELIABILITY.md's first
section (:mod:`benchmarks.report_corpus`). A run of some (``--models`` or ``--tools``) writes only its results file,
``corpus-<date>-part-<models>-<tools>.json`` (which ``--report-only`` does not take as the newest), and leaves
RELIABILITY.md alone: its table of one model would replace the merged one. ``--table`` renders it all the same.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zoo import corpus as zcorpus

from . import corpus_metrics, report_corpus
from .harness import REPO_ROOT, RunConfig, _git, ensure_anchors, log_run, measure, new_results, onnxprec_source_hash
from .int8 import latency_ratios
from .tools import RUNNER

logger = logging.getLogger(__name__)

KIND = "corpus"
LATENCY_BUDGET_S = 0.05  # each timed block of a latency round runs the model about this long


@dataclasses.dataclass(frozen=True)
class CorpusTool:
    """One cell of the table: a command (``{M}`` model, ``{O}`` output, ``{C}`` calibration folder, ``{H}``
    held-out folder, ``{D}`` calibration ``.npz``, ``{Q}`` the INT8 result, ``{R}`` report JSON)."""

    id: str
    venv: str  # project or anchors
    argv: str
    writes_model: bool = True
    int8: bool = False  # an INT8 result: latency against FP32
    needs: str | None = None  # the tool whose result it reads as {Q}
    only_with_weights: bool = False  # INT4: models with MatMul or Gather weights
    optimize: bool = True  # judged with ORT's graph optimizations (off for FP8: its CPU rewrites break FP8 Convs)

    def user(self) -> str:
        cmd = self.argv.replace("-m onnxprec.cli", "onnxprec").replace(str(RUNNER) + " ", "benchmarks/_runner.py ")
        for k, v in {"{M}": "M.onnx", "{O}": "out.onnx", "{C}": "calib/", "{H}": "heldout/", "{D}": "calib.npz",
                     "{Q}": "M.int8.onnx", "{R}": "report.json"}.items():  # fmt: skip
            cmd = cmd.replace(k, v)
        return cmd if self.venv == "project" else f"(anchors venv) python {cmd}"


_AC = "-m onnxprec.cli autocast --onnx_path {M} --output_path {O} --keep_io_types --report_json {R}"
_Q8 = "-m onnxprec.cli quantize int8 --onnx_path {M} --output_path {O} --report_json {R}"
_MO = "-m modelopt.onnx.quantization --quantize_mode int8 --onnx_path {M} --output_path {O}"
_MO_FP8 = _MO.replace("int8", "fp8") + " --calibration_data_path {D} --calibration_eps cpu"
# fmt: off
TOOLS: dict[str, CorpusTool] = {t.id: t for t in (
    CorpusTool("autocast:fp16", "project", _AC),
    CorpusTool("autocast:fp16+data", "project", _AC + " -d {C}"),
    CorpusTool("autocast:bf16", "project", _AC + " --low_precision_type bf16"),
    CorpusTool("autocast:bf16+keep", "project", _AC + " --low_precision_type bf16 --keep_unsupported_fp32"),
    CorpusTool("int8", "project", _Q8 + " -d {C}", int8=True),
    CorpusTool("int8:nodata", "project", _Q8, int8=True),
    CorpusTool("int8:trt", "project", _Q8 + " -d {C} --runtime trt", int8=True),
    CorpusTool("int4", "project", "-m onnxprec.cli quantize int4 --onnx_path {M} --output_path {O} --report_json {R}",
               only_with_weights=True),
    CorpusTool("preprocess", "project", "-m onnxprec.cli preprocess --input {M} --output {O}"),
    CorpusTool("evaluate", "project", "-m onnxprec.cli evaluate {M} {Q} --data {H} --report_json {R}",
               writes_model=False, needs="int8"),
    CorpusTool("compare", "project", "-m onnxprec.cli compare {M} {Q} -d {C} --report_json {R}",
               writes_model=False, needs="int8"),
    CorpusTool("ort:quantize_static", "anchors", f"{RUNNER} ort_int8 --input {{M}} --output {{O}} --calib {{C}} "
               "--method MinMax", int8=True),
    CorpusTool("modelopt:int8", "anchors", _MO + " --calibration_data_path {D} --calibration_eps cpu", int8=True),
    CorpusTool("fp8", "project", _Q8.replace("int8", "fp8") + " -d {C}", optimize=False),
    CorpusTool("modelopt:fp8", "anchors", _MO_FP8, optimize=False),
)}
# fmt: on


# ------------------------------------------------------------------------------------------------------------
# inputs and outputs
# ------------------------------------------------------------------------------------------------------------


def batches(folder: Path) -> list[dict[str, np.ndarray]]:
    """The ``.npz`` batches of a split, in name order."""
    out = []
    for p in sorted(folder.glob("*.npz")):
        with np.load(p) as z:
            out.append({k: z[k] for k in z.files})
    return out


def merged_npz(folder: Path, dest: Path) -> Path:
    """The split as one ``.npz`` (batches concatenated on axis 0 when every input allows it, else the first
    batch), for tools that read a single file."""
    if not dest.exists():
        bs = batches(folder)
        try:
            joined = {k: np.concatenate([b[k] for b in bs]) for k in bs[0]}
            sizes = {v.shape[0] for v in joined.values()}
            data = joined if len(sizes) == 1 else bs[0]
        except ValueError:  # scalars or inputs whose batch is not on axis 0
            data = bs[0]
        np.savez(dest, **data)  # type: ignore[arg-type]
    return dest


def _session(path: Path, threads: int = 2, optimize: bool = True) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


_NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def run_outputs(
    path: Path, feeds: Sequence[Mapping[str, np.ndarray]], optimize: bool = True
) -> list[dict[str, np.ndarray]]:
    """The model's outputs on each batch with ONNX Runtime's CPU provider (float inputs cast to the model's float
    type; non-tensor outputs left out; float outputs as float32), with its graph optimizations unless ``optimize``
    is False."""
    s = _session(path, optimize=optimize)
    types = {i.name: _NP_TYPES.get(i.type) for i in s.get_inputs()}
    names = [o.name for o in s.get_outputs() if o.type.startswith("tensor")]
    out = []
    for f in feeds:
        cast = {k: v.astype(types[k]) if types.get(k) and v.dtype.kind == "f" else v for k, v in f.items()}
        res = s.run(names, cast)
        out.append({n: r.astype(np.float32) if r.dtype.kind == "f" else r for n, r in zip(names, res)})
    return out


def has_weights(path: Path) -> bool:
    """Whether the model has a MatMul/Gemm with a 2-D weight initializer or a Gather from a 2-D table (INT4's
    layers)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and len(dims.get(n.input[1], [])) == 2:
            return True
        if n.op_type == "Gather" and len(dims.get(n.input[0], [])) == 2 and min(dims[n.input[0]]) >= 16:
            return True
    return False


# ------------------------------------------------------------------------------------------------------------
# one cell
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelRun:
    """One model's run: its manifest record, folders, FP32 outputs and the version keys of the cells."""

    name: str
    rec: dict[str, Any]
    work: Path
    versions: dict[str, str]
    timeout_s: float
    anchors_python: Path | None
    ref: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)

    @property
    def src(self) -> Path:
        return Path(self.rec["path"])

    @property
    def calib(self) -> Path:
        return self.src.parent / "calib"

    @property
    def heldout(self) -> Path:
        return self.src.parent / "heldout"


def cell_key(mr: ModelRun, tool: CorpusTool, dep: str | None) -> str:
    """The cell's cache key: the model, its inputs, the command, onnxprec's sources or the anchors' versions, the
    result it reads, the metric and its bound."""
    parts = [mr.rec["sha256"], json.dumps(mr.rec.get("data"), sort_keys=True), tool.argv, mr.versions[tool.venv],
             dep or "", str(mr.rec["bound"]), json.dumps(mr.rec.get("metric_options"))]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _classify(rc: int | None, status: str, judged: dict[str, Any] | None, writes_model: bool, log: str) -> str:
    """pass | destroyed (exit 0, bound missed) | unloadable (exit 0, ONNX Runtime cannot run the result) |
    refused (non-zero exit with the tool's message) | crashed (non-zero exit with a Python traceback) | timeout |
    ok (a tool that writes no model, exit 0)."""
    if status in ("timeout", "memory-limit"):
        return status
    if rc:
        return "crashed" if "Traceback (most recent call last)" in log else "refused"
    if not writes_model:
        return "ok"
    if judged is None:
        return "unloadable"
    return "pass" if judged["passed"] else "destroyed"


def run_cell(
    mr: ModelRun, tool: CorpusTool, cells: dict[str, dict[str, Any]], run: bool = True
) -> dict[str, Any] | None:
    """Runs (or takes from the cache) one tool on one model; returns its cell. ``run`` false: only the cached cell
    (None when there is none for the current key), so that a run of some tools still reports the others."""
    dep = cells.get(tool.needs) if tool.needs else None
    if tool.needs and (not dep or dep.get("outcome") not in ("pass", "destroyed")):
        return {"outcome": "skipped", "reason": f"no {tool.needs} result to read"}
    if tool.only_with_weights and not has_weights(mr.src):
        return {"outcome": "n/a", "reason": "no MatMul/Gemm or Gather weights"}
    key = cell_key(mr, tool, dep.get("key") if dep else None)
    folder = mr.work / tool.id.replace(":", "_").replace("+", "_") / key  # versions side by side
    cached = folder / "cell.json"
    if cached.exists():
        old = json.loads(cached.read_text())
        if old.get("key") == key and (not tool.writes_model or old["outcome"] in ("refused", "crashed", "timeout")
                                      or (folder / "out.onnx").exists()):  # fmt: skip
            logger.info("%s %s: cached (%s)", mr.name, tool.id, old["outcome"])
            return dict(old, cached=True)
    if not run:
        return None
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model = folder / "model.onnx"
    for f in mr.src.parent.iterdir():  # a copy of the model (ModelOpt writes beside its input)
        if f.is_file() and (f.suffix == ".onnx" or f.name.endswith(".data") or f.name in _external(mr.src)):
            shutil.copy(f, folder / ("model.onnx" if f == mr.src else f.name))
    files: dict[str, Path] = {"M": model, "O": folder / "out.onnx", "C": mr.calib, "H": mr.heldout,
             "R": folder / "report.json", "D": merged_npz(mr.calib, mr.work / "calib.npz"),
             "Q": Path(dep["folder"] if dep else folder) / "out.onnx"}  # fmt: skip
    python = sys.executable if tool.venv == "project" else str(mr.anchors_python)
    argv = [python, *(a.format(**files) for a in tool.argv.split())]
    rec = measure(argv, folder / "log.txt", mr.timeout_s, cwd=REPO_ROOT)
    rc = rec.get("returncode")
    cell: dict[str, Any] = {"key": key, "folder": str(folder), "command": tool.user(), "rc": rc,
                            "status": rec["status"], "wall_s": rec.get("wall_s"),
                            "peak_rss_mb": rec.get("peak_rss_mb")}  # fmt: skip
    if rec["status"] != "ok":
        cell["message"] = str(rec.get("error", "")).strip().splitlines()[-1][:300] if rec.get("error") else ""
    judged = None
    if rec["status"] == "ok" and tool.writes_model:
        if not files["O"].exists():
            cell["message"] = "exit 0 but no output file"
        else:
            try:
                got = run_outputs(files["O"], batches(mr.heldout), tool.optimize)
                mr.ref = mr.ref or run_outputs(mr.src, batches(mr.heldout))
                judged = corpus_metrics.judge(mr.rec["metric"], mr.rec["bound"], mr.ref, got, mr.rec.get("output"),
                                              mr.rec.get("metric_options"))  # fmt: skip
                cell["metric"] = judged
            except Exception as e:  # a result ONNX Runtime cannot run is a result too
                cell["message"] = f"ONNX Runtime cannot run the result: {type(e).__name__}: {e}".splitlines()[0][:300]
    log = (folder / "log.txt").read_text(errors="replace") if (folder / "log.txt").exists() else ""
    cell["outcome"] = _classify(rc, rec["status"], judged, tool.writes_model, log)
    if tool.int8 and judged is not None:
        cell["latency"] = _latency(mr, files["O"])
    log_run(f"{mr.name} {tool.id} [{cell['outcome']}]", rec)
    for f in folder.glob("*.onnx*"):  # keep only the result (evaluate and compare read the INT8 one)
        if f.name not in ("out.onnx", "out.onnx.data") and not f.name.startswith("out."):
            f.unlink()
    partial = cached.with_suffix(".part")  # a run stopped mid-write leaves no truncated cell
    partial.write_text(json.dumps(cell, indent=1, default=_json) + "\n")
    partial.replace(cached)
    return cell


def _external(path: Path) -> set[str]:
    return zcorpus._external_locations(path)


def _json(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def _latency(mr: ModelRun, candidate: Path) -> dict[str, Any]:
    """The candidate's latency against FP32 on the first held-out batch, 2 threads, alternating rounds."""
    feeds = batches(mr.heldout)[0]
    s = _session(mr.src)
    t = time.perf_counter()
    s.run(None, feeds)
    one = time.perf_counter() - t
    runs = max(1, min(50, int(LATENCY_BUDGET_S / max(one, 1e-6))))
    try:
        res = latency_ratios({"fp32": mr.src, "candidate": candidate}, feeds, runs)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
    return {"fp32_ms": res["fp32"], "ratio": res["candidate"], "runs": runs}


# ------------------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------------------


def run_model(config: RunConfig, name: str, rec: dict[str, Any], tools: Sequence[str],
              versions: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """Every tool on one model, in :data:`TOOLS` order (a tool that reads another's result runs after it)."""
    t0 = time.perf_counter()
    work = Path(rec["path"]).parent.parent.parent / "cells" / name
    work.mkdir(parents=True, exist_ok=True)
    mr = ModelRun(name, rec, work, versions, config.timeout_s, config.anchors_python)
    cells: dict[str, dict[str, Any]] = {}  # FP32's held-out outputs are computed when a cell first needs them
    for tid in TOOLS:  # the tools asked for (and what they read) run; the others' current cached cells are reported
        asked = tid in tools or any(TOOLS[t].needs == tid for t in tools)
        if (cell := run_cell(mr, TOOLS[tid], cells, run=asked)) is not None:
            cells[tid] = cell
    block = {"kind": rec["kind"], "package": rec["package"], "bytes": rec["total_bytes"], "metric": rec["metric"],
             "bound": rec["bound"], "cells": cells,
             "seconds": time.perf_counter() - t0}  # fmt: skip
    logger.info("%s: done in %.0f s", name, block["seconds"])
    return block


def results_name(models: Sequence[str], tools: Sequence[str]) -> str:
    """The results file's name: ``corpus-<date>.json`` for every model and tool, else ``corpus-<date>-part-<models>-
    <tools>.json`` (one's name, or how many)."""
    date = f"{dt.date.today():%Y-%m-%d}"
    if not models and not tools:
        return f"corpus-{date}.json"
    part = [names[0] if len(names) == 1 else f"{len(names)}{what}" if names else f"all{what}"
            for names, what in ((models, "models"), (tools, "tools"))]  # fmt: skip
    return f"corpus-{date}-part-{'-'.join(part).replace(':', '_')}.json"


def run(config: RunConfig, jobs: int = 1, table: bool | None = None) -> Path:
    """Every tool (``config.tools``, default all) on every corpus model with inputs (``config.models``, default all);
    writes the results file and, with ``table`` (None: when the run covers every model and tool), RELIABILITY.md's
    section."""
    manifest = zcorpus.load_manifest()
    models = config.models or zcorpus.ready(manifest)
    if unknown := [m for m in models if m not in manifest["models"]]:
        raise ValueError(f"unknown corpus model(s) {', '.join(unknown)}; `python -m zoo.corpus list` shows them")
    tools = config.tools or list(TOOLS)
    if unknown := [t for t in tools if t not in TOOLS]:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}")
    ensure_anchors(config, {TOOLS[t].venv for t in tools})
    data = new_results(KIND, config, jobs=jobs, timeout_s=config.timeout_s)
    versions = {"project": f"src {onnxprec_source_hash()}",
                "anchors": json.dumps(data["versions"]["anchors"], sort_keys=True)}  # fmt: skip
    data.update(git=_git("rev-parse", "--short=10", "HEAD"), corpus=manifest["corpus"], tools=list(TOOLS), models={})
    path = config.results_dir / results_name(config.models or [], config.tools or [])
    for m in models:  # first every model's current cached cells, so that a stopped run still reports them
        data["models"][m] = run_model(config, m, manifest["models"][m], (), versions)
    _write(path, data)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {m: pool.submit(run_model, config, m, manifest["models"][m], tools, versions) for m in models}
        for m, fut in futures.items():
            try:
                data["models"][m] = fut.result()
            except Exception as e:  # one model's failure (its FP32 run, its inputs) must not lose the others
                logger.exception("%s: not run", m)
                data["models"][m] = {"error": f"{type(e).__name__}: {e}"[:300], **_meta(manifest["models"][m])}
            data["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
            _write(path, data)
    if table if table is not None else not (config.models or config.tools):
        report_corpus.write(path)
    else:
        logger.info("RELIABILITY.md left as it is (a run of some models or tools; --table renders it): %s", path)
    return path


def _meta(rec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: rec[k] for k in ("kind", "package", "metric", "bound")} | {"bytes": rec["total_bytes"], "cells": {}}


def _write(path: Path, data: dict[str, Any]) -> None:
    from .harness import write_results

    write_results(path, data)
