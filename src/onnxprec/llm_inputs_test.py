"""LLM inputs: masks, positions and KV caches built from token ids, each head-size resolution path, run in ORT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from onnxprec._io import load_model
from onnxprec._testing import run, tiny_decoder
from onnxprec.errors import CalibrationDataError
from onnxprec.llm_inputs import LLMInputs

IDS = np.random.default_rng(0).integers(0, 16, (2, 6))


def _inputs(proto: onnx.ModelProto) -> LLMInputs:
    inputs = LLMInputs.of(ir.serde.deserialize_model(proto))
    assert inputs is not None
    return inputs


def _by_hand(proto: onnx.ModelProto, ids: np.ndarray, kv_heads: int) -> dict[str, np.ndarray]:
    feeds = {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)}
    for value in proto.graph.input:
        if value.name.startswith("past"):
            feeds[value.name] = np.zeros((ids.shape[0], kv_heads, 0, 16), np.float32)
    return feeds


@pytest.mark.parametrize(("attention", "kv_heads"), [("gqa", 1), ("mha", 2)])
def test_head_size_from_the_attention_node(attention: str, kv_heads: int) -> None:
    """GroupQueryAttention (packed QKV: width / (heads + 2 kv heads)) and MultiHeadAttention (width / heads)."""
    proto = tiny_decoder(attention)
    assert proto.graph.input[2].type.tensor_type.shape.dim[3].dim_param == "kv_cache_dim"
    feeds = _inputs(proto).complete({"input_ids": IDS})
    assert list(feeds) == [v.name for v in proto.graph.input]  # in the model's order
    assert feeds["past_key_values.1.value"].shape == (2, kv_heads, 0, 16)
    assert feeds["past_key_values.0.key"].dtype == np.float32
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((2, 6), np.int64))
    expected = run(proto, _by_hand(proto, IDS, kv_heads))
    for got, want in zip(run(proto, feeds), expected):
        np.testing.assert_array_equal(got, want)


def test_head_size_from_the_present_outputs() -> None:
    """No attention node (plain ONNX Concat), symbolic past dims, static present dims."""
    feeds = _inputs(tiny_decoder("concat", static_present=True)).complete({"input_ids": IDS})
    assert feeds["past_key_values.0.key"].shape == (2, 2, 0, 16)
    with pytest.raises(CalibrationDataError, match=r"Cannot size the KV-cache input past_key_values\.0\.key.*kv_cache"):
        _inputs(tiny_decoder("concat")).complete({"input_ids": IDS})


def test_head_size_and_context_from_genai_config(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(tiny_decoder("concat"), path)
    config = {"model": {"context_length": 8, "decoder": {"head_size": 16, "num_key_value_heads": 2}}}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    inputs = LLMInputs.of(load_model(path))
    assert inputs is not None
    feeds = inputs.complete({"input_ids": IDS})
    assert feeds["past_key_values.1.key"].shape == (2, 2, 0, 16)
    run(path, feeds)
    with pytest.raises(CalibrationDataError, match=r"context of 8 tokens \(context_length in genai_config\.json\)"):
        inputs.complete({"input_ids": np.zeros((1, 9), np.int64)})


def test_static_head_size_and_position_ids() -> None:
    proto = tiny_decoder("concat", symbolic_head=False, position_ids=True, max_positions=8)
    inputs = _inputs(proto)
    mask = np.ones((2, 6), np.int64)
    mask[1, 4:] = 0  # right padding: positions continue from the mask, padding gets 1
    feeds = inputs.complete({"input_ids": IDS, "attention_mask": mask})
    np.testing.assert_array_equal(feeds["position_ids"], [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 1, 1]])
    assert feeds["past_key_values.0.value"].shape == (2, 2, 0, 16)
    run(proto, feeds)
    with pytest.raises(CalibrationDataError, match=r"context of 8 tokens \(the rows of the position embedding table\)"):
        inputs.complete({"input_ids": np.zeros((1, 9), np.int64)})


def test_context_from_the_rotary_cache_and_a_filled_past() -> None:
    inputs = _inputs(tiny_decoder("gqa", max_positions=8))
    assert inputs.context() == (8, "the rows of GroupQueryAttention's cos cache 'cos_cache'")
    with pytest.raises(CalibrationDataError, match="Windows of 9 tokens are longer than the model's context of 8"):
        inputs.complete({"input_ids": np.zeros((1, 9), np.int64)})
    past = {
        f"past_key_values.{i}.{kind}": np.zeros((1, 1, 5, 16), np.float32) for i in (0, 1) for kind in ("key", "value")
    }
    feeds = inputs.complete({"input_ids": np.zeros((1, 3), np.int64)}, past)
    assert feeds["attention_mask"].shape == (1, 8)  # over the past and the current tokens
    with pytest.raises(CalibrationDataError, match="Windows of 9 tokens"):
        inputs.complete({"input_ids": np.zeros((1, 4), np.int64)}, past)


def test_some_past_inputs_but_not_all_is_an_error() -> None:
    inputs = _inputs(tiny_decoder("gqa"))
    assert inputs.plan({"input_ids"}) == {"attention_mask", *(s.name for s in inputs.past_specs)}
    assert inputs.plan({s.name for s in inputs.specs}) == frozenset()
    given = {"input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"}
    with pytest.raises(CalibrationDataError, match=r"2 of the model's 4 .* lacks past_key_values\.1\.key, past_key"):
        inputs.plan(given)


def test_not_an_llm() -> None:
    from onnxprec._testing import make_model, tensor_info

    proto = make_model(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], [tensor_info("x", shape=[1, 3])], [tensor_info("y")]
    )
    assert LLMInputs.of(ir.serde.deserialize_model(proto)) is None
