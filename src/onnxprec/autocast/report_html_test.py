"""The ``--report`` HTML page and the details behind it, on tiny models (in a browser: tests/report_browser_test)."""

from __future__ import annotations

import json
import shlex
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._testing import F, make_model, tensor_info
from onnxprec.autocast import convert_file
from onnxprec.autocast.report import command_line, patterns
from onnxprec.autocast.report_html import render
from onnxprec.cli import main
from onnxprec.errors import InvalidArgumentError


def _model(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """x*S -> +B -> Relu -> Softmax, S large enough that data_max keeps the first three in FP32."""
    nodes = [
        helper.make_node("Mul", ["X", "S"], ["m"], name="block.0/scale"),
        helper.make_node("Add", ["m", "B"], ["a"], name="block.0/bias"),
        helper.make_node("Relu", ["a"], ["r"], name="block.1/act"),
        helper.make_node("Softmax", ["r"], ["Y"], axis=-1, name="block.1/softmax"),
    ]
    inits = {"S": np.full(8, 300.0, np.float32), "B": np.ones(8, np.float32)}
    path = tmp_path / "tiny.onnx"
    onnx.save(make_model(nodes, [tensor_info("X", F, ["n", 8])], [tensor_info("Y", F, ["n", 8])], inits), path)
    return path, {"X": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}


class _Page(HTMLParser):
    """Collects the ids, the rows of each table, and any attribute that would load something."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.rows: dict[str, list[list[str]]] = {}
        self.loads: list[str] = []
        self._table: list[str] = []
        self._cell: list[str] | None = None
        self._body = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        self.loads += [str(a[k]) for k in ("src", "href") if a.get(k)]
        if tag == "table":
            self._table.append(str(a.get("id") or ""))
            self.rows.setdefault(self._table[-1], [])
        elif tag == "tbody":
            self._body = True
        elif tag == "tr" and self._body and self._table:
            self.rows[self._table[-1]].append([])
        elif tag == "td" and self._body and self._table:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._table:
            self._table.pop()
        elif tag == "tbody":
            self._body = False
        elif tag == "td" and self._cell is not None:
            self.rows[self._table[-1]][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_report_is_one_self_contained_page_whose_tables_are_the_json(tmp_path: Path) -> None:
    path, feeds = _model(tmp_path)
    html_path = tmp_path / "report.html"
    out = tmp_path / "out.onnx"
    report = convert_file(path, out, keep_io_types=True, calibration_data=feeds, report=str(html_path))
    data = report.to_json()
    page = _Page()
    text = html_path.read_text()
    page.feed(text)
    assert {"summary", "along", "ops", "nodes", "suggestions", "command", "plot", "report-data"} <= page.ids
    assert page.loads == []  # nothing to fetch: CSS, JS and SVG are inline
    nodes = page.rows["nodes"]
    assert [r[1:5] for r in nodes] == [[n["name"], n["op_type"], n["precision"], n["reason"]] for n in data["nodes"]]
    assert [int(r[7]) for r in nodes] == [n["casts"] for n in data["nodes"]]
    # the FP32 nodes: data_max decided, ranges shown against it, and casts around them
    high = {n["name"]: n for n in data["nodes"] if n["precision"] == "fp32"}
    assert set(high) == {"block.0/scale", "block.0/bias", "block.1/act"}
    assert all("data_max" in n["reason"] and n["range"] > 512 for n in high.values())
    assert sum(n["casts"] for n in data["nodes"]) >= report.stats.casts
    assert all(n["error"] is not None for n in data["nodes"])  # every node's output measured against FP32
    # include suggestions: the FP32 nodes fit FP16 with room to spare, one pattern for the block
    suggested = data["suggestions"]["nodes_to_include"]["patterns"]
    assert {p["pattern"] for p in suggested} == {r"block\.0/scale$", r"block\.0/bias$", r"block\.1/act$"}
    # the embedded JSON is the report, and the page renders from it alone
    start = text.index('id="report-data">') + len('id="report-data">')
    embedded = json.loads(text[start : text.index("</script>", start)].replace("<\\/", "</"))
    assert embedded == json.loads(json.dumps(data))
    assert render(embedded) == text


def test_the_command_reproduces_the_run(tmp_path: Path) -> None:
    path, feeds = _model(tmp_path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    first = tmp_path / "first.html"
    args = [
        "autocast",
        "--onnx_path",
        str(path),
        "--output_path",
        str(tmp_path / "a.onnx"),
        "--keep_io_types",
        "-d",
        str(tmp_path / "feeds.npz"),
        "--data_max",
        "256",
        "-ne",
        "block.1/.*",
        "--report_html",
        str(first),
    ]
    assert main(args) == 0
    page = _Page()
    page.feed(first.read_text())
    command = json.loads(first.read_text().split('id="report-data">')[1].split("</script>")[0])["command"]
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "onnxprec.autocast"]
    assert "--data_max" in words and "256" in words and "--nodes_to_exclude" in words and "--report_html" in words
    words[words.index("--report_html") + 1] = str(tmp_path / "second.html")
    assert main(["autocast", *words[3:]]) == 0
    second = json.loads((tmp_path / "second.html").read_text().split('id="report-data">')[1].split("</script>")[0])
    first_json = json.loads(first.read_text().split('id="report-data">')[1].split("</script>")[0])
    assert [(n["name"], n["precision"]) for n in second["nodes"]] == [
        (n["name"], n["precision"]) for n in first_json["nodes"]
    ]


@pytest.mark.parametrize("where", ["missing/report.html", "tiny.onnx"])
def test_a_report_path_that_cannot_be_written_fails_before_the_work(tmp_path: Path, where: str) -> None:
    path, feeds = _model(tmp_path)
    with pytest.raises(InvalidArgumentError, match="--report"):
        convert_file(path, tmp_path / "out.onnx", calibration_data=feeds, report=str(tmp_path / where))
    assert not (tmp_path / "out.onnx").exists()


def test_patterns_generalize_numbers_only_when_nothing_else_matches() -> None:
    names = ["/m/layers.0/ln/Pow", "/m/layers.1/ln/Pow"]
    assert patterns(names, [*names, "/m/layers.0/x"]) == [{"pattern": r"/m/layers\.\d+/ln/Pow$", "nodes": 2}]
    exact = patterns(names[:1], [*names, "/m/layers.0/x"])
    assert exact == [{"pattern": r"/m/layers\.0/ln/Pow$", "nodes": 1}]


def test_command_line_lists_what_differs_from_the_defaults() -> None:
    from onnxprec.autocast import AutoCastOptions

    options = AutoCastOptions(low_precision_type="bf16", keep_io_types=True, op_types_to_exclude=["Softmax"])
    command = command_line(options, "m.onnx", "o.onnx")
    assert command == (
        "python -m onnxprec.autocast --onnx_path m.onnx --output_path o.onnx --low_precision_type bf16 "
        "--op_types_to_exclude Softmax --keep_io_types"
    )
    assert "in memory" in command_line(AutoCastOptions(calibration_data={"x": np.ones(2)}), "m.onnx", None)
