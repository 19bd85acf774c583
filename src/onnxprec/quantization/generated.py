"""Calibration text an LLM writes itself, for users without data (sampled token windows, KV cache reused).

Random token ids are not text: a quantized model's error on them says little about its error on text (a size budget
chosen on them can be worse than a uniform choice). The model's own samples are text in its distribution:
each window starts from a random token and continues with tokens sampled from the model at temperature 1, one
decoding step per token through the model's past key/value inputs (or by re-running the prefix when it has none).
When every past input feeds a GroupQueryAttention, the cache is one buffer per input of all the window's positions,
bound as both the past input and the present output (the kernel writes each new key/value in place, as
onnxruntime-genai's ``past_present_share_buffer``): no second cache, no new one per step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxprec._ort import Session, create_session, import_onnxruntime
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


def _shares_buffer(llm: LLMInputs) -> bool:
    """Whether every past input of ``llm`` is read by a GroupQueryAttention only (no sliding window), whose present
    output has its type: its kernel then updates the past's buffer in place when the present is bound to it."""
    outputs = {str(v.name): v for v in llm.model.graph.outputs}
    for spec, present in llm.presents().items():
        value = next(v for v in llm.model.graph.inputs if v.name == spec)
        uses = list(value.uses())
        out = outputs.get(present)
        if out is None or out.dtype != value.dtype or not uses:
            return False
        for use in uses:
            node = use.node
            if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft" or use.idx not in (3, 4):
                return False
            if node.attributes.get_int("local_window_size", -1) > 0:
                return False
    return True


def _write_in_place(
    session: Session, llm: LLMInputs, ids: np.ndarray, length: int, rng: np.random.Generator, temperature: float
) -> np.ndarray:
    """``ids`` ``[windows, 1]`` continued to ``length`` tokens, each past/present pair bound to one buffer of
    ``length`` positions (GroupQueryAttention reads its valid length from the attention mask)."""
    ort = import_onnxruntime()
    name, presents = llm.ids.name, llm.presents()
    empty = llm.complete({name: ids})
    caches = {}  # the buffers' memory, which their OrtValues share
    buffers = {}
    binding = session.inner.io_binding()
    for past, present in presents.items():
        shape = list(empty[past].shape)
        shape[2] = length
        caches[past] = np.zeros(shape, dtype=empty[past].dtype)
        buffers[past] = ort.OrtValue.ortvalue_from_numpy(caches[past])
        binding.bind_ortvalue_input(past, buffers[past])
        binding.bind_ortvalue_output(present, buffers[past])
    binding.bind_output("logits", "cpu")
    token = ids[:, 0]
    for step in range(length - 1):
        feeds = llm.complete({name: token[:, None]}, past=caches, past_length=step)
        fed = {key: np.ascontiguousarray(a) for key, a in session.feeds(feeds).items() if key not in buffers}
        for key, array in fed.items():  # ``fed`` holds the arrays until the run
            binding.bind_cpu_input(key, array)
        session.inner.run_with_iobinding(binding)
        logits = binding.get_outputs()[len(buffers)].numpy()  # bound after the presents
        token = _sample(logits[:, -1], rng, temperature)
        ids = np.concatenate([ids, token[:, None]], axis=1)
    return ids


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
        spinning=False,  # hundreds of short decoding steps
        what="the model writing calibration text",
    )
    ids = rng.integers(0, vocab, (windows, 1))
    name = llm.ids.name
    if llm.has_past and _shares_buffer(llm):
        ids = _write_in_place(session, llm, ids, length, rng, temperature)
    elif llm.has_past:
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
