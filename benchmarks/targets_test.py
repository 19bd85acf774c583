"""Targets as data: one generic evaluation (reached, not reached, not measured, one row per model for ``*``)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import report_autocast
from benchmarks.report_common import Merged
from benchmarks.targets import Goal, evaluate, targets_table


def _stats(value: float) -> dict[str, Any]:
    return {"median": value, "min": value, "max": value, "n": 1}


def _tool(run: str, wall: float | None, **extra: Any) -> dict[str, Any]:
    summary = {"wall_s": _stats(wall), "peak_rss_mb": _stats(100.0)} if wall else {}
    return {"_run": run, "status": "ok" if wall else "failed", "summary": summary, "_vs": {}, **extra}


def _merged() -> Merged:
    structure = {"nodes": 10, "float_nodes": 10, "low_nodes": 10, "fp32_nodes": 0, "casts": 2}
    fast = _tool("a", 1.0, structure=structure, accuracy={"rel_l2": 1e-3, "max_abs": 0.01, "nonfinite": 0})
    fast["_vs"]["modelopt"] = {"speedup": _stats(20.0), "paired": True}
    slow = _tool("a", 20.0, structure={**structure, "casts": 1}, accuracy={"rel_l2": 1e-3, "nonfinite": 0})
    models = {
        "chain_8": {"tools": {"onnxprec": fast, "modelopt": slow}, "fp32": {}},
        "chain_4": {"tools": {"onnxprec": _tool("a", None)}, "fp32": {}},
    }
    return Merged(models, [{"run_id": "a"}])


def test_targets_are_evaluated_from_data() -> None:
    merged = _merged()
    targets = [
        Goal("{model}: ≥10× faster", "speedup", ">=", 10, "≥ 10×", "chain_8", context=("ModelOpt {anchor_wall_s} s",)),
        Goal("{model}: < 2 s", "wall_s", "<", 2, "< 2 s", "chain_4", anchor=None),
        Goal("{model}: < 2 s", "wall_s", "<", 2, "< 2 s", "chain_1000", anchor=None),
        Goal("{model}: casts ≤ ModelOpt's", "casts", "<=", 1, "≤"),
        Goal("{model}: error ≤ 1.05× ModelOpt's", "rel_l2", "<=", 1.05, "≤", context=("max abs {max_abs}",)),
    ]
    rows = evaluate(targets, merged)
    assert [(r.target, r.reached) for r in rows] == [
        ("chain_8: ≥10× faster", True),
        ("chain_4: < 2 s", False),  # it ran and failed: not reached
        ("chain_1000: < 2 s", None),  # never measured
        ("chain_8: casts ≤ ModelOpt's", False),  # * targets: only the models where both tools have results
        ("chain_8: error ≤ 1.05× ModelOpt's", True),
    ]
    assert rows[0].measured == "**20.0×**" and rows[0].context == "ModelOpt 20.0 s" and rows[0].run == "[1]"
    assert rows[1].measured == "**failed**" and rows[2].measured == "not measured"
    assert rows[4].context == "max abs 0.01 vs –"
    assert "| chain_8: ≥10× faster | **20.0×** | ≥ 10× | ✅ |" in targets_table(rows)


def test_autocast_targets_name_known_metrics_and_tools() -> None:
    rows = evaluate(report_autocast.TARGETS, _merged())
    assert rows[0].measured == "not measured"  # SmolLM2 absent
    assert any(r.target == "chain_8: nodes in low precision ≥ ModelOpt's" and r.reached for r in rows)


@pytest.mark.slow
def test_accuracy_target_metrics() -> None:
    """Issue 11: the target's own error against its bound; low nodes against the default only where it meets it."""
    structure = {"nodes": 10, "float_nodes": 10, "low_nodes": 8, "fp32_nodes": 2, "casts": 2}
    target = _tool("a", 5.0, structure=structure, accuracy={"rel_l2": 9e-4, "nonfinite": 0})
    meets = _tool("a", 1.0, structure={**structure, "low_nodes": 7}, accuracy={"rel_l2": 8e-4, "nonfinite": 0})
    misses = _tool("a", 1.0, structure={**structure, "low_nodes": 10}, accuracy={"rel_l2": 2e-3, "nonfinite": 0})
    merged = Merged(
        {
            "m1": {"tools": {"onnxprec:target": target, "onnxprec:data": meets}, "fp32": {}},
            "m2": {"tools": {"onnxprec:target": target, "onnxprec:data": misses}, "fp32": {}},
        },
        [{"run_id": "a"}],
    )
    targets = [
        Goal("{model}: met", "own_rel_l2", "<=", 1e-3, "≤", "m1", "onnxprec:target", anchor=None),
        *(
            Goal("{model}: ≥ default", "low_nodes_at_target", ">=", 1, "≥", m, "onnxprec:target", "onnxprec:data",
                   reference=1e-3)
            for m in ("m1", "m2")
        ),
    ]  # fmt: skip
    rows = evaluate(targets, merged)
    assert [(r.target, r.reached) for r in rows] == [
        ("m1: met", True),
        ("m1: ≥ default", True),
        ("m2: ≥ default", None),
    ]
    assert rows[2].measured.startswith("n/a: the default misses it")
