"""The ``--report`` HTML file: one self-contained page (inline CSS, JS and SVG; no network) from the report JSON.

:func:`render` takes exactly what ``--report_json`` writes (:meth:`AutoCastReport.to_json`) and returns the page:
the summary and output errors, the accuracy-target search, attention masks, a plot of each node's range and
error along the graph, counts by op type, every node's decision with the rule or measurement behind it, the
suggested ``--nodes_to_exclude``/``--nodes_to_include`` patterns and the command that reproduces the run. The
tables are plain HTML (readable without JavaScript); a small script only filters and sorts them. The JSON is
embedded too (``<script type="application/json" id="report-data">``).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["render", "write_html"]

_LOW = "#2563eb"
_HIGH = "#ea580c"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1f2937;
background:#f8fafc}
header{background:#0f172a;color:#f8fafc;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header p{margin:0;color:#cbd5e1}main{padding:18px 28px;max-width:1400px}
section{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:14px 18px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 10px}table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f5f9;position:sticky;top:0;cursor:pointer;user-select:none}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.kpis{display:flex;flex-wrap:wrap;gap:12px}
.kpi{border:1px solid #e2e8f0;border-radius:6px;padding:8px 12px;min-width:130px}
.kpi b{display:block;font-size:20px}.low{color:#1d4ed8}.fp32{color:#c2410c}.ok{color:#15803d}.miss{color:#b91c1c}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
pre{background:#f1f5f9;padding:8px 10px;border-radius:6px;white-space:pre-wrap;word-break:break-all}
.controls{display:flex;gap:10px;align-items:center;margin:0 0 8px}.controls input{padding:4px 8px;width:320px}
.scroll{max-height:560px;overflow:auto;border:1px solid #e2e8f0}.muted{color:#64748b}
svg text{font:11px system-ui,sans-serif;fill:#334155}
"""

_JS = """
(function(){
  var table=document.getElementById('nodes');
  var filter=document.getElementById('filter');
  var precision=document.getElementById('precision');
  var count=document.getElementById('shown');
  function apply(){
    var q=filter.value.toLowerCase(), p=precision.value, n=0;
    var rows=table.tBodies[0].rows;
    for(var i=0;i<rows.length;i++){
      var r=rows[i], show=(!q||r.textContent.toLowerCase().indexOf(q)>=0)&&(!p||r.getAttribute('data-precision')===p);
      r.style.display=show?'':'none'; if(show){n++;}
    }
    count.textContent=n;
  }
  filter.addEventListener('input',apply); precision.addEventListener('change',apply);
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable th'),function(th,col){
    th.addEventListener('click',function(){
      var body=th.closest('table').tBodies[0], rows=Array.prototype.slice.call(body.rows);
      var asc=th.getAttribute('data-sort')!=='asc'; th.setAttribute('data-sort',asc?'asc':'desc');
      rows.sort(function(a,b){
        var x=a.cells[col].getAttribute('data-v')||a.cells[col].textContent;
        var y=b.cells[col].getAttribute('data-v')||b.cells[col].textContent;
        var fx=parseFloat(x), fy=parseFloat(y);
        var c=(!isNaN(fx)&&!isNaN(fy))?fx-fy:x.localeCompare(y);
        return asc?c:-c;
      });
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
  apply();
})();
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "–"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, numeric: Iterable[int] = (), attrs: str = ""
) -> str:
    nums = set(numeric)
    head = "".join(f'<th class="num">{_e(h)}</th>' if i in nums else f"<th>{_e(h)}</th>" for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in nums else ""
            cells.append(f"<td{cls}>{cell}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table {attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _plot(nodes: Sequence[Mapping[str, Any]], data_max: float | None, limit: float, outputs_error: float | None) -> str:
    """Two panels over the node index: each node's range (log) and its output's error against FP32 (log)."""
    width, height, left, right, top, gap = 1100, 210, 64, 16, 14, 46
    points = [(int(n["index"]), n) for n in nodes if n.get("index") is not None]
    if not points:
        return '<p class="muted">No node to plot.</p>'
    count = max(i for i, _ in points) + 1

    def x(index: int) -> float:
        return left + (width - left - right) * (index + 0.5) / count

    def panel(key: str, y0: float, title: str, lines: Sequence[tuple[float, str, str]]) -> str:
        values = [n[key] for _, n in points if isinstance(n.get(key), (int, float)) and n[key] > 0]
        values += [v for v, _, _ in lines if v and v > 0 and math.isfinite(v)]
        if not values:
            return f'<text x="{left}" y="{y0 + height / 2}">{_e(title)}: not measured</text>'
        lo = math.floor(math.log10(min(values)))
        hi = math.ceil(math.log10(max(values)))
        hi = hi if hi > lo else lo + 1

        def y(v: float) -> float:
            return y0 + height - (height * (math.log10(v) - lo) / (hi - lo))

        out = [
            f'<rect x="{left}" y="{y0}" width="{width - left - right}" height="{height}" fill="#fff" stroke="#cbd5e1"/>'
        ]
        for tick in range(lo, hi + 1):
            ty = y(10.0**tick)
            out.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eef2f7"/>')
            out.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end">1e{tick}</text>')
        for value, color, label in lines:
            if value and value > 0 and math.isfinite(value):
                ly = y(value)
                out.append(
                    f'<line x1="{left}" x2="{width - right}" y1="{ly:.1f}" y2="{ly:.1f}" stroke="{color}" '
                    f'stroke-dasharray="5 4"/><text x="{width - right - 4}" y="{ly - 4:.1f}" text-anchor="end" '
                    f'style="fill:{color}">{_e(label)}</text>'
                )
        for precision_low, color in ((False, _HIGH), (True, _LOW)):
            d = "".join(
                f"M{x(i):.1f} {y(n[key]):.1f}h0"
                for i, n in points
                if isinstance(n.get(key), (int, float)) and n[key] > 0 and (n["precision"] != "fp32") == precision_low
            )
            if d:
                out.append(f'<path d="{d}" stroke="{color}" stroke-width="4" stroke-linecap="round" fill="none"/>')
        out.append(f'<text x="{left}" y="{y0 - 3}">{_e(title)}</text>')
        return "".join(out)

    total = top + 2 * height + gap + 34
    parts = [
        f'<svg id="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total}" width="100%" role="img" '
        'aria-label="range and error along the graph">',
        panel(
            "range",
            top,
            "largest magnitude of each node's tensors (as data_max saw it)",
            [(data_max or 0.0, "#64748b", f"data_max {_fmt(data_max)}"), (limit, "#b91c1c", f"low type max {limit:g}")],
        ),
        panel(
            "error",
            top + height + gap,
            "relative L2 error of each node's output against FP32 (first calibration sample)",
            [(outputs_error or 0.0, "#64748b", f"model output {_fmt(outputs_error)}")],
        ),
        f'<text x="{(left + width) / 2}" y="{total - 6}" text-anchor="middle">node (topological order)</text>',
        f'<circle cx="{left + 10}" cy="{total - 10}" r="4" fill="{_LOW}"/>',
        f'<text x="{left + 18}" y="{total - 6}">low</text>',
        f'<circle cx="{left + 60}" cy="{total - 10}" r="4" fill="{_HIGH}"/>',
        f'<text x="{left + 68}" y="{total - 6}">fp32</text>',
        "</svg>",
    ]
    return "".join(parts)


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
    kpis = [
        (f"{low_nodes} / {total}", f"nodes in {low} ({pct:.1f} %)"),
        (counts.get("casts", 0), "casts inserted"),
        (counts.get("initializers_converted", 0), "weights converted"),
        (_fmt(worst), "worst output rel. L2 vs FP32"),
    ]
    kpi_html = "".join(f'<div class="kpi"><b>{_e(v)}</b><span class="muted">{_e(k)}</span></div>' for v, k in kpis)
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
        f'<div class="kpis">{kpi_html}</div>'
        + (
            "<h2 style='margin-top:14px'>Outputs against FP32</h2>"
            + _table(["output", "max abs", "rel. L2", "cosine", "finite"], output_rows, numeric=(1, 2, 3))
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
            + _table(
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
            + _table(
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
        + _table(["op type", low, "fp32", "total"], op_rows, numeric=(1, 2, 3), attrs='id="by-op" class="sortable"')
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
    head = "".join(
        f'<th class="num">{h}</th>' if i in (0, 5, 6, 7, 8) else f"<th>{h}</th>" for i, h in enumerate(headers)
    )
    sections.append(
        '<section id="all-nodes"><h2>Every node</h2><div class="controls">'
        '<input id="filter" type="search" placeholder="filter: name, op type, reason...">'
        f'<select id="precision"><option value="">all precisions</option><option value="{_e(low)}">{_e(low)}</option>'
        '<option value="fp32">fp32</option></select><span class="muted"><span id="shown"></span> shown</span></div>'
        f'<div class="scroll"><table id="nodes" class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(node_rows)}</tbody></table></div>"
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
            + _table(["pattern (re.match)", "nodes"], rows, numeric=(1,), attrs=f'id="{flag}"')
            + f"<pre>--{flag} {_e(argument)}</pre>"
        )
    sections.append('<section id="suggestions"><h2>Suggested patterns</h2>' + "".join(blocks) + "</section>")
    sections.append(
        '<section id="reproduce"><h2>Reproduce</h2>'
        f'<pre id="command">{_e(report.get("command") or "(converted through the API)")}</pre>'
        f'<p class="muted">onnxprec {_e(report.get("onnxprec_version"))}</p></section>'
    )

    data = json.dumps(report, allow_nan=False).replace("</", "<\\/")
    title = f"AutoCast report: {Path(str(report.get('input') or 'model')).name}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>{_e(title)}</h1><p>{_e(report.get('input'))} → {_e(report.get('output'))} · {_e(low)}</p>"
        f"</header><main>{''.join(sections)}</main>"
        f'<script type="application/json" id="report-data">{data}</script><script>{_JS}</script></body></html>'
    )


def write_html(path: str | Path, report: Mapping[str, Any]) -> Path:
    """Writes the page atomically; returns the path."""
    from onnxprec._io import write_atomically

    return write_atomically(path, render(report))
