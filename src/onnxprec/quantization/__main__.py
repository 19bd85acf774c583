"""``python -m onnxprec.quantization --quantize_mode int8|int4 ...``: ModelOpt's command line, one tool per mode.

``--quantize_mode`` (default int8, as ModelOpt) picks the tool; every other flag is that tool's
(``python -m onnxprec.quantization --quantize_mode int4 --help`` lists the INT4 flags).
"""

from __future__ import annotations

import sys

from onnxprec.errors import OnnxprecError
from onnxprec.quantization._api import split_mode

if __name__ == "__main__":
    from onnxprec.cli import tool_main

    try:
        mode, rest = split_mode(sys.argv[1:])
    except OnnxprecError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(tool_main(f"quantize {mode}", rest, prog=f"python -m onnxprec.quantization --quantize_mode {mode}"))
