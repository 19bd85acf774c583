"""AutoCast by accuracy target: the option, the emulation session, both search directions, checked for real
(the target's grammar: :mod:`onnxprec.accuracy_test`)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, run, tensor_info
from onnxprec.autocast import AutoCastOptions, convert_model, convert_to_mixed_precision, target
from onnxprec.errors import InvalidArgumentError
from onnxprec.metrics import rel_l2

LAYERS, WIDTH, ROWS = 6, 48, 64


def _mlp(scale: float = 1.0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """LAYERS x (MatMul -> Add -> Tanh), then a MatMul to the output; ``scale`` sizes the first layer's values."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "X"
    for i in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH) * (scale if i == 0 else 1.0)).astype(np.float32)
        inits[f"W{i}"], inits[f"B{i}"] = w, rng.standard_normal(WIDTH).astype(np.float32) * 0.1
        nodes += [
            helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"layer{i}/matmul"),
            helper.make_node("Add", [f"m{i}", f"B{i}"], [f"a{i}"], name=f"layer{i}/add"),
            helper.make_node("Tanh" if i else "Identity", [f"a{i}"], [f"t{i}"], name=f"layer{i}/act"),
        ]
        x = f"t{i}"
    inits["Wout"] = (rng.standard_normal((WIDTH, 8)) / np.sqrt(WIDTH)).astype(np.float32)
    nodes.append(helper.make_node("MatMul", [x, "Wout"], ["Y"], name="head/matmul"))
    model = make_model(nodes, [tensor_info("X", F, ["n", WIDTH])], [tensor_info("Y", F, ["n", 8])], inits)
    return model, {"X": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)}


def _convert(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **kwargs: object):  # type: ignore[no-untyped-def]
    options = AutoCastOptions(calibration_data=feeds, keep_io_types=True, **kwargs)  # type: ignore[arg-type]
    converted, report, _ = convert_model(model, options)
    return converted, report


def _low(report) -> int:  # type: ignore[no-untyped-def]
    return sum(d.low for d in report.decisions.values())


def _error(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **kwargs: object) -> float:
    """The real error of a conversion, measured as the pipeline measures it (no ORT graph rewrites)."""
    out = convert_to_mixed_precision(model, calibration_data=feeds, keep_io_types=True, **kwargs)  # type: ignore[arg-type]
    (got,) = create_session(out, optimization="none").run(feeds)
    return rel_l2(run(model, feeds)[0], got)


@pytest.mark.parametrize("spec", ["rel_l2=1e-3", "accuracy>=0.9", "rel_l2<=", "rel_l2<=nan", ""])
def test_bad_targets_name_the_accepted_forms(spec: str) -> None:
    with pytest.raises(InvalidArgumentError, match="METRIC<=VALUE"):
        AutoCastOptions(target_accuracy=spec)


def test_downward_keeps_the_sensitive_nodes_in_fp32_until_the_real_model_meets_the_target() -> None:
    model, feeds = _mlp()
    _, default = _convert(model, feeds)
    assert _low(default) == default.stats.nodes and _error(model, feeds) > 2e-4  # everything low by default
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=2e-4")
    search = report.target_search
    assert search.mode == "downward" and search.reached
    assert 0 < _low(report) < _low(default)
    kept = [n.name for n, d in report.decisions.items() if not d.low]
    assert all("target accuracy: kept in FP32" in d.reason for n, d in report.decisions.items() if n.name in kept)
    # the saved numbers are the real model's, and the real model meets the target
    error = _error(model, feeds, target_accuracy="rel_l2<=2e-4")
    assert error <= 2e-4
    assert report.numeric.max_rel_l2 == pytest.approx(error, rel=1e-3)
    # one emulation session, a real session for the default and one per check
    assert search.sessions == 1 + sum(step.kind == "real" for step in search.steps)


def test_upward_converts_what_data_max_kept_while_the_target_holds() -> None:
    model, feeds = _mlp(scale=250.0)  # layer 0 reaches about 1000: data_max keeps it in FP32
    _, default = _convert(model, feeds)
    high = {n.name for n, d in default.decisions.items() if not d.low}
    assert "layer0/add" in high
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=1e-2")
    assert report.target_search.mode == "upward" and report.target_search.reached
    assert _low(report) > _low(default)
    assert report.decisions[next(n for n in report.decisions if n.name == "layer0/add")].low


@pytest.mark.slow
def test_a_target_the_default_meets_never_converts_fewer_nodes() -> None:
    model, feeds = _mlp(scale=250.0)
    _, default = _convert(model, feeds)
    _, report = _convert(model, feeds, target_accuracy=f"rel_l2<={_error(model, feeds)!r}")
    assert report.target_search.reached and _low(report) >= _low(default)


def test_overflowing_nodes_are_never_candidates() -> None:
    model, feeds = _mlp(scale=2e4)  # layer 0 beyond 65504
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=0.5")
    assert not report.decisions[next(n for n in report.decisions if n.name == "layer0/add")].low


def test_a_callback_target() -> None:
    model, feeds = _mlp()
    seen = []

    def close_enough(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> bool:
        seen.append(set(candidate))
        return float(np.abs(reference["Y"] - candidate["Y"]).max()) < 1e-4

    _, report = _convert(model, feeds, target_accuracy=close_enough)
    assert seen and seen[0] == {"Y"}
    assert report.target_search.reached and report.target_search.mode == "downward"
    assert report.numeric.errors["Y"]["max_abs"] < 1e-4


def test_an_unreachable_target_is_reported_not_hidden() -> None:
    model, feeds = _mlp()
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=1e-12", nodes_to_include=["layer5/.*"])
    search = report.target_search
    assert not search.reached and search.note
    assert report.to_json()["target"]["reached"] is False


def test_a_target_needs_a_runtime_that_runs_the_low_type() -> None:
    """BF16 MatMul has no kernel on ONNX Runtime's CPU: the target cannot be measured, and the error says so."""
    from onnxprec.errors import UnsupportedModelError

    model, feeds = _mlp()
    with pytest.raises(UnsupportedModelError, match=r"--target_accuracy measures.*--providers cuda:0"):
        _convert(model, feeds, target_accuracy="rel_l2<=1e-2", low_precision_type="bf16")


def _trace(report) -> list[tuple[str, str, int, bool]]:  # type: ignore[no-untyped-def]
    """What the search tried, in order, without the times."""
    return [(s.kind, s.what, s.low_nodes, s.ok) for s in report.target_search.steps]


def test_the_search_is_the_same_whatever_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _mlp()
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=2e-4")
    assert sum(" more" in what for _, what, _, _ in _trace(report)) == target.REFINE_RUNS  # greedy steps ran
    ticks = iter(range(0, 10**9, 1000))  # every reading of the clock 1000 s after the last: each run looks slow
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    _, slow = _convert(model, feeds, target_accuracy="rel_l2<=2e-4")
    assert _trace(slow) == _trace(report)
    assert {n.name: d.low for n, d in slow.decisions.items()} == {n.name: d.low for n, d in report.decisions.items()}


def test_a_model_with_no_work_to_count_gets_every_greedy_step() -> None:
    """One run's work divides the greedy steps' budget: a graph with no MatMul, Gemm or Conv, no calibration output
    kept and an emulation of no nodes counts none, and every step is allowed (:data:`target.REFINE_RUNS`), not a
    division by zero."""
    import onnx_ir as ir

    from onnxprec.accuracy import AccuracyTarget, ReferenceOutputs

    proto = make_model([helper.make_node("Relu", ["X"], ["Y"])], [tensor_info("X", F, ["n", 4])],
                       [tensor_info("Y", F, ["n", 4])], {})  # fmt: skip
    model = ir.from_proto(proto)
    problem = target.Problem(model, {}, {}, None, ReferenceOutputs(), AccuracyTarget.parse("rel_l2<=0.01"),
                             ir.DataType.FLOAT16, True, None, lambda decisions: model)  # fmt: skip
    assert target.refine_runs(problem, 0) == target.REFINE_RUNS


def test_the_greedy_steps_stop_at_the_work_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _mlp()
    # one emulated run of the MLP: its multiply-adds on the ROWS rows plus a node cost per node of the emulation model
    macs = ROWS * WIDTH * WIDTH * LAYERS + ROWS * WIDTH * 8
    runs = []
    refine_runs = target.refine_runs

    def spy(problem: target.Problem, nodes: int) -> int:
        runs.append(refine_runs(problem, nodes))
        per_run = macs + target.EMULATED_NODE_MULTIPLY_ADDS * nodes
        assert target.REFINE_MULTIPLY_ADDS // per_run == runs[-1]
        return runs[-1]

    monkeypatch.setattr(target, "refine_runs", spy)
    monkeypatch.setattr(target, "REFINE_MULTIPLY_ADDS", 2.5 * (macs + target.EMULATED_NODE_MULTIPLY_ADDS * 80))
    _, report = _convert(model, feeds, target_accuracy="rel_l2<=2e-4")
    assert runs and runs[0] < target.REFINE_RUNS
    assert sum(" more" in what for _, what, _, _ in _trace(report)) == runs[0]
    assert report.target_search.reached
