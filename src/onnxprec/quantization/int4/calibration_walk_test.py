"""INT4 calibration of a segmented model: one forward walk (each segment's session made once, whatever the depth),
with the same output as one pass per chunk of statistics. The tests that quantize a decoder several times to compare
the walks are slow (about a CPU second each)."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec import _ort
from onnxprec._testing import tiny_decoder
from onnxprec.quantization.int4 import quantize, quantize_file


def _decoder(layers: int) -> onnx.ModelProto:
    # GQA with rotary caches, shape constants read by every layer and a sliding-window ring buffer in layer 0, as
    # onnxruntime-genai's builder writes them; about 700 KB of weights per layer, so that segments of 512 KiB
    # (stats_memory_mb=1) cut it about once a layer.
    return tiny_decoder("gqa", layers=layers, heads=8, kv_heads=2, head_size=32, vocab=256, max_positions=64, window=8)


def _segment_sessions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Records (segment, segments) of every segment session the reference runner makes."""
    made: list[tuple[int, int]] = []
    create = _ort.create_session

    def counting(*args: object, **kwargs: object) -> object:
        match = re.match(r"segment (\d+)/(\d+)", str(kwargs.get("what", "")))
        if match:
            made.append((int(match[1]), int(match[2])))
        return create(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_ort, "create_session", counting)
    return made


def _quantize(model: onnx.ModelProto, method: str) -> onnx.ModelProto:
    ids = np.random.default_rng(0).integers(3, 250, (3, 12))
    return quantize(
        model, calibration_method=method, calibration_data_reader={"input_ids": ids}, block_size=32,
        stats_memory_mb=1, nodes_to_exclude=[],
    )  # fmt: skip


def _weights(model: onnx.ModelProto) -> dict[str, bytes]:
    return {i.name: i.raw_data for i in model.graph.initializer}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["awq_lite", "gptq"])
def test_each_segment_runs_once_and_the_output_equals_one_pass_per_chunk(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _segment_sessions(monkeypatch)
    walked = _quantize(_decoder(6), method)
    segments = {total for _, total in made}
    assert len(segments) == 1 and segments.pop() > 3
    assert sorted(made) == sorted(set(made))  # no segment session made twice: no pass restarts from the embedding
    walked_sessions = len(made)
    made.clear()
    # The former plan: a pass per chunk of statistics that fit --stats_memory_mb, each from the embedding again.
    monkeypatch.setattr("onnxprec.quantization.int4._api.streams", lambda model, segment_bytes: False)
    chunked = _quantize(_decoder(6), method)
    assert len(made) > walked_sessions
    assert _weights(walked) == _weights(chunked)


@pytest.mark.slow
def test_segment_sessions_grow_linearly_with_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _segment_sessions(monkeypatch)
    counts = []
    for layers in (2, 4, 8):  # deeper random-weight stacks overflow float32
        made.clear()
        _quantize(_decoder(layers), "awq_lite")
        counts.append(len(made))
    # one session per segment, segments of a fixed weight size: twice the layers, at most twice the sessions (+1 for
    # the piece that holds the embedding and the head)
    assert counts[1] <= 2 * counts[0] + 1 and counts[2] <= 2 * counts[1] + 1, counts


@pytest.mark.slow
@pytest.mark.parametrize(("method", "kwargs"), [("awq_full", {}), ("rtn", {"use_zero_point": True})])
def test_large_weights_quantized_in_column_chunks_equal_the_whole(
    method: str, kwargs: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxprec.quantization.formats import quantized_weight

    src = tmp_path / "m.onnx"
    model = _decoder(2)
    onnx.save(model, src, save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=1024)
    ids = np.random.default_rng(0).integers(3, 250, (2, 12))
    outputs = []
    reads: list[slice] = []
    columns = quantized_weight.LazyQuantizedWeight._columns

    def spy(self: quantized_weight.LazyQuantizedWeight, part: slice) -> np.ndarray:
        reads.append(part)
        return columns(self, part)

    monkeypatch.setattr(quantized_weight.LazyQuantizedWeight, "_columns", spy)
    for chunk_bytes in (1 << 30, 4096):  # at once; in chunks of 4096 / (4 K) columns (the table: 8 of its 256 rows)
        monkeypatch.setattr(quantized_weight, "CHUNK_BYTES", chunk_bytes)
        dst = tmp_path / f"q{chunk_bytes}.onnx"
        report = quantize_file(
            src, dst, calibration_method=method, calibration_data_reader={"input_ids": ids}, block_size=32,
            **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip
        outputs.append((_weights(onnx.load(dst)), report.to_json()["layers"]))
    (whole, whole_layers), (chunked, chunked_layers) = outputs
    assert whole == chunked and len(reads) > 100
    assert len(whole_layers) == len(chunked_layers) >= 6
    for a, b in zip(whole_layers, chunked_layers):
        for key in ("weight_rel_error", "scale_min", "scale_max", "scale_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["weight"], key)


def test_segments_sized_by_provider_and_by_segment_mb() -> None:
    from onnxprec.quantization.int4 import Int4Options

    cpu = Int4Options(stats_memory_mb=256)
    assert cpu.segment_bytes == 128 * 2**20 and cpu.check_segment_bytes is None  # the CPU's sizes as before
    assert Int4Options(calibration_eps=["cuda:0"]).segment_bytes == _ort.DEVICE_SESSION_BYTES
    assert Int4Options(calibration_eps=["trt", "cpu"], segment_mb=3).segment_bytes == 3 * 2**20
    assert Int4Options(segment_mb=3).check_segment_bytes == 3 * 2**20
    assert _ort.session_weight_bytes(None, 7) == _ort.session_weight_bytes(["cpu", "cuda"], 7) == 7
    assert _ort.session_weight_bytes(["dml:1"], 7) == _ort.DEVICE_SESSION_BYTES


@pytest.mark.slow
def test_segment_sizes_and_spilled_gptq_results_write_byte_identical_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxprec.quantization import methods
    from onnxprec.quantization.int4 import _api

    src = tmp_path / "m.onnx"
    onnx.save(_decoder(3), src, save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=1024)
    ids = np.random.default_rng(0).integers(3, 250, (2, 12))
    made = _segment_sessions(monkeypatch)
    spilled = []
    spill = methods.CompactWeight.spill

    def spy(self: methods.CompactWeight, to: methods.Spill) -> methods.SpilledWeight:
        spilled.append(to.path)
        return spill(self, to)

    monkeypatch.setattr(methods.CompactWeight, "spill", spy)
    written = {}
    # The old path: one session (a segment as large as the model), then segments of 1 MiB with the GPTQ results kept
    # in memory and written to a file as they are made.
    for name, segment_mb, spills in (("whole", 1024, True), ("segments", 1, False), ("spilled", 1, True)):
        made.clear(), spilled.clear()
        monkeypatch.setattr(_api, "Spill", methods.Spill if spills else lambda: None)
        dst = tmp_path / name / "q.onnx"
        dst.parent.mkdir()
        report = quantize_file(
            src, dst, external_data=True, calibration_method="gptq", calibration_data_reader={"input_ids": ids},
            block_size=32, nodes_to_exclude=[], segment_mb=segment_mb,
        )  # fmt: skip
        written[name] = (dst.read_bytes(), (dst.parent / "q.onnx.data").read_bytes())
        assert (len(made) >= 3) == (segment_mb == 1)
        assert len(spilled) == (len(report.layers) if name == "spilled" else 0) and len(report.layers) >= 7
        gc.collect()  # the model's graph holds reference cycles
        assert not any(path.exists() for path in spilled)  # the spill file goes with the results that read it
    assert written["whole"] == written["segments"] == written["spilled"]


@pytest.mark.slow
def test_the_report_says_where_a_walks_time_went(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_decoder(3), src, save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=1024)
    ids = np.random.default_rng(0).integers(3, 250, (2, 12))
    report = quantize_file(
        src, tmp_path / "q.onnx", calibration_method="awq_gptq", calibration_data_reader={"input_ids": ids},
        block_size=32, nodes_to_exclude=[], segment_mb=1,
    )  # fmt: skip
    seconds = report.to_json()["seconds"]
    parts = ("calibration runs: statistics", "calibration runs: sessions", "calibration deciding", "calibration: awq",
             "calibration: gptq", "calibration: output errors")  # fmt: skip
    assert all(isinstance(seconds[part], float) and seconds[part] >= 0 for part in parts), seconds
    # parts of their wholes (each rounded to 0.1 ms in the report)
    runs = seconds["calibration runs: statistics"] + seconds["calibration runs: sessions"]
    assert runs <= seconds["calibration runs"] + 1e-3
    decided = seconds["calibration: awq"] + seconds["calibration: gptq"] + seconds["calibration: output errors"]
    assert decided <= seconds["calibration deciding"] + 1e-3 <= seconds["calibration"] + 2e-3
