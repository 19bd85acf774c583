"""``python -m onnxprec.quantization.int4``: INT4 weight-only quantization (``onnxprec quantize int4``)."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("quantize int4"))
