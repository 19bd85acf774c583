"""The HTML kit: number format, tables, filters, the page and the log-scale axes."""

from __future__ import annotations

import math
from html.parser import HTMLParser

from onnxprec._html import LogAxes, filters, fmt, num_cell, page, section, table


def test_number_format() -> None:
    assert [fmt(None), fmt(0.0), fmt(1234.5678), fmt(1234.5678, 6), fmt(math.inf), fmt(math.nan)] == [
        "-", "0", "1.23e+03", "1234.57", "inf", "nan",
    ]  # fmt: skip


def test_table_wraps_cells_and_keeps_given_ones() -> None:
    html = table(["a", "b"], [["<code>x</code>", num_cell(0.5)], '<tr class="div"><td>y</td><td>1</td></tr>'],
                 numeric=(1,), attrs='id="t"')  # fmt: skip
    assert html.startswith('<table id="t" class="sortable"><thead><tr><th>a</th><th class="num">b</th></tr>')
    assert '<td><code>x</code></td><td class="num" data-v="0.5">0.5</td>' in html
    assert '<tr class="div"><td>y</td><td>1</td></tr>' in html
    assert 'data-v=""' in num_cell(None) and ">-<" in num_cell(None)


def test_page_is_well_formed_and_self_contained() -> None:
    body = section("s", "Title", filters("t", checkbox=("div", "only"), count_id="n") + table(["a"], [["1"]]))
    html = page("T <x>", "sub", [body], {"k": "</script>"})
    assert html.startswith("<!DOCTYPE html>") and "<title>T &lt;x&gt;</title>" in html
    assert '{"k": "<\\/script>"}' in html  # the embedded JSON cannot close its script element
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    opened: list[str] = []

    class Check(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list) -> None:  # type: ignore[type-arg]
            if tag not in ("meta", "input"):
                opened.append(tag)

        def handle_endtag(self, tag: str) -> None:
            assert opened.pop() == tag

    Check().feed(html)
    assert opened == []


def test_log_axes_map_decades_linearly_and_clamp() -> None:
    axes = LogAxes((0, 10), (-2, 2), (50, 10, 400, 200))
    assert (axes.x(0), axes.x(10), axes.x(5)) == (50, 450, 250)
    assert (axes.y(100.0), axes.y(0.01), axes.y(1.0)) == (10, 210, 110)
    assert axes.y(0.0) == axes.y(1e-9) == 210 and axes.y(math.inf) == axes.y(1e9) == 10
    assert LogAxes.decades_of([0.0, 3e-3, 40.0, math.nan]) == (-3, 2) and LogAxes.decades_of([0.0]) is None
    assert axes.hline(None, "red") == "" and "stroke-dasharray" in axes.hline(1.0, "red", "one")
