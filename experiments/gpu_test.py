"""The GPU workflow's bundles (experiments.gpu_prepare) and timing loop (experiments.gpu_latency), on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zoo
from experiments import gpu_latency, gpu_prepare


@pytest.mark.slow
def test_gpu_bundles_round_trip_and_cpu_timing(tmp_path: Path) -> None:
    tiny_zoo = tmp_path / "zoo"
    zoo.build_model("chain_24", tiny_zoo)
    stage = tmp_path / "stage" / "chain_24"
    stage.mkdir(parents=True)
    src = zoo.model_path("chain_24", tiny_zoo)
    (stage / "fp32.onnx").write_bytes(src.read_bytes())
    (stage / "copy.onnx").write_bytes(src.read_bytes())
    with open(stage / "inputs.npz", "wb") as f:
        np.savez(f, **zoo.inputs("chain_24", tiny_zoo))  # type: ignore[arg-type]
    chunk = src.stat().st_size // 3 + 1  # forces every model into pieces
    dirs = gpu_prepare.bundle(tmp_path / "stage", tmp_path / "out", chunk)
    assert len(dirs) > 2
    for d in dirs:
        assert sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and p.name != gpu_prepare.MANIFEST) <= chunk
    assembled = gpu_latency.assemble(tmp_path / "out")
    assert (assembled / "chain_24" / "fp32.onnx").read_bytes() == src.read_bytes()
    res = gpu_latency.time_model(assembled / "chain_24", ["1"], warmup=1, iters=4, rounds=2, provider="cpu")
    assert res["copy"]["batches"]["1"]["rel_l2"] == 0.0
    assert res["fp32"]["batches"]["1"]["iters"] == 4
