"""The utilities part of BENCHMARKS.md: ``onnxprec preprocess``, ``evaluate``, ``dump`` and ``compare`` (issue 10).

Reads ``benchmarks/results/utilities-*.json`` (:mod:`benchmarks.utilities`); for every (model, tool) the newest
measurement wins. Per model: one table (the FP16 candidate's production, then each tool: status, whole-process
time, peak RSS against the model's size, what it produced), then ``preprocess`` against ONNX Runtime's own
``quant_pre_process`` side by side, and the sentence the issue asks for: SmolLM2's peak RSS of dump and compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report_common import (
    TEXT,
    Column,
    blocks,
    column_table,
    load_results,
    model_label,
    model_sort_key,
    num,
    run_lines,
    short_error,
    size,
)
from .utilities import CANDIDATE, KIND, LLM, ORT_PREPROCESS, TOOL_IDS

MIB = 1 << 20
LABELS = {"matmul_4gb": "4 GiB MatMul stack (`matmul_4gb`)"}
TOOL_LABELS = {CANDIDATE: "*AutoCast FP16 (the candidate)*", ORT_PREPROCESS: "ORT `quant_pre_process`"}


@dataclass
class UtilitiesMerged:
    """The newest row of every (model, tool) (the candidate under :data:`CANDIDATE`), and each model's newest
    description (size, external data, data shapes)."""

    rows: dict[str, dict[str, dict[str, Any]]]
    models: dict[str, dict[str, Any]]
    runs: list[dict[str, Any]]


def merge(runs: Sequence[dict[str, Any]]) -> UtilitiesMerged:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    models: dict[str, dict[str, Any]] = {}
    for run in runs:
        for model, entry in run.get("models", {}).items():
            models[model] = {k: v for k, v in entry.items() if k not in ("tools", "candidate")}
            if entry.get("candidate"):
                rows.setdefault(model, {})[CANDIDATE] = {**entry["candidate"], "run": run["number"]}
            for tool, rec in entry.get("tools", {}).items():
                rows.setdefault(model, {})[tool] = {**rec, "run": run["number"]}
    return UtilitiesMerged(rows, models, list(runs))


def _model(name: str) -> str:
    return LABELS.get(name, model_label(name))


def _rss(rec: dict[str, Any]) -> str:
    peak = rec.get("peak_rss_mb")
    return f"{num(peak, 0)} MiB" if peak else "–"


def _status(rec: dict[str, Any]) -> str:
    status = rec.get("status", "?")
    if status == "ok":
        return "ok"
    err = short_error(rec.get("error"), 160).replace("|", "\\|")
    return f"**{status}**" + (f": {err}" if err else "")


def _produced(tool: str, rec: dict[str, Any]) -> str:
    """What the tool wrote or found, in a few words."""
    if rec.get("status") != "ok":
        return "–"
    if tool in (CANDIDATE, "preprocess", ORT_PREPROCESS):
        return size(rec.get("output_bytes")) if rec.get("output_bytes") else "–"
    if tool == "dump":
        return f"{rec.get('tensors', '?')} tensors, {size(rec.get('output_bytes'))}"
    if tool == "compare":
        counts = rec.get("counts") or {}
        first = rec.get("first_divergence")
        node = first.get("node") if isinstance(first, dict) else first
        out = [f"{counts.get('compared', '?')}/{counts.get('tensors', '?')} tensors compared"]
        out.append(f"{counts.get('diverged', '?')} diverged (first `{node}`)" if first else "no divergence")
        first_output = list((rec.get("outputs") or {}).items())[:1]
        out += [f"`{name}` rel L2 {num(o.get('rel_l2'), 2)}" for name, o in first_output]
        return ", ".join(out)
    if tool == "evaluate":
        parts = []
        for m in rec.get("evaluated") or []:
            ppl = m.get("perplexity")
            who = "FP32" if m.get("reference") else "FP16"
            if ppl is not None:
                parts.append(f"{who} ppl {ppl:.3f}")
            agreement = next(iter((m.get("agreement") or {}).values()), None)
            if agreement and agreement.get("top1") is not None:
                parts.append(f"top-1 agreement {agreement['top1'] * 100:.1f} %")
        return ", ".join(parts) or "–"
    return "–"


def _tool_columns(model_bytes: int | None) -> tuple[Column, ...]:
    """The model table's columns over ``(tool, row)`` pairs."""
    per_size = lambda p: f"{num(p * MIB / model_bytes)}×" if p and model_bytes else "–"  # noqa: E731
    return (
        ("Tool", lambda x: TOOL_LABELS.get(x[0], f"onnxprec `{x[0]}`")),
        ("command", lambda x: f"`{x[1].get('command', '')}`"),
        ("status", lambda x: _status(x[1])),
        ("time s", lambda x: num(x[1].get("wall_s"))),
        ("peak RSS", lambda x: _rss(x[1])),
        ("peak RSS / model size", lambda x: per_size(x[1].get("peak_rss_mb"))),
        ("result", lambda x: _produced(*x)),
        ("run", lambda x: f"[U{x[1]['run']}]"),
    )


def model_table(m: UtilitiesMerged, model: str) -> list[str]:
    rows_in = m.rows.get(model, {})
    desc = m.models.get(model, {})
    order = [CANDIDATE, *TOOL_IDS, *sorted(t for t in rows_in if t not in TOOL_IDS and t != CANDIDATE)]
    weights = "weights in external data" if desc.get("external_data") else "weights inside the protobuf"
    data = ", ".join(f"`{k}` {v}" for k, v in (desc.get("data") or {}).items())
    rows = [(tool, rows_in[tool]) for tool in order if tool in rows_in]
    heading = f"### {_model(model)}: {size(desc.get('file_bytes'))} ({weights}); data {data or '–'}"
    return blocks(heading, column_table(_tool_columns(desc.get("file_bytes")), rows) or "")


def preprocess_table(m: UtilitiesMerged) -> list[str]:
    pairs = [(model, m.rows[model].get("preprocess"), m.rows[model].get(ORT_PREPROCESS)) for model in m.rows]
    pairs = sorted((x for x in pairs if x[1] is not None and x[2] is not None), key=lambda x: model_sort_key(x[0]))
    time_cell = lambda r: num(r.get("wall_s")) if r.get("status") == "ok" else _status(r)  # noqa: E731

    def ort_over_ours(key: str) -> Callable[[tuple[str, dict[str, Any], dict[str, Any]]], str]:
        ran = lambda r: r.get("status") == "ok" and r.get(key)  # noqa: E731
        return lambda x: f"**{num(x[2][key] / x[1][key])}×**" if ran(x[1]) and ran(x[2]) else "–"

    columns: tuple[Column, ...] = (
        ("Model", lambda x: _model(x[0])),
        ("size", lambda x: size(m.models.get(x[0], {}).get("file_bytes"))),
        ("onnxprec time s", lambda x: time_cell(x[1])),
        ("ORT time s", lambda x: time_cell(x[2])),
        ("ORT / onnxprec time", ort_over_ours("wall_s")),
        ("onnxprec peak RSS", lambda x: _rss(x[1])),
        ("ORT peak RSS", lambda x: _rss(x[2])),
        ("ORT / onnxprec RSS", ort_over_ours("peak_rss_mb")),
    )
    made = column_table(columns, pairs)
    if not made:
        return []
    heading = "### `onnxprec preprocess` and ONNX Runtime's `quant_pre_process`, side by side"
    return blocks(heading, TEXT["utilities.preprocess"], made)


def llm_sentence(m: UtilitiesMerged) -> list[str]:
    """SmolLM2's peak RSS of dump and compare, as the issue asks."""
    rows = m.rows.get(LLM, {})
    dump, compare = rows.get("dump"), rows.get("compare")
    if not dump and not compare:
        return []
    model_bytes = m.models.get(LLM, {}).get("file_bytes")

    def one(tool: str, rec: dict[str, Any] | None) -> str:
        if rec is None:
            return f"`onnxprec {tool}` was not measured"
        if rec.get("status") != "ok" or not rec.get("peak_rss_mb"):
            return f"`onnxprec {tool}` {_status(rec)} [U{rec['run']}]"
        return f"`onnxprec {tool}` peaks at **{num(rec['peak_rss_mb'], 0)} MiB** [U{rec['run']}]"

    data = ", ".join(f"`{k}` {v}" for k, v in (m.models.get(LLM, {}).get("data") or {}).items())
    wrote = ""
    if dump and dump.get("status") == "ok" and dump.get("tensors"):
        wrote = f": {dump['tensors']} tensors, {size(dump.get('output_bytes'))} written"
    return [
        f"**Peak RSS on {model_label(LLM)}** ({size(model_bytes)} FP32 model, one window {data}): "
        f"{one('dump', dump)} (every float node output, `--dump_float`{wrote}) and {one('compare', compare)} "
        "(FP32 against its FP16 AutoCast, node by node).",
        "",
    ]


def max_load(run: dict[str, Any]) -> float | None:
    """The highest 1-minute load average seen around the run's tool processes (None for older files)."""
    loads = [
        x[k]
        for entry in run.get("models", {}).values()
        for rec in [entry.get("candidate") or {}, *entry.get("tools", {}).values()]
        for x in rec.get("rounds", [])
        for k in ("load_before", "load_after")
        if x.get(k) is not None
    ]
    return max(loads, default=None)


def runs_list(m: UtilitiesMerged) -> list[str]:
    out = []
    for r in m.runs:
        load, cores = max_load(r), r.get("machine", {}).get("cores")
        at_end = r.get("onnxprec_sources_at_end")
        settings = f"onnxprec sources sha256 {r['versions']['project'].get('onnxprec_src_sha256', '?')}"
        settings += f", **changed during the run** to {at_end}" if at_end else ""
        if load is not None and cores and load > 0.75 * cores + 1:
            settings += f"; **the machine was busy** (1-min load average up to {num(load, 1)}): times are stretched"
        out += [*run_lines(r, f"U{r['number']}", settings), ""]
    return out


def sections(results_dir: Path) -> list[str]:
    """The utilities part of BENCHMARKS.md (empty without utilities results)."""
    runs = load_results(results_dir, KIND)
    if not runs:
        return []
    m = merge(runs)
    out = blocks("## Utilities (preprocess, evaluate, dump, compare)", TEXT["utilities.intro"])
    out += runs_list(m) + llm_sentence(m)
    for model in sorted(m.rows, key=model_sort_key):
        out += model_table(m, model)
    return out + blocks(TEXT["utilities.memory"]) + preprocess_table(m)
