"""AutoCast on real trained models with their real inputs, against ONNX Runtime FP32 outputs.

Needs ../shared/models (skipped with a message on a fresh clone); SmolLM2 also needs the zoo cache built by
``python -m zoo build smollm2_135m`` (slow tests, ``-m slow``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._ort import import_onnxruntime, session_options
from onnxprec._testing import reference_perplexity, run, shared_path
from onnxprec.autocast import convert_file, convert_to_mixed_precision
from onnxprec.metrics import Perplexity, cosine, rel_l2

MODELS = shared_path("models")
needs_shared = pytest.mark.skipif(
    MODELS is None, reason="../shared/models is absent (fresh clone): real-model tests skipped"
)


def _effnet() -> tuple[Path, dict[str, np.ndarray]]:
    assert MODELS is not None
    return MODELS / "efficientnet_lite0.onnx", {"input": np.load(MODELS / "efficientnet_lite0_input.npy")}


def _minilm() -> tuple[Path, dict[str, np.ndarray]]:
    assert MODELS is not None
    return MODELS / "minilm_l6_v2_bert.onnx", dict(np.load(MODELS / "minilm_l6_v2_bert_inputs.npz"))


def _strict(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


@pytest.mark.slow
@needs_shared
def test_efficientnet_fp16_matches_fp32_on_real_photos(tmp_path: Path) -> None:
    path, feeds = _effnet()
    out = tmp_path / "e.onnx"
    report = convert_file(path, out, keep_io_types=True, calibration_data=feeds)
    model = onnx.load(out)
    _strict(model)
    (ref,) = run(path, feeds)
    (got,) = run(out, feeds)
    assert rel_l2(ref, got) < 0.01
    assert (ref.argmax(1) == got.argmax(1)).all()  # same top-1 class on every photo
    assert report.stats.low_nodes == report.stats.nodes == 131
    assert report.stats.casts == 2  # the input and the output, nothing else
    assert report.numeric is not None and report.numeric.max_rel_l2 < 0.01


@pytest.mark.slow
@needs_shared
def test_minilm_fp16_matches_fp32_on_real_sentences(tmp_path: Path) -> None:
    path, feeds = _minilm()
    out = tmp_path / "m.onnx"
    report = convert_file(path, out, keep_io_types=True, calibration_data=feeds)
    _strict(onnx.load(out))
    (ref,) = run(path, feeds)
    (got,) = run(out, feeds)
    assert rel_l2(ref, got) < 0.01
    width = ref.shape[-1]
    assert min(cosine(r, g) for r, g in zip(ref.reshape(-1, width), got.reshape(-1, width))) > 0.999  # per token
    # Everything converts: shape values and token ids above data_max do not count (ModelOpt keeps Gather/Reshape/
    # Shape in FP32 because of them), and the attention mask (finfo.min = -3.4e38 on padded tokens) is measured
    # past its fill and converted with a fill FP16 can add (autocast/masks.py).
    high = {n.op_type: d.reason for n, d in report.decisions.items() if not d.low}
    assert not high, high
    assert [r.rewritten_to for r in report.mask_regions] == [-16384.0]


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("loader", [_effnet, _minilm])
def test_bf16_models_are_valid(loader) -> None:  # type: ignore[no-untyped-def]
    path, feeds = loader()
    model = convert_to_mixed_precision(str(path), low_precision_type="bf16", keep_io_types=True, calibration_data=feeds)
    _strict(model)
    assert model.opset_import[0].version >= 22
    floats = [t for t in model.graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.BFLOAT16)]
    bf16 = sum(t.data_type == onnx.TensorProto.BFLOAT16 for t in floats)
    assert bf16 >= 0.9 * len(floats)


ZOO = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo"))


@pytest.mark.slow
@pytest.mark.skipif(
    not (ZOO / "smollm2_135m.onnx").exists() or shared_path("models", "smollm2_eval_input_ids.npy") is None,
    reason="SmolLM2 not built: run `python -m zoo build smollm2_135m`",
)
def test_smollm2_fp16_perplexity_within_half_percent(tmp_path: Path) -> None:
    """The FP16 SmolLM2's perplexity on the first 4 zoo windows (1,024 tokens) is within 0.5% of the FP32 model's on
    the same windows (measured once in a child process and cached). The FP16 session runs a window at a time in
    low-memory order, its activations in ONNX Runtime's memory arena, which gives its free regions back after each
    run (no memory pattern, which would hold them all at once): outside the arena, ONNX Runtime's buffers come from
    the C heap that the conversion before left fragmented, and the process's peak is higher and varies run to run."""
    ids_path = shared_path("models", "smollm2_eval_input_ids.npy")
    assert ids_path is not None
    ids = np.load(ids_path)[:4]
    out = tmp_path / "s.onnx"
    convert_file(ZOO / "smollm2_135m.onnx", out, keep_io_types=True)
    ort = import_onnxruntime()
    options = session_options(low_memory=True, spinning=False)
    options.enable_mem_pattern = False
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    shrink = ort.RunOptions()
    shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    ppl = Perplexity()
    for window in np.split(ids, len(ids)):
        (logits,) = session.run(["logits"], {"input_ids": window}, shrink)
        ppl.update(logits, window)
    fp32 = reference_perplexity(ZOO / "smollm2_135m.onnx", ids)
    assert abs(ppl.value / fp32 - 1) < 0.005, (ppl.value, fp32)
