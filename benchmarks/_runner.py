"""One converter run, as a user would start it: ``python benchmarks/_runner.py TOOL --input IN --output OUT``.

A standalone script (stdlib only at the top; it runs in the project venv or in the anchors venv, never imports
the ``benchmarks`` package). The harness wraps it in ``/usr/bin/time -v`` for whole-process wall time and peak
RSS; the script itself reports, as one line ``@@BENCH {json}`` on stdout, the time spent importing the tool and
the conversion-only time (load + convert + save, the tool's own entry point, without interpreter start-up and
imports).

Tools: :data:`TOOLS`, each a function that imports the tool (timed as ``import_s``) and returns its conversion
through the entry point users call (timed as ``convert_s``: the CLI ``main`` where the tool has one); the commands
users type for the same conversions are :mod:`benchmarks.tools`' and :mod:`benchmarks.int4`'s tables.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MARKER = "@@BENCH "
# never import benchmarks/*.py (harness.py, output_metrics.py...) as top-level modules by accident
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if not p or str(Path(p).resolve()) != _HERE]


Convert = Callable[[], Any]  # the tool's conversion (load + convert + save); returns its exit code or None


def _autocast_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--onnx_path", args.input, "--output_path", args.output, "--keep_io_types"]
    return argv + (["--data_max", args.data_max] if args.data_max is not None else [])


def _load(path: str) -> tuple[Any, bool]:
    """onnx.load, telling whether the weights were external (so that the result keeps them external)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(path, load_external_data=False)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    if external:
        load_external_data_for_model(model, str(Path(path).parent))
    return model, external


def _save(model: Any, path: str, external: bool) -> None:
    import onnx

    if external or model.ByteSize() > 2_000_000_000:
        onnx.save_model(
            model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=Path(path).name + ".data"
        )
    else:
        onnx.save_model(model, path)


def _rewrite(args: argparse.Namespace, convert: Callable[[Any], Any]) -> Convert:
    """Loads the model, converts it in memory and saves it (external data kept external)."""

    def run() -> None:
        model, external = _load(args.input)
        _save(convert(model), args.output, external)

    return run


def _onnxprec(args: argparse.Namespace) -> Convert:
    import onnxprec.autocast  # noqa: F401  (the CLI imports it lazily: count it as import time)
    from onnxprec.cli import autocast_main

    argv = _autocast_argv(args)
    argv += ["--report_json", args.report_json] if args.report_json else []
    argv += ["-d", args.inputs] if args.inputs else []
    argv += ["--target_accuracy", args.target] if args.target else []
    return lambda: autocast_main(argv)


def _modelopt(args: argparse.Namespace) -> Convert:
    from modelopt.onnx.autocast.__main__ import main as modelopt_main

    return lambda: modelopt_main(_autocast_argv(args)) and None


def _baseline_loadsave(args: argparse.Namespace) -> Convert:
    import onnx  # noqa: F401  (imported by _load: count it as import time)

    return _rewrite(args, lambda m: m)


def _occ_fp16(args: argparse.Namespace) -> Convert:
    from onnxconverter_common.float16 import convert_float_to_float16

    return _rewrite(args, lambda m: convert_float_to_float16(m, keep_io_types=True))


def _ort_fp16(args: argparse.Namespace) -> Convert:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return _rewrite(args, lambda m: convert_float_to_float16(m, keep_io_types=True))


def _occ_amp(args: argparse.Namespace) -> Convert:
    import numpy as np
    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    if not args.inputs:
        raise SystemExit("this tool needs --inputs (an .npz of the model's real inputs)")
    with np.load(args.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    kw = {"rtol": args.rtol, "atol": args.atol, "keep_io_types": True}
    return _rewrite(args, lambda m: auto_convert_mixed_precision(m, feeds, **kw))


def _onnxprec_int4(args: argparse.Namespace) -> Convert:
    from onnxprec.quantization.int4._cli import add_arguments
    from onnxprec.quantization.int4._cli import run as int4_run

    argv = ["--onnx_path", args.input, "--output_path", args.output]
    if args.method != "default":  # "default": the tool's defaults, only the data, budget and report flags
        argv += ["--calibration_method", args.method]
        argv += ["--block_size", str(args.block_size), "--output_format", args.format]
        argv += ["--nodes_to_exclude", *args.exclude]
        if not args.exclude:  # every layer, as the builder's -p int4: the embedding (and a tied head) too
            argv.append("--quantize_embeddings")
        argv += ["--use_zero_point"] if args.zero_point else []
    argv += ["--calibration_data", args.calib] if args.calib else []
    argv += ["--report_json", args.report_json] if args.report_json else []
    argv += ["--size_budget_mb", str(args.size_budget_mb)] if args.size_budget_mb else []
    argv += ["--no_accuracy_guard"] if args.no_accuracy_guard else []
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return lambda: int4_run(ap.parse_args(argv))


def _reader(folder: str | None) -> Any:
    """An ONNX Runtime ``CalibrationDataReader`` of the ``.npz`` feeds of ``folder``, in name order (None: None)."""
    if not folder:
        return None
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader

    files = sorted(Path(folder).glob("*.npz"))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(files)

        def get_next(self) -> dict[str, Any] | None:
            name = next(self.it, None)
            if name is None:
                return None
            with np.load(name) as z:
                return {k: z[k] for k in z.files}

    return Reader()


def _modelopt_int4(args: argparse.Namespace) -> Convert:
    # its Python API: ModelOpt's CLI hides the method and the block size
    from modelopt.onnx.quantization.int4 import quantize

    def run() -> None:
        model = quantize(
            args.input,
            calibration_method=args.method,
            calibration_data_reader=_reader(args.calib),
            calibration_eps=["cpu"],
            use_zero_point=args.zero_point,
            block_size=args.block_size,
            nodes_to_exclude=args.exclude,
            # without CuPy, awq_lite's fusing of the scales into a preceding LayerNorm/MatMul/Mul initializer calls
            # CuPy's .get() on a numpy array (AttributeError, ModelOpt 0.47): the scales go into Mul nodes instead
            **({"awqlite_fuse_nodes": False} if args.method == "awq_lite" else {}),
        )
        _save(model, args.output, model.ByteSize() > 2_000_000_000)

    return run


def _ort_int4(args: argparse.Namespace) -> Convert:
    import re

    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    def run() -> None:
        model, external = _load(args.input)
        # ORT takes exact node names: the regexes resolved to the names they match
        excluded = [n.name for n in model.graph.node if any(re.search(p, n.name) for p in args.exclude)]
        config: Any
        if args.method == "hqq":  # MatMulNBits with float zero points only; no Gather
            config = HQQWeightOnlyQuantConfig(block_size=args.block_size, bits=4)
        else:  # matmulnbits with no exclusion: the embedding Gather too (GatherBlockQuantized), as the builder
            every = args.format == "matmulnbits" and not args.exclude
            config = DefaultWeightOnlyQuantConfig(
                block_size=args.block_size,
                is_symmetric=not args.zero_point,
                accuracy_level=4,
                quant_format=QuantFormat.QOperator if args.format == "matmulnbits" else QuantFormat.QDQ,
                op_types_to_quantize=("MatMul", "Gather") if every else None,
            )
        q = MatMulNBitsQuantizer(model, nodes_to_exclude=excluded, algo_config=config)
        q.process()
        _save(q.model.model, args.output, external)

    return run


def _ort_int8(args: argparse.Namespace) -> Convert:
    # --method: a CalibrationMethod (QDQ per channel), SmoothQuant (MinMax with it) or dynamic (quantize_dynamic)
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_dynamic, quantize_static

    if args.method == "dynamic":
        return lambda: quantize_dynamic(args.input, args.output, per_channel=True)
    sq = {"SmoothQuant": True} if args.method == "SmoothQuant" else None
    method = CalibrationMethod["MinMax" if sq else args.method]
    kw = {"quant_format": QuantFormat.QDQ, "per_channel": True, "calibrate_method": method, "extra_options": sq}
    return lambda: quantize_static(args.input, args.output, _reader(args.calib), **kw)


def _onnxprec_int8(args: argparse.Namespace) -> Convert:
    from onnxprec.quantization.int8._cli import add_arguments
    from onnxprec.quantization.int8._cli import run as int8_run

    argv = ["--onnx_path", args.input, "--output_path", args.output]
    argv += ["--calibration_data", args.calib] if args.calib else []
    argv += ["--report_json", args.report_json] if args.report_json else []
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    return lambda: int8_run(ap.parse_args(argv))


def _genai_builder(args: argparse.Namespace) -> Convert:
    import runpy
    import shutil

    out = Path(args.output).parent
    argv = ["builder", "-i", args.input, "-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(out / "cache")]
    argv += ["--extra_options", f"algo_config={args.method}"] if args.method != "default" else []

    def run() -> None:
        sys.argv = argv
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
        shutil.rmtree(out / "cache", ignore_errors=True)

    return run


# each tool: its imports (timed as import_s) and the conversion they return (timed as convert_s)
TOOLS: dict[str, Callable[[argparse.Namespace], Convert]] = {
    "onnxprec": _onnxprec,
    "modelopt": _modelopt,
    "occ_fp16": _occ_fp16,
    "occ_amp": _occ_amp,
    "ort_fp16": _ort_fp16,
    "baseline_loadsave": _baseline_loadsave,
    "onnxprec_int4": _onnxprec_int4,
    "modelopt_int4": _modelopt_int4,
    "ort_int4": _ort_int4,
    "ort_int8": _ort_int8,
    "onnxprec_int8": _onnxprec_int8,
    "genai_builder": _genai_builder,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tool", choices=TOOLS)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--data-max", default=None, help="AutoCast --data_max (e.g. inf); default: the tool's own")
    ap.add_argument("--inputs", default=None, help=".npz of real inputs (occ_amp)")
    ap.add_argument("--report-json", default=None, help="onnxprec: write its report JSON (--report_json) here")
    ap.add_argument("--target", default=None, help="onnxprec: --target_accuracy (e.g. rel_l2<=1e-3)")
    ap.add_argument("--rtol", type=float, default=0.01, help="occ_amp rtol")
    ap.add_argument("--atol", type=float, default=0.001, help="occ_amp atol")
    ap.add_argument("--method", default="rtn", help="INT4: calibration method (onnxprec_int4: 'default', its defaults)")
    ap.add_argument("--block-size", type=int, default=128, help="INT4: block size (-1 per channel)")
    ap.add_argument("--zero-point", action="store_true", help="INT4: asymmetric (zero points)")
    ap.add_argument("--format", default="qdq", help="onnxprec_int4, ort_int4: qdq or matmulnbits")
    ap.add_argument("--size-budget-mb", type=float, default=None, help="onnxprec_int4: --size_budget_mb")
    ap.add_argument("--no-accuracy-guard", action="store_true", help="onnxprec_int4: --no_accuracy_guard")
    ap.add_argument("--calib", default=None, help="INT4: folder of .npz feeds, read in name order (default: random)")
    ap.add_argument("--exclude", nargs="*", default=[".*/lm_head"], help="INT4: regexes of layers kept in float")
    args = ap.parse_args()
    record: dict[str, Any] = {"tool": args.tool, "pid": os.getpid()}
    try:  # the tool's imports, then its conversion
        t = time.perf_counter()
        convert = TOOLS[args.tool](args)
        record["import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rc = int(convert() or 0)
        record.update(convert_s=time.perf_counter() - t, rc=rc)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
        record.update(rc=rc, error=str(e.code))
    except BaseException as e:  # report any failure as a result, with its traceback in the log
        traceback.print_exc()
        rc = 1
        record.update(rc=rc, error=f"{type(e).__name__}: {e}"[:500])
    record["process_s"] = time.perf_counter() - _T0
    sys.stderr.flush()
    print(MARKER + json.dumps(record), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
