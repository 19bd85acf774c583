"""The corpus runner's pieces on synthetic models and results: splits as one file, INT4's applicability, how a
cell is classified, the counts and the RELIABILITY.md section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from benchmarks import corpus, report_corpus


def _model(path: Path, op: str) -> Path:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    node = helper.make_node(op, ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_has_weights_sees_matmul_weights_only(tmp_path: Path) -> None:
    assert corpus.has_weights(_model(tmp_path / "mm.onnx", "MatMul"))
    assert not corpus.has_weights(_model(tmp_path / "add.onnx", "Add"))


def test_merged_npz_concatenates_batches_or_keeps_the_first(tmp_path: Path) -> None:
    split = tmp_path / "calib"
    split.mkdir()
    for i in range(3):
        np.savez(split / f"{i:03d}.npz", x=np.full((2, 4), i, np.float32))
    with np.load(corpus.merged_npz(split, tmp_path / "calib.npz")) as z:
        assert z["x"].shape == (6, 4)
    vad = tmp_path / "vad"
    vad.mkdir()
    for i in range(2):  # a state whose batch is on axis 1 and a scalar: not joinable on axis 0
        np.savez(vad / f"{i:03d}.npz", x=np.zeros((8, 4), np.float32), state=np.zeros((2, 8, 3)), sr=np.array(16000))
    with np.load(corpus.merged_npz(vad, tmp_path / "vad.npz")) as z:
        assert z["x"].shape == (8, 4) and z["sr"].shape == ()


@pytest.mark.parametrize(
    ("rc", "status", "judged", "writes", "log", "expected"),
    [
        (0, "ok", {"passed": True}, True, "", "pass"),
        (0, "ok", {"passed": False}, True, "", "destroyed"),
        (0, "ok", None, True, "", "unloadable"),
        (3, "failed", None, True, "error: the accuracy guard failed", "refused"),
        (1, "failed", None, True, "Traceback (most recent call last):\n  ...", "crashed"),
        (None, "timeout", None, True, "", "timeout"),
        (0, "ok", None, False, "", "ok"),
    ],
)
def test_classify(rc: int | None, status: str, judged: dict | None, writes: bool, log: str, expected: str) -> None:
    assert corpus._classify(rc, status, judged, writes, log) == expected


def _results() -> dict:
    def cell(outcome: str, value: float | None = None, ratio: float | None = None, **kw: object) -> dict:
        c: dict = {"outcome": outcome, "command": "onnxprec quantize int8 ...", "rc": 0, **kw}
        if value is not None:
            c["metric"] = {"metric": "top1", "value": value}
        if ratio is not None:
            c["latency"] = {"ratio": ratio}
        return c

    models = {
        "a": {"kind": "k1", "package": "p==1", "bytes": 2e6, "metric": "top1", "bound": 0.98,
              "cells": {"int8": cell("pass", 1.0, 0.6), "int4": cell("n/a")}},
        "b": {"kind": "k2", "package": "q==2", "bytes": 1e6, "metric": "top1", "bound": 0.98,
              "cells": {"int8": cell("destroyed", 0.5, 1.2), "int4": cell("refused", rc=3, message="error: no")}},
        "c": {"kind": "k2", "package": "q==2", "bytes": 1e6, "metric": "top1", "bound": 0.98,
              "cells": {"int8": cell("crashed", rc=1, message="IndexError: x"), "int4": cell("pass", 0.99)}},
    }  # fmt: skip
    return {"models": models, "tools": ["int8", "int4"], "settings": {"timeout_s": 300},
            "versions": {"project": {}, "anchors": {}}, "command": "python -m benchmarks corpus",
            "date": "2026-11-28T23:00:00"}  # fmt: skip


def test_counts_per_tool() -> None:
    c = report_corpus.counts(_results()["models"], "int8")
    assert (c["ran"], c["pass"], c["destroyed"], c["crashed"], c["faster"], c["timed"]) == (3, 1, 1, 1, 1, 2)
    c = report_corpus.counts(_results()["models"], "int4")
    assert (c["ran"], c["pass"], c["refused"]) == (2, 1, 1)  # n/a is not a run


def test_section_replaces_itself_and_keeps_the_rest() -> None:
    lines = report_corpus.section(_results(), "benchmarks/results/corpus-x.json")
    assert lines[0] == report_corpus.BEGIN and lines[-1] == report_corpus.END
    text = "\n".join(lines)
    assert "| a | k1 | p==1 | 2.0 | top1 ≥ 0.980 | ✓ 1.00, 0.60x | n/a |" in text
    assert "| **destroyed, exit 0** | | | | | 1/3 | 0/2 |" in text
    assert "| **faster than FP32** | | | | | 1/2 | – |" in text  # of the results that were timed
    assert "- b `int4` (exit 3): error: no" in text
    old = "# Title\n\nnode sweep\n"
    once = report_corpus.render(old, lines)
    assert once.endswith(old) and once.startswith(report_corpus.BEGIN)
    assert report_corpus.render(once, lines) == once  # regenerating replaces the section, nothing else


@pytest.mark.slow
def test_merge_takes_later_cells_and_cites_each_run(tmp_path: Path) -> None:
    first, second = _results(), _results()
    second["models"]["b"]["cells"] = {"int8": dict(second["models"]["b"]["cells"]["int8"], outcome="pass")}
    first["tools"], second["tools"] = ["int4", "int8"], ["int8", "fp8"]
    second["models"]["b"]["cells"]["fp8"] = {"outcome": "refused", "rc": 2, "message": "error: no"}
    assert second["models"]["a"]["cells"]["int4"]["outcome"] == "n/a"  # written by every run: not a column it ran
    second["models"]["c"]["cells"]["int4"]["cached"] = True  # reported, not run, by the second run
    second["command"] = "python -m benchmarks corpus --tools int8"
    paths = []
    for i, data in enumerate((first, second)):
        paths.append(tmp_path / f"corpus-{i}.json")
        paths[-1].write_text(json.dumps(data))
    first["models"]["a"]["cells"]["compare"] = {"outcome": "ok", "command": "onnxprec compare ...", "rc": 0}
    second["models"]["a"]["cells"]["compare"] = {"outcome": "skipped", "reason": "no int8 result to read"}
    paths[0].write_text(json.dumps(first))
    paths[1].write_text(json.dumps(second))
    merged = report_corpus.merge(paths)
    assert merged["models"]["a"]["cells"]["compare"]["outcome"] == "ok"  # a later 'skipped' hides nothing
    assert merged["models"]["b"]["cells"]["int8"]["outcome"] == "pass"  # the later run's cell
    assert merged["models"]["b"]["cells"]["int4"]["outcome"] == "refused"  # kept from the first
    assert merged["models"]["b"]["cells"]["int8"]["run"] == 2 and merged["models"]["b"]["cells"]["int4"]["run"] == 1
    assert merged["runs"][1]["contributed"] == ["fp8", "int8"]
    assert merged["tools"] == ["int4", "int8", "fp8"]  # a column only a later run has is in the table
    text = "\n".join(report_corpus.section(merged, "benchmarks/results/corpus-merged.json"))
    assert "Merged from 2 runs" in text and "--tools int8" in text and "columns run here: `fp8`, `int8`" in text
    assert "| `fp8` |" in text  # its column


@pytest.mark.parametrize(("models", "tools", "table", "renders"), [
    (["m"], ["int8:trt"], None, False),  # one model: its results file only, RELIABILITY.md untouched
    ([], ["int8"], None, False),  # one tool on every model: the same
    (["m"], [], True, True),  # --table asks for it
    ([], [], None, True),  # every model and tool: the table
])  # fmt: skip
def test_a_run_of_some_models_or_tools_leaves_the_table_alone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    models: list[str],
    tools: list[str],
    table: bool | None,
    renders: bool,
) -> None:
    rec = {"kind": "image", "package": "p==1", "metric": "top1", "bound": 0.99, "total_bytes": 1}
    monkeypatch.setattr(corpus.zcorpus, "load_manifest", lambda: {"corpus": "c", "models": {"m": rec}})
    monkeypatch.setattr(corpus.zcorpus, "ready", lambda manifest: ["m"])
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(corpus, "run_model", lambda config, name, rec, tools, versions: ran.append(tuple(tools))
                        or {"kind": rec["kind"], "cells": {}})  # fmt: skip
    rendered: list[Path] = []
    monkeypatch.setattr(corpus.report_corpus, "write", rendered.append)
    config = corpus.RunConfig(models=models, tools=tools, results_dir=tmp_path)
    path = corpus.run(config, table=table)
    assert json.loads(path.read_text())["models"]["m"] == {"kind": "image", "cells": {}}
    assert rendered == ([path] if renders else [])
    assert ("-part-" in path.name) == bool(models or tools)
    assert ran[-1] == tuple(tools or corpus.TOOLS)


def test_newest_skips_the_results_of_a_run_of_some(tmp_path: Path) -> None:
    full = tmp_path / "corpus-2026-01-01.json"
    full.write_text("{}")
    (tmp_path / "corpus-2026-01-02-part-m-int8.json").write_text("{}")  # written later
    assert report_corpus.newest(tmp_path) == full
    assert corpus.results_name(["a", "b"], ["int8:trt"]).endswith("-part-2models-int8_trt.json")
    assert corpus.results_name([], ["int8", "fp8"]).endswith("-part-allmodels-2tools.json")
