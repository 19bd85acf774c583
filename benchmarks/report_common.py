"""What every part of BENCHMARKS.md shares: loading and merging the result files, number formatting, tables.

Every ``benchmarks/results/*.json`` written by ``python -m benchmarks run`` is read, oldest first; for each model
and tool the newest measurement wins, so a partial rerun (``--models smollm2_135m --tools onnxprec,modelopt``)
updates only its rows. Ratios between two tools come from the same run, round by round; when the newest
measurements of a tool and its anchor come from different runs the ratio of their medians is shown instead,
marked with a dagger.
Sections measured outside the harness (INT8 by hand, CUDA by ``experiments/gpu_latency.py``) are stored as
finished tables with their provenance (:func:`measured_tables`).

Each part's sections are its module's (:mod:`benchmarks.report_autocast`, ``report_int4``, ``report_utilities``);
goals are :class:`benchmarks.targets.Goal` data.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tools import RATIO_ANCHORS, TOOLS

logger = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_LABELS = {
    "efficientnet_lite0": "EfficientNet-Lite0",
    "minilm_l6_v2": "MiniLM-L6-v2",
    "smollm2_135m": "SmolLM2-135M",
    "qwen_1.5b": "Qwen2.5-Coder-1.5B-Instruct (builder FP32, 28 layers, vocabulary 151,936)",
    "qwen_0.5b": "Qwen2.5-Coder-0.5B-Instruct (builder FP32, 24 layers, tied head)",
}
TOOL_ORDER = tuple(TOOLS)
TEXT_PATH = Path(__file__).resolve().parent / "report_text.md"


def text_blocks(path: Path = TEXT_PATH) -> dict[str, str]:
    """The document's prose: ``{key: paragraph lines}`` from the ``<!-- key -->`` blocks of ``report_text.md``."""
    parts = re.split(r"^<!-- ([\w.]+) -->\n", path.read_text(), flags=re.M)
    return {key: body.strip("\n") for key, body in zip(parts[1::2], parts[2::2])}


TEXT = text_blocks()  # table rows follow the tools' registry order (unknown tools last, by name)


# ------------------------------------------------------------------------------------------------------------
# loading and merging
# ------------------------------------------------------------------------------------------------------------


def load_results(results_dir: Path = RESULTS_DIR, kind: str = "autocast") -> list[dict[str, Any]]:
    """The result files of one part (``"kind"``: ``autocast`` when absent, ``int4``, ``utilities``, or the finished
    tables ``cuda``, ``int8``), oldest first, each with its ``run_id``, ``file`` (relative to the repository) and
    ``number`` (1, 2, ...)."""
    runs = []
    for p in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            logger.warning("skipping %s: %s", p, e)
            continue
        if not isinstance(data, dict) or data.get("kind", "autocast") != kind:
            continue
        data.setdefault("run_id", p.stem)
        try:
            data["file"] = p.resolve().relative_to(REPO_ROOT).as_posix()
        except ValueError:
            data["file"] = str(p)
        runs.append(data)
    runs.sort(key=lambda d: d.get("date", ""))
    for i, r in enumerate(runs, 1):
        r["number"] = i
    return runs


def measured_tables(results_dir: Path, kind: str) -> list[str]:
    """The sections of the ``<kind>-*.json`` files that hold finished tables (``title``, ``intro``, ``tables``: each
    an optional ``heading`` and ``intro``, ``columns``, ``rows``, ``notes``): numbers measured outside the
    harness's runs, stored with their ``provenance``; a file of one table may hold its ``columns``, ``rows`` and
    ``notes`` itself."""
    out: list[str] = []
    for run in load_results(results_dir, kind):
        if "title" not in run:  # a run still going, or interrupted before its table
            continue
        out += [f"## {run['title']}", "", *run["intro"], ""]
        for t in run.get("tables") or [{k: run[k] for k in ("columns", "rows", "notes")}]:
            out += [f"### {t['heading']}", ""] if t.get("heading") else []
            out += [*t.get("intro", []), ""] if t.get("intro") else []
            out += [table(t["columns"], t["rows"]), ""]
            for note in t.get("notes", []):
                out += [*note, ""]
    return out


@dataclass
class Merged:
    """The newest measurement of every (model, tool), and the runs they come from."""

    models: dict[str, dict[str, Any]]
    runs: list[dict[str, Any]]  # the runs that contributed, oldest first

    def run_number(self, run_id: str) -> int:
        """The run's number in the document (``[n]``), counting from 1."""
        return next(i for i, r in enumerate(self.runs, 1) if r["run_id"] == run_id)


def merge(runs: Sequence[dict[str, Any]]) -> Merged:
    """Newest wins per (model, tool); a skipped or unrun tool never hides an older measurement."""
    models: dict[str, dict[str, Any]] = {}
    for run in runs:
        for name, block in run.get("models", {}).items():
            m = models.setdefault(name, {"tools": {}, "fp32": {}})
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
            for anchor in RATIO_ANCHORS:
                other = m["tools"].get(anchor)
                if anchor == tool or other is None:
                    continue
                same_run = other["_run"] == entry["_run"]
                ratios = entry.get("vs", {}).get(anchor) if same_run else _cross_ratio(entry, other)
                if ratios:
                    entry["_vs"][anchor] = ratios
    return merged


def median(entry: dict[str, Any], key: str) -> float | None:
    """The median of a tool entry's summary statistic ``key`` (``wall_s``, ``peak_rss_mb``...), or None."""
    s = entry.get("summary", {}).get(key)
    return s["median"] if s else None


def _cross_ratio(entry: dict[str, Any], anchor: dict[str, Any]) -> dict[str, Any] | None:
    tw, aw = median(entry, "wall_s"), median(anchor, "wall_s")
    if not tw or not aw:
        return None
    one = lambda x: {"median": x, "min": x, "max": x, "n": 1}  # noqa: E731
    out: dict[str, Any] = {"speedup": one(aw / tw), "time_ratio": one(tw / aw), "paired": False}
    tr, ar = median(entry, "peak_rss_mb"), median(anchor, "peak_rss_mb")
    if tr and ar:
        out["rss_ratio"] = one(tr / ar)
    return out


# ------------------------------------------------------------------------------------------------------------
# formatting
# ------------------------------------------------------------------------------------------------------------


def num(x: float | None, digits: int = 2) -> str:
    """A number for a table cell: ``digits`` significant-ish digits, scientific when tiny or huge, – for None."""
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


def _spread(s: dict[str, Any], digits: int) -> tuple[str, str]:
    """The median of a summary statistic and its `` [min–max]`` ("" for one value)."""
    med, lo, hi = (num(s[k], digits) for k in ("median", "min", "max"))
    return med, "" if s.get("n", 1) <= 1 or lo == hi else f" [{lo}–{hi}]"


def stat(s: dict[str, Any] | None, digits: int = 2) -> str:
    """``median [min–max]`` of a summary statistic (just the median for one value)."""
    return "".join(_spread(s, digits)) if s else "–"


def ratio(s: dict[str, Any] | None, paired: bool = True, digits: int = 2) -> str:
    """``**median×** [min–max]`` of a ratio statistic; † when it is a ratio of medians from different runs."""
    if not s:
        return "–"
    med, spread = _spread(s, digits)
    return f"**{med}×**{spread}" + ("" if paired else " †")


def blocks(*parts: str) -> list[str]:
    """Markdown blocks (headings, paragraphs, tables) as the document's lines, each followed by a blank line."""
    return [line for part in parts for line in (part, "")]


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table."""
    rows = list(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


Column = tuple[str, Callable[[Any], str]]  # a table column: its header and its cell of one row


def column_table(columns: Sequence[Column], rows: Iterable[Any], first: Sequence[Sequence[str]] = ()) -> str | None:
    """A markdown table with the rows ``first`` (given cell by cell), then a row per item of ``rows``, each cell
    ``cell(item)``; None without rows."""
    cells = [*first, *([cell(r) for _, cell in columns] for r in rows)]
    return table([header for header, _ in columns], cells) if cells else None


def model_label(name: str) -> str:
    """The zoo model's name in tables."""
    return MODEL_LABELS.get(name, name)


def tool_label(tool: str, entry: dict[str, Any]) -> str:
    """The tool's name in tables (as recorded with its results, else from the registry)."""
    return entry.get("label") or (TOOLS[tool].label if tool in TOOLS else tool)


def anchor_of(tool: str) -> str | None:
    """The tool whose time and memory ``tool``'s ratios are taken against."""
    if tool in TOOLS:
        return TOOLS[tool].anchor
    return "modelopt:inf" if tool.endswith(":inf") else "modelopt"


def size(nbytes: int | None) -> str:
    """Bytes as MiB (GiB from 1 GiB)."""
    if nbytes is None:
        return "–"
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def cos(c: float | None) -> str:
    """A cosine similarity, as ``1 − 1.9e-07`` when it is that close to 1."""
    if c is None:
        return "–"
    if c > 0.999999:
        return f"1 − {num(1 - c, 1)}"
    return f"{c:.6f}"


def ordered(tools: dict[str, Any]) -> list[str]:
    """Tool ids in table order."""
    return sorted(tools, key=lambda t: (TOOL_ORDER.index(t) if t in TOOL_ORDER else len(TOOL_ORDER), t))


def model_sort_key(name: str) -> tuple[int, float, str]:
    """Real models first, then the chains by length, then the MatMul stacks by size."""
    if name.startswith("chain_"):
        return (1, float(name.split("_")[1]), name)
    if name.startswith("matmul_"):
        return (2, float(name[len("matmul_") : -2]), name)
    return (0, 0.0, name)


def status_text(entry: dict[str, Any]) -> str:
    """Why a tool has no numbers on a model (skipped, memory-limit, timeout, failed...)."""
    status = entry.get("status", "?")
    if status == "skipped":
        return f"skipped: {entry.get('reason', '')}"
    first = (entry.get("runs") or [{}])[0]
    if status == "memory-limit":
        peak, wall = num(first.get("poll_peak_rss_mb"), 0), num(first.get("wall_s"))
        return f"**memory-limit**: stopped at {peak} MiB after {wall} s"
    if status == "timeout":
        return f"**timeout** after {num(first.get('wall_s'))} s"
    return f"**{status}**" + (f": {short_error(entry.get('error'))}" if entry.get("error") else "")


def short_error(err: object, width: int = 80) -> str:
    """A failure message shortened for a table cell."""
    text = str(err or "")
    if "Load model from" in text and "failed:" in text:
        return "ONNX Runtime cannot load the result (" + text.split("failed:", 1)[1].strip()[: width - 40] + "…)"
    return text[:width]


# ------------------------------------------------------------------------------------------------------------
# the document's shared parts
# ------------------------------------------------------------------------------------------------------------

MODEL_GROUPS = (
    "Real models",
    "Chains (scaling in node count)",
    "MatMul stacks (scaling in weight size, external data)",
)


def model_groups(merged: Merged) -> list[tuple[str, list[str]]]:
    """``(title, models)`` of the real models, the chains and the MatMul stacks that have results."""
    groups = [(title, [m for m in merged.models if model_sort_key(m)[0] == i]) for i, title in enumerate(MODEL_GROUPS)]
    return [(t, sorted(ms, key=model_sort_key)) for t, ms in groups if ms]


def runs_of(merged: Merged, models: Iterable[str]) -> str:
    """``runs [1] date, [4] date`` of the runs the models' rows come from."""
    numbers = sorted({merged.run_number(e["_run"]) for name in models for e in merged.models[name]["tools"].values()})
    parts = [f"[{n}] {str(merged.runs[n - 1].get('date', '?'))[:16].replace('T', ' ')}" for n in numbers]
    return ("run " if len(parts) == 1 else "runs ") + ", ".join(parts)


def grouped_tables(
    merged: Merged, groups: Sequence[tuple[str, list[str]]], make: Callable[[Merged, list[str]], str | None]
) -> list[str]:
    """For each ``(title, models)`` group that ``make`` gives a table: ``### title — runs ...`` and the table."""
    out: list[str] = []
    for title, models in groups:
        if made := make(merged, models):
            out += [f"### {title} — {runs_of(merged, models)}", "", made, ""]
    return out


def run_lines(r: dict[str, Any], ref: str, settings: str) -> list[str]:
    """One run as the document cites it (``[ref]``): its command and file, machine and versions (the one results
    header), then the part's ``settings`` line."""
    mach, pv, av = r.get("machine", {}), r["versions"].get("project", {}), r["versions"].get("anchors", {})
    git = pv.get("onnxprec_git") or f"none: sources {pv.get('onnxprec_src_sha256')}"  # a tree copied without .git
    return [
        f"**[{ref}]** {str(r.get('date', '?'))[:19].replace('T', ' ')} — `{r.get('command', '?')}` "
        f"(`{r.get('file', r.get('run_id'))}`)  ",
        f"machine: {mach.get('cpu', '?')}, {mach.get('cores', '?')} cores, {mach.get('ram_gib', '?')} GiB RAM, "
        f"{mach.get('os', '?')}, Python {mach.get('python', '?')}; shared with other jobs  ",
        f"onnxprec {pv.get('onnxprec', '?')} (git {git}), onnx {pv.get('onnx', '?')}, "
        f"onnxruntime {pv.get('onnxruntime', '?')}, onnx-ir {pv.get('onnx-ir', '?')}; anchors venv: "
        + (", ".join(f"{k} {v}" for k, v in av.items() if v) or "not used")
        + "  ",
        settings,
    ]


def runs_section(merged: Merged) -> list[str]:
    """``## Runs``: each contributing run's command, machine, versions and settings, numbered as cited."""
    out = ["## Runs", ""]
    for i, r in enumerate(merged.runs, 1):
        pv, st = r["versions"].get("project", {}), r.get("settings", {})
        out += run_lines(
            r,
            str(i),
            f"settings: {st.get('repeats', '?')} rounds ({st.get('heavy_repeats', '?')} for "
            f"{', '.join(st.get('heavy_models', []))}), timeout {st.get('timeout_s', '?')} s per tool run, "
            f"memory limit {st.get('mem_limit_mb', '?')} MiB"
            + ("; page cache warmed before every tool run" if st.get("page_cache") else "")
            + (f"; onnxprec sources sha256 {pv['onnxprec_src_sha256']}" if pv.get("onnxprec_src_sha256") else ""),
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
    return out
