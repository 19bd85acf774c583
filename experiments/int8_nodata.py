"""INT8 without calibration data against INT8 with it, on the corpus (issue 24's "No data" rule: not worse than
1.5x the error with data on the median corpus model).

Each model's two INT8 results (with ``-d calib/`` and without data) are run on the held-out inputs and judged
against FP32 by the model's task metric (``benchmarks/corpus_metrics.py``). A result is taken from the corpus
cells (``~/.cache/onnxprec/corpus/cells/<model>/int8[_nodata]/*/out.onnx``, written even where the guard refused
it) when the merged results file names one; otherwise it is made here: without data with
``--random_calibration_data`` (the inputs with no synthetic form get random values), with data, where the corpus
cell timed out, with ``--no_accuracy_guard`` (no float fallback, so its error is an upper bound of the guarded
one's and the ratio a lower bound).

Two errors per result: the task error (1 - agreement for top-1/decision/strings/boxes, 1 - cosine, the noise power
10^(-SNR/10) for an SNR) and the largest relative L2 of a float output. The ratio is no-data over with-data
(both task errors 0: 1; only the with-data one 0: inf).

    python experiments/int8_nodata.py --out experiments/results/2026-11-29-int8-nodata.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import corpus, corpus_metrics  # noqa: E402
from zoo import corpus as zcorpus  # noqa: E402

MERGED = ROOT / "benchmarks/results/corpus-merged-2026-11-29.json"
_Q8 = [sys.executable, "-m", "onnxprec.cli", "quantize", "int8", "--log_level", "WARNING"]
TIMEOUT_S = 900


def task_error(judged: dict[str, Any]) -> float:
    value = float(judged["value"])
    if judged["metric"] == "snr":
        return 10 ** (-value / 10) if math.isfinite(value) else 0.0
    return max(0.0, 1.0 - value)


def ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def _cell_result(cells: dict[str, Any], tool: str) -> Path | None:
    cell = cells.get(tool, {})
    folder = cell.get("folder")
    if cell.get("outcome") in ("timeout", None) or not folder:
        return None
    out = Path(folder) / "out.onnx"
    return out if out.exists() else None


def _make(rec: dict[str, Any], work: Path, extra: list[str]) -> tuple[Path | None, int, str]:
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out.onnx"
    argv = [*_Q8, "--onnx_path", rec["path"], "--output_path", str(out), *extra]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, -9, f"stopped after {TIMEOUT_S} s"
    last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    return (out if out.exists() else None), proc.returncode, last


def judge(rec: dict[str, Any], path: Path, ref: list[dict[str, Any]], held: list[dict[str, Any]]) -> dict[str, Any]:
    got = corpus.run_outputs(path, held)
    return corpus_metrics.judge(rec["metric"], rec["bound"], ref, got, rec.get("output"), rec.get("metric_options"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "int8-nodata")
    args = parser.parse_args()
    manifest = zcorpus.load_manifest()["models"]
    merged = json.loads(MERGED.read_text())["models"]
    names = args.models.split(",") if args.models else list(merged)
    results = json.loads(args.out.read_text()) if args.out.exists() else {"models": {}}
    for name in names:
        if name in results["models"]:
            continue
        rec, cells = manifest[name], merged[name]["cells"]
        row: dict[str, Any] = {"metric": rec["metric"], "bound": rec["bound"]}
        held = corpus.batches(Path(rec["path"]).parent / "heldout")
        try:
            ref = corpus.run_outputs(Path(rec["path"]), held)
        except Exception as e:
            row["skipped"] = f"FP32 does not run: {type(e).__name__}"
            results["models"][name] = row
            continue
        for tool, extra in (("int8", ["-d", str(Path(rec["path"]).parent / "calib"), "--no_accuracy_guard"]),
                            ("int8:nodata", ["--random_calibration_data"])):  # fmt: skip
            side: dict[str, Any] = {"corpus_outcome": cells.get(tool, {}).get("outcome")}
            path = _cell_result(cells, tool)
            if path is not None:
                side["from"] = "corpus cell"
            else:
                path, rc, last = _make(rec, args.work / name / tool.replace(":", "_"), extra)
                side.update({"from": "run here: " + " ".join(extra[-1:]), "rc": rc, "last_line": last})
            if path is not None:
                try:
                    judged = judge(rec, path, ref, held)
                    side.update(value=judged["value"], passed=judged["passed"], max_rel_l2=judged.get("max_rel_l2"),
                                task_error=task_error(judged))  # fmt: skip
                except Exception as e:
                    side["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            row[tool] = side
            print(name, tool, {k: v for k, v in side.items() if k != "last_line"}, flush=True)
        a, b = row.get("int8:nodata", {}), row.get("int8", {})
        if "task_error" in a and "task_error" in b:
            row["task_ratio"] = ratio(a["task_error"], b["task_error"])
            row["rel_l2_ratio"] = ratio(a["max_rel_l2"] or 0.0, b["max_rel_l2"] or 0.0)
        results["models"][name] = row
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    pairs = [r for r in results["models"].values() if "rel_l2_ratio" in r]
    results["summary"] = {
        "pairs": len(pairs),
        "median_rel_l2_ratio": statistics.median(r["rel_l2_ratio"] for r in pairs) if pairs else None,
        "median_task_ratio": statistics.median(r["task_ratio"] for r in pairs) if pairs else None,
        "over_1_5x_rel_l2": sum(r["rel_l2_ratio"] > 1.5 for r in pairs),
        "nodata_destroyed": sorted(
            n for n, r in results["models"].items() if r.get("int8:nodata", {}).get("passed") is False
        ),
    }
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(results["summary"], indent=1, default=str))


if __name__ == "__main__":
    main()
