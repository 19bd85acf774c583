"""A KV-cache decoder written with onnx.helper and numpy, no torch: the corpus model CI can build.

Two pre-norm layers of the shape the torch exports have (hidden 128, 4 heads of 32, SiLU-gated MLP 256, vocab
512): embedding Gather, RMSNorm from ReduceMean/Sqrt, Q/K/V MatMuls, past K/V concatenated on the sequence
axis (``past_key_values.N.key`` [batch, 4, past, 32] in, ``present.N.key`` out), a causal mask from Range /
LessOrEqual ANDed with ``attention_mask``, filled with float32's lowest value as exporters do, Softmax, and an
untied lm_head. Fixed seed; weights N(0, 0.05).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, HEAD, FFN, VOCAB, LAYERS = 128, 4, 32, 256, 512, 2


def build_kv_decoder(path: Path, seed: int = 0) -> None:
    """Writes the decoder to ``path`` (checked with full type inference)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []

    def w(name: str, *shape: int, std: float = 0.05) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name))
        return name

    def const(name: str, value: object, dtype: type = np.int64) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(kind: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], name=f"/{out}/{kind}", **attrs))
        return out

    def rms(x: str, p: str) -> str:
        sq = op("Mul", [x, x], f"{p}.sq")
        mean = op("ReduceMean", [sq, "axes_last"], f"{p}.mean", keepdims=1)
        inv = op("Reciprocal", [op("Sqrt", [op("Add", [mean, "eps"], f"{p}.var")], f"{p}.std")], f"{p}.inv")
        return op("Mul", [op("Mul", [x, inv], f"{p}.normed"), w(f"{p}.weight", HIDDEN)], f"{p}.out")

    const("axes_last", [-1])
    const("eps", 1e-5, np.float32)
    const("min", np.finfo(np.float32).min, np.float32)
    const("scale", 1 / np.sqrt(HEAD), np.float32)
    const("one", 1)
    const("zero", 0)
    const("heads_shape", [0, 0, HEADS, HEAD])
    const("hidden_shape", [0, 0, HIDDEN])
    x = op("Gather", [w("embed", VOCAB, HIDDEN, std=1.0), "input_ids"], "embeds")
    seq = op("Squeeze", [op("Shape", ["input_ids"], "ids_shape", start=1, end=2)], "seq")
    total = op("Squeeze", [op("Shape", ["attention_mask"], "mask_shape", start=1, end=2)], "total")
    rows = op("Range", [op("Sub", [total, seq], "past_len"), total, "one"], "rows")
    cols = op("Range", ["zero", total, "one"], "cols")
    causal = op(
        "LessOrEqual", [op("Unsqueeze", [cols, "zero"], "cols2"), op("Unsqueeze", [rows, "one"], "rows2")], "causal"
    )
    mask = op(
        "Cast",
        [op("Unsqueeze", ["attention_mask", const("axes12", [1, 2])], "mask4")],
        "mask_bool",
        to=TensorProto.BOOL,
    )
    allowed = op("And", [causal, mask], "allowed")
    ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])]
    ins.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]))
    outs = []
    for i in range(LAYERS):
        p = f"layers.{i}"
        h = rms(x, f"{p}.input_norm")
        kv = []
        for part in ("q", "k", "v"):
            proj = op("MatMul", [h, w(f"{p}.{part}_proj", HIDDEN, HIDDEN)], f"{p}.{part}")
            heads = op(
                "Transpose",
                [op("Reshape", [proj, "heads_shape"], f"{p}.{part}4")],
                f"{p}.{part}_heads",
                perm=[0, 2, 1, 3],
            )
            if part != "q":
                past = f"past_key_values.{i}.{'key' if part == 'k' else 'value'}"
                present = f"present.{i}.{'key' if part == 'k' else 'value'}"
                ins.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, ["batch", HEADS, "past", HEAD]))
                outs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, ["batch", HEADS, "total", HEAD]))
                heads = op("Concat", [past, heads], present, axis=2)
            kv.append(heads)
        q, k, v = kv
        kt = op("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
        scores = op("Mul", [op("MatMul", [q, kt], f"{p}.qk"), "scale"], f"{p}.scores")
        probs = op("Softmax", [op("Where", [allowed, scores, "min"], f"{p}.masked")], f"{p}.probs", axis=-1)
        ctx = op("Transpose", [op("MatMul", [probs, v], f"{p}.ctx")], f"{p}.ctxt", perm=[0, 2, 1, 3])
        attn = op(
            "MatMul", [op("Reshape", [ctx, "hidden_shape"], f"{p}.ctx3"), w(f"{p}.o_proj", HIDDEN, HIDDEN)], f"{p}.attn"
        )
        x = op("Add", [x, attn], f"{p}.resid1")
        h = rms(x, f"{p}.post_norm")
        gate = op("MatMul", [h, w(f"{p}.gate_proj", HIDDEN, FFN)], f"{p}.gate")
        up = op("MatMul", [h, w(f"{p}.up_proj", HIDDEN, FFN)], f"{p}.up")
        act = op("Mul", [op("Mul", [gate, op("Sigmoid", [gate], f"{p}.sig")], f"{p}.silu"), up], f"{p}.act")
        x = op("Add", [x, op("MatMul", [act, w(f"{p}.down_proj", FFN, HIDDEN)], f"{p}.down")], f"{p}.resid2")
    logits = op("MatMul", [rms(x, "final_norm"), w("lm_head", HIDDEN, VOCAB)], "logits")
    assert logits == "logits"
    outs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB]))
    for t in inits:  # norm weights: ones
        if t.name.endswith("norm.weight"):
            t.CopyFrom(numpy_helper.from_array(np.ones(HIDDEN, np.float32), t.name))
    graph = helper.make_graph(nodes, "kv_decoder", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="onnxprec-corpus")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save_model(model, tmp)
    tmp.replace(path)
