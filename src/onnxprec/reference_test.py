"""Tests of the reference runner: selection, observers, chunking under a budget, one-shot sources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from onnx_ir.passes.common import ShapeInferencePass

from onnxprec import _ort
from onnxprec._testing import make_model, tensor_info
from onnxprec.errors import CalibrationDataError
from onnxprec.observers import ChannelAbsMeanObserver, FirstBatchObserver, RangeObserver
from onnxprec.reference import run_reference

F = TensorProto.FLOAT


def _chain(n: int = 6) -> ir.Model:
    """x -> (MatMul W, Relu) x n/2 -> y, all [2, 16]."""
    nodes, inits, prev = [], {}, "x"
    rng = np.random.default_rng(0)
    for i in range(n // 2):
        nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        inits[f"W{i}"] = rng.standard_normal((16, 16)).astype(np.float32)
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    proto = make_model(nodes, [tensor_info("x", F, [2, 16])], [tensor_info("y", F, [2, 16])], inits)
    return ir.serde.deserialize_model(proto)


def _numpy_chain(model: ir.Model, x: np.ndarray) -> dict[str, np.ndarray]:
    values, prev = {}, x
    for i in range(3):
        w = model.graph.initializers[f"W{i}"].const_value.numpy()
        values[f"m{i}"] = prev @ w
        values[f"r{i}"] = prev = np.maximum(values[f"m{i}"], 0)
    return values


def _batches(k: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(k)]


def test_observers_see_every_selected_tensor_of_every_batch() -> None:
    model, batches = _chain(), _batches()
    absmean, first = ChannelAbsMeanObserver(), FirstBatchObserver()
    result = run_reference(model, batches, observers=[absmean, first])
    expected = [_numpy_chain(model, b["x"]) for b in batches]
    for name in ("m0", "r0", "m2", "r2"):
        rows = np.concatenate([e[name] for e in expected])
        np.testing.assert_allclose(absmean.mean(name), np.abs(rows).mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(first.arrays[name], expected[0][name], rtol=1e-4, atol=1e-5)
    assert absmean.tokens["x"] == 6  # graph inputs too
    assert result.num_batches == 3 and result.stats is None
    np.testing.assert_allclose(result.first_outputs["y"], expected[0]["r2"], rtol=1e-4, atol=1e-5)


def test_selector_limits_what_is_fetched() -> None:
    model = _chain()
    seen = RangeObserver()
    run_reference(model, _batches(1), select=lambda v: v.name.startswith("m"), observers=[seen])
    assert set(seen.stats) == {"x", "y", "m0", "m1", "m2"}
    values = [model.graph.node(1).outputs[0]]  # r0, by object
    seen = RangeObserver()
    run_reference(model, _batches(1), select=values, observers=[seen], observe_inputs=False)
    assert set(seen.stats) == {"y", "r0"}


def test_budget_splits_runs_into_chunks_without_changing_results(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batches = _chain(), _batches()
    whole, tiny = RangeObserver(), RangeObserver()
    one = run_reference(model, batches, observers=[whole])
    many = run_reference(model, batches, observers=[tiny], budget_bytes=1)
    assert (one.chunks, many.chunks) == (1, 6)  # m0 r0 m1 r1 m2 r2: one tensor per run
    assert whole.stats.keys() == tiny.stats.keys()
    for name, stats in whole.stats.items():
        assert (stats.min, stats.max, stats.batches) == (tiny.stats[name].min, tiny.stats[name].max, 3)
    # The temp-file path for large in-memory weights gives the same statistics.
    monkeypatch.setattr(_ort, "_INLINE_LIMIT", 1)
    spilled = RangeObserver()
    run_reference(model, batches, observers=[spilled], budget_bytes=1)
    assert {k: v.absmax for k, v in spilled.stats.items()} == {k: v.absmax for k, v in whole.stats.items()}


def test_one_shot_sources_are_spooled_once_for_all_chunks() -> None:
    model, batches = _chain(), _batches(4)
    pulled = []

    def generate() -> Iterator[dict[str, np.ndarray]]:
        for b in batches:
            pulled.append(1)
            yield b

    observer = RangeObserver()
    result = run_reference(model, generate(), observers=[observer], budget_bytes=1)
    assert len(pulled) == 4 and result.num_batches == 4 and result.chunks > 1
    assert all(s.batches == 4 for s in observer.stats.values())


def test_empty_source_and_bad_feeds_are_clear_errors() -> None:
    with pytest.raises(CalibrationDataError, match="holds no batch"):
        run_reference(_chain(), iter([]))
    with pytest.raises(CalibrationDataError, match="calibration batch 0"):
        run_reference(_chain(), [{"x": np.ones((3, 5), np.float32)}])


def test_ranges_reduced_in_the_runtime_equal_ranges_of_fetched_tensors() -> None:
    """Range-only runs reduce in ORT (min/max/sum/shape); NaN, empty tensors and shapes match the raw path."""
    nodes = [
        helper.make_node("Log", ["x"], ["log"], name="log"),  # NaN for negative inputs
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
        helper.make_node("Slice", ["relu", "s", "e"], ["empty"], name="slice"),  # [0, 3]
        helper.make_node("Identity", ["empty"], ["empty_copy"], name="read_empty"),  # observed: something reads it
        helper.make_node("Add", ["log", "relu"], ["y"], name="add"),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", F, [2, 3])],
        [tensor_info("y", F, [2, 3])],
        {"s": np.array([0], np.int64), "e": np.array([0], np.int64)},
    )
    model = ir.serde.deserialize_model(proto)
    ShapeInferencePass()(model)
    assert all(v.dtype == ir.DataType.FLOAT for n in model.graph for v in n.outputs)
    batches = [{"x": np.array([[1, 2, 3], [4, 5, 6]], np.float32)}, {"x": np.array([[-1, 0, 9]] * 2, np.float32)}]
    reduced, fetched = RangeObserver(), RangeObserver()
    run_reference(model, batches, observers=[reduced])
    run_reference(model, batches, observers=[fetched, FirstBatchObserver()])  # not range-only: raw tensors
    for name in ("log", "relu", "empty"):
        a, b = reduced.stats[name], fetched.stats[name]
        assert (a.min, a.max, a.absmax, a.shape, a.batches) == (b.min, b.max, b.absmax, b.shape, b.batches)
        assert a.dtype == b.dtype == np.float32
    assert reduced.stats["log"].absmax == np.inf  # NaN in the second batch: unbounded
    assert reduced.stats["relu"].max == 9 and reduced.stats["empty"].shape == (0, 3)


@pytest.mark.parametrize("inferred", [True, False])
def test_segmented_run_equals_the_whole_graph(inferred: bool) -> None:
    # Large models run piece by piece (each piece's weights mapped only while it runs); here each 1 KiB weight is
    # its own piece. Without known types of the tensors crossing pieces the runner falls back to the whole graph.
    model = _chain(6)
    if inferred:
        ShapeInferencePass()(model)
    rng = np.random.default_rng(3)
    batches = [{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(3)]
    results = []
    for segment_bytes in (1 << 30, 1024):
        absmean, first = ChannelAbsMeanObserver(), FirstBatchObserver()
        result = run_reference(model, batches, observers=[absmean, first], segment_bytes=segment_bytes)
        results.append((result, absmean, first))
    (whole, absmean_w, first_w), (pieces, absmean_p, first_p) = results
    assert whole.segments == 1
    assert pieces.segments == (3 if inferred else 1)
    assert pieces.num_batches == whole.num_batches == 3
    assert set(first_p.arrays) == set(first_w.arrays) >= {"m0", "r0", "m1", "r1", "m2", "x"}
    for name, array in first_w.arrays.items():
        np.testing.assert_array_equal(first_p.arrays[name], array)
        np.testing.assert_array_equal(absmean_p.mean(name), absmean_w.mean(name))
    np.testing.assert_array_equal(pieces.first_outputs["y"], whole.first_outputs["y"])
    expected = _numpy_chain(model, batches[0]["x"])
    for name, array in expected.items():
        np.testing.assert_allclose(first_p.arrays[name], array, rtol=1e-5, atol=1e-5)


def test_segmented_range_run_reduces_inside_each_piece() -> None:
    # AutoCast's range-only run: min/max/sum/shape are computed by the runtime inside each piece.
    model = _chain(6)
    ShapeInferencePass()(model)
    batches = _batches()
    results = []
    for segment_bytes in (1 << 30, 1024):
        ranges = RangeObserver(sentinels={"m1": 0.5})
        result = run_reference(model, batches, observers=[ranges], segment_bytes=segment_bytes)
        results.append((result, ranges))
    (whole, ranges_w), (pieces, ranges_p) = results
    assert (whole.segments, pieces.segments) == (1, 3)
    assert pieces.stats is not None and set(pieces.stats) == set(ranges_w.stats)
    for name, stats in ranges_w.stats.items():
        assert ranges_p.stats[name] == stats, name


def test_outputs_nothing_reads_are_not_observed() -> None:
    # LayerNormalization's optional Mean/InvStdDev outputs here feed nothing: they decide nothing, and some providers
    # never compute such outputs (ORT's CUDA SkipSimplifiedLayerNormalization), so observing them failed the run.
    nodes = [
        helper.make_node("LayerNormalization", ["x", "scale"], ["n", "mean", "inv"], name="ln", axis=-1),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    proto = make_model(
        nodes,
        [tensor_info("x", TensorProto.FLOAT, [2, 16])],
        [tensor_info("y", TensorProto.FLOAT, [2, 16])],
        {"scale": np.ones(16, np.float32)},
        opset=17,
    )
    model = ir.serde.deserialize_model(proto)
    for chunked in (False, True):
        ranges = RangeObserver()
        run_reference(model, _batches(), observers=[ranges] if chunked else [ranges, FirstBatchObserver()])
        assert ranges.stats is not None and "n" in ranges.stats
        assert not {"mean", "inv"} & set(ranges.stats)


def test_later_chunks_drop_every_node_of_the_sentinel_reductions() -> None:
    """The chunks after the first run without the range reductions: the sentinel ones' Constant, LessOrEqual, Abs
    and Where go too (they would otherwise run over the tensor for nothing on every batch)."""
    from onnxprec.reference import _ort_model_with_reductions, _without

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4]))
    relu = ir.Node("", "Relu", [x], outputs=[ir.Value(name="m", type=ir.TensorType(ir.DataType.FLOAT))])
    neg = ir.Node("", "Neg", [relu.outputs[0]], outputs=[ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT))])
    model = ir.Model(ir.Graph([x], [neg.outputs[0]], nodes=[relu, neg], opset_imports={"": 18}), ir_version=9)
    with _ort_model_with_reductions(model, [relu.outputs[0]], {"m": 0.5}) as (payload, _, reductions, added):
        base = _ort.model_proto(payload)
        assert len(reductions["m"]) == 5  # min, max, sum, shape and the magnitude above the sentinel
        assert len(base.graph.node) == 2 + 4 + 6
        plain = _without(base, added, 1)
    assert [node.op_type for node in plain.graph.node] == ["Relu", "Neg"]
    assert [out.name for out in plain.graph.output] == ["y"]
    assert [node.op_type for node in model.graph] == ["Relu", "Neg"]  # the model as before


def _builder_like(layers: int = 3) -> ir.Model:
    """The parts of onnxruntime-genai's builder graphs that cross segment boundaries: shape constants from Constant
    nodes that every layer reads, declared in value_info as scalars (as the builder does: ``shape {}``), a length
    computed from the attention mask at the start and read by every layer, and a tied embedding (the Gather reads a
    Transpose of the lm_head weight that the last MatMul reads too)."""
    rng = np.random.default_rng(0)
    hidden, head = 32, 8
    i64 = TensorProto.INT64
    inits = {"lm_head": (rng.standard_normal((hidden, 64)) * 0.1).astype(np.float32)}
    shape_const = helper.make_tensor("v", i64, [3], [0, -1, head])
    nodes = [
        helper.make_node("Constant", [], ["/constants/INT64/[0, -1, 8]"], value=shape_const, name="c_shape"),
        helper.make_node("Constant", [], ["/constants/INT64/[1]"], value_ints=[1], name="c_one"),
        helper.make_node("Constant", [], ["/constants/INT64/[0, -1, 32]"], value_ints=[0, -1, hidden], name="c_back"),
        helper.make_node("ReduceSum", ["attention_mask", "/constants/INT64/[1]"], ["mask_sum"], keepdims=1, name="sum"),
        helper.make_node("Cast", ["mask_sum"], ["length"], to=TensorProto.FLOAT, name="length"),
        helper.make_node("Transpose", ["lm_head"], ["table"], perm=[1, 0], name="embed_t"),
        helper.make_node("Gather", ["table", "input_ids"], ["h0"], name="embed"),
    ]
    prev = "h0"
    for i in range(layers):
        inits[f"w{i}"] = (rng.standard_normal((hidden, hidden)) * 0.2).astype(np.float32)
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Reshape", [f"m{i}", "/constants/INT64/[0, -1, 8]"], [f"heads{i}"], name=f"split{i}"),
            helper.make_node("Softmax", [f"heads{i}"], [f"norm{i}"], axis=-1, name=f"norm{i}"),
            helper.make_node("Reshape", [f"norm{i}", "/constants/INT64/[0, -1, 32]"], [f"back{i}"], name=f"join{i}"),
            helper.make_node("Mul", [f"back{i}", "length"], [f"scaled{i}"], name=f"scale{i}"),
            helper.make_node("Add", [prev, f"scaled{i}"], [f"h{i + 1}"], name=f"res{i}"),
        ]
        prev = f"h{i + 1}"
    nodes.append(helper.make_node("MatMul", [prev, "lm_head"], ["logits"], name="lm_head"))
    inputs = [tensor_info("input_ids", i64, ["batch", "seq"]), tensor_info("attention_mask", i64, ["batch", "seq"])]
    proto = make_model(nodes, inputs, [tensor_info("logits", F, ["batch", "seq", 64])], inits)
    # The builder's value info: every tensor typed, its shape constants as scalars.
    proto.graph.value_info.extend(
        tensor_info(out, i64, [])
        if out.startswith("/constants/")
        else tensor_info(out, F if out != "mask_sum" else i64)
        for node in proto.graph.node
        for out in node.output
        if out != "logits"
    )
    return ir.serde.deserialize_model(proto)


@pytest.mark.parametrize("carry_memory", [None, 0])
def test_segmented_run_of_a_builder_graph_equals_the_whole_graph(
    carry_memory: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces of one weight each: the shape constants are computed by every piece that reads them (their scalar value
    # info is never a piece's input), the mask's length and the tied table cross pieces by element type. With no
    # memory for them, the carried activations go through temporary files.
    import onnxprec.segments

    if carry_memory is not None:
        monkeypatch.setattr(onnxprec.segments, "CARRY_MEMORY_BYTES", carry_memory)
    model = _builder_like(3)
    rng = np.random.default_rng(2)
    batches = [
        {"input_ids": rng.integers(0, 64, (1, 5)), "attention_mask": np.ones((1, 5), np.int64)} for _ in range(2)
    ]
    results = []
    for segment_bytes in (1 << 30, 1):
        first = FirstBatchObserver()
        results.append((run_reference(model, batches, observers=[first], segment_bytes=segment_bytes), first))
    (whole, first_w), (pieces, first_p) = results
    # Each node with a weight alone, the nodes after it in the next piece; the Transpose of the tied table is computed
    # by the piece of its Gather (its own piece, which nothing else reads, is not run).
    assert (whole.segments, pieces.segments) == (1, 10)
    np.testing.assert_array_equal(pieces.first_outputs["logits"], whole.first_outputs["logits"])
    assert set(first_p.arrays) == set(first_w.arrays) and "back2" in first_w.arrays
    for name, array in first_w.arrays.items():
        np.testing.assert_array_equal(first_p.arrays[name], array, err_msg=name)


def test_pieces_with_matmulnbits_run_its_pre_packed_kernel(tmp_path: Path) -> None:
    # Unpacked, MatMulNBits dequantizes its whole weight to float32 on every run (933 MB for a 1.5B model's 8-bit
    # head); a piece holding one pre-packs it, and so computes what a default session computes.
    import onnx

    from onnxprec.passes import InferTypesPass
    from onnxprec.quantization import int4
    from onnxprec.quantization._testing import mlp

    onnx.save(mlp(k=64, h=96, n=48), tmp_path / "f.onnx")
    path = tmp_path / "q.onnx"
    int4.quantize_file(tmp_path / "f.onnx", path, output_format="matmulnbits", nodes_to_exclude=[],
                       calibration_method="rtn", log_level="WARNING")  # fmt: skip
    model = ir.load(path)
    assert sum(n.op_type == "MatMulNBits" for n in model.graph) >= 2
    InferTypesPass()(model)  # the types crossing pieces (ONNX's inference does not know MatMulNBits)
    rng = np.random.default_rng(0)
    x = {"X": rng.standard_normal((2, 4, 64)).astype(np.float32)}
    pieces = run_reference(model, [x], select=(), observe_inputs=False, segment_bytes=1)
    assert pieces.segments >= 2
    name = str(model.graph.outputs[0].name)
    packed = _ort.create_session(str(path)).run(x, [name])[0]
    unpacked = _ort.create_session(str(path), low_memory=True).run(x, [name])[0]
    np.testing.assert_array_equal(pieces.first_outputs[name], packed)
    assert not np.array_equal(packed, unpacked)  # the two kernels differ (int8 activations when pre-packed)


def test_a_table_tied_through_a_transpose_is_gathered_by_columns_in_pieces() -> None:
    # Transpose(head weight) -> Gather would compute the whole transposed table in the Gather's piece (671 MB for
    # Gemma-3's 262k x 640): the pieces gather the weight's columns instead, with the same values.
    from onnxprec._pieces import gather_columns
    from onnxprec.quantization._testing import tiny_lm

    proto = tiny_lm("transpose")[0]
    model = ir.serde.deserialize_model(proto)
    ShapeInferencePass()(model)
    rng = np.random.default_rng(2)
    batches = [{"ids": rng.integers(0, 80, (2, 5))} for _ in range(2)]
    whole = run_reference(model, batches, select=(), observe_inputs=False)
    pieces = run_reference(model, batches, select=(), observe_inputs=False, segment_bytes=1)
    assert whole.segments == 1 and pieces.segments >= 2
    np.testing.assert_array_equal(pieces.first_outputs["logits"], whole.first_outputs["logits"])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "T"])
    gather_columns(proto, (), {"ids": ids}.get)
    ops = [(n.op_type, list(n.input)) for n in proto.graph.node]
    assert ("Gather", ["lm_head.weight", "ids"]) in ops and not any(op == "Transpose" and "lm_head.weight" in i
                                                                    for op, i in ops)  # fmt: skip


def test_a_whole_model_gathers_a_transposed_table_by_columns_with_the_same_logits() -> None:
    # For a session of the whole model (the size budget's real runs), where ORT would fold the Transpose into a copy
    from onnxprec._pieces import gather_model_columns
    from onnxprec.quantization._testing import tiny_lm

    proto = tiny_lm("transpose")[0]
    before, after = ir.serde.deserialize_model(proto), ir.serde.deserialize_model(proto)
    assert gather_model_columns(after) == 1
    assert [n.op_type for n in after.graph] == ["Gather", "Transpose", "MatMul", "Relu", "MatMul"]
    ids = {"ids": np.random.default_rng(0).integers(0, 80, (2, 7))}
    np.testing.assert_array_equal(
        _ort.create_session(after).run(ids, ["logits"])[0], _ort.create_session(before).run(ids, ["logits"])[0]
    )
