"""``python -m onnxprec.debug dump ...`` and ``python -m onnxprec.debug compare ...``."""

from __future__ import annotations

import sys

from onnxprec.cli import tool_main

TOOLS = ("dump", "compare")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m onnxprec.debug {{{','.join(TOOLS)}}} [-h] ...", file=sys.stderr)
        return 2
    return tool_main(argv[0], argv[1:], prog=f"python -m onnxprec.debug {argv[0]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
