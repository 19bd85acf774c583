"""Every tool's results on the golden cases equal the committed snapshot (golden.json; slow, real models).

Skipped with the reason when the real-model inputs the snapshot was made from are absent (a fresh clone has neither
../shared/models nor the zoo cache). After a change meant to change results: ``python tests/golden/run_golden.py
snapshot`` and commit golden.json with the change that explains it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_golden import GOLDEN, INPUTS, differences, find_inputs, snapshot


@pytest.mark.slow
def test_every_tool_gives_the_snapshot_results() -> None:
    golden = json.loads(GOLDEN.read_text())
    models = find_inputs(golden["inputs"])
    if isinstance(models, str):
        pytest.skip(models)
    diffs = differences(golden["cases"], snapshot(models))
    assert not diffs, "\n".join([*diffs[:40], f"{len(diffs)} differences from {GOLDEN.name}"])


def test_the_snapshot_is_small_and_holds_no_model() -> None:
    assert GOLDEN.stat().st_size < 64_000
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == {"inputs", "cases"} and len(golden["cases"]) > 50
    for record in golden["cases"].values():
        assert set(record) == {"rc", "errors", "summary", "files", "stdout_sha256", "report_sha256"}
        assert all(isinstance(digest, str) and len(digest) == 64 for digest in record["files"].values())


def test_without_the_inputs_the_reason_names_where_it_looked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import run_golden

    monkeypatch.setattr(run_golden, "shared_path", lambda *parts: None)
    monkeypatch.setenv("ONNXPREC_ZOO", str(tmp_path / "zoo"))
    assert "neither ../shared/models nor the zoo cache" in str(find_inputs())
    (tmp_path / "zoo").mkdir()
    for name in INPUTS:
        (tmp_path / "zoo" / name).write_bytes(b"other")
    assert find_inputs() == tmp_path / "zoo"
    assert "holds other versions of efficientnet_lite0.onnx" in str(find_inputs({name: "0" * 64 for name in INPUTS}))
