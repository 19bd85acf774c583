"""The INT8 part: onnxprec's INT8 quantizer beside ONNX Runtime's and ModelOpt's, the anchors in the same run.

    python -m benchmarks int8 [--models minilm_l6_v2,efficientnet_lite0] [--tools ID,...] [--tag T]

Every tool of :data:`TOOLS` quantizes a copy of each FP32 model of :data:`MODELS` as its own process (the harness's
runner: wall time, peak RSS); then, in this process, agreement with FP32 on each evaluation set (:func:`agreement`)
and CPU latency against FP32 (:func:`latency_ratios`). The method is ``report_text.md``'s ``int8.intro``; the run
stores its finished table in ``int8-<date>-<tag>.json``, which the report renders as the by-hand INT8 tables.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import zoo
from onnxprec import metrics
from onnxprec._latency import time_alternating
from onnxprec._ort_profile import profile_kernels

from .harness import REPO_ROOT, RunConfig, ensure_anchors, log_run, measure, run_models, write_results
from .report_common import TEXT, model_label, num, run_lines
from .tools import RUNNER, parse_tools

logger = logging.getLogger(__name__)

SHARED = REPO_ROOT.parent / "shared" / "models"
ROUNDS = 15  # latency rounds; in each every model runs --latency-runs times at batch 1, a quarter at the usual batch
_ORT = f"{RUNNER} ort_int8 --input {{M}} --output {{O}} --calib {{F}} --method "
_STATIC = "quantize_static(M, O, reader, quant_format=QuantFormat.QDQ, per_channel=True, calibrate_method=Calibration"
_CLI = "--quantize_mode int8 --onnx_path {M} --output_path {O}"
# tool id: (venv, the command after the interpreter: {M} model, {D} calibration .npz, {F} a folder of its samples,
# {O} output; what a user calls)
TOOLS: dict[str, tuple[str, str, str]] = {
    "onnxprec": ("project", f"-m onnxprec.quantization {_CLI} --calibration_data {{D}}",
                 f"python -m onnxprec.quantization {_CLI.format(M='M', O='O')} --calibration_data D"),
    **{f"ort:{m.lower()}": ("anchors", _ORT + m, f"{_STATIC}Method.{m})") for m in ("MinMax", "Entropy", "Percentile")},
    "ort:smoothquant": ("anchors", _ORT + "SmoothQuant",
                        f'{_STATIC}Method.MinMax, extra_options={{"SmoothQuant": True}})'),
    "ort:dynamic": ("anchors", _ORT + "dynamic", "quantize_dynamic(M, O, per_channel=True)"),
    "modelopt": ("anchors", f"-m modelopt.onnx.quantization {_CLI} --calibration_data_path {{D}} --calibration_eps cpu",
                 f"python -m modelopt.onnx.quantization {_CLI.format(M='M', O='O')} --calibration_data_path D "
                 "--calibration_eps cpu"),
}  # fmt: skip
# zoo name: (its file in ../shared/models, calibration rows, evaluation sets {name: rows; None: the held-out images},
# rows per ORT run, the output compared (None: the first), latency rows at batch 1, at the usual batch)
MODELS: dict[str, tuple[str, slice, dict[str, slice | None], int, str | None, slice, slice]] = {
    "minilm_l6_v2": ("minilm_l6_v2_bert", slice(0, 4), {"rows 4-7": slice(4, 8)}, 4, "last_hidden_state",
                     slice(4, 5), slice(4, 8)),
    "efficientnet_lite0": ("efficientnet_lite0", slice(0, 7),
                           {"calibration 7": slice(0, 7), "held out 29": None}, 1, None, slice(0, 1), slice(0, 7)),
}  # fmt: skip


def agreement(ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """A candidate's outputs against FP32's (samples along axis 0): rel L2 and cosine of all of them, the worst
    sample's rel L2, and for ``[N, classes]`` outputs the top-1 agreement."""
    out: dict[str, Any] = {"rel_l2": metrics.rel_l2(ref, got), "cosine": metrics.cosine(ref, got), "n": len(ref)}
    out["worst_rel_l2"] = max(metrics.rel_l2(r, g) for r, g in zip(ref, got))
    return out | ({"top1": int((ref.argmax(1) == got.argmax(1)).sum())} if ref.ndim == 2 else {})


def _session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = 2, 1, 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]


def latency_ratios(paths: Mapping[str, Path], feeds: dict[str, np.ndarray], runs: int) -> dict[str, Any]:
    """Latency against the first of ``paths`` on ``feeds``, 2 threads: :data:`ROUNDS` rounds, each timing ``runs``
    runs of every model in turn (the order rotating), after 3 warm-up runs each (:func:`time_alternating`)."""
    sessions = {k: _session(p) for k, p in paths.items()}
    latencies = time_alternating(
        [functools.partial(s.run, None, feeds) for s in sessions.values()], ROUNDS, runs=runs, warmup=3
    )
    first, *others = paths
    ratios = latencies.ratios()
    return {first: latencies.median_ms(0)} | {key: ratios[i] for i, key in enumerate(others, 1)}


def _outputs(path: Path, sets: dict[str, dict[str, np.ndarray]], per_run: int, output: str | None) -> dict[str, Any]:
    """The compared output of ``path`` on every evaluation set, ``per_run`` samples per ONNX Runtime call."""
    s = _session(path)
    name = [output or s.get_outputs()[0].name]
    steps = {k: range(0, len(next(iter(x.values()))), per_run) for k, x in sets.items()}
    return {k: np.concatenate([s.run(name, {n: v[i : i + per_run] for n, v in x.items()})[0] for i in steps[k]])
            for k, x in sets.items()}  # fmt: skip


def _data(model: str, work: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """The FP32 model, its inputs and evaluation sets; writes ``calib.npz`` and ``calib/`` (one sample a file)."""
    stem, calib, sets, *_ = MODELS[model]
    inputs = next(SHARED.glob(f"{stem}_input*"))  # real inputs: an .npz of every input, or the images' .npy
    z = np.load(inputs)
    data = {k: z[k] for k in z.files} if inputs.suffix == ".npz" else {"input": z}
    (work / "calib").mkdir(parents=True)
    np.savez(work / "calib.npz", **{k: v[calib] for k, v in data.items()})
    for i in range(calib.start, calib.stop):
        np.savez(work / "calib" / f"{i:03d}.npz", **{k: v[i : i + 1] for k, v in data.items()})
    evaluation = {k: {n: v[rows] for n, v in data.items()} for k, rows in sets.items() if rows is not None}
    if None in sets.values():  # EfficientNet-Lite0's 29 held-out images, made in the torch venv
        cmd = [str(zoo.ensure_torch_venv()), "experiments/int8_effnet.py", "images", str(work / "h.npy")]
        subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True)
        evaluation.update({k: {"input": np.load(work / "h.npy")} for k, rows in sets.items() if rows is None})
    return SHARED / f"{stem}.onnx", data, evaluation


def run(config: RunConfig) -> Path:
    """Every tool on every model, then accuracy and latency; returns the results file, with its finished table."""
    config.models = config.models or list(MODELS)
    tools = parse_tools(config.tools or list(TOOLS), TOOLS)
    if unknown := [m for m in config.models if m not in MODELS]:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; the INT8 part knows {', '.join(MODELS)}")
    ensure_anchors(config, {TOOLS[t][0] for t in tools})
    path = run_models(config, "int8", lambda m, work: _run_model(config, m, tools, work), latency_rounds=ROUNDS)
    data = json.loads(path.read_text())
    settings = f"settings: {ROUNDS} latency rounds of {config.latency_runs} runs at batch 1"
    cited = {**data, "file": Path(os.path.relpath(path, REPO_ROOT)).as_posix()}
    data.update(title=f"INT8 (issue 18) against the anchors in one run: {', '.join(map(model_label, data['models']))}",
                intro=[TEXT["int8.intro"], "", *run_lines(cited, "this run", settings)],
                tables=[table(model, block) for model, block in data["models"].items()])  # fmt: skip
    write_results(path, data)
    return path


def _run_model(config: RunConfig, model: str, tools: list[str], work: Path) -> dict[str, Any]:
    src, data, sets = _data(model, work)
    block: dict[str, Any] = {"sets": {k: len(next(iter(x.values()))) for k, x in sets.items()}, "tools": {}}
    block["fp32_sha256"] = hashlib.sha256(src.read_bytes()).hexdigest()  # ../shared is writable: say which file
    outputs = {"fp32": src}
    for tool in tools:
        venv, template, user = TOOLS[tool]
        rdir = work / tool.replace(":", "_")
        rdir.mkdir()
        shutil.copy(src, rdir / "model.onnx")  # ModelOpt writes beside its input
        files = {"M": rdir / "model.onnx", "D": work / "calib.npz", "F": work / "calib", "O": rdir / "out.onnx"}
        argv = [str(sys.executable if venv == "project" else config.anchors_python)]
        rec = measure(argv + template.format(**files).split(), rdir / "log.txt", config.timeout_s, config.mem_limit_mb)
        if rec["status"] == "ok" and not files["O"].exists():
            rec.update(status="failed", error="no output file")
        log_run(f"{model} {tool}", rec)
        block["tools"][tool] = {"command": user, **rec}
        outputs.update({tool: files["O"]} if rec["status"] == "ok" else {})
    _, _, _, per_run, output, one, usual = MODELS[model]
    ref = _outputs(src, sets, per_run, output)
    for tool, path in list(outputs.items())[1:]:
        entry = block["tools"][tool]
        try:
            got = _outputs(path, sets, per_run, output)
            entry["accuracy"] = {k: agreement(ref[k], got[k]) for k in sets}
            p = profile_kernels(path, {k: v[one] for k, v in data.items()})  # evaluate's kernel profile, batch 1
            entry["kernels"] = [p.integer_nodes, p.nodes, p.integer_share, p.qdq_nodes]
        except Exception as e:  # a result ONNX Runtime cannot run is a result too (left out of the latency)
            if "accuracy" not in entry:
                entry["accuracy"] = _error(e)
                del outputs[tool]
    for label, rows, runs in (("batch 1", one, config.latency_runs), ("usual", usual, config.latency_runs // 4)):
        if config.latency:
            logger.info("%s: latency at %s (rows %d-%d)", model, label, rows.start, rows.stop - 1)
            block.setdefault("latency", {})[label] = {"rows": rows.stop - rows.start, **latency_ratios(
                outputs, {k: v[rows] for k, v in data.items()}, max(2, runs))}  # fmt: skip
    return block


def _accuracy(acc: Any, name: str) -> str:
    if isinstance(acc, str) or name not in acc:
        return f"**does not run**: {acc[:80]}" if isinstance(acc, str) else "–"
    a = acc[name]
    if "top1" in a:
        return f"{num(a['rel_l2'], 3)} ({num(a['worst_rel_l2'], 3)}) / {a['top1']}/{a['n']}"
    return f"{a['cosine']:.5f} / {num(a['rel_l2'], 3)} ({num(a['worst_rel_l2'], 3)})"


def _kernels(e: dict[str, Any]) -> str:
    i, n, share, qdq = e.get("kernels") or [None] * 4
    return "–" if n is None else f"{i}/{n} ({'–' if share is None else f'{share:.0%}'}), {qdq}"


def table(model: str, block: dict[str, Any]) -> dict[str, Any]:
    """The model's finished table (``heading``, ``columns``, ``rows``, ``notes``), as the report renders it."""
    lat = block.get("latency", {})
    top1 = "calibration 7" in block["sets"]
    kind = "rel L2 (worst image) / top-1" if top1 else "cosine / rel L2 (worst row)"
    size = lat.get("usual", {}).get("rows", "?")
    columns = ["tool", *(f"{s}: {kind}" for s in block["sets"]), f"latency vs FP32, batch 1 / {size}",
               "integer kernels / all (time), Q/DQ left", "quantization: wall (own call)", "peak RSS"]  # fmt: skip
    rows = []
    for tool, e in block["tools"].items():
        if e["status"] != "ok":
            error = str(e.get("error", "")).strip().splitlines() or [""]
            rows.append([f"`{tool}`", f"**{e['status']}**: {error[-1][:120]}", *[""] * (len(columns) - 2)])
            continue
        vs = [lat.get(b, {}).get(tool) for b in ("batch 1", "usual")]
        wall = f"{num(e['wall_s'], 1)} s" + (f" ({num(e['convert_s'], 1)} s)" if e.get("convert_s") else "")
        rows.append([f"`{tool}`", *(_accuracy(e.get("accuracy", {}), s) for s in block["sets"]),
                     " / ".join(f"{num(v)}x" if isinstance(v, float) else "–" for v in vs), _kernels(e), wall,
                     f"{num(e['peak_rss_mb'], 0)} MiB"])  # fmt: skip
    fp32 = f"FP32 `{block.get('fp32_sha256', '?')[:8]}…`, batch 1: {num(lat.get('batch 1', {}).get('fp32'))} ms"
    notes = [[f"- `{t}`: `{e['command']}`" for t, e in block["tools"].items()]]
    return {"heading": f"{model_label(model)} ({fp32})", "columns": columns, "rows": rows, "notes": notes}
