"""``onnxprec quantize int4`` and ``python -m onnxprec.quantization.int4``: INT4 weight-only quantization.

The flags come from :class:`~onnxprec.quantization.int4.Int4Options` (declared once, with the API keywords, ModelOpt's
names), the input/output flags below and the shared :class:`onnxprec._options.CommonArgs`. Nothing heavy is imported
until :func:`run`, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from onnxprec import _options
from onnxprec._options import CommonArgs, ToolOptions, from_args, option
from onnxprec.cli import check_report_path, write_report
from onnxprec.quantization.int4._options import Int4Options

__all__ = ["DESCRIPTION", "EPILOG", "FileArgs", "add_arguments", "run"]

DESCRIPTION = (
    "Quantize the weights of MatMul/Gemm layers to INT4 (RTN, AWQ, GPTQ), block-wise along K; "
    "output as DequantizeLinear -> MatMul (QDQ) or com.microsoft::MatMulNBits."
)
EPILOG = """\
examples:
  {prog} --onnx_path model.onnx --calibration_method rtn
      writes model.int4.onnx beside model.onnx (symmetric INT4, block 128, no data needed)
  {prog} --onnx_path llm.onnx --output_path llm.int4.onnx --calibration_method awq_gptq \\
      --calibration_data windows.npz --block_size 128 --output_format matmulnbits --report_json report.json
      AWQ scales then GPTQ on real token windows (the most accurate here); report.json lists every layer's
      method, AWQ alpha, scales and errors
"""


@dataclass
class FileArgs(ToolOptions):
    """The input and output of the command line (the API takes them as arguments of ``quantize_file``)."""

    TITLE = "input and output"

    onnx_path: str = option(flags=("--onnx_path",), metavar="PATH", help="Input float ONNX model.")
    output_path: str | None = option(
        None,
        flags=("--output_path",),
        metavar="PATH",
        help="Output model (default: <name>.int4.onnx beside the input).",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The INT4 flags (ModelOpt's names where ModelOpt has them) and onnxprec's extras."""
    _options.add_arguments(parser, FileArgs, Int4Options, CommonArgs)


def run(args: argparse.Namespace) -> int:
    """Quantizes the model; prints one summary line on stdout."""
    from onnxprec.quantization.int4._api import quantize_file

    files = from_args(FileArgs, args)
    common = from_args(CommonArgs, args)
    options = dataclasses.replace(from_args(Int4Options, args), log_level=common.log_level)
    check_report_path(common.report_json, protected=[files.onnx_path, *filter(None, [files.output_path])])
    report = quantize_file(files.onnx_path, files.output_path, options=options)
    write_report(common.report_json, report.to_json())
    print(f"{report.summary}; saved {report.output_path}")
    return 0
