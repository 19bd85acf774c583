"""--size_budget_mb end to end on a tiny LM: the file fits, the choice is reported, real runs scale the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._testing import make_model, tensor_info
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization._testing import run_fp32_compute, tiny_lm
from onnxprec.quantization.int4 import quantize_file


def _lm(tmp_path: Path) -> tuple[Path, list[dict[str, np.ndarray]]]:
    model, _ = tiny_lm("copies", v=512, h=64)
    path = tmp_path / "lm.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(0)
    return path, [{"ids": rng.integers(0, 512, (1, 32))} for _ in range(4)]


def _files(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


@pytest.mark.slow
@pytest.mark.parametrize("output_format", ["qdq", "matmulnbits"])
def test_the_output_fits_the_budget_and_the_report_says_why(tmp_path: Path, output_format: str) -> None:
    source, data = _lm(tmp_path)
    smallest = quantize_file(
        source, tmp_path / "all4.onnx", calibration_method="rtn", block_size=32, nodes_to_exclude=[],
        output_format=output_format, quantize_embeddings=True,
    )  # fmt: skip
    everything8 = quantize_file(
        source, tmp_path / "all8.onnx", calibration_method="rtn", nodes_to_exclude=[], layers_8bit=[""],
        output_format=output_format, quantize_embeddings=True,
    )  # fmt: skip
    low, high = _files(tmp_path / "all4.onnx"), _files(tmp_path / "all8.onnx")
    assert smallest.layers and everything8.layers and low < high
    budget = (low + high) / 2 / 1e6
    output = tmp_path / "budget.onnx"
    report = quantize_file(
        source, output, calibration_method="rtn", calibration_data_reader=data, size_budget_mb=budget,
        output_format=output_format, accuracy_level=0,
    )  # fmt: skip
    assert _files(output) <= budget * 1e6
    data_json = json.loads(json.dumps(report.to_json()))
    assert {layer["weight"] for layer in data_json["layers"]} == {"lm_head.weight", "W1"}  # no default exclusion
    for layer in data_json["layers"]:
        assert layer["sensitivity"] >= 0 and layer["bytes"] > 0 and layer["bits"] in (4, 8)
    assert any(layer["bits"] == 8 or layer["block_size"] < 128 for layer in data_json["layers"])  # bytes were spent
    size = data_json["size_budget"]
    assert size["budget_mb"] == budget and size["estimated_mb"] <= budget
    mbs = [point["mb"] for point in size["curve"]]
    losses = [point["loss"] for point in size["curve"]]
    assert mbs == sorted(mbs) and losses == sorted(losses, reverse=True)
    assert [len(s["weights"]) for s in size["real_runs"]["sets"]] == [1, 1]  # the tied table+head, then W1
    (y,) = run_fp32_compute(onnx.load(output), data[0])
    assert np.isfinite(y).all()


def test_a_budget_below_the_smallest_size_names_it(tmp_path: Path) -> None:
    source, data = _lm(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"below the smallest reachable size, 0\.0\d MB"):
        quantize_file(source, tmp_path / "q.onnx", calibration_data_reader=data, size_budget_mb=0.001)
    assert not (tmp_path / "q.onnx").exists()


def test_explicit_exclusions_still_apply_and_tiny_weights_may_stay_float(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    nodes = [
        onnx.helper.make_node("MatMul", ["X", "Wtiny"], ["a"], name="/tiny/MatMul"),
        onnx.helper.make_node("MatMul", ["a", "Wbig"], ["b"], name="/big/MatMul"),
        onnx.helper.make_node("MatMul", ["b", "Whead"], ["logits"], name="/lm_head/MatMul"),
    ]
    inits = {
        "Wtiny": rng.standard_normal((64, 64)).astype(np.float32),
        "Wbig": rng.standard_normal((64, 1024)).astype(np.float32),
        "Whead": rng.standard_normal((1024, 32)).astype(np.float32),
    }
    model = make_model(nodes, [tensor_info("X", 1, [1, 8, 64])], [tensor_info("logits", 1, [1, 8, 32])], inits)
    source = tmp_path / "m.onnx"
    onnx.save(model, source)
    data = [{"X": rng.standard_normal((1, 8, 64)).astype(np.float32)} for _ in range(2)]
    report = quantize_file(
        source, tmp_path / "q.onnx", calibration_method="rtn", calibration_data_reader=data, size_budget_mb=1.0,
        nodes_to_exclude=[".*/lm_head"],
    )  # fmt: skip
    weights = {layer.weight: layer for layer in report.layers}
    assert "Whead" not in weights and ("/lm_head/MatMul", ".*/lm_head") in report.excluded
    assert "Wtiny" not in weights  # 4096 values: float fits a generous budget and has no error
    assert ("Wtiny", "kept in float by the size budget") in report.skipped
    assert weights["Wbig"].bits == 8


@pytest.mark.slow
def test_a_budget_that_holds_every_weight_at_int8_measures_nothing(tmp_path: Path) -> None:
    # Nothing to choose: the output is the all-INT8 one, without statistics or real runs (a 1.5B LLM's budget at the
    # builder's k_quant_mixed size is above its all-INT8 size).
    model, _ = tiny_lm("untied", v=512, h=160)  # W1 has 25,600 values: no float candidate
    source = tmp_path / "lm.onnx"
    onnx.save(model, source)
    data = [{"ids": np.random.default_rng(0).integers(0, 512, (1, 32))} for _ in range(2)]
    everything8 = tmp_path / "all8.onnx"
    quantize_file(
        source, everything8, calibration_method="rtn", nodes_to_exclude=[], layers_8bit=[""], quantize_embeddings=True,
    )  # fmt: skip
    output = tmp_path / "budget.onnx"
    budget = _files(everything8) / 1e6 + 0.02  # the estimate's margin for names and nodes
    report = quantize_file(source, output, calibration_data_reader=data, size_budget_mb=budget)
    assert output.read_bytes() == everything8.read_bytes()
    assert {(layer.weight, layer.bits) for layer in report.layers} == {
        ("embed.weight", 8), ("W1", 8), ("lm_head.weight", 8)
    }  # fmt: skip
    size = report.to_json()["size_budget"]
    assert size["real_runs"] == {"skipped": "the budget holds every weight at its most precise candidate"}
    assert size["seconds"] == {} and "calibration" not in report.seconds
    assert all(layer["sensitivity"] is None for layer in report.budget.layers.values())
    assert report.summary.startswith("Quantized 3 weights (3 layers) at 8 bits with rtn, "), report.summary
    assert report.method == "awq_lite" and "awq_lite" not in report.summary  # the method asked for, never applied
    # without data the LLM writes no calibration text either
    free = quantize_file(source, tmp_path / "free.onnx", size_budget_mb=budget)
    assert (tmp_path / "free.onnx").read_bytes() == everything8.read_bytes()
    assert "written text" not in free.seconds and free.budget.probes == size["real_runs"]


@pytest.fixture
def short_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM writes windows of 16 tokens, not 256 (a model without a KV cache re-runs its whole prefix for each
    token it writes), for the tests of what a run chooses and does with its text, not of the text's length (the
    first test below writes the full windows)."""
    from onnxprec.quantization.int4 import _budget

    monkeypatch.setattr(_budget, "WRITTEN_LENGTH", 16)


@pytest.mark.slow
def test_without_data_an_llm_calibrates_on_the_text_it_writes(tmp_path: Path) -> None:
    from onnxprec._io import load_model
    from onnxprec.quantization.generated import generated_token_windows
    from onnxprec.quantization.int4._budget import WRITTEN_LENGTH, WRITTEN_WINDOWS

    source, _ = _lm(tmp_path)
    written = generated_token_windows(load_model(source), WRITTEN_WINDOWS, WRITTEN_LENGTH)
    free = quantize_file(source, tmp_path / "free.onnx", calibration_method="gptq", block_size=16)
    given = quantize_file(
        source, tmp_path / "given.onnx", calibration_method="gptq", block_size=16,
        calibration_data_reader=[{"ids": written[i : i + 1]} for i in range(WRITTEN_WINDOWS)],
    )  # fmt: skip
    assert free.calibration["written"] and not free.calibration["random"]
    assert free.calibration["samples"] == WRITTEN_WINDOWS
    # the same GPTQ weights as with the written windows given as data
    weights = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(tmp_path / f).graph.initializer}
               for f in ("free.onnx", "given.onnx")]  # fmt: skip
    assert weights[0].keys() == weights[1].keys()
    for name, array in weights[0].items():
        np.testing.assert_array_equal(array, weights[1][name], err_msg=name)
    assert given.calibration["written"] is False


@pytest.mark.slow
@pytest.mark.usefixtures("short_text")
def test_the_default_without_data_calibrates_an_llm_on_its_own_text(tmp_path: Path) -> None:
    from onnxprec.quantization.int4._options import NO_DATA_LLM_METHOD

    source, _ = _lm(tmp_path)
    default = quantize_file(source, tmp_path / "default.onnx", block_size=16)
    assert default.method == NO_DATA_LLM_METHOD and default.calibration["written"]
    assert {layer.method for layer in default.layers if layer.bits == 4} == {NO_DATA_LLM_METHOD}
    same = quantize_file(source, tmp_path / "same.onnx", block_size=16, calibration_method=NO_DATA_LLM_METHOD)
    assert (tmp_path / "default.onnx").read_bytes() == (tmp_path / "same.onnx").read_bytes()
    assert same.method == NO_DATA_LLM_METHOD


@pytest.mark.slow
@pytest.mark.parametrize(("stats_memory_mb", "method"), [(1, "awq_lite"), (2, "awq_gptq")])
@pytest.mark.usefixtures("short_text")
def test_the_default_without_data_takes_awq_lite_when_gptqs_hessian_exceeds_the_stats_memory(
    tmp_path: Path, stats_memory_mb: int, method: str
) -> None:
    # H = 384: GPTQ's float64 [K, K] Hessian takes 1.125 MiB, over --stats_memory_mb 1 and within 2.
    model, _ = tiny_lm("copies", v=512, h=384)
    source = tmp_path / "lm.onnx"
    onnx.save(model, source)
    report = quantize_file(source, tmp_path / "out.onnx", block_size=16, stats_memory_mb=stats_memory_mb)
    assert report.method == method and report.calibration["written"]
    assert {layer.method for layer in report.layers if layer.bits == 4} == {method}


@pytest.mark.slow
@pytest.mark.parametrize(("device_mb", "method"), [(1, "awq_lite"), (1024, "awq_gptq")])
@pytest.mark.usefixtures("short_text")
def test_on_a_gpu_backend_the_no_data_choice_asks_where_the_hessian_would_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_mb: int, method: str
) -> None:
    # --stats_memory_mb 1 is below the 1.125 MiB Hessian (H = 384): a device that holds GPTQ's factorisation keeps
    # awq_gptq; one too small for it would put the Hessians on the host, so the run takes awq_lite there too.
    from onnxprec import _array
    from onnxprec.quantization.algorithms.backend_test import _fake_backend

    fake, _ = _fake_backend(memory_limit=device_mb << 20)
    monkeypatch.setattr(_array, "backend", lambda providers, memory_limit_mb: fake)
    model, _ = tiny_lm("copies", v=512, h=384)
    source = tmp_path / "lm.onnx"
    onnx.save(model, source)
    report = quantize_file(source, tmp_path / "out.onnx", block_size=16, stats_memory_mb=1)
    assert report.method == method


@pytest.mark.usefixtures("short_text")
def test_the_run_resolves_a_plan_and_leaves_the_callers_options_as_given(tmp_path: Path) -> None:
    # An LLM without data and without layer options: the run takes the LLM defaults (block 32, MatMulNBits, the
    # embedding quantized) and the no-data method; the report names them, the caller's object keeps every attribute.
    from onnxprec.quantization.int4._api import quantize_model
    from onnxprec.quantization.int4._options import LLM_BLOCK_SIZE, NO_DATA_LLM_METHOD, Int4Options

    source, _ = _lm(tmp_path)
    options = Int4Options()
    given = {name: list(value) if isinstance(value, list) else value for name, value in vars(options).items()}
    _, report = quantize_model(source, options)
    assert vars(options) == given
    assert (options.method, options.block_size, options.output_format) == ("kquant", 128, "qdq")
    assert (report.method, report.block_size, report.output_format) == (NO_DATA_LLM_METHOD, LLM_BLOCK_SIZE,
                                                                         "matmulnbits")  # fmt: skip
    assert report.to_json()["method"] == NO_DATA_LLM_METHOD and NO_DATA_LLM_METHOD in report.summary


def test_a_plan_is_a_value_that_steps_replace() -> None:
    import dataclasses

    from onnxprec.quantization.int4._options import LLM_BLOCK_SIZE, Int4Options, Int4Plan

    options = Int4Options(output_format="qdq")
    plan = Int4Plan.of(options)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.llm = True  # type: ignore[misc]
    llm = plan.for_llm().with_method("gptq")
    assert (llm.llm, llm.method, llm.config.block_size, llm.options.format) == (True, "gptq", LLM_BLOCK_SIZE, "qdq")
    assert llm.default_method and llm.options.quantize_embeddings and llm.options.exclude_patterns == []
    assert (plan.llm, plan.method, plan.config.block_size, plan.options) == (False, "kquant", 128, options)
    assert plan.options is options and not options.quantize_embeddings


def test_candidates_scored_slice_by_slice_equal_whole_weight_losses(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tied table (Gather and MatMul) is scored over slices of its output columns (a 262k-token table has no full
    # dequantized copy); the losses equal the whole-weight Hessian-weighted and plain relative errors.
    import onnx_ir as ir

    from onnxprec.quantization.algorithms.rtn import quantize_rtn
    from onnxprec.quantization.int4 import _budget
    from onnxprec.quantization.int4._options import Int4Options
    from onnxprec.quantization.select import select_layers
    from onnxprec.sensitivity import hessian_loss

    model, _ = tiny_lm("tied", v=512, h=64)
    selection = select_layers(ir.serde.deserialize_model(model), gathers=True)
    target = next(t for t in selection.targets if t.gathers and t.matmuls)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, target.k)).astype(np.float32)
    gram = x.astype(np.float64).T @ x
    options = Int4Options(size_budget_mb=1.0)
    monkeypatch.setattr(_budget, "_SLICE_BYTES", 4 * target.k * 100)  # 6 slices of at most 100 columns
    sliced = _budget._candidates(target, gram, options)
    w = target.read()
    assert [c.precision.bits for c in sliced] == [4, 4, 8]  # blocks 64 and 32 (K = 64), INT8
    for candidate in sliced:
        p = candidate.precision
        dq = quantize_rtn(w, p.block_size, symmetric=True, bits=p.bits).dequantize()
        expected = hessian_loss(w, dq, gram) + hessian_loss(w, dq, None)
        assert candidate.loss == pytest.approx(expected, rel=1e-6)


def test_probe_logits_are_reduced_a_few_positions_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real runs keep, per position, the reference's top-k log-probabilities and the log of the normalizer: no
    # [positions, vocabulary] log-softmax is made, only [_ROWS, vocabulary] temporaries.
    from onnxprec.quantization.int4 import _budget

    monkeypatch.setattr(_budget, "_ROWS", 3)
    logits = (np.random.default_rng(0).standard_normal((10, 1000)) * 8).astype(np.float32)
    exact = logits.astype(np.float64)
    np.testing.assert_allclose(_budget._log_normalizer(logits), np.log(np.exp(exact).sum(axis=1)), rtol=1e-6)


def test_probes_on_the_saved_int8_reference_measure_what_whole_copies_measure(tmp_path: Path) -> None:
    # Each real run reads every weight but its own set from the INT8 reference saved once; the KL divergences equal
    # those of probe models built and quantized whole, in memory.
    import onnx_ir as ir

    from onnxprec.calibration_data import CalibrationArgs
    from onnxprec.quantization.int4 import _budget
    from onnxprec.quantization.int4._options import Int4Options
    from onnxprec.quantization.select import select_layers

    source, data = _lm(tmp_path)
    model = ir.load(source)
    options = Int4Options(size_budget_mb=1.0, output_format="matmulnbits")
    selection = select_layers(model, gathers=True)
    candidates = {t: _budget._candidates(t, None, options) for t in selection.targets}
    report = _budget.BudgetReport(1_000_000, 0)
    expected: list[float] = []

    def run(replay: object) -> None:
        _budget._calibrate_gains(model, replay, candidates, options, report)  # type: ignore[arg-type]
        eight = {t.name: _budget.Precision(8, options.block_8bit(t.k)) for t in selection.targets}
        reference = _budget._reference_top(_budget._probe_model(model, eight, options)[0], replay, options)  # type: ignore[arg-type]
        for targets in _budget._probe_sets(candidates):
            chosen = {t.name: min(candidates[t], key=lambda c: c.bytes).precision for t in targets}
            probe, _ = _budget._probe_model(model, {**eight, **chosen}, options)
            expected.append(_budget._kl(probe, replay, reference, options))  # type: ignore[arg-type]

    CalibrationArgs(data, None, None).run(model, run)
    measured = [s["measured_kl"] for s in report.probes["sets"]]
    assert len(measured) == 2 and measured == expected  # the tied table and head, W1


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_probes_compute_at_the_outputs_accuracy_level(accuracy_level: int) -> None:
    # At accuracy_level 0 ONNX Runtime's CPU MatMulNBits dequantizes an 8-bit weight whole at every run (on a
    # 262k-token tied table, a float copy of the table per probe): the probes take --accuracy_level, as the output.
    import onnx_ir as ir

    from onnxprec._ort import create_session
    from onnxprec.quantization.budget import Precision
    from onnxprec.quantization.int4 import _budget
    from onnxprec.quantization.int4._options import Int4Options
    from onnxprec.quantization.select import select_layers

    model, _ = tiny_lm("tied", v=512, h=64)
    float_model = ir.serde.deserialize_model(model)
    options = Int4Options(size_budget_mb=1.0, accuracy_level=accuracy_level)
    chosen = {t.name: Precision(8, 32) for t in select_layers(float_model, gathers=True).targets}
    probe, _ = _budget._probe_model(float_model, chosen, options)
    levels = {node.attributes.get_int("accuracy_level", 0) for node in probe.graph if node.op_type == "MatMulNBits"}
    assert levels == {accuracy_level}
    ids = np.random.default_rng(0).integers(0, 512, (1, 16))
    expected = create_session(float_model).run({"ids": ids}, ["logits"])[0]
    got = create_session(probe).run({"ids": ids}, ["logits"])[0]
    assert np.corrcoef(expected.ravel(), got.ravel())[0, 1] > 0.999  # INT8 weights (and activations at level 4)
