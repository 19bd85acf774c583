"""The steps of ``zoo.bigllm`` that need the big-LLM venv's packages (gguf, transformers, tokenizers, onnxruntime's
quantizers); run there as ``python _bigllm_venv.py STEP ...`` by :mod:`zoo.bigllm`, never imported by the project.

    gguf2hf GGUF OUT            dequantize a qwen2 GGUF into an FP32 Hugging Face folder, one tensor at a time
    tokenize HF OUT.npz SPEC    token windows of the text files a JSON spec names (see zoo.bigllm.text_spec)
    ort_int4 IN OUT METHOD      ONNX Runtime's MatMulNBitsQuantizer: rtn (block 32, symmetric) or k_quant
    generate IDS.npy ROUNDS DIR...  onnxruntime-genai decode tokens/s and prefill ms of builder-style folders
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
SHARD_BYTES = 2_000_000_000


def _hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m is None or m.group(2) not in _LAYER:
        raise SystemExit(f"unexpected GGUF tensor {name}")
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"


def gguf2hf(gguf_path: str, out: str) -> None:
    """Config and tokenizer through transformers' GGUF support; FP32 safetensors shards of about 2 GB, each tensor
    dequantized by gguf's own reader (peak memory about one shard)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    folder, name = os.path.split(os.path.abspath(gguf_path))
    cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
    if cfg.model_type != "qwen2":
        raise SystemExit(f"expected a qwen2 GGUF, got {cfg.model_type}")
    reader = GGUFReader(gguf_path)
    names = {t.name for t in reader.tensors}
    cfg.tie_word_embeddings = "output.weight" not in names
    cfg.torch_dtype = "float32"
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
    eos = [cfg.eos_token_id] + ([cfg.bos_token_id] if cfg.bos_token_id not in (None, cfg.eos_token_id) else [])
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=eos, pad_token_id=cfg.pad_token_id).save_pretrained(
        out
    )
    shards: list[tuple[str, list[str]]] = []
    current: dict[str, np.ndarray] = {}
    current_bytes = total = 0

    def flush() -> None:
        nonlocal current, current_bytes
        if current:
            file = f"shard-{len(shards) + 1:05d}.safetensors"
            save_file(current, os.path.join(out, file), metadata={"format": "pt"})
            shards.append((file, list(current)))
            print(f"wrote {file} ({current_bytes / 1e9:.2f} GB) at {time.time() - t0:.0f} s", flush=True)
            current, current_bytes = {}, 0

    for tensor in reader.tensors:
        shape = tuple(int(x) for x in reversed(tensor.shape.tolist()))  # GGUF lists the innermost dim first
        array = dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32, copy=False)
        if not np.isfinite(array).all():
            raise SystemExit(f"non-finite values in {tensor.name}")
        if current_bytes + array.nbytes > SHARD_BYTES:
            flush()
        current[_hf_name(tensor.name)] = np.ascontiguousarray(array)
        current_bytes += array.nbytes
        total += array.nbytes
    flush()
    weight_map = {}
    for i, (file, keys) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(out, file), os.path.join(out, final))
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    Path(out, "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    print(f"done: {len(weight_map)} tensors, {total / 1e9:.2f} GB, {time.time() - t0:.0f} s")


def tokenize(hf: str, out: str, spec_json: str) -> None:
    """``spec``: {"window": S, "sets": {name: {"files": [...], "windows": n}}}; each set's files are read in order
    (UTF-8), joined with a blank line, tokenized once, and cut into its first ``n`` windows of ``S`` tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    spec = json.loads(Path(spec_json).read_text())
    size = int(spec["window"])
    arrays = {}
    for name, entry in spec["sets"].items():
        text = "\n\n".join(Path(f).read_text(encoding="utf-8") for f in entry["files"])
        ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        need = int(entry["windows"]) * size
        if ids.size < need:
            raise SystemExit(f"{name}: {ids.size} tokens, {need} needed")
        arrays[name] = ids[:need].reshape(-1, size)
        print(f"{name}: {ids.size} tokens, {arrays[name].shape[0]} windows of {size}", flush=True)
    np.savez(out, **arrays)  # type: ignore[arg-type]


def ort_int4(src: str, dst: str, method: str) -> None:
    """MatMulNBitsQuantizer on every MatMul (the CLI's block 32, symmetric; accuracy level 4, the CPU fast path):
    ``rtn`` its default (MLAS) quantizer, ``k_quant`` its KQuantWeightOnlyQuantConfig."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        KQuantWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    t0 = time.time()
    if method == "rtn":
        config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=4)
    elif method == "k_quant":
        config = KQuantWeightOnlyQuantConfig()
    else:
        raise SystemExit(f"unknown method {method}")
    quantizer = MatMulNBitsQuantizer(src, block_size=32, is_symmetric=True, accuracy_level=4, algo_config=config)
    quantizer.process()
    data = os.path.basename(dst) + ".data"
    quantizer.model.save_model_to_file(dst, use_external_data_format=True)
    produced = Path(dst).with_name(data)
    print(f"quantized in {time.time() - t0:.0f} s; data {produced.name} exists: {produced.exists()}")


def generate(ids_npy: str, rounds: str, *folders: str) -> None:
    """onnxruntime-genai on the CPU, the folders alternating round by round: greedy decode of 64 new tokens after a
    short prompt (tokens/s of the new tokens) and the prefill of each ``[N, S]`` window of ``ids_npy`` (ms: the
    prompt's forward pass and the first new token); one JSON line per folder with the medians, the rounds and the
    start of the generated text."""
    import onnxruntime_genai as og

    prompts = np.load(ids_npy)
    results: dict[str, dict[str, list[float]]] = {f: {"decode": [], "prefill": []} for f in folders}
    texts: dict[str, str] = {}
    for _ in range(int(rounds)):
        for folder in folders:
            model = og.Model(folder)
            tokenizer = og.Tokenizer(model)
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=200, do_sample=False)
            gen = og.Generator(model, params)
            gen.append_tokens(tokenizer.encode('def quicksort(items):\n    """Sort a list of numbers."""\n'))
            gen.generate_next_token()
            t0, count = time.perf_counter(), 0
            while not gen.is_done() and count < 64:
                gen.generate_next_token()
                count += 1
            results[folder]["decode"].append(count / (time.perf_counter() - t0))
            texts[folder] = tokenizer.decode(gen.get_sequence(0))[:200]
            del gen
            for window in prompts:
                params = og.GeneratorParams(model)
                params.set_search_options(max_length=len(window) + 1, do_sample=False)
                gen = og.Generator(model, params)
                t0 = time.perf_counter()
                gen.append_tokens(window.astype(np.int32))
                gen.generate_next_token()
                results[folder]["prefill"].append(1000 * (time.perf_counter() - t0))
                del gen
            del model
    for folder, r in results.items():
        row = {"folder": folder, "decode_tokens_per_s": float(np.median(r["decode"])),
               "prefill_ms": float(np.median(r["prefill"])), "prefill_tokens": int(prompts.shape[1]),
               "rounds": r, "text": texts[folder]}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    steps: dict[str, Callable[..., None]] = {
        "gguf2hf": gguf2hf, "tokenize": tokenize, "ort_int4": ort_int4, "generate": generate,
    }  # fmt: skip
    step, *args = sys.argv[1:]
    steps[step](*args)
