"""Activation statistics: exact against numpy, split into passes under a memory budget, batches split and replayed."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec.calibration_data import CalibrationData
from onnxprec.quantization._testing import mlp
from onnxprec.quantization.activation_stats import collect_stats, plan_chunks, pruned_copy, stats_bytes
from onnxprec.quantization.int4 import quantize
from onnxprec.quantization.methods import METHODS
from onnxprec.quantization.select import select_layers

X = np.random.default_rng(0).standard_normal((3, 5, 64)).astype(np.float32)


def _model() -> ir.Model:
    return ir.serde.deserialize_model(mlp())


def test_statistics_match_numpy() -> None:
    model = _model()
    groups = select_layers(model).groups()
    gamma = next(v for k, v in model.graph.initializers.items() if k == "gamma").const_value.numpy()  # type: ignore[union-attr]
    spec = METHODS["awq_gptq"]  # all three statistics
    stats = collect_stats(model, groups, CalibrationData([{"X": X}], model, batch_size=1), spec, sample_tokens=7)
    xn = (X * gamma).reshape(-1, 64)
    first = stats[groups[0]]
    np.testing.assert_allclose(first.absmean, np.abs(xn).mean(0), rtol=1e-5)  # type: ignore[arg-type]
    exact = xn.astype(np.float64).T @ xn
    np.testing.assert_allclose(first.gram, exact, rtol=1e-5, atol=1e-6 * np.abs(exact).max())  # type: ignore[arg-type]
    assert first.sample.shape == (7, 64) and first.tokens == 15  # type: ignore[union-attr]
    assert first.sample.dtype == np.float16  # type: ignore[union-attr]  (stored at half the bytes)
    rows = {tuple(r) for r in xn.astype(np.float16)}
    assert all(tuple(r) in rows for r in first.sample)  # type: ignore[union-attr]
    assert stats[groups[1]].absmean.shape == (96,)  # type: ignore[union-attr]


def test_chunks_fit_the_budget_and_several_passes_give_the_same_model(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    groups = select_layers(model).groups()
    spec = METHODS["gptq"]
    sizes = [stats_bytes(g, spec, 512) for g in groups]
    assert plan_chunks(groups, spec, 512, sum(sizes)) == [groups]
    assert plan_chunks(groups, spec, 512, 1) == [[g] for g in groups]
    calib = [{"X": X}]
    one = quantize(mlp(), calibration_method="gptq", calibration_data_reader=calib, block_size=16)
    passes = []

    def one_group_per_pass(groups, spec, sample_tokens, budget):  # type: ignore[no-untyped-def]
        passes.extend(plan_chunks(groups, spec, sample_tokens, 1))
        return [[g] for g in groups]

    monkeypatch.setattr("onnxprec.quantization.int4._api.plan_chunks", one_group_per_pass)
    several = quantize(mlp(), calibration_method="gptq", calibration_data_reader=calib, block_size=16)
    assert len(passes) == 2
    assert {i.name: i.raw_data for i in one.graph.initializer} == {
        i.name: i.raw_data for i in several.graph.initializer
    }


def test_batches_split_along_a_dynamic_batch_axis_and_one_shot_sources_replay() -> None:
    model = _model()

    def generator() -> Iterator[dict[str, np.ndarray]]:
        yield {"X": X}
        yield {"X": X[:1]}

    replay = CalibrationData(generator(), model, batch_size=1)
    try:
        next(iter(replay))  # an abandoned first iteration (the reference runner peeks at the first batch)
        for _ in range(2):
            batches = list(replay)
            assert [b["X"].shape[0] for b in batches] == [1, 1, 1, 1]
            np.testing.assert_array_equal(batches[2]["X"], X[2:3])
        assert (replay.batches, replay.samples) == (4, 4)
    finally:
        replay.close()
    assert [b["X"].shape[0] for b in CalibrationData([{"X": X}], model, batch_size=2)] == [2, 1]
    assert [b["X"].shape[0] for b in CalibrationData([{"X": X}], model, batch_size=0)] == [3]


def test_static_batch_is_not_split() -> None:
    proto = mlp()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    model = ir.serde.deserialize_model(proto)
    assert [b["X"].shape[0] for b in CalibrationData([{"X": X}], model, batch_size=1)] == [3]


def test_pruned_copy_runs_only_what_the_inputs_need() -> None:
    model = _model()
    copy = pruned_copy(model, ["xn"])
    assert [n.op_type for n in copy.graph] == ["Mul"]
    assert len(model.graph) == 7  # the original is untouched
    assert [str(v.name) for v in copy.graph.outputs] == ["xn"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["awq_lite", "gptq"])
def test_calibration_reader_and_npz_sources(tmp_path, method: str) -> None:  # type: ignore[no-untyped-def]
    class Reader:  # an ONNX Runtime CalibrationDataReader
        def __init__(self) -> None:
            self.items = iter([{"X": X[i : i + 1]} for i in range(3)])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.items, None)

    np.savez(tmp_path / "calib.npz", X=X)
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"{i}.npz", X=X[i : i + 1])
    results = [
        quantize(mlp(), calibration_method=method, calibration_data_reader=source, block_size=16, stats_memory_mb=1)
        for source in (Reader(), str(tmp_path / "calib.npz"), str(folder), [{"X": X}], iter([{"X": X}]))
    ]
    reference = {i.name: i.raw_data for i in results[0].graph.initializer}
    for result in results[1:]:
        assert {i.name: i.raw_data for i in result.graph.initializer} == reference
    onnx.checker.check_model(results[0], full_check=True)


def _parallel_block() -> onnx.ModelProto:
    """Phi's layer: attention and MLP side by side on one norm's output, summed at the end; the attention's
    second MatMul input (``a``) is no input of the deeper MLP branch."""
    from onnx import helper

    from onnxprec._testing import F, make_model, tensor_info

    rng = np.random.default_rng(1)
    inits = {
        "gamma": rng.uniform(0.5, 2.0, 64).astype(np.float32),
        **{w: (rng.standard_normal((64, 64)) / 8).astype(np.float32) for w in ("Wa", "Wo", "Wf", "Wd")},
    }
    nodes = [
        helper.make_node("Mul", ["X", "gamma"], ["xn"], name="/model/layers.0/ln/Mul"),
        helper.make_node("MatMul", ["xn", "Wa"], ["qa"], name="/model/layers.0/attn/qkv/MatMul"),
        helper.make_node("Tanh", ["qa"], ["a"], name="/model/layers.0/attn/Attention"),
        helper.make_node("MatMul", ["a", "Wo"], ["ao"], name="/model/layers.0/attn/o_proj/MatMul"),
        helper.make_node("MatMul", ["xn", "Wf"], ["h"], name="/model/layers.0/mlp/fc1/MatMul"),
        helper.make_node("Relu", ["h"], ["f"], name="/model/layers.0/mlp/act"),
        helper.make_node("MatMul", ["f", "Wd"], ["fo"], name="/model/layers.0/mlp/fc2/MatMul"),
        helper.make_node("Add", ["ao", "fo"], ["Y"], name="/model/layers.0/Add"),
    ]
    return make_model(nodes, [tensor_info("X", F, ["B", "T", 64])], [tensor_info("Y", F, ["B", "T", 64])], inits)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["awq_lite", "gptq"])
def test_side_by_side_branches_are_all_observed(method: str) -> None:
    """A group input that the deepest one does not depend on (Phi's last attention output beside its MLP) is
    observed too: it crashed AWQ/GPTQ with a KeyError on the builder's Phi."""
    model = ir.serde.deserialize_model(_parallel_block())
    groups = select_layers(model).groups()
    assert {g.name for g in groups} == {"xn", "a", "f"}
    stats = collect_stats(model, groups, CalibrationData([{"X": X}], model, batch_size=1), METHODS["awq_gptq"])
    gamma, wa = (model.graph.initializers[n].const_value.numpy() for n in ("gamma", "Wa"))  # type: ignore[union-attr]
    a = np.tanh((X * gamma) @ wa).reshape(-1, 64)
    got = stats[next(g for g in groups if g.name == "a")]
    np.testing.assert_allclose(got.absmean, np.abs(a).mean(0), rtol=1e-5)  # type: ignore[arg-type]
    np.testing.assert_allclose(got.gram, a.astype(np.float64).T @ a, rtol=1e-4, atol=1e-4)  # type: ignore[arg-type]
    out = quantize(_parallel_block(), calibration_method=method, calibration_data_reader=[{"X": X}], block_size=16)
    onnx.checker.check_model(out, full_check=True)
    assert sum(n.op_type == "DequantizeLinear" for n in out.graph.node) >= 4


def test_a_model_above_twice_the_segment_size_runs_in_segments_with_the_same_statistics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnxprec import segments

    model = _model()
    groups = select_layers(model).groups()
    spec = METHODS["gptq"]
    whole = collect_stats(model, groups, CalibrationData([{"X": X}], model, batch_size=1), spec)
    runs: list[int] = []
    original = segments.run_segmented

    def spy(base: onnx.ModelProto, segments: list[list[int]], *args: object, **kwargs: object) -> object:
        runs.append(len(segments))
        return original(base, segments, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(segments, "run_segmented", spy)
    parts = collect_stats(model, groups, CalibrationData([{"X": X}], model, batch_size=1), spec, segment_bytes=16384)
    assert runs and runs[0] >= 2  # mlp's weights (about 80 KB) in pieces of at most 16 KB
    for group in groups:
        np.testing.assert_allclose(parts[group].gram, whole[group].gram, rtol=1e-6)  # type: ignore[arg-type]


def test_statistics_handed_over_as_each_segment_ends_equal_those_of_a_whole_pass() -> None:
    # The size budget's one pass over a segmented model: each group's Gram matrix is handed over (and dropped by the
    # observers) when the piece that computes its input has seen every batch, in graph order, one piece at a time.
    from onnxprec.quantization.activation_stats import streams

    model = _model()
    groups = select_layers(model).groups()
    spec = METHODS["gptq"]
    batches = [{"X": X[i : i + 1]} for i in range(3)]
    whole = collect_stats(model, groups, CalibrationData(batches, model), spec)
    handed: list[list[str]] = []
    got = {}

    def take(stats: dict) -> None:  # type: ignore[type-arg]
        handed.append([group.name for group in stats])
        got.update(stats)

    assert streams(model, 16384) and not streams(model, 1 << 20)
    left = collect_stats(model, groups, CalibrationData(batches, model), spec, segment_bytes=16384, on_ready=take)
    assert not left and len(handed) >= 2  # in several handovers, not at the end
    assert [name for names in handed for name in names] == [group.name for group in groups]
    for group in groups:
        assert got[group].tokens == whole[group].tokens == 15
        np.testing.assert_allclose(got[group].gram, whole[group].gram, rtol=1e-6)  # type: ignore[arg-type]


def test_float32_gram_terms_are_summed_in_float64_exactly_as_widened_copies() -> None:
    from onnxprec.quantization.activation_stats import Float32GramObserver

    observer = Float32GramObserver(["x"])
    batches = [np.random.default_rng(i).standard_normal((2, 7, 16)).astype(np.float32) for i in range(3)]
    for batch in batches:
        observer.update("x", batch)
    rows = [b.reshape(-1, 16) for b in batches]
    expected = sum((r.T @ r).astype(np.float64) for r in rows)
    assert observer.gram["x"].dtype == np.float64 and observer.tokens["x"] == 42
    np.testing.assert_array_equal(observer.gram["x"], expected)  # type: ignore[arg-type]
