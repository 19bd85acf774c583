"""``onnxprec quantize fp8`` (``python -m onnxprec.quantization --quantize_mode fp8``): its description, examples
and the flags of :class:`~onnxprec.quantization.fp8.Fp8Options` with the shared ones (:func:`_tool.command_line`).
"""

from __future__ import annotations

from onnxprec.quantization import _tool
from onnxprec.quantization.fp8._options import Fp8Options

DESCRIPTION = (
    "Quantize Conv, MatMul and Gemm layers to FP8 E4M3FN for TensorRT (Ada and Hopper GPUs), as ModelOpt's "
    "--quantize_mode fp8: per-channel FP8 weights, per-tensor FP8 activations calibrated on the data, Q/DQ on the "
    "layers' inputs and residual Adds, an FP16 remainder; checked against the float model in ONNX Runtime."
)
EPILOG = """\
examples:
  {prog} --onnx_path model.onnx --calibration_data inputs.npz
      writes model.quant.onnx (FP8 Q/DQ, FP16 remainder, TensorRT placement)
  {prog} --onnx_path model.onnx -d inputs.npz --high_precision_dtype fp32
      the float remainder stays FP32
"""


add_arguments, run = _tool.command_line(Fp8Options, "onnxprec.quantization.fp8")
