"""INT4 on real trained models: all-MiniLM-L6-v2 (../shared/models) and SmolLM2-135M (zoo cache; slow).

Skipped with a message when the models are absent (a fresh clone has no ../shared).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._io import save_model
from onnxprec._ort import create_session
from onnxprec._testing import reference_perplexity, run, shared_path
from onnxprec.metrics import Perplexity, rel_l2
from onnxprec.quantization.int4 import Int4Options, quantize, quantize_model

MODELS = shared_path("models")
SMOLLM2 = Path(os.environ.get("ONNXPREC_ZOO", Path.home() / ".cache" / "onnxprec" / "zoo")) / "smollm2_135m.onnx"


@pytest.mark.slow
@pytest.mark.skipif(MODELS is None, reason="../shared/models is absent (fresh clone): real-model tests skipped")
def test_minilm_every_method_beats_or_matches_onnxruntime_rtn(tmp_path: Path) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    assert MODELS is not None
    path = MODELS / "minilm_l6_v2_bert.onnx"
    feeds = dict(np.load(MODELS / "minilm_l6_v2_bert_inputs.npz"))
    (reference,) = run(path, feeds)[:1]
    anchor = MatMulNBitsQuantizer(
        onnx.load(path), algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False)
    )
    anchor.process()
    anchor_error = rel_l2(reference, run(anchor.model.model, feeds)[0])
    calibration = [{k: v[i : i + 1] for k, v in feeds.items()} for i in range(len(feeds["input_ids"]))]
    errors = {}
    for method in ("rtn", "awq_lite", "awq_clip", "awq_full", "gptq"):
        # the methods' numerics at 4 bits: the accuracy guard off (it would put most weights at 8 bits)
        model = quantize(path, calibration_method=method, calibration_data_reader=calibration, block_size=32,
                         use_zero_point=True, accuracy_guard=False)  # fmt: skip
        onnx.checker.check_model(model, full_check=True)
        assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) == 36
        errors[method] = rel_l2(reference, run(model, feeds)[0])
    assert errors["rtn"] <= 1.02 * anchor_error, (errors, anchor_error)
    for method in ("awq_lite", "awq_clip", "awq_full", "gptq"):
        assert errors[method] < 0.95 * anchor_error, (method, errors, anchor_error)


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.exists(), reason=f"{SMOLLM2} is absent: build it with python -m zoo build")
def test_smollm2_rtn_and_awq_perplexity(tmp_path: Path) -> None:
    """RTN and AWQ-lite INT4 SmolLM2 against the FP32 model's perplexity on windows 8-11 of the zoo inputs (measured
    once in a child process and cached: its session alone holds 1.2 GB). The pipeline of ``quantize_file`` without
    its check of the written file (the FP32 and INT4 models on the first calibration window, a warning when they
    differ: the tests of ``int4/check_test.py``), whose measurement the perplexities here replace."""
    ids = np.load(SMOLLM2.with_name("smollm2_135m.inputs.npz"))["input_ids"]
    calibration, evaluation = ids[:1], ids[8:12]  # one window: AWQ-lite sits between FP32 and RTN as on two

    def perplexity(model: Path) -> float:  # the windows one a run, through one session
        session, accumulator = create_session(model, optimization="all", spinning=False), Perplexity()
        for window in evaluation:
            accumulator.update(session.run({"input_ids": window[None]})[0], window[None])
        return accumulator.value

    fp32 = reference_perplexity(SMOLLM2, evaluation)
    results = {}
    for method in ("rtn", "awq_lite"):
        out = tmp_path / f"{method}.onnx"
        options = Int4Options(calibration_method=method, block_size=128,
                              calibration_data_reader=[{"input_ids": w[None]} for w in calibration])  # fmt: skip
        model, report = quantize_model(SMOLLM2, options)
        save_model(model, out)
        del model
        assert not report.excluded  # an LLM's defaults quantize its head and embedding too
        # the tied embedding/head is stored for its Gather and its MatMul: 8.3 % over the ideal 4-bit bytes
        assert abs(report.quantized_bytes / report.ideal_bytes - 1) < 0.1
        results[method] = perplexity(out)
    assert fp32 < results["awq_lite"] < results["rtn"] < 2 * fp32, (fp32, results)
