"""The compare report as a terminal table and as a self-contained HTML page (inline CSS, JS and SVG)."""

from __future__ import annotations

import html
import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxprec.debug.compare import CompareReport, CompareRow

__all__ = ["fmt", "render", "text_table"]


def fmt(value: float | None, digits: int = 3) -> str:
    """A number in 3 (or ``digits``) significant digits; ``-`` for None."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


# --------------------------------------------------------------------------------------------------
# Terminal


def _selection(report: CompareReport, max_rows: int) -> list[CompareRow | None]:
    """All rows when they fit; else those around the first divergence and the worst ones (None marks a gap)."""
    rows = report.rows
    if len(rows) <= max_rows:
        return list(rows)
    keep: set[int] = set()
    first = report.first_divergence_row
    if first is not None:
        at = rows.index(first)
        keep.update(range(max(0, at - 5), min(len(rows), at + 10)))
    worst = sorted(
        (i for i, r in enumerate(rows) if r.rel_l2 is not None),
        key=lambda i: -(rows[i].rel_l2 if math.isfinite(rows[i].rel_l2 or 0.0) else math.inf),  # type: ignore[operator]
    )
    for i in worst:
        if len(keep) >= max_rows:
            break
        keep.add(i)
    keep.update(range(len(rows) - 1, len(rows)))  # the last node: the model's output
    picked: list[CompareRow | None] = []
    previous = -1
    for i in sorted(keep):
        if i != previous + 1:
            picked.append(None)
        picked.append(rows[i])
        previous = i
    if previous != len(rows) - 1:
        picked.append(None)
    return picked


def text_table(report: CompareReport, max_rows: int = 40) -> str:
    """A fixed-width table of the rows (flag ``!`` marks diverged rows, ``>`` the first divergence)."""
    head = f"{'':1} {'#':>5} {'depth':>5}  {'node':<44} {'op':<14} {'max_abs':>9} {'rel_l2':>9} {'cosine':>9}  match"
    lines = [head, "-" * len(head)]
    first = report.first_divergence_row
    for row in _selection(report, max_rows):
        if row is None:
            lines.append(f"{'':1} {'...':>5}")
            continue
        flag = ">" if row is first else "!" if row.diverged else " "
        how = row.match if row.status == "compared" else row.status
        lines.append(
            f"{flag:1} {row.index:>5} {row.depth:>5}  {_short(row.node, 44):<44} {_short(row.op_type, 14):<14} "
            f"{fmt(row.max_abs):>9} {fmt(row.rel_l2):>9} {fmt(row.cosine, 6):>9}  {_short(how, 30)}"
        )
    shown = sum(1 for r in _selection(report, max_rows) if r is not None)
    if shown < len(report.rows):
        lines.append(f"({shown} of {len(report.rows)} rows shown: write them all with --json or --html)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px}
th,td{padding:2px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{position:sticky;top:0;background:#f6f6f6;cursor:pointer}
td.l,th.l{text-align:left}
tr.div td{background:#fff0f0}tr.first td{background:#ffd6d6;font-weight:bold}
tr.un td{color:#999}
code{background:#f3f3f3;padding:1px 4px}
.ok{color:#096}.bad{color:#c00}
svg text{font:11px sans-serif}
"""

_JS = """
function filt(){var q=document.getElementById('q').value.toLowerCase(),d=document.getElementById('d').checked;
document.querySelectorAll('#rows tbody tr').forEach(function(r){var s=r.textContent.toLowerCase();
r.style.display=(s.indexOf(q)>=0&&(!d||r.classList.contains('div')))?'':'none'})}
function sortBy(c,n){var t=document.querySelector('#rows tbody'),rs=Array.from(t.rows);
var k=function(r){var v=r.cells[c].dataset.v||r.cells[c].textContent;return n?(v==='-'?-1:parseFloat(v)):v};
var asc=t.dataset.c==c&&t.dataset.o!=='a';t.dataset.c=c;t.dataset.o=asc?'a':'d';
rs.sort(function(a,b){var x=k(a),y=k(b);return (x<y?-1:x>y?1:0)*(asc?1:-1)});rs.forEach(function(r){t.appendChild(r)})}
"""


def _plot(report: CompareReport) -> str:
    """Relative L2 error (log scale) against depth: the worst inexact tensor per depth as a line, every tensor a dot."""
    rows = [r for r in report.rows if r.rel_l2 is not None]
    if not rows:
        return "<p>No tensor was compared.</p>"
    width, height, left, bottom, top = 900, 300, 60, 30, 10
    floor, ceiling = -8.0, 2.0

    def y_of(value: float) -> float:
        v = math.log10(value) if value > 0 else floor
        v = ceiling if not math.isfinite(v) else min(max(v, floor), ceiling)
        return top + (ceiling - v) / (ceiling - floor) * (height - top - bottom)

    deepest = max(r.depth for r in rows)

    def x_of(depth: int) -> float:
        return left + (depth / max(deepest, 1)) * (width - left - 10)

    worst: dict[int, float] = {}
    for r in rows:
        value = r.rel_l2 if r.rel_l2 is not None and math.isfinite(r.rel_l2) else 10.0**ceiling
        if r.nonfinite > r.ref_nonfinite:
            value = 10.0**ceiling
        if value > 0:  # exact tensors (shape ops, FP32 islands) would pull the line to the floor
            worst[r.depth] = max(worst.get(r.depth, 0.0), value)
    line = " ".join(f"{x_of(d):.1f},{y_of(v):.1f}" for d, v in sorted(worst.items()))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for exponent in range(int(floor), int(ceiling) + 1, 2):
        y = y_of(10.0**exponent)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{exponent}</text>')
    tolerance = y_of(report.rtol) if report.rtol > 0 else None
    if tolerance is not None:
        parts.append(
            f'<line x1="{left}" x2="{width - 10}" y1="{tolerance:.1f}" y2="{tolerance:.1f}" stroke="#c00" '
            f'stroke-dasharray="4 3"><title>rtol {report.rtol:g}</title></line>'
        )
    first = report.first_divergence_row
    if first is not None:
        x = x_of(first.depth)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{height - bottom}" stroke="#c00">'
            f"<title>first divergence: {html.escape(first.node)}</title></line>"
        )
    parts.append(f'<polyline fill="none" stroke="#36c" stroke-width="1.5" points="{line}"/>')
    for r in rows:
        value = r.rel_l2 if r.rel_l2 is not None else 0.0
        color = "#c00" if r.diverged else "#36c"
        label = html.escape(f"{r.node} ({r.op_type}) depth {r.depth}: rel_l2 {fmt(r.rel_l2)}")
        parts.append(
            f'<circle cx="{x_of(r.depth):.1f}" cy="{y_of(value):.1f}" r="2" fill="{color}" fill-opacity="0.5">'
            f"<title>{label}</title></circle>"
        )
    axis_y = height - bottom
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{axis_y}" y2="{axis_y}" stroke="#999"/>')
    parts.append(
        f'<text x="{(width + left) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
        "depth (node level from the inputs)</text>"
    )
    parts.append(f'<text x="{left}" y="{axis_y + 14}" text-anchor="middle">0</text>')
    parts.append(f'<text x="{width - 10}" y="{axis_y + 14}" text-anchor="end">{deepest}</text>')
    parts.append(
        f'<text x="12" y="{top + 10}" transform="rotate(-90 12 {top + 10})" text-anchor="end">rel L2 error</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _cell(value: float | None, digits: int = 3) -> str:
    shown = fmt(value, digits)
    exact = "-" if value is None else repr(value)
    return f'<td data-v="{html.escape(exact)}">{html.escape(shown)}</td>'


def render(report: CompareReport) -> str:
    """The whole page as a string."""
    e = html.escape
    first = report.first_divergence_row
    summary = [f"<p>{e(report.summary)}.</p>"]
    if first is not None:
        summary.append(
            "<p>Keep it in high precision with "
            f"<code>--nodes_to_exclude '{e(report.exclude_pattern or '')}'</code>.</p>"
        )
    if report.verification is not None:
        v = report.verification
        css = "ok" if v.fixed else "bad"
        summary.append(f'<p class="{css}">{e(v.summary)}</p>')
    summary += [f"<p>{e(note)}</p>" for note in report.notes]
    outputs = [
        "<table><tr><th class=l>output</th><th>max abs</th><th>rel L2</th><th>cosine</th><th>top-1</th>"
        "<th>non-finite</th></tr>"
    ]
    outputs += [
        f"<tr><td class=l>{e(o.name)}</td>{_cell(o.max_abs)}{_cell(o.rel_l2)}{_cell(o.cosine, 6)}"
        f"{_cell(o.top1, 4)}<td>{o.nonfinite}</td></tr>"
        for o in report.outputs.values()
    ]
    outputs.append("</table>")
    header = [
        "#",
        "depth",
        "node",
        "op",
        "tensor",
        "candidate",
        "match",
        "max abs",
        "rel L2",
        "cosine",
        "|ref| max",
        "non-finite",
    ]
    text_columns = {2, 3, 4, 5, 6}
    table = ['<table id="rows"><thead><tr>']
    for i, name in enumerate(header):
        css = ' class="l"' if i in text_columns else ""
        numeric = "false" if i in text_columns else "true"
        table.append(f'<th{css} onclick="sortBy({i},{numeric})">{e(name)}</th>')
    table.append("</tr></thead><tbody>")
    for r in report.rows:
        css = "first div" if r is first else "div" if r.diverged else "un" if r.status != "compared" else ""
        how = r.match if r.status == "compared" else f"{r.status}: {r.match}"
        table.append(
            f'<tr class="{css}"><td data-v="{r.index}">{r.index}</td><td data-v="{r.depth}">{r.depth}</td>'
            f"<td class=l>{e(r.node)}</td><td class=l>{e(r.op_type)}</td><td class=l>{e(r.tensor)}</td>"
            f"<td class=l>{e(r.candidate or '-')}</td><td class=l>{e(how)}</td>"
            f"{_cell(r.max_abs)}{_cell(r.rel_l2)}{_cell(r.cosine, 6)}{_cell(r.ref_absmax)}"
            f'<td data-v="{r.nonfinite}">{r.nonfinite}</td></tr>'
        )
    table.append("</tbody></table>")
    title = f"onnxprec compare: {report.candidate or 'candidate'} vs {report.reference or 'reference'}"
    settings = json.dumps({"atol": report.atol, "rtol": report.rtol, "batches": report.batches})
    return "".join(
        [
            "<!DOCTYPE html><html><head><meta charset='utf-8'>",
            f"<title>{e(title)}</title><style>{_CSS}</style><script>{_JS}</script></head><body>",
            f"<h1>{e(title)}</h1>",
            *summary,
            f"<p>Criterion: a tensor diverges when the candidate has non-finite values where the reference has none, "
            f"or when rel L2 &gt; rtol and max abs &gt; atol. Settings: <code>{e(settings)}</code></p>",
            "<h2>Final outputs</h2>",
            *outputs,
            "<h2>Error along the graph</h2>",
            _plot(report),
            "<h2>Every tensor, in topological order</h2>",
            '<p><input id="q" placeholder="filter" oninput="filt()"> '
            '<label><input id="d" type="checkbox" onchange="filt()"> diverged only</label></p>',
            *table,
            "</body></html>\n",
        ]
    )
