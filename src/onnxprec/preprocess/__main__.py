"""``python -m onnxprec.preprocess``: ONNX Runtime's ``quant_pre_process`` command line, same flags."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("preprocess"))
