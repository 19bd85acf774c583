"""``onnxprec quantize int4`` and ``python -m onnxprec.quantization.int4``: INT4 weight-only quantization.

The flags come from :class:`~onnxprec.quantization.int4.Int4Options` (declared once, with the API keywords,
ModelOpt's names) and the groups every quantizer shares (:mod:`onnxprec.quantization._tool`). Nothing heavy is
imported until :func:`run`, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse

from onnxprec.quantization import _tool
from onnxprec.quantization.int4._options import Int4Options

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run"]

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The INT4 flags (ModelOpt's names where ModelOpt has them) and onnxprec's extras."""
    _tool.add_arguments(parser, Int4Options)


def run(args: argparse.Namespace) -> int:
    """Quantizes the model; prints one summary line on stdout."""
    from onnxprec.quantization.int4 import quantize_file

    return _tool.run_cli(args, Int4Options, quantize_file)
