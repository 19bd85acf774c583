"""FP8 MiniLM-L6 against ModelOpt 0.47: each reading of the held-out cosine, and why the padding positions of a few
held-out sentences are further off in onnxprec's model than in ModelOpt's.

Both tools calibrate on the 8 sentences of ``../shared/models`` as ``experiments/fp8_modelopt.py`` does; the held-out
set is the corpus's 64 ``paraphrase-minilm-l3`` sentences (padded to 32 tokens). Readings of ``last_hidden_state``
against the float model's, per sentence or token, min and mean: ``all`` (a sentence's 32 positions flattened, padding
included), ``tokens`` (its real tokens flattened), ``token`` (each real token alone), ``pooled`` (the masked mean of its
real tokens: the sentence embedding sentence-transformers computes) and ``padding`` (its padding positions alone).

Models: onnxprec's default and ModelOpt's default (``entropy`` ranges); ModelOpt with ``--calibration_method max``; and
single-lever edits of onnxprec's model: calibrated on all 8 sentences (no accuracy guard, which holds the last quarter
out), the activation maxima on E4M3's 36 as ModelOpt places them (instead of 28), ModelOpt's activation ranges, the
FP32 remainder, and a replica of ModelOpt's ``max`` model (onnxprec's graph with ModelOpt's activation scales and FP8
weight levels); and ModelOpt's ``max`` model with its dequantized weights rounded to FP16, as onnxprec's are in ONNX
Runtime. Also: each activation's calibrated maximum in both tools against the float model's, the float model's own
sensitivity per position (1 % multiplicative noise after layer 1), and the cosine after each layer at the worst
sentence's worst positions.

    python -m experiments.fp8_minilm_padding
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from experiments.fp8_modelopt import CORPUS, MODELS, RESULTS, minilm_heldout, note_header
from onnxprec._ort import create_session
from onnxprec.quantization.algorithms.qtypes import FP8_ACTIVATION_HEADROOM
from onnxprec.quantization.fp8 import quantize_file
from onnxprec.quantization.fp8.modelopt_test import _modelopt, dequantized_inputs

FLOAT = MODELS / "minilm_l6_v2_bert.onnx"
OURS_TOP = 448 / FP8_ACTIVATION_HEADROOM  # onnxprec: a calibrated maximum on E4M3's 28
MODELOPT_TOP = 127**2 / 448  # ModelOpt: its INT8 scale (max / 127) times 127 / 448 puts the maximum on 36
Feeds = dict[str, np.ndarray]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def readings(models: dict[str, Path], batches: Sequence[Feeds]) -> dict[str, dict[str, list[float]]]:
    """Each model's readings (module docstring) as [min, mean]; FP8 models run with ORT's optimizations off."""
    reference = create_session(str(FLOAT), optimization="all")
    sessions = {name: create_session(str(path), optimization="none") for name, path in models.items()}
    kinds = ("all", "tokens", "token", "pooled", "padding")
    values: dict[str, dict[str, list[float]]] = {name: {k: [] for k in kinds} for name in models}
    for feeds in batches:
        ref = np.asarray(reference.run(feeds)[0], np.float64)
        for name, session in sessions.items():
            got, v = np.asarray(session.run(feeds)[0], np.float64), values[name]
            for i, mask in enumerate(np.asarray(feeds["attention_mask"], bool)):
                v["all"].append(_cos(ref[i], got[i]))
                v["tokens"].append(_cos(ref[i][mask], got[i][mask]))
                v["token"] += [_cos(a, b) for a, b in zip(ref[i][mask], got[i][mask])]
                v["pooled"].append(_cos(ref[i][mask].mean(0), got[i][mask].mean(0)))
                if not mask.all():
                    v["padding"].append(_cos(ref[i][~mask], got[i][~mask]))
    return {n: {k: [round(min(x), 5), round(float(np.mean(x)), 5)] for k, x in v.items()} for n, v in values.items()}


def _consts(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    out = {i.name: i for i in graph.initializer}
    out.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute})
    return out


def qdq_inputs(path: Path) -> dict[tuple[str, int], tuple[onnx.NodeProto, onnx.NodeProto]]:
    """Each node input read through a DequantizeLinear (Casts skipped): its (QuantizeLinear, DequantizeLinear); the
    QuantizeLinear of onnxprec's weights is absent (None is never stored: those inputs are left out)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    producers = {o: n for n in graph.node for o in n.output}
    return {
        key: (producers[dq.input[0]], dq)
        for key, dq in dequantized_inputs(graph).items()
        if dq is not None and dq.input[0] in producers
    }


def activation_scales(path: Path) -> dict[tuple[str, int], float]:
    """Per-tensor activation scale of each node input read through a Q/DQ pair (weights: per-channel, left out)."""
    model = onnx.load(str(path))
    consts, out = _consts(model.graph), {}
    for key, (q, dq) in qdq_inputs(path).items():
        scale = numpy_helper.to_array(consts[dq.input[1]])
        if scale.size == 1 and q.input[0] not in consts:
            out[key] = float(scale)
    return out


def float_maxima(names: Sequence[str], feeds: Feeds) -> dict[str, tuple[float, float, bool]]:
    """Each tensor's largest magnitude in the float model over the 8 calibration sentences, over the first 6 (the
    accuracy guard holds out the last quarter), and whether the largest sits on a padding position."""
    model = onnx.load(str(FLOAT))
    for name in names:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    values = ort.InferenceSession(model.SerializeToString(), options).run(list(names), feeds)
    mask = np.asarray(feeds["attention_mask"], bool)
    out = {}
    for name, value in zip(names, values):
        x = np.abs(np.asarray(value))
        where = np.unravel_index(int(x.argmax()), x.shape)
        out[name] = (float(x.max()), float(x[:6].max()), not bool(mask[where[0], where[1]]))
    return out


def _edited(src: Path, dst: Path, edit: Callable[[onnx.ModelProto], None]) -> Path:
    model = onnx.load(str(src))
    edit(model)
    onnx.save(model, str(dst))
    return dst


def _set(tensor: onnx.TensorProto, value: np.ndarray) -> None:
    tensor.CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(tensor).dtype), tensor.name))


def with_activation_scales(src: Path, dst: Path, scale_of: Callable[[tuple[str, int], float], float]) -> Path:
    """``src`` with each activation Q/DQ pair's scale replaced by ``scale_of(node input, its scale)``."""
    pairs = qdq_inputs(src)
    current = activation_scales(src)

    def edit(model: onnx.ModelProto) -> None:
        consts = _consts(model.graph)
        for key, scale in current.items():
            q, dq = pairs[key]
            for name in {q.input[1], dq.input[1]}:
                _set(consts[name], np.asarray(scale_of(key, scale)).reshape(tuple(consts[name].dims)))

    return _edited(src, dst, edit)


def with_weights_of(src: Path, dst: Path, other: Path) -> Path:
    """onnxprec's ``src`` with the FP8 weight levels and scales of ModelOpt's ``other`` (its FP16 weight through its
    QuantizeLinear, computed by ONNX Runtime)."""
    ours, theirs = qdq_inputs(src), qdq_inputs(other)
    theirs_model = onnx.load(str(other))
    their_consts = _consts(theirs_model.graph)

    def edit(model: onnx.ModelProto) -> None:
        graph, consts = model.graph, _consts(model.graph)
        producers = {o: n for n in graph.node for o in n.output}
        for node in graph.node:
            for index, name in enumerate(node.input):
                dq = producers.get(name)
                if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in consts:
                    continue
                q = theirs[node.name, index][0]
                weight, scale, zero = (numpy_helper.to_array(their_consts[x]) for x in q.input)
                levels = _quantize(weight, scale, zero, next((a.i for a in q.attribute if a.name == "axis"), 1))
                _set(consts[dq.input[0]], levels)
                _set(consts[dq.input[1]], numpy_helper.to_array(their_consts[q.input[1]]))
        assert not set(ours) - set(theirs)

    return _edited(src, dst, edit)


def with_fp16_weights(src: Path, dst: Path) -> Path:
    """ModelOpt's ``src`` with each weight's QuantizeLinear -> DequantizeLinear replaced by its dequantized FP8 weight
    rounded to FP16, read directly: what onnxprec's weight DequantizeLinear (FP8 levels, FP16 scale and output) gives
    in ORT's CPU provider, where ModelOpt's reaches the MatMul in FP32."""

    def edit(model: onnx.ModelProto) -> None:
        graph, consts = model.graph, _consts(model.graph)
        for (name, index), (q, _) in qdq_inputs(src).items():
            if q.input[0] not in consts:
                continue  # an activation
            weight, scale, zero = (numpy_helper.to_array(consts[x]) for x in q.input)
            axis = next((a.i for a in q.attribute if a.name == "axis"), 1)
            shape = [1] * weight.ndim
            shape[axis] = -1
            levels = _quantize(weight, scale, zero, axis).astype(np.float32)
            value = (levels * scale.astype(np.float32).reshape(shape)).astype(np.float16)
            node = next(n for n in graph.node if n.name == name)
            graph.initializer.append(numpy_helper.from_array(value, f"{node.input[index]}_fp16"))
            node.input[index] = f"{node.input[index]}_fp16"

    return _edited(src, dst, edit)


def _quantize(weight: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int) -> np.ndarray:
    """ONNX Runtime's FP8 QuantizeLinear of ``weight``."""
    helper, proto = onnx.helper, onnx.TensorProto
    node = helper.make_node("QuantizeLinear", ["w", "s", "z"], ["y"], axis=axis)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")]
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("w", proto.FLOAT16, list(weight.shape))],
                              [helper.make_tensor_value_info("y", proto.FLOAT8E4M3FN, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return np.asarray(create_session(model, optimization="none").run({"w": weight})[0]).view(ml_dtypes.float8_e4m3fn)


def sensitivity(batches: Sequence[Feeds], noise: float = 0.01, seed: int = 0) -> dict[str, object]:
    """The float model's own amplification per position: 1 - cosine of the output after multiplying layer 1's output
    (its LayerNorm) by ``1 + noise * N(0, 1)``, mean of 3 draws; real tokens against padding positions."""
    tensor = "/m/encoder/layer.1/output/LayerNorm/LayerNormalization_output_0"
    model = onnx.load(str(FLOAT))
    for node in model.graph.node:
        node.input[:] = [tensor + "_noisy" if x == tensor else x for x in node.input]
    model.graph.node.append(onnx.helper.make_node("Mul", [tensor, "noise"], [tensor + "_noisy"]))
    model.graph.input.append(onnx.helper.make_tensor_value_info("noise", onnx.TensorProto.FLOAT, None))
    session = create_session(model, optimization="none")
    rng = np.random.default_rng(seed)
    real: list[float] = []
    padding: list[float] = []
    worst: list[tuple[float, str]] = []
    for b, feeds in enumerate(batches):
        shape = (*feeds["input_ids"].shape, 384)
        ref = np.asarray(session.run({**feeds, "noise": np.ones(shape, np.float32)})[0], np.float64)
        noisy = [(1 + noise * rng.standard_normal(shape)).astype(np.float32) for _ in range(3)]
        draws = [np.asarray(session.run({**feeds, "noise": n})[0], np.float64) for n in noisy]
        for i, mask in enumerate(np.asarray(feeds["attention_mask"], bool)):
            for t in range(len(mask)):
                err = float(np.mean([1 - _cos(ref[i, t], d[i, t]) for d in draws]))
                (real if mask[t] else padding).append(err)
                worst.append((err, f"batch {b} row {i} position {t} ({int(mask.sum())} real tokens)"))
    worst.sort(reverse=True)
    stats = {
        name: {"median": float(np.median(v)), "p99": float(np.percentile(v, 99)), "max": max(v), "n": len(v)}
        for name, v in (("real_tokens", real), ("padding", padding))
    }
    return {
        "noise_at": tensor,
        "noise": noise,
        "one_minus_cosine": stats,
        "worst": [[round(e, 5), w] for e, w in worst[:8]],
    }


def worst_positions(models: dict[str, Path], batches: Sequence[Feeds], count: int = 6) -> dict[str, object]:
    """Each model's lowest per-position cosines over the held-out set (padding included)."""
    reference = create_session(str(FLOAT), optimization="all")
    out: dict[str, object] = {}
    for name, path in models.items():
        session, found = create_session(str(path), optimization="none"), []
        for b, feeds in enumerate(batches):
            ref = np.asarray(reference.run(feeds)[0], np.float64)
            got = np.asarray(session.run(feeds)[0], np.float64)
            for i, mask in enumerate(np.asarray(feeds["attention_mask"], bool)):
                for t in range(len(mask)):
                    kind = "real" if mask[t] else "padding"
                    found.append(
                        (_cos(ref[i, t], got[i, t]), f"batch {b} row {i} position {t} ({kind}, {int(mask.sum())} real)")
                    )
        out[name] = [[round(c, 4), w] for c, w in sorted(found)[:count]]
    return out


def layer_trace(models: dict[str, Path], feeds: Feeds, row: int, positions: Sequence[int]) -> dict[str, object]:
    """Cosine with the float model after each LayerNorm of sentence ``row`` at ``positions``, and the mean over its
    real tokens."""
    blocks = [f"/m/encoder/layer.{layer}/{part}/LayerNorm/LayerNormalization_output_0"
              for layer in range(6) for part in ("attention/output", "output")]  # fmt: skip
    names = ["/m/embeddings/LayerNorm/LayerNormalization_output_0", *blocks[:-1]]  # the last one is the output
    mask = np.asarray(feeds["attention_mask"][row], bool)

    def run(path: Path, element: int) -> list[np.ndarray]:
        model = onnx.load(str(path))
        for name in names:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, element, None))
        session = create_session(model, optimization="none")
        return [np.asarray(x, np.float64)[row] for x in session.run(feeds, [*names, "last_hidden_state"])]

    ref = run(FLOAT, onnx.TensorProto.FLOAT)
    out: dict[str, object] = {"positions": list(positions)}
    for model_name, path in models.items():
        got = run(path, onnx.TensorProto.FLOAT16)
        out[model_name] = {
            (n.removeprefix("/m/").removesuffix("/LayerNormalization_output_0")): [
                *(round(_cos(r[t], g[t]), 4) for t in positions),
                round(float(np.mean([_cos(r[t], g[t]) for t in np.flatnonzero(mask)])), 4),
            ]
            for n, r, g in zip([*names, "last_hidden_state"], ref, got)
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minilm-heldout", type=Path, default=CORPUS / "paraphrase-minilm-l3" / "heldout")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{dt.date.today():%Y-%m-%d}-fp8-minilm-padding.json")
    args = ap.parse_args()
    with np.load(MODELS / "minilm_l6_v2_bert_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    heldout = minilm_heldout(args.minilm_heldout)
    results = note_header("experiments.fp8_minilm_padding")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "calibration.npz"
        np.savez(data, **feeds)
        m: dict[str, Path] = {"onnxprec": work / "onnxprec.onnx", "modelopt": _modelopt(FLOAT, feeds, data, work)}
        quantize_file(FLOAT, m["onnxprec"], calibration_data=str(data))
        m["modelopt_max"] = _modelopt(FLOAT, feeds, data, work, ("--calibration_method", "max"))
        m["onnxprec_all8"] = work / "all8.onnx"
        quantize_file(FLOAT, m["onnxprec_all8"], calibration_data=str(data), accuracy_guard=False)
        m["onnxprec_fp32_remainder"] = work / "fp32.onnx"
        quantize_file(FLOAT, m["onnxprec_fp32_remainder"], calibration_data=str(data), high_precision_dtype="fp32")
        ours, theirs = activation_scales(m["onnxprec"]), activation_scales(m["modelopt"])
        m["onnxprec_max_on_36"] = with_activation_scales(m["onnxprec"], work / "on36.onnx",
                                                         lambda _, s: s * OURS_TOP / MODELOPT_TOP)  # fmt: skip
        m["onnxprec_modelopt_ranges"] = with_activation_scales(
            m["onnxprec"], work / "moranges.onnx", lambda k, _: theirs[k] * MODELOPT_TOP / OURS_TOP
        )
        their_max = activation_scales(m["modelopt_max"])
        replica = with_activation_scales(m["onnxprec_all8"], work / "replica_a.onnx", lambda k, _: their_max[k])
        m["replica_of_modelopt_max"] = with_weights_of(replica, work / "replica.onnx", m["modelopt_max"])
        m["modelopt_max_fp16_weights"] = with_fp16_weights(m["modelopt_max"], work / "mo_fp16w.onnx")

        results["readings_heldout"] = readings(m, heldout)
        results["readings_calibration"] = readings(m, [feeds])
        producers = {n.name: n for n in onnx.load(str(FLOAT), load_external_data=False).graph.node}
        tensors = {key: producers[key[0]].input[key[1]] for key in ours}
        maxima = float_maxima(sorted(set(tensors.values())), feeds)
        ranges = []
        for key in sorted(ours):
            full, first6, on_padding = maxima[tensors[key]]
            ranges.append({"input": f"{key[0]}[{key[1]}]", "float_max_8": round(full, 4),
                           "float_max_first_6": round(first6, 4), "max_on_padding": on_padding,
                           "onnxprec": round(ours[key] * OURS_TOP, 4),
                           "modelopt_entropy": round(theirs[key] * MODELOPT_TOP, 4),
                           "modelopt_max": round(their_max[key] * MODELOPT_TOP, 4)})  # fmt: skip
        results["activation_maxima"] = ranges
        results["sensitivity"] = sensitivity(heldout)
        pair = {k: m[k] for k in ("onnxprec", "modelopt", "modelopt_max", "replica_of_modelopt_max")}
        results["worst_positions"] = worst_positions(pair, heldout)
        results["layer_trace_batch7_row1"] = layer_trace(
            {k: m[k] for k in ("onnxprec", "modelopt")}, heldout[7], 1, (13, 14)
        )
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    for split in ("readings_heldout", "readings_calibration"):
        table = results[split]
        assert isinstance(table, dict)
        for name, r in table.items():
            print(split, name.ljust(26), "  ".join(f"{k} {v[0]:.5f}/{v[1]:.5f}" for k, v in r.items()))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
