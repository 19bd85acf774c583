"""The utilities benchmark: an end-to-end run of the four tools (and ORT's quant_pre_process) on a tiny external-data
stack, and the report rendered from results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo

from . import report, report_utilities, utilities
from .harness import RunConfig

TINY = "matmul_0.002gb"


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    zoo_dir = tmp_path_factory.mktemp("zoo")
    zoo.build_model(TINY, zoo_dir)
    return zoo_dir


@pytest.mark.slow  # runs the harness: a process per measured command
def test_end_to_end_on_a_tiny_external_data_stack(tiny_zoo: Path, tmp_path: Path) -> None:
    config = RunConfig(
        models=[TINY],
        results_dir=tmp_path / "results",
        work_dir=tmp_path,
        zoo_dir=tiny_zoo,
        timeout_s=300,
        command="pytest",
        repeats=1,  # one process per tool: every assertion is about a run, none about the rounds' median
    )
    path = utilities.run(config)
    assert path.name.startswith("utilities-")
    data = json.loads(path.read_text())
    assert data["kind"] == "utilities"  # never "autocast": report_common.load_results must skip it
    entry = data["models"][TINY]
    assert entry["external_data"] and entry["file_bytes"] > 2_000_000
    assert entry["candidate"]["status"] == "ok" and entry["candidate"]["output_bytes"] > 0
    assert set(entry["tools"]) == set(utilities.TOOL_IDS)
    for tool, rec in entry["tools"].items():
        assert rec["status"] == "ok", (tool, rec.get("error"), rec.get("log_tail"))
        assert rec["peak_rss_mb"] > 0 and rec["wall_s"] > 0, tool
    tools = entry["tools"]
    assert tools["preprocess"]["output_bytes"] > 2_000_000
    assert tools["dump"]["tensors"] > 0
    assert tools["compare"]["counts"]["unmatched"] == 0 and tools["compare"]["first_divergence"] is None
    assert [m["reference"] for m in tools["evaluate"]["evaluated"]] == [True, False]
    # the work folder (candidate, outputs, data) is removed
    assert not list(tmp_path.glob("onnxprec-utilities-*"))
    text = "\n".join(report_utilities.sections(config.results_dir))
    assert "## Utilities (preprocess, evaluate, dump, compare)" in text
    assert "| onnxprec `dump` |" in text and "| ORT `quant_pre_process` |" in text


def _rec(status: str, wall: float, rss: float | None, **extra: object) -> dict[str, object]:
    return {"status": status, "wall_s": wall, "peak_rss_mb": rss, "command": "onnxprec x", **extra}


def _result() -> dict[str, object]:
    tools = {
        "preprocess": _rec("ok", 10.0, 800.0, output_bytes=650 << 20),
        "ort:quant_pre_process": _rec("ok", 20.0, 2000.0, output_bytes=650 << 20),
        "evaluate": _rec(
            "ok",
            12.0,
            1500.0,
            evaluated=[
                {"name": "m", "reference": True, "perplexity": 19.0},
                {"name": "c", "reference": False, "perplexity": 19.01, "agreement": {"logits": {"top1": 0.99}}},
            ],
        ),
        "dump": _rec("ok", 30.0, 1234.0, tensors=2000, output_bytes=3 << 30, rounds=[{"load_before": 6.5}]),
        "compare": _rec(
            "ok",
            25.0,
            1111.0,
            counts={"tensors": 2000, "compared": 1990, "diverged": 1},
            first_divergence={"node": "/model/norm/Pow"},
            outputs={"logits": {"rel_l2": 0.001}},
        ),
    }
    big = {
        "preprocess": _rec("ok", 60.0, 700.0),
        "ort:quant_pre_process": _rec("failed", 5.0, None, error="ValueError: Message onnx.ModelProto | too large"),
        "dump": _rec("timeout", 1800.0, None),
    }
    return {
        "kind": "utilities",
        "date": "2026-11-26T12:00:00",
        "command": "python -m benchmarks utilities",
        "machine": {"cpu": "test", "cores": 2, "ram_gib": 23},
        "versions": {"project": {"onnxprec_git": "abc"}, "anchors": {}},
        "onnxruntime": "1.32.0",
        "models": {
            "smollm2_135m": {
                "file_bytes": 652 << 20,
                "external_data": False,
                "data": {"input_ids": [1, 256]},
                "candidate": _rec("ok", 40.0, 900.0, output_bytes=330 << 20),
                "tools": tools,
            },
            "matmul_4gb": {"file_bytes": 4 << 30, "external_data": True, "data": {"X": [1, 4096]}, "tools": big},
        },
    }


def test_report_renders_tables_the_sentence_and_the_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "utilities-2026-11-26-x.json").write_text(json.dumps(_result()))
    lines = report_utilities.sections(tmp_path)
    text = "\n".join(lines)
    assert lines[0] == "## Utilities (preprocess, evaluate, dump, compare)"
    # the sentence: SmolLM2 peak RSS of dump and compare
    assert (
        "`onnxprec dump` peaks at **1234 MiB** [U1] (every float node output, `--dump_float`: 2000 tensors, 3.00 GiB"
        in text
        and "`onnxprec compare` peaks at **1111 MiB**" in text
    )
    assert "### SmolLM2-135M: 652.0 MiB (weights inside the protobuf)" in text
    assert "### 4 GiB MatMul stack (`matmul_4gb`): 4.00 GiB (weights in external data)" in text
    assert "2000 tensors, 3.00 GiB" in text  # dump
    assert "1 diverged (first `/model/norm/Pow`)" in text  # compare
    assert "FP32 ppl 19.000, FP16 ppl 19.010" in text and "top-1 agreement 99.0 %" in text  # evaluate
    assert "**failed**: ValueError: Message onnx.ModelProto \\| too large" in text  # table-safe failure
    assert "**timeout**" in text
    assert "**the machine was busy** (1-min load average up to 6.5)" in text  # 2 cores, another job running
    side = next(ln for ln in text.splitlines() if ln.startswith("| SmolLM2-135M | 652.0 MiB |"))
    assert "**2.00×**" in side and "**2.50×**" in side  # ORT / onnxprec: time 20/10, RSS 2000/800
    # the whole document gets the section after the INT4 part; the AutoCast loader ignores the file
    doc = report.render(report.merge([]), [], ["## INT4"], lines)
    assert doc.index("## INT4") < doc.index("## Utilities (preprocess, evaluate, dump, compare)")
    from .report_common import load_results

    assert load_results(tmp_path) == []


@pytest.mark.slow
def test_report_is_empty_without_utilities_results(tmp_path: Path) -> None:
    assert report_utilities.sections(tmp_path) == []
    (tmp_path / "int4-2026-11-26.json").write_text(json.dumps({"kind": "int4", "models": {}}))
    assert report_utilities.sections(tmp_path) == []
