"""onnxprec.evaluate.evaluate_models: perplexity, accuracy, agreement and latency against numpy and metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxprec import _ort, metrics
from onnxprec._options import signature_mismatches
from onnxprec._testing import F16, F, make_model, qdq_conv, run_cli, shared_path, tensor_info
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, OnnxprecError
from onnxprec.evaluate import EvaluateOptions, evaluate_models

I64 = TensorProto.INT64
VOCAB, DIM, HEADS, HEAD_DIM = 11, 6, 2, 3
RNG = np.random.default_rng(0)
EMBED = RNG.standard_normal((VOCAB, DIM)).astype(np.float32)
HEAD = RNG.standard_normal((DIM, VOCAB)).astype(np.float32)


def _lm(path: Path, *, mask: bool = False, kv: bool = False, head: np.ndarray = HEAD) -> Path:
    """A tiny causal LM: logits = embedding[ids] @ head (each position depends on its own token).

    With ``kv``, the past key/value inputs are concatenated with this step's keys/values (present outputs), so
    the model runs only on a past of shape [batch, heads, past, head_dim]; the attention mask must cover
    past + current tokens (it scales the logits, broadcast along the vocabulary).
    """
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed"),
        helper.make_node("MatMul", ["h", "head"], ["raw"], name="head"),
    ]
    inputs = [tensor_info("input_ids", I64, ["batch", "seq"])]
    weights: dict[str, np.ndarray] = {"embed": EMBED, "head": head}
    outputs = [tensor_info("logits", F, ["batch", "seq", VOCAB])]
    logits = "raw"
    if mask or kv:
        inputs.append(tensor_info("attention_mask", I64, ["batch", "total"]))
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["maskf"], to=F, name="cast_mask"),
            helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"], name="unsqueeze_mask"),
            helper.make_node("Mul", ["raw", "mask3"], ["masked"], name="apply_mask"),
        ]
        weights["last"] = np.array([-1], np.int64)
        logits = "masked"
    if kv:
        weights["kv_shape"] = np.array([0, 0, HEADS, HEAD_DIM], np.int64)
        nodes += [
            helper.make_node("Reshape", ["h", "kv_shape"], ["h4"], name="split_heads"),
            helper.make_node("Transpose", ["h4"], ["k"], perm=[0, 2, 1, 3], name="heads_first"),
        ]
        for kind in ("key", "value"):
            past, present = f"past_key_values.0.{kind}", f"present.0.{kind}"
            inputs.append(tensor_info(past, F, ["batch", HEADS, "past_sequence_length", HEAD_DIM]))
            outputs.append(tensor_info(present, F, ["batch", HEADS, "total", HEAD_DIM]))
            nodes.append(helper.make_node("Concat", [past, "k"], [present], axis=2, name=f"concat_{kind}"))
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="out"))
    onnx.save(make_model(nodes, inputs, outputs, weights), path)
    return path


def _numpy_perplexity(ids: np.ndarray, mask: np.ndarray | None = None) -> float:
    logits = (EMBED[ids] @ HEAD).astype(np.float64)
    if mask is not None:
        logits = logits * mask[..., None]
    x = logits[:, :-1]
    log_probs = x - x.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, ids[:, 1:, None], axis=-1)[..., 0]
    keep = np.ones_like(nll, bool) if mask is None else mask[:, 1:] > 0
    return float(np.exp(nll[keep].mean()))


def _classifier(path: Path, weight: np.ndarray, *, fp16_io: bool = False) -> Path:
    elem = F16 if fp16_io else F
    nodes = [helper.make_node("MatMul", ["x", "W"], ["logits"], name="mm")]
    w = weight.astype(np.float16 if fp16_io else np.float32)
    onnx.save(
        make_model(nodes, [tensor_info("x", elem, ["N", 4])], [tensor_info("logits", elem, ["N", 10])], {"W": w}),
        path,
    )
    return path


def test_perplexity_equals_numpy_and_token_windows(tmp_path: Path) -> None:
    model = _lm(tmp_path / "lm.onnx")
    ids = RNG.integers(0, VOCAB, (5, 9)).astype(np.int64)
    report = evaluate_models(model, {"input_ids": ids}, latency_runs=0)
    result = report["lm"]
    assert result.perplexity == pytest.approx(_numpy_perplexity(ids), rel=1e-6)
    assert result.tokens == 5 * 8 and result.samples == 5 and result.is_reference
    np.save(tmp_path / "windows.npy", ids.astype(np.int32))  # token windows, batched by batch_size
    windows = evaluate_models([model], tmp_path / "windows.npy", batch_size=2, latency_runs=0)["lm"]
    assert windows.batches == 3 and windows.perplexity == pytest.approx(result.perplexity, rel=1e-9)


def test_perplexity_honours_the_attention_mask(tmp_path: Path) -> None:
    model = _lm(tmp_path / "lm.onnx", mask=True)
    ids = RNG.integers(0, VOCAB, (4, 8)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 5:] = 0  # right padding
    mask[3, 6:] = 0
    np.savez(tmp_path / "data.npz", input_ids=ids, attention_mask=mask)
    result = evaluate_models([model], tmp_path / "data.npz", latency_runs=0)["lm"]
    assert result.perplexity == pytest.approx(_numpy_perplexity(ids, mask), rel=1e-6)
    assert result.tokens == int(mask[:, 1:].sum())
    # Without a mask in the data the model is fed ones: every token counts.
    unmasked = evaluate_models([model], {"input_ids": ids}, latency_runs=0)["lm"]
    assert unmasked.perplexity == pytest.approx(_numpy_perplexity(ids), rel=1e-6)


def test_kv_cache_model_gets_an_empty_past(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _lm(tmp_path / "kv.onnx", kv=True)
    seen: list[dict[str, tuple[int, ...]]] = []
    fetched: list[list[str] | None] = []
    original = _ort.Session.run

    def spy(self: _ort.Session, feeds: dict[str, np.ndarray], fetches: Any = None) -> list[Any]:
        seen.append({k: v.shape for k, v in feeds.items()})
        fetched.append(None if fetches is None else list(fetches))
        return original(self, feeds, fetches)

    monkeypatch.setattr(_ort.Session, "run", spy)
    ids = RNG.integers(0, VOCAB, (3, 7)).astype(np.int64)
    report = evaluate_models([model, model], {"input_ids": ids}, latency_runs=0)
    assert seen[0] == {  # an LLM's token windows run one a run (calibration_data: no batch size given)
        "input_ids": (1, 7),
        "past_key_values.0.key": (1, HEADS, 0, HEAD_DIM),
        "past_key_values.0.value": (1, HEADS, 0, HEAD_DIM),
        "attention_mask": (1, 7),
    }
    assert fetched[0] == ["logits"]  # present.* are not fetched
    assert report.models[0].perplexity == pytest.approx(_numpy_perplexity(ids), rel=1e-6)
    assert report.models[1].agreement is not None and list(report.models[1].agreement) == ["logits"]
    assert report.models[1].agreement["logits"]["max_abs"] == 0.0


def test_kl_divergence_and_top1_agreement_with_a_reference_model_match_numpy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    float_lm = _lm(tmp_path / "float.onnx")
    noisy = (HEAD + 0.3 * RNG.standard_normal(HEAD.shape)).astype(np.float32)
    quantized = _lm(tmp_path / "quantized.onnx", head=noisy)
    ids = RNG.integers(0, VOCAB, (4, 9)).astype(np.int64)
    report = evaluate_models(quantized, {"input_ids": ids}, reference=str(float_lm), batch_size=3, latency_runs=0)
    assert [m.name for m in report.models] == ["float", "quantized"] and report.reference.name == "float"
    p_logits = (EMBED[ids] @ HEAD).astype(np.float64)
    q_logits = (EMBED[ids] @ noisy).astype(np.float64)
    p = np.exp(p_logits) / np.exp(p_logits).sum(-1, keepdims=True)
    q = np.exp(q_logits) / np.exp(q_logits).sum(-1, keepdims=True)
    kl = float((p * np.log(p / q)).sum(-1).mean())  # every position, batch by batch
    top1 = float((p_logits.argmax(-1) == q_logits.argmax(-1)).mean())
    assert kl > 0.01 and 0 < top1 < 1
    agreement = report["quantized"].agreement
    assert agreement is not None
    assert agreement["logits"]["kl"] == pytest.approx(kl, rel=1e-5)
    assert agreement["logits"]["top1"] == pytest.approx(top1, abs=0)
    assert report["float"].agreement is None
    table = report.table()
    assert table.splitlines()[0].split()[:4] == ["model", "perplexity", "KL", "top-1"]
    assert f"{kl:.4g}" in table
    import argparse

    from onnxprec.evaluate import _cli

    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    assert parser.parse_args([str(quantized), "--reference_model", str(float_lm)]).reference == str(float_lm)


def test_top1_top5_accuracy_against_labels(tmp_path: Path) -> None:
    weight = RNG.standard_normal((4, 10)).astype(np.float32)
    model = _classifier(tmp_path / "clf.onnx", weight)
    folder = tmp_path / "batches"
    folder.mkdir()
    xs = [RNG.standard_normal((n, 4)).astype(np.float32) for n in (6, 5, 7)]
    for i, x in enumerate(xs):
        np.savez(folder / f"b{i}.npz", x=x)
    logits = np.concatenate(xs) @ weight
    labels = RNG.integers(0, 10, len(logits))
    labels[:4] = logits[:4].argmax(-1)  # some hits for top-1
    labels[4:8] = np.argsort(-logits[4:8], axis=-1)[:, 3]  # 4th best: top-5 hits, top-1 misses
    np.save(tmp_path / "labels.npy", labels)
    result = evaluate_models([model], folder, labels=tmp_path / "labels.npy", latency_runs=0)["clf"]
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    assert result.top1_accuracy == pytest.approx(float((logits.argmax(-1) == labels).mean()), abs=0)
    assert result.top5_accuracy == pytest.approx(float((top5 == labels[:, None]).any(-1).mean()), abs=0)
    assert result.labelled == 18 and result.batches == 3
    with pytest.raises(CalibrationDataError, match="--labels has 17 entries but the data has"):
        evaluate_models([model], folder, labels=labels[:17], latency_runs=0)


def test_agreement_equals_metrics(tmp_path: Path) -> None:
    weight = RNG.standard_normal((4, 10)).astype(np.float32)
    noisy = weight + 0.05 * RNG.standard_normal(weight.shape).astype(np.float32)
    ref = _classifier(tmp_path / "ref.onnx", weight)
    cand = _classifier(tmp_path / "cand.onnx", noisy)
    x = RNG.standard_normal((12, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    report = evaluate_models([ref, cand], tmp_path / "x.npz", batch_size=5, latency_runs=0)
    assert report.models[0].agreement is None
    got = report["cand"].agreement
    assert got is not None
    expected = metrics.compare(x @ weight, x @ noisy, top1=True)
    for key in ("max_abs", "rel_l2", "cosine", "top1"):
        assert got["logits"][key] == pytest.approx(expected[key], rel=1e-5), key
    assert got["logits"]["nonfinite"] == 0
    # The reference can be named, and can be a model that is not in the list.
    named = evaluate_models([ref, cand], tmp_path / "x.npz", reference="cand", latency_runs=0)
    assert named.reference.name == "cand" and named["ref"].agreement is not None
    other = evaluate_models([cand], tmp_path / "x.npz", reference=str(ref), latency_runs=0)
    assert [m.name for m in other.models] == ["ref", "cand"] and other.reference.name == "ref"


def test_fp16_model_takes_fp32_data(tmp_path: Path) -> None:
    weight = RNG.standard_normal((4, 10)).astype(np.float32)
    ref = _classifier(tmp_path / "fp32.onnx", weight)
    half = _classifier(tmp_path / "fp16.onnx", weight, fp16_io=True)
    np.savez(tmp_path / "x.npz", x=RNG.standard_normal((8, 4)).astype(np.float32))
    report = evaluate_models([ref, half], tmp_path / "x.npz", latency_runs=0)
    agreement = report["fp16"].agreement
    assert agreement is not None and agreement["logits"]["rel_l2"] < 1e-2 and agreement["logits"]["top1"] == 1.0


def test_latency_fields(tmp_path: Path) -> None:
    weight = RNG.standard_normal((4, 10)).astype(np.float32)
    a, b = _classifier(tmp_path / "a.onnx", weight), _classifier(tmp_path / "b.onnx", weight)
    data = {"x": RNG.standard_normal((4, 4)).astype(np.float32)}
    default = evaluate_models([a, b], data)  # fast by default: latency and the kernel profile only when asked
    assert all(m.latency_ms is None and m.kernels is None for m in default.models)
    assert "median ms" not in default.table() and "int kernels" not in default.table()
    report = evaluate_models([a, b], data, latency_runs=5)
    for result in report.models:
        latency = result.latency_ms
        assert latency is not None and latency["runs"] == 5
        assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
        assert latency["mean"] > 0
    assert report.latency_batch == {"x": [4, 4]}
    assert "median ms" in report.table() and "p90 ms" in report.table()


def test_kernel_profile_counts_the_integer_kernels_onnxruntime_ran(tmp_path: Path) -> None:
    weight = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    quantized = tmp_path / "conv_int8.onnx"
    onnx.save(qdq_conv(weight), quantized)
    plain = make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")],
        [tensor_info("x", F, [1, 3, 8, 8])],
        [tensor_info("y", F, [1, 4, 8, 8])],
        {"w": weight},
    )
    onnx.save(plain, tmp_path / "conv.onnx")
    data = {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    report = evaluate_models([tmp_path / "conv.onnx", quantized], data, latency_runs=0, profile_runs=2)
    fp32, int8 = report["conv"].kernels, report["conv_int8"].kernels
    assert fp32 is not None and int8 is not None and fp32.runs == int8.runs == 2
    assert fp32.integer_nodes == 0 and fp32.qdq_nodes == 0 and fp32.integer_share == 0.0
    # The QDQ Conv ran as one QLinearConv; the input's Q and the output's DQ ran unfused (maybe with NHWC Transposes).
    assert int8.integer_nodes == 1 and int8.qdq_nodes == 2 and int8.nodes in (3, 5)
    assert [k.op_type for k in int8.kernels if k.integer] == ["QLinearConv"]
    assert int8.integer_share is not None and 0 < int8.integer_share < 1
    table = report.table()
    header = table.splitlines()[0]
    assert "int kernels" in header and "int time" in header and "Q/DQ" in header
    row = next(line for line in table.splitlines() if line.startswith("conv_int8"))
    assert f"1/{int8.nodes}" in row.split()
    json_kernels = report.to_json()["models"][1]["kernels"]
    assert (json_kernels["integer_nodes"], json_kernels["qdq_nodes"], json_kernels["nodes"]) == (1, 2, int8.nodes)
    assert json_kernels["op_types"][0]["ms"] >= json_kernels["op_types"][-1]["ms"]  # slowest first
    off = evaluate_models([quantized], data, latency_runs=0, profile_runs=0)
    assert off["conv_int8"].kernels is None and "int kernels" not in off.table()
    assert off.to_json()["models"][0]["kernels"] is None
    with pytest.raises(InvalidArgumentError, match="profile_runs must be an integer >= 0"):
        evaluate_models([quantized], data, profile_runs=-1)


def test_random_data_and_clear_errors(tmp_path: Path) -> None:
    model = _lm(tmp_path / "lm.onnx", mask=True)
    result = evaluate_models([model], None, latency_runs=0)["lm"]
    assert result.perplexity is not None and result.samples >= 1
    clf = _classifier(tmp_path / "clf.onnx", np.ones((4, 10), np.float32))
    with pytest.raises(InvalidArgumentError, match="not a causal LM"):
        evaluate_models([clf], None, perplexity=True, latency_runs=0)
    with pytest.raises(CalibrationDataError, match="do not match the model's inputs"):
        evaluate_models([clf], {"y": np.zeros((2, 4), np.float32)}, latency_runs=0)
    with pytest.raises(InvalidArgumentError, match=r"'clf' needs inputs \['x'\] that the reference 'lm' does not have"):
        evaluate_models([model, clf], {"input_ids": np.zeros((1, 4), np.int64)}, latency_runs=0)
    with pytest.raises(OnnxprecError, match="does not exist"):
        evaluate_models([tmp_path / "missing.onnx"], None)
    with pytest.raises(InvalidArgumentError, match="batch_size must be a positive integer"):
        evaluate_models([clf], None, batch_size=0)
    with pytest.raises(InvalidArgumentError, match=r"Custom op library '/nonexistent/ops\.so' does not exist"):
        evaluate_models([clf], None, custom_op_libs=["/nonexistent/ops.so"])


def test_polygraphy_json_without_the_mask(tmp_path: Path) -> None:
    import base64
    import io

    def encode(array: np.ndarray) -> dict[str, str]:
        buffer = io.BytesIO()
        np.save(buffer, array)
        return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}

    model = _lm(tmp_path / "lm.onnx", mask=True)
    batches = [RNG.integers(0, VOCAB, (2, 5)).astype(np.int64) for _ in range(3)]
    (tmp_path / "inputs.json").write_text(json.dumps([{"input_ids": encode(ids)} for ids in batches]))
    result = evaluate_models([model], tmp_path / "inputs.json", latency_runs=0)["lm"]
    assert result.batches == 6  # 3 entries of 2 token windows, one window a run
    assert result.perplexity == pytest.approx(_numpy_perplexity(np.concatenate(batches)), rel=1e-6)


def test_signature_matches_options() -> None:
    assert signature_mismatches(evaluate_models, EvaluateOptions, skip=("models", "data", "providers")) == []


def _registered(words: str) -> bool:
    from onnxprec import cli

    return any(name == words for name, _, _ in cli.TOOLS)


def test_command_line_table_and_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from onnxprec.evaluate import _cli

    weight = RNG.standard_normal((4, 10)).astype(np.float32)
    ref = _classifier(tmp_path / "ref.onnx", weight)
    cand = _classifier(tmp_path / "cand.onnx", weight + 0.01)
    np.savez(tmp_path / "x.npz", x=RNG.standard_normal((6, 4)).astype(np.float32))
    np.save(tmp_path / "labels.npy", RNG.integers(0, 10, 6))
    out = tmp_path / "eval.json"
    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    args = parser.parse_args([
        str(ref), str(cand), "--data", str(tmp_path / "x.npz"), "--labels", str(tmp_path / "labels.npy"),
        "--report_json", str(out), "--latency_runs", "2", "--profile_runs", "3", "--providers", "cpu",
    ])  # fmt: skip
    assert _cli.run(args) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0].split()
    assert header[:2] == ["model", "top-1"] and "cosine" in header and "p90" in header
    assert "ref (ref)" in table
    data = json.loads(out.read_text())
    assert set(data) == {
        "tool", "onnxprec_version", "summary", "data", "providers", "reference", "latency_batch", "models",
    }  # fmt: skip
    assert data["tool"] == "evaluate" and data["reference"] == "ref" and data["providers"] == ["cpu"]
    assert data["summary"].startswith("Evaluated 2 model(s) on 6 samples in 1 batch(es): ref top-1 ")
    keys = {
        "name", "path", "reference", "batches", "samples", "perplexity", "tokens", "accuracy", "main_output",
        "agreement", "latency_ms", "kernels", "seconds",
    }  # fmt: skip
    assert all(set(m) == keys for m in data["models"])
    cand_json = data["models"][1]
    assert set(cand_json["accuracy"]) == {"top1", "top5", "samples"}
    assert set(cand_json["agreement"]["logits"]) == {"max_abs", "rel_l2", "cosine", "nonfinite", "top1"}
    assert set(cand_json["latency_ms"]) == {"median", "p90", "mean", "min", "runs"}
    kernels = cand_json["kernels"]
    assert set(kernels) == {
        "runs", "nodes", "integer_nodes", "integer_time_share", "qdq_nodes", "qdq_time_share", "kernel_ms", "op_types",
    }  # fmt: skip
    assert kernels["runs"] == 3 and kernels["integer_nodes"] == 0 and kernels["integer_time_share"] == 0.0
    assert kernels["nodes"] == sum(op["nodes"] for op in kernels["op_types"]) >= 1
    assert all(set(op) == {"op_type", "provider", "nodes", "ms", "integer", "qdq"} for op in kernels["op_types"])
    assert "int kernels" in table and "--profile_runs" in parser.format_help()
    assert "--custom_op_lib" in parser.format_help() and "--perplexity" in parser.format_help()
    assert "--json" not in parser.format_help()  # the old spelling of --report_json: a hidden alias
    assert parser.parse_args([str(ref), "--json", str(out)]).report_json == str(out)


@pytest.mark.skipif(not _registered("evaluate"), reason="'evaluate' is not yet registered in onnxprec.cli.TOOLS")
def test_subcommand(tmp_path: Path) -> None:
    model = _lm(tmp_path / "lm.onnx")
    np.save(tmp_path / "ids.npy", RNG.integers(0, VOCAB, (4, 6)))
    for module, words in (("onnxprec.evaluate", []), ("onnxprec", ["evaluate"])):
        result = run_cli(*words, str(model), "--data", str(tmp_path / "ids.npy"), "--latency_runs", "1", module=module)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].split()[:2] == ["model", "perplexity"]
    default = run_cli("evaluate", str(model), "-d", str(tmp_path / "ids.npy"))  # no latency, no profile unless asked
    assert default.returncode == 0 and "median ms" not in default.stdout and "int kernels" not in default.stdout
    bad = run_cli("evaluate", str(model), "-d", str(tmp_path / "nope.npz"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert f"--calibration_data '{tmp_path / 'nope.npz'}' does not exist" in bad.stderr
    helptext = run_cli("evaluate", "--help").stdout
    assert "--custom_op_lib" in helptext and "examples:" in helptext


# --------------------------------------------------------------------------------------------------
# Real models: FP32 against AutoCast FP16 (../shared/models)

MODELS = shared_path("models")
needs_shared = pytest.mark.skipif(
    MODELS is None, reason="../shared/models is absent (fresh clone): real-model tests skipped"
)


@pytest.mark.slow
@needs_shared
def test_minilm_fp32_against_autocast_fp16(tmp_path: Path) -> None:
    from onnxprec.autocast import convert_file

    assert MODELS is not None
    source = MODELS / "minilm_l6_v2_bert.onnx"
    data = MODELS / "minilm_l6_v2_bert_inputs.npz"
    half = tmp_path / "minilm.fp16.onnx"
    convert_file(source, half, keep_io_types=True, calibration_data=data)
    report = evaluate_models([source, half], data, latency_runs=2)
    agreement = report["minilm.fp16"].agreement
    assert agreement is not None
    states = agreement["last_hidden_state"]
    assert states["cosine"] > 0.999 and states["rel_l2"] < 0.01 and "top1" not in states  # not a classifier
    assert report.models[0].perplexity is None  # an encoder, not a causal LM
    assert all(m.latency_ms and m.latency_ms["median"] > 0 for m in report.models)


@pytest.mark.slow
@needs_shared
def test_efficientnet_fp32_against_autocast_fp16(tmp_path: Path) -> None:
    from onnxprec.autocast import convert_file

    assert MODELS is not None
    source = MODELS / "efficientnet_lite0.onnx"
    photos = np.load(MODELS / "efficientnet_lite0_input.npy")
    half = tmp_path / "effnet.fp16.onnx"
    convert_file(source, half, keep_io_types=True, calibration_data={"input": photos})
    labels = np.asarray(_ort.create_session(source).run({"input": photos})[0]).argmax(-1)  # FP32's own classes
    report = evaluate_models([source, half], {"input": photos}, labels=labels, batch_size=4, latency_runs=2)
    assert report["efficientnet_lite0"].top1_accuracy == 1.0
    fp16 = report["effnet.fp16"]
    assert fp16.agreement is not None and fp16.agreement["logits"]["top1"] == 1.0
    assert fp16.top1_accuracy == 1.0 and fp16.batches == 2
