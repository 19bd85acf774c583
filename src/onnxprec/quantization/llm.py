"""Calibration (and evaluation) feeds for causal language models, from token ids or text.

:func:`llm_feeds` cuts a token stream into windows of ``seq_len`` tokens and builds every input the model declares:
``input_ids``, ``attention_mask`` (ones), ``position_ids`` / ``cache_position`` (``0..S-1``), ``token_type_ids``
(zeros) and, for models exported with a KV cache, empty ``past_key_values`` tensors (past length 0) whose names,
element types (FP16 for FP16 models) and head sizes are read from the model's inputs. A tokenizer is optional: pass
pre-tokenized ids, or text with any tokenizer object (``transformers``, ``tokenizers`` or a callable).
The same feeds serve perplexity evaluation (``logits[:, :-1]`` against ``input_ids[:, 1:]``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxprec._io import ModelSource, load_model
from onnxprec.calibration import InputSpec, input_specs
from onnxprec.errors import CalibrationDataError, InvalidArgumentError

__all__ = ["llm_feeds", "token_windows"]

logger = logging.getLogger(__name__)

_PAST = re.compile(r"past|cache|present", re.I)
_PAST_LEN = re.compile(r"past|cache|total|kv|seq|len", re.I)
_DEFAULT_SEQ_LEN = 256


def _encode(text: str | Sequence[str], tokenizer: Any) -> list[int]:
    """Token ids of ``text`` from a ``transformers``/``tokenizers`` tokenizer or a callable returning ids."""
    texts = [text] if isinstance(text, str) else list(text)
    ids: list[int] = []
    for item in texts:
        encoded: Any
        if hasattr(tokenizer, "encode"):
            encoded = tokenizer.encode(item)
        elif callable(tokenizer):
            encoded = tokenizer(item)
        else:
            raise InvalidArgumentError("tokenizer must have encode(text) or be a callable returning token ids.")
        if isinstance(encoded, dict) or hasattr(encoded, "keys"):
            encoded = encoded["input_ids"]
        if hasattr(encoded, "ids"):  # tokenizers.Encoding
            encoded = encoded.ids
        ids.extend(int(i) for i in np.asarray(encoded).reshape(-1))
    return ids


def token_windows(ids: Any, seq_len: int, max_windows: int | None = None) -> np.ndarray:
    """``[windows, seq_len]`` int64 windows cut from ``ids`` (a 1-D stream, or rows that are concatenated).

    The tail shorter than ``seq_len`` is dropped, unless the stream holds less than one window (then the one window
    is the whole stream).
    """
    stream = np.asarray(ids, dtype=np.int64).reshape(-1)
    if stream.size == 0:
        raise InvalidArgumentError("No token ids: pass a non-empty token_ids or text.")
    if seq_len < 1:
        raise InvalidArgumentError(f"seq_len must be positive, got {seq_len}.")
    if stream.size < seq_len:
        logger.warning("Only %d tokens: one window shorter than seq_len=%d", stream.size, seq_len)
        return stream[None, :]
    count = stream.size // seq_len
    if max_windows is not None:
        count = min(count, max_windows)
    return stream[: count * seq_len].reshape(count, seq_len)


def _static_seq_len(specs: list[InputSpec]) -> int | None:
    for spec in specs:
        if "input_ids" in spec.name and len(spec.dims) == 2 and isinstance(spec.dims[1], int) and spec.dims[1] > 0:
            return spec.dims[1]
    return None


def _past_shape(spec: InputSpec, batch: int) -> tuple[int, ...]:
    """Shape of an empty KV-cache input: batch, past length 0, other dims static."""
    shape = []
    past_axis = None
    for axis, dim in enumerate(spec.dims):
        if isinstance(dim, int) and dim >= 0:
            shape.append(dim)
        elif axis == 0:
            shape.append(batch)
        elif past_axis is None and (dim is None or _PAST_LEN.search(str(dim))):
            shape.append(0)
            past_axis = axis
        else:
            raise CalibrationDataError(
                f"Cannot size the KV-cache input {spec.describe()}: its dim '{dim}' is dynamic; export the model with "
                "static head counts and sizes, or pass the feeds yourself."
            )
    if past_axis is None and 0 not in shape[1:]:
        raise CalibrationDataError(f"Cannot find the past-length axis of the KV-cache input {spec.describe()}.")
    return tuple(shape)


def _feed(spec: InputSpec, window: np.ndarray) -> np.ndarray:
    batch, seq = window.shape
    name = spec.name.lower()
    dtype = spec.dtype
    if _PAST.search(name) and np.issubdtype(dtype, np.floating):
        return np.zeros(_past_shape(spec, batch), dtype=dtype)
    if np.issubdtype(dtype, np.bool_):
        dims = [d if isinstance(d, int) and d > 0 else (batch if i == 0 else 1) for i, d in enumerate(spec.dims)]
        return np.zeros(dims, dtype=dtype)
    if not np.issubdtype(dtype, np.integer):
        raise CalibrationDataError(
            f"llm_feeds cannot build the input {spec.describe()} (not token ids, a mask, positions or a KV cache): "
            "pass the feeds yourself."
        )
    if "mask" in name:
        return np.ones((batch, seq), dtype=dtype)
    if "position" in name:
        positions = np.broadcast_to(np.arange(seq, dtype=dtype), (batch, seq))
        return positions[0].copy() if len(spec.dims) == 1 else positions.copy()
    if "type" in name or "segment" in name:
        return np.zeros((batch, seq), dtype=dtype)
    if "ids" in name or "input" in name or "token" in name:
        return window.astype(dtype)
    raise CalibrationDataError(
        f"llm_feeds cannot build the input {spec.describe()}: pass the feeds yourself (a list of dicts)."
    )


def llm_feeds(
    model_or_path: ModelSource,
    token_ids: Any = None,
    *,
    text: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    seq_len: int | None = None,
    max_windows: int | None = None,
    batch_size: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Feed dicts of token windows for a causal LM, for calibration or evaluation.

    Args:
        model_or_path: The model (path, ``onnx.ModelProto`` or ``onnx_ir.Model``); only its inputs are read.
        token_ids: Pre-tokenized ids: a 1-D stream, or 2-D rows (concatenated into one stream).
        text: Text to tokenize with ``tokenizer`` instead (a string or several).
        tokenizer: Anything with ``encode(text)`` (``transformers``, ``tokenizers``) or a callable returning ids.
        seq_len: Tokens per window (default: the model's static sequence length, else 256).
        max_windows: At most this many windows.
        batch_size: Windows per feed dict.

    Returns:
        One dict per batch of windows with every input of the model; integer inputs in the model's integer type,
        KV-cache inputs empty (past length 0) in the model's float type.

    Raises:
        InvalidArgumentError: No ids, or text without a tokenizer.
        CalibrationDataError: An input that cannot be built (the message names it).
    """
    if (token_ids is None) == (text is None):
        raise InvalidArgumentError("Pass exactly one of token_ids or text (with a tokenizer).")
    if text is not None:
        if tokenizer is None:
            raise InvalidArgumentError("text needs a tokenizer (anything with encode(text)); or pass token_ids.")
        token_ids = _encode(text, tokenizer)
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be positive, got {batch_size}.")
    specs = input_specs(load_model(model_or_path))
    length = seq_len or _static_seq_len(specs) or _DEFAULT_SEQ_LEN
    windows = token_windows(token_ids, length, max_windows)
    feeds = []
    for start in range(0, windows.shape[0], batch_size):
        window = windows[start : start + batch_size]
        feeds.append({spec.name: _feed(spec, window) for spec in specs})
    logger.info("%d feed(s) of %d window(s) x %d tokens", len(feeds), windows.shape[0], windows.shape[1])
    return feeds
