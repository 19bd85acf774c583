"""``onnxprec quantize int8`` and ``python -m onnxprec.quantization --quantize_mode int8``: INT8 quantization.

The flags come from :class:`~onnxprec.quantization.int8.Int8Options` (declared once, with the API keywords,
ModelOpt's names) and the groups every quantizer shares (:mod:`onnxprec.quantization._tool`). Nothing heavy is
imported until :func:`run`, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse

from onnxprec.quantization import _tool
from onnxprec.quantization.int8._options import Int8Options

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run"]

DESCRIPTION = (
    "Quantize Conv, MatMul and Gemm layers to INT8 for the runtime that will run the model: on ONNX Runtime's CPU "
    "(the default) static QDQ that fuses into QLinear kernels and dynamic INT8 MatMuls, with outlier channels and "
    "SmoothQuant chosen on calibration data, bias correction, and the most sensitive layers back in float until "
    "--target_accuracy holds; TensorRT-style Q/DQ with --runtime trt."
)
EPILOG = """\
examples:
  {prog} --onnx_path model.onnx --calibration_data inputs.npz
      writes model.quant.onnx (FP32 remainder, placement for ONNX Runtime's CPU provider)
  {prog} --onnx_path cnn.onnx -d images.npz --calibration_method mse --target_accuracy "top1>=0.99" \\
      --report_json report.json
      static ranges by MSE; layers go back to float until 99 % of the calibration images keep their top-1
  {prog} --onnx_path model.onnx -d inputs.npz --runtime trt
      TensorRT-style symmetric Q/DQ, FP16 remainder (ModelOpt's defaults)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The INT8 flags (ModelOpt's names where ModelOpt has them) and onnxprec's extras."""
    _tool.add_arguments(parser, Int8Options)


def run(args: argparse.Namespace) -> int:
    """Quantizes the model; prints one summary line on stdout."""
    from onnxprec.quantization.int8 import quantize_file

    return _tool.run_cli(args, Int8Options, quantize_file)
