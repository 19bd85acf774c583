"""``python -m onnxprec.autocast``: ModelOpt AutoCast's command line, same flags and spellings."""

from __future__ import annotations

import sys

from onnxprec._lazy_sympy import defer_sympy

defer_sympy()  # before onnxprec.cli pulls in onnx-ir

from onnxprec.cli import autocast_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(autocast_main())
