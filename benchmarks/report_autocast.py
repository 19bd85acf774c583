"""The AutoCast part of BENCHMARKS.md: its targets (as data), conversion cost, quality and CPU latency.

The loading, merging and formatting it uses are :mod:`benchmarks.report_common`'s; the targets are evaluated by
:func:`benchmarks.targets.evaluate`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo import SMOLLM2_FP32_PERPLEXITY

from .report_common import (
    TEXT,
    Merged,
    anchor_of,
    cos,
    grouped_tables,
    median,
    model_groups,
    model_label,
    model_sort_key,
    num,
    ordered,
    ratio,
    short_error,
    size,
    stat,
    status_text,
    table,
    tool_label,
)
from .targets import Target, evaluate, targets_table
from .tools import TARGET, TOOLS

logger = logging.getLogger(__name__)

GIB_MB = 1024.0
ERROR_TOLERANCE = 1.05  # "output error no worse": relative L2 at most 5 % above ModelOpt's

# ------------------------------------------------------------------------------------------------------------
# targets (the AutoCast issue's goals)
# ------------------------------------------------------------------------------------------------------------

_MODELOPT_WALL = "ModelOpt here {anchor_wall_s} s"


def _versus_modelopt(tool: str, anchor: str, flag: str) -> tuple[Target, ...]:
    """The result-quality targets of ``tool`` against ModelOpt with the same data_max, on every model."""
    return (
        Target(
            f"{{model}}{flag}: nodes in low precision ≥ ModelOpt's",
            "low_nodes",
            ">=",
            1,
            "≥",
            tool=tool,
            anchor=anchor,
            context=("of {float_nodes} float nodes; left in FP32: {fp32_nodes}",),
        ),
        Target(f"{{model}}{flag}: Cast nodes ≤ ModelOpt's", "casts", "<=", 1, "≤", tool=tool, anchor=anchor),
        Target(
            f"{{model}}{flag}: output error no worse than ModelOpt's",
            "rel_l2",
            "<=",
            ERROR_TOLERANCE,
            f"≤ {ERROR_TOLERANCE:g}× ModelOpt's",
            tool=tool,
            anchor=anchor,
            context=("max abs {max_abs}",),
        ),
    )


# fmt: off
TARGETS: tuple[Target, ...] = (
    Target("{model}: whole process ≥10× faster than ModelOpt", "speedup", ">=", 10, "≥ 10×", "smollm2_135m",
           context=(_MODELOPT_WALL, " (issue: 156 s)"), digits=1),
    Target("{model}: peak RSS ≤ 1/3 of ModelOpt's", "rss_ratio", "<=", 1 / 3, "≤ 0.333×", "smollm2_135m",
           context=("ModelOpt here {anchor_rss_gib} GiB", " (issue: 5.9 GB)"), digits=3),
    # Foundation issue (runtime layer and observer-based reference runs): 622 MiB of FP32 weights.
    Target("{model}: whole process ≥25× faster than ModelOpt (foundation)", "speedup", ">=", 25, "≥ 25×",
           "smollm2_135m", context=(_MODELOPT_WALL,), digits=1),
    Target("{model}: peak RSS ≤ 1.2× the weights (foundation)", "peak_rss_mb", "<=", 1.2 * 622.3,
           "≤ 747 MiB (1.2 × 622 MiB)", "smollm2_135m", anchor=None, digits=0),
    Target("{model}, data_max=inf: wall ≤ 1.5× a plain onnx.load + onnx.save", "time_ratio", "<=", 1.5, "≤ 1.5×",
           "smollm2_135m", "onnxprec:inf", "baseline_loadsave"),
    Target("{model}, data_max=inf: peak RSS < 1 GiB", "peak_rss_mb", "<", GIB_MB, "< 1024 MiB", "smollm2_135m",
           "onnxprec:inf", anchor=None, digits=0),
    Target("4 GiB external-data MatMul stack, data_max=inf: peak RSS < 1 GiB", "peak_rss_mb", "<", GIB_MB,
           "< 1024 MiB", "matmul_4gb", "onnxprec:inf", anchor=None, digits=0),
    Target("{model}: whole process ≥5× faster than ModelOpt", "speedup", ">=", 5, "≥ 5×", "minilm_l6_v2",
           context=(_MODELOPT_WALL,), digits=1),
    Target("{model}: whole process ≥5× faster than ModelOpt", "speedup", ">=", 5, "≥ 5×", "efficientnet_lite0",
           context=(_MODELOPT_WALL,), digits=1),
    Target("2000-node chain: whole process < 2 s", "wall_s", "<", 2, "< 2 s", "chain_2000",
           context=(_MODELOPT_WALL, " (issue: 68 s)")),
    Target("2000-node chain (data_max=inf): whole process < 2 s", "wall_s", "<", 2, "< 2 s", "chain_2000",
           "onnxprec:inf", "modelopt:inf", context=(_MODELOPT_WALL, " (issue: 68 s)")),
    *_versus_modelopt("onnxprec", "modelopt", ""),
    *_versus_modelopt("onnxprec:inf", "modelopt:inf", " (data_max=inf)"),
    Target("{model} FP16 perplexity within 0.5 % of FP32", "perplexity_change", "<=", 0.005,
           "≤ 0.5 % from {fp32_perplexity}", "smollm2_135m", anchor=None,
           context=("FP32 measured {fp32_perplexity} (reference {reference})",), reference=SMOLLM2_FP32_PERPLEXITY),
    # issue 11: attention masks in FP16 without FP32 islands (the Cast-count row above), and target accuracy
    Target("{model} FP16 perplexity within 0.1 % of FP32 (masks in FP16)", "perplexity_change", "<=", 0.001,
           "≤ 0.1 % from {fp32_perplexity}", "smollm2_135m", anchor=None,
           context=("FP32 measured {fp32_perplexity}",), reference=SMOLLM2_FP32_PERPLEXITY),
    *(
        target
        for model in ("smollm2_135m", "minilm_l6_v2")
        for target in (
            Target(f"{{model}}: --target_accuracy {TARGET} met (real inputs)", "own_rel_l2", "<=", 1e-3,
                   "≤ 1e-3", model, "onnxprec:target", anchor=None, digits=2),
            Target("{model}: target mode < 5× a default conversion on the same data", "time_ratio", "<", 5,
                   "< 5×", model, "onnxprec:target", "onnxprec:data", context=("default here {anchor_wall_s} s",),
                   digits=1),
            Target("{model}: target mode nodes in low precision ≥ the default's, where the default meets the target",
                   "low_nodes_at_target", ">=", 1, "≥", model, "onnxprec:target", "onnxprec:data",
                   context=("of {float_nodes} float nodes; left in FP32: {fp32_nodes}",), reference=1e-3),
        )
    ),
)
# fmt: on


# ------------------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------------------


def cost_table(merged: Merged, models: Sequence[str]) -> str:
    """Time and memory, led by the ratios against ModelOpt (the same data_max variant)."""
    rows = []
    for model in models:
        m = merged.models[model]
        for tool in ordered(m["tools"]):
            e = m["tools"][tool]
            if e.get("status") in ("skipped", "not run"):
                continue
            anchor = anchor_of(tool)
            v = e["_vs"].get(anchor) if anchor else None
            s = e.get("summary", {})
            if not s.get("wall_s"):
                speed, rss = status_text(e), "–"
            elif tool in _TARGET_TOOLS:
                speed, rss = "– (accuracy target table)", "–"
            else:
                paired = v.get("paired", True) if v else True
                speed = ratio(v.get("speedup") if v else None, paired, 1) if anchor else "(anchor)"
                rss = ratio(v.get("rss_ratio") if v else None, paired, 2) if anchor else "(anchor)"
                other = m["tools"].get(anchor) if anchor else None
                if anchor and not v and other and other.get("status") in ("timeout", "memory-limit", "failed"):
                    speed = f"{tool_label(anchor, other)}: {other['status']}"
            rows.append(
                [
                    model_label(model),
                    tool_label(tool, e),
                    speed,
                    rss,
                    stat(s.get("wall_s")),
                    stat(s.get("peak_rss_mb"), 0),
                    stat(s.get("convert_s")),
                    stat(s.get("import_s")),
                    str(s["wall_s"]["n"]) if s.get("wall_s") else "0",
                    f"[{merged.run_number(e['_run'])}]",
                ]
            )
    return table(
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


_TARGET_TOOLS = ("onnxprec:data", "onnxprec:target")


def target_table(merged: Merged, models: Sequence[str]) -> str | None:
    """``--target_accuracy`` against the default on the same calibration data and against onnxconverter-common's
    ``auto_mixed_precision`` (AutoCast issue 11)."""
    rows = []
    for model in models:
        m = merged.models[model]
        base = m["tools"].get("onnxprec:data")
        if not base and "onnxprec:target" not in m["tools"]:
            continue
        for tool in ("onnxprec:data", "onnxprec:target", "occ_amp"):
            e = m["tools"].get(tool)
            if not e or e.get("status") in ("skipped", "not run"):
                continue
            s, st, acc = e.get("summary", {}), e.get("structure"), e.get("accuracy", {})
            v = e["_vs"].get("onnxprec:data") if tool != "onnxprec:data" else None
            search = (e.get("tool_reported") or {}).get("target") or {}
            rows.append(
                [
                    model_label(model),
                    tool_label(tool, e),
                    stat(s.get("wall_s")) if s.get("wall_s") else status_text(e),
                    ratio(v.get("time_ratio"), v.get("paired", True), 1) if v and v.get("time_ratio") else "–",
                    f"{st['low_nodes']}/{st.get('float_nodes', st['nodes'])}" if st else "–",
                    str(st["casts"]) if st else "–",
                    num(acc.get("rel_l2"), 2) if "rel_l2" in acc else "–",
                    num(acc.get("perplexity"), 3) if acc.get("perplexity") is not None else "–",
                    (
                        f"{search['mode']}, {search['moved']} moved, {search['sessions']} sessions, "
                        f"{search['runs']} runs, {'reached' if search['reached'] else 'NOT reached'}"
                    )
                    if search
                    else "–",
                ]
            )
    if not rows:
        return None
    return table(
        [
            "Model",
            "Tool",
            "wall s",
            "time vs onnxprec on the same data",
            "low-precision nodes",
            "Cast nodes",
            "rel L2 err",
            "perplexity",
            "search",
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
        for tool in ordered(m["tools"]):
            v = m["tools"][tool]["_vs"].get("baseline_loadsave")
            if not v:
                continue
            e = m["tools"][tool]
            rows.append(
                [
                    model_label(model),
                    tool_label(tool, e),
                    ratio(v.get("time_ratio"), v.get("paired", True)),
                    ratio(v.get("rss_ratio"), v.get("paired", True)),
                    stat(e["summary"].get("wall_s")),
                    stat(base["summary"].get("wall_s")),
                    stat(e["summary"].get("peak_rss_mb"), 0),
                    stat(base["summary"].get("peak_rss_mb"), 0),
                ]
            )
    if not rows:
        return None
    return table(
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
                    model_label(model),
                    "FP32 original",
                    f"0/{fs.get('float_nodes', fs['nodes'])} ({fs['nodes']} nodes)",
                    str(fs["casts"]),
                    size(fs.get("file_bytes")),
                    "–",
                    "–",
                    "–",
                    "–",
                    num(ppl, 3) if ppl else "–",
                    "–",
                ]
            )
        for tool in ordered(m["tools"]):
            e = m["tools"][tool]
            st = e.get("structure")
            if not st:
                continue
            acc = e.get("accuracy", {})
            rep = e.get("tool_reported")
            base_casts = fs["casts"] if fs else 0
            rows.append(
                [
                    model_label(model),
                    tool_label(tool, e),
                    f"{st['low_nodes']}/{st.get('float_nodes', st['nodes'])} ({st['low_pct']:.1f} %)"
                    + (f", FP32: {_ops(st.get('fp32_ops', {}))}" if st.get("fp32_nodes") else ""),
                    f"{st['casts']} ({st['casts'] - base_casts:+d})",
                    size(st.get("file_bytes")),
                    num(acc.get("max_abs"), 3) if "max_abs" in acc else short_error(acc.get("error", "–"), 70),
                    num(acc.get("rel_l2"), 2) if "rel_l2" in acc else "–",
                    cos(acc.get("cosine")),
                    f"{acc['top1'] * 100:.2f} %" if acc.get("top1") is not None else "–",
                    num(acc.get("perplexity"), 3) if acc.get("perplexity") is not None else "–",
                    _reported(rep),
                ]
            )
    return table(
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
        rows.append([model_label(model), "FP32 original", _lat(base), "1.00×"])
        for tool in ordered(m["tools"]):
            e = m["tools"][tool]
            lat = e.get("latency_cpu")
            if not lat:
                continue
            if "median_ms" not in lat:
                rows.append([model_label(model), tool_label(tool, e), f"failed: {short_error(lat.get('error'))}", "–"])
                continue
            rows.append([model_label(model), tool_label(tool, e), _lat(lat), f"{num(lat.get('vs_fp32'))}×"])
    if not rows:
        return None
    return table(["Model", "Model file", "median ms [p10–p90]", "vs FP32 (lower is faster)"], rows)


def _lat(lat: dict[str, Any]) -> str:
    if "p10_ms" not in lat:  # onnxprec.evaluate's statistics (runs from 2026-11-27 on)
        return f"{num(lat['median_ms'])} (p90 {num(lat['p90_ms'])}, {lat['iters']} runs)"
    return f"{num(lat['median_ms'])} [{num(lat['p10_ms'])}–{num(lat['p90_ms'])}] ({lat['iters']} runs)"


# ------------------------------------------------------------------------------------------------------------
# chart
# ------------------------------------------------------------------------------------------------------------


def scaling_chart(merged: Merged, path: Path) -> bool:
    """Wall time and peak RSS against model size for the chains and the MatMul stacks; False without data."""
    chains = sorted((m for m in merged.models if m.startswith("chain_")), key=model_sort_key)
    mats = sorted((m for m in merged.models if m.startswith("matmul_")), key=model_sort_key)
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
                    med = median(e, key)
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


METHOD = ["## Method", "", TEXT["autocast.method"].format(tolerance=round((ERROR_TOLERANCE - 1) * 100)), ""]


# ------------------------------------------------------------------------------------------------------------
# the AutoCast part of the document
# ------------------------------------------------------------------------------------------------------------

INTRO = (
    TEXT["autocast.intro.zoo"],
    "",
    TEXT["autocast.intro.reproduce"],
    "",
)


def sections(merged: Merged, cuda: Sequence[str] = (), png: str | None = None) -> list[str]:
    """Targets, conversion cost, quality, CPU latency, the CUDA tables (``cuda``: measured outside the harness,
    :func:`benchmarks.report_common.measured_tables`) and the method, as markdown lines."""
    out = [
        "## Targets (AutoCast issue)",
        "",
        "Whole process, same flags, `--keep_io_types`. ✅ reached, ❌ not reached, – not measured. "
        "Ratios: median over rounds [min–max]; † = ratio of medians from different runs.",
        "",
        targets_table(evaluate(TARGETS, merged)),
        "",
    ]
    groups = model_groups(merged)
    out += [
        "## Conversion cost",
        "",
        TEXT["autocast.cost"],
        "",
    ]
    out += grouped_tables(merged, groups, cost_table)
    bt = baseline_table(merged, [m for _, ms in groups for m in ms])
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
    tt = target_table(merged, [m for _, ms in groups for m in ms])
    if tt:
        out += [
            f"### Accuracy target: `--target_accuracy {TARGET}` (AutoCast issue 11)",
            "",
            TEXT["autocast.target"],
            "",
            tt,
            "",
            TEXT["autocast.target.proxy"],
            "",
        ]
    if png:
        out += ["### Scaling chart", "", f"![wall time and peak RSS against model size]({png})", ""]
    out += [
        "## Quality of the result",
        "",
        TEXT["autocast.quality"],
        "",
    ]
    out += grouped_tables(merged, groups, quality_table)
    lat_parts = grouped_tables(merged, groups, latency_table)
    if lat_parts:
        out += [
            "## Inference latency, ONNX Runtime CPU",
            "",
            TEXT["autocast.latency.cpu"],
            "",
            *lat_parts,
        ]
    out += cuda
    return out + METHOD
