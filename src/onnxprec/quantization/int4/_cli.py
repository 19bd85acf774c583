"""``onnxprec quantize int4`` and ``python -m onnxprec.quantization.int4``: INT4 weight-only quantization.

The flags come from :class:`~onnxprec.quantization.int4.Int4Options` (declared once, with the API keywords, ModelOpt's
names) and the shared :class:`onnxprec._options.FileArgs` and :class:`onnxprec._options.CommonArgs`. Nothing heavy
is imported until :func:`run`, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import dataclasses

from onnxprec import _options, _report
from onnxprec._options import CommonArgs, FileArgs, file_args, from_args
from onnxprec.quantization.int4._options import Int4Options

__all__ = ["DESCRIPTION", "EPILOG", "FILES", "add_arguments", "run"]

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


FILES = file_args("<name>.int4.onnx", input_help="Input float ONNX model.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The INT4 flags (ModelOpt's names where ModelOpt has them) and onnxprec's extras."""
    _options.add_arguments(parser, FILES, Int4Options, CommonArgs)


def run(args: argparse.Namespace) -> int:
    """Quantizes the model; prints one summary line on stdout."""
    from onnxprec.quantization.int4._api import quantize_file

    files = from_args(FileArgs, args)
    common = from_args(CommonArgs, args)
    options = dataclasses.replace(from_args(Int4Options, args), log_level=common.log_level)
    _report.check_paths({"--report_json": common.report_json}, [files.onnx_path, *filter(None, [files.output_path])])
    report = quantize_file(files.onnx_path, files.output_path, options=options)
    _report.write_json(common.report_json, report.to_json())
    print(f"{report.summary}; saved {report.output_path}")
    return 0
