"""FP8 against ModelOpt 0.47 on magika-v3.3 and MiniLM-L6, each Q/DQ model evaluated two ways on the same held-out
inputs: ONNX Runtime's CPU provider (graph optimizations off, as the corpus judges FP8) and the ONNX spec
(``onnx.reference.ReferenceEvaluator``, the issue's golden).

ORT's CPU provider has no FP16 QuantizeLinear or MatMul: it runs ModelOpt's weight layout (FP16 initializer ->
QuantizeLinear -> DequantizeLinear with FP16 scale) in FP32 end to end, so its dequantized weights are never rounded to
FP16, while onnxprec's (FP8 initializer -> DequantizeLinear with FP16 scale) leave the DequantizeLinear in FP16, as the
spec says (its output takes the scale's type). Under the spec both layouts round. The ``modelopt*_fp16w`` models are
ModelOpt's with each weight's Q -> DQ replaced by its dequantized value rounded to FP16
(``experiments/fp8_minilm_padding.py``'s ``with_fp16_weights``): what the spec gives, evaluated by ORT. The
``onnxprec_fp32scale`` models are onnxprec's with each FP8 weight's DequantizeLinear given an FP32 scale and followed
by a Cast to FP16 (``with_fp32_scales``): a layout ORT's CPU provider does not round, with the same values under the
spec.

Engines: ``ort`` (CPU provider, optimizations off); ``spec`` (``onnx.reference`` as shipped: each op in its declared
type with numpy; numpy's FP16 matmul accumulates in FP32, and its FP16 QuantizeLinear divides in FP16 since opset 19
leaves the precision open and opset 25's default is the scale's type); ``spec_fp32`` (the same graph, with MatMul,
Gemm, Conv, the reductions, Softmax, LayerNormalization and QuantizeLinear's division computed in FP32 from their FP16
inputs and rounded once to the declared type: the convention of TensorRT and ORT's inserted casts). The float model
runs in ORT with all optimizations as the reference; its own ``spec`` run is recorded as a check.

Readings. magika (63 held-out samples of the corpus): top-1 and top-5 agreement with the float model (the corpus's
task metric), rel L2 of ``target_label`` (the corpus's ``max_rel_l2``), the samples whose top-1 flips with the float
top two. MiniLM (the corpus's 64 ``paraphrase-minilm-l3`` held-out sentences, padded to 32, as
``experiments/fp8_minilm_padding.py``): cosine of ``last_hidden_state`` per sentence over all positions, over the real
tokens, each real token alone, the pooled embedding, the padding positions (min / mean), and rel L2 over all.

    python -m experiments.fp8_spec
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops import load_op

from benchmarks.corpus import batches, merged_npz, run_outputs
from benchmarks.corpus_metrics import judge
from experiments.fp8_minilm_padding import FLOAT as MINILM
from experiments.fp8_minilm_padding import with_fp16_weights
from experiments.fp8_modelopt import CORPUS, MODELS, RESULTS, minilm_heldout, note_header
from onnxprec.quantization.fp8 import quantize_file
from onnxprec.quantization.fp8.modelopt_test import _modelopt

Feeds = dict[str, np.ndarray]
FP32_OPS = ("MatMul", "Gemm", "Conv", "ReduceSum", "ReduceMean", "Softmax", "LayerNormalization", "GlobalAveragePool")


class GlobalMaxPool(OpRun):
    """The spec's GlobalMaxPool (the maximum over every axis after the channel one). onnx 1.23.2's reference reduces
    axes ``ndim - 2`` and ``ndim - 1``, which for a 3-D ``[N, C, L]`` input takes the channel axis too."""

    op_domain = ""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


def _accepted(base: type[OpRun]) -> set[str]:
    """The attributes ``base._run`` takes (a class named after its op type reads the latest schema's attributes)."""
    return set(inspect.signature(base._run).parameters)


def _fp32_op(op_type: str, version: int) -> type[OpRun]:
    """``op_type``'s reference implementation run on FP32 copies of its FP16 inputs, outputs rounded back to FP16."""
    base = load_op("", op_type, version)
    accepted = _accepted(base)

    def _run(self: OpRun, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        half = any(isinstance(a, np.ndarray) and a.dtype == np.float16 for a in args)
        wide = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float16 else a for a in args]
        out = base._run(self, *wide, **{k: v for k, v in kwargs.items() if k in accepted})
        return tuple(o.astype(np.float16) if half and isinstance(o, np.ndarray) and o.dtype == np.float32 else o
                     for o in out)  # fmt: skip

    return type(op_type, (base,), {"op_domain": "", "_run": _run})


def _fp32_quantize(version: int) -> type[OpRun]:
    """QuantizeLinear dividing an FP16 input by its FP16 scale in FP32 (then the spec's saturating cast)."""
    base = load_op("", "QuantizeLinear", version)
    accepted = _accepted(base)

    def _run(self: OpRun, x: np.ndarray, scale: np.ndarray, *rest: Any, **kwargs: Any) -> tuple[Any, ...]:
        kept = {k: v for k, v in kwargs.items() if k in accepted}
        return base._run(self, x.astype(np.float32), scale.astype(np.float32), *rest, **kept)

    return type("QuantizeLinear", (base,), {"op_domain": "", "_run": _run})


def spec_session(path: Path, fp32: bool) -> Callable[[Feeds], list[np.ndarray]]:
    """The model under ``onnx.reference``; ``fp32``: the accumulating ops and QuantizeLinear's division in FP32."""
    model = onnx.load(str(path))
    version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    ops = {n.op_type for n in model.graph.node}
    new_ops: list[type[OpRun]] = [GlobalMaxPool]
    if fp32:
        new_ops += [_fp32_op(op, version) for op in FP32_OPS if op in ops]
        new_ops += [_fp32_quantize(version)] if "QuantizeLinear" in ops else []
    evaluator = ReferenceEvaluator(model, new_ops=new_ops)
    names = [o.name for o in model.graph.output]
    return lambda feeds: list(evaluator.run(names, feeds))


def outputs(path: Path, feeds: Sequence[Feeds], engine: str) -> list[dict[str, np.ndarray]]:
    """Each batch's float outputs as FP32 (``ort``: ORT's CPU provider with optimizations off)."""
    if engine == "ort":
        return run_outputs(path, feeds, optimize=False)
    run = spec_session(path, fp32=engine == "spec_fp32")
    names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    return [{n: np.asarray(v, np.float32) for n, v in zip(names, run(f)) if np.asarray(v).dtype.kind == "f"}
            for f in feeds]  # fmt: skip


def _rel_l2(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    a = np.concatenate([x.ravel() for x in ref]).astype(np.float64)
    b = np.concatenate([x.ravel() for x in got]).astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def magika_readings(ref: list[dict[str, np.ndarray]], got: list[dict[str, np.ndarray]]) -> dict[str, object]:
    """The corpus's judge (top-1 of the first output, rel L2), the number of flipped samples and the first four with
    the float top two."""
    result = judge("top1", 0.98, ref, got)
    r = np.concatenate([next(iter(o.values())) for o in ref])
    g = np.concatenate([next(iter(o.values())) for o in got])
    flips = []
    for i in np.flatnonzero(r.argmax(-1) != g.argmax(-1)):
        top = np.sort(r[i])[::-1][:2]
        flips.append({"sample": int(i), "float_top2": [round(float(t), 4) for t in top],
                      "got_top": int(g[i].argmax()), "float_top": int(r[i].argmax())})  # fmt: skip
    return {"top1": result["value"], "top5": result["top5"], "n": result["n"], "rel_l2": result["max_rel_l2"],
            "output": result["max_rel_l2_output"], "flipped": len(flips), "flips": flips[:4]}  # fmt: skip


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def minilm_readings(ref: list[np.ndarray], got: list[np.ndarray], masks: list[np.ndarray]) -> dict[str, object]:
    """``experiments/fp8_minilm_padding.py``'s readings as [min, mean], and rel L2 over every position."""
    kinds = ("all", "tokens", "token", "pooled", "padding")
    v: dict[str, list[float]] = {k: [] for k in kinds}
    for r, g, mask in zip(ref, got, masks):
        r, g = r.astype(np.float64), g.astype(np.float64)
        for i, m in enumerate(mask.astype(bool)):
            v["all"].append(_cos(r[i], g[i]))
            v["tokens"].append(_cos(r[i][m], g[i][m]))
            v["token"] += [_cos(a, b) for a, b in zip(r[i][m], g[i][m])]
            v["pooled"].append(_cos(r[i][m].mean(0), g[i][m].mean(0)))
            if not m.all():
                v["padding"].append(_cos(r[i][~m], g[i][~m]))
    out: dict[str, object] = {k: [round(min(x), 5), round(float(np.mean(x)), 5)] for k, x in v.items()}
    out["rel_l2"] = round(_rel_l2(ref, got), 5)
    return out


ENGINES = ("ort", "spec", "spec_fp32")


def with_fp32_scales(src: Path, dst: Path) -> Path:
    """onnxprec's ``src`` with each FP8 weight's DequantizeLinear given its scale in FP32 (so an FP32 output) and an
    explicit Cast to FP16 after it: the same values under the spec, and a layout whose Cast ORT's CPU provider drops
    before its FP32 MatMul (so the dequantized weights are not rounded to FP16 there)."""
    model = onnx.load(str(src))
    graph, inits = model.graph, {i.name: i for i in model.graph.initializer}
    nodes, changed = [], set()
    for node in graph.node:
        nodes.append(node)
        weight, scale = (inits.get(x) for x in node.input[:2]) if node.op_type == "DequantizeLinear" else (None, None)
        if weight is None or scale is None or scale.data_type != onnx.TensorProto.FLOAT16:
            continue
        wide = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scale).astype(np.float32), scale.name + "_fp32")
        graph.initializer.append(wide)
        out = node.output[0]
        node.input[1], node.output[0] = wide.name, out + "_fp32"
        nodes.append(onnx.helper.make_node("Cast", [out + "_fp32"], [out], to=onnx.TensorProto.FLOAT16))
        changed.add(out)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [v for v in graph.value_info if v.name not in changed]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return dst


def _skipped(name: str, engine: str) -> bool:
    """Under the spec ModelOpt's models already round their weights to FP16, and onnxprec's FP32-scale layout gives
    the values of its FP16 one (checked under ``spec_fp32``)."""
    return (engine != "ort" and name.endswith("_fp16w")) or (engine == "spec" and name.endswith("_fp32scale"))


def magika(work: Path, log: Callable[[str], None]) -> dict[str, object]:
    folder = CORPUS / "magika-v3.3"
    model, calib, heldout = folder / "model.onnx", folder / "calib", batches(folder / "heldout")
    data = merged_npz(calib, work / "magika_calib.npz")
    with np.load(data) as z:
        feeds = {k: z[k] for k in z.files}
    models = {"onnxprec": work / "magika.fp8.onnx", "modelopt": _modelopt(model, feeds, data, work)}
    quantize_file(model, models["onnxprec"], calibration_data=str(calib))
    models["modelopt_fp16w"] = with_fp16_weights(models["modelopt"], work / "magika_mo_fp16w.onnx")
    models["onnxprec_fp32scale"] = with_fp32_scales(models["onnxprec"], work / "magika_fp32scale.onnx")
    ref = run_outputs(model, heldout)
    out: dict[str, object] = {"float_spec_vs_ort": magika_readings(ref, outputs(model, heldout, "spec"))}
    for engine in ENGINES:
        for name, path in models.items():
            if _skipped(name, engine):
                continue
            start = time.perf_counter()
            out[f"{name}/{engine}"] = magika_readings(ref, outputs(path, heldout, engine))
            log(f"magika {name}/{engine} {out[f'{name}/{engine}']} ({time.perf_counter() - start:.0f} s)")
    return out


def minilm(work: Path, log: Callable[[str], None], spec_batches: int) -> dict[str, object]:
    with np.load(MODELS / "minilm_l6_v2_bert_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    data = work / "minilm_calibration.npz"
    np.savez(data, **feeds)
    heldout = minilm_heldout(CORPUS / "paraphrase-minilm-l3" / "heldout")
    models = {"onnxprec": work / "minilm.fp8.onnx", "modelopt": _modelopt(MINILM, feeds, data, work),
              "modelopt_max": _modelopt(MINILM, feeds, data, work, ("--calibration_method", "max"))}  # fmt: skip
    quantize_file(MINILM, models["onnxprec"], calibration_data=str(data))
    models["modelopt_fp16w"] = with_fp16_weights(models["modelopt"], work / "minilm_mo_fp16w.onnx")
    models["modelopt_max_fp16w"] = with_fp16_weights(models["modelopt_max"], work / "minilm_mo_max_fp16w.onnx")
    models["onnxprec_fp32scale"] = with_fp32_scales(models["onnxprec"], work / "minilm_fp32scale.onnx")
    ref = [o["last_hidden_state"] for o in run_outputs(MINILM, heldout)]
    masks = [f["attention_mask"] for f in heldout]
    out: dict[str, object] = {"spec_batches": spec_batches, "sentences": sum(len(m) for m in masks)}
    for engine in ENGINES:
        sub = heldout if engine == "ort" else heldout[:spec_batches]
        n = len(sub)
        for name, path in models.items():
            if _skipped(name, engine):
                continue
            start = time.perf_counter()
            got = [o["last_hidden_state"] for o in outputs(path, sub, engine)]
            out[f"{name}/{engine}"] = minilm_readings(ref[:n], got, masks[:n])
            if engine == "ort" and n > spec_batches:  # the same readings on the spec's subset, side by side
                out[f"{name}/ort_subset"] = minilm_readings(
                    ref[:spec_batches], got[:spec_batches], masks[:spec_batches]
                )
            log(f"minilm {name}/{engine} {out[f'{name}/{engine}']} ({time.perf_counter() - start:.0f} s)")
    float_spec = [o["last_hidden_state"] for o in outputs(MINILM, heldout[:1], "spec")]
    out["float_spec_vs_ort_batch0"] = minilm_readings(ref[:1], float_spec, masks[:1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="magika,minilm")
    ap.add_argument("--spec-batches", type=int, default=8, help="MiniLM held-out batches (of 8) run under the spec")
    ap.add_argument("--out", type=Path, default=RESULTS / f"{dt.date.today():%Y-%m-%d}-fp8-spec.json")
    args = ap.parse_args()
    results = note_header("experiments.fp8_spec")
    np.seterr(over="ignore")  # FP16 overflow is a reading here (an output's inf), not a warning
    wanted = args.models.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "magika" in wanted:
            results["magika"] = magika(Path(tmp), print)
        if "minilm" in wanted:
            results["minilm"] = minilm(Path(tmp), print, args.spec_batches)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
