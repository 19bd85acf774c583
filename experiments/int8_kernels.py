"""Which kernels ONNX Runtime's CPU provider runs for INT8 models of MiniLM and EfficientNet-Lite0, per tool.

For each model: onnxprec's INT8 quantizer with its defaults, ONNX Runtime's ``quantize_static`` (QDQ, per channel,
MinMax: as its users run it) and ``quantize_dynamic`` (per channel), and ModelOpt 0.47's ``quantize_mode int8``
(in the anchors venv, when it exists) quantize the FP32 model on its calibration rows; then one ``onnxprec
evaluate`` run puts them beside FP32 on the evaluation rows: agreement, latency, and the kernel profile (nodes in
integer kernels / all kernel nodes, their share of kernel time, Q/DQ nodes left unfused). Prints a markdown table.

    python experiments/int8_kernels.py WORK [--models minilm effnet] [--latency_runs 20] [--profile_runs 5]

Data (../shared/models): MiniLM calibrates on rows 0-3 and is evaluated on rows 4-7 (one batch of 4 x 14 tokens);
EfficientNet-Lite0 calibrates on its 7 images and is evaluated on the same 7, one image a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

MODELS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "models"
ANCHORS = Path.home() / ".cache" / "onnxprec" / "anchors-venv" / "bin" / "python"
# name: (FP32 model, calibration rows, evaluation rows, evaluation batch size, rows per quantize_static batch)
MODELS = {
    "minilm": ("minilm_l6_v2_bert.onnx", slice(0, 4), slice(4, 8), 4, 4),
    "effnet": ("efficientnet_lite0.onnx", slice(0, 7), slice(0, 7), 1, 1),
}


def _arrays(model: str) -> dict[str, np.ndarray]:
    if model == "minilm":
        with np.load(MODELS_DIR / "minilm_l6_v2_bert_inputs.npz") as data:
            return {k: data[k] for k in data.files}
    return {"input": np.load(MODELS_DIR / "efficientnet_lite0_input.npy")}


def _ort_quantize(fp32: Path, calib: dict[str, np.ndarray], per_batch: int, work: Path) -> dict[str, Path]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            starts = range(0, len(next(iter(calib.values()))), per_batch)
            self.batches = iter([{k: v[i : i + per_batch] for k, v in calib.items()} for i in starts])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    static, dynamic = work / "ort_static.onnx", work / "ort_dynamic.onnx"
    if not static.exists():
        quantize_static(str(fp32), str(static), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        calibrate_method=CalibrationMethod.MinMax)  # fmt: skip
    if not dynamic.exists():
        quantize_dynamic(str(fp32), str(dynamic), per_channel=True)
    return {"ORT quantize_static QDQ MinMax": static, "ORT quantize_dynamic": dynamic}


def _quantize(model: str, work: Path) -> tuple[Path, dict[str, Path], Path, int]:
    file, calib_rows, eval_rows, batch, per_batch = MODELS[model]
    fp32 = MODELS_DIR / file
    arrays = _arrays(model)
    calib = {k: v[calib_rows] for k, v in arrays.items()}
    np.savez(work / "calib.npz", **calib)
    np.savez(work / "eval.npz", **{k: v[eval_rows] for k, v in arrays.items()})
    ours = work / "onnxprec.onnx"
    if not ours.exists():
        subprocess.run([sys.executable, "-m", "onnxprec.quantization", "--quantize_mode", "int8", "--onnx_path",
                        str(fp32), "--calibration_data", str(work / "calib.npz"), "--output_path", str(ours)],
                       check=True)  # fmt: skip
    candidates = {"onnxprec (defaults)": ours, **_ort_quantize(fp32, calib, per_batch, work)}
    modelopt = work / "modelopt.onnx"
    if ANCHORS.exists() and not modelopt.exists():
        source = work / "modelopt_input.onnx"  # ModelOpt rewrites its input file in place (adds value_info)
        shutil.copy(fp32, source)
        subprocess.run([str(ANCHORS), "-m", "modelopt.onnx.quantization", "--quantize_mode", "int8", "--onnx_path",
                        str(source), "--calibration_data_path", str(work / "calib.npz"), "--calibration_eps", "cpu",
                        "--output_path", str(modelopt)], check=False, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    if modelopt.exists():
        candidates["ModelOpt 0.47 int8"] = modelopt
    return fp32, candidates, work / "eval.npz", batch


def _row(name: str, kernels: dict[str, Any] | None, latency: float | None, ref: float | None) -> str:
    if kernels is None:
        return f"| {name} | - | - | - | - |"
    share = kernels["integer_time_share"]
    ops = sorted((op for op in kernels["op_types"] if op["integer"]), key=lambda op: -op["nodes"])
    kinds = ", ".join(f"{op['nodes']} {op['op_type']}" for op in ops) or "none"
    ratio = f"{latency / ref:.2f}x" if latency and ref else "-"
    return (
        f"| {name} | {kernels['integer_nodes']} / {kernels['nodes']} ({kinds}) | "
        f"{'-' if share is None else f'{share:.0%}'} | {kernels['qdq_nodes']} ({kernels['qdq_time_share']:.0%}) | "
        f"{ratio} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="Folder for the data, the quantized models and the reports.")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--latency_runs", type=int, default=20)
    parser.add_argument("--profile_runs", type=int, default=5)
    args = parser.parse_args()
    for model in args.models:
        work = args.work / model
        work.mkdir(parents=True, exist_ok=True)
        fp32, candidates, data, batch = _quantize(model, work)
        names = {"fp32": fp32, **candidates}
        report = work / "evaluate.json"
        command = [sys.executable, "-m", "onnxprec", "evaluate", *map(str, names.values()), "--data", str(data),
                   "--batch_size", str(batch), "--latency_runs", str(args.latency_runs), "--profile_runs",
                   str(args.profile_runs), "--report_json", str(report)]  # fmt: skip
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
        results = json.loads(report.read_text())["models"]
        ref = (results[0]["latency_ms"] or {}).get("median")
        print(f"\n{model}: | tool | nodes in integer kernels / all kernel nodes | integer share of kernel time | "
              "unfused Q/DQ (time share) | latency vs FP32 |")  # fmt: skip
        for label, result in zip(names, results):
            print(_row(label, result["kernels"], (result["latency_ms"] or {}).get("median"), ref))
        print()


if __name__ == "__main__":
    main()
