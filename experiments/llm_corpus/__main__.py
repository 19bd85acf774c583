"""``python -m experiments.llm_corpus build|sweep ...``: see build.py and sweep.py."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    cmd, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "build":
        from .build import main
    elif cmd == "sweep":
        from .sweep import main  # type: ignore[no-redef]
    else:
        sys.exit("usage: python -m experiments.llm_corpus build|sweep [--help]")
    sys.exit(main(rest))
