"""Golden snapshot of every tool's results, to check that a refactoring leaves them unchanged.

Runs the command line of every tool (in this process, through :func:`onnxprec.cli.main`) on the small real
models in ``/work/shared/models`` (EfficientNet-Lite0 and MiniLM with their real inputs) and on a tiny
synthetic model, and records per run: the exit code, the ``error:`` line, stdout with the numbers that vary
between runs masked, the report JSON without timings and paths, and the sha256 of every file written.

    python tests/golden.py snapshot golden.json     # before the change
    python tests/golden.py compare golden.json      # after it: prints every difference, exit 1 if any

Not collected by pytest (the name matches neither ``*_test.py`` nor ``test_*.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

MODELS = Path("/work/shared/models")
_VOLATILE_KEYS = re.compile(
    r"(seconds|latency|_ms$|^ms|time|rss|memory|onnxprec_version|^input$|^output$|output_path|input_path|"
    r"output_dir|command|^path$|runs_per_second|throughput|sessions|peak)",
    re.IGNORECASE,
)


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
        return re.sub(r"/tmp/[^\s'\"]*/", "<tmp>/", value)
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def _mask(text: str) -> str:
    text = re.sub(r"/tmp/[^\s'\"]*/", "<tmp>/", text)
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


def _cases(tmp: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    eff = MODELS / "efficientnet_lite0.onnx"
    minilm = MODELS / "minilm_l6_v2_bert.onnx"
    eff_npz = tmp / "eff.npz"
    np.savez(
        eff_npz,
        **{
            onnx.load(eff, load_external_data=False).graph.input[0].name: np.load(
                MODELS / "efficientnet_lite0_input.npy"
            )[:4]
        },
    )
    minilm_npz = MODELS / "minilm_l6_v2_bert_inputs.npz"
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
        )
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

        pair(f"{tag}/evaluate", ["evaluate", m, str(fp16), "--data", d, "--latency_runs", "0"])
        pair(
            f"{tag}/evaluate_json",
            ["evaluate", m, str(fp16), "--data", d, "--latency_runs", "0", "--json", f"{o}/e.json"],
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


def snapshot(only: str | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in _cases(Path(tmp)).items():
            if only and not re.search(only, name):
                continue
            print(f"  {name}", file=sys.__stderr__, flush=True)
            results[name] = case()
    return results


def _stable(value: Any) -> Any:
    """Without what depends on the machine's speed: the target search's greedy steps after its bisection stop
    after ``target.REFINE_SECONDS``, so their number (and ``runs``) varies with the load; its decisions do not."""
    if isinstance(value, dict):
        out = {k: _stable(v) for k, v in value.items()}
        if "steps" in out and "runs" in out:
            out.pop("runs")
            out["steps"] = [s for s in out["steps"] if not (s.get("kind") == "emulated" and " more" in s.get("what"))]
        return out
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() | b.keys():
            if k not in b:
                out.append(f"{path}/{k}: removed (was {json.dumps(a[k])[:200]})")
            elif k not in a:
                out.append(f"{path}/{k}: added ({json.dumps(b[k])[:200]})")
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {json.dumps(a)[:300]} -> {json.dumps(b)[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("snapshot", "compare"))
    parser.add_argument("path")
    parser.add_argument("--only", help="Regex of the case names to run.")
    args = parser.parse_args()
    if not MODELS.is_dir():
        print(f"{MODELS} is missing", file=sys.stderr)
        return 2
    results = snapshot(args.only)
    if args.action == "snapshot":
        Path(args.path).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"{len(results)} cases written to {args.path}")
        return 0
    Path(args.path).with_suffix(".new.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    golden = json.loads(Path(args.path).read_text())
    if args.only:
        golden = {k: v for k, v in golden.items() if re.search(args.only, k)}
    diffs: list[str] = []
    _diff(_stable(golden), _stable(json.loads(json.dumps(results))), "", diffs)
    for line in sorted(diffs):
        print(line)
    print(f"{len(results)} cases, {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
