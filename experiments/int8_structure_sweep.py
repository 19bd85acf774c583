"""INT8's structure folds (same-type Casts, layout Transposes, per-channel affine chains) on many models: what each
removes, and the float outputs before and after on the same random feeds (ONNX Runtime, optimizations off).

    python experiments/int8_structure_sweep.py [--dynamic 1] MODEL.onnx [MODEL.onnx ...]

Dynamic dimensions are fed as ``--dynamic``; integer inputs as ones. A model ONNX Runtime cannot run on such feeds
prints its error (the float model's, not the folds').
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxprec.passes import LiftFloatConstantsPass, NameNodesPass
from onnxprec.quantization.activation_stats import quiet_onnx_ir
from onnxprec.quantization.int8._api import _fold_structure


def _feeds(session: Any, dynamic: int, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    feeds: dict[str, np.ndarray] = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else dynamic for d in info.shape]
        kind = info.type
        if kind in ("tensor(float)", "tensor(float16)"):
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32 if kind == "tensor(float)" else np.float16)
        elif kind in ("tensor(int64)", "tensor(int32)", "tensor(bool)"):
            feeds[info.name] = np.ones(shape, {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(kind, bool))
        else:
            return None
    return feeds


def _error(a: np.ndarray, b: np.ndarray) -> float:
    if np.asarray(a).dtype.kind != "f":
        return float(not np.array_equal(a, b))
    return float(np.abs(a.astype(np.float64) - b).max() / (np.abs(a).max() + 1e-12))


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--dynamic", type=int, default=1)
    args = parser.parse_args()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for path in args.models:
        name = path.parent.name if path.name == "model.onnx" else path.stem
        try:
            model = ir.load(path)
            with quiet_onnx_ir():
                NameNodesPass()(model)
                LiftFloatConstantsPass()(model)
                before = ir.serde.serialize_model(model).SerializeToString()
                tick = time.perf_counter()
                counts = _fold_structure(model)
                seconds = time.perf_counter() - tick
            if not any(counts.values()):
                print(f"{name}: unchanged ({seconds:.2f} s)")
                continue
            after = ir.serde.serialize_model(model).SerializeToString()
            reference, folded = ort.InferenceSession(before, options), ort.InferenceSession(after, options)
            feeds = _feeds(reference, args.dynamic, np.random.default_rng(0))
            if feeds is None:
                print(f"{name}: {counts}, inputs of other types: not run")
                continue
            error = max(_error(a, b) for a, b in zip(reference.run(None, feeds), folded.run(None, feeds)))
            print(f"{name}: {counts}, max relative error {error:.2e} ({seconds:.2f} s)")
        except Exception as e:  # one line per model, the sweep goes on
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")


if __name__ == "__main__":
    main()
