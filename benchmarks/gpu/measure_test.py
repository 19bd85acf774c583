"""measure.py (the GPU run's step timer) on this machine: the RSS of a process tree, the log's time and RSS prefix,
and the phases cut at the log lines that match their patterns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_phase_marked_after_the_previous_one_waits_for_it() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure", MEASURE)
    assert spec is not None and spec.loader is not None
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    lines = [(1.0, "Quantizing 9 weights"), (2.0, "Reference run (segments): 1/9 segments"), (9.0, "Writing weights")]
    lines += [(10.0, "Reference run (segments): 1/34 segments")]
    samples = [(float(t), 100.0, None) for t in range(12)]
    walk = "load=^;walk=Quantizing [0-9]+ weights;after the walk=Reference run: [0-9]+ tensors;save=Writing weights"

    def started(check: str, upto: int) -> list[tuple[str, float]]:
        table = measure.phase_table(measure.parse_phases(f"{walk};check={check}"), lines[:upto], samples, upto + 1.0)
        return [(row["phase"], row["start_s"]) for row in table]

    # stopped in the walk: unmarked, the check's pattern matches the walk's progress (the 8B run called its walk
    # 'check'); marked, the check waits for the save
    assert started("Reference run \\(segments\\)", 2) == [("load", 0.0), ("walk", 1.0), ("check", 2.0)]
    assert started(">Reference run \\(segments\\)", 2) == [("load", 0.0), ("walk", 1.0)]
    assert started(">Reference run \\(segments\\)", 4) == [("load", 0.0), ("walk", 1.0), ("save", 9.0), ("check", 10.0)]
