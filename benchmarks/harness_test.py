"""The benchmark harness end to end on a tiny chain with the onnxprec tool alone (no anchors venv, no ../shared),
plus its pure parts: round-by-round ratios, merging runs, the GPU bundles and the GPU timing script on CPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import zoo
from benchmarks import harness, report, report_autocast, report_common
from benchmarks.proc import run_measured


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    zoo_dir = tmp_path_factory.mktemp("zoo")
    zoo.build_model("chain_24", zoo_dir)
    return zoo_dir


@pytest.mark.slow  # runs the harness: a process per measured command
def test_end_to_end_onnxprec_only(tiny_zoo: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    config = harness.RunConfig(
        models=["chain_24"],
        tools=["onnxprec"],
        repeats=2,
        zoo_dir=tiny_zoo,
        results_dir=results,
        work_dir=tmp_path,
        latency_runs=3,
        command="pytest",
    )
    path = harness.run(config)
    data = json.loads(path.read_text())
    assert data["schema"] == harness.SCHEMA
    assert data["machine"]["cores"]
    assert data["versions"]["project"]["onnxprec"]
    block = data["models"]["chain_24"]
    assert block["fp32"]["structure"]["nodes"] == 24
    entry = block["tools"]["onnxprec"]
    assert entry["status"] == "ok", entry
    assert [r["repeat"] for r in entry["runs"]] == [0, 1]
    for r in entry["runs"]:
        assert r["wall_s"] > 0 and r["peak_rss_mb"] > 10
        assert 0 < r["convert_s"] < r["wall_s"]
        assert r["out_bytes"] > 0
    s = entry["summary"]
    assert s["wall_s"]["n"] == 2 and s["wall_s"]["min"] <= s["wall_s"]["median"] <= s["wall_s"]["max"]
    st = entry["structure"]
    assert st["nodes"] == 24 and st["low_nodes"] == 24 and st["casts"] == 2  # keep_io_types: one cast each side
    assert entry["tool_reported"] == {"low_nodes": 24, "nodes": 24, "casts_inserted": 2}
    acc = entry["accuracy"]
    assert acc["rel_l2"] < 1e-2 and acc["cosine"] > 0.999 and acc["nonfinite"] == 0
    assert entry["latency_cpu"]["median_ms"] > 0 and entry["latency_cpu"]["vs_fp32"] > 0
    assert block["fp32"]["latency_cpu"]["median_ms"] > 0
    assert not list(tmp_path.glob("onnxprec-autocast-*")), "converted models must be cleaned up"

    md = report.write_report(results, tmp_path / "BENCHMARKS.md")
    text = md.read_text() + (tmp_path / "STUDIES.md").read_text()  # chains are a scaling study
    wall = report_common.stat(s["wall_s"])
    assert "| chain_24 | onnxprec |" in text
    assert wall in text
    assert "24/24 (100.0 %)" in text
    assert "python -m benchmarks" in text or "pytest" in text


@pytest.mark.slow  # runs the harness: a process per measured command
def test_failed_and_timed_out_runs_are_recorded(tmp_path: Path) -> None:
    bad = run_measured([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "a.txt", timeout_s=30)
    assert bad.status == "failed" and bad.returncode == 3
    killed = run_measured([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], tmp_path / "k.txt")
    assert killed.status == "failed" and killed.returncode == 128 + 9  # GNU time says "Exit status: 0"
    slow = run_measured([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "b.txt", timeout_s=0.5)
    assert slow.status == "timeout" and slow.wall_s < 10
    polled = run_measured(
        [sys.executable, "-c", "x = bytearray(200 << 20); import time; time.sleep(0.5)"],
        tmp_path / "c.txt",
        use_gnu_time=False,
    )
    assert polled.status == "ok" and polled.peak_rss_mb is not None and polled.peak_rss_mb > 150


def _runs(*walls: float | None) -> list[dict[str, Any]]:
    return [
        {"repeat": i, "status": "ok" if w else "timeout", "wall_s": w or 0.0, "peak_rss_mb": 100.0}
        for i, w in enumerate(walls)
    ]


def test_ratios_are_paired_by_round() -> None:
    r = harness.paired_ratios(_runs(1.0, 2.0, 1.0), _runs(10.0, 10.0, None))
    assert r is not None
    assert r["speedup"]["n"] == 2 and r["speedup"]["min"] == 5.0 and r["speedup"]["max"] == 10.0
    assert harness.paired_ratios(_runs(1.0), _runs(None)) is None


def _run_file(run_id: str, date: str, tools: dict[str, float]) -> dict[str, Any]:
    entries: dict[str, dict[str, Any]] = {}
    for tool, wall in tools.items():
        runs = _runs(wall)
        entries[tool] = {"status": "ok", "runs": runs, "summary": {"wall_s": harness.stats([wall])}, "vs": {}}
    if "onnxprec" in tools and "modelopt" in tools:
        entries["onnxprec"]["vs"]["modelopt"] = harness.paired_ratios(
            entries["onnxprec"]["runs"], entries["modelopt"]["runs"]
        )
    return {"run_id": run_id, "date": date, "models": {"chain_24": {"family": "chain", "tools": entries}}}


def test_merge_keeps_the_newest_and_marks_cross_run_ratios() -> None:
    old = _run_file("a", "2026-01-01T00:00:00", {"onnxprec": 2.0, "modelopt": 20.0})
    new = _run_file("b", "2026-01-02T00:00:00", {"onnxprec": 1.0})
    merged = report_common.merge([old, new])
    entry = merged.models["chain_24"]["tools"]["onnxprec"]
    assert entry["_run"] == "b"
    assert entry["_vs"]["modelopt"]["paired"] is False and entry["_vs"]["modelopt"]["speedup"]["median"] == 20.0
    same = report_common.merge([old])
    assert same.models["chain_24"]["tools"]["onnxprec"]["_vs"]["modelopt"]["paired"] is True
    assert "†" in report_autocast.cost_table(merged, ["chain_24"])


@pytest.mark.slow
def test_benchmarks_md_regenerates_from_the_stored_results() -> None:
    """BENCHMARKS.md and experiments/STUDIES.md are exactly what `python -m benchmarks report` renders."""
    results, studies = report.split(report.record(harness.RESULTS_DIR))
    assert results == report.MD_PATH.read_text()
    assert studies == report.STUDIES_PATH.read_text()
    assert len(results.splitlines()) <= 250
    assert not re.search(r"issue \d", results)


@pytest.mark.slow
def test_split_keeps_every_section_once() -> None:
    """Every section of the record lands in exactly one of the two documents; each kept one names its runs."""
    full = report.record(harness.RESULTS_DIR)
    results, studies = report.split(full)
    headings = [line for line in full.splitlines() if line.startswith(("## ", "### "))]
    kept, moved = results.splitlines(), studies.splitlines()
    for heading in set(headings):
        shown = report._ISSUE.sub("", heading).replace(" — runs ", " — ")
        assert kept.count(shown) + moved.count(heading) >= headings.count(heading), heading
    for line in results.splitlines():
        if line.startswith("- **["):
            assert re.match(r"- \*\*\[\w+\]\*\* 20\d\d-\d\d-\d\d \d\d:\d\d: `python -m benchmarks ", line), line
