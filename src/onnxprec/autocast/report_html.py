"""The ``--report_html`` file: one self-contained page (inline CSS, JS and SVG; no network) from the report JSON.

:func:`render` takes exactly what ``--report_json`` writes (:meth:`AutoCastReport.to_json`) and returns the page:
the summary and output errors, the accuracy-target search, attention masks, a plot of each node's range and
error along the graph, counts by op type, every node's decision with the rule or measurement behind it, the
suggested ``--nodes_to_exclude``/``--nodes_to_include`` patterns and the command that reproduces the run. The
tables are plain HTML (readable without JavaScript); a small script only filters and sorts them. The JSON is
embedded too (``<script type="application/json" id="report-data">``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxprec._html import (
    BAD_COLOR,
    HIGH_COLOR,
    LOW_COLOR,
    MUTED_COLOR,
    LogAxes,
    filters,
    fmt,
    kpis,
    page,
    svg,
    table,
)
from onnxprec._html import e as _e

__all__ = ["render", "write_html"]


def _fmt(value: float | None, digits: int = 4) -> str:
    return fmt(value, digits)


def _plot(nodes: Sequence[Mapping[str, Any]], data_max: float | None, limit: float, outputs_error: float | None) -> str:
    """Two panels over the node index: each node's range (log) and its output's error against FP32 (log)."""
    width, height, left, right, top, gap = 1100, 210, 64, 16, 14, 46
    points = [(int(n["index"]), n) for n in nodes if n.get("index") is not None]
    if not points:
        return '<p class="muted">No node to plot.</p>'
    count = max(i for i, _ in points) + 1

    def panel(key: str, y0: float, title: str, lines: Sequence[tuple[float, str, str]]) -> str:
        values = [n[key] for _, n in points if isinstance(n.get(key), (int, float))]
        decades = LogAxes.decades_of([*values, *(v for v, _, _ in lines if v)])
        if decades is None:
            return f'<text x="{left}" y="{y0 + height / 2}">{_e(title)}: not measured</text>'
        axes = LogAxes((-0.5, count - 0.5), decades, (left, y0, width - left - right, height))
        out = [axes.frame(title), *(axes.hline(value, color, label) for value, color, label in lines)]
        for precision_low, color in ((False, HIGH_COLOR), (True, LOW_COLOR)):
            d = "".join(
                f"M{axes.x(i):.1f} {axes.y(n[key]):.1f}h0"
                for i, n in points
                if isinstance(n.get(key), (int, float)) and n[key] > 0 and (n["precision"] != "fp32") == precision_low
            )
            if d:
                out.append(f'<path d="{d}" stroke="{color}" stroke-width="4" stroke-linecap="round" fill="none"/>')
        return "".join(out)

    total = top + 2 * height + gap + 34
    return svg(
        width,
        total,
        [
            panel(
                "range",
                top,
                "largest magnitude of each node's tensors (as data_max saw it)",
                [
                    (data_max or 0.0, MUTED_COLOR, f"data_max {_fmt(data_max)}"),
                    (limit, BAD_COLOR, f"low type max {limit:g}"),
                ],
            ),
            panel(
                "error",
                top + height + gap,
                "relative L2 error of each node's output against FP32 (first calibration sample)",
                [(outputs_error or 0.0, MUTED_COLOR, f"model output {_fmt(outputs_error)}")],
            ),
            f'<text x="{(left + width) / 2}" y="{total - 6}" text-anchor="middle">node (topological order)</text>',
            f'<circle cx="{left + 10}" cy="{total - 10}" r="4" fill="{LOW_COLOR}"/>',
            f'<text x="{left + 18}" y="{total - 6}">low</text>',
            f'<circle cx="{left + 60}" cy="{total - 10}" r="4" fill="{HIGH_COLOR}"/>',
            f'<text x="{left + 68}" y="{total - 6}">fp32</text>',
        ],
        svg_id="plot",
        label="range and error along the graph",
    )


def render(report: Mapping[str, Any]) -> str:
    """The HTML page of a report (the dict :meth:`AutoCastReport.to_json` returns)."""
    low = str(report.get("low_precision_type", "fp16"))
    counts = report.get("counts", {})
    nodes: list[dict[str, Any]] = list(report.get("nodes", []))
    settings = report.get("settings", {}) or {}
    data_max = settings.get("data_max")
    limit = 65504.0 if low == "fp16" else 3.3895313892515355e38
    numeric = report.get("numeric") or {}
    outputs = numeric.get("outputs", {}) or {}
    worst = max((e.get("rel_l2") or 0.0 for e in outputs.values()), default=None)
    low_nodes, total = counts.get("low_nodes", 0), counts.get("nodes", 0)
    pct = 100.0 * low_nodes / total if total else 0.0

    sections = []
    kpi_html = kpis(
        [
            (f"{low_nodes} / {total}", f"nodes in {low} ({pct:.1f} %)"),
            (counts.get("casts", 0), "casts inserted"),
            (counts.get("initializers_converted", 0), "weights converted"),
            (_fmt(worst), "worst output rel. L2 vs FP32"),
        ]
    )
    output_rows = [
        [
            f"<code>{_e(name)}</code>",
            _fmt(e.get("max_abs")),
            _fmt(e.get("rel_l2")),
            _fmt(e.get("cosine"), 8),
            '<span class="ok">yes</span>' if e.get("finite") else '<span class="miss">NO</span>',
        ]
        for name, e in outputs.items()
    ]
    note = f'<p class="muted">Numeric check skipped: {_e(numeric.get("skipped"))}</p>' if numeric.get("skipped") else ""
    seconds = ", ".join(f"{k} {v:.2f} s" for k, v in (report.get("seconds") or {}).items())
    sections.append(
        '<section id="summary"><h2>Summary</h2>'
        + kpi_html
        + (
            "<h2 style='margin-top:14px'>Outputs against FP32</h2>"
            + table(["output", "max abs", "rel. L2", "cosine", "finite"], output_rows, numeric=(1, 2, 3))
            if output_rows
            else ""
        )
        + note
        + f'<p class="muted">Settings: {_e(json.dumps(settings))}; calibration batches: '
        f"{_e(report.get('reference_batches'))}; time: {_e(seconds)}</p></section>"
    )

    search = report.get("target")
    if search:
        verdict = (
            '<span class="ok">reached</span>' if search.get("reached") else '<span class="miss">NOT reached</span>'
        )
        step_rows = []
        for step in search.get("steps", []):
            errors = step.get("errors", {})
            first: Mapping[str, Any] = next(iter(errors.values()), {})
            step_rows.append(
                [
                    _e(step.get("kind")),
                    _e(step.get("what")),
                    str(step.get("low_nodes")),
                    _fmt(first.get("rel_l2")),
                    _fmt(first.get("max_abs")),
                    '<span class="ok">ok</span>' if step.get("ok") else '<span class="miss">miss</span>',
                    _fmt(step.get("seconds"), 3),
                ]
            )
        sections.append(
            f'<section id="target"><h2>Accuracy target <code>{_e(search.get("target"))}</code>: {verdict}</h2>'
            f"<p>Direction: <b>{_e(search.get('mode'))}</b>; {_e(search.get('candidates'))} candidate nodes, "
            f"{_e(search.get('moved'))} moved; {_e(search.get('sessions'))} ONNX Runtime sessions, "
            f"{_e(search.get('runs'))} runs, {_fmt(search.get('seconds'), 3)} s. {_e(search.get('note'))}</p>"
            + table(
                ["kind", "configuration", "low nodes", "rel. L2", "max abs", "verdict", "s"],
                step_rows,
                numeric=(2, 3, 4, 6),
                attrs='id="steps"',
            )
            + '<p class="muted">Emulated runs round every low tensor as FP16/BF16 hardware does; their verdicts '
            "are scaled to the error measured for real on the default classification. Real runs convert the model "
            "and run it.</p></section>"
        )

    regions = report.get("masks") or []
    if regions:
        mask_rows = [
            [
                _e(", ".join(r.get("sources", []))),
                _fmt(r.get("fill")),
                _fmt(r.get("rewritten_to")),
                str(r.get("tainted")),
                str(len(r.get("softmaxes", []))),
                _e(r.get("impure") or "attention mask"),
            ]
            for r in regions
        ]
        sections.append(
            '<section id="masks"><h2>Attention masks</h2>'
            + table(
                ["fill made by", "FP32 fill", "fill in the converted model", "mask tensors", "Softmax", "verdict"],
                mask_rows,
                numeric=(1, 2, 3, 4),
            )
            + '<p class="muted">Mask tensors are measured past their sentinels: data_max sees the scores, not the '
            "fill.</p></section>"
        )

    sections.append(
        '<section id="along"><h2>Range and error along the graph</h2>'
        + _plot(nodes, data_max, limit, worst)
        + (f'<p class="muted">{_e(report.get("errors_note"))}</p>' if report.get("errors_note") else "")
        + "</section>"
    )

    by_op = report.get("by_op_type") or {}
    op_rows = [
        [f"<code>{_e(op)}</code>", str(c.get(low, 0)), str(c.get("fp32", 0)), str(sum(c.values()))]
        for op, c in by_op.items()
    ]
    sections.append(
        '<section id="ops"><h2>Nodes by op type</h2>'
        + table(["op type", low, "fp32", "total"], op_rows, numeric=(1, 2, 3), attrs='id="by-op"')
        + "</section>"
    )

    node_rows = []
    for n in nodes:
        precision = n.get("precision")
        cls = "fp32" if precision == "fp32" else "low"
        rng, measured = n.get("range"), n.get("measured_range")
        shown = _fmt(rng) + (f" <span class='muted'>(raw {_fmt(measured)})</span>" if measured != rng else "")
        node_rows.append(
            f'<tr data-precision="{_e(precision)}"><td class="num">{_e(n.get("index"))}</td>'
            f"<td><code>{_e(n.get('name'))}</code></td><td>{_e(n.get('op_type'))}</td>"
            f'<td class="{cls}">{_e(precision)}</td><td>{_e(n.get("reason"))}</td>'
            f'<td class="num" data-v="{_e(rng if rng is not None else -1)}">{shown}</td>'
            f'<td class="num">{_fmt(data_max)}</td><td class="num">{_e(n.get("casts", 0))}</td>'
            f'<td class="num" data-v="{_e(n.get("error") if n.get("error") is not None else -1)}">'
            f"{_fmt(n.get('error'))}</td></tr>"
        )
    headers = ["#", "node", "op type", "precision", "decided by", "range", "data_max", "casts", "error vs FP32"]
    controls = filters(
        "nodes",
        search="filter: name, op type, reason...",
        search_id="filter",
        select=("precision", "data-precision", [("", "all precisions"), (low, low), ("fp32", "fp32")]),
        count_id="shown",
    )
    sections.append(
        '<section id="all-nodes"><h2>Every node</h2>'
        + controls
        + '<div class="scroll">'
        + table(headers, node_rows, numeric=(0, 5, 6, 7, 8), attrs='id="nodes"')
        + "</div>"
        '<p class="muted">range: the largest magnitude of the node\'s non-constant tensors as data_max saw it (raw: '
        "as measured, mask sentinels included); casts: inserted next to the node; error: of the node's output "
        "against FP32 on the first calibration sample.</p></section>"
    )

    suggestions = report.get("suggestions") or {}
    blocks = []
    for flag in ("nodes_to_exclude", "nodes_to_include"):
        item = suggestions.get(flag) or {}
        found = item.get("patterns") or []
        if not found:
            blocks.append(f"<h3>--{flag}</h3><p class='muted'>Nothing to suggest.</p>")
            continue
        rows = [[f"<code>{_e(p['pattern'])}</code>", str(p["nodes"])] for p in found]
        argument = " ".join(json.dumps(p["pattern"]) for p in found)
        blocks.append(
            f"<h3>--{flag}</h3><p class='muted'>{_e(item.get('why'))}</p>"
            + table(["pattern (re.match)", "nodes"], rows, numeric=(1,), attrs=f'id="{flag}"')
            + f"<pre>--{flag} {_e(argument)}</pre>"
        )
    sections.append('<section id="suggestions"><h2>Suggested patterns</h2>' + "".join(blocks) + "</section>")
    sections.append(
        '<section id="reproduce"><h2>Reproduce</h2>'
        f'<pre id="command">{_e(report.get("command") or "(converted through the API)")}</pre>'
        f'<p class="muted">onnxprec {_e(report.get("onnxprec_version"))}</p></section>'
    )

    title = f"AutoCast report: {Path(str(report.get('input') or 'model')).name}"
    return page(title, f"{report.get('input')} → {report.get('output')} · {low}", sections, report)


def write_html(path: str | Path, report: Mapping[str, Any]) -> Path:
    """Writes the page atomically; returns the path."""
    from onnxprec._io import write_atomically

    return write_atomically(path, render(report))
