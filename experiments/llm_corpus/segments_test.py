"""The segmented reference run on the corpus: every graph cut into the smallest pieces (one weight each) gives the
outputs of the whole graph. The builder's graphs carry shape constants, attention-mask subgraphs read by every layer,
sliding-window ring buffers and tied heads across the cuts. The torch-built corpus models are used where the corpus
is built (``python -m experiments.llm_corpus build``; skipped otherwise), the torch-free decoder always."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from experiments.llm_corpus import build
from experiments.llm_corpus.synthetic import build_kv_decoder
from onnxprec._io import load_model
from onnxprec._testing import reference_path
from onnxprec.calibration_data import CalibrationData
from onnxprec.reference import run_reference

TOKENS = 16


def _whole_outputs(model: ir.Model, data: CalibrationData, cache: Path | None) -> dict[str, np.ndarray]:
    """The whole graph's outputs on ``data``; with ``cache`` (an .npz path), read from it when it exists, else
    computed and written to it (atomically)."""
    if cache is not None and cache.exists():
        with np.load(cache) as saved:
            return dict(saved)
    whole = run_reference(model, data, select=[], segment_bytes=1 << 40)
    assert whole.segments == 1
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.partial.npz")
        np.savez(partial, **whole.first_outputs)
        partial.replace(cache)
    return whole.first_outputs


def _check_pieces_equal_whole(path: Path, segment_bytes: int | None = 1, cache: Path | None = None) -> int:
    """Runs ``path`` whole and in pieces (default: of one weight each) on one window; returns the number of pieces.
    With ``cache``, the whole graph's outputs are read from (or, on the first run, written to) that .npz file."""
    model = load_model(path)
    ids = np.random.default_rng(0).integers(3, 500, (1, TOKENS))
    data = CalibrationData({"input_ids": ids}, model)
    whole = _whole_outputs(model, data, cache)
    pieces = run_reference(model, data, select=[], segment_bytes=segment_bytes)
    assert set(pieces.first_outputs) == set(whole)
    for name, expected in whole.items():
        actual = pieces.first_outputs[name]
        if name.startswith("present") and expected.ndim == 4:
            # a sliding window's ring buffer holds this window's TOKENS positions; the rest is unwritten memory
            expected, actual = expected[:, :, :TOKENS], actual[:, :, :TOKENS]
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=f"{path}: {name}")
    return pieces.segments


@pytest.mark.slow
def test_the_torch_free_decoder_in_pieces_equals_the_whole(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    build_kv_decoder(path)
    onnx.save(onnx.shape_inference.infer_shapes(onnx.load(path)), path)  # typed, as exporters write them
    assert _check_pieces_equal_whole(path) > 6  # embedding, 3 projections and MLP per layer, lm_head


CORPUS_MODELS = sorted(build.CORPUS_DIR.glob("*/*/model.onnx")) if build.CORPUS_DIR.is_dir() else []


@pytest.mark.slow
@pytest.mark.skipif(
    not CORPUS_MODELS, reason=f"no LLM corpus in {build.CORPUS_DIR} (python -m experiments.llm_corpus build)"
)
@pytest.mark.parametrize("path", CORPUS_MODELS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_corpus_model_in_pieces_equals_the_whole(path: Path) -> None:
    if path.parent.parent.name == "synthetic":
        pytest.skip("the untyped torch-free decoder runs whole (its typed copy is tested above)")
    assert _check_pieces_equal_whole(path) > 2


GEMMA3_270M = Path(os.environ.get("ONNXPREC_GEMMA3_270M", "~/.cache/onnxprec/gemma/fp32/model.onnx")).expanduser()


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA3_270M.exists(), reason=f"no Gemma-3-270M builder model at {GEMMA3_270M}")
def test_gemma3_270m_in_pieces_equals_the_whole() -> None:
    """The real Gemma-3-270M built by the builder (-p fp32 -e cpu; 1.14 GB, a 262k-row table tied to the lm_head,
    shape constants read by every layer, sliding windows of 512): its default pieces give the whole graph's outputs.

    The whole graph's run maps all 1.14 GB of weights at once (1.8 GB peak RSS): its outputs are kept in
    ~/.cache/onnxprec (keyed by the model files' sizes and times, the window and onnxruntime's version), so that only
    the first run makes it; later runs run the pieces alone (0.85 GB). In a process of its own, which the test
    run's own process then never holds on top of what earlier tests left resident."""
    data = GEMMA3_270M.parent / "model.onnx.data"
    assert GEMMA3_270M.stat().st_size + data.stat().st_size > 1 << 30
    cache = reference_path("gemma3-270m", [GEMMA3_270M, data], TOKENS, suffix="npz")
    code = (
        "import sys; from pathlib import Path; from experiments.llm_corpus import segments_test as t;"
        " print(t._check_pieces_equal_whole(Path(sys.argv[1]), segment_bytes=None, cache=Path(sys.argv[2])))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", code, str(GEMMA3_270M), str(cache)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) >= 6
