"""``python -m onnxprec.quantization.int8``: INT8 quantization (``onnxprec quantize int8``)."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("quantize int8"))
