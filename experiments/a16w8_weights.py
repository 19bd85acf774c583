"""EfficientNet-Lite0: INT8 weight rounding and bias correction variants, weights alone (activations float).

Every Conv and the Gemm but the stem Conv and the first depthwise Conv (the layers INT8 and A16W8 keep float by
default) get per-output-channel symmetric INT8 weights (levels -127..127), dequantized back into the FP32 model, so
the model runs in float with only the weight error: what ``int8_effnet.py decompose``'s "weights alone" measures of a
quantized model. Statistics come from the FP32 model on the 7 calibration images: each layer's input patches (im2col,
the zero padding of the Pad node before it included), their mean and ``XᵀX``.

Variants (``--variant``, comma-separated, each a ``+``-joined set of):
``rtn``: round to nearest, scale max|w|/127;
``mse``: per-channel scale searched over 0.5-1.0 x max|w|/127 for the least ``||W - Q(W)||²``;
``hmse``: the same, for the least output error ``ΔWᵀ diag(H) ΔW`` (H: the input patches' XᵀX);
``hfull``: the same, for the least output error ``tr(ΔW H ΔWᵀ)`` (full H);
``gptq``, ``gptq0.1``, ``gptq1``: GPTQ rounding (damp 0.01, 0.1, 1) with the chosen scales;
``all``: GPTQ on every layer, also those with fewer calibration rows than inputs (else RTN there, as the product);
``bc``: bias correction with the per-channel input mean (the product's before this study: padding ignored);
``bcp``: bias correction with the mean input patch (padding included: exact for the mean output shift).

    python experiments/a16w8_weights.py --heldout hold.npy --variant rtn,rtn+bc,rtn+bcp,gptq+bcp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int8_effnet as base

from onnxprec.quantization.algorithms.int8 import QMAX, gptq_per_channel
from onnxprec.quantization.int8.grams import ConvGeometry

FLOAT = ("/_conv_stem/Conv", "/_blocks.0/_depthwise_conv/Conv")


def _attr(node: Any, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _layers(model: Any) -> list[Any]:
    return [n for n in model.graph.node if n.op_type in ("Conv", "Gemm") and n.name not in FLOAT]


def statistics(model: Any, x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Per layer: ``mean_c`` [C] channel means, ``mean_p`` [G, K] mean patch, ``h`` [G, K, K] patch XᵀX, ``n`` rows."""
    import onnx
    import onnxruntime as ort

    layers = _layers(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = sorted({n.input[0] for n in layers})
    for name in names:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    session = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inits = {i.name: i for i in model.graph.initializer}
    stats: dict[str, dict[str, Any]] = {}
    for i in range(len(x)):
        outs = dict(zip(names, session.run(names, {"input": x[i : i + 1]})))
        for node in layers:
            value = outs[node.input[0]].astype(np.float64)
            shape = list(inits[node.input[1]].dims)
            if node.op_type == "Gemm":
                rows = value.reshape(1, -1, value.shape[-1])
            else:
                pads, groups = _attr(node, "pads", [0, 0, 0, 0]), int(_attr(node, "group", 1))
                strides = tuple(_attr(node, "strides", [1, 1]))
                geometry = ConvGeometry((shape[2], shape[3]), strides, tuple(pads), (1, 1), groups)
                rows = geometry.patches(value)
            s = stats.setdefault(node.name, {"sum_p": 0.0, "h": 0.0, "n": 0, "sum_c": 0.0, "count_c": 0})
            s["sum_p"] = s["sum_p"] + rows.sum(axis=1)
            s["h"] = s["h"] + np.einsum("gtk,gtl->gkl", rows, rows, optimize=True)
            s["n"] += rows.shape[1]
            axes = (0,) if value.ndim == 2 else (0, 2, 3)
            s["sum_c"] = s["sum_c"] + value.sum(axis=axes)
            s["count_c"] += value.size // value.shape[1]
    for s in stats.values():
        s["mean_p"] = s["sum_p"] / s["n"]
        s["mean_c"] = s["sum_c"] / s["count_c"]
    return stats


def _scales(w: np.ndarray, mode: str, h: np.ndarray) -> np.ndarray:
    """Per-channel scales of ``w`` ``[G, K, N]`` (``[G, N]``): RTN's max/127, or the factor in 0.5-1.0 of it with the
    least squared error (``mse``), diag(H)-weighted output error (``hmse``) or full-H output error (``hfull``)."""
    top = np.abs(w).max(axis=1) / QMAX
    top[top <= 0] = 1.0
    if mode == "rtn":
        return top
    best, best_err = top.copy(), np.full(top.shape, np.inf)
    diag = np.einsum("gkk->gk", h)[:, :, None]
    for factor in np.linspace(0.5, 1.0, 51):
        s = top * factor
        delta = np.clip(np.rint(w / s[:, None, :]), -QMAX, QMAX) * s[:, None, :] - w
        if mode == "mse":
            err = (delta**2).sum(axis=1)
        elif mode == "hmse":
            err = (diag * delta**2).sum(axis=1)
        else:
            err = np.einsum("gkn,gkl,gln->gn", delta, h, delta)
        better = err < best_err
        best[better], best_err[better] = s[better], err[better]
    return best


def quantize(model: Any, stats: dict[str, dict[str, np.ndarray]], variant: str) -> Any:
    """A copy of ``model`` whose layers have the variant's dequantized INT8 weights (and corrected biases)."""
    import onnx
    from onnx import numpy_helper

    parts = set(variant.split("+"))
    scale_mode = next((p for p in parts if p in ("rtn", "mse", "hmse", "hfull")), "rtn")
    gptq = next((p for p in parts if p.startswith("gptq")), None)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: i for i in out.graph.initializer}
    for node in _layers(out):
        s = stats[node.name]
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        gemm = node.op_type == "Gemm"
        m = w.shape[0]
        groups = 1 if gemm else int(_attr(node, "group", 1))
        grouped = w.reshape(groups, m // groups, -1).transpose(0, 2, 1)  # [G, K, N]
        h = s["h"]
        scales = _scales(grouped, scale_mode, h)
        rows_ok = s["n"] >= h.shape[-1] or "all" in parts
        if gptq is not None and rows_ok:
            damp = float(gptq[4:] or 0.01)
            levels = gptq_per_channel(grouped, h, damp=damp, scales=scales)[0].astype(np.float64)
        else:
            levels = np.clip(np.rint(grouped / scales[:, None, :]), -QMAX, QMAX)
        deq = levels * scales[:, None, :]
        delta = deq - grouped  # [G, K, N]
        new = deq.transpose(0, 2, 1).reshape(w.shape)
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(new.astype(np.float32), node.input[1]))
        correction = None
        if "bcp" in parts:
            correction = -np.einsum("gk,gkn->gn", s["mean_p"], delta).reshape(m)
        elif "bc" in parts:
            mean_c = s["mean_c"]
            per_group = grouped.shape[1] // (1 if gemm else w.shape[2] * w.shape[3])
            summed = delta.reshape(groups, per_group, -1, delta.shape[2]).sum(axis=2)  # [G, C/g, N]
            correction = -np.einsum("gc,gcn->gn", mean_c.reshape(groups, per_group), summed).reshape(m)
        if correction is not None:
            b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
            inits[node.input[2]].CopyFrom(numpy_helper.from_array((b + correction).astype(np.float32), node.input[2]))
    return out


def main() -> None:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--out", default="/tmp")
    args = parser.parse_args()
    model = onnx.load(str(base.FP32))
    stats = statistics(model, np.load(base.CALIBRATION))
    for variant in args.variant.split(","):
        path = str(Path(args.out) / f"w_{variant}.onnx")
        onnx.save(quantize(model, stats, variant), path)
        base.evaluate([path], args.heldout)


if __name__ == "__main__":
    main()
