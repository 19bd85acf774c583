"""Weight-only quantization (INT4 block-wise, optional INT8) of ONNX MatMul weights."""
