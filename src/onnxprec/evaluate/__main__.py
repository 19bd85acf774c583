"""``python -m onnxprec.evaluate``: run models side by side on the same data and report task metrics."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("evaluate"))
