"""The ``--report`` HTML page in a real headless browser, on the real models of the benchmark zoo.

Needs Debian's ``chromium`` (``apt-get install chromium``), Playwright (``pip install 'onnxprec[browser]'``, with
``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1``: the system browser is driven through ``executable_path``) and the zoo
models (``python -m zoo build``). Slow: ``-m slow``. Screenshots of each page and of its plot are
written to ``$ONNXPREC_REPORT_SHOTS`` (default: the test's temporary folder).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxprec.autocast import convert_file

ZOO = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo"))
CHROMIUM = os.environ.get("ONNXPREC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install chromium"),
    pytest.mark.skipif(
        sync_playwright is None,
        reason="Playwright is not installed: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 pip install 'onnxprec[browser]'",
    ),
]

# model -> (calibration rows, extra options): SmolLM2's real text cut to 2 of its 16 sequences to stay quick
CASES: dict[str, tuple[int | None, dict[str, Any]]] = {
    "efficientnet_lite0": (None, {}),
    "minilm_l6_v2": (None, {"target_accuracy": "rel_l2<=1e-3"}),
    "smollm2_135m": (2, {}),
}


def _inputs(model: str, rows: int | None) -> dict[str, np.ndarray]:
    with np.load(ZOO / f"{model}.inputs.npz") as data:
        return {k: (data[k][:rows] if rows else data[k]) for k in data.files}


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ONNXPREC_REPORT_SHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _cells(page: Any, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f"{selector} tbody tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent.trim()))"
    )


@pytest.mark.parametrize("model", sorted(CASES))
def test_report_loads_without_errors_and_matches_the_json(model: str, tmp_path: Path) -> None:
    if not (ZOO / f"{model}.onnx").exists():
        pytest.skip(f"{model} is not in the zoo cache: python -m zoo build {model}")
    rows, extra = CASES[model]
    html_path = tmp_path / f"{model}.html"
    report = convert_file(
        ZOO / f"{model}.onnx",
        tmp_path / f"{model}.fp16.onnx",
        keep_io_types=True,
        calibration_data=_inputs(model, rows),
        report=str(html_path),
        **extra,
    )
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    shots = _shots(tmp_path)
    assert sync_playwright is not None and CHROMIUM is not None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: problems.append(f"request: {r.url}") if not r.url.startswith("file:") else None)
        page.goto(html_path.as_uri())
        page.wait_for_load_state("load")
        assert problems == []
        page.screenshot(path=str(shots / f"{model}_page.png"))

        # the embedded JSON is the report
        embedded = json.loads(page.locator("#report-data").text_content() or "")
        assert embedded["counts"] == data["counts"] and len(embedded["nodes"]) == len(data["nodes"])

        # every node, in order, as the JSON has it
        nodes = _cells(page, "#nodes")
        assert len(nodes) == len(data["nodes"]) == int(page.locator("#shown").text_content() or 0)
        for row, node in zip(nodes, data["nodes"]):
            assert row[1:5] == [node["name"], node["op_type"], node["precision"], node["reason"]]
            assert int(row[7]) == node["casts"]
        assert sum(int(r[7]) > 0 for r in nodes) > 0 or data["counts"]["casts"] == 0
        measured = [n for n in data["nodes"] if n["error"] is not None]
        assert measured, data["errors_note"]

        # counts by op type
        by_op = {r[0]: (int(r[1]), int(r[2])) for r in _cells(page, "#by-op")}
        assert by_op == {op: (c["fp16"], c["fp32"]) for op, c in data["by_op_type"].items()}
        assert sum(a + b for a, b in by_op.values()) == data["counts"]["nodes"]

        # the target search, when there is one
        if data["target"] is not None:
            steps = _cells(page, "#steps")
            assert [r[1] for r in steps] == [s["what"] for s in data["target"]["steps"]]
            page.locator("#target").screenshot(path=str(shots / f"{model}_target.png"))

        # filtering works
        page.fill("#filter", data["nodes"][0]["name"])
        assert int(page.locator("#shown").text_content() or 0) >= 1
        page.fill("#filter", "")

        # the command reproduces the run
        command = page.locator("#command").text_content() or ""
        assert command.startswith("python -m onnxprec.autocast --onnx_path") and "--keep_io_types" in command

        # the plot: points for every measured node, and a screenshot that shows them
        assert page.locator("#plot path").count() >= 2
        plot_png = shots / f"{model}_plot.png"
        page.locator("#along").screenshot(path=str(plot_png))
        assert _blue_pixels(page, plot_png) > 200  # the low-precision markers are on the screenshot
        browser.close()


_COUNT_BLUE = """async (src) => {
  const img = new Image(); img.src = src; await img.decode();
  const canvas = document.createElement('canvas'); canvas.width = img.width; canvas.height = img.height;
  const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, canvas.width, canvas.height).data; let n = 0;
  for (let i = 0; i < d.length; i += 4) { if (d[i + 2] > 200 && d[i] < 90 && d[i + 1] < 150) n++; }
  return n;
}"""


def _blue_pixels(page: Any, png: Path) -> int:
    """Counts the plot's blue (low precision) pixels on the screenshot, decoded by the browser itself."""
    source = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    return int(page.evaluate(_COUNT_BLUE, source))
