"""LLM inputs: what a causal language model's feeds need besides its token ids, read from the model.

:class:`LLMInputs` reads a decoder's inputs once (its token ids, ``attention_mask``, ``position_ids`` /
``cache_position``, ``token_type_ids``, boolean cache flags and the past key/value inputs) and completes a batch
that holds only token ids:

- ``attention_mask``: ones over the total (past + current) length;
- ``position_ids`` (when the model asks for them): from the mask, ``cumsum - 1`` (padding gets 1, as Hugging
  Face's ``generate`` does); ``cache_position``: ``past .. total - 1``;
- past keys/values: empty (past length 0), or given (the ``present.*`` outputs of a prefix run), in the element
  type and layout the model declares. A symbolic head count or head size (builder models:
  ``[batch_size, 3, past_sequence_length, kv_cache_dim]``) is resolved from the matching ``present.*`` output,
  from the GroupQueryAttention / MultiHeadAttention / Attention node that reads the input (its head counts and
  the width of its query, found through the graph), or from ``genai_config.json`` beside the model. A
  sliding-window GroupQueryAttention cache (``sliding_window_cache``) is a ring of ``local_window_size`` positions
  (an empty one too; the mask says what is valid); a past input without a past-length axis (a convolution state)
  is zeros of its static shape.

A batch is completed only when it gives every past input or none; some but not all is an error naming the
missing ones. Windows longer than the model's context (``context_length`` in ``genai_config.json``, else the
rows of the rotary cos cache or of the position embedding table) are an error too. :func:`token_windows` cuts a
token stream into windows, and :func:`llm_feeds` makes whole feed dicts from ids or text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec import _genai
from onnxprec._genai import GENAI_CONFIG
from onnxprec._io import ModelSource, load_model, model_file
from onnxprec.calibration import InputSpec, gather_table_rows, input_specs, split_batch
from onnxprec.errors import CalibrationDataError, InvalidArgumentError

__all__ = ["LLMInputs", "llm_feeds", "read_token_ids", "token_windows"]

logger = logging.getLogger(__name__)

_PAST = re.compile(r"past|cache", re.I)
_PAST_AXIS = re.compile(r"past|seq|len|total|time|step", re.I)
_DEFAULT_SEQ_LEN = 256
# Attention ops that read a KV cache: op type -> the input slots of the past key and value.
_ATTENTION = {"GroupQueryAttention": (3, 4), "MultiHeadAttention": (6, 7), "Attention": (4, 5)}
_PASS_THROUGH = ("Cast", "Identity")
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Cast", "Identity", "DequantizeLinear", "QuantizeLinear")


@dataclass(frozen=True)
class _Past:
    """A past input: its spec, past-length axis (None: a state of fixed size, e.g. a convolution's), sizes (batch
    and past axes 0), present output, and ring size (a sliding-window cache: the past is a buffer of that many
    positions, its valid part given by the mask)."""

    spec: InputSpec
    axis: int | None
    sizes: tuple[int, ...]
    present: str | None
    ring: int = 0

    def shape(self, batch: int, length: int) -> tuple[int, ...]:
        sizes = list(self.sizes)
        if not (isinstance(self.spec.dims[0], int) and self.spec.dims[0] > 0):
            sizes[0] = batch
        if self.axis is not None:
            sizes[self.axis] = max(length, self.ring)
        return tuple(sizes)


def _ids_spec(specs: list[InputSpec]) -> InputSpec | None:
    """The token ids input: ``input_ids``, else a rank-2 integer input named like token ids."""
    for spec in specs:
        if spec.name == "input_ids":
            return spec
    for spec in specs:
        name = spec.name.lower()
        other = any(word in name for word in ("position", "type", "segment", "mask"))
        named = ("ids" in name or "token" in name) and not other
        if named and len(spec.dims) == 2 and np.issubdtype(spec.dtype, np.integer):
            return spec
    return None


def _is_past(spec: InputSpec) -> bool:
    return bool(_PAST.search(spec.name)) and spec.kind == "tensor" and len(spec.dims) >= 3


class LLMInputs:
    """The inputs of a causal LM: which ones a batch of token ids lacks, and how to build them.

    Use :meth:`of` (None for a model without a token ids input).
    """

    def __init__(self, model: ir.Model, specs: list[InputSpec], ids: InputSpec) -> None:
        self.model = model
        self.specs = specs
        self.ids = ids
        self.past_specs = [s for s in specs if s is not ids and _is_past(s)]
        self._config: dict[str, Any] | None = None
        self._past: list[_Past] | None = None
        self._context: tuple[int, str] | bool | None = False  # False: not computed yet

    @classmethod
    def of(cls, model: ir.Model, specs: list[InputSpec] | None = None) -> LLMInputs | None:
        """The LLM inputs of ``model``, or None when it has no token ids input."""
        specs = specs if specs is not None else input_specs(model)
        ids = _ids_spec(specs)
        return cls(model, specs, ids) if ids is not None else None

    @property
    def has_past(self) -> bool:
        return bool(self.past_specs)

    # ----------------------------------------------------------------------------------------------
    # What to build

    def buildable(self, spec: InputSpec) -> bool:
        """Whether :meth:`complete` can build ``spec`` from token ids (a mask, positions, token types, a cache
        flag or a past key/value)."""
        name = spec.name.lower()
        if spec in self.past_specs:
            return True
        if spec.kind != "tensor" or spec is self.ids:
            return False
        if spec.dtype == np.bool_:
            return True
        if "mask" in name:
            return np.issubdtype(spec.dtype, np.number)
        integer = np.issubdtype(spec.dtype, np.integer)
        return integer and ("position" in name or "type" in name or "segment" in name)

    def plan(self, given: Collection[str]) -> frozenset[str]:
        """The inputs to build for data that holds ``given`` (empty when the data is complete, or when it lacks an
        input that cannot be built: validation then names it).

        Raises:
            CalibrationDataError: The data gives some past inputs but not all of them.
        """
        past = [s.name for s in self.past_specs]
        absent = [name for name in past if name not in given]
        if absent and len(absent) < len(past):
            raise CalibrationDataError(
                f"The data gives {len(past) - len(absent)} of the model's {len(past)} past key/value inputs and "
                f"lacks {', '.join(absent)}: give every past input, or none (then they are built from input_ids)."
            )
        missing = [s for s in self.specs if s.name not in given]
        if not missing or self.ids.name not in given or not all(self.buildable(s) for s in missing):
            return frozenset()
        return frozenset(s.name for s in missing)

    # ----------------------------------------------------------------------------------------------
    # Building

    def complete(
        self, batch: Mapping[str, Any], past: Mapping[str, np.ndarray] | None = None, past_length: int | None = None
    ) -> dict[str, Any]:
        """``batch`` with every input it lacks built from its token ids (see the module docstring).

        Args:
            batch: At least the token ids ``[batch, sequence]``; inputs it holds are kept.
            past: Past keys/values for the inputs the batch lacks (e.g. a prefix run's ``present.*``, by past input
                name); None: empty ones.
            past_length: The tokens ``past`` holds (default: the past-length axis of a past that is not a
                sliding-window ring buffer or a fixed-size state).

        Raises:
            CalibrationDataError: An input that cannot be built, a KV cache that cannot be sized, a mask that does
                not cover the past and current tokens, or windows longer than the model's context.
        """
        ids = np.asarray(batch[self.ids.name])
        if ids.ndim != 2:
            raise CalibrationDataError(
                f"Token ids '{self.ids.name}' have shape {list(ids.shape)}: give [batch, sequence] windows."
            )
        size, length = ids.shape
        feeds = dict(batch)
        feeds[self.ids.name] = ids.astype(self.ids.dtype, copy=False)
        known = 0 if not past else past_length
        for layout in self._layouts() if any(s.name not in feeds for s in self.past_specs) else []:
            given = None if past is None else past.get(layout.spec.name)
            if given is None:
                feeds[layout.spec.name] = np.zeros(layout.shape(size, 0), dtype=layout.spec.dtype)
                continue
            feeds[layout.spec.name] = np.asarray(given).astype(layout.spec.dtype, copy=False)
            if known is None and layout.axis is not None and not layout.ring:
                known = int(feeds[layout.spec.name].shape[layout.axis])
        past_length = known or 0
        mask = self._mask(feeds, size, past_length + length)
        self.check_length(past_length + length)
        for spec in self.specs:
            if spec.name in feeds:
                continue
            if not self.buildable(spec):
                raise CalibrationDataError(
                    f"Cannot build the input {spec.describe()} from token ids (not a mask, positions, token types, a "
                    "cache flag or a KV cache): pass it in the data."
                )
            feeds[spec.name] = self._build(spec, mask, size, length, past_length)
        order = {s.name: i for i, s in enumerate(self.specs)}
        return dict(sorted(feeds.items(), key=lambda item: order.get(item[0], len(order))))

    def _mask(self, feeds: dict[str, Any], size: int, total: int) -> np.ndarray:
        """The attention mask over ``total`` tokens: the batch's own (checked), else ones (added to the feeds)."""
        spec = next((s for s in self.specs if "mask" in s.name.lower() and s is not self.ids), None)
        if spec is None or spec.name not in feeds:
            mask = np.ones((size, total), dtype=np.int64)
            if spec is not None and self.buildable(spec):
                feeds[spec.name] = mask.astype(spec.dtype)
            return mask
        mask = np.asarray(feeds[spec.name])
        if mask.ndim == 2 and mask.shape[-1] != total:
            raise CalibrationDataError(
                f"'{spec.name}' covers {mask.shape[-1]} tokens, the past and current tokens are {total}: give a mask "
                "over both, or leave it out (ones are built)."
            )
        return mask

    def _build(self, spec: InputSpec, mask: np.ndarray, size: int, length: int, past_length: int) -> np.ndarray:
        name = spec.name.lower()
        if spec.dtype == np.bool_:  # a cache flag (Optimum's use_cache_branch): whether a past is given
            dims = [d if isinstance(d, int) and d > 0 else (size if i == 0 else 1) for i, d in enumerate(spec.dims)]
            return np.full(dims, past_length > 0, dtype=np.bool_)
        if "position" in name and "cache" in name:
            return np.arange(past_length, past_length + length, dtype=spec.dtype)
        if "position" in name:
            positions = np.cumsum(mask.astype(np.int64), axis=-1) - 1
            positions[mask == 0] = 1  # as Hugging Face's generate does for padding
            positions = positions[:, -length:].astype(spec.dtype)
            return positions[0].copy() if len(spec.dims) == 1 else positions
        return np.zeros((size, length), dtype=spec.dtype)  # token types

    # ----------------------------------------------------------------------------------------------
    # The KV cache's layout

    def _layouts(self) -> list[_Past]:
        if self._past is None:
            self._past = [self._layout(spec) for spec in self.past_specs]
        return self._past

    def _layout(self, spec: InputSpec) -> _Past:
        dims = spec.dims
        axis = next((a for a, d in enumerate(dims) if a and isinstance(d, str) and _PAST_AXIS.search(d)), None)
        if axis is None:
            axis = next((a for a, d in enumerate(dims) if a and not isinstance(d, int)), None)
        if axis is None and not all(isinstance(d, int) and d >= 0 for d in dims[1:]):
            raise CalibrationDataError(
                f"Cannot find the past-length axis of the KV-cache input {spec.describe()}: pass it in the data."
            )
        attention = _attention_of(spec.value)
        present = self._present(spec, attention)
        present_dims = self._output_dims(present)
        decoder = self.config().get("decoder", {})
        sizes = []
        for a, dim in enumerate(dims):
            if a in (0, axis) or (isinstance(dim, int) and dim >= 0):
                sizes.append(dim if isinstance(dim, int) and a != axis and dim >= 0 else 0)
                continue
            size = present_dims[a] if present_dims is not None and len(present_dims) == len(dims) else None
            last = a == len(dims) - 1
            if not isinstance(size, int) and attention is not None and len(dims) == 4:
                size = attention[1] if last else attention[0]
            if not isinstance(size, int) and len(dims) == 4:
                size = decoder.get("head_size" if last else "num_key_value_heads")
            if not isinstance(size, int) or size <= 0:
                raise CalibrationDataError(
                    f"Cannot size the KV-cache input {spec.describe()}: its dim '{dim}' is not static, not in the "
                    f"present outputs, the attention node's head counts or {GENAI_CONFIG}; pass every past input in "
                    "the data."
                )
            sizes.append(size)
        ring = 0
        sliding: int = attention[2].attributes.get_int("sliding_window_cache", 0) if attention is not None else 0
        if attention is not None and sliding:
            ring = max(0, attention[2].attributes.get_int("local_window_size", 0))
        logger.debug("Past %s: %s (past axis %s, ring %d, present %s)", spec.name, sizes, axis, ring, present)
        return _Past(spec, axis, tuple(sizes), present, ring)

    def _present(self, spec: InputSpec, attention: tuple[int, int, ir.Node, int] | None) -> str | None:
        """The graph output that holds this past input's updated cache."""
        outputs = {str(v.name) for v in self.model.graph.outputs}
        if attention is not None:
            node, slot = attention[2], attention[3]
            index = 1 + _ATTENTION[node.op_type].index(slot)
            if index < len(node.outputs) and str(node.outputs[index].name) in outputs:
                return str(node.outputs[index].name)
        names = self.config().get("decoder", {})
        candidates = []
        for kind in ("key", "value"):
            past_pattern = names.get("inputs", {}).get(f"past_{kind}_names")
            present_pattern = names.get("outputs", {}).get(f"present_{kind}_names")
            if isinstance(past_pattern, str) and isinstance(present_pattern, str) and "%d" in past_pattern:
                match = re.fullmatch(re.escape(past_pattern).replace("%d", r"(\d+)"), spec.name)
                if match and "%d" in present_pattern:
                    candidates.append(present_pattern.replace("%d", match.group(1)))
        candidates += [spec.name.replace("past_key_values", "present"), re.sub("past", "present", spec.name)]
        return next((name for name in candidates if name in outputs), None)

    def _output_dims(self, name: str | None) -> tuple[int | str | None, ...] | None:
        value = next((v for v in self.model.graph.outputs if v.name == name), None)
        if value is None or value.shape is None:
            return None
        return tuple(d if isinstance(d, int) else None for d in value.shape)

    def presents(self) -> dict[str, str]:
        """Past input name -> the graph output holding its updated cache (for a prefix run).

        Raises:
            CalibrationDataError: A past input without a matching ``present`` output.
        """
        result = {}
        for layout in self._layouts():
            if layout.present is None:
                raise CalibrationDataError(
                    f"No graph output holds the updated cache of '{layout.spec.name}': a filled past needs the "
                    "model's present.* outputs (use past_length=0)."
                )
            result[layout.spec.name] = layout.present
        return result

    # ----------------------------------------------------------------------------------------------
    # Context and vocabulary

    def config(self) -> dict[str, Any]:
        """``model`` of the ``genai_config.json`` beside the model file ({} when there is none).

        Raises:
            ModelLoadError: The config exists but is not readable (``_genai.read_config`` says how to fix it).
        """
        if self._config is None:
            path = model_file(self.model)
            folder = _genai.genai_folder(path) if path is not None else None
            self._config = _genai.read_config(folder)["model"] if folder is not None else {}
        return self._config

    def context(self) -> tuple[int, str] | None:
        """The longest window the model takes and where that comes from, or None when nothing says."""
        if self._context is False:
            self._context = self._find_context()
        return self._context  # type: ignore[return-value]

    def _find_context(self) -> tuple[int, str] | None:
        length = self.config().get("context_length")
        if isinstance(length, int) and length > 0:
            return length, f"context_length in {GENAI_CONFIG}"
        limits = []
        for node in self.model.graph:
            slot = {"GroupQueryAttention": 7, "RotaryEmbedding": 2}.get(node.op_type)
            if slot is None or len(node.inputs) <= slot or node.inputs[slot] is None:
                continue
            if node.op_type == "GroupQueryAttention" and not node.attributes.get_int("do_rotary", 0):
                continue
            cache = node.inputs[slot]
            assert cache is not None
            rows = cache.shape[0] if cache.shape is not None and len(cache.shape) else None
            if isinstance(rows, int):
                limits.append((rows, f"the rows of {node.op_type}'s cos cache '{cache.name}'"))
        positions = next((s for s in self.specs if "position" in s.name.lower() and "cache" not in s.name), None)
        rows = gather_table_rows(positions.value) if positions is not None else None
        if rows is not None:
            limits.append((rows, "the rows of the position embedding table"))
        return min(limits, key=lambda limit: limit[0]) if limits else None

    def check_length(self, total: int) -> None:
        """Raises a one-line error when ``total`` (past + current) tokens exceed the model's context."""
        context = self.context()
        if context is not None and total > context[0]:
            raise CalibrationDataError(
                f"Windows of {total} tokens are longer than the model's context of {context[0]} tokens ({context[1]}): "
                f"cut the token ids into windows of at most {context[0]} tokens."
            )

    def vocab_size(self) -> int | None:
        """How many token ids the model knows: its embedding table's rows, its logits' width or the config's."""
        rows = gather_table_rows(self.ids.value)
        if rows is None:
            logits = next((v for v in self.model.graph.outputs if "logits" in str(v.name)), None)
            last = logits.shape[-1] if logits is not None and logits.shape is not None and len(logits.shape) else None
            rows = last if isinstance(last, int) else None
        size = self.config().get("vocab_size")
        return rows if rows is not None else (size if isinstance(size, int) and size > 0 else None)


def _attention_of(value: ir.Value, depth: int = 3) -> tuple[int, int, ir.Node, int] | None:
    """(heads, head size, node, slot) of the attention node that reads the past input ``value`` (through Casts)."""
    for use in value.uses():
        node = use.node
        if node.op_type in _PASS_THROUGH and depth:
            found = _attention_of(node.outputs[0], depth - 1)
            if found is not None:
                return found
        if node.op_type not in _ATTENTION or use.idx not in _ATTENTION[node.op_type]:
            continue
        sizes = _head_sizes(node)
        if sizes is not None:
            return (*sizes, node, use.idx)
    return None


def _head_sizes(node: ir.Node) -> tuple[int, int] | None:
    """(KV heads, head size) of an attention node, from its head counts and the width of its query."""
    attrs = node.attributes
    query = node.inputs[0] if node.inputs else None
    if query is None:
        return None
    if node.op_type == "Attention":  # ONNX, opset 23: Q [B, S, q_heads * H] or [B, q_heads, S, H]
        heads, kv_heads = attrs.get_int("q_num_heads", 0), attrs.get_int("kv_num_heads", 0)
    else:
        heads = attrs.get_int("num_heads", 0)
        kv_heads = attrs.get_int("kv_num_heads", heads) if node.op_type == "GroupQueryAttention" else heads
    if heads <= 0 or kv_heads <= 0:
        return None
    rank = len(query.shape) if query.shape is not None else 3
    width = _last_dim(query)
    if width is None:
        return None
    if rank in (4, 5):  # heads already split: the last axis is the head size
        return kv_heads, width
    packed = node.op_type == "GroupQueryAttention" and (len(node.inputs) < 2 or node.inputs[1] is None)
    parts = heads + 2 * kv_heads if packed else heads
    return (kv_heads, width // parts) if width % parts == 0 else None


def _last_dim(value: ir.Value, depth: int = 6) -> int | None:
    """The size of ``value``'s last axis: declared, else found through the nodes that produce it."""
    if value.shape is not None and len(value.shape) and isinstance(value.shape[-1], int):
        return value.shape[-1]
    const = value.const_value
    if const is not None and const.shape is not None and len(const.shape) and isinstance(const.shape[-1], int):
        return const.shape[-1]
    node = value.producer()
    if node is None or depth == 0:
        return None
    if node.op_type == "MatMulNBits":
        return node.attributes.get_int("N", 0) or None
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and node.inputs[1] is not None:
        weight = node.inputs[1]
        transposed: int = node.attributes.get_int("transB", 0)
        if node.op_type == "Gemm" and transposed:
            shape = weight.shape if weight.shape is not None else None
            return shape[0] if shape is not None and isinstance(shape[0], int) else None
        return _last_dim(weight, depth - 1)
    if node.op_type in _ELEMENTWISE:
        for source in node.inputs:
            size = _last_dim(source, depth - 1) if source is not None else None
            if size is not None and size > 1:
                return size
    return None


# --------------------------------------------------------------------------------------------------
# Token windows and whole feeds


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
        model_or_path: The model (path, ``onnx.ModelProto`` or ``onnx_ir.Model``); only its inputs are read (and
            ``genai_config.json`` beside a model file).
        token_ids: Pre-tokenized ids: a 1-D stream, or 2-D rows (concatenated into one stream).
        text: Text to tokenize with ``tokenizer`` instead (a string or several).
        tokenizer: Anything with ``encode(text)`` (``transformers``, ``tokenizers``) or a callable returning ids.
        seq_len: Tokens per window (default: the model's static sequence length, else 256).
        max_windows: At most this many windows.
        batch_size: Windows per feed dict.

    Returns:
        One dict per batch of windows with every input of the model (see :class:`LLMInputs`): integer inputs in
        the model's integer type, KV-cache inputs empty (past length 0) in the model's float type.

    Raises:
        InvalidArgumentError: No ids, or text without a tokenizer.
        CalibrationDataError: An input that cannot be built, or windows longer than the model's context.
    """
    if (token_ids is None) == (text is None):
        raise InvalidArgumentError("Pass exactly one of token_ids or text (with a tokenizer).")
    if text is not None:
        if tokenizer is None:
            raise InvalidArgumentError("text needs a tokenizer (anything with encode(text)); or pass token_ids.")
        token_ids = _encode(text, tokenizer)
    if batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be positive, got {batch_size}.")
    model = load_model(model_or_path)
    specs = input_specs(model)
    inputs = LLMInputs.of(model, specs)
    if inputs is None:
        raise CalibrationDataError(
            f"llm_feeds needs a causal LM with a token ids input; the model's inputs are "
            f"{[s.describe() for s in specs]}: pass the feeds yourself (a list of dicts)."
        )
    static = inputs.ids.dims[1] if isinstance(inputs.ids.dims[1], int) and inputs.ids.dims[1] > 0 else None
    windows = token_windows(token_ids, seq_len or static or _DEFAULT_SEQ_LEN, max_windows)
    feeds = [inputs.complete(batch) for batch in split_batch({inputs.ids.name: windows}, batch_size)]
    logger.info("%d feed(s) of %d window(s) x %d tokens", len(feeds), windows.shape[0], windows.shape[1])
    return feeds


def read_token_ids(path: Path) -> np.ndarray:
    """Token windows ``[N, seq]`` from an ``.npy`` file, as int64."""
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise CalibrationDataError(
            f"Cannot read token ids from '{path}' ({type(e).__name__}): save them with np.save."
        ) from None
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise CalibrationDataError(
            f"'{path}' holds {ids.dtype} {list(ids.shape)}: token windows are integer ids of shape [N, seq]."
        )
    return np.asarray(ids, dtype=np.int64)
