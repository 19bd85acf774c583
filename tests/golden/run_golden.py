"""Golden snapshot of every tool's results, to check that a change leaves them as they were (or says which changed).

Runs the command line of every tool (in this process, through :func:`onnxprec.cli.main`) on two small real models
(EfficientNet-Lite0 and MiniLM with their real inputs, from ``../shared/models`` or the zoo cache) and on a tiny
synthetic model, and records per run a small summary: the exit code, the ``error:`` lines, the report's summary line
(else stdout's first line), the sha256 of every file written (one combined digest when a run writes more than
``_MAX_FILES``), and sha256 digests of stdout with the numbers that vary between runs masked and of the report JSON
without timings and paths. Models are never stored: ``golden.json`` beside this file is the committed snapshot and
records the sha256 of the input files it was made from.

    python tests/golden/run_golden.py compare      # prints every difference from golden.json, exit 1 if any
    python tests/golden/run_golden.py snapshot     # rewrites golden.json (after a change meant to change results)

``golden_test.py`` (slow) runs ``compare`` where the inputs are present and skips with a message otherwise.

Linear algebra runs on one OpenBLAS thread, as in the test suite (conftest.py): GPTQ's results depend on the number
of threads (their sums in another order), so a snapshot taken on one machine compares equal on another.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: see the module docstring

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxprec._testing import shared_path

GOLDEN = Path(__file__).with_name("golden.json")
INPUTS = (
    "efficientnet_lite0.onnx",
    "efficientnet_lite0_input.npy",
    "minilm_l6_v2_bert.onnx",
    "minilm_l6_v2_bert_inputs.npz",
)
_MAX_FILES = 8
_PATHS: list[str] = []
"""The inputs' folder as a run spells it (given, absolute, resolved): replaced by ``<models>`` in reports and output,
so that a snapshot taken in one checkout compares equal in another (CI's clone, its own copy of ../shared)."""


def _unpath(text: str) -> str:
    for path in _PATHS:
        text = text.replace(path, "<models>")
    return re.sub(r"/tmp/[^\s'\"]*/", "<tmp>/", text)


_VOLATILE_KEYS = re.compile(
    r"(seconds|latency|_ms$|^ms|time|rss|memory|onnxprec_version|^input$|^output$|output_path|input_path|"
    r"output_dir|command|^path$|runs_per_second|throughput|sessions|peak)",
    re.IGNORECASE,
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _folders() -> list[Path]:
    """Where the real-model inputs may be: ``../shared/models`` beside the checkout, then the zoo cache."""
    zoo = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo"))
    return [folder for folder in (shared_path("models"), zoo) if folder is not None and folder.is_dir()]


def find_inputs(expected: dict[str, str] | None = None) -> Path | str:
    """The first folder holding every file of ``INPUTS`` (with the sha256 in ``expected`` when given), or why none
    does (a line for a skip message)."""
    reasons = []
    for folder in _folders():
        missing = [name for name in INPUTS if not (folder / name).is_file()]
        if missing:
            reasons.append(f"{folder} lacks {', '.join(missing)}")
            continue
        changed = [name for name in INPUTS if expected and _sha256(folder / name) != expected.get(name)]
        if changed:
            reasons.append(f"{folder} holds other versions of {', '.join(changed)} than the snapshot's")
            continue
        return folder
    searched = "; ".join(reasons) or "neither ../shared/models nor the zoo cache ($ONNXPREC_ZOO) exists"
    return f"the golden snapshot's real-model inputs were not found ({searched})"


def _tiny(folder: Path) -> tuple[Path, Path]:
    """A MatMul -> Add -> Relu -> MatMul -> Softmax model with 64x64 weights, and one .npz of inputs."""
    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [64, 64], rng.standard_normal((64, 64)).astype(np.float32).ravel())
    b1 = helper.make_tensor("b1", TensorProto.FLOAT, [64], rng.standard_normal(64).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [64, 32], rng.standard_normal((64, 32)).astype(np.float32).ravel())
    big = helper.make_tensor("big", TensorProto.FLOAT, [1], [1000.0])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["a"], name="add1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "big"], ["m"], name="scale_up"),
        helper.make_node("MatMul", ["m", "w2"], ["y"], name="mm2"),
        helper.make_node("Softmax", ["y"], ["out"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32])],
        [w1, b1, w2, big],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tiny.onnx"
    onnx.save(model, path)
    data = folder / "tiny.npz"
    np.savez(data, x=rng.standard_normal((4, 64)).astype(np.float32))
    return path, data


def _clean(value: Any) -> Any:
    """The report without timings, versions and paths (which differ between runs and checkouts)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not _VOLATILE_KEYS.search(str(k))}
    if isinstance(value, list):
        items = [_clean(v) for v in value]
        if items and all(isinstance(v, dict) and "op_type" in v for v in items):  # a kernel profile: slowest first
            items.sort(key=lambda v: (str(v["op_type"]), str(v.get("provider"))))
        return items
    if isinstance(value, str):
        return _unpath(value)
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def _mask(text: str) -> str:
    text = _unpath(text)
    text = re.sub(r"\b\d+(\.\d+)? ?(s|ms|MiB|MB|GiB|µs)\b", "<t>", text)
    text = re.sub(r"(latency|ms/batch)[^\n]*", r"\1 <masked>", text)
    text = re.sub(r"\b\d+\.\d%", "<share>", text)  # a kernel profile's time shares (one decimal)
    return text


def _hash_files(folder: Path, before: set[Path]) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p not in before and p.suffix not in (".json", ".html"):
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run(argv: list[str], folder: Path, report_flag: str = "--report_json") -> dict[str, Any]:
    from onnxprec import cli

    before = {p for p in folder.rglob("*")}
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    full = [*argv, report_flag, str(report)] if report_flag else argv
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(full)
        except SystemExit as e:  # argparse
            rc = int(e.code or 0)
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error:") or ": error:" in line]
    result: dict[str, Any] = {
        "rc": rc,
        "errors": [_mask(e) for e in errors],
        "stdout": _mask(out.getvalue()),
        "files": _hash_files(folder, before | {report}),
    }
    if report.exists():
        result["report"] = _clean(json.loads(report.read_text()))
    for p in sorted(set(folder.rglob("*.json")) - before - {report}):
        result.setdefault("json_files", {})[str(p.relative_to(folder))] = _clean(json.loads(p.read_text()))
    for p in set(folder.rglob("*")) - before:
        if p.is_file():
            p.unlink()
    return result


def _cases(tmp: Path, models: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    eff = models / "efficientnet_lite0.onnx"
    minilm = models / "minilm_l6_v2_bert.onnx"
    eff_npz = tmp / "eff.npz"
    np.savez(
        eff_npz,
        **{
            onnx.load(eff, load_external_data=False).graph.input[0].name: np.load(
                models / "efficientnet_lite0_input.npy"
            )[:4]
        },
    )
    minilm_npz = models / "minilm_l6_v2_bert_inputs.npz"
    tiny, tiny_npz = _tiny(tmp)
    out = tmp / "out"
    out.mkdir()
    o = str(out)
    cases: dict[str, Callable[[], dict[str, Any]]] = {}

    def add(name: str, argv: list[str], report_flag: str = "--report_json") -> None:
        cases[name] = lambda: _run(argv, out, report_flag)

    for model, data, tag in ((tiny, tiny_npz, "tiny"), (eff, eff_npz, "eff"), (minilm, minilm_npz, "minilm")):
        m, d = str(model), str(data)
        add(
            f"{tag}/autocast",
            ["autocast", "--onnx_path", m, "--output_path", f"{o}/a.onnx", "-d", d, "--keep_io_types"],
        )
        add(
            f"{tag}/autocast_bf16_random",
            ["autocast", "--onnx_path", m, "--output_path", f"{o}/b.onnx", "-t", "bf16"]
            if tag != "minilm"
            else [
                "autocast",
                "--onnx_path",
                m,
                "--output_path",
                f"{o}/b.onnx",
                "-t",
                "bf16",
                "--input_shapes",
                "input_ids:2x16,attention_mask:2x16,token_type_ids:2x16",
            ],
        )
        add(
            f"{tag}/autocast_target",
            [
                "autocast",
                "--onnx_path",
                m,
                "--output_path",
                f"{o}/t.onnx",
                "-d",
                d,
                "--keep_io_types",
                "--target_accuracy",
                "rel_l2<=1e-3",
            ],
        )
        if tag != "eff":  # EfficientNet has Conv weights only (and one Gemm)
            for method in ("rtn", "awq_lite", "gptq"):
                add(
                    f"{tag}/int4_{method}_qdq",
                    [
                        "quantize",
                        "int4",
                        "--onnx_path",
                        m,
                        "--output_path",
                        f"{o}/q.onnx",
                        "--calibration_method",
                        method,
                        "--calibration_data",
                        d,
                        "--block_size",
                        "32",
                        "-ne",
                    ],
                )
            add(
                f"{tag}/int4_rtn_matmulnbits",
                [
                    "quantize",
                    "int4",
                    "--onnx_path",
                    m,
                    "--output_path",
                    f"{o}/n.onnx",
                    "--calibration_method",
                    "rtn",
                    "--output_format",
                    "matmulnbits",
                    "--block_size",
                    "32",
                    "-ne",
                ],
            )
            add(
                f"{tag}/int4_awq_lite_matmulnbits",
                [
                    "quantize",
                    "int4",
                    "--onnx_path",
                    m,
                    "--output_path",
                    f"{o}/n.onnx",
                    "--calibration_method",
                    "awq_lite",
                    "--calibration_data",
                    d,
                    "--output_format",
                    "matmulnbits",
                    "--block_size",
                    "32",
                    "-ne",
                ],
            )
        add(f"{tag}/int8", ["quantize", "int8", "--onnx_path", m, "--output_path", f"{o}/i8.onnx", "-d", d])
        add(f"{tag}/preprocess", ["preprocess", "--input", m, "--output", f"{o}/p.onnx"])
        add(
            f"{tag}/preprocess_opset21",
            [
                "preprocess",
                "--input",
                m,
                "--output",
                f"{o}/p.onnx",
                "--opset",
                "21",
                "--save_as_external_data",
                "--all_tensors_to_one_file",
            ],
        )
        add(
            f"{tag}/dump",
            ["dump", "--onnx_path", m, "--calibration_data", d, "--dump_float", "--output_dir", f"{o}/dump"],
        )  # the .txt files the first 1024 values (the default; every value is in the .bin files)
    # Pairs for evaluate and compare: the model and its AutoCast conversion, made here first.
    for model, data, tag in ((tiny, tiny_npz, "tiny"), (eff, eff_npz, "eff"), (minilm, minilm_npz, "minilm")):
        m, d = str(model), str(data)
        fp16 = tmp / f"{tag}.fp16.onnx"

        def pair(
            name: str, argv: list[str], model: str = m, fp16: Path = fp16, data: str = d, flag: str = "--report_json"
        ) -> None:
            def go() -> dict[str, Any]:
                if not fp16.exists():
                    from onnxprec.autocast import convert_file

                    convert_file(model, fp16, calibration_data=data, keep_io_types=True)
                return _run(argv, out, flag)

            cases[name] = go

        pair(f"{tag}/evaluate", ["evaluate", m, str(fp16), "--data", d, "--latency_runs", "0", "--profile_runs", "3"])
        pair(
            f"{tag}/evaluate_json",
            [
                "evaluate",
                m,
                str(fp16),
                "--data",
                d,
                "--latency_runs",
                "0",
                "--profile_runs",
                "3",
                "--json",
                f"{o}/e.json",
            ],
            flag="",
        )
        pair(f"{tag}/compare", ["compare", m, str(fp16), "--calibration_data", d])
        pair(
            f"{tag}/compare_verify",
            [
                "compare",
                m,
                str(fp16),
                "--calibration_data",
                d,
                "--verify",
                "--json",
                f"{o}/c.json",
                "--html",
                f"{o}/c.html",
            ],
            flag="",
        )
    # Reported errors (one line each).
    t = str(tiny)
    add("err/missing_input", ["autocast", "--onnx_path", f"{tmp}/nope.onnx"])
    add("err/bad_regex", ["autocast", "--onnx_path", t, "--output_path", f"{o}/x.onnx", "-ne", "("])
    add("err/output_is_input", ["autocast", "--onnx_path", t, "--output_path", t])
    add("err/report_is_input", ["autocast", "--onnx_path", t, "--output_path", f"{o}/x.onnx"], report_flag="")
    cases["err/report_is_input"] = lambda: _run(
        ["autocast", "--onnx_path", t, "--output_path", f"{o}/x.onnx", "--report_json", t], out, ""
    )
    add(
        "err/report_folder_missing",
        ["autocast", "--onnx_path", t, "--output_path", f"{o}/x.onnx", "--report_json", f"{tmp}/no/r.json"],
        report_flag="",
    )
    add(
        "err/bad_calib_names",
        ["quantize", "int4", "--onnx_path", t, "--output_path", f"{o}/x.onnx", "--calibration_data", str(minilm_npz)],
    )
    add("err/int4_bad_block", ["quantize", "int4", "--onnx_path", t, "--block_size", "48"])
    add("err/preprocess_missing", ["preprocess", "--input", f"{tmp}/nope.onnx"])
    add("err/preprocess_out_is_in", ["preprocess", "--input", t, "--output", t])
    add("err/dump_out_folder", ["dump", "--onnx_path", t, "--output_dir", f"{tmp}/no/such"])
    add("err/compare_json_is_input", ["compare", t, t, "--json", t], report_flag="")
    add("err/compare_html_folder", ["compare", t, t, "--html", f"{tmp}/no/x.html"], report_flag="")
    add("err/evaluate_json_is_input", ["evaluate", t, "--json", t], report_flag="")
    add("err/evaluate_bad_batch", ["evaluate", t, "--batch_size", "0"])
    add("err/autocast_corrupt", ["autocast", "--onnx_path", str(tiny_npz)])
    return cases


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The small record of one run kept in the snapshot (see the module docstring)."""
    report = result.get("report") or next(iter(result.get("json_files", {}).values()), None)
    summary = report.get("summary") if isinstance(report, dict) else None
    files = result["files"]
    if len(files) > _MAX_FILES:
        files = {f"{len(files)} files": _digest(files)}
    return {
        "rc": result["rc"],
        "errors": result["errors"],
        "summary": summary if isinstance(summary, str) else result["stdout"].split("\n", 1)[0],
        "files": files,
        "stdout_sha256": _digest(result["stdout"]),
        "report_sha256": None if report is None else _digest(report),
    }


def snapshot(models: Path, only: str | None = None) -> dict[str, Any]:
    """Every case's :func:`summarize` record (the cases whose name matches the regex ``only``), by name."""
    results: dict[str, Any] = {}
    _PATHS[:] = sorted({str(models), os.path.abspath(models), str(models.resolve())}, key=len, reverse=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in _cases(Path(tmp), models).items():
            if only and not re.search(only, name):
                continue
            print(f"  {name}", file=sys.__stderr__, flush=True)
            results[name] = summarize(case())
    return results


def differences(golden: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """One line per case and field that differs between two snapshots' cases, sorted."""
    out: list[str] = []
    for name in sorted(golden.keys() | results.keys()):
        if name not in results:
            out.append(f"{name}: not run")
        elif name not in golden:
            out.append(f"{name}: not in the snapshot")
        else:
            for key in sorted(golden[name].keys() | results[name].keys()):
                was, now = golden[name].get(key), results[name].get(key)
                if was != now:
                    out.append(f"{name} {key}: {json.dumps(was)[:300]} -> {json.dumps(now)[:300]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("snapshot", "compare"))
    parser.add_argument("path", nargs="?", type=Path, default=GOLDEN, help="The snapshot (default: %(default)s).")
    parser.add_argument("--only", help="Regex of the case names to run.")
    args = parser.parse_args()
    golden = json.loads(args.path.read_text()) if args.action == "compare" else None
    models = find_inputs(golden["inputs"] if golden else None)
    if isinstance(models, str):
        print(models, file=sys.stderr)
        return 2
    results = snapshot(models, args.only)
    if golden is None:
        inputs = {name: _sha256(models / name) for name in INPUTS}
        args.path.write_text(json.dumps({"inputs": inputs, "cases": results}, indent=1, sort_keys=True) + "\n")
        print(f"{len(results)} cases written to {args.path}")
        return 0
    cases = {k: v for k, v in golden["cases"].items() if not args.only or re.search(args.only, k)}
    diffs = differences(cases, results)
    print("\n".join([*diffs, f"{len(results)} cases, {len(diffs)} differences"]))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
