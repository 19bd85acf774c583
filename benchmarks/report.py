"""BENCHMARKS.md (and the scaling chart) from the result files, without rerunning anything.

Every ``benchmarks/results/*.json`` written by ``python -m benchmarks run`` is read, oldest first; for each model
and tool the newest measurement wins, so a partial rerun (``--models smollm2_135m --tools onnxprec,modelopt``)
updates only its rows. Ratios between two tools come from the same run, round by round; when the newest
measurements of a tool and its anchor come from different runs the ratio of their medians is shown instead,
marked with a dagger. GPU latencies come from ``benchmarks/results/gpu-*.json`` (``benchmarks/gpu_latency.py``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tools import TOOLS
from .zoo import SMOLLM2_FP32_PERPLEXITY

logger = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]
MD_PATH = REPO_ROOT / "BENCHMARKS.md"
PNG_NAME = "scaling.png"
GIB_MB = 1024.0
ERROR_TOLERANCE = 1.05  # "output error no worse": relative L2 at most 5 % above ModelOpt's
MODEL_LABELS = {
    "efficientnet_lite0": "EfficientNet-Lite0",
    "minilm_l6_v2": "MiniLM-L6-v2",
    "smollm2_135m": "SmolLM2-135M",
}
TOOL_ORDER = ("onnxprec", "modelopt", "onnxprec:inf", "modelopt:inf", "occ_fp16", "occ_amp", "ort_fp16")


# ------------------------------------------------------------------------------------------------------------
# loading and merging
# ------------------------------------------------------------------------------------------------------------


def load_results(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every run's result file, oldest first (GPU files excluded)."""
    runs = []
    for p in sorted(results_dir.glob("*.json")):
        if p.name.startswith("gpu-"):
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            logger.warning("skipping %s: %s", p, e)
            continue
        if isinstance(data, dict) and "models" in data:
            data.setdefault("run_id", p.stem)
            try:
                data["file"] = p.resolve().relative_to(REPO_ROOT).as_posix()
            except ValueError:
                data["file"] = str(p)
            runs.append(data)
    runs.sort(key=lambda d: d.get("date", ""))
    return runs


def load_gpu_results(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every ``gpu-*.json``, oldest first."""
    out = []
    for p in sorted(results_dir.glob("gpu-*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            logger.warning("skipping %s: %s", p, e)
            continue
        data.setdefault("file", p.name)
        out.append(data)
    out.sort(key=lambda d: d.get("date", ""))
    return out


@dataclass
class Merged:
    """The newest measurement of every (model, tool), and the runs they come from."""

    models: dict[str, dict[str, Any]]
    runs: list[dict[str, Any]]  # the runs that contributed, oldest first

    def run_number(self, run_id: str) -> int:
        return next(i for i, r in enumerate(self.runs, 1) if r["run_id"] == run_id)


def merge(runs: Sequence[dict[str, Any]]) -> Merged:
    """Newest wins per (model, tool); a skipped or unrun tool never hides an older measurement."""
    models: dict[str, dict[str, Any]] = {}
    for run in runs:
        for name, block in run.get("models", {}).items():
            m = models.setdefault(name, {"tools": {}, "fp32": {}})
            for key in ("family", "file_bytes"):
                if key in block:
                    m[key] = block[key]
            if block.get("fp32"):
                m["fp32"] = {**block["fp32"], "_run": run["run_id"]}
            for tool, entry in block.get("tools", {}).items():
                if entry.get("status") in ("skipped", "not run") and tool in m["tools"]:
                    continue
                m["tools"][tool] = {**entry, "_run": run["run_id"]}
    used = {e["_run"] for m in models.values() for e in m["tools"].values()}
    used |= {m["fp32"]["_run"] for m in models.values() if m["fp32"].get("_run")}
    merged = Merged(models, [r for r in runs if r["run_id"] in used])
    for m in models.values():
        for tool, entry in m["tools"].items():
            entry["_vs"] = {}
            for anchor in ("modelopt", "modelopt:inf", "baseline_loadsave"):
                other = m["tools"].get(anchor)
                if anchor == tool or other is None:
                    continue
                same_run = other["_run"] == entry["_run"]
                if same_run and anchor in entry.get("vs", {}):
                    entry["_vs"][anchor] = entry["vs"][anchor]
                elif not same_run:
                    cross = _cross_ratio(entry, other)
                    if cross:
                        entry["_vs"][anchor] = cross
    return merged


def _median(entry: dict[str, Any], key: str) -> float | None:
    s = entry.get("summary", {}).get(key)
    return s["median"] if s else None


def _cross_ratio(entry: dict[str, Any], anchor: dict[str, Any]) -> dict[str, Any] | None:
    tw, aw = _median(entry, "wall_s"), _median(anchor, "wall_s")
    if not tw or not aw:
        return None
    one = {"n": 1}
    out: dict[str, Any] = {
        "speedup": {"median": aw / tw, "min": aw / tw, "max": aw / tw, **one},
        "time_ratio": {"median": tw / aw, "min": tw / aw, "max": tw / aw, **one},
        "paired": False,
    }
    tr, ar = _median(entry, "peak_rss_mb"), _median(anchor, "peak_rss_mb")
    if tr and ar:
        out["rss_ratio"] = {"median": tr / ar, "min": tr / ar, "max": tr / ar, **one}
    return out


# ------------------------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------------------------


def _num(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    ax = abs(x)
    if ax != 0 and (ax < 10 ** -(digits + 1) or ax >= 1e6):
        return f"{x:.{max(1, digits - 1)}e}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.{max(0, digits - 1)}f}"
    return f"{x:.{digits}f}" if ax >= 0.01 or ax == 0 else f"{x:.{digits + 2}f}"


def _stat(s: dict[str, Any] | None, digits: int = 2) -> str:
    if not s:
        return "–"
    med, lo, hi = (_num(s[k], digits) for k in ("median", "min", "max"))
    if s.get("n", 1) <= 1 or lo == hi:
        return med
    return f"{med} [{lo}–{hi}]"


def _ratio(s: dict[str, Any] | None, paired: bool = True, digits: int = 2) -> str:
    if not s:
        return "–"
    text = f"**{_num(s['median'], digits)}×**"
    lo, hi = _num(s["min"], digits), _num(s["max"], digits)
    if s.get("n", 1) > 1 and lo != hi:
        text += f" [{lo}–{hi}]"
    return text + ("" if paired else " †")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = list(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _model_label(name: str) -> str:
    return MODEL_LABELS.get(name, name)


def _tool_label(tool: str, entry: dict[str, Any]) -> str:
    return entry.get("label") or (TOOLS[tool].label if tool in TOOLS else tool)


def _anchor_of(tool: str) -> str | None:
    if tool in TOOLS:
        return TOOLS[tool].anchor
    return "modelopt:inf" if tool.endswith(":inf") else "modelopt"


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "–"
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def _ordered(tools: dict[str, Any]) -> list[str]:
    return sorted(tools, key=lambda t: (TOOL_ORDER.index(t) if t in TOOL_ORDER else len(TOOL_ORDER), t))


def _model_sort_key(name: str) -> tuple[int, float, str]:
    if name.startswith("chain_"):
        return (1, float(name.split("_")[1]), name)
    if name.startswith("matmul_"):
        return (2, float(name[len("matmul_") : -2]), name)
    return (0, 0.0, name)


def _status_text(entry: dict[str, Any]) -> str:
    status = entry.get("status", "?")
    if status == "skipped":
        return f"skipped: {entry.get('reason', '')}"
    first = (entry.get("runs") or [{}])[0]
    if status == "memory-limit":
        peak, wall = _num(first.get("poll_peak_rss_mb"), 0), _num(first.get("wall_s"))
        return f"**memory-limit**: stopped at {peak} MiB after {wall} s"
    if status == "timeout":
        return f"**timeout** after {_num(first.get('wall_s'))} s"
    return f"**{status}**" + (f": {_short_error(entry.get('error'))}" if entry.get("error") else "")


def _short_error(err: object, width: int = 80) -> str:
    """A failure message shortened for a table cell."""
    text = str(err or "")
    if "Load model from" in text and "failed:" in text:
        return "ONNX Runtime cannot load the result (" + text.split("failed:", 1)[1].strip()[: width - 40] + "…)"
    return text[:width]


# ------------------------------------------------------------------------------------------------------------
# targets
# ------------------------------------------------------------------------------------------------------------


@dataclass
class TargetRow:
    """One of the AutoCast issue's targets, evaluated on the newest numbers."""

    target: str
    measured: str
    goal: str
    reached: bool | None
    context: str = ""
    run: str = ""


def _vs(m: dict[str, Any] | None, tool: str, anchor: str) -> dict[str, Any] | None:
    if not m or tool not in m["tools"]:
        return None
    return m["tools"][tool].get("_vs", {}).get(anchor)


def targets(merged: Merged) -> list[TargetRow]:
    """Every target of the AutoCast issue that the merged results can answer (unmeasured ones as such)."""
    rows: list[TargetRow] = []
    M = merged.models

    def run_of(model: str, tool: str) -> str:
        e = M.get(model, {}).get("tools", {}).get(tool)
        return f"[{merged.run_number(e['_run'])}]" if e else ""

    def speed_row(model: str, goal: float, tool: str = "onnxprec", anchor: str = "modelopt", note: str = "") -> None:
        v = _vs(M.get(model), tool, anchor)
        s = v["speedup"] if v else None
        aw = _median(M[model]["tools"][anchor], "wall_s") if model in M and anchor in M[model]["tools"] else None
        rows.append(
            TargetRow(
                f"{_model_label(model)}: whole process ≥{goal:g}× faster than ModelOpt",
                _ratio(s, v.get("paired", True) if v else True, 1) if s else "not measured",
                f"≥ {goal:g}×",
                s["median"] >= goal if s else None,
                (f"ModelOpt here {_num(aw)} s" if aw else "") + note,
                run_of(model, tool),
            )
        )

    sm = "smollm2_135m"
    speed_row(sm, 10, note=" (issue: 156 s)")
    v = _vs(M.get(sm), "onnxprec", "modelopt")
    rss = v.get("rss_ratio") if v else None
    ar = _median(M[sm]["tools"]["modelopt"], "peak_rss_mb") if sm in M and "modelopt" in M[sm]["tools"] else None
    rows.append(
        TargetRow(
            "SmolLM2-135M: peak RSS ≤ 1/3 of ModelOpt's",
            _ratio(rss, v.get("paired", True) if v else True, 3) if rss else "not measured",
            "≤ 0.333×",
            rss["median"] <= 1 / 3 if rss else None,
            (f"ModelOpt here {_num(ar / 1024)} GiB" if ar else "") + " (issue: 5.9 GB)",
            run_of(sm, "onnxprec"),
        )
    )
    v = _vs(M.get(sm), "onnxprec:inf", "baseline_loadsave")
    tr = v["time_ratio"] if v else None
    rows.append(
        TargetRow(
            "SmolLM2-135M, data_max=inf: wall ≤ 1.5× a plain onnx.load + onnx.save",
            _ratio(tr, v.get("paired", True) if v else True) if tr else "not measured",
            "≤ 1.5×",
            tr["median"] <= 1.5 if tr else None,
            "",
            run_of(sm, "onnxprec:inf"),
        )
    )
    for model, tool, label in (
        (sm, "onnxprec:inf", "SmolLM2-135M, data_max=inf: peak RSS < 1 GiB"),
        ("matmul_4gb", "onnxprec:inf", "4 GiB external-data MatMul stack, data_max=inf: peak RSS < 1 GiB"),
    ):
        e = M.get(model, {}).get("tools", {}).get(tool)
        r = e.get("summary", {}).get("peak_rss_mb") if e else None
        rows.append(
            TargetRow(
                label,
                f"{_stat(r, 0)} MiB" if r else ("not measured" if not e else _status_text(e)),
                "< 1024 MiB",
                r["median"] < GIB_MB if r else (False if e else None),
                "",
                run_of(model, tool),
            )
        )
    speed_row("minilm_l6_v2", 5)
    speed_row("efficientnet_lite0", 5)
    for tool in ("onnxprec", "onnxprec:inf"):
        e = M.get("chain_2000", {}).get("tools", {}).get(tool)
        w = e.get("summary", {}).get("wall_s") if e else None
        aw = (
            _median(M["chain_2000"]["tools"][_anchor_of(tool) or "modelopt"], "wall_s")
            if ("chain_2000" in M and (_anchor_of(tool) or "modelopt") in M["chain_2000"]["tools"])
            else None
        )
        rows.append(
            TargetRow(
                f"2000-node chain{' (data_max=inf)' if tool.endswith(':inf') else ''}: whole process < 2 s",
                f"{_stat(w)} s" if w else ("not measured" if not e else _status_text(e)),
                "< 2 s",
                w["median"] < 2 if w else (False if e else None),
                (f"ModelOpt here {_num(aw)} s" if aw else "") + " (issue: 68 s)",
                run_of("chain_2000", tool),
            )
        )
    rows += _quality_targets(merged)
    e = M.get(sm, {}).get("tools", {}).get("onnxprec")
    ppl = e.get("accuracy", {}).get("perplexity") if e else None
    base = M.get(sm, {}).get("fp32", {}).get("perplexity") or SMOLLM2_FP32_PERPLEXITY
    rel = abs(ppl - base) / base if ppl is not None else None
    rows.append(
        TargetRow(
            "SmolLM2-135M FP16 perplexity within 0.5 % of FP32",
            f"{_num(ppl, 3)} ({rel * 100:+.2f} %)" if rel is not None else "not measured",
            f"≤ 0.5 % from {_num(base, 3)}",
            rel <= 0.005 if rel is not None else None,
            f"FP32 measured {_num(base, 3)} (reference {SMOLLM2_FP32_PERPLEXITY})",
            run_of(sm, "onnxprec"),
        )
    )
    return rows


def _quality_targets(merged: Merged) -> list[TargetRow]:
    rows: list[TargetRow] = []
    for model in sorted(merged.models, key=_model_sort_key):
        m = merged.models[model]
        for tool, anchor in (("onnxprec", "modelopt"), ("onnxprec:inf", "modelopt:inf")):
            ours, theirs = m["tools"].get(tool), m["tools"].get(anchor)
            if not ours or not theirs or "structure" not in ours or "structure" not in theirs:
                continue
            so, st = ours["structure"], theirs["structure"]
            ao, at = ours.get("accuracy", {}), theirs.get("accuracy", {})
            flag = " (data_max=inf)" if tool.endswith(":inf") else ""
            run = f"[{merged.run_number(ours['_run'])}]"
            rows.append(
                TargetRow(
                    f"{_model_label(model)}{flag}: nodes in low precision ≥ ModelOpt's",
                    f"{so['low_nodes']} vs {st['low_nodes']}",
                    "≥",
                    so["low_nodes"] >= st["low_nodes"],
                    f"of {so.get('float_nodes', so['nodes'])} / {st.get('float_nodes', st['nodes'])} float nodes; "
                    f"left in FP32: {so.get('fp32_nodes', '?')} vs {st.get('fp32_nodes', '?')}",
                    run,
                )
            )
            rows.append(
                TargetRow(
                    f"{_model_label(model)}{flag}: Cast nodes ≤ ModelOpt's",
                    f"{so['casts']} vs {st['casts']}",
                    "≤",
                    so["casts"] <= st["casts"],
                    "",
                    run,
                )
            )
            if "rel_l2" in ao and "rel_l2" in at:
                ok = ao["rel_l2"] <= at["rel_l2"] * ERROR_TOLERANCE + 1e-9 and ao.get("nonfinite", 0) <= at.get(
                    "nonfinite", 0
                )
                rows.append(
                    TargetRow(
                        f"{_model_label(model)}{flag}: output error no worse than ModelOpt's",
                        f"rel L2 {_num(ao['rel_l2'], 2)} vs {_num(at['rel_l2'], 2)}",
                        f"≤ {ERROR_TOLERANCE:g}× ModelOpt's",
                        ok,
                        f"max abs {_num(ao.get('max_abs'))} vs {_num(at.get('max_abs'))}",
                        run,
                    )
                )
    return rows


# ------------------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------------------


def _runs_of(merged: Merged, models: Iterable[str]) -> str:
    ids = sorted(
        {e["_run"] for name in models for e in merged.models[name]["tools"].values()},
        key=merged.run_number,
    )
    parts = [f"[{merged.run_number(i)}] {_run_date(merged, i)}" for i in ids]
    return "run " + ", ".join(parts) if len(parts) == 1 else "runs " + ", ".join(parts)


def _run_date(merged: Merged, run_id: str) -> str:
    run = next(r for r in merged.runs if r["run_id"] == run_id)
    return str(run.get("date", "?"))[:16].replace("T", " ")


def cost_table(merged: Merged, models: Sequence[str]) -> str:
    """Time and memory, led by the ratios against ModelOpt (the same data_max variant)."""
    rows = []
    for model in models:
        m = merged.models[model]
        for tool in _ordered(m["tools"]):
            e = m["tools"][tool]
            if e.get("status") in ("skipped", "not run"):
                continue
            anchor = _anchor_of(tool)
            v = e["_vs"].get(anchor) if anchor else None
            s = e.get("summary", {})
            if not s.get("wall_s"):
                speed, rss = _status_text(e), "–"
            else:
                paired = v.get("paired", True) if v else True
                speed = _ratio(v.get("speedup") if v else None, paired, 1) if anchor else "(anchor)"
                rss = _ratio(v.get("rss_ratio") if v else None, paired, 2) if anchor else "(anchor)"
                other = m["tools"].get(anchor) if anchor else None
                if anchor and not v and other and other.get("status") in ("timeout", "memory-limit", "failed"):
                    speed = f"{_tool_label(anchor, other)}: {other['status']}"
            rows.append(
                [
                    _model_label(model),
                    _tool_label(tool, e),
                    speed,
                    rss,
                    _stat(s.get("wall_s")),
                    _stat(s.get("peak_rss_mb"), 0),
                    _stat(s.get("convert_s")),
                    _stat(s.get("import_s")),
                    str(s["wall_s"]["n"]) if s.get("wall_s") else "0",
                    f"[{merged.run_number(e['_run'])}]",
                ]
            )
    return _table(
        [
            "Model",
            "Tool",
            "× faster than ModelOpt",
            "peak RSS vs ModelOpt",
            "wall s",
            "peak RSS MiB",
            "convert-only s",
            "import s",
            "n",
            "run",
        ],
        rows,
    )


def baseline_table(merged: Merged, models: Sequence[str]) -> str | None:
    """data_max=inf conversions against a plain onnx.load + onnx.save of the same model."""
    rows = []
    for model in models:
        m = merged.models[model]
        base = m["tools"].get("baseline_loadsave")
        if not base or not base.get("summary", {}).get("wall_s"):
            continue
        for tool in _ordered(m["tools"]):
            v = m["tools"][tool]["_vs"].get("baseline_loadsave")
            if not v:
                continue
            e = m["tools"][tool]
            rows.append(
                [
                    _model_label(model),
                    _tool_label(tool, e),
                    _ratio(v.get("time_ratio"), v.get("paired", True)),
                    _ratio(v.get("rss_ratio"), v.get("paired", True)),
                    _stat(e["summary"].get("wall_s")),
                    _stat(base["summary"].get("wall_s")),
                    _stat(e["summary"].get("peak_rss_mb"), 0),
                    _stat(base["summary"].get("peak_rss_mb"), 0),
                ]
            )
    if not rows:
        return None
    return _table(
        [
            "Model",
            "Tool",
            "wall vs load+save",
            "peak RSS vs load+save",
            "tool wall s",
            "load+save wall s",
            "tool RSS MiB",
            "load+save RSS MiB",
        ],
        rows,
    )


def quality_table(merged: Merged, models: Sequence[str]) -> str:
    """Structure and output error of each tool's result."""
    rows = []
    for model in models:
        m = merged.models[model]
        fp32 = m.get("fp32", {})
        fs = fp32.get("structure")
        if fs:
            ppl = fp32.get("perplexity")
            rows.append(
                [
                    _model_label(model),
                    "FP32 original",
                    f"0/{fs.get('float_nodes', fs['nodes'])} ({fs['nodes']} nodes)",
                    str(fs["casts"]),
                    _size(fs.get("file_bytes")),
                    "–",
                    "–",
                    "–",
                    "–",
                    _num(ppl, 3) if ppl else "–",
                    "–",
                ]
            )
        for tool in _ordered(m["tools"]):
            e = m["tools"][tool]
            st = e.get("structure")
            if not st:
                continue
            acc = e.get("accuracy", {})
            rep = e.get("tool_reported")
            base_casts = fs["casts"] if fs else 0
            rows.append(
                [
                    _model_label(model),
                    _tool_label(tool, e),
                    f"{st['low_nodes']}/{st.get('float_nodes', st['nodes'])} ({st['low_pct']:.1f} %)"
                    + (f", FP32: {_ops(st.get('fp32_ops', {}))}" if st.get("fp32_nodes") else ""),
                    f"{st['casts']} ({st['casts'] - base_casts:+d})",
                    _size(st.get("file_bytes")),
                    _num(acc.get("max_abs"), 3) if "max_abs" in acc else _short_error(acc.get("error", "–"), 70),
                    _num(acc.get("rel_l2"), 2) if "rel_l2" in acc else "–",
                    _cos(acc.get("cosine")),
                    f"{acc['top1'] * 100:.2f} %" if acc.get("top1") is not None else "–",
                    _num(acc.get("perplexity"), 3) if acc.get("perplexity") is not None else "–",
                    _reported(rep),
                ]
            )
    return _table(
        [
            "Model",
            "Tool",
            "low-precision nodes",
            "Cast nodes (inserted)",
            "size",
            "max abs err",
            "rel L2 err",
            "cosine",
            "top-1 agree",
            "perplexity",
            "tool's own count",
        ],
        rows,
    )


def _ops(counts: dict[str, int], most: int = 3) -> str:
    """``3 Where, 2 Add`` (the most frequent op types first)."""
    items = list(counts.items())
    text = ", ".join(f"{n} {op}" for op, n in items[:most])
    return text + (", …" if len(items) > most else "")


def _cos(c: float | None) -> str:
    if c is None:
        return "–"
    if c > 0.999999:
        return f"1 − {_num(1 - c, 1)}"
    return f"{c:.6f}"


def _reported(rep: dict[str, Any] | None) -> str:
    if not rep:
        return "–"
    text = f"{rep['low_nodes']}/{rep['nodes']}"
    if "casts_inserted" in rep:
        text += f", {rep['casts_inserted']} casts"
    return text


def latency_table(merged: Merged, models: Sequence[str]) -> str | None:
    """ONNX Runtime CPU latency of each result, batch 1, against the FP32 model timed in the same process."""
    rows = []
    for model in models:
        m = merged.models[model]
        base = m.get("fp32", {}).get("latency_cpu")
        if not base or "median_ms" not in base:
            continue
        rows.append([_model_label(model), "FP32 original", _lat(base), "1.00×"])
        for tool in _ordered(m["tools"]):
            e = m["tools"][tool]
            lat = e.get("latency_cpu")
            if not lat:
                continue
            if "median_ms" not in lat:
                rows.append(
                    [_model_label(model), _tool_label(tool, e), f"failed: {_short_error(lat.get('error'))}", "–"]
                )
                continue
            rows.append([_model_label(model), _tool_label(tool, e), _lat(lat), f"{_num(lat.get('vs_fp32'))}×"])
    if not rows:
        return None
    return _table(["Model", "Model file", "median ms [p10–p90]", "vs FP32 (lower is faster)"], rows)


def _lat(lat: dict[str, Any]) -> str:
    return f"{_num(lat['median_ms'])} [{_num(lat['p10_ms'])}–{_num(lat['p90_ms'])}] ({lat['iters']} runs)"


GPU_LABELS = {
    "fp32": "FP32 original",
    "onnxprec": "onnxprec FP16",
    "modelopt": "ModelOpt FP16",
    "occ_fp16": "onnxconverter-common FP16",
    "ort_fp16": "onnxruntime transformers FP16",
}


def gpu_section(gpu: Sequence[dict[str, Any]]) -> str | None:
    """One table per GPU result file (newest first): per model and batch, FP32 then each variant."""
    if not gpu:
        return None
    parts = []
    order = list(GPU_LABELS)
    for g in reversed(gpu):
        rows = []
        for model in sorted(g.get("models", {}), key=_model_sort_key):
            variants = g["models"][model]
            names = sorted(variants, key=lambda v: (order.index(v) if v in order else len(order), v))
            batches = sorted({b for v in variants.values() for b in v.get("batches", {})}, key=int)
            for batch in batches:
                base = variants.get("fp32", {}).get("batches", {}).get(batch, {}).get("median_ms")
                mo = variants.get("modelopt", {}).get("batches", {}).get(batch, {}).get("median_ms")
                for variant in names:
                    r = variants[variant].get("batches", {}).get(batch)
                    if r is None:
                        continue
                    label = GPU_LABELS.get(variant, variant)
                    ppl = variants[variant].get("perplexity") if batch == batches[-1] else None
                    ppl_text = _num(ppl, 3) if ppl is not None else "–"
                    if "median_ms" not in r:
                        rows.append(
                            [
                                _model_label(model),
                                batch,
                                label,
                                f"failed: {r.get('error', '')[:70]}",
                                "–",
                                "–",
                                "–",
                                ppl_text,
                            ]
                        )
                        continue
                    rows.append(
                        [
                            _model_label(model),
                            batch,
                            label,
                            f"{_num(r['median_ms'], 3)} [{_num(r['p10_ms'], 3)}–{_num(r['p90_ms'], 3)}]",
                            f"**{_num(base / r['median_ms'])}×**" if base else "–",
                            f"{_num(mo / r['median_ms'])}×" if mo and variant != "fp32" else "–",
                            _num(r.get("rel_l2"), 2) if r.get("rel_l2") is not None and variant != "fp32" else "–",
                            ppl_text,
                        ]
                    )
        head = (
            f"### {g.get('card', '?')}, {g.get('date', '?')[:10]}\n\n"
            f"**{g.get('card', '?')}** (driver {g.get('driver', '?')}), onnxruntime {g.get('onnxruntime', '?')}, "
            f"{g.get('date', '?')[:16].replace('T', ' ')}: `{g.get('command', 'python benchmarks/gpu_latency.py')}` "
            f"(`benchmarks/results/{g.get('file', '')}`); {g.get('warmup', '?')} warm-up runs, then "
            f"{g.get('iters', '?')} timed runs per model file in {g.get('rounds', '?')} rounds alternating the files, "
            "inputs and outputs bound on the GPU (IO binding)."
        )
        parts.append(
            head
            + "\n\n"
            + _table(
                [
                    "Model",
                    "batch",
                    "Model file",
                    "median ms [p10–p90]",
                    "speed-up vs FP32",
                    "speed vs ModelOpt FP16",
                    "rel L2 vs FP32",
                    "perplexity",
                ],
                rows,
            )
        )
        notes = [str(n) for n in g.get("notes", [])]
        env = g.get("env")
        if env:
            notes.append("GPU machine: " + ", ".join(f"{k} {v}" for k, v in env.items()))
        if g.get("conversion_on_gpu_machine_s"):
            conv = g["conversion_on_gpu_machine_s"]
            notes.append("SmolLM2 conversions there (s): " + ", ".join(f"{k} {_num(v)}" for k, v in conv.items()))
        if notes:
            parts.append("\n".join(f"* {n}" for n in notes))
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------------------------------
# chart
# ------------------------------------------------------------------------------------------------------------


def scaling_chart(merged: Merged, path: Path) -> bool:
    """Wall time and peak RSS against model size for the chains and the MatMul stacks; False without data."""
    chains = sorted((m for m in merged.models if m.startswith("chain_")), key=_model_sort_key)
    mats = sorted((m for m in merged.models if m.startswith("matmul_")), key=_model_sort_key)
    if not chains and not mats:
        return False
    try:
        import matplotlib
    except ImportError:
        logger.warning("matplotlib is not installed (pip install matplotlib): no scaling chart")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    styles = {
        "onnxprec": ("tab:blue", "-", "o"),
        "onnxprec:inf": ("tab:blue", "--", "s"),
        "modelopt": ("tab:red", "-", "o"),
        "modelopt:inf": ("tab:red", "--", "s"),
        "baseline_loadsave": ("tab:gray", ":", "^"),
    }
    for row, (names, xlabel, xof) in enumerate(
        (
            (chains, "chain length (nodes)", lambda n: float(n.split("_")[1])),
            (mats, "MatMul stack weights (GiB, external data)", lambda n: float(n[len("matmul_") : -2])),
        )
    ):
        for col, (key, ylabel) in enumerate(
            (("wall_s", "whole-process wall time (s)"), ("peak_rss_mb", "peak RSS (MiB)"))
        ):
            ax = axes[row][col]
            for tool, (color, ls, marker) in styles.items():
                xs, ys = [], []
                stopped: list[tuple[float, float, str]] = []
                for n in names:
                    e = merged.models[n]["tools"].get(tool)
                    if not e:
                        continue
                    med = _median(e, key)
                    if med is not None:
                        xs.append(xof(n))
                        ys.append(med)
                    elif e.get("status") in ("timeout", "memory-limit", "failed") and e.get("runs"):
                        first = e["runs"][0]
                        y = first.get("wall_s") if key == "wall_s" else first.get("poll_peak_rss_mb")
                        if y:
                            stopped.append((xof(n), y, str(e["status"])))
                if xs:
                    ax.plot(xs, ys, color=color, ls=ls, marker=marker, label=TOOLS[tool].label)
                for x, y, status in stopped:
                    ax.plot([x], [y], color=color, marker="x", ms=10, ls="none")
                    ax.annotate(
                        f"{TOOLS[tool].label}: {status}",
                        (x, y),
                        xytext=(-8, -3),
                        textcoords="offset points",
                        ha="right",
                        va="top",
                        fontsize=7,
                        color=color,
                    )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ticks = [xof(n) for n in names]
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle("AutoCast scaling: onnxprec vs ModelOpt (keep_io_types; x = stopped run)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------------------
# the document
# ------------------------------------------------------------------------------------------------------------


def render(merged: Merged, gpu: Sequence[dict[str, Any]] = (), png: str | None = None) -> str:
    """BENCHMARKS.md's text."""
    out: list[str] = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m benchmarks report` from benchmarks/results/*.json; do not edit by hand. -->",
        "",
        "onnxprec AutoCast against the converters users would otherwise pick, on the benchmark zoo "
        "(`benchmarks/zoo.py`): NVIDIA ModelOpt AutoCast (the anchor every ratio is taken against), "
        "onnxconverter-common `float16` and `auto_mixed_precision`, and onnxruntime's `transformers.float16`. "
        "Every tool runs as its own process (`benchmarks/_runner.py` under `/usr/bin/time -v`), the anchors "
        "in their own virtual environment (`python -m benchmarks.anchors_env`), all AutoCast runs with "
        "`--keep_io_types`. Rounds alternate the tools (A B A B ...), and ratios are taken round by round "
        "against the anchor measured seconds apart, because the machine is shared and noisy: read the ratios "
        "first, the absolute numbers second. Cells show the median over rounds and [min–max].",
        "",
        "Reproduce every table: `python -m benchmarks run` (then, to re-render only, `python -m benchmarks "
        "report`). Rerun a subset with e.g. `python -m benchmarks run --models smollm2_135m --tools "
        "onnxprec,modelopt`: the report keeps the newest measurement of every (model, tool).",
        "",
        "## Runs",
        "",
    ]
    for i, r in enumerate(merged.runs, 1):
        mach = r.get("machine", {})
        pv = r.get("versions", {}).get("project", {})
        av = r.get("versions", {}).get("anchors", {})
        st = r.get("settings", {})
        out.append(
            f"**[{i}]** {str(r.get('date', '?'))[:19].replace('T', ' ')} — `{r.get('command', '?')}` "
            f"(`{r.get('file', r['run_id'])}`)  "
        )
        out.append(
            f"machine: {mach.get('cpu', '?')}, {mach.get('cores', '?')} cores, {mach.get('ram_gib', '?')} GiB RAM, "
            f"{mach.get('os', '?')}, Python {mach.get('python', '?')}; shared with other jobs  "
        )
        out.append(
            f"onnxprec {pv.get('onnxprec', '?')} (git {pv.get('onnxprec_git', '?')}), onnx {pv.get('onnx', '?')}, "
            f"onnxruntime {pv.get('onnxruntime', '?')}, onnx-ir {pv.get('onnx-ir', '?')}; anchors venv: "
            + (", ".join(f"{k} {v}" for k, v in av.items() if v) or "not used")
            + "  "
        )
        out.append(
            f"settings: {st.get('repeats', '?')} rounds ({st.get('heavy_repeats', '?')} for "
            f"{', '.join(st.get('heavy_models', []))}), timeout {st.get('timeout_s', '?')} s per tool run, "
            f"memory limit {st.get('mem_limit_mb', '?')} MiB"
            + ("; page cache warmed before every tool run" if st.get("page_cache") else "")
            + (f"; onnxprec sources sha256 {pv['onnxprec_src_sha256']}" if pv.get("onnxprec_src_sha256") else "")
        )
        changed = sorted(
            name
            for name, block in r.get("models", {}).items()
            if block.get("onnxprec_src_sha256") not in (None, pv.get("onnxprec_src_sha256"))
        )
        if changed:
            out[-1] += "  "
            out.append(f"⚠ src/onnxprec changed while this run was going; different sources for: {', '.join(changed)}")
        out.append("")
    rows = targets(merged)
    out += [
        "## Targets (AutoCast issue)",
        "",
        "Whole process, same flags, `--keep_io_types`. ✅ reached, ❌ not reached, – not measured. "
        "Ratios: median over rounds [min–max]; † = ratio of medians from different runs.",
        "",
        _table(
            ["Target", "Measured", "Goal", "", "Context", "run"],
            [
                [
                    r.target,
                    r.measured,
                    r.goal,
                    "✅" if r.reached else ("❌" if r.reached is False else "–"),
                    r.context.strip(),
                    r.run,
                ]
                for r in rows
            ],
        ),
        "",
    ]
    groups = [
        ("Real models", [m for m in merged.models if _model_sort_key(m)[0] == 0]),
        ("Chains (scaling in node count)", [m for m in merged.models if _model_sort_key(m)[0] == 1]),
        (
            "MatMul stacks (scaling in weight size, external data)",
            [m for m in merged.models if _model_sort_key(m)[0] == 2],
        ),
    ]
    groups = [(t, sorted(ms, key=_model_sort_key)) for t, ms in groups if ms]
    out += [
        "## Conversion cost",
        "",
        "× faster = ModelOpt's whole-process wall time / the tool's (same `data_max` variant: the data_max=inf rows "
        "compare with ModelOpt data_max=inf), per round; peak RSS vs ModelOpt = the tool's peak RSS / ModelOpt's "
        "(lower is better). wall s and peak RSS are of the whole process (interpreter start-up and imports "
        "included); convert-only s is the tool's own entry point (load + convert + save); import s the "
        "imports before it.",
        "",
    ]
    for title, models in groups:
        out += [f"### {title} — {_runs_of(merged, models)}", "", cost_table(merged, models), ""]
    base_models = [m for _, ms in groups for m in ms]
    bt = baseline_table(merged, base_models)
    if bt:
        out += [
            "### data_max=inf against a plain `onnx.load` + `onnx.save`",
            "",
            "The floor for any converter that reads and writes the whole model (same process set-up, external "
            "data kept external).",
            "",
            bt,
            "",
        ]
    if png:
        out += [
            "### Scaling chart",
            "",
            f"![wall time and peak RSS against model size]({png})",
            "",
        ]
    out += [
        "## Quality of the result",
        "",
        "low-precision nodes: nodes (Cast and Constant excluded) with at least one FP16/BF16 input or output "
        "(types from the model plus ONNX shape inference), out of the nodes with any floating-point input or "
        'output (integer shape arithmetic excluded); "FP32:" names the op types of the float nodes left '
        "in FP32. Cast nodes: all Cast nodes in the result (inserted = minus the FP32 model's own); size: "
        ".onnx plus external data. Errors are "
        "against the FP32 model on the real inputs (ONNX Runtime CPU, whole batch), on the first output: max "
        "abs, relative L2 ||a−b||/||a||, cosine, top-1 agreement (argmax over the last axis; EfficientNet "
        "logits per image, SmolLM2 logits per token). Perplexity: SmolLM2 on the 16 real 256-token windows. "
        "\"tool's own count\" is the tool's log line (`Converted X/Y nodes`), which counts differently.",
        "",
    ]
    for title, models in groups:
        out += [f"### {title} — {_runs_of(merged, models)}", "", quality_table(merged, models), ""]
    lat_parts = []
    for title, models in groups:
        lt = latency_table(merged, models)
        if lt:
            lat_parts += [f"### {title} — {_runs_of(merged, models)}", "", lt, ""]
    if lat_parts:
        out += [
            "## Inference latency, ONNX Runtime CPU",
            "",
            "Batch 1 (the first real sample), default session options, on the benchmark machine; the FP32 model "
            "and every result in one process (one at a time for the MatMul stacks above 3 GB in all), "
            "alternating in rounds after warm-up. ONNX Runtime's CPU provider runs FP16 only where it has FP16 "
            "kernels and inserts casts around the other nodes, so this table says what a CPU user gets, not what "
            "a GPU gets.",
            "",
            *lat_parts,
        ]
    gs = gpu_section(gpu)
    out += ["## Inference latency, ONNX Runtime CUDA", ""]
    if gs:
        out += [
            "`python benchmarks/gpu_latency.py` on the GPU machine, models prepared by "
            "`python -m benchmarks gpu-prepare` (SmolLM2's converted on the GPU machine itself).",
            "",
            gs,
            "",
        ]
    else:
        out += [
            "Not measured yet: `python -m benchmarks gpu-prepare --out DIR`, move DIR to the GPU machine, run "
            "`python benchmarks/gpu_latency.py DIR --out benchmarks/results/gpu-<date>.json` there, bring the JSON "
            "back and run `python -m benchmarks report`.",
            "",
        ]
    out += METHOD
    return "\n".join(out).rstrip() + "\n"


METHOD = [
    "## Method",
    "",
    "* **Tools** (`python -m benchmarks tools`): `onnxprec` = `python -m onnxprec.autocast --onnx_path M "
    "--output_path O --keep_io_types` (project venv); `modelopt` = `python -m modelopt.onnx.autocast` with the "
    "same flags (nvidia-modelopt 0.47.0, anchors venv); `:inf` variants add `--data_max inf` (no reference "
    "run); `occ_fp16` = onnxconverter-common `float16.convert_float_to_float16(keep_io_types=True)`; `occ_amp` = "
    "onnxconverter-common `auto_convert_mixed_precision` on the real inputs with rtol 0.01, atol 0.001 "
    "(one round only, models under 200 MB, 900 s timeout); `ort_fp16` = onnxruntime "
    "`transformers.float16.convert_float_to_float16(keep_io_types=True)`; `baseline_loadsave` = `onnx.load` + "
    "`onnx.save` (external data stays external). All with their default settings otherwise.",
    "* **One process per run**, started by `benchmarks/_runner.py`, which calls the tool's own entry point "
    "(the CLI `main` for the AutoCast tools) and reports its import time and its conversion-only time (load + "
    "convert + save). Whole-process wall time is measured around the child; peak RSS is the child's "
    "`ru_maxrss` from `/usr/bin/time -v` (psutil polling of the process tree where GNU time is missing). A "
    "watchdog stops a run past its timeout or past the memory limit; such runs are shown as timeout / "
    "memory-limit and the tool is not retried on that model.",
    "* **Rounds**: for each model, round r runs every tool once in a fixed order; ratios against the anchor "
    "(ModelOpt with the same data_max, or load+save) are taken per round and summarised as median [min–max]. "
    'Runs whose settings say "page cache warmed" read the model\'s files once before every tool run, so each '
    "run starts with them in the page cache (without it, the first tool after a multi-GB run pays for the disk).",
    "* **Default plan** (`python -m benchmarks tools`): real models get every tool (SmolLM2 also "
    "onnxprec data_max=inf and load+save); chains get onnxprec and ModelOpt with both data_max settings; the "
    "MatMul stacks get the data_max=inf variants and load+save only (a reference run of a multi-GB model is "
    "not what those rows are about). chain_5000 and the MatMul stacks of 1 GiB and more get `--heavy-repeats` "
    "rounds.",
    "* **Quality and latency** are measured afterwards in a separate worker process on the first successful "
    "output of each tool (`benchmarks/metrics.py` documents every definition). The zoo (`benchmarks/zoo.py`) "
    "documents the models and their real inputs.",
    '* **Targets**: ratios use the median over rounds. "Output error no worse" allows the relative L2 error '
    f"to exceed ModelOpt's by at most {round((ERROR_TOLERANCE - 1) * 100)} % (rounding-order noise); "
    "1 GiB = 1024 MiB.",
    "* **GPU**: `python -m benchmarks gpu-prepare --out benchmarks/gpu-bundles` converts MiniLM and "
    "EfficientNet with onnxprec, ModelOpt and onnxconverter-common here and packs them with the FP32 models "
    "and real inputs into bundles of at most 60 MB; on the GPU machine `python benchmarks/gpu_latency.py DIR "
    "--out benchmarks/results/gpu-<date>.json` reassembles them and times every file with the "
    "CUDAExecutionProvider in one process. SmolLM2 is too large to move: its files are converted on the GPU "
    "machine and put in `DIR/smollm2_135m/` (fp32.onnx, onnxprec.onnx, modelopt.onnx, occ_fp16.onnx, "
    "inputs.npz) before running the same script.",
    "",
]


def write_report(results_dir: Path = RESULTS_DIR, md_path: Path = MD_PATH, png_path: Path | None = None) -> Path:
    """Regenerates BENCHMARKS.md (and the scaling chart beside the results) from the result files."""
    runs = load_results(results_dir)
    if not runs:
        raise FileNotFoundError(f"no result files in {results_dir}: run `python -m benchmarks run` first")
    merged = merge(runs)
    png = png_path or results_dir / PNG_NAME
    rel_png = None
    if scaling_chart(merged, png):
        try:
            rel_png = png.resolve().relative_to(md_path.resolve().parent).as_posix()
        except ValueError:
            rel_png = png.resolve().as_posix()
    md_path.write_text(render(merged, load_gpu_results(results_dir), rel_png))
    logger.info("wrote %s", md_path)
    return md_path
