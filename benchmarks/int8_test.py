"""The INT8 part's pure logic on synthetic input: agreement, per-round latency ratios, the finished table."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import int8
from benchmarks.report_common import table


def test_agreement_of_logits() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((5, 10)).astype(np.float32)
    got = ref.copy()
    got[2] += 0.5  # one sample off: its error is the worst, and its top-1 may flip
    got[4, ref[4].argmin()] = ref[4].max() + 1  # a sure top-1 flip
    a = int8.agreement(ref, got)
    d = (got - ref).astype(np.float64)
    assert a["rel_l2"] == pytest.approx(np.linalg.norm(d) / np.linalg.norm(ref))
    per_sample = np.linalg.norm(d, axis=1) / np.linalg.norm(ref, axis=1)
    assert a["worst_rel_l2"] == pytest.approx(per_sample.max())
    assert a["top1"] == int((ref.argmax(1) == got.argmax(1)).sum()) <= 4
    assert a["n"] == 5
    flat = np.dot(ref.ravel(), got.ravel()) / (np.linalg.norm(ref) * np.linalg.norm(got))
    assert a["cosine"] == pytest.approx(flat, rel=1e-6)


def test_agreement_of_hidden_states_has_no_top1() -> None:
    ref = np.ones((2, 3, 4), np.float32)
    a = int8.agreement(ref, ref * 1.01)
    assert "top1" not in a
    assert a["rel_l2"] == pytest.approx(0.01, rel=1e-4)
    assert a["worst_rel_l2"] == pytest.approx(0.01, rel=1e-4)
    assert a["cosine"] == pytest.approx(1.0)


def test_table_rows_and_failures() -> None:
    ok = {
        "status": "ok",
        "command": "python -m onnxprec.quantization ...",
        "wall_s": 4.44,
        "convert_s": None,
        "peak_rss_mb": 145.2,
        "accuracy": {"rows 4-7": {"rel_l2": 0.042, "cosine": 0.999118, "worst_rel_l2": 0.0431, "n": 4}},
        "kernels": [36, 275, 0.74, 6],
    }
    crashed = {
        "status": "failed",
        "command": "quantize_static(...)",
        "error": "Traceback (most recent call last):\nValueError: Too many bins for data range.",
        "wall_s": 3.1,
        "peak_rss_mb": 432.0,
    }
    unloadable = {**ok, "accuracy": "InvalidGraph: bad node", "kernels": None}
    block = {
        "sets": {"rows 4-7": 4},
        "tools": {"onnxprec": ok, "ort:entropy": crashed, "modelopt": unloadable},
        "latency": {"batch 1": {"rows": 1, "fp32": 10.2, "onnxprec": 0.49}, "usual": {"rows": 4, "fp32": 30.0}},
    }
    t = int8.table("minilm_l6_v2", block)
    assert t["heading"] == "MiniLM-L6-v2 (FP32 `?…`, batch 1: 10.2 ms)"
    assert len(t["columns"]) == 6 and "batch 1 / 4" in t["columns"][2]
    rows = {r[0]: r for r in t["rows"]}
    assert rows["`onnxprec`"][1:] == ["0.99912 / 0.042 (0.043)", "0.49x / –", "36/275 (74%), 6", "4.4 s", "145 MiB"]
    assert rows["`ort:entropy`"][1] == "**failed**: ValueError: Too many bins for data range."
    assert rows["`modelopt`"][1] == "**does not run**: InvalidGraph: bad node"
    assert rows["`modelopt`"][3] == "–"
    assert all(len(r) == len(t["columns"]) for r in t["rows"])
    assert table(t["columns"], t["rows"]).count("\n") == 4
    assert t["notes"] == [[f"- `{k}`: `{v['command']}`" for k, v in block["tools"].items()]]


@pytest.mark.slow
def test_effnet_table_shows_top1_per_set() -> None:
    acc = {"calibration 7": {"rel_l2": 0.0389, "worst_rel_l2": 0.05, "top1": 7, "n": 7, "cosine": 0.999}}
    acc["held out 29"] = {"rel_l2": 0.0459, "worst_rel_l2": 0.058, "top1": 28, "n": 29, "cosine": 0.998}
    e = {"status": "ok", "command": "c", "wall_s": 10.0, "convert_s": 9.0, "peak_rss_mb": 700.0, "accuracy": acc}
    t = int8.table("efficientnet_lite0", {"sets": {"calibration 7": 7, "held out 29": 29}, "tools": {"onnxprec": e}})
    assert t["columns"][1] == "calibration 7: rel L2 (worst image) / top-1"
    assert t["rows"][0][1:3] == ["0.039 (0.050) / 7/7", "0.046 (0.058) / 28/29"]
    assert t["rows"][0][5] == "10 s (9.0 s)"
