"""The calibration-data object: re-iterable, split, spooled for one-shot sources, checked first, LLM inputs built."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from onnxprec._io import load_model
from onnxprec._testing import F, make_model, run, tensor_info, tiny_decoder
from onnxprec.calibration_data import BatchStore, CalibrationArgs, CalibrationData, run_on_data
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.observers import RangeObserver
from onnxprec.reference import run_reference

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 3)).astype(np.float32)


def _relu(batch: int | str = "n") -> ir.Model:
    nodes = [helper.make_node("Relu", ["X"], ["Y"], name="relu")]
    return ir.serde.deserialize_model(make_model(nodes, [tensor_info("X", F, [batch, 3])], [tensor_info("Y", F, None)]))


def _decoder(tmp_path: Path, attention: str = "gqa", **kwargs: object) -> ir.Model:
    path = tmp_path / f"{attention}.onnx"
    onnx.save(tiny_decoder(attention, **kwargs), path)  # type: ignore[arg-type]
    return load_model(path)


def test_one_shot_sources_are_spooled_and_replayed() -> None:
    def generator() -> Iterator[dict[str, np.ndarray]]:
        yield {"X": X}
        yield {"X": X[:2]}

    data = CalibrationData(generator(), _relu(), batch_size=2)
    assert data.one_shot and data.first["X"].shape == (2, 3)  # the first run, read and checked when made
    spool = Path(data._spool.name)  # type: ignore[union-attr]
    next(iter(data))  # an abandoned pass (as the reference runner's peek)
    passes = [list(data) for _ in range(2)]
    assert [b["X"].shape[0] for b in passes[0]] == [2, 2, 1, 2]
    for a, b in zip(*passes):
        np.testing.assert_array_equal(a["X"], b["X"])
    assert (data.batches, data.samples) == (4, 7) and len(data) == 4
    assert sorted(p.name for p in spool.iterdir()) == ["0.npz", "1.npz"]  # one file a stored batch, never a list
    data.close()
    assert not spool.exists()
    with pytest.raises(CalibrationDataError, match="closed"):
        list(data)


def test_re_readable_sources_are_read_again_and_checked_first(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", X=X)
    data = CalibrationData(tmp_path / "x.npz", _relu(), batch_size=3)
    assert not data.one_shot and [b["X"].shape[0] for b in data] == [3, 2] == [b["X"].shape[0] for b in data]
    static = CalibrationData({"X": np.ones((4, 3), np.float32)}, _relu(2))  # cut into static batches of 2
    assert [b["X"].shape for b in static] == [(2, 3), (2, 3)]

    def bad() -> Iterator[dict[str, np.ndarray]]:
        yield {"X": X.astype(np.float64)}
        raise AssertionError("read past the first batch")

    with pytest.raises(CalibrationDataError, match="dtype float64"):
        CalibrationData(bad(), _relu())
    with pytest.raises(CalibrationDataError, match="holds no batch"):
        CalibrationData([], _relu())


def test_ids_only_data_is_completed_for_a_kv_model(tmp_path: Path) -> None:
    model = _decoder(tmp_path)
    ids = RNG.integers(0, 16, (4, 6))
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    np.save(tmp_path / "ids.npy", ids.astype(np.int32))
    for source in (tmp_path / "ids.npz", tmp_path / "ids.npy", {"input_ids": ids}):
        data = CalibrationData(source, model, batch_size=3)
        assert data.completed == {
            "attention_mask",
            *(f"past_key_values.{i}.{k}" for i in (0, 1) for k in ("key", "value")),
        }
        batches = list(data)
        assert [b["input_ids"].shape for b in batches] == [(3, 6), (1, 6)]
        assert batches[1]["past_key_values.0.key"].shape == (1, 1, 0, 16)
        assert batches[1]["input_ids"].dtype == np.int64
    ranges = RangeObserver()
    result = run_reference(model, data, observers=[ranges])  # ORT runs the completed feeds
    assert result.num_batches == 2 and ranges.stats["logits"].batches == 2 and ranges.stats["logits"].absmax > 0


def test_an_llm_npz_of_windows_runs_one_window_a_run(tmp_path: Path) -> None:
    # The data help says an .npz is split along the batch axis: an LLM's windows are one a run unless a batch size
    # is given, so that no run holds the logits of every window; 0 keeps the batch as stored.
    model = _decoder(tmp_path)
    ids = RNG.integers(0, 16, (8, 6))
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    data = CalibrationData(tmp_path / "ids.npz", model)
    batches = list(data)
    assert [b["input_ids"].shape for b in batches] == [(1, 6)] * 8 and (data.batches, data.samples) == (8, 8)
    np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in batches]), ids)
    assert [b["input_ids"].shape for b in CalibrationData(tmp_path / "ids.npz", model, batch_size=0)] == [(8, 6)]
    assert [b["X"].shape for b in CalibrationData({"X": X}, _relu())] == [(5, 3)]  # not an LLM: as stored
    ranges = RangeObserver()
    result = run_reference(model, data, observers=[ranges])
    assert result.num_batches == 8 and result.first_outputs["logits"].shape == (1, 6, 16)


def test_partial_past_and_long_windows_are_clear_errors(tmp_path: Path) -> None:
    model = _decoder(tmp_path, max_positions=8)
    partial = {"input_ids": np.zeros((1, 4), np.int64), "past_key_values.0.key": np.zeros((1, 1, 0, 16), np.float32)}
    with pytest.raises(CalibrationDataError, match=r"lacks past_key_values\.0\.value, past_key_values\.1\.key"):
        CalibrationData(partial, model)
    with pytest.raises(CalibrationDataError, match="Windows of 9 tokens are longer than the model's context of 8"):
        CalibrationData({"input_ids": np.zeros((1, 9), np.int64)}, model)


def test_random_data_for_a_kv_model(tmp_path: Path) -> None:
    model = _decoder(tmp_path, vocab=50)
    seen: list[dict[str, np.ndarray]] = []

    def step(data: CalibrationData) -> int:
        seen.extend(data)
        return run_reference(model, data).num_batches

    assert run_on_data(model, None, step) == 1
    ids = seen[0]["input_ids"]
    assert ids.shape == (1, 32) and ids.max() < 50 and len(np.unique(ids)) > 2  # inside the vocabulary, capped
    assert seen[0]["past_key_values.0.key"].shape == (1, 1, 0, 16)  # at the context (32 rotary rows)


def test_a_prefix_run_fills_the_past(tmp_path: Path) -> None:
    model = _decoder(tmp_path)
    proto = ir.serde.serialize_model(model)
    ids = RNG.integers(0, 16, (2, 7))
    batches = list(CalibrationData({"input_ids": ids}, model, past_length=4))
    assert [b["input_ids"].shape for b in batches] == [(1, 4), (1, 4), (1, 3), (1, 3)]  # one window a run
    assert batches[0]["past_key_values.0.key"].shape == (1, 1, 0, 16)
    assert batches[2]["past_key_values.0.key"].shape == (1, 1, 4, 16)
    assert batches[3]["attention_mask"].shape == (1, 7)
    for row in range(2):  # decode-like logits equal those of the whole window
        full = run(proto, CalibrationData({"input_ids": ids[row : row + 1]}, model).first)[0]
        np.testing.assert_allclose(run(proto, batches[2 + row])[0], full[:, 4:], rtol=1e-5, atol=1e-5)


def test_a_sliding_window_ring_buffer_and_a_fixed_size_state(tmp_path: Path) -> None:
    """A sliding-window GroupQueryAttention takes its past as a ring of ``window`` positions (empty ones too);
    a convolution state has no past-length axis: zeros of its static shape. The prefix run fills both exactly."""
    model = _decoder(tmp_path, window=16, state=True)
    proto = ir.serde.serialize_model(model)
    ids = RNG.integers(0, 16, (1, 12))
    first = CalibrationData({"input_ids": ids}, model).first
    assert first["past_key_values.0.key"].shape == (1, 1, 16, 16)  # the ring
    assert first["past_key_values.1.key"].shape == (1, 1, 0, 16)
    assert first["past.0.conv"].shape == (1, 4, 2) and not first["past.0.conv"].any()
    full = run(proto, first)[0]
    head, tail = CalibrationData({"input_ids": ids}, model, past_length=5)
    assert head["past_key_values.0.key"].shape == (1, 1, 16, 16) and head["input_ids"].shape == (1, 5)
    assert tail["past_key_values.0.key"].shape == (1, 1, 16, 16)
    assert tail["past_key_values.1.key"].shape == (1, 1, 5, 16)
    assert tail["attention_mask"].shape == (1, 12)
    np.testing.assert_allclose(run(proto, tail)[0], full[:, 5:], rtol=1e-5, atol=1e-5)


def test_npy_of_a_single_input_model(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    data = CalibrationData(str(tmp_path / "x.npy"), _relu(), batch_size=2)
    batches = list(data)
    assert [sorted(b) for b in batches] == [["X"], ["X"]]
    np.testing.assert_array_equal(np.concatenate([b["X"] for b in batches]), x)
    two_inputs = make_model(
        [helper.make_node("Add", ["A", "B"], ["Y"])],
        [tensor_info("A", F, ["n", 3]), tensor_info("B", F, ["n", 3])],
        [tensor_info("Y", F, None)],
    )
    with pytest.raises(CalibrationDataError, match=r"holds one input, and the model has 2: A, B; save an \.npz"):
        CalibrationData(str(tmp_path / "x.npy"), ir.serde.deserialize_model(two_inputs))


def test_batch_store_keeps_arrays_in_memory_up_to_its_bound_and_the_rest_in_files() -> None:
    store = BatchStore(memory_bytes=100)
    small, large = np.arange(10, dtype=np.float32), np.arange(50, dtype=np.float32)
    store.put(0, "a", small)  # 40 bytes: in memory
    store.put(0, "b", large)  # 200 bytes: beyond the bound, in a file
    store.put(1, "a", small)  # 80 bytes in memory now
    store.put(1, "seq", [small, None])
    small[0] = 99  # the store holds copies
    assert store.spilled == 1 and sorted(store.names(0)) == ["a", "b"] and sorted(store.names(1)) == ["a", "seq"]
    np.testing.assert_array_equal(store.get(0, "b"), np.arange(50, dtype=np.float32))
    assert store.get(0, "a")[0] == 0 and store.get(1, "seq")[1] is None
    store.drop(0, "b")
    store.drop(0, "a")
    store.put(0, "c", large[:15])  # 60 + 40 bytes: fits again once the others are dropped
    assert store.spilled == 0 and store.names(0) == ["c"]
    store.close()
    assert store.names(1) == []


def test_calibration_args_build_the_data_from_source_shapes_and_batch_size() -> None:
    args = CalibrationArgs({"X": X}, "X:4x3", batch_size=2)
    assert args.input_shapes == {"X": (4, 3)} and not args.random  # parsed once, when the group is made
    with args.open(_relu()) as data:
        assert [b["X"].shape[0] for b in data] == [2, 2, 1]  # the user's data, split by the batch size
    assert args.run(_relu(), lambda data: data.samples or len(data)) == 3
    assert CalibrationArgs(None, {}).input_shapes is None and CalibrationArgs().random
    with pytest.raises(InvalidArgumentError, match="input_shapes entry"):
        CalibrationArgs(None, "X:4by3")
    random = CalibrationArgs(None, "X:4x3")  # random data of the sizes given
    assert random.run(_relu(), lambda data: data.first["X"].shape) == (4, 3)
    opened = CalibrationData({"X": X}, _relu())
    assert CalibrationArgs(opened).open(_relu()) is opened  # a CalibrationData already made is used as it is
    assert CalibrationArgs(opened).run(_relu(), lambda data: data) is opened and opened.first is not None


def test_calibration_args_retry_random_data_until_the_step_runs() -> None:
    sizes: list[int] = []

    def step(data: CalibrationData) -> int:
        sizes.append(data.first["X"].shape[0])
        if len(sizes) < 2:
            raise CalibrationDataError("did not run")
        return sizes[-1]

    assert CalibrationArgs().run(_relu(), step) == sizes[1] and len(sizes) == 2
    sizes.clear()
    with pytest.raises(CalibrationDataError, match="does not run on random inputs"):
        CalibrationArgs(None, "X:2x3").run(_relu(), step)
    assert sizes == [2]  # the sizes the user fixed: one attempt only
