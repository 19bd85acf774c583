"""The corpus's torch side. Runs in the torch venv (never imports onnxprec or benchmarks); ``build.py`` calls it as

    <torch-venv>/bin/python _torch_side.py hf     CORPUS ARCH...   # random-weight HF folders: CORPUS/ARCH/hf/
    <torch-venv>/bin/python _torch_side.py export CORPUS ARCH...   # torch.onnx.export with KV: CORPUS/ARCH/torch/
    <torch-venv>/bin/python _torch_side.py check  CORPUS ARCH/EXPORTER...   # ORT vs torch on CORPUS/ids.npy
    <torch-venv>/bin/python _torch_side.py lowp   CORPUS ARCH...   # the model's own FP16/BF16 error: ARCH/lowp.json

Each step writes ``<out>.status.json`` beside its output folder: ``{"ok": bool, "error": first line, ...}``, so one
architecture that fails does not stop the others. Every model: 2 layers, hidden 128, 4 query / 2 KV heads of 32,
intermediate 256, vocab 512 (SmolLM2's tokenizer cut to its first 512 ids), fixed seed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

VOCAB = 512
BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "initializer_range": 0.05,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
}
# architecture name -> (transformers model_type, HF architectures[0], config overrides)
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("llama", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("mistral", "MistralForCausalLM", {"sliding_window": 128}),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {}),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", {"tie_word_embeddings": True}),
    "phi": ("phi", "PhiForCausalLM", {}),
    "phi3": ("phi3", "Phi3ForCausalLM", {"original_max_position_embeddings": 512}),
    "phi3_longrope": (
        "phi3",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 256,
            "rope_parameters": {  # "type" too, as the hub's Phi-3 configs have it (the builder reads it)
                "type": "longrope",
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(16)],
                "long_factor": [1.0 + 0.2 * i for i in range(16)],
            },
        },
    ),
    "phimoe": (
        "phimoe",
        "PhiMoEForCausalLM",  # the hub checkpoints' name, which the builder matches (transformers: Phimoe)
        {
            "num_local_experts": 4,
            "original_max_position_embeddings": 256,
            "rope_parameters": {
                "type": "longrope",
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.05 * i for i in range(16)],
                "long_factor": [1.0 + 0.2 * i for i in range(16)],
                "short_mscale": 1.1,
                "long_mscale": 1.2,
                "original_max_position_embeddings": 256,
            },
        },
    ),
    "gemma": ("gemma", "GemmaForCausalLM", {"tie_word_embeddings": True}),
    "gemma2": ("gemma2", "Gemma2ForCausalLM", {"tie_word_embeddings": True, "sliding_window": 128}),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", {"tie_word_embeddings": True, "sliding_window": 128}),
    "granite": ("granite", "GraniteForCausalLM", {}),
    "granitemoehybrid": (
        "granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
        # attention layers only (as Granite-4.0-micro): the builder has no Mamba layers
        {"layer_types": ["attention", "attention"], "num_local_experts": 4},
    ),
    "olmo": ("olmo", "OlmoForCausalLM", {}),
    "nemotron": ("nemotron", "NemotronForCausalLM", {}),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM", {"tie_word_embeddings": True}),
    "ernie4_5": ("ernie4_5", "Ernie4_5ForCausalLM", {"tie_word_embeddings": True}),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", {}),
    "lfm2": ("lfm2", "Lfm2ForCausalLM", {"layer_types": ["conv", "full_attention"], "tie_word_embeddings": True}),
    "lfm2_moe": (
        "lfm2_moe",
        "Lfm2MoeForCausalLM",
        {"layer_types": ["conv", "full_attention"], "num_experts": 4, "moe_intermediate_size": 64}
        | {"num_dense_layers": 1},
    ),
    "gpt_oss": (
        "gpt_oss",
        "GptOssForCausalLM",
        # its default YaRN (factor 32 over 4096): a YaRN fitted to 512 positions and head 32 trips the builder's
        # assert 0 < low < high < d_half - 1
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128},
    ),
}


def write_status(path: Path, **fields: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fields, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def first_line(e: BaseException) -> str:
    """The line that says why: torch.onnx's exception summary when it has one, else the first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}".strip())
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)[:400]


# ----------------------------------------------------------------------------------------------------------
# HF folders
# ----------------------------------------------------------------------------------------------------------


def small_tokenizer(src: Path, out: Path) -> None:
    """SmolLM2's byte-level BPE tokenizer cut to ids < VOCAB: the special tokens, the 256 bytes and the merges
    whose parts and result all stay under the cut. Every text still encodes (bytes are always there)."""
    tok = json.loads((src / "tokenizer.json").read_text())
    model = tok["model"]
    vocab = {k: v for k, v in model["vocab"].items() if v < VOCAB}
    model["vocab"] = vocab
    model["merges"] = [m for m in model["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < VOCAB]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            (out / name).write_bytes((src / name).read_bytes())


def make_hf(arch: str, out: Path, tokenizer_src: Path) -> dict[str, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, hf_arch, overrides = ARCHS[arch]
    kw = {**BASE, **overrides}
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg.architectures = [hf_arch]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if type(model).__name__ != hf_arch:  # save_pretrained writes the class name; keep the hub checkpoints' name
        saved = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**saved, "architectures": [hf_arch]}, indent=2) + "\n")
    small_tokenizer(tokenizer_src, out)
    return {"params": sum(p.numel() for p in model.parameters()), "class": type(model).__name__}


# ----------------------------------------------------------------------------------------------------------
# torch.onnx.export with a KV cache
# ----------------------------------------------------------------------------------------------------------


class WithPast(nn.Module):
    """(input_ids, attention_mask, position_ids, past K/V per layer) -> (logits, present K/V per layer), the
    input and output names that onnxruntime-genai's builder and Optimum use."""

    def __init__(self, model: nn.Module, n_layers: int) -> None:
        super().__init__()
        self.model = model
        self.n_layers = n_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for i in range(self.n_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def kv_shape(cfg: Any, batch: int, length: int) -> list[int]:
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return [batch, cfg.num_key_value_heads, length, head]


def example(cfg: Any, batch: int = 2, past: int = 3, seq: int = 5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(17, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).expand(batch, seq)
    kv = [torch.randn(kv_shape(cfg, batch, past), generator=g) for _ in range(2 * cfg.num_hidden_layers)]
    return (ids, mask, pos, *kv)


def io_names(n_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(n_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def export_torch(hf: Path, out: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    n = cfg.num_hidden_layers
    wrapper = WithPast(model, n).eval()
    args = example(cfg)
    ins, outs = io_names(n)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    errors = []
    for dynamo in (True, False):
        try:
            t0 = time.perf_counter()
            if dynamo:
                d = torch.export.Dim.DYNAMIC  # named dims cannot say total = past + seq; DYNAMIC infers it
                shapes: list[Any] = [{0: d, 1: d}, {0: d, 1: d}, {0: d, 1: d}, ({0: d, 2: d},) * (2 * n)]
                torch.onnx.export(
                    wrapper, args, str(path), dynamo=True, input_names=ins, output_names=outs,
                    dynamic_shapes=shapes, opset_version=18, external_data=False,
                )  # fmt: skip
            else:
                axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"}}
                axes["position_ids"] = {0: "batch", 1: "seq"}
                axes.update({k: {0: "batch", 2: "past"} for k in ins[3:]})
                axes.update({"logits": {0: "batch", 1: "seq"}, **{k: {0: "batch", 2: "total"} for k in outs[1:]}})
                torch.onnx.export(
                    wrapper, args, str(path), dynamo=False, input_names=ins, output_names=outs,
                    dynamic_axes=axes, opset_version=17,
                )  # fmt: skip
            return {"exporter": "dynamo" if dynamo else "torchscript", "export_s": round(time.perf_counter() - t0, 1),
                    "dynamo_error": errors[0] if errors else None}  # fmt: skip
        except Exception as e:  # record why, try the other exporter
            errors.append(first_line(e))
            for p in out.glob("model.onnx*"):
                p.unlink()
    raise RuntimeError(f"dynamo: {errors[0]} | torchscript: {errors[1]}")


# ----------------------------------------------------------------------------------------------------------
# ORT vs torch
# ----------------------------------------------------------------------------------------------------------


def ort_feeds(sess: Any, ids: np.ndarray, head: int, past: int = 0) -> dict[str, np.ndarray]:
    """input_ids, an all-ones mask, positions and empty past KV for any of the corpus's exporters (``past`` zero
    rows for onnxruntime-genai's shared buffer with sliding-window layers: their attention wants its capacity)."""
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
    dtypes["tensor(int32)"] = np.int32
    feeds = {}
    for i in sess.get_inputs():
        dt = dtypes[i.type]
        if i.name == "input_ids":
            feeds[i.name] = ids.astype(dt)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones(ids.shape, dt)
        elif i.name == "position_ids":
            feeds[i.name] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(dt)
        elif "past" in i.name and len(i.shape) == 4:
            if not isinstance(i.shape[1], int):
                raise ValueError(f"{i.name}: symbolic KV heads {i.shape}")
            feeds[i.name] = np.zeros([ids.shape[0], i.shape[1], past, head], dt)
        elif "past" in i.name:  # a fixed-size state (LFM2's conv)
            feeds[i.name] = np.zeros([ids.shape[0], *i.shape[1:]], dt)
        else:
            raise ValueError(f"unknown input {i.name} {i.shape}")
    return feeds


def check(corpus: Path, arch: str, exporter: str) -> dict[str, Any]:
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM

    ids = np.load(corpus / "ids.npy")[:2, :32]
    model = AutoModelForCausalLM.from_pretrained(corpus / arch / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(corpus / arch / exporter / "model.onnx"), so, providers=["CPUExecutionProvider"])
    cfg = model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    past = 0
    genai = corpus / arch / exporter / "genai_config.json"
    if genai.exists():
        g = json.loads(genai.read_text())
        if g["model"]["decoder"].get("sliding_window") and g["search"].get("past_present_share_buffer"):
            past = int(g["search"]["max_length"])
    y = sess.run(["logits"], ort_feeds(sess, ids, head, past))[0].astype(np.float32)
    rel = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
    return {"ort_vs_torch_rel_l2": rel, "logits_rms": float(np.sqrt(np.mean(ref**2)))}


def own_error(corpus: Path, arch: str) -> dict[str, Any]:
    """The model's own low-precision error: transformers' logits with weights and compute in FP16 and in BF16
    against FP32 (relative L2), on the sweep's judged windows (ids 4-7, eager attention)."""
    from transformers import AutoModelForCausalLM

    ids = torch.from_numpy(np.load(corpus / "ids.npy")[4:8])
    model = AutoModelForCausalLM.from_pretrained(corpus / arch / "hf", dtype=torch.float32, attn_implementation="eager")
    model.eval()
    out: dict[str, Any] = {}
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.double()
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            got = model.to(dtype)(input_ids=ids, use_cache=False).logits.double()
            out[name] = float((got - ref).norm() / ref.norm())
            model.to(torch.float32)
    return out


def main(argv: list[str]) -> int:
    step, corpus, names = argv[0], Path(argv[1]), argv[2:]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    tokenizer_src = Path(os.environ["ONNXPREC_CORPUS_TOKENIZER"]) if step == "hf" else Path()
    for name in names:
        t0 = time.perf_counter()
        arch, _, exporter = name.partition("/")
        status = corpus / arch / ("hf.status.json" if step == "hf" else "torch.status.json")
        if step == "check":
            status = corpus / arch / f"{exporter}.check.json"
        elif step == "lowp":
            status = corpus / arch / "lowp.json"
        elif step not in ("hf", "export"):
            raise SystemExit(f"unknown step {step}")
        try:
            if step == "hf":
                info = make_hf(arch, corpus / arch / "hf", tokenizer_src)
            elif step == "export":
                info = export_torch(corpus / arch / "hf", corpus / arch / "torch")
            elif step == "lowp":
                info = own_error(corpus, arch)
            else:
                info = check(corpus, arch, exporter)
            write_status(status, ok=True, seconds=round(time.perf_counter() - t0, 1), **info)
            print(f"{step} {name}: ok {info}", flush=True)
        except Exception as e:  # one architecture's failure is a result, not a stop
            write_status(status, ok=False, error=first_line(e), trace=traceback.format_exc()[-3000:])
            print(f"{step} {name}: FAILED {first_line(e)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
