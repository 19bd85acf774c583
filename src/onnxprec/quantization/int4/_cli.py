"""``onnxprec quantize int4`` (``python -m onnxprec.quantization.int4``): the flags of
:class:`~onnxprec.quantization.int4.Int4Options` and those every quantizer shares (:mod:`onnxprec.quantization._tool`).
"""

from __future__ import annotations

from onnxprec.quantization import _tool
from onnxprec.quantization.int4._options import Int4Options

DESCRIPTION = (
    "Quantize the weights of MatMul/Gemm layers to INT4 (RTN, AWQ, GPTQ), block-wise along K; "
    "output as DequantizeLinear -> MatMul (QDQ) or com.microsoft::MatMulNBits."
)
EPILOG = """\
examples:
  {prog} --onnx_path model.onnx --calibration_method rtn
      writes model.quant.onnx beside model.onnx (symmetric INT4, block 128, no data needed)
  {prog} --onnx_path llm.onnx --output_path llm.int4.onnx --calibration_method awq_gptq \\
      --calibration_data windows.npz --block_size 128 --output_format matmulnbits --report_json report.json
      AWQ scales then GPTQ on real token windows (the most accurate here); report.json lists every layer's
      method, AWQ alpha, scales and errors
"""


add_arguments, run = _tool.command_line(Int4Options, "onnxprec.quantization.int4")
