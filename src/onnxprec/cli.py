"""The ``onnxprec`` command line: one subcommand per tool, each with its own argument group.

User errors (:class:`onnxprec.errors.OnnxprecError`) print one line and exit with code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from onnxprec._lazy_sympy import defer_sympy
from onnxprec.errors import OnnxprecError

__all__ = ["add_autocast_arguments", "autocast_main", "main"]

logger = logging.getLogger("onnxprec")


def add_autocast_arguments(parser: argparse.ArgumentParser) -> None:
    """AutoCast's flags, spelled as in ModelOpt (``python -m modelopt.onnx.autocast``)."""
    parser.add_argument("--onnx_path", required=True, help="Input FP32 ONNX model.")
    parser.add_argument(
        "--output_path",
        default=None,
        help="Output model (default: <name>.fp16.onnx or <name>.bf16.onnx beside the input).",
    )
    parser.add_argument(
        "-t",
        "--low_precision_type",
        choices=["fp16", "bf16"],
        default="fp16",
        help="Low precision type (default: fp16).",
    )
    parser.add_argument(
        "-d",
        "--calibration_data",
        default=None,
        help="Inputs for the reference run: .npz, folder of .npz, or Polygraphy .json "
        "(default: realistic random data).",
    )
    parser.add_argument(
        "-ne", "--nodes_to_exclude", nargs="*", default=[], help="Regexes (re.match) of node names to keep in FP32."
    )
    parser.add_argument("-ope", "--op_types_to_exclude", nargs="*", default=[], help="Op types to keep in FP32.")
    parser.add_argument(
        "-ni",
        "--nodes_to_include",
        nargs="*",
        default=[],
        help="Regexes of node names to convert even if a rule excludes them.",
    )
    parser.add_argument(
        "-opi", "--op_types_to_include", nargs="*", default=[], help="Op types to convert even if a rule excludes them."
    )
    parser.add_argument(
        "--data_max",
        type=float,
        default=512,
        help="Keep nodes whose float I/O exceed this in the reference run (inf: no reference run).",
    )
    parser.add_argument(
        "--init_max", type=float, default=65504, help="Keep nodes whose FP32 initializers exceed this magnitude."
    )
    parser.add_argument(
        "--init_conversion_max_bytes",
        type=int,
        default=None,
        help="Initializers above this many bytes stay FP32 and are cast at run time.",
    )
    parser.add_argument(
        "--max_depth_of_reduction",
        type=int,
        default=None,
        help="Keep nodes that accumulate more terms than this per output element.",
    )
    parser.add_argument("--keep_io_types", action="store_true", help="Keep FP32 graph inputs and outputs.")
    parser.add_argument(
        "--log_level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Log level (DEBUG prints every node's decision and the rule that made it).",
    )
    parser.add_argument(
        "--providers",
        nargs="*",
        default=["cpu"],
        help="ONNX Runtime providers for the reference run: cpu, cuda[:N], trt, dml.",
    )
    parser.add_argument("--trt_plugins", nargs="*", default=[], help="TensorRT plugin libraries (.so).")
    parser.add_argument(
        "--trt_plugins_precision",
        nargs="*",
        default=[],
        help="Custom op precisions: op:fp16, op:fp32 or op:[fp16,fp32]:[fp16].",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=None,
        help="Target opset (default: at least 13 for fp16, 22 for bf16; never lowered).",
    )
    parser.add_argument(
        "--use_standalone_type_inference",
        action="store_true",
        help="Accepted for ModelOpt compatibility; onnxprec always uses ONNX type inference.",
    )
    group = parser.add_argument_group("onnxprec extras")
    group.add_argument(
        "--input_shapes", default=None, help="Sizes of dynamic inputs for random data: name:1x3x224x224,ids:1x128."
    )
    group.add_argument(
        "--external_data", action="store_true", help="Save weights to <output>.data (automatic above 2 GB)."
    )
    group.add_argument(
        "--no_validate", action="store_true", help="Skip the checker, I/O contract and numeric checks of the result."
    )


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level), format="[onnxprec] %(levelname)s: %(message)s", stream=sys.stderr, force=True
    )


def _run_autocast(args: argparse.Namespace) -> int:
    from onnxprec.autocast import convert_file

    report = convert_file(
        args.onnx_path,
        args.output_path,
        external_data=True if args.external_data else None,
        low_precision_type=args.low_precision_type,
        nodes_to_exclude=args.nodes_to_exclude,
        op_types_to_exclude=args.op_types_to_exclude,
        nodes_to_include=args.nodes_to_include,
        op_types_to_include=args.op_types_to_include,
        data_max=args.data_max,
        init_max=args.init_max,
        keep_io_types=args.keep_io_types,
        calibration_data=args.calibration_data,
        init_conversion_max_bytes=args.init_conversion_max_bytes,
        providers=tuple(args.providers),
        trt_plugins=tuple(args.trt_plugins),
        trt_plugins_precision=tuple(args.trt_plugins_precision),
        max_depth_of_reduction=args.max_depth_of_reduction,
        opset=args.opset,
        input_shapes=args.input_shapes,
        validate=not args.no_validate,
    )
    print(f"{report.summary}; saved {report.output_path}")
    return 0


def _guarded(run: object, args: argparse.Namespace) -> int:
    """Runs a tool: user errors become one line on stderr and exit code 2."""
    _configure_logging(getattr(args, "log_level", "INFO"))
    try:
        return run(args)  # type: ignore[operator]
    except OnnxprecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("error: out of memory: save with --external_data and lower the calibration batch size", file=sys.stderr)
        return 2


def autocast_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m onnxprec.autocast``."""
    defer_sympy()
    parser = argparse.ArgumentParser(
        prog="python -m onnxprec.autocast",
        description="Convert an FP32 ONNX model to mixed FP32/FP16 or FP32/BF16 (ModelOpt AutoCast flags).",
    )
    add_autocast_arguments(parser)
    return _guarded(_run_autocast, parser.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnxprec`` console script."""
    defer_sympy()
    parser = argparse.ArgumentParser(prog="onnxprec", description="Make ONNX models smaller and faster.")
    sub = parser.add_subparsers(dest="command", required=True)
    autocast = sub.add_parser("autocast", help="FP32 -> mixed FP16/BF16 (ModelOpt AutoCast flags).")
    add_autocast_arguments(autocast)
    autocast.set_defaults(run=_run_autocast)
    args = parser.parse_args(argv)
    return _guarded(args.run, args)


if __name__ == "__main__":
    sys.exit(main())
