"""Gathers the GPU run's JSON files (measure.py's, the tools' reports, make_llama.json, sizes) into one file.

python collect.py RESULTS_DIR OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# What each report contributes: its one-line summary, step timings and calibration facts, not per-layer details.
REPORT_KEYS = ("summary", "seconds", "calibration", "method", "nodes_converted", "nodes_total", "validation")


def main() -> None:
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    merged: dict[str, object] = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        if path.stem.endswith("_report"):
            data = {k: v for k, v in data.items() if k in REPORT_KEYS}
        merged[path.stem] = data
    for path in sorted(results.glob("*_size.txt")):
        merged[path.stem] = int(path.read_text().split()[0])
    model = results.parent / "fp32" / "make_llama.json"
    if model.exists():
        merged["model"] = json.loads(model.read_text())
    out.write_text(json.dumps(merged, indent=1))
    print(json.dumps(merged, indent=1)[:6000])


if __name__ == "__main__":
    main()
