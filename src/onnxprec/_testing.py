"""Helpers for tests: tiny hand-built models, ORT runs (through :mod:`onnxprec._ort`), and ../shared data."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxprec._ort import create_session

__all__ = ["SHARED", "make_genai_folder", "make_model", "run", "shared_path", "tensor_info"]

F = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
BF16 = TensorProto.BFLOAT16

# ../shared beside the project root (tests skip when it is absent, e.g. on a fresh clone)
SHARED = Path(os.environ.get("ONNXPREC_SHARED", Path(__file__).resolve().parents[3] / "shared"))


def shared_path(*parts: str) -> Path | None:
    """A path under ../shared, or None when it does not exist."""
    path = SHARED.joinpath(*parts)
    return path if path.exists() else None


def tensor_info(name: str, elem_type: int = F, shape: Sequence[int | str | None] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    *,
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
    ir_version: int = 8,
) -> onnx.ModelProto:
    """A checked model from nodes and numpy initializers."""
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def run(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs a model on ONNX Runtime CPU (default optimizations); float inputs are cast to the model's input
    types, and BF16/FP8 outputs come back as ml_dtypes arrays (see :class:`onnxprec._ort.Session`)."""
    return create_session(model, optimization="all", what="the test model").run(feeds)


def _byte_level_tokenizer() -> dict:
    """A byte-level BPE ``tokenizer.json`` without merges: 3 special tokens, then one token per byte (GPT-2's map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    chars = {b: chr(b if b in printable else next(extra)) for b in range(256)}
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate([*specials, *(chars[b] for b in range(256))])}
    level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, s in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def make_genai_folder(
    folder: Path, *, name: str = "model.onnx", tokenizer: bool = True, provider: str = "cpu", seed: int = 0
) -> Path:
    """A tiny decoder that onnxruntime-genai loads and generates with, in ``folder`` with its genai_config.json.

    One layer: token embedding, K/V projections appended to the past KV (``past_key_values.0.key/value``
    ``[batch, 1, past, 16]`` -> ``present.0.*``), the mean of the values mixed back in, and ``logits`` over 260 ids
    (ids 3-258 are bytes with the byte-level ``tokenizer.json`` written when ``tokenizer``). Its MatMul weights
    (K 32 and 16) quantize at block size 16. ``provider``: the config's provider (``cpu`` or ``cuda``).

    Returns:
        The model's path.
    """
    vocab, hidden, head = 260, 32, 16
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {
        "E": rng.standard_normal((vocab, hidden)).astype(np.float32),
        "Wk": (0.3 * rng.standard_normal((hidden, head))).astype(np.float32),
        "Wv": (0.3 * rng.standard_normal((hidden, head))).astype(np.float32),
        "Wc": (0.3 * rng.standard_normal((head, hidden))).astype(np.float32),
        "Wo": rng.standard_normal((hidden, vocab)).astype(np.float32),
        "axis1": np.array([1], np.int64),
        "axis2": np.array([2], np.int64),
    }
    node = helper.make_node
    nodes = [
        node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
        node("MatMul", ["emb", "Wk"], ["k"], name="k_proj"),
        node("Unsqueeze", ["k", "axis1"], ["k4"], name="k_heads"),
        node("Concat", ["past_key_values.0.key", "k4"], ["present.0.key"], axis=2, name="k_cache"),
        node("MatMul", ["emb", "Wv"], ["v"], name="v_proj"),
        node("Unsqueeze", ["v", "axis1"], ["v4"], name="v_heads"),
        node("Concat", ["past_key_values.0.value", "v4"], ["present.0.value"], axis=2, name="v_cache"),
        node("ReduceMean", ["present.0.value", "axis2"], ["mean"], keepdims=1, name="mean"),
        node("Squeeze", ["mean", "axis1"], ["mean3"], name="mean3"),
        node("MatMul", ["mean3", "Wc"], ["context"], name="c_proj"),
        node("Add", ["emb", "context"], ["h"], name="residual"),
        node("MatMul", ["h", "Wo"], ["logits"], name="lm_head"),
    ]
    past: list[int | str | None] = ["batch_size", 1, "past_sequence_length", head]
    total: list[int | str | None] = ["batch_size", 1, "total_sequence_length", head]
    inputs = [
        tensor_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        tensor_info("past_key_values.0.key", F, past),
        tensor_info("past_key_values.0.value", F, past),
    ]
    outputs = [
        tensor_info("logits", F, ["batch_size", "sequence_length", vocab]),
        tensor_info("present.0.key", F, total),
        tensor_info("present.0.value", F, total),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(make_model(nodes, inputs, outputs, weights, opset=18), path)
    providers: list = [] if provider == "cpu" else [{provider: {"enable_cuda_graph": "0"}}]
    config = {
        "model": {
            "bos_token_id": 1,
            "context_length": 64,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": providers},
                "filename": name,
                "head_size": head,
                "hidden_size": hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": 1,
                "num_hidden_layers": 1,
                "num_key_value_heads": 1,
            },
            "eos_token_id": 2,
            "pad_token_id": 2,
            "type": "llama",
            "vocab_size": vocab,
        },
        "search": {"do_sample": False, "max_length": 64, "num_beams": 1, "past_present_share_buffer": False},
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    if tokenizer:
        (folder / "tokenizer.json").write_text(json.dumps(_byte_level_tokenizer()))
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "unk_token": "<unk>",
                    "tokenizer_class": "GPT2Tokenizer",
                    "model_max_length": 64,
                }
            )
        )
        (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return path
