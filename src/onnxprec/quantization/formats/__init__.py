"""Output formats of a quantized weight: ``DequantizeLinear -> MatMul`` (QDQ) or ``com.microsoft::MatMulNBits``.

Both rewrite the graph around a :class:`~onnxprec.quantization.formats.quantized_weight.LazyQuantizedWeight`, whose
tensors are computed while the model is written: the float weight is read (memory-mapped), quantized, split into the
format's initializers and released, one weight at a time.
"""

from __future__ import annotations

from onnxprec.quantization.formats.matmulnbits import rewrite_matmulnbits
from onnxprec.quantization.formats.qdq import rewrite_qdq
from onnxprec.quantization.formats.quantized_weight import LazyQuantizedWeight

__all__ = ["FORMATS", "LazyQuantizedWeight", "rewrite_matmulnbits", "rewrite_qdq"]

FORMATS = ("qdq", "matmulnbits")
