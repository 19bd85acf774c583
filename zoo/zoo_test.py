"""Tests of the benchmark zoo's synthetic builders (fast; the real models are not built here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import zoo
from onnxprec import _testing
from onnxprec.metrics import perplexity


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return _testing.run(path, feeds)[0]


def test_chain_500_builds_checks_and_runs(tmp_path: Path) -> None:
    path = zoo.model_path("chain_500", zoo_dir=tmp_path)
    assert path == tmp_path / "chain_500.onnx"
    assert zoo.available("chain_500", zoo_dir=tmp_path)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) == 500
    assert {n.op_type for n in model.graph.node} == {"MatMul", "Add", "Relu", "Tanh", "Mul"}
    feeds = zoo.inputs("chain_500")
    y = _run(path, feeds)
    assert y.shape == (1, zoo.CHAIN_WIDTH)
    assert np.isfinite(y).all() and 0 < np.abs(y).max() < 100
    # no stray temp files left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain_500.onnx"]


@pytest.mark.parametrize("n", [1, 7, 8, 9, 17])
def test_chain_has_exactly_n_nodes(tmp_path: Path, n: int) -> None:
    path = tmp_path / f"chain_{n}.onnx"
    zoo.build_chain(path, n)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) == n
    assert np.isfinite(_run(path, {"X": np.ones((1, zoo.CHAIN_WIDTH), np.float32)})).all()


def test_chain_fp16_is_accurate(tmp_path: Path) -> None:
    """Values stay well inside the FP16 range: the same chain computed in float16 numpy stays close."""
    path = tmp_path / "c.onnx"
    zoo.build_chain(path, 200)
    model = onnx.load(path)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = zoo.inputs("chain_200")["X"]
    values32: dict[str, np.ndarray] = {"X": x, **inits}
    values16: dict[str, np.ndarray] = {k: v.astype(np.float16) for k, v in values32.items()}
    ops: dict[str, Callable[..., np.ndarray]] = {
        "MatMul": np.matmul,
        "Add": np.add,
        "Mul": np.multiply,
        "Tanh": np.tanh,
        "Relu": lambda a: np.maximum(a, 0),
    }
    for node in model.graph.node:
        for vals in (values32, values16):
            vals[node.output[0]] = ops[node.op_type](*(vals[i] for i in node.input))
    ref, low = values32["Y"], values16["Y"].astype(np.float32)
    np.testing.assert_allclose(_run(path, {"X": x}), ref, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(low - ref) / np.linalg.norm(ref) < 1e-2


def test_matmul_stack_tiny(tmp_path: Path) -> None:
    path = tmp_path / "mm.onnx"
    zoo.build_matmul_stack(path, total_bytes=4 * zoo.MIB)
    data = tmp_path / "mm.onnx.data"
    assert data.stat().st_size == 4 * zoo.MIB
    assert path.stat().st_size < 64 * 1024  # the weights are all external
    onnx.checker.check_model(str(path))
    model = onnx.load(path, load_external_data=False)
    weights = list(model.graph.initializer)
    assert len(weights) == 4
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in weights)
    assert {e.value for t in weights for e in t.external_data if e.key == "location"} == {"mm.onnx.data"}
    hidden = weights[0].dims[0]
    x = np.random.default_rng(0).standard_normal((1, hidden), dtype=np.float32)
    y = _run(path, {"X": x})
    assert y.shape == (1, hidden) and np.isfinite(y).all()
    # the weights are N(0, 2/hidden): check against numpy
    w = [onnx.numpy_helper.to_array(t, base_dir=str(tmp_path)) for t in weights]
    ref = x
    for i, wi in enumerate(w):
        ref = ref @ wi
        if i < len(w) - 1:
            ref = np.maximum(ref, 0)
    np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-4)
    assert 0.5 < float(np.std(w[0])) * np.sqrt(hidden / 2) < 1.5


def test_matmul_inputs_match_model_width() -> None:
    assert zoo.inputs("matmul_0.5gb")["X"].shape == (1, zoo.MATMUL_HIDDEN)
    np.testing.assert_array_equal(zoo.inputs("chain_500")["X"], zoo.inputs("chain_500")["X"])


def test_perplexity_matches_direct_formula() -> None:
    """The perplexity the zoo checks SmolLM2 with (and the benchmark reports): onnxprec.metrics.perplexity."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 11)).astype(np.float32) * 10
    ids = rng.integers(0, 11, (2, 5))
    lp = logits[:, :-1] - np.log(np.exp(logits[:, :-1].astype(np.float64)).sum(-1, keepdims=True))
    nll = -np.take_along_axis(lp, ids[:, 1:, None], -1).mean()
    assert perplexity(logits, ids) == pytest.approx(np.exp(nll), rel=1e-6)
    # stable: a large common offset changes nothing (a naive softmax overflows), and hopeless logits give inf
    assert perplexity(logits + 1e4, ids) == pytest.approx(np.exp(nll), rel=1e-4)
    assert perplexity(logits * 1e4, ids) == np.inf


def test_zoo_refuses_a_folder_inside_the_repo() -> None:
    with pytest.raises(ValueError, match="outside the repository"):
        zoo.model_path("chain_500", zoo_dir=zoo.REPO_ROOT / "out", build=False)


@pytest.mark.slow
def test_unknown_name_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown zoo model"):
        zoo.model_path("resnet9000", zoo_dir=tmp_path)
