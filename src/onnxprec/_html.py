"""The HTML kit of the tools' report pages: one self-contained page (inline CSS, JS and SVG; nothing fetched).

Every report page (AutoCast's and compare's ``--report_html``, the next tools') is :func:`page` around
:func:`section` blocks: :func:`table` (sortable by a click on a header, numbers right-aligned, the exact value in
``data-v``), :func:`filters` (a search box, a select on a row attribute, a checkbox on a row class, a shown-rows
count), :class:`LogAxes` for plots of values spanning decades, and one number format, :func:`fmt`. The tables are
plain HTML (readable without JavaScript); the one script only sorts and filters them. Only the standard library is
imported.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["LOW_COLOR", "LogAxes", "e", "filters", "fmt", "num_cell", "page", "section", "svg", "table"]

LOW_COLOR = "#2563eb"  # low precision, a measurement within bounds
HIGH_COLOR = "#ea580c"  # FP32, kept high
BAD_COLOR = "#b91c1c"  # a miss, a divergence, a limit
MUTED_COLOR = "#64748b"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1f2937;
background:#f8fafc}
header{background:#0f172a;color:#f8fafc;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header p{margin:0;color:#cbd5e1}main{padding:18px 28px;max-width:1400px}
section{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:14px 18px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 10px}table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f5f9;position:sticky;top:0;cursor:pointer;user-select:none}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.div td{background:#fef2f2}tr.first td{background:#fee2e2;font-weight:bold}tr.un td{color:#94a3b8}
.kpis{display:flex;flex-wrap:wrap;gap:12px}
.kpi{border:1px solid #e2e8f0;border-radius:6px;padding:8px 12px;min-width:130px}
.kpi b{display:block;font-size:20px}.low{color:#1d4ed8}.fp32{color:#c2410c}.ok{color:#15803d}.miss{color:#b91c1c}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
pre{background:#f1f5f9;padding:8px 10px;border-radius:6px;white-space:pre-wrap;word-break:break-all}
.controls{display:flex;gap:10px;align-items:center;margin:0 0 8px}
.controls input[type=search]{padding:4px 8px;width:320px}
.scroll{max-height:560px;overflow:auto;border:1px solid #e2e8f0}.muted{color:#64748b}
svg text{font:11px system-ui,sans-serif;fill:#334155}
"""

JS = """
(function(){
  function key(cell){var v=cell.getAttribute('data-v');return v===null?cell.textContent:v;}
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(table){
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,col){
      th.addEventListener('click',function(){
        var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
        var asc=th.getAttribute('data-sort')!=='asc'; th.setAttribute('data-sort',asc?'asc':'desc');
        rows.sort(function(a,b){
          var x=key(a.cells[col]), y=key(b.cells[col]), fx=parseFloat(x), fy=parseFloat(y);
          if(x===''){fx=-Infinity;} if(y===''){fy=-Infinity;}
          var c=(!isNaN(fx)&&!isNaN(fy))?(fx<fy?-1:fx>fy?1:0):x.localeCompare(y);
          return asc?c:-c;
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
  var groups={};
  Array.prototype.forEach.call(document.querySelectorAll('[data-filter]'),function(el){
    var id=el.getAttribute('data-filter'); (groups[id]=groups[id]||[]).push(el);
  });
  Object.keys(groups).forEach(function(id){
    var table=document.getElementById(id), controls=groups[id];
    var count=document.querySelector('[data-count="'+id+'"]');
    function passes(el,row){
      if(el.type==='checkbox'){return !el.checked||row.classList.contains(el.getAttribute('data-class'));}
      if(el.tagName==='SELECT'){return !el.value||row.getAttribute(el.getAttribute('data-attr'))===el.value;}
      var q=el.value.toLowerCase(); return !q||row.textContent.toLowerCase().indexOf(q)>=0;
    }
    function apply(){
      var rows=table.tBodies[0].rows, n=0;
      for(var i=0;i<rows.length;i++){
        var show=controls.every(function(el){return passes(el,rows[i]);});
        rows[i].style.display=show?'':'none'; if(show){n++;}
      }
      if(count){count.textContent=n;}
    }
    controls.forEach(function(el){
      el.addEventListener(el.type==='checkbox'||el.tagName==='SELECT'?'change':'input',apply);
    });
    apply();
  });
})();
"""


def e(value: Any) -> str:
    """HTML-escaped text; None is empty."""
    return html.escape("" if value is None else str(value))


def fmt(value: float | None, digits: int = 3) -> str:
    """The one number format of the reports: ``digits`` significant digits; ``-`` for None; inf and nan as such."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def num_cell(value: float | None, digits: int = 3, *, css: str = "") -> str:
    """A numeric ``<td>``: the formatted value, the exact one in ``data-v`` (what sorting uses; empty for None)."""
    exact = "" if value is None else repr(float(value)) if isinstance(value, float) else str(value)
    cls = f"num {css}".strip()
    return f'<td class="{cls}" data-v="{e(exact)}">{e(fmt(value, digits))}</td>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str] | str],
    *,
    numeric: Iterable[int] = (),
    attrs: str = "",
    sortable: bool = True,
) -> str:
    """A table: ``headers`` (text), and per row either a complete ``<tr>`` or its cells.

    A cell is HTML: one that starts with ``<td`` is used as it is (e.g. :func:`num_cell`), any other is wrapped in a
    ``<td>``, right-aligned in the ``numeric`` columns. ``sortable`` tables sort on a click on a header.
    """
    nums = set(numeric)
    head = "".join(f'<th class="num">{e(h)}</th>' if i in nums else f"<th>{e(h)}</th>" for i, h in enumerate(headers))
    body = []
    for row in rows:
        if isinstance(row, str):
            body.append(row)
            continue
        cells = []
        for i, cell in enumerate(row):
            if cell.startswith("<td"):
                cells.append(cell)
            else:
                cells.append(f'<td class="num">{cell}</td>' if i in nums else f"<td>{cell}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    classes = ' class="sortable"' if sortable and "class=" not in attrs else ""
    return f"<table {attrs}{classes}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def filters(
    table_id: str,
    *,
    search: str = "filter",
    search_id: str | None = None,
    select: tuple[str, str, Sequence[tuple[str, str]]] | None = None,
    checkbox: tuple[str, str] | None = None,
    count_id: str | None = None,
) -> str:
    """The controls that filter a table's rows: a search box, optionally a select and a checkbox, a shown count.

    Args:
        table_id: The table's ``id``.
        search: The search box's placeholder.
        search_id: The search box's ``id`` (for tests and links).
        select: ``(id, row attribute, [(value, label), ...])``: rows whose attribute equals the chosen value
            (the first option should have the value ``""``: all rows).
        checkbox: ``(row class, label)``: only rows with that class when checked.
        count_id: The ``id`` of the element showing how many rows are shown (None: no count).
    """
    parts = [
        f'<input type="search" data-filter="{e(table_id)}" placeholder="{e(search)}"'
        + (f' id="{e(search_id)}"' if search_id else "")
        + ">"
    ]
    if select is not None:
        select_id, attr, options = select
        opts = "".join(f'<option value="{e(v)}">{e(label)}</option>' for v, label in options)
        parts.append(f'<select id="{e(select_id)}" data-filter="{e(table_id)}" data-attr="{e(attr)}">{opts}</select>')
    if checkbox is not None:
        css, label = checkbox
        parts.append(
            f'<label><input type="checkbox" data-filter="{e(table_id)}" data-class="{e(css)}"> {e(label)}</label>'
        )
    if count_id is not None:
        parts.append(f'<span class="muted"><span id="{e(count_id)}" data-count="{e(table_id)}"></span> shown</span>')
    return f'<div class="controls">{"".join(parts)}</div>'


def section(section_id: str, title: str, body: str) -> str:
    """A titled block of the page (``title`` is HTML)."""
    return f'<section id="{e(section_id)}"><h2>{title}</h2>{body}</section>'


def kpis(items: Iterable[tuple[Any, str]]) -> str:
    """Key numbers in boxes: ``(value, what it is)``."""
    boxes = "".join(f'<div class="kpi"><b>{e(v)}</b><span class="muted">{e(k)}</span></div>' for v, k in items)
    return f'<div class="kpis">{boxes}</div>'


def page(title: str, subtitle: str, sections: Iterable[str], data: Mapping[str, Any] | None = None) -> str:
    """The whole document: header, sections, the report's JSON (``#report-data``, when given) and the script."""
    embedded = ""
    if data is not None:
        payload = json.dumps(data, allow_nan=False).replace("</", "<\\/")
        embedded = f'<script type="application/json" id="report-data">{payload}</script>'
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{e(title)}</h1><p>{e(subtitle)}</p></header><main>{''.join(sections)}</main>"
        f"{embedded}<script>{JS}</script></body></html>\n"
    )


def svg(width: float, height: float, parts: Iterable[str], *, svg_id: str | None = None, label: str = "") -> str:
    """An inline SVG that scales to the page's width."""
    ident = f' id="{e(svg_id)}"' if svg_id else ""
    return (
        f'<svg{ident} xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="{e(label)}">{"".join(parts)}</svg>'
    )


class LogAxes:
    """A plot panel with a log-scale y axis over whole decades and a linear x axis.

    Args:
        x_range: The x values at the left and right edges.
        decades: The lowest and highest power of ten on the y axis; values outside are drawn at the edge.
        box: ``(left, top, width, height)`` of the panel in the SVG.
    """

    def __init__(self, x_range: tuple[float, float], decades: tuple[int, int], box: tuple[float, float, float, float]):
        self.x0, self.x1 = x_range
        self.lo, self.hi = decades[0], max(decades[1], decades[0] + 1)
        self.left, self.top, self.width, self.height = box

    @staticmethod
    def decades_of(values: Iterable[float]) -> tuple[int, int] | None:
        """The decades that hold the positive finite values (None when there is none)."""
        shown = [v for v in values if v > 0 and math.isfinite(v)]
        if not shown:
            return None
        return math.floor(math.log10(min(shown))), math.ceil(math.log10(max(shown)))

    def x(self, value: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return self.left + self.width * (value - self.x0) / span

    def y(self, value: float) -> float:
        """The y of a value; 0 and below at the bottom, inf and nan at the top."""
        v = math.log10(value) if value > 0 else self.lo
        v = self.hi if not math.isfinite(v) else min(max(v, self.lo), self.hi)
        return self.top + self.height * (self.hi - v) / (self.hi - self.lo)

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def frame(self, title: str = "", *, every: int = 1, background: bool = True) -> str:
        """The panel's background, a grid line and label per ``every`` decades, and its title above it."""
        out = []
        if background:
            out.append(
                f'<rect x="{self.left}" y="{self.top}" width="{self.width}" height="{self.height}" fill="#fff" '
                'stroke="#cbd5e1"/>'
            )
        for tick in range(self.lo, self.hi + 1, every):
            ty = self.y(10.0**tick)
            out.append(f'<line x1="{self.left}" x2="{self.right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eef2f7"/>')
            out.append(f'<text x="{self.left - 6}" y="{ty + 4:.1f}" text-anchor="end">1e{tick}</text>')
        if title:
            out.append(f'<text x="{self.left}" y="{self.top - 3}">{e(title)}</text>')
        return "".join(out)

    def hline(self, value: float | None, color: str, label: str = "") -> str:
        """A dashed line at ``value`` (nothing for None, 0 or non-finite), labelled at its right end."""
        if not value or value <= 0 or not math.isfinite(value):
            return ""
        ly = self.y(value)
        text = (
            f'<text x="{self.right - 4}" y="{ly - 4:.1f}" text-anchor="end" style="fill:{color}">{e(label)}</text>'
            if label
            else ""
        )
        return (
            f'<line x1="{self.left}" x2="{self.right}" y1="{ly:.1f}" y2="{ly:.1f}" stroke="{color}" '
            f'stroke-dasharray="5 4"><title>{e(label)}</title></line>{text}'
        )

    def vline(self, x_value: float, color: str, title: str) -> str:
        """A solid vertical line across the panel at ``x_value`` with a hover title."""
        x = self.x(x_value)
        return (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top}" y2="{self.bottom}" stroke="{color}">'
            f"<title>{e(title)}</title></line>"
        )
