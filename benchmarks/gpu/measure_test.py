"""measure.py (the GPU run's step timer) on this machine: the RSS of a process tree, the log's time and RSS prefix,
and the phases cut at the log lines that match their patterns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MEASURE = Path(__file__).with_name("measure.py")

CHILD = """
import time
print("loading", flush=True); time.sleep(0.8)
print("Quantizing 3 weights", flush=True); block = bytearray(200 * 2**20); block[::4096] = b"x" * len(block[::4096])
for i in range(3):
    print(f"walk {i}", end="\\r", flush=True); time.sleep(0.5)
del block
print("Saving weights", flush=True); time.sleep(0.8)
"""


def test_phases_get_their_wall_time_and_peak_rss(tmp_path: Path) -> None:
    phases = "load=^;walk=Quantizing [0-9]+ weights;save=Saving weights;never=no such line"
    run = subprocess.run(
        [sys.executable, str(MEASURE), "step", str(tmp_path), "--phases", phases, "--", sys.executable, "-c", CHILD],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads((tmp_path / "step.json").read_text())
    assert result["exit_code"] == 0 and "phase walk" in run.stdout
    rows = {row["phase"]: row for row in result["phases"]}
    assert list(rows) == ["load", "walk", "save"]  # a phase whose line never came is absent
    assert rows["walk"]["peak_rss_mib"] > rows["load"]["peak_rss_mib"] + 150  # the 200 MiB block is the walk's
    assert rows["save"]["peak_rss_mib"] < rows["walk"]["peak_rss_mib"] - 150
    assert rows["load"]["start_s"] == 0 < rows["walk"]["start_s"] < rows["save"]["start_s"]
    assert abs(sum(row["wall_s"] for row in rows.values()) - result["wall_s"]) < 0.5
    log = (tmp_path / "step.log").read_text().splitlines()
    assert any(line.endswith("] walk 2") and line.startswith("[") for line in log)  # progress lines kept, prefixed
    assert (tmp_path / "step.rss.tsv").read_text().startswith("seconds\trss_mib")
