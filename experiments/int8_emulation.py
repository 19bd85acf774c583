"""How well the INT8 emulation session matches the real INT8 model (issue 18, float fallback).

For one model and calibration file: the real all-INT8 model's error (built and run by ONNX Runtime with its fusions,
as the float fallback checks it) beside the emulation's; then, per layer, the error with that layer alone in float,
emulated and (``--real``) real, and the rank correlation of the two sets of gains (what the search ranks by).

    python -m experiments.int8_emulation --onnx_path M --calibration_data D [--real] [--metric rel_l2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def _ranks(values: list[float]) -> np.ndarray:
    return np.argsort(np.argsort(np.asarray(values))).astype(np.float64)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx_path", required=True)
    parser.add_argument("--calibration_data", required=True)
    parser.add_argument("--metric", default="rel_l2")
    parser.add_argument("--real", action="store_true", help="also each layer alone in float for real (slow)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from onnxprec._io import load_model
    from onnxprec.accuracy import AccuracyTarget, ReferenceOutputs
    from onnxprec.quantization.int8 import _api, fallback
    from onnxprec.quantization.int8._options import Int8Options
    from onnxprec.quantization.int8._report import Int8Report
    from onnxprec.quantization.int8.accuracy_steps import apply_decisions
    from onnxprec.quantization.int8.decide import decide, plan_for
    from onnxprec.quantization.int8.emulation import Int8Emulator

    target = AccuracyTarget.parse(f"{args.metric}{'>=' if args.metric == 'cosine' else '<='}0")
    options = Int8Options(calibration_data=args.calibration_data, target_accuracy=str(target))
    model = load_model(args.onnx_path)
    _api._sanitize(model, options)
    plan = plan_for(model, options)
    keep = ReferenceOutputs()
    stats, data = _api._calibrate(model, plan, options, Int8Report("ort-cpu", options.method, "fp32"), keep)
    decisions = decide(model, plan, stats, options)
    names = [layer.name for layer in plan.layers if layer.name in decisions.layers]

    def bad(m: Any) -> float:
        value = m.worst(args.metric)
        return 1 - value if args.metric == "cosine" else value

    def real(floats: list[str]) -> Any:
        candidate, _ = apply_decisions(model, options, decisions, floats)
        return fallback.measure(candidate, target, keep)

    result: dict[str, Any] = {"model": args.onnx_path, "layers": len(names), "metric": args.metric}
    tick = time.perf_counter()
    all_real = real([])
    result["real_check_s"] = time.perf_counter() - tick
    tick = time.perf_counter()
    with Int8Emulator(model, plan, decisions, options, names) as emulator:
        result["emulator_build_s"] = time.perf_counter() - tick
        tick = time.perf_counter()
        all_emulated = emulator.measure([], target, keep)
        result["emulated_check_s"] = time.perf_counter() - tick
        result["all_int8"] = {"real": bad(all_real), "emulated": bad(all_emulated)}
        print(f"{len(names)} layers; all INT8 {args.metric}: real {bad(all_real):.5g}, emulated "
              f"{bad(all_emulated):.5g}; real check {result['real_check_s']:.2f} s, emulator build "
              f"{result['emulator_build_s']:.2f} s, emulated check {result['emulated_check_s']:.3f} s")  # fmt: skip
        rows = []
        for name in names:
            row = {"layer": name, "emulated": bad(emulator.measure([name], target, keep))}
            if args.real:
                row["real"] = bad(real([name]))
            rows.append(row)
    result["alone_in_float"] = rows
    if args.real:
        base_e, base_r = result["all_int8"]["emulated"], result["all_int8"]["real"]
        gains_e = [base_e**2 - r["emulated"] ** 2 for r in rows]
        gains_r = [base_r**2 - r["real"] ** 2 for r in rows]
        rho = float(np.corrcoef(_ranks(gains_e), _ranks(gains_r))[0, 1])
        top = max(1, len(rows) // 10)
        best_r = set(np.argsort(gains_r)[::-1][:top].tolist())
        best_e = set(np.argsort(gains_e)[::-1][:top].tolist())
        result["spearman_gains"] = rho
        result[f"top{top}_overlap"] = len(best_r & best_e)
        print(f"Spearman of the gains (emulated vs real): {rho:.3f}; top {top} overlap {len(best_r & best_e)}")
        for r in sorted(rows, key=lambda r: r["real"])[:8]:
            print(f"  {r['layer']:50s} real {r['real']:.5g}  emulated {r['emulated']:.5g}")
    if data is not None:
        data.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
