"""Held-out perplexity and ModelOpt's INT4 for the Qwen2.5-Coder runs of run_15b.sh (GPU machine or any machine).

    python llm15.py ppl IDS.npy MODEL.onnx...          one JSON line per model: held-out perplexity (windows 8-15 of
                                                      IDS, one ONNX Runtime CPU call each, as benchmarks.int4's
                                                      held_out_perplexity), model bytes, seconds
    python llm15.py modelopt IN OUT IDS.npy EPS       ModelOpt's int4.quantize awq_lite, calibrated on windows 0-7
                                                      of IDS (every input of the model completed by onnxprec's
                                                      llm_feeds), EPS its calibration_eps (comma separated), the head
                                                      kept in float as benchmarks.int4's modelopt rows
    python llm15.py genai OUT.json PROMPTS.npy ROUNDS PROVIDER NAME=MODEL...
                                                      onnxruntime-genai greedy generation (onnxprec's generate_models,
                                                      what `onnxprec evaluate --generate MODEL --data PROMPTS.npy
                                                      --max_new_tokens 128 --providers PROVIDER` runs) of each model in
                                                      turn, ROUNDS rounds after a warm-up round: the median prefill ms
                                                      of one prompt (its forward pass and the first new token) and
                                                      decode tokens/s, the first 20 generated ids of each prompt and
                                                      the greedy agreement with the first model; a model that fails is
                                                      recorded and skipped

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


NEW_TOKENS = int(os.environ.get("LLM15_NEW_TOKENS", "128"))  # fewer in the local CPU test only
SHOWN_IDS = 20


def genai(out: str, prompts_npy: str, rounds: str, provider: str, *models: str) -> None:
    from onnxprec.evaluate import generate_models

    prompts = np.load(prompts_npy)
    paths = dict(m.split("=", 1) for m in models)
    runs: dict[str, dict[str, Any]] = {
        k: {"model": v, "prefill_ms": [], "decode_tokens_per_s": []} for k, v in paths.items()
    }
    for r in range(int(rounds) + 1):  # round 0: the warm-up, not counted
        for name, path in paths.items():
            run = runs[name]
            if "error" in run:
                continue
            try:
                t0 = time.perf_counter()
                res = generate_models([path], data=prompts, providers=[provider], max_new_tokens=NEW_TOKENS).models[0]
            except Exception as e:  # a model onnxruntime-genai cannot load or run is a result too
                run["error"] = f"{type(e).__name__}: {e}"[:400]
                print(json.dumps({"round": r, "name": name, "error": run["error"]}), flush=True)
                continue
            prefill, decode = 1000 * res.prefill_seconds / len(prompts), float(res.decode_tokens_per_s or 0.0)
            if r:
                run["prefill_ms"].append(round(prefill, 2))
                run["decode_tokens_per_s"].append(round(decode, 2))
            run["sequences"], run["load_s"] = res.sequences, round(res.load_seconds, 2)
            row = {"round": r, "name": name, "prefill_ms": round(prefill, 2), "decode_tokens_per_s": round(decode, 2)}
            print(
                json.dumps({**row, "generated": res.generated_tokens, "wall_s": round(time.perf_counter() - t0, 1)}),
                flush=True,
            )
    first = next((run.get("sequences") for run in runs.values() if run.get("sequences")), None)
    for run in runs.values():
        sequences = run.pop("sequences", None)
        if not run["prefill_ms"]:
            continue
        run["prefill_ms_median"] = float(np.median(run["prefill_ms"]))
        run["decode_tokens_per_s_median"] = float(np.median(run["decode_tokens_per_s"]))
        run["first_ids"] = [seq[:SHOWN_IDS] for seq in sequences or []]
        if first is not None and sequences is not None:
            same = [sum(a == b for a, b in zip(x, y)) for x, y in zip(first, sequences)]
            run["agreement_with_first"] = sum(same) / max(1, sum(max(len(x), len(y)) for x, y in zip(first, sequences)))
            run["first_divergence"] = [
                next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(first, sequences)
            ]
    import onnxruntime_genai as og

    result = {
        "provider": provider, "genai": og.__version__, "genai_file": og.__file__, "prompts": list(prompts.shape),
        "new_tokens": NEW_TOKENS, "rounds": int(rounds), "models": runs,
    }  # fmt: skip
    Path(out).write_text(json.dumps(result, indent=1))
    for name, run in runs.items():
        print(name, {k: v for k, v in run.items() if k not in ("model",)}, flush=True)


def main() -> None:
    verb, args = sys.argv[1], sys.argv[2:]
    if verb == "ppl":
        perplexity(*args)
    elif verb == "modelopt":
        modelopt(*args)
    elif verb == "genai":
        genai(*args)
    else:
        raise SystemExit(f"unknown verb {verb}: ppl, modelopt or genai")


if __name__ == "__main__":
    main()
