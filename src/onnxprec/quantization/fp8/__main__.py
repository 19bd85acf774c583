"""``python -m onnxprec.quantization.fp8``: FP8 quantization (``onnxprec quantize fp8``)."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("quantize fp8"))
