"""A decoder of Llama-3.1-8B's shape with random weights, exported to ONNX with a KV cache (FP32, external data).

Standalone (torch and onnx only, no onnxprec): it runs on the GPU machine, which has torch but not this project's
environment. The module is written out here rather than taken from transformers so that its inputs and outputs are
plain tensors in onnxruntime-genai's names (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key|value`` -> ``logits``, ``present.{i}.key|value``); the arithmetic is Llama's: RMSNorm,
rotary positions, grouped-query attention with a causal and padding mask, SwiGLU MLP, an untied lm_head. Random
weights (normal, std 0.02) make time and memory measurable; they say nothing about accuracy.

    python make_llama.py OUT_DIR [--layers 32 --hidden 4096 --heads 32 --kv_heads 8 --intermediate 14336
                                  --vocab 128256 --device cuda --exporter dynamo|torchscript]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.input_layernorm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
        past_key: torch.Tensor, past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        key = torch.cat((past_key, k), dim=2)
        value = torch.cat((past_value, v), dim=2)
        groups = self.heads // self.kv_heads
        k_all = key.repeat_interleave(groups, dim=1)
        v_all = value.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k_all.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        attn = torch.matmul(torch.softmax(scores, dim=-1), v_all)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        h = self.post_attention_layernorm(x)
        x = x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
        return x, key, value


class LlamaShaped(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
                 context: int = 8192, theta: float = 500000.0) -> None:  # fmt: skip
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads, kv_heads, intermediate) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        head_dim = hidden // heads
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_cache", angles.cos(), persistent=True)
        self.register_buffer("sin_cache", angles.sin(), persistent=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:  # fmt: skip
        s = input_ids.shape[1]
        total = attention_mask.shape[1]
        x = self.embed_tokens(input_ids)
        cos = self.cos_cache[position_ids].unsqueeze(1)
        sin = self.sin_cache[position_ids].unsqueeze(1)
        # query i (at total - s + i) sees key j when j <= total - s + i and the mask keeps j
        rows = torch.arange(s, device=input_ids.device).unsqueeze(1) + (total - s)
        cols = torch.arange(total, device=input_ids.device).unsqueeze(0)
        allowed = (cols <= rows).unsqueeze(0).unsqueeze(0) & (attention_mask > 0).unsqueeze(1).unsqueeze(1)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill(
            ~allowed, torch.finfo(x.dtype).min
        )
        presents = []
        for i, layer in enumerate(self.layers):
            x, key, value = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents += [key, value]
        return (self.lm_head(self.norm(x)), *presents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv_heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="torchscript")
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    tick = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaShaped(args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate, args.vocab)
    context = model.cos_cache.shape[0]
    model = model.to_empty(device=args.device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        # the rotary caches were made on meta: recompute them on the device
        head_dim = args.hidden // args.heads
        inv = 1.0 / 500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=args.device) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float32, device=args.device), inv)
        angles = torch.cat((angles, angles), dim=-1)
        model.cos_cache.copy_(angles.cos())
        model.sin_cache.copy_(angles.sin())
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    timings["init_s"] = time.perf_counter() - tick
    print(f"params {params:,} ({params * 4 / 1e9:.1f} GB FP32), init {timings['init_s']:.1f} s", flush=True)

    b, s, p_len = 1, 3, 4
    head_dim = args.hidden // args.heads
    ids = torch.randint(0, args.vocab, (b, s), device=args.device)
    mask = torch.ones(b, p_len + s, dtype=torch.int64, device=args.device)
    positions = torch.arange(p_len, p_len + s, device=args.device).unsqueeze(0)
    past = [torch.randn(b, args.kv_heads, p_len, head_dim, device=args.device) for _ in range(2 * args.layers)]
    past_names = [f"past_key_values.{i}.{kind}" for i in range(args.layers) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(args.layers) for kind in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids", *past_names]
    outputs = ["logits", *present_names]
    out = args.out_dir / "model.onnx"
    tick = time.perf_counter()
    with torch.no_grad():
        if args.exporter == "torchscript":
            axes: dict[str, dict[int, str]] = {
                "input_ids": {0: "batch_size", 1: "sequence_length"},
                "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                "position_ids": {0: "batch_size", 1: "sequence_length"},
                "logits": {0: "batch_size", 1: "sequence_length"},
            }
            for name in past_names:
                axes[name] = {0: "batch_size", 2: "past_sequence_length"}
            for name in present_names:
                axes[name] = {0: "batch_size", 2: "total_sequence_length"}
            torch.onnx.export(
                model, (ids, mask, positions, *past), str(out), input_names=inputs, output_names=outputs,
                dynamic_axes=axes, opset_version=args.opset, dynamo=False,
            )  # fmt: skip
        else:
            dim = torch.export.Dim
            batch, seq, past_len = dim("batch_size"), dim("sequence_length"), dim("past_sequence_length")
            shapes = {
                "input_ids": {0: batch, 1: seq},
                "attention_mask": {0: batch, 1: past_len + seq},
                "position_ids": {0: batch, 1: seq},
                "past": [{0: batch, 2: past_len}] * (2 * args.layers),
            }
            program = torch.onnx.export(
                model, (ids, mask, positions, *past), input_names=inputs, output_names=outputs,
                dynamic_shapes=shapes, opset_version=max(args.opset, 18), dynamo=True, optimize=True,
            )  # fmt: skip
            program.save(str(out), external_data=True)
    timings["export_s"] = time.perf_counter() - tick
    files = sorted(args.out_dir.iterdir())
    size = sum(f.stat().st_size for f in files)
    print(f"exported {out} ({len(files)} files, {size / 1e9:.2f} GB) in {timings['export_s']:.1f} s", flush=True)
    config = {key: getattr(args, key) for key in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")}
    summary = {"params": params, "bytes": size, "files": len(files), "exporter": args.exporter, **config, **timings}
    (args.out_dir / "make_llama.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
