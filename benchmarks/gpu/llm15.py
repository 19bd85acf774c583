"""Held-out perplexity and ModelOpt's INT4 for the Qwen2.5-Coder runs of run_15b.sh (GPU machine or any machine).

    python llm15.py ppl IDS.npy MODEL.onnx...          one JSON line per model: held-out perplexity (windows 8-15 of
                                                      IDS, one ONNX Runtime CPU call each, as benchmarks.int4's
                                                      held_out_perplexity), model bytes, seconds
    python llm15.py modelopt IN OUT IDS.npy EPS       ModelOpt's int4.quantize awq_lite, calibrated on windows 0-7
                                                      of IDS (every input of the model completed by onnxprec's
                                                      llm_feeds), EPS its calibration_eps (comma separated), the head
                                                      kept in float as benchmarks.int4's modelopt rows

Standalone: imports onnxprec (PYTHONPATH) but not the benchmarks package, whose imports need the project's venv.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CALIBRATION = range(0, 8)
HELD_OUT = range(8, 16)
EXCLUDE = [r".*/lm_head"]  # ModelOpt's re.match from the start misses its own default "/lm_head" here


def _feeds(model: Path, ids: np.ndarray, windows: range) -> list[dict[str, np.ndarray]]:
    from onnxprec.llm_inputs import llm_feeds

    return llm_feeds(model, ids[windows.start : windows.stop], seq_len=ids.shape[1])


def perplexity(ids_npy: str, *models: str) -> None:
    import onnxruntime as ort

    from onnxprec.metrics import Perplexity

    ids = np.load(ids_npy)
    for name in models:
        path = Path(name)
        t0 = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = min(16, os.cpu_count() or 1)
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        ppl = Perplexity()
        for feed, i in zip(_feeds(path, ids, HELD_OUT), HELD_OUT, strict=True):
            ppl.update(sess.run(["logits"], feed)[0], ids[i : i + 1])
        del sess
        size = sum(f.stat().st_size for f in path.parent.iterdir() if f.name.startswith(path.name))
        row = {"model": str(path), "perplexity": round(float(ppl.value), 4), "mb": round(size / 1e6, 1)}
        print(json.dumps({**row, "eval_s": round(time.perf_counter() - t0, 1)}), flush=True)


def modelopt(src: str, dst: str, ids_npy: str, eps: str) -> None:
    import onnx
    from modelopt.onnx.quantization.int4 import quantize
    from onnxruntime.quantization import CalibrationDataReader

    feeds = iter(_feeds(Path(src), np.load(ids_npy), CALIBRATION))

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, Any] | None:
            return next(feeds, None)

    try:
        import cupy  # noqa: F401

        fuse: dict[str, bool] = {}
    except ImportError:  # without CuPy awq_lite's scale fusing calls CuPy's .get() on numpy (ModelOpt 0.47)
        fuse = {"awqlite_fuse_nodes": False}
    t0 = time.perf_counter()
    model = quantize(
        src,
        calibration_method="awq_lite",
        calibration_data_reader=Reader(),
        calibration_eps=eps.split(","),
        nodes_to_exclude=EXCLUDE,
        **fuse,
    )
    print(f"quantized in {time.perf_counter() - t0:.0f} s", flush=True)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model, dst, save_as_external_data=True, all_tensors_to_one_file=True, location=Path(dst).name + ".data"
    )
    print(f"saved {dst} at {time.perf_counter() - t0:.0f} s", flush=True)


def main() -> None:
    verb, args = sys.argv[1], sys.argv[2:]
    if verb == "ppl":
        perplexity(*args)
    elif verb == "modelopt":
        modelopt(*args)
    else:
        raise SystemExit(f"unknown verb {verb}: ppl or modelopt")


if __name__ == "__main__":
    main()
