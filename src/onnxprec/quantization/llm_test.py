"""LLM feeds: windows, masks, positions and empty KV caches read from the model's inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxprec._testing import make_model, tensor_info
from onnxprec.errors import CalibrationDataError, InvalidArgumentError
from onnxprec.quantization import llm_feeds, token_windows


def _kv_model(float_type: int = TensorProto.FLOAT16):  # type: ignore[no-untyped-def]
    inputs = [
        tensor_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        tensor_info("attention_mask", TensorProto.INT64, ["batch", "total_seq"]),
        tensor_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
        tensor_info("past_key_values.0.key", float_type, ["batch", 3, "past_seq", 8]),
        tensor_info("past_key_values.0.value", float_type, ["batch", 3, "past_seq", 8]),
    ]
    nodes = [helper.make_node("Identity", [i.name], [f"{i.name}_out"]) for i in inputs]
    outputs = [tensor_info(f"{i.name}_out", i.type.tensor_type.elem_type, None) for i in inputs]
    return make_model(nodes, inputs, outputs)


def test_windows_masks_positions_and_empty_fp16_cache() -> None:
    ids = np.arange(1000) % 97
    feeds = llm_feeds(_kv_model(), ids, seq_len=64, max_windows=5, batch_size=2)
    assert len(feeds) == 3  # 5 windows in batches of 2
    first = feeds[0]
    np.testing.assert_array_equal(first["input_ids"], ids[:128].reshape(2, 64))
    assert first["attention_mask"].shape == (2, 64) and first["attention_mask"].all()
    np.testing.assert_array_equal(first["position_ids"][1], np.arange(64))
    assert first["past_key_values.0.key"].shape == (2, 3, 0, 8)
    assert first["past_key_values.0.value"].dtype == np.float16
    assert feeds[2]["input_ids"].shape == (1, 64)


def test_text_with_any_tokenizer() -> None:
    class Tokenizer:
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    feeds = llm_feeds(_kv_model(TensorProto.FLOAT), text="hello world, " * 10, tokenizer=Tokenizer(), seq_len=16)
    assert len(feeds) == 8 and feeds[0]["input_ids"][0, 0] == ord("h")
    assert feeds[0]["past_key_values.0.key"].dtype == np.float32
    assert len(llm_feeds(_kv_model(), text="abc", tokenizer=lambda t: {"input_ids": [1, 2, 3]}, seq_len=2)) == 1


def test_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        llm_feeds(_kv_model())
    with pytest.raises(InvalidArgumentError, match="tokenizer"):
        llm_feeds(_kv_model(), text="x")
    model = make_model(
        [helper.make_node("Identity", ["pixel_values"], ["y"])],
        [tensor_info("pixel_values", TensorProto.FLOAT, [1, 3])],
        [tensor_info("y", TensorProto.FLOAT, [1, 3])],
    )
    with pytest.raises(CalibrationDataError, match="pixel_values"):
        llm_feeds(model, [1, 2, 3])
    assert token_windows([1, 2, 3], 8).shape == (1, 3)  # shorter than one window: the whole stream
    assert token_windows(np.arange(20).reshape(2, 10), 6).tolist() == [
        list(range(6)),
        list(range(6, 12)),
        list(range(12, 18)),
    ]
