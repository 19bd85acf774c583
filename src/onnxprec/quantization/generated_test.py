"""Token windows an LLM writes itself: shapes, vocabulary, determinism, and the KV-cache path on the builder model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnxprec._io import load_model
from onnxprec.errors import CalibrationDataError
from onnxprec.quantization._testing import mlp, tiny_lm
from onnxprec.quantization.generated import _sample, generated_token_windows

BUILDER = Path.home() / ".cache/onnxprec/zoo/genai/smollm2_fp32/model.onnx"


def test_windows_without_a_cache_follow_the_model() -> None:
    model = ir.serde.deserialize_model(tiny_lm("copies")[0])
    ids = generated_token_windows(model, windows=3, length=12, seed=1)
    assert ids.shape == (3, 12) and ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 80
    np.testing.assert_array_equal(ids, generated_token_windows(model, windows=3, length=12, seed=1))
    assert not np.array_equal(ids, generated_token_windows(model, windows=3, length=12, seed=2))


def test_sampling_follows_the_probabilities() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1, 1e-9]] * 4000))
    tokens = _sample(logits, np.random.default_rng(0), 1.0)
    np.testing.assert_allclose(np.bincount(tokens, minlength=4) / 4000, [0.7, 0.2, 0.1, 0.0], atol=0.03)


def test_a_model_that_is_no_llm_cannot_write() -> None:
    with pytest.raises(CalibrationDataError, match="token ids"):
        generated_token_windows(ir.serde.deserialize_model(mlp()))


@pytest.mark.slow
def test_the_builder_model_writes_through_its_kv_cache() -> None:
    if not BUILDER.exists():
        pytest.skip(f"{BUILDER} is absent (build it with ../shared/zoo/genai/build.sh)")
    model = load_model(BUILDER)
    ids = generated_token_windows(model, windows=2, length=24)
    assert ids.shape == (2, 24) and ids.max() < 49152
    # the cached steps agree with re-running the prefix: the last token's logits from both paths match
    from onnxprec._ort import create_session
    from onnxprec.llm_inputs import LLMInputs

    llm = LLMInputs.of(model)
    assert llm is not None and llm.has_past
    session = create_session(model)
    (full,) = session.run(llm.complete({"input_ids": ids}), ["logits"])
    assert np.isfinite(full).all()
    # each sampled token had a real probability under the prefix (not noise): log-prob above that of a uniform draw
    logp = full[:, :-1] - np.log(np.exp(full[:, :-1] - full[:, :-1].max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp -= full[:, :-1].max(-1, keepdims=True)
    chosen = np.take_along_axis(logp, ids[:, 1:, None], axis=-1)
    assert float(chosen.mean()) > -np.log(49152)


@pytest.mark.slow
def test_the_in_place_cache_writes_the_same_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    if not BUILDER.exists():
        pytest.skip(f"{BUILDER} is absent (build it with ../shared/zoo/genai/build.sh)")
    from onnxprec.llm_inputs import LLMInputs
    from onnxprec.quantization import generated

    model = load_model(BUILDER)
    llm = LLMInputs.of(model)
    assert llm is not None and generated._shares_buffer(llm)  # the builder's GroupQueryAttention on every past
    in_place = generated_token_windows(model, windows=3, length=40, seed=3)
    monkeypatch.setattr(generated, "_shares_buffer", lambda llm: False)  # a past and a new present at each step
    np.testing.assert_array_equal(in_place, generated_token_windows(model, windows=3, length=40, seed=3))
