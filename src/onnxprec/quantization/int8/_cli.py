"""``onnxprec quantize int8`` (``python -m onnxprec.quantization --quantize_mode int8``): its description, examples
and the flags of :class:`~onnxprec.quantization.int8.Int8Options` with the shared ones (:func:`_tool.command_line`).
"""

from __future__ import annotations

from onnxprec.quantization import _tool
from onnxprec.quantization.int8._options import Int8Options

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
  {prog} --onnx_path cnn.onnx -d images.npz --target_accuracy "top1>=0.99" \\
      --report_json report.json
      the most sensitive layers go back to float until 99 % of the calibration images keep their top-1
  {prog} --onnx_path model.onnx -d inputs.npz --runtime trt
      TensorRT-style symmetric Q/DQ, FP16 remainder (ModelOpt's defaults)
"""


add_arguments, run = _tool.command_line(Int8Options, "onnxprec.quantization.int8")
