"""``python -m onnxprec``: the same command line as the ``onnxprec`` console script (``onnxprec.cli.main``)."""

from __future__ import annotations

import sys

from onnxprec.cli import main

if __name__ == "__main__":
    sys.exit(main())
