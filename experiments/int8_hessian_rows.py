"""How much INT8's GPTQ rounding loses when its Conv Hessians are row samples (``grams.ROWS_PER_INPUT``).

For a corpus model (``python -m zoo.corpus build``), every Conv's GPTQ rounding is computed from the exact calibration
Hessian and from samples of R rows per input (every tensor sampled), and scored by ``tr(ΔWᵀ H ΔW)`` with ``H`` the
Hessian of the held-out inputs (the layer's output error there), relative to rounding to nearest.

    python experiments/int8_hessian_rows.py ppocrv4-rec [R ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from benchmarks.corpus import batches
from onnxprec.quantization.algorithms.int8 import dequantize_weight, quantize_weight
from onnxprec.quantization.int8 import _api, grams
from onnxprec.quantization.int8._options import Int8Options
from onnxprec.quantization.int8._report import Int8Report
from onnxprec.quantization.int8.decide import _gptq, _matrix
from onnxprec.reference import run_reference

EVERY = 1 << 40


def main(name: str, rates: list[int]) -> None:
    root = Path.home() / ".cache" / "onnxprec" / "corpus" / "models" / name
    options = Int8Options(calibration_data=str(root / "calib"))
    run = _api.Int8Run(str(root / "model.onnx"), options, Int8Report("ort-cpu", options.method, "fp32"), None)
    _api._load_and_place(run)
    geometries = _api._observers(run.plan, options)[3].geometries
    calib, held = batches(root / "calib"), batches(root / "heldout")
    grams.EXACT_MULTIPLY_ADDS = 0  # every tensor sampled but by the exact observers (EVERY rows per input)
    exact = grams.HessianObserver(geometries, len(calib), rows_per_input=EVERY)
    sampled = {r: grams.HessianObserver(geometries, len(calib), rows_per_input=r) for r in rates}
    held_out = grams.HessianObserver(geometries, len(held), rows_per_input=EVERY)
    wanted = lambda value: str(value.name) in geometries  # noqa: E731
    run_reference(run.model, calib, select=wanted, observers=[exact, *sampled.values()])
    run_reference(run.model, held, select=wanted, observers=[held_out])
    ratios: dict[str, list[float]] = {"exact": [], **{str(r): [] for r in rates}}
    for layer in run.plan.layers:
        tensor = str(layer.activation.name)
        if layer.node.op_type != "Conv" or tensor not in exact.hessians or tensor not in held_out.hessians:
            continue
        h = held_out.hessians[tensor]
        groups, k = h.shape[0], h.shape[-1]
        if exact.sampled[tensor] < k:
            continue
        w = _matrix(layer).astype(np.float64)

        def score(q: np.ndarray, scales: np.ndarray, w: np.ndarray = w, h: np.ndarray = h, g: int = groups) -> float:
            delta = (dequantize_weight(q, scales, axis=0) - w).reshape(g, w.shape[0] // g, -1)
            return float(np.einsum("gmk,gkl,gml->", delta, h, delta))

        rtn = score(*quantize_weight(w, axis=0))
        if rtn <= 0:
            continue
        ratios["exact"].append(score(*_gptq(w, exact.hessians[tensor], True)) / rtn)
        for r in rates:
            enough = tensor in sampled[r].hessians and sampled[r].sampled[tensor] >= k
            ratios[str(r)].append(score(*_gptq(w, sampled[r].hessians[tensor], True)) / rtn if enough else 1.0)
    for key, values in ratios.items():
        print(f"{name}: Hessian {key} rows per input: {len(values)} Convs, GPTQ's held-out error / RTN's: "
              f"mean {np.mean(values):.4f}, median {np.median(values):.4f}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], [int(r) for r in sys.argv[2:]] or [8, 32, 128])
