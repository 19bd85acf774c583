"""INT4 calibration of a segmented model: one forward walk (each segment's session made once, whatever the depth),
with the same output as one pass per chunk of statistics."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from onnxprec import _ort
from onnxprec._testing import tiny_decoder
from onnxprec.quantization.int4 import quantize


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
