"""``python -m onnxprec.autocast``: ModelOpt AutoCast's command line, same flags and spellings."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

if __name__ == "__main__":
    sys.exit(tool_main("autocast"))
