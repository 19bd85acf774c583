"""Tests of the LLM corpus and its sweep. The sample sweep runs on the corpus's torch-free KV decoder, so CI (no
torch) runs it; the torch-built corpus models are swept by the command (RELIABILITY.md), not here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.llm_corpus import build, sweep
from experiments.llm_corpus.synthetic import build_kv_decoder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.build_synthetic(tmp_path_factory.mktemp("corpus"))


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(x) for x in sess.run(None, feeds)]


def test_synthetic_decoder_caches_keys_and_values(corpus: Path) -> None:
    """Prefill of 10 tokens == prefill of 6, then 4 more fed with the 6's present K/V as past."""
    path = corpus / "synthetic" / "onnx" / "model.onnx"
    ids = np.load(corpus / "ids.npy")[:2, :10]
    sess = sweep._session(path)
    full = _run(path, sweep.complete(sess, ids, None))
    assert full[0].shape == (2, 10, 512) and full[1].shape == (2, 4, 10, 32)
    first = _run(path, sweep.complete(sess, ids[:, :6], None))
    feeds = {"input_ids": ids[:, 6:], "attention_mask": np.ones((2, 10), np.int64)}
    for i in range(2):
        feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = first[1 + 2 * i], first[2 + 2 * i]
    second = _run(path, feeds)
    np.testing.assert_allclose(second[0], full[0][:, 6:], atol=1e-5)
    # causal: the first 6 positions do not see the later tokens
    np.testing.assert_allclose(first[0], full[0][:, :6], atol=1e-5)
    assert 0.1 < float(full[0].std()) < 10


def test_synthetic_decoder_is_deterministic(tmp_path: Path) -> None:
    build_kv_decoder(tmp_path / "a.onnx")
    build_kv_decoder(tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "b.onnx"]


def test_complete_sizes_symbolic_kv_from_the_head_size(corpus: Path) -> None:
    class Input:
        def __init__(self, name: str, type_: str, shape: list[object]) -> None:
            self.name, self.type, self.shape = name, type_, shape

    class Sess:
        def get_inputs(self) -> list[Input]:
            return [
                Input("input_ids", "tensor(int32)", ["batch", "seq"]),
                Input("attention_mask", "tensor(int64)", ["batch", "total"]),
                Input("past_key_values.0.key", "tensor(float16)", ["batch", 3, "past", "kv_cache_dim"]),
            ]

    ids = np.arange(10, dtype=np.int64).reshape(2, 5)
    feeds = sweep.complete(Sess(), ids, 64)
    assert feeds["input_ids"].dtype == np.int32 and feeds["attention_mask"].shape == (2, 5)
    assert feeds["past_key_values.0.key"].shape == (2, 3, 0, 64)
    assert feeds["past_key_values.0.key"].dtype == np.float16
    assert list(sweep.complete(Sess(), ids, 64, full=False)) == ["input_ids"]
    with pytest.raises(ValueError, match="cannot size"):
        sweep.complete(Sess(), ids, None)


def test_error_line_picks_the_exception() -> None:
    log = "Loading...\nTraceback (most recent call last):\n  File x\nNotImplementedError: The m is not supported.\n"
    assert build.error_line(log) == "NotImplementedError: The m is not supported."
    assert build.error_line("all fine\nlast words\n") == "last words"
    assert build.error_line("") == "no output"


def test_archs_are_the_builders_decoders() -> None:
    names = build.archs()
    for arch in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "granite", "olmo", "nemotron"):
        assert arch in names
    assert "smollm3" in names and len(names) == len(set(names)) >= 15


def test_markdown_table_and_failure_groups() -> None:
    rows = [
        {"model": "a/x", "tool": "autocast_fp16", "verdict": "pass"},
        {"model": "a/x", "tool": "genai", "verdict": "skip", "error": "not a genai folder"},
        {"model": "b/y", "tool": "autocast_fp16", "verdict": "fail", "stage": "tool", "error": "exit 2: boom"},
        {"model": "b/y", "tool": "genai", "verdict": "fail", "stage": "tool", "error": "exit 2: boom"},
    ]
    md = sweep.markdown(rows, "cmd")
    assert "| a/x | ok | skip |" in md and "| b/y | **tool** | **tool** |" in md
    assert "1 of 4 cases pass; 1 skipped." in md
    assert "- 2x fail (tool): exit 2: boom - b/y:autocast_fp16, b/y:genai" in md


@pytest.mark.slow
def test_sweep_sample_passes_on_the_torch_free_decoder(corpus: Path, tmp_path: Path) -> None:
    """The CI sample: every tool but genai on the synthetic KV decoder, inputs completed by the sweep (the
    ids-only path is the sweep's default and its table's subject, RELIABILITY.md)."""
    tools = [t for t in sweep.TOOLS if t != "genai" and not t.startswith(("int4_awq", "int4_gptq_mnb"))]
    rows = sweep.sweep(["synthetic/onnx"], tools, tmp_path / "out", True, 1, 300.0, corpus=corpus)
    assert [r["tool"] for r in rows] == [t for t in tools if t != "compare"] + ["compare"]
    bounds = json.loads(sweep.BOUNDS.read_text())["tools"]
    for r in rows:
        assert r["verdict"] == "pass", r
        if r["tool"] in bounds:
            assert r["rel_l2"] <= bounds[r["tool"]]["bound"], r
    by = {r["tool"]: r for r in rows}
    assert by["preprocess"]["rel_l2"] < 1e-5 and by["dump"]["rel_l2"] < 1e-5
    assert by["int4_rtn_qdq"]["rel_l2"] > 0 and by["autocast_fp16"]["runtime"] == "onnxruntime"
    assert by["autocast_bf16"]["runtime"] in ("onnxruntime", "onnx.reference")
    assert by["compare"]["candidate"] == "autocast_fp16"


def test_model_bounds_raise_autocast_to_twice_the_architectures_own_error() -> None:
    doc = {
        "tools": {"autocast_fp16": {"bound": 0.002}, "autocast_bf16": {"bound": 0.09}, "int4_rtn_qdq": {"bound": 0.6}},
        "own_error": {"arch": {"granite": {"fp16": 0.0029, "bf16": 0.0176}}},
    }
    granite = sweep.model_bounds(doc, "granite/torch")
    assert granite["autocast_fp16"]["bound"] == 0.0058 and granite["autocast_bf16"]["bound"] == 0.09
    assert granite["int4_rtn_qdq"]["bound"] == 0.6
    assert sweep.model_bounds(doc, "llama/torch") == doc["tools"]
    assert doc["tools"]["autocast_fp16"]["bound"] == 0.002  # not changed in place
    row = {"model": "granite/torch", "tool": "autocast_fp16", "verdict": "fail", "stage": "numerics", "rel_l2": 0.0028}
    assert sweep.rejudge([row], doc)[0]["verdict"] == "pass"
    assert sweep.rejudge([row | {"model": "llama/torch"}], doc)[0]["verdict"] == "fail"


@pytest.mark.slow
def test_a_float_model_ort_cannot_run_makes_its_cases_skips(tmp_path: Path) -> None:
    """The float model fails in ORT (here a Reshape that cannot fit the window): its tools' outputs that fail the
    same way, and the tools without a model output, are skips saying why; a missing output is a failure."""
    from onnx import TensorProto, helper, save

    nodes = [
        helper.make_node("Cast", ["input_ids"], ["x"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["x", "shape"], ["logits"]),
    ]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 7])
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], [shape],
    )  # fmt: skip
    model = tmp_path / "m" / "model.onnx"
    model.parent.mkdir()
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(model))
    ids = np.arange(8 * 16).reshape(8, 16) % 50
    facts = sweep.prepare(model, tmp_path / "w", ids, False)
    assert "Reshape" in facts["unrunnable"] and not (tmp_path / "w" / "data" / "ref.npy").exists()
    (tmp_path / "w" / "int4_rtn_qdq").mkdir()
    (tmp_path / "w" / "int4_rtn_qdq" / "model.onnx").write_bytes(model.read_bytes())
    row = sweep.judge("int4_rtn_qdq", model, tmp_path / "w", facts, {}, 10.0)
    assert row["verdict"] == "skip" and row["stage"] == "baseline" and "output written" in row["error"]
    assert sweep.judge("evaluate", model, tmp_path / "w", facts, {}, 10.0)["verdict"] == "skip"
    assert sweep.judge("preprocess", model, tmp_path / "w", facts, {}, 10.0)["verdict"] == "fail"
