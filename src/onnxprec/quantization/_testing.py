"""Helpers for the quantization tests: tiny models, reading quantized weights back, numpy references."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxprec._ort import create_session
from onnxprec._testing import F, make_model, tensor_info
from onnxprec.quantization.packing import unpack_matmulnbits

__all__ = [
    "TIED_FORMS",
    "correlated",
    "dequantized_weights",
    "fails_cleanly",
    "mlp",
    "parameters",
    "run_fp32_compute",
    "single_matmul",
    "tiny_cnn",
    "tiny_lm",
]

TIED_FORMS = ("copies", "transpose", "gemm", "untied")
"""How :func:`tiny_lm` stores its embedding and lm_head: two initializers of equal content (torch exports), one
``[H, V]`` initializer read by the lm_head and by ``Transpose -> Gather`` (onnxruntime-genai's builder), one
``[V, H]`` table read by the Gather and by ``Gemm(transB=1)``, or two different matrices."""


def correlated(t: int, k: int, seed: int = 0, *, outliers: bool = True) -> np.ndarray:
    """LLM-like tokens: correlated channels (a random mixing) and a few channels 10x larger."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, k)) @ (rng.standard_normal((k, k)) / np.sqrt(k))
    if outliers:
        x[:, rng.choice(k, max(1, k // 32), replace=False)] *= 10
    return x.astype(np.float32)


def parameters(function: Callable[..., Any]) -> list[tuple[str, str]]:
    """``function``'s parameters in order, each with its default (``"required"`` without one; enums by name): what
    the ONNX Runtime-compatible functions must share with ONNX Runtime's own."""
    found = []
    for name, parameter in inspect.signature(function).parameters.items():
        default = parameter.default
        found.append(
            (name, "required" if default is inspect.Parameter.empty else str(getattr(default, "name", default)))
        )
    return found


def fails_cleanly(
    run: Callable[..., Any], folder: Path, error: type[Exception], match: str, source: Path, **kwargs: object
) -> str:
    """Checks that ``run(source, folder / "out.onnx", **kwargs)`` raises ``error`` with one line matching ``match``
    and leaves no output (nor a temporary one) behind; returns the message."""
    out = folder / "out.onnx"
    with pytest.raises(error, match=match) as info:
        run(source, out, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert not out.exists() and not (folder / "out.onnx.data").exists()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".out.onnx")] == []
    return message


def single_matmul(
    k: int = 96, n: int = 40, *, name: str = "mm", gemm: bool = False, dtype: int = F, seed: int = 0
) -> tuple[onnx.ModelProto, np.ndarray]:
    """``Y = X @ W`` (or ``Gemm(X, W^T, C, alpha=0.5, transB=1)`` with ``C`` ``[N]``) and its float32 W ``[K, N]``."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    if gemm:
        c = rng.standard_normal(n).astype(np_dtype)
        node = helper.make_node("Gemm", ["X", "W", "C"], ["Y"], name=name, transB=1, alpha=0.5, beta=2.0)
        inits = {"W": w.T.astype(np_dtype), "C": c}
        shape: list[int | str] = ["T", k]
    else:
        node = helper.make_node("MatMul", ["X", "W"], ["Y"], name=name)
        inits = {"W": w.astype(np_dtype)}
        shape = ["B", "T", k]
    out_shape = [*shape[:-1], n]
    model = make_model([node], [tensor_info("X", dtype, shape)], [tensor_info("Y", dtype, out_shape)], inits)
    return model, w.astype(np_dtype).astype(np.float32)


def mlp(k: int = 64, h: int = 96, n: int = 48, *, seed: int = 0, head: bool = True) -> onnx.ModelProto:
    """``X -> Mul(gamma) -> {q, k} MatMuls (shared input) -> Add -> Relu -> MatMul -> [lm_head MatMul]``."""
    rng = np.random.default_rng(seed)
    inits = {
        "gamma": rng.uniform(0.5, 2.0, k).astype(np.float32),
        "Wq": (rng.standard_normal((k, h)) / np.sqrt(k)).astype(np.float32),
        "Wk": (rng.standard_normal((k, h)) / np.sqrt(k)).astype(np.float32),
        "Wo": (rng.standard_normal((h, n)) / np.sqrt(h)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["X", "gamma"], ["xn"], name="/model/norm/Mul"),
        helper.make_node("MatMul", ["xn", "Wq"], ["q"], name="/model/layers.0/q_proj/MatMul"),
        helper.make_node("MatMul", ["xn", "Wk"], ["kk"], name="/model/layers.0/k_proj/MatMul"),
        helper.make_node("Add", ["q", "kk"], ["s"], name="/model/layers.0/Add"),
        helper.make_node("Relu", ["s"], ["r"], name="/model/layers.0/Relu"),
        helper.make_node("MatMul", ["r", "Wo"], ["o"], name="/model/layers.0/o_proj/MatMul"),
    ]
    out = "o"
    if head:
        inits["Whead"] = (rng.standard_normal((n, 80)) / np.sqrt(n)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["o", "Whead"], ["logits"], name="/model/lm_head/MatMul"))
        out = "logits"
    return make_model(
        nodes, [tensor_info("X", F, ["B", "T", k])], [tensor_info(out, F, ["B", "T", 80 if head else n])], inits
    )


def cancelling(path: Path, shape: tuple[int, ...], *, scale: float, opset: int = 17) -> list[dict[str, np.ndarray]]:
    """Writes to ``path`` a float MatMul ``cancel`` whose weights are 300 plus small terms, on inputs whose halves
    cancel (``[a, -a]``: the 300s add to zero), then a MatMul ``mm`` (weights ``N(0, 1) * scale``), input ``x`` and
    output ``y`` of ``shape`` (its last axis even); returns 8 such runs. In FP16 the weights' small terms round away
    (300's step is 0.25): a float remainder in FP16 destroys the output, in FP32 it is exact."""
    rng = np.random.default_rng(0)
    width = shape[-1]
    weights = {"w2": (300 + rng.standard_normal((width, width)) / 100).astype(np.float32),
               "w1": (rng.standard_normal((width, width)) * scale).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w2"], ["h"], name="cancel"),
             helper.make_node("MatMul", ["h", "w1"], ["y"], name="mm")]  # fmt: skip
    value = [tensor_info("x", F, list(shape))], [tensor_info("y", F, list(shape))]
    onnx.save(make_model(nodes, *value, weights, opset=opset), path)
    halves = [rng.standard_normal((*shape[:-1], width // 2)).astype(np.float32) for _ in range(8)]
    return [{"x": np.concatenate([a, -a], axis=-1)} for a in halves]


def optimized_ops(path: Path, tmp_path: Path) -> list[str]:
    """The op types ONNX Runtime's CPU provider runs after its fusions."""
    optimized = tmp_path / "optimized.onnx"
    create_session(str(path), optimization="all", optimized_model_path=optimized)
    return [n.op_type for n in onnx.load(str(optimized)).graph.node]


def tiny_cnn(seed: int = 0, channels: int = 8) -> onnx.ModelProto:
    """A MobileNet-like block: ``Pad -> Conv -> Clip(0, 6) -> Pad -> depthwise Conv -> Relu -> Conv 1x1 -> Add
    (residual) -> ReduceMean -> Gemm(transB=1)``, input ``[N, 3, 16, 16]``, logits ``[N, 10]``."""
    rng = np.random.default_rng(seed)
    c = channels
    inits: dict[str, np.ndarray] = {
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "w0": (rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32),
        "b0": rng.standard_normal(c).astype(np.float32) * 0.1,
        "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
        "w1": (rng.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32),
        "b1": rng.standard_normal(c).astype(np.float32) * 0.1,
        "w2": (rng.standard_normal((c, c, 1, 1)) * 0.4).astype(np.float32),
        "b2": rng.standard_normal(c).astype(np.float32) * 0.1,
        "wfc": (rng.standard_normal((10, c)) * 0.5).astype(np.float32),
        "bfc": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p0"], name="/stem/Pad", mode="constant"),
        helper.make_node("Conv", ["p0", "w0", "b0"], ["c0"], name="/stem/Conv", kernel_shape=[3, 3]),
        helper.make_node("Clip", ["c0", "lo", "hi"], ["a0"], name="/stem/Clip"),
        helper.make_node("Pad", ["a0", "pads"], ["p1"], name="/dw/Pad", mode="constant"),
        helper.make_node("Conv", ["p1", "w1", "b1"], ["c1"], name="/dw/Conv", kernel_shape=[3, 3], group=c),
        helper.make_node("Relu", ["c1"], ["a1"], name="/dw/Relu"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="/project/Conv", kernel_shape=[1, 1]),
        helper.make_node("Add", ["c2", "a0"], ["r"], name="/Add"),
        helper.make_node("ReduceMean", ["r"], ["pooled"], name="/ReduceMean", axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["pooled", "wfc", "bfc"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    return make_model(nodes, [tensor_info("x", F, ["N", 3, 16, 16])], [tensor_info("logits", F, ["N", 10])], inits)


def run_fp32_compute(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs on ONNX Runtime CPU with float compute in the fused INT4 kernels (no int8 rounding of activations)."""
    session = create_session(model, optimization="none", what="the test model")
    return session.run(feeds)


def _array(proto: onnx.ModelProto, name: str) -> np.ndarray:
    for init in proto.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    raise KeyError(name)


def _repeat(values: np.ndarray | float, block: int, rows: int) -> np.ndarray | float:
    """Block parameters ``[n_blocks, N]`` repeated over the rows of their blocks."""
    return np.repeat(values, block, axis=0)[:rows] if np.ndim(values) else values


def dequantized_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Float32 ``[K, N]`` weight each quantized node reads, by node name (MatMul/Gemm after QDQ, or MatMulNBits)."""
    producers = {out: node for node in proto.graph.node for out in node.output}
    result = {}
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            zp = _array(proto, node.input[3]) if len(node.input) > 3 and node.input[3] else None
            qw = unpack_matmulnbits(
                _array(proto, node.input[1]), _array(proto, node.input[2]), zp, attrs["K"], bits=attrs["bits"]
            )
            result[node.name] = qw.dequantize()
        elif node.op_type in ("MatMul", "Gemm") and node.input[1] in producers:
            dq = producers[node.input[1]]
            if dq.op_type != "DequantizeLinear":
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
            q = _array(proto, dq.input[0]).astype(np.float32)
            scales = _array(proto, dq.input[1]).astype(np.float32)
            zero = _array(proto, dq.input[2]).astype(np.float32) if len(dq.input) > 2 and dq.input[2] else 0.0
            block = int(attrs.get("block_size") or q.shape[0])
            result[node.name] = (q - _repeat(zero, block, q.shape[0])) * _repeat(scales, block, q.shape[0])
    return result


def tiny_lm(
    form: str = "copies", *, v: int = 80, h: int = 48, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``ids -> Gather(embedding) -> MatMul(W1) -> Relu -> lm_head`` and its float32 weights, each ``[K, N]``.

    ``form`` is one of :data:`TIED_FORMS`; the weights returned are ``embedding`` (the table ``[V, H]`` as the
    ``[K=H, N=V]`` matrix its blocks run along), ``w1`` and ``head``. ``ids`` is ``[B, T]`` (``[T]`` for ``gemm``).
    """
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((v, h)).astype(np.float32)
    w1 = (rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)
    head = table.T.copy() if form != "untied" else (rng.standard_normal((h, v)) / np.sqrt(h)).astype(np.float32)
    inits: dict[str, np.ndarray] = {"W1": w1}
    nodes = []
    if form == "transpose":
        inits["lm_head.weight"] = head
        nodes.append(helper.make_node("Transpose", ["lm_head.weight"], ["table"], name="/embed/Transpose", perm=[1, 0]))
        nodes.append(helper.make_node("Gather", ["table", "ids"], ["e"], name="/embed/Gather"))
    else:
        inits["embed.weight"] = table
        nodes.append(helper.make_node("Gather", ["embed.weight", "ids"], ["e"], name="/embed/Gather"))
    nodes += [
        helper.make_node("MatMul", ["e", "W1"], ["m"], name="/layers.0/mlp/MatMul"),
        helper.make_node("Relu", ["m"], ["r"], name="/layers.0/Relu"),
    ]
    if form == "gemm":
        nodes.append(helper.make_node("Gemm", ["r", "embed.weight"], ["logits"], name="/lm_head/Gemm", transB=1))
    elif form == "transpose":
        nodes.append(helper.make_node("MatMul", ["r", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    else:
        inits["lm_head.weight"] = head
        nodes.append(helper.make_node("MatMul", ["r", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    shape: list[int | str] = ["T"] if form == "gemm" else ["B", "T"]
    model = make_model(
        nodes,
        [tensor_info("ids", onnx.TensorProto.INT64, shape)],
        [tensor_info("logits", F, [*shape, v])],
        inits,
    )
    return model, {"embedding": table.T.copy(), "w1": w1, "head": head}
