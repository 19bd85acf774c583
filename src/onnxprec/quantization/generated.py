"""Calibration text an LLM writes itself, for users without data (sampled token windows, KV cache reused).

Random token ids are not text: a quantized model's error on them says little about its error on text (a size budget
chosen on them can be worse than a uniform choice). The model's own samples are text in its distribution:
each window starts from a random token and continues with tokens sampled from the model at temperature 1, one
decoding step per token through the model's past key/value inputs (or by re-running the prefix when it has none).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxprec._ort import create_session
from onnxprec.errors import CalibrationDataError
from onnxprec.llm_inputs import LLMInputs

__all__ = ["generated_token_windows"]

logger = logging.getLogger(__name__)


def _sample(logits: np.ndarray, rng: np.random.Generator, temperature: float) -> np.ndarray:
    """One token per row of ``logits`` ``[B, V]``, sampled at ``temperature``."""
    scaled = logits.astype(np.float64) / temperature
    scaled -= scaled.max(axis=1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=1, keepdims=True)
    cumulative = probs.cumsum(axis=1)
    draws = rng.random((logits.shape[0], 1)) * cumulative[:, -1:]
    return (cumulative < draws).sum(axis=1).astype(np.int64)


def generated_token_windows(
    model: ir.Model,
    windows: int = 8,
    length: int = 256,
    *,
    seed: int = 0,
    temperature: float = 1.0,
    providers: Sequence[str] | None = None,
    writer: ir.Model | None = None,
) -> np.ndarray:
    """``windows`` token windows ``[windows, length]`` (int64) sampled from ``model`` (an LLM with a ``logits`` output).

    ``writer``: the model whose session samples the tokens, with ``model``'s inputs and outputs (a quantized copy of
    a large ``model``: one session holds all the weights it runs); default ``model`` itself.

    Raises:
        CalibrationDataError: The model has no token ids input, no ``logits`` output or an unknown vocabulary size.
    """
    llm = LLMInputs.of(model)
    if llm is None or not any(v.name == "logits" for v in model.graph.outputs):
        raise CalibrationDataError(
            "The model has no token ids input and logits output: it cannot write calibration text."
        )
    vocab = llm.vocab_size()
    if vocab is None:
        raise CalibrationDataError("The model's vocabulary size is unknown: it cannot write calibration text.")
    rng = np.random.default_rng(seed)
    session = create_session(
        model if writer is None else writer,
        providers=providers,
        optimization="all",
        what="the model writing calibration text",
    )
    ids = rng.integers(0, vocab, (windows, 1))
    name = llm.ids.name
    if llm.has_past:
        presents = llm.presents()
        fetches = ["logits", *presents.values()]
        feeds = llm.complete({name: ids})
        for _ in range(length - 1):
            outputs = session.run(feeds, fetches)
            token = _sample(outputs[0][:, -1], rng, temperature)
            ids = np.concatenate([ids, token[:, None]], axis=1)
            past = dict(zip(presents, outputs[1:]))
            del outputs
            feeds = llm.complete({name: token[:, None]}, past=past, past_length=ids.shape[1] - 1)
    else:
        for _ in range(length - 1):
            (logits,) = session.run(llm.complete({name: ids}), ["logits"])
            token = _sample(logits[:, -1], rng, temperature)
            ids = np.concatenate([ids, token[:, None]], axis=1)
    del session
    logger.info("The model wrote %d calibration windows of %d tokens", windows, length)
    return ids
