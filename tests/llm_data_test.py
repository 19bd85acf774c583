"""Every tool on a KV-cache decoder (GroupQueryAttention, symbolic head size) given token ids only, or no data.

The tiny decoder is laid out as onnxruntime-genai's builder writes its models (``onnxprec._testing.tiny_decoder``);
the calibration data is an ``.npz`` holding only ``input_ids``: the attention mask and the empty past keys/values
are built from the model (issue 15). Perplexity is checked against ORT run on feeds built by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import run, shared_path, tiny_decoder
from onnxprec.autocast import convert_file
from onnxprec.debug import compare_models, dump_model
from onnxprec.evaluate import evaluate_models
from onnxprec.quantization.int4 import quantize_file

VOCAB = 64
IDS = np.random.default_rng(0).integers(0, VOCAB, (4, 12))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(tiny_decoder("gqa", vocab=VOCAB), tmp_path / "model.onnx")
    np.savez(tmp_path / "ids.npz", input_ids=IDS)
    return tmp_path


def _perplexity_by_hand(model: Path, ids: np.ndarray) -> float:
    """As ../shared/zoo/genai/ppl.py: ones for the mask, zeros [1, 1, 0, 16] for every past input, one window a run."""
    nll, count = 0.0, 0
    for window in ids:
        feeds = {"input_ids": window[None], "attention_mask": np.ones((1, len(window)), np.int64)}
        for i in range(2):
            for kind in ("key", "value"):
                feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 1, 0, 16), np.float32)
        logits = run(model, feeds)[0][0, :-1].astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        nll -= log_probs[np.arange(len(window) - 1), window[1:]].sum()
        count += len(window) - 1
    return float(np.exp(nll / count))


@pytest.mark.slow
def test_int4_autocast_evaluate_dump_and_compare_on_token_ids(folder: Path) -> None:
    model, ids = folder / "model.onnx", folder / "ids.npz"
    report = quantize_file(
        model, folder / "int4.onnx", calibration_method="awq_gptq", calibration_data_reader=str(ids), block_size=16
    )
    assert report.calibration["batches"] == 4 and report.calibration["samples"] == 4  # split to batch size 1
    autocast = convert_file(model, folder / "fp16.onnx", calibration_data=str(ids))
    assert autocast.reference_batches == 4  # the .npy's 4 windows, one a run
    evaluation = evaluate_models([model, folder / "int4.onnx", folder / "fp16.onnx"], ids, latency_runs=0)
    reference = evaluation["model"]
    assert reference.tokens == 4 * 11 and reference.perplexity == pytest.approx(_perplexity_by_hand(model, IDS), 1e-5)
    fp16 = evaluation["fp16"].agreement
    assert fp16 is not None and fp16["logits"]["cosine"] > 0.999
    dumped = dump_model(folder / "int4.onnx", str(ids), output_dir=str(folder / "dump"))
    assert dumped.index["inputs"]["past_key_values.0.key"]["shape"] == [1, 1, 0, 16]  # the first window
    compared = compare_models(model, folder / "fp16.onnx", str(ids))
    assert compared.batches == 4 and compared.first_divergence is None


@pytest.mark.slow
def test_no_data_and_the_data_flag_of_evaluate(folder: Path) -> None:
    """AutoCast's default (random data) runs on random ids inside the vocabulary; evaluate reads an .npy of ids."""
    config = {"model": {"context_length": 16, "vocab_size": VOCAB, "decoder": {"head_size": 16}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    assert convert_file(folder / "model.onnx", folder / "fp16.onnx").reference_batches == 1
    np.save(folder / "ids.npy", IDS[:2])
    result = evaluate_models([folder / "model.onnx"], folder / "ids.npy", batch_size=1, latency_runs=0)["model"]
    assert result.batches == 2 and result.perplexity == pytest.approx(
        _perplexity_by_hand(folder / "model.onnx", IDS[:2]), 1e-5
    )


BUILDER = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo")) / "genai" / "smollm2_fp32"


@pytest.mark.slow
def test_builder_smollm2_perplexity_from_token_ids_only(tmp_path: Path) -> None:
    """onnxruntime-genai's builder SmolLM2 (KV inputs with a symbolic head size), windows 8-11 of the zoo ids:
    ../shared/zoo/genai/ppl.py, which fills the KV inputs by hand, measures 22.131 on them (with its window slice set
    to ``[8:12]``; on its own windows 8-15 it measures 19.762)."""
    ids = shared_path("models", "smollm2_eval_input_ids.npy")
    if not (BUILDER / "model.onnx").exists() or ids is None:
        pytest.skip("the builder's SmolLM2 (../shared/zoo/genai/build.sh) or the zoo ids are absent")
    np.save(tmp_path / "ids.npy", np.load(ids)[8:12])
    result = evaluate_models(BUILDER / "model.onnx", tmp_path / "ids.npy", batch_size=1, latency_runs=0)["model"]
    assert result.tokens == 4 * 255 and result.perplexity == pytest.approx(22.131, abs=5e-4)
