"""The AutoCast part of BENCHMARKS.md: its targets (as data), conversion cost, quality and CPU latency.

The loading, merging and formatting it uses are :mod:`benchmarks.report_common`'s; the targets are evaluated by
:func:`benchmarks.targets.evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zoo import SMOLLM2_FP32_PERPLEXITY

from .report_common import (
    TEXT,
    Column,
    Merged,
    anchor_of,
    blocks,
    column_table,
    cos,
    grouped_tables,
    model_groups,
    model_label,
    num,
    ordered,
    ratio,
    short_error,
    size,
    stat,
    status_text,
    tool_label,
)
from .targets import Goal, evaluate, targets_table
from .tools import TARGET

GIB_MB = 1024.0
ERROR_TOLERANCE = 1.05  # "output error no worse": relative L2 at most 5 % above ModelOpt's

# ------------------------------------------------------------------------------------------------------------
# targets (the AutoCast issue's goals)
# ------------------------------------------------------------------------------------------------------------

_MODELOPT_WALL = "ModelOpt here {anchor_wall_s} s"
# onnxprec against ModelOpt with the same data_max: (tool, anchor, the rows' words)
_DATA_MAX = (("onnxprec", "modelopt", ""), ("onnxprec:inf", "modelopt:inf", " (data_max=inf)"))


# fmt: off
TARGETS: tuple[Goal, ...] = (
    Goal("{model}: whole process ≥10× faster than ModelOpt", "speedup", ">=", 10, "≥ 10×", "smollm2_135m",
           context=(_MODELOPT_WALL, " (issue: 156 s)"), digits=1),
    Goal("{model}: peak RSS ≤ 1/3 of ModelOpt's", "rss_ratio", "<=", 1 / 3, "≤ 0.333×", "smollm2_135m",
           context=("ModelOpt here {anchor_rss_gib} GiB", " (issue: 5.9 GB)"), digits=3),
    # Foundation issue (runtime layer and observer-based reference runs): 622 MiB of FP32 weights.
    Goal("{model}: whole process ≥25× faster than ModelOpt (foundation)", "speedup", ">=", 25, "≥ 25×",
           "smollm2_135m", context=(_MODELOPT_WALL,), digits=1),
    Goal("{model}: peak RSS ≤ 1.2× the weights (foundation)", "peak_rss_mb", "<=", 1.2 * 622.3,
           "≤ 747 MiB (1.2 × 622 MiB)", "smollm2_135m", anchor=None, digits=0),
    Goal("{model}, data_max=inf: wall ≤ 1.5× a plain onnx.load + onnx.save", "time_ratio", "<=", 1.5, "≤ 1.5×",
           "smollm2_135m", "onnxprec:inf", "baseline_loadsave"),
    Goal("{model}, data_max=inf: peak RSS < 1 GiB", "peak_rss_mb", "<", GIB_MB, "< 1024 MiB", "smollm2_135m",
           "onnxprec:inf", anchor=None, digits=0),
    Goal("4 GiB external-data MatMul stack, data_max=inf: peak RSS < 1 GiB", "peak_rss_mb", "<", GIB_MB,
           "< 1024 MiB", "matmul_4gb", "onnxprec:inf", anchor=None, digits=0),
    *(Goal("{model}: whole process ≥5× faster than ModelOpt", "speedup", ">=", 5, "≥ 5×", model,
             context=(_MODELOPT_WALL,), digits=1) for model in ("minilm_l6_v2", "efficientnet_lite0")),
    *(Goal(f"2000-node chain{flag}: whole process < 2 s", "wall_s", "<", 2, "< 2 s", "chain_2000", tool, anchor,
             context=(_MODELOPT_WALL, " (issue: 68 s)")) for tool, anchor, flag in _DATA_MAX),
    # the result's quality against ModelOpt's with the same data_max, on every model
    *(
        target
        for tool, anchor, flag in _DATA_MAX
        for target in (
            Goal(f"{{model}}{flag}: nodes in low precision ≥ ModelOpt's", "low_nodes", ">=", 1, "≥", tool=tool,
                   anchor=anchor, context=("of {float_nodes} float nodes; left in FP32: {fp32_nodes}",)),
            Goal(f"{{model}}{flag}: Cast nodes ≤ ModelOpt's", "casts", "<=", 1, "≤", tool=tool, anchor=anchor),
            Goal(f"{{model}}{flag}: output error no worse than ModelOpt's", "rel_l2", "<=", ERROR_TOLERANCE,
                   f"≤ {ERROR_TOLERANCE:g}× ModelOpt's", tool=tool, anchor=anchor, context=("max abs {max_abs}",)),
        )
    ),
    Goal("{model} FP16 perplexity within 0.5 % of FP32", "perplexity_change", "<=", 0.005,
           "≤ 0.5 % from {fp32_perplexity}", "smollm2_135m", anchor=None,
           context=("FP32 measured {fp32_perplexity} (reference {reference})",), reference=SMOLLM2_FP32_PERPLEXITY),
    # issue 11: attention masks in FP16 without FP32 islands (the Cast-count row above), and target accuracy
    Goal("{model} FP16 perplexity within 0.1 % of FP32 (masks in FP16)", "perplexity_change", "<=", 0.001,
           "≤ 0.1 % from {fp32_perplexity}", "smollm2_135m", anchor=None,
           context=("FP32 measured {fp32_perplexity}",), reference=SMOLLM2_FP32_PERPLEXITY),
    *(
        target
        for model in ("smollm2_135m", "minilm_l6_v2")
        for target in (
            Goal(f"{{model}}: --target_accuracy {TARGET} met (real inputs)", "own_rel_l2", "<=", 1e-3,
                   "≤ 1e-3", model, "onnxprec:target", anchor=None, digits=2),
            Goal("{model}: target mode < 5× a default conversion on the same data", "time_ratio", "<", 5,
                   "< 5×", model, "onnxprec:target", "onnxprec:data", context=("default here {anchor_wall_s} s",),
                   digits=1),
            Goal("{model}: target mode nodes in low precision ≥ the default's, where the default meets the target",
                   "low_nodes_at_target", ">=", 1, "≥", model, "onnxprec:target", "onnxprec:data",
                   context=("of {float_nodes} float nodes; left in FP32: {fp32_nodes}",), reference=1e-3),
        )
    ),
)
# fmt: on


# ------------------------------------------------------------------------------------------------------------
# tables: each a tuple of (header, cell) columns over the rows of (model, tool) it keeps
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One (model, tool) of the merged results (``tool`` "fp32": the FP32 model's own row)."""

    merged: Merged
    model: str
    tool: str
    e: dict[str, Any]

    @property
    def s(self) -> dict[str, Any]:
        return self.e.get("summary", {})

    @property
    def st(self) -> dict[str, Any]:
        return self.e.get("structure") or {}

    @property
    def acc(self) -> dict[str, Any]:
        return self.e.get("accuracy", {})

    @property
    def fp32(self) -> bool:
        return self.tool == "fp32"

    def vs(self, anchor: str | None) -> dict[str, Any]:
        return (self.e.get("_vs", {}).get(anchor) or {}) if anchor else {}

    def other(self, tool: str | None) -> dict[str, Any]:
        return (self.merged.models[self.model]["tools"].get(tool) or {}) if tool else {}


def rows(merged: Merged, models: Sequence[str], keep: Callable[[Row], object], fp32: bool = False) -> list[Row]:
    """The rows ``keep`` keeps, model by model in table order (the FP32 model's first when ``fp32``)."""
    out = []
    for model in models:
        m = merged.models[model]
        out += [Row(merged, model, "fp32", m.get("fp32", {}))] if fp32 else []
        out += [Row(merged, model, tool, m["tools"][tool]) for tool in ordered(m["tools"])]
    return [r for r in out if keep(r)]


_MODEL: Column = ("Model", lambda r: model_label(r.model))
_TOOL: Column = ("Tool", lambda r: "FP32 original" if r.fp32 else tool_label(r.tool, r.e))
_TARGET_TOOLS = ("onnxprec:data", "onnxprec:target")


def _stat(key: str, digits: int = 2, of: str | None = None) -> Callable[[Row], str]:
    """A summary statistic of the row's tool (``of``: of that tool on the same model)."""
    return lambda r: stat((r.other(of).get("summary", {}) if of else r.s).get(key), digits)


def _ratio(anchor: str, key: str, digits: int = 2) -> Callable[[Row], str]:
    return lambda r: ratio(r.vs(anchor).get(key), r.vs(anchor).get("paired", True), digits)


def _versus(key: str, digits: int) -> Callable[[Row], str]:
    """The cost table's ratio against the tool's anchor, or why there is none."""

    def cell(r: Row) -> str:
        anchor = anchor_of(r.tool)
        other = r.other(anchor)
        if not r.s.get("wall_s") or r.tool in _TARGET_TOOLS:
            return ("– (accuracy target table)" if r.s.get("wall_s") else status_text(r.e)) if key == "speedup" else "–"
        if not anchor:
            return "(anchor)"
        if key == "speedup" and not r.vs(anchor) and other.get("status") in ("timeout", "memory-limit", "failed"):
            return f"{tool_label(anchor, other)}: {other['status']}"
        return ratio(r.vs(anchor).get(key), r.vs(anchor).get("paired", True), digits)

    return cell


COST: tuple[Column, ...] = (
    _MODEL,
    _TOOL,
    ("× faster than ModelOpt", _versus("speedup", 1)),
    ("peak RSS vs ModelOpt", _versus("rss_ratio", 2)),
    ("wall s", _stat("wall_s")),
    ("peak RSS MiB", _stat("peak_rss_mb", 0)),
    ("convert-only s", _stat("convert_s")),
    ("import s", _stat("import_s")),
    ("n", lambda r: str(r.s["wall_s"]["n"]) if r.s.get("wall_s") else "0"),
    ("run", lambda r: f"[{r.merged.run_number(r.e['_run'])}]"),
)


def cost_table(merged: Merged, models: Sequence[str]) -> str | None:
    """Time and memory, led by the ratios against ModelOpt (the same data_max variant)."""
    return column_table(COST, rows(merged, models, lambda r: r.e.get("status") not in ("skipped", "not run")))


def _search(r: Row) -> str:
    s = (r.e.get("tool_reported") or {}).get("target")
    if not s:
        return "–"
    reached = "reached" if s["reached"] else "NOT reached"
    return f"{s['mode']}, {s['moved']} moved, {s['sessions']} sessions, {s['runs']} runs, {reached}"


def _nodes(r: Row) -> str:
    return f"{r.st['low_nodes']}/{r.st.get('float_nodes', r.st['nodes'])}" if r.st else "–"


def _num(key: str, digits: int) -> Callable[[Row], str]:
    """The result's accuracy metric ``key`` (the FP32 model's own for its row)."""
    return lambda r: num(v, digits) if (v := (r.e if r.fp32 else r.acc).get(key)) is not None else "–"


TARGET_COLUMNS: tuple[Column, ...] = (
    _MODEL,
    _TOOL,
    ("wall s", lambda r: stat(r.s["wall_s"]) if r.s.get("wall_s") else status_text(r.e)),
    ("time vs onnxprec on the same data", _ratio("onnxprec:data", "time_ratio", 1)),
    ("low-precision nodes", _nodes),
    ("Cast nodes", lambda r: str(r.st["casts"]) if r.st else "–"),
    ("rel L2 err", _num("rel_l2", 2)),
    ("perplexity", _num("perplexity", 3)),
    ("search", _search),
)


def target_table(merged: Merged, models: Sequence[str]) -> str | None:
    """``--target_accuracy`` against the default on the same calibration data and against onnxconverter-common's
    ``auto_mixed_precision`` (AutoCast issue 11)."""
    models = [m for m in models if set(_TARGET_TOOLS) & set(merged.models[m]["tools"])]
    tools = (*_TARGET_TOOLS, "occ_amp")
    ran = rows(merged, models, lambda r: r.tool in tools and r.e.get("status") not in ("skipped", "not run"))
    return column_table(TARGET_COLUMNS, ran)


BASELINE: tuple[Column, ...] = (
    _MODEL,
    _TOOL,
    ("wall vs load+save", _ratio("baseline_loadsave", "time_ratio")),
    ("peak RSS vs load+save", _ratio("baseline_loadsave", "rss_ratio")),
    ("tool wall s", _stat("wall_s")),
    ("load+save wall s", _stat("wall_s", of="baseline_loadsave")),
    ("tool RSS MiB", _stat("peak_rss_mb", 0)),
    ("load+save RSS MiB", _stat("peak_rss_mb", 0, of="baseline_loadsave")),
)


def baseline_table(merged: Merged, models: Sequence[str]) -> str | None:
    """data_max=inf conversions against a plain onnx.load + onnx.save of the same model."""
    return column_table(BASELINE, rows(merged, models, lambda r: r.vs("baseline_loadsave")))


def _low_nodes(r: Row) -> str:
    st = r.st
    if r.fp32:
        return f"0/{st.get('float_nodes', st['nodes'])} ({st['nodes']} nodes)"
    ops = f", FP32: {_ops(st.get('fp32_ops', {}))}" if st.get("fp32_nodes") else ""
    return f"{_nodes(r)} ({st['low_pct']:.1f} %){ops}"


def _casts(r: Row) -> str:
    base = (r.merged.models[r.model].get("fp32", {}).get("structure") or {}).get("casts", 0)
    return str(r.st["casts"]) if r.fp32 else f"{r.st['casts']} ({r.st['casts'] - base:+d})"


QUALITY: tuple[Column, ...] = (
    _MODEL,
    _TOOL,
    ("low-precision nodes", _low_nodes),
    ("Cast nodes (inserted)", _casts),
    ("size", lambda r: size(r.st.get("file_bytes"))),
    (
        "max abs err",
        lambda r: num(r.acc["max_abs"], 3) if "max_abs" in r.acc else short_error(r.acc.get("error", "–"), 70),
    ),
    ("rel L2 err", lambda r: num(r.acc.get("rel_l2"), 2) if "rel_l2" in r.acc else "–"),
    ("cosine", lambda r: cos(r.acc.get("cosine"))),
    ("top-1 agree", lambda r: f"{r.acc['top1'] * 100:.2f} %" if r.acc.get("top1") is not None else "–"),
    ("perplexity", _num("perplexity", 3)),
    ("tool's own count", lambda r: _reported(r.e.get("tool_reported"))),
)


def quality_table(merged: Merged, models: Sequence[str]) -> str | None:
    """Structure and output error of each tool's result."""
    return column_table(QUALITY, rows(merged, models, lambda r: r.st, fp32=True))


def _ops(counts: dict[str, int], most: int = 3) -> str:
    """``3 Where, 2 Add`` (the most frequent op types first)."""
    items = list(counts.items())
    text = ", ".join(f"{n} {op}" for op, n in items[:most])
    return text + (", …" if len(items) > most else "")


def _reported(rep: dict[str, Any] | None) -> str:
    if not rep:
        return "–"
    text = f"{rep['low_nodes']}/{rep['nodes']}"
    if "casts_inserted" in rep:
        text += f", {rep['casts_inserted']} casts"
    return text


def _lat(r: Row) -> str:
    lat = r.e["latency_cpu"]
    if "median_ms" not in lat:
        return f"failed: {short_error(lat.get('error'))}"
    if "p10_ms" not in lat:  # onnxprec.evaluate's statistics (runs since its latency replaced the harness's)
        return f"{num(lat['median_ms'])} (p90 {num(lat['p90_ms'])}, {lat['iters']} runs)"
    return f"{num(lat['median_ms'])} [{num(lat['p10_ms'])}–{num(lat['p90_ms'])}] ({lat['iters']} runs)"


def _vs_fp32(r: Row) -> str:
    lat = r.e["latency_cpu"]
    return "1.00×" if r.fp32 else (f"{num(lat.get('vs_fp32'))}×" if "median_ms" in lat else "–")


LATENCY: tuple[Column, ...] = (
    _MODEL,
    ("Model file", _TOOL[1]),
    ("median ms [p10–p90]", _lat),
    ("vs FP32 (lower is faster)", _vs_fp32),
)


def latency_table(merged: Merged, models: Sequence[str]) -> str | None:
    """ONNX Runtime CPU latency of each result, batch 1, against the FP32 model timed in the same process."""
    timed = [m for m in models if "median_ms" in (merged.models[m].get("fp32", {}).get("latency_cpu") or {})]
    return column_table(LATENCY, rows(merged, timed, lambda r: r.e.get("latency_cpu"), fp32=True))


# ------------------------------------------------------------------------------------------------------------
# the AutoCast part of the document
# ------------------------------------------------------------------------------------------------------------

INTRO = blocks(TEXT["autocast.intro.zoo"], TEXT["autocast.intro.reproduce"])


def sections(merged: Merged, cuda: Sequence[str] = ()) -> list[str]:
    """Targets, conversion cost, quality, CPU latency, the CUDA tables (``cuda``: measured outside the harness,
    :func:`benchmarks.report_common.measured_tables`) and the method, as markdown lines."""
    groups = model_groups(merged)
    models = [m for _, ms in groups for m in ms]
    out = blocks("## Targets (AutoCast issue)", TEXT["autocast.targets"], targets_table(evaluate(TARGETS, merged)))
    out += blocks("## Conversion cost", TEXT["autocast.cost"]) + grouped_tables(merged, groups, cost_table)
    if bt := baseline_table(merged, models):
        out += blocks("### data_max=inf against a plain `onnx.load` + `onnx.save`", TEXT["autocast.baseline"], bt)
    if tt := target_table(merged, models):
        heading = f"### Accuracy target: `--target_accuracy {TARGET}` (AutoCast issue 11)"
        out += blocks(heading, TEXT["autocast.target"], tt, TEXT["autocast.target.proxy"])
    out += blocks("## Quality of the result", TEXT["autocast.quality"]) + grouped_tables(merged, groups, quality_table)
    if latency := grouped_tables(merged, groups, latency_table):
        out += blocks("## Inference latency, ONNX Runtime CPU", TEXT["autocast.latency.cpu"]) + latency
    method = TEXT["autocast.method"].format(tolerance=round((ERROR_TOLERANCE - 1) * 100))
    return out + list(cuda) + blocks("## Method", method)
