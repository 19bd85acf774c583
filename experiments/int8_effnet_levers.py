"""EfficientNet-Lite0 INT8: the levers of BENCHMARKS.md's "linear stream, finer weights, calibration views" section.

Each command writes a candidate model from an INT8 model of ``python -m onnxprec.quantization --quantize_mode int8``
(the default, or ``--no_float_linear_outputs`` where a command says so); ``int8_effnet.py eval`` and ``latency``
judge them (``eval --no_optimizations`` for the emulations that keep float weights or per-channel Q/DQ, which ONNX
Runtime's own fusions would otherwise re-quantize).

``views`` (the torch venv: scipy) writes 28 augmented views of the 7 calibration images in tensor space: a flip every
other view, a crop of 70-90 % resized back, contrast 0.8-1.2 and a colour shift of +-0.2 per channel.
``linear`` rewrites the project Convs of a ``--no_float_linear_outputs`` model in one of the forms ONNX Runtime
1.32's CPU provider has an integer kernel for: ``qdq`` (Q/DQ as they are, what ``rows`` starts from),
``convinteger`` (ConvInteger -> Cast -> Mul -> Add), ``matmulinteger`` (channels last, MatMulInteger -> Cast -> Mul
-> Add), ``mitf`` (channels last, com.microsoft::MatMulIntegerToFloat), ``hilo`` (``mitf`` plus a second
MatMulIntegerToFloat on the INT8 residual of the FP32 weight, ``w = s_hi q_hi + s_lo q_lo``, with the FP32 bias);
every other reader of the linear stream reads it float.
``scales`` searches one factor (0.8, 0.9, 1.1, 1.25) per activation scale, coordinate-wise, on the views (the
consumers' INT32 biases follow), and prints the calibration and held-out errors after the sweep.
``bias`` corrects each Conv's bias, in order, by the mean shift of its output against FP32 on the data.
``channels`` gives the Convs' inputs on the float stream per-channel UINT8 Q/DQ (the data's ranges times headroom).
``weights`` gives the Convs whose name matches a regex the FP32 model's weight and bias (their input Q/DQ kept);
``bypass`` drops the activation Q/DQ pairs whose float input matches a regex (``int8_effnet.bypassed``).
``rows`` emulates finer project weights on a fraction of input rows: GPTQ (the Hessian of the data) on the other rows,
their error pushed onto the kept rows, which stay exact (what a second INT8 part on those rows would give).

    ~/.cache/onnxprec/torch-venv/bin/python experiments/int8_effnet_levers.py views views.npy
    python experiments/int8_effnet_levers.py linear PREV.onnx OUT.onnx --form mitf
    python experiments/int8_effnet_levers.py scales INT8.onnx OUT.onnx --views views.npy --heldout heldout.npy
    python experiments/int8_effnet_levers.py bias INT8.onnx OUT.onnx --data views.npy
    python experiments/int8_effnet_levers.py channels INT8.onnx OUT.onnx --headroom 1.5
    python experiments/int8_effnet_levers.py rows EMULATED.onnx OUT.onnx --fraction 0.125 --data views.npy
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int8_effnet as base

MS = "com.microsoft"


def _onnx() -> Any:
    import onnx

    return onnx


def _arrays(model: Any) -> dict[str, Any]:
    return {i.name: i for i in model.graph.initializer}


def _array(inits: dict[str, Any], name: str) -> np.ndarray:
    from onnx import numpy_helper

    return numpy_helper.to_array(inits[name])


def _set(inits: dict[str, Any], name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper

    inits[name].CopyFrom(numpy_helper.from_array(value, name))


def _add(model: Any, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _producers(model: Any) -> dict[str, Any]:
    return {o: n for n in model.graph.node for o in n.output}


def _fp32_convs() -> tuple[dict[str, Any], dict[str, Any]]:
    model = _onnx().load(base.FP32)
    return {n.name: n for n in model.graph.node if n.op_type == "Conv"}, _arrays(model)


def _fp32_tensors(names: list[str], x: np.ndarray) -> list[list[np.ndarray]]:
    """FP32 values of ``names`` per image."""
    from onnx import helper

    model = _onnx().load(base.FP32)
    model.graph.output.extend([helper.make_tensor_value_info(n, 1, None) for n in names])
    session = _from_proto(model)
    return [session.run(names, {"input": x[i : i + 1]}) for i in range(len(x))]


def _from_proto(model: Any, optimize: bool = True) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level, so.intra_op_num_threads = 3, 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _logits(session: Any, x: np.ndarray) -> np.ndarray:
    return np.concatenate([session.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))])


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def views(out: str) -> None:
    from scipy.ndimage import zoom  # type: ignore[import-not-found]

    rng = np.random.default_rng(0)
    result = []
    for image in np.load(base.CALIBRATION):
        for k in range(4):
            v = image[:, :, ::-1] if k % 2 == 0 else image
            side = int(224 * rng.uniform(0.7, 0.9))
            i, j = rng.integers(0, 224 - side + 1, 2)
            v = zoom(v[:, i : i + side, j : j + side], (1, 224 / side, 224 / side), order=1)[:, :224, :224]
            v = v * rng.uniform(0.8, 1.2) + rng.uniform(-0.2, 0.2, (3, 1, 1))
            result.append(v.astype(np.float32))
    np.save(out, np.stack(result))


def linear(source: str, out: str, form: str, hilo: str) -> None:
    """The project Convs of a ``--no_float_linear_outputs`` model in ``form``; the stream float for non-Conv readers."""
    from onnx import TensorProto, helper

    onnx = _onnx()
    model = onnx.load(source)
    graph, inits, producer = model.graph, _arrays(model), _producers(model)
    fp_convs, fp_inits = _fp32_convs()
    replaced: dict[int, list[Any]] = {}
    for node in graph.node:
        if node.op_type != "Conv" or "project_conv" not in node.name or form == "qdq":
            continue
        dqx, dqw, dqb = (producer[node.input[i]] for i in range(3))
        xq, xs, xz = dqx.input
        wq, ws = dqw.input[0], dqw.input[1]
        w_scales = _array(inits, ws).astype(np.float64)
        bias = _array(inits, dqb.input[0]).astype(np.float64) * _array(inits, dqb.input[1]).astype(np.float64)
        n = node.name
        channels = w_scales.shape[0]
        levels = _array(inits, wq).reshape(channels, -1)
        y = node.output[0]
        t_in = helper.make_node("Transpose", [xq], [n + "_xt"], perm=[0, 2, 3, 1], name=n + "_t_in")
        t_out = helper.make_node("Transpose", [n + "_nhwc"], [y], perm=[0, 3, 1, 2], name=n + "_t_out")
        rescale = (float(_array(inits, xs)) * w_scales).astype(np.float32)
        if form == "convinteger":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            _add(model, n + "_rescale", rescale.reshape(1, channels, 1, 1))
            _add(model, n + "_fbias", bias.astype(np.float32).reshape(1, channels, 1, 1))
            replaced[id(node)] = [
                helper.make_node("ConvInteger", [xq, wq, xz], [n + "_i32"], name=n + "_int", **attrs),
                helper.make_node("Cast", [n + "_i32"], [n + "_f"], to=TensorProto.FLOAT, name=n + "_cast"),
                helper.make_node("Mul", [n + "_f", n + "_rescale"], [n + "_scaled"], name=n + "_mul"),
                helper.make_node("Add", [n + "_scaled", n + "_fbias"], [y], name=n + "_bias"),
            ]
            continue
        _add(model, n + "_wT", np.ascontiguousarray(levels.T))
        if form == "matmulinteger":
            _add(model, n + "_rescale", rescale)
            _add(model, n + "_fbias", bias.astype(np.float32))
            replaced[id(node)] = [
                t_in,
                helper.make_node("MatMulInteger", [n + "_xt", n + "_wT", xz], [n + "_i32"], name=n + "_int"),
                helper.make_node("Cast", [n + "_i32"], [n + "_f"], to=TensorProto.FLOAT, name=n + "_cast"),
                helper.make_node("Mul", [n + "_f", n + "_rescale"], [n + "_scaled"], name=n + "_mul"),
                helper.make_node("Add", [n + "_scaled", n + "_fbias"], [n + "_nhwc"], name=n + "_bias"),
                t_out,
            ]
            continue
        _add(model, n + "_wscale", w_scales.astype(np.float32))
        split = form == "hilo" and re.search(hilo, n) is not None
        if split:  # the FP32 weight's residual as a second INT8 part; the FP32 bias (no correction left to make)
            fp = fp_convs[n]
            weight = _array(fp_inits, fp.input[1]).reshape(channels, -1).T.astype(np.float64)
            residual = weight - levels.T * w_scales
            lo_scales = np.maximum(np.abs(residual).max(0), 1e-12) / 127
            _add(model, n + "_wT_lo", np.clip(np.rint(residual / lo_scales), -127, 127).astype(np.int8))
            _add(model, n + "_wscale_lo", lo_scales.astype(np.float32))
            bias = _array(fp_inits, fp.input[2]).astype(np.float64)
        _add(model, n + "_fbias", bias.astype(np.float32))
        product = n + ("_hi" if split else "_nhwc")
        inputs = [n + "_xt", n + "_wT", xs, n + "_wscale", xz, "", n + "_fbias"]
        nodes = [t_in, helper.make_node("MatMulIntegerToFloat", inputs, [product], name=n + "_int", domain=MS)]
        if split:
            inputs = [n + "_xt", n + "_wT_lo", xs, n + "_wscale_lo", xz]
            nodes += [
                helper.make_node("MatMulIntegerToFloat", inputs, [n + "_lo"], name=n + "_int_lo", domain=MS),
                helper.make_node("Add", [n + "_hi", n + "_lo"], [n + "_nhwc"], name=n + "_hilo"),
            ]
        replaced[id(node)] = [*nodes, t_out]
    kept = [m for node in graph.node for m in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(kept)
    _float_stream(model)
    if form in ("mitf", "hilo") and not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    onnx.save(model, out)


def _float_stream(model: Any) -> None:
    """Readers other than Convs of the project outputs and residual Adds read them float; dead nodes go."""
    graph, producer = model.graph, _producers(model)
    constants = {i.name for i in graph.initializer}
    mapping = {}
    for node in graph.node:
        q = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        stream = q is not None and q.op_type == "QuantizeLinear" and re.search("project_conv|/Add", q.input[0])
        if stream and node.input[0] not in constants:
            mapping[node.output[0]] = q.input[0]  # type: ignore[union-attr]
    for node in graph.node:
        if node.op_type != "Conv":
            node.input[:] = [mapping.get(x, x) for x in node.input]
    while True:
        used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
        kept = [n for n in graph.node if any(o in used for o in n.output)]
        if len(kept) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(kept)


def scales(source: str, out: str, views_path: str, heldout: str) -> None:
    onnx = _onnx()
    model = onnx.load(source)
    graph, inits, producer = model.graph, _arrays(model), _producers(model)
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    pairs = []  # (scale, [(INT32 bias, its scale, the weight's scales)] of the Convs that read it)
    for q in graph.node:
        if q.op_type != "QuantizeLinear" or q.input[1] not in inits:
            continue
        dqs = [r for r in readers.get(q.output[0], []) if r.op_type == "DequantizeLinear"]
        convs = [r for dq in dqs for r in readers.get(dq.output[0], []) if r.op_type == "Conv" and len(r.input) > 2]
        biases = [(*producer[c.input[2]].input[:2], producer[c.input[1]].input[1]) for c in convs]
        pairs.append((q.input[1], biases))
    float_bias = {
        b: _array(inits, b).astype(np.float64) * _array(inits, s).astype(np.float64)
        for _, biases in pairs
        for b, s, _w in biases
    }

    def set_scale(name: str, biases: list[tuple[str, str, str]], value: float) -> None:
        _set(inits, name, np.array(value, np.float32))
        for b, s, w in biases:
            combined = (np.float32(value) * _array(inits, w).astype(np.float32)).astype(np.float32)
            _set(inits, s, combined)
            _set(inits, b, np.clip(np.rint(float_bias[b] / combined), -(2**31), 2**31 - 1).astype(np.int32))

    fp32 = _from_proto(onnx.load(base.FP32))
    sets = {"views": np.load(views_path), "calibration": np.load(base.CALIBRATION), "held out": np.load(heldout)}
    refs = {k: _logits(fp32, x) for k, x in sets.items()}

    def errors() -> str:
        session = _from_proto(model)
        return ", ".join(f"{k} {_rel(_logits(session, x), refs[k]):.4f}" for k, x in sets.items())

    print(f"before: {errors()}", flush=True)
    best = _rel(_logits(_from_proto(model), sets["views"]), refs["views"])
    for name, biases in pairs:
        start, chosen = float(_array(inits, name)), 1.0
        for factor in (0.8, 0.9, 1.1, 1.25):
            set_scale(name, biases, start * factor)
            value = _rel(_logits(_from_proto(model), sets["views"]), refs["views"])
            if value < best - 1e-5:
                best, chosen = value, factor
        set_scale(name, biases, start * chosen)
        if chosen != 1.0:
            print(f"  {name} x{chosen}: views {best:.4f}", flush=True)
    print(f"after: {errors()}", flush=True)
    onnx.save(model, out)


def bias(source: str, out: str, data: str) -> None:
    from onnx import helper

    onnx = _onnx()
    x = np.load(data)
    model = onnx.load(source)
    graph, inits, producer = model.graph, _arrays(model), _producers(model)
    fp_convs, _ = _fp32_convs()
    present = {o for n in graph.node for o in n.output}
    targets = [c.output[0] for c in fp_convs.values() if c.output[0] in present]
    reference = [np.mean([v.mean(axis=(0, 2, 3)) for v in per_image], axis=0)
                 for per_image in zip(*_fp32_tensors(targets, x))]  # fmt: skip
    graph.output.extend([helper.make_tensor_value_info(t, 1, None) for t in targets])
    for target, ref in zip(targets, reference):
        session = _from_proto(model, optimize=False)
        shift = np.mean([session.run([target], {"input": x[i : i + 1]})[0].mean(axis=(0, 2, 3)) for i in range(len(x))],
                        axis=0) - ref  # fmt: skip
        node = producer[target]
        if node.op_type == "Conv" and producer.get(node.input[2]) is not None:
            dq = producer[node.input[2]]
            levels, step = _array(inits, dq.input[0]).astype(np.float64), _array(inits, dq.input[1]).astype(np.float64)
            _set(inits, dq.input[0], np.rint(levels - shift / step).astype(np.int32))
        elif node.op_type == "Transpose" and producer[node.input[0]].op_type == "MatMulIntegerToFloat":
            name = producer[node.input[0]].input[6]
            _set(inits, name, (_array(inits, name) - shift).astype(np.float32))
    del graph.output[1:]
    onnx.save(model, out)


def channels(source: str, out: str, headroom: float) -> None:
    from onnx import helper

    onnx = _onnx()
    model = onnx.load(source)
    graph, producer = model.graph, _producers(model)
    targets = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in producer
               and producer[n.input[0]].op_type in ("Add", "Transpose")]  # fmt: skip
    values = _fp32_tensors([q.input[0] for q in targets], np.load(base.CALIBRATION))
    for k, q in enumerate(targets):
        v = np.concatenate([per_image[k] for per_image in values])
        lo = np.minimum(v.min((0, 2, 3)), 0) * headroom
        hi = np.maximum(v.max((0, 2, 3)), 0) * headroom
        step = np.maximum(hi - lo, 1e-12) / 255
        s = _add(model, q.input[1] + "_channels", step.astype(np.float32))
        z = _add(model, q.input[2] + "_channels", np.clip(np.rint(-lo / step), 0, 255).astype(np.uint8))
        for node in [q, *(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])]:
            node.input[1], node.input[2] = s, z
            node.attribute.append(helper.make_attribute("axis", 1))
    onnx.save(model, out)


def weights(source: str, out: str, pattern: str) -> None:
    onnx = _onnx()
    fp_convs, fp_inits = _fp32_convs()
    model = onnx.load(source)
    have = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.name in fp_convs and re.search(pattern, node.name):
            for i in (1, 2):
                name = fp_convs[node.name].input[i]
                if name not in have:
                    model.graph.initializer.append(fp_inits[name])
                    have.add(name)
                node.input[i] = name
    onnx.save(model, out)


def rows(source: str, out: str, fraction: float, data: str) -> None:
    onnx = _onnx()
    fp_convs, fp_inits = _fp32_convs()
    convs = [c for c in fp_convs.values() if "project_conv" in c.name]
    hessians: list[Any] = [0] * len(convs)
    sums: list[Any] = [0] * len(convs)
    counts = [0] * len(convs)
    for per_image in _fp32_tensors([c.input[0] for c in convs], np.load(data)):
        for k, value in enumerate(per_image):
            v = value[0].reshape(value.shape[1], -1).astype(np.float64)
            hessians[k] = hessians[k] + v @ v.T
            sums[k], counts[k] = sums[k] + v.sum(1), counts[k] + v.shape[1]
    model = onnx.load(source)
    by_name = {n.name: n for n in model.graph.node}
    for conv, h, total, count in zip(convs, hessians, sums, counts):
        stored = _array(fp_inits, conv.input[1]).astype(np.float64)
        out_channels, k = stored.shape[:2]
        weight = stored.reshape(out_channels, k).T  # [K, N]
        kept = round(k * fraction)
        step = np.abs(weight).max(0) / 127
        step[step <= 0] = 1
        order = np.argsort(np.diag(h) * (weight**2).sum(1))  # the kept rows (largest energy) last
        w = weight[order].copy()
        hp = h[np.ix_(order, order)].copy()
        diagonal = np.diag(hp).copy()
        mean = max(diagonal.mean(), 1e-12)
        diagonal[diagonal <= 0] = mean
        hp[np.arange(k), np.arange(k)] = diagonal + 0.01 * mean
        upper = np.linalg.cholesky(np.linalg.inv(hp)).T
        for i in range(k - kept):
            rounded = np.clip(np.rint(w[i] / step), -127, 127) * step
            error = (w[i] - rounded) / upper[i, i]
            w[i] = rounded
            w[i + 1 :] -= upper[i, i + 1 :][:, None] * error[None, :]
        effective = np.empty_like(weight)
        effective[order] = w
        corrected = _array(fp_inits, conv.input[2]).astype(np.float64) - (total / count) @ (effective - weight)
        node = by_name[conv.name]
        node.input[1] = _add(model, conv.name + "_rows_weight",
                             effective.T.reshape(stored.shape).astype(np.float32))  # fmt: skip
        node.input[2] = _add(model, conv.name + "_rows_bias", corrected.astype(np.float32))
    onnx.save(model, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("views").add_argument("out")
    for name in ("linear", "scales", "bias", "channels", "rows", "weights", "bypass"):
        p = sub.add_parser(name)
        p.add_argument("source")
        p.add_argument("out")
        if name == "linear":
            p.add_argument("--form", choices=("qdq", "convinteger", "matmulinteger", "mitf", "hilo"), default="mitf")
            p.add_argument("--hilo", default="project_conv", help="regex of the project Convs split (hilo)")
        if name == "scales":
            p.add_argument("--views", required=True)
            p.add_argument("--heldout", required=True)
        if name in ("bias", "rows"):
            p.add_argument("--data", default=str(base.CALIBRATION))
        if name == "channels":
            p.add_argument("--headroom", type=float, default=1.0)
        if name == "rows":
            p.add_argument("--fraction", type=float, default=0.125)
        if name in ("weights", "bypass"):
            p.add_argument("--pattern", required=True, help="regex (re.search) of the Conv names / tensor names")
    args = parser.parse_args()
    if args.command == "views":
        views(args.out)
    elif args.command == "linear":
        linear(args.source, args.out, args.form, args.hilo)
    elif args.command == "scales":
        scales(args.source, args.out, args.views, args.heldout)
    elif args.command == "bias":
        bias(args.source, args.out, args.data)
    elif args.command == "channels":
        channels(args.source, args.out, args.headroom)
    elif args.command == "weights":
        weights(args.source, args.out, args.pattern)
    elif args.command == "bypass":
        base.bypassed(args.source, args.pattern, args.out)
    else:
        rows(args.source, args.out, args.fraction, args.data)


if __name__ == "__main__":
    main()
